//! Blocks as the pipeline receives them (from a peer or a block file):
//! consensus decoding, then the context-free checks (`check_block`) and
//! the checks against a UTXO view that holds nothing (`connect_block`),
//! at a height past every activation. Must never panic, whatever the block.
#![no_main]

use std::collections::HashMap;

use bitcoin::{Block, Network};
use kakehi::chain::ChainParams;
use kakehi::validation::{check_block, connect_block, BlockContext};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(block) = bitcoin::consensus::deserialize::<Block>(data) else {
        return;
    };
    let params = ChainParams::new(Network::Regtest);
    let ctx = BlockContext {
        params: &params,
        height: 1_000,
        block_hash: block.block_hash(),
        prev_median_time_past: block.header.time.saturating_sub(1),
        median_time_past_at: &|h| Some(h),
    };
    let _ = check_block(&block, &ctx);
    let _ = connect_block(&block, &ctx, &HashMap::new());
});
