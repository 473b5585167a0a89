//! assumevalid by Bitcoin Core's rule, through the pipeline, on regtest-a
//! and blocks built on top of it (`common::blockgen`).
//!
//! The assumevalid chain: regtest-a's tip (1500), then regtest-a's case 16
//! (1501: a bad signature), then 100 blocks (1502..1601, the last one the
//! assumevalid block), then 2,049 more headers without their blocks, so
//! that every block up to 1601 is more than two weeks of regtest work
//! (2,016 blocks) below the best header. With `--assumevalid` set to block
//! 1601:
//! - a block off that chain (a rival 1501 carrying case 16's transaction)
//!   is fully checked and rejected for its signature;
//! - case 16 and the 100 blocks after it are connected without script
//!   checks (the bad signature is below the assumevalid block);
//! - above it, a block with a bad signature is rejected, and a valid one is
//!   accepted with its scripts verified.
//!
//! With assumevalid off (regtest's default), case 16 is rejected
//! (`tests/it/backbone.rs`); each of Core's conditions alone, "block too recent
//! relative to best header" among them, is unit-tested in
//! `src/chain/assumevalid.rs`.

use crate::common;

use bitcoin::{Amount, Block, Transaction, TxOut};
use common::blockgen::{coinbase, mine, spend_p2wpkh, subsidy, Kind, Wallet};
use common::{data, TestNode};
use kakehi::chain::assumevalid::AssumeValid;
use kakehi::pipeline::SubmitOutcome;

fn submit(node: &TestNode, block: &Block) -> SubmitOutcome {
    node.chain.lock().submit_block(block).expect("storage")
}

fn read_block(rel: &str) -> Block {
    let params = kakehi::chain::ChainParams::new(bitcoin::Network::Regtest);
    kakehi::import::read_file(&data(rel), &params)
        .expect("block file")
        .remove(0)
        .block
}

fn reward(wallet: &Wallet, height: u32, tag: u32) -> Transaction {
    let pay = TxOut {
        value: Amount::from_sat(subsidy(height)),
        script_pubkey: wallet.script_pubkey(Kind::P2wpkh),
    };
    coinbase(height, tag, vec![pay])
}

/// Blocks on `from` (a block at `height`): `count` coinbase-only blocks.
fn extend(wallet: &Wallet, from: &Block, height: u32, count: u32, tag: u32) -> Vec<Block> {
    let mut out: Vec<Block> = Vec::new();
    for i in 1..=count {
        let prev = out.last().unwrap_or(from);
        let b = mine(
            (prev.block_hash(), prev.header.time),
            reward(wallet, height + i, tag),
            vec![],
        );
        out.push(b);
    }
    out
}

/// A transaction spending the P2WPKH coinbase output of `funding`
/// ([`spend_p2wpkh`], fee 1,000 sats), with its signature's byte 10
/// flipped when `corrupt`.
fn spend(wallet: &Wallet, funding: &Block, corrupt: bool) -> Transaction {
    spend_p2wpkh(wallet, &funding.txdata[0], 1_000, corrupt)
}

fn assert_script_failure(outcome: &SubmitOutcome, what: &str) {
    match outcome {
        SubmitOutcome::Rejected { reason, .. } => assert!(
            reason.starts_with("block-script-verify-flag-failed ("),
            "{what}: rejected as {reason}"
        ),
        other => panic!("{what}: {other:?}"),
    }
}

#[test]
fn scripts_skipped_below_the_assumevalid_block_and_checked_elsewhere() {
    let wallet = Wallet::new();
    let node = TestNode::new(bitcoin::Network::Regtest);
    let imported = node.import(&[data("regtest-a/blocks.dat")]);
    assert!(imported.rejected.is_empty(), "{:?}", imported.rejected);
    let tip = node.chain.lock().index().tip().clone();
    assert_eq!(tip.height, 1500);
    let case16 = read_block("regtest-a/invalid/16-bad-signature.blk");
    assert_eq!(case16.header.prev_blockhash, tip.hash);

    // The assumevalid chain: case 16, 100 blocks (1601 is assumevalid),
    // then 2,049 blocks whose headers alone are given (up to 3650).
    let above = extend(&wallet, &case16, 1501, 100, 0);
    let assumed = above.last().expect("block 1601").clone();
    let funding = above[0].clone(); // 1502: its coinbase matures at 1602.
    let valid_1602 = mine(
        (assumed.block_hash(), assumed.header.time),
        reward(&wallet, 1602, 0),
        vec![spend(&wallet, &funding, false)],
    );
    let mut beyond = vec![valid_1602.clone()];
    beyond.extend(extend(&wallet, &valid_1602, 1602, 2_048, 0));
    let mut headers = vec![case16.header];
    headers.extend(above.iter().chain(&beyond).map(|b| b.header));
    {
        let mut cs = node.chain.lock();
        cs.set_assume_valid(AssumeValid::Block(assumed.block_hash()));
        let accepted = cs.accept_headers(&headers).expect("storage");
        assert!(accepted.refused.is_none(), "{:?}", accepted.refused);
        assert_eq!(cs.index().best_header().height, 3650);
    }

    // Off the assumevalid chain: checked, rejected for the signature.
    let rival = mine(
        (tip.hash, tip.header.time),
        reward(&wallet, 1501, 7),
        vec![case16.txdata[1].clone()],
    );
    assert_script_failure(
        &submit(&node, &rival),
        "rival 1501 off the assumevalid chain",
    );

    // Below the assumevalid block: case 16's bad signature is not checked.
    let stats = |node: &TestNode| node.chain.lock().stats().clone();
    let before = stats(&node);
    assert!(matches!(
        submit(&node, &case16),
        SubmitOutcome::Accepted { height: 1501, .. }
    ));
    for b in &above {
        assert!(matches!(submit(&node, b), SubmitOutcome::Accepted { .. }));
    }
    let after = stats(&node);
    assert_eq!(
        after.blocks_assumed_valid - before.blocks_assumed_valid,
        101
    );
    assert_eq!(after.inputs_verified, before.inputs_verified);
    assert_eq!(node.chain.lock().index().tip().hash, assumed.block_hash());

    // Above it: a bad signature is rejected; the valid block is verified.
    let bad_1602 = mine(
        (assumed.block_hash(), assumed.header.time),
        reward(&wallet, 1602, 9),
        vec![spend(&wallet, &funding, true)],
    );
    assert_script_failure(&submit(&node, &bad_1602), "bad signature above assumevalid");
    assert!(matches!(
        submit(&node, &valid_1602),
        SubmitOutcome::Accepted { height: 1602, .. }
    ));
    let last = stats(&node);
    assert_eq!(last.blocks_assumed_valid, after.blocks_assumed_valid);
    assert_eq!(
        last.inputs_verified - after.inputs_verified,
        2,
        "bad 1602, then 1602"
    );
}
