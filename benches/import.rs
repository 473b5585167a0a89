//! Import throughput of testnet-data/regtest-a (1,529 blocks, 22,543
//! non-coinbase transactions, 7 reorgs) through the full pipeline, side by
//! side with Bitcoin Core's own engine on the same file.
//!
//! Each round runs, one after the other on the same machine:
//! - kakehi with every block a durable boundary (`GroupLimits::PER_BLOCK`,
//!   what a synced node does);
//! - kakehi as `kakehi import` runs it: blocks older than 24 h made durable
//!   in groups (`GroupLimits::NODE_DEFAULT`: 1,000 blocks, 32 MiB, 1 s);
//! - Bitcoin Core's engine (`benches/core_import.py`: `pbk`
//!   `ChainstateManager.import_blocks`, default caches, scripts checked);
//! - a decode-only baseline.
//!
//! Run: `cargo bench --bench import` (`KAKEHI_BENCH_RUNS=N` rounds, default
//! 3; `KAKEHI_BENCH_SKIP_CORE=1` skips Core's engine). Prints every round
//! and the best of each.

#[path = "common/core.rs"]
mod core_engine;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use bitcoin::Network;
use kakehi::chain::ChainParams;
use kakehi::import::{import_files, read_file};
use kakehi::node::{open_chainstate, DataDir};
use kakehi::pipeline::GroupLimits;
use parking_lot::Mutex;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// One kakehi import of `file` into a fresh datadir with `limits`: seconds.
fn kakehi_import(file: &Path, params: &ChainParams, limits: GroupLimits) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let datadir = DataDir::open(dir.path()).expect("datadir");
    let mut cs = open_chainstate(params.clone(), &datadir).expect("open");
    cs.set_group_limits(limits);
    let chain = Mutex::new(cs);
    let t = Instant::now();
    let s = import_files(
        &chain,
        &[file.to_path_buf()],
        &AtomicBool::new(false),
        false,
    )
    .expect("import");
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(s.tip_height, 1500);
    secs
}

/// One import of `file` by Bitcoin Core's engine: seconds.
fn core_import(file: &Path) -> f64 {
    let v = core_engine::import(&[file.to_path_buf()]);
    assert_eq!(v["height"], 1500, "Core's engine did not reach the tip");
    v["seconds"].as_f64().unwrap_or(f64::NAN)
}

fn main() {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testnet-data/regtest-a/blocks.dat");
    let params = ChainParams::new(Network::Regtest);
    let runs: usize = std::env::var("KAKEHI_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let with_core = std::env::var_os("KAKEHI_BENCH_SKIP_CORE").is_none();
    let records = read_file(&file, &params).expect("read");
    let blocks = records.len() as f64;
    let txs: usize = records.iter().map(|r| r.block.txdata.len()).sum();
    drop(records);
    println!(
        "regtest-a: {blocks} blocks, {txs} transactions (coinbases included), {runs} rounds"
    );

    let (mut per_block, mut grouped, mut core, mut decode) =
        (f64::MAX, f64::MAX, f64::MAX, f64::MAX);
    for round in 1..=runs {
        let t = Instant::now();
        std::hint::black_box(read_file(&file, &params).expect("read"));
        let d = t.elapsed().as_secs_f64();
        let p = kakehi_import(&file, &params, GroupLimits::PER_BLOCK);
        let g = kakehi_import(&file, &params, GroupLimits::NODE_DEFAULT);
        let c = if with_core { core_import(&file) } else { f64::NAN };
        println!(
            "round {round}: kakehi per block {p:.2} s, kakehi grouped {g:.2} s, Core's engine {c:.2} s, decode only {d:.3} s"
        );
        per_block = per_block.min(p);
        grouped = grouped.min(g);
        core = core.min(c);
        decode = decode.min(d);
    }
    let line = |name: &str, secs: f64| {
        println!(
            "{name}: {secs:.2} s, {:.0} blocks/s, {:.0} tx/s",
            blocks / secs,
            txs as f64 / secs
        );
    };
    println!("best of {runs}:");
    line("kakehi, every block durable", per_block);
    line("kakehi, groups while catching up (kakehi import)", grouped);
    if with_core {
        line("Bitcoin Core's engine (scripts checked)", core);
        println!(
            "kakehi grouped vs Core's engine: {:.2}x; per block vs Core: {:.2}x",
            core / grouped,
            core / per_block
        );
    }
    println!("decode only (baseline): {decode:.3} s");
    println!("grouped vs per block: {:.2}x", per_block / grouped);
}
