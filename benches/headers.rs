//! Headers sync at testnet3's size: N regtest headers (4,800,000 by default,
//! testnet3's height; `KAKEHI_BENCH_HEADERS=N`) mined in memory on top of
//! regtest's genesis, then stored the way a P2P `headers` message stores
//! them (`Chainstate::accept_headers`, batches of 2,000: checks, block
//! index, one index-database batch each), then the datadir reopened.
//!
//! Baseline in the same run: hashing each header once (`block_hash`, one
//! SHA-256d of 80 bytes), which no header sync can avoid.
//!
//! Prints headers/s for both, their ratio, the time to reopen the datadir,
//! and the process's resident memory (VmRSS now, VmHWM peak) after each
//! phase.
//!
//! Run: `cargo bench --bench headers`.

#[path = "common/mod.rs"]
mod common;

use std::time::Instant;

use bitcoin::block::{Header, Version};
use bitcoin::hashes::Hash;
use bitcoin::{BlockHash, CompactTarget, Network, Target, TxMerkleNode};
use kakehi::chain::ChainParams;
use kakehi::node::{open_chainstate, DataDir};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Headers per `accept_headers` call: a full P2P `headers` message.
const BATCH: usize = 2_000;

fn main() {
    let n: usize = std::env::var("KAKEHI_BENCH_HEADERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4_800_000);
    let params = ChainParams::new(Network::Regtest);
    let genesis = params.genesis_block().header;

    let t = Instant::now();
    let headers = mine(genesis, n);
    println!(
        "mined {n} regtest headers in {:.1} s ({})",
        t.elapsed().as_secs_f64(),
        memory()
    );

    let t = Instant::now();
    let mut acc = 0u8;
    for h in &headers {
        acc ^= h.block_hash().as_byte_array()[0];
    }
    std::hint::black_box(acc);
    let hash_rate = n as f64 / t.elapsed().as_secs_f64();
    println!("baseline, one SHA-256d per header: {hash_rate:.0} headers/s");

    let dir = tempfile::tempdir().expect("tempdir");
    let datadir = DataDir::open(dir.path()).expect("datadir");
    let mut chain = open_chainstate(params.clone(), &datadir).expect("open");
    let t = Instant::now();
    for batch in headers.chunks(BATCH) {
        let out = chain.accept_headers(batch).expect("index database");
        assert!(out.refused.is_none(), "refused: {:?}", out.refused);
    }
    let secs = t.elapsed().as_secs_f64();
    let rate = n as f64 / secs;
    println!(
        "accept_headers, batches of {BATCH}: {secs:.1} s, {rate:.0} headers/s, {:.2}x the hashing baseline ({})",
        rate / hash_rate,
        memory()
    );
    let last = headers[n - 1].block_hash();
    drop(headers);
    drop(chain);

    let t = Instant::now();
    let chain = open_chainstate(params, &datadir).expect("reopen");
    println!(
        "reopen with {} headers: {:.2} s ({})",
        chain.index().len(),
        t.elapsed().as_secs_f64(),
        memory()
    );
    assert!(chain.index().id_of(&last).is_some(), "last header kept");
    println!(
        "datadir: {:.0} MiB",
        common::dir_bytes(dir.path()) as f64 / (1024.0 * 1024.0)
    );
}

/// `n` headers on top of `genesis`, each with regtest's minimum difficulty
/// (`0x207fffff`: about one nonce in two passes), ten minutes apart.
fn mine(genesis: Header, n: usize) -> Vec<Header> {
    let bits = CompactTarget::from_consensus(0x207f_ffff);
    let target = Target::from_compact(bits);
    let mut prev: BlockHash = genesis.block_hash();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut h = Header {
            version: Version::from_consensus(4),
            prev_blockhash: prev,
            merkle_root: TxMerkleNode::from_byte_array([(i % 251) as u8; 32]),
            time: genesis.time + 1 + i as u32,
            bits,
            nonce: 0,
        };
        while h.validate_pow(target).is_err() {
            h.nonce += 1;
        }
        prev = h.block_hash();
        out.push(h);
    }
    out
}

/// "RSS x MiB, peak y MiB" from `/proc/self/status` (Linux).
fn memory() -> String {
    format!(
        "RSS {} MiB, peak {} MiB",
        common::status_mib("VmRSS:"),
        common::status_mib("VmHWM:")
    )
}
