//! Cost of the address index on testnet-data/regtest-a (1,529 blocks,
//! 24,072 transactions, 7 reorgs): the same import with the index off and
//! on, side by side in each round, every block a durable boundary
//! (`GroupLimits::PER_BLOCK`) and grouped (`GroupLimits::NODE_DEFAULT`, as
//! `kakehi import`); the index database's bytes with and without it; and
//! the snapshot reads of the busiest script (first page of 25, the whole
//! history, totals and UTXOs), p50 and p99 over 200 runs, warm.
//!
//! Run: `cargo bench --bench address_index` (`KAKEHI_BENCH_RUNS=N` rounds,
//! default 2).

#[path = "common/mod.rs"]
#[allow(dead_code)]
mod common;
#[path = "common/env.rs"]
mod env;
#[path = "common/timed_import.rs"]
mod timed_import;

use std::path::{Path, PathBuf};
use std::time::Instant;

use bitcoin::Network;
use env::env_or;
use kakehi::chain::ChainParams;
use kakehi::node::{open_chainstate, DataDir};
use kakehi::pipeline::GroupLimits;
use timed_import::timed_import;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// One import into a fresh datadir: (seconds, bytes of `index/`, the datadir).
fn import(file: &Path, limits: GroupLimits, index: bool) -> (f64, u64, tempfile::TempDir) {
    let (secs, chain, dir) = timed_import(file, ChainParams::new(Network::Regtest), |cs| {
        cs.set_group_limits(limits);
        cs.set_address_index(index, &mut |_| {})
            .expect("index setting");
    });
    drop(chain);
    (secs, common::dir_bytes(&dir.path().join("index")), dir)
}

fn percentiles(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

fn queries(dir: &Path) {
    let datadir = DataDir::open(dir).expect("datadir");
    let cs = open_chainstate(ChainParams::new(Network::Regtest), &datadir)
        .expect("open")
        .snapshot();
    // The busiest script of regtest-a's UTXO set.
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testnet-data/regtest-a/utxos.txt"),
    )
    .expect("utxos.txt");
    let mut counts = std::collections::HashMap::new();
    for l in text.lines() {
        *counts
            .entry(l.split_whitespace().nth(2).expect("script"))
            .or_insert(0) += 1;
    }
    let (script, _) = counts
        .into_iter()
        .max_by_key(|(s, n)| (*n, *s))
        .expect("a script");
    let script = bitcoin::ScriptBuf::from_hex(script).expect("hex");
    let sh = kakehi::primitives::script_hash(script.as_bytes());
    let all = cs.script_txs(&sh, None, usize::MAX).expect("history");
    println!("busiest script: {} transactions", all.len());
    let mut page = Vec::new();
    let mut whole = Vec::new();
    let mut summary = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        cs.script_txs(&sh, None, 25).expect("page");
        page.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        cs.script_txs(&sh, None, usize::MAX).expect("history");
        whole.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        cs.script_summary(&sh).expect("summary");
        summary.push(t.elapsed().as_secs_f64() * 1e3);
    }
    for (name, v) in [
        ("first page (25)", page),
        ("whole history", whole),
        ("totals + UTXOs", summary),
    ] {
        let (p50, p99) = percentiles(v);
        println!("{name}: p50 {p50:.3} ms, p99 {p99:.3} ms");
    }
}

fn main() {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testnet-data/regtest-a/blocks.dat");
    let runs: usize = env_or("KAKEHI_BENCH_RUNS", 2);
    let mut kept = None;
    for round in 1..=runs {
        for (name, limits) in [
            ("per block", GroupLimits::PER_BLOCK),
            ("grouped", GroupLimits::NODE_DEFAULT),
        ] {
            let (off, off_bytes, _) = import(&file, limits, false);
            let (on, on_bytes, dir) = import(&file, limits, true);
            println!(
                "round {round} {name}: off {off:.2} s, on {on:.2} s, on/off {:.2}; index/ {off_bytes} -> {on_bytes} bytes (+{} per transaction)",
                on / off,
                (on_bytes.saturating_sub(off_bytes)) / 24_072
            );
            kept = Some(dir);
        }
    }
    if let Some(dir) = kept {
        queries(dir.path());
    }
}
