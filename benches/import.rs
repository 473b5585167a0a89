//! Import throughput of testnet-data/regtest-a (1,529 blocks, 22,543
//! non-coinbase transactions, 7 reorgs) through the full pipeline, side by
//! side with Bitcoin Core's own engine on the same file.
//!
//! Each round runs, one after the other on the same machine:
//! - kakehi with every block a durable boundary (`GroupLimits::PER_BLOCK`,
//!   what a synced node does), every script verified by Core's interpreter
//!   (regtest's default: no assumevalid block);
//! - kakehi as `kakehi import` runs it: blocks older than 24 h made durable
//!   in groups (`GroupLimits::NODE_DEFAULT`: 1,000 blocks, 32 MiB, 1 s),
//!   scripts verified;
//! - the same, with the best chain's scripts skipped by assumevalid (its
//!   tip as the assumevalid block, 2,100 headers built on it given first so
//!   that every best-chain block is two weeks of work below the best
//!   header; stale blocks are still checked);
//! - Bitcoin Core's engine (`benches/core_import.py`: `pbk`
//!   `ChainstateManager.import_blocks`, default caches, scripts checked, one
//!   script-check worker per core but one, as bitcoind's `-par` default);
//! - a decode-only baseline.
//!
//! Run: `cargo bench --bench import` (`KAKEHI_BENCH_RUNS=N` rounds, default
//! 3; `KAKEHI_BENCH_SKIP_CORE=1` skips Core's engine). Prints every round
//! and the best of each.

#[path = "../tests/common/blockgen.rs"]
#[allow(dead_code)]
mod blockgen;
#[path = "common/core.rs"]
mod core_engine;
#[path = "common/env.rs"]
mod env;
#[path = "common/timed_import.rs"]
mod timed_import;

use std::path::{Path, PathBuf};
use std::time::Instant;

use bitcoin::block::Header;
use bitcoin::{Amount, Network, TxOut};
use env::env_or;
use kakehi::chain::assumevalid::AssumeValid;
use kakehi::chain::ChainParams;
use kakehi::import::read_file;
use kakehi::pipeline::{GroupLimits, PipelineStats};
use timed_import::timed_import;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// One kakehi import of `file` into a fresh datadir with `limits`; `assume`
/// gives the assumevalid block and the headers to accept first. Returns the
/// seconds and the pipeline's counters.
fn kakehi_import(
    file: &Path,
    params: &ChainParams,
    limits: GroupLimits,
    assume: Option<(AssumeValid, &[Header])>,
) -> (f64, PipelineStats) {
    let (secs, chain, _dir) = timed_import(file, params.clone(), |cs| {
        cs.set_group_limits(limits);
        if let Some((setting, headers)) = assume {
            cs.set_assume_valid(setting);
            let accepted = cs.accept_headers(headers).expect("headers");
            assert!(accepted.refused.is_none(), "{:?}", accepted.refused);
        }
    });
    let stats = chain.lock().stats().clone();
    (secs, stats)
}

/// One import of `file` by Bitcoin Core's engine with `workers`
/// script-check threads: seconds.
fn core_import(file: &Path, workers: usize) -> f64 {
    let v = core_engine::import(&[file.to_path_buf()], workers);
    assert_eq!(v["height"], 1500, "Core's engine did not reach the tip");
    v["seconds"].as_f64().unwrap_or(f64::NAN)
}

/// regtest-a's best-chain headers, then `extra` headers built on its tip,
/// and its tip as the assumevalid block.
fn headers_beyond_the_tip(
    file: &Path,
    params: &ChainParams,
    extra: u32,
) -> (Vec<Header>, AssumeValid) {
    let (_, chain, _dir) = timed_import(file, params.clone(), |_| {});
    let cs = chain.lock();
    let index = cs.index();
    let tip = index.tip().clone();
    let mut headers: Vec<Header> = (1..=tip.height)
        .filter_map(|h| index.active_at(h).map(|e| e.header))
        .collect();
    let wallet = blockgen::Wallet::new();
    let mut prev = (tip.hash, tip.header.time);
    for i in 1..=extra {
        let height = tip.height + i;
        let pay = TxOut {
            value: Amount::from_sat(blockgen::subsidy(height)),
            script_pubkey: wallet.script_pubkey(blockgen::Kind::P2wpkh),
        };
        let b = blockgen::mine(prev, blockgen::coinbase(height, 0, vec![pay]), vec![]);
        prev = (b.block_hash(), b.header.time);
        headers.push(b.header);
    }
    (headers, AssumeValid::Block(tip.hash))
}

/// The best (lowest) time of each configuration over the rounds.
struct Best {
    per_block: f64,
    grouped: f64,
    assumed: f64,
    core: f64,
    decode: f64,
    /// The counters of the fastest grouped import with scripts.
    scripts: PipelineStats,
}

fn main() {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testnet-data/regtest-a/blocks.dat");
    let params = ChainParams::new(Network::Regtest);
    let runs: usize = env_or("KAKEHI_BENCH_RUNS", 3);
    let with_core = std::env::var_os("KAKEHI_BENCH_SKIP_CORE").is_none();
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
    let records = read_file(&file, &params).expect("read");
    let blocks = records.len() as f64;
    let txs: usize = records.iter().map(|r| r.block.txdata.len()).sum();
    drop(records);
    let (headers, assumed) = headers_beyond_the_tip(&file, &params, 2_100);
    println!("regtest-a: {blocks} blocks, {txs} transactions (coinbases included), {runs} rounds");

    let mut best = Best {
        per_block: f64::MAX,
        grouped: f64::MAX,
        assumed: f64::MAX,
        core: f64::MAX,
        decode: f64::MAX,
        scripts: PipelineStats::default(),
    };
    for round in 1..=runs {
        let t = Instant::now();
        std::hint::black_box(read_file(&file, &params).expect("read"));
        let d = t.elapsed().as_secs_f64();
        let (p, _) = kakehi_import(&file, &params, GroupLimits::PER_BLOCK, None);
        let (g, stats) = kakehi_import(&file, &params, GroupLimits::NODE_DEFAULT, None);
        let assume = Some((assumed, headers.as_slice()));
        let (a, av) = kakehi_import(&file, &params, GroupLimits::NODE_DEFAULT, assume);
        assert!(av.blocks_assumed_valid >= 1_400, "{av:?}");
        let c = if with_core {
            core_import(&file, workers)
        } else {
            f64::NAN
        };
        println!(
            "round {round}: kakehi per block {p:.2} s, kakehi grouped {g:.2} s, \
             grouped assumevalid {a:.2} s, Core's engine {c:.2} s, decode only {d:.3} s"
        );
        best.per_block = best.per_block.min(p);
        if g < best.grouped {
            best.grouped = g;
            best.scripts = stats;
        }
        best.assumed = best.assumed.min(a);
        best.core = best.core.min(c);
        best.decode = best.decode.min(d);
    }
    report(
        &best,
        blocks,
        txs as f64,
        runs,
        with_core.then_some(workers),
    );
}

/// Prints the best of each configuration and the same-run ratios.
fn report(best: &Best, blocks: f64, txs: f64, runs: usize, core_workers: Option<usize>) {
    let line = |name: &str, secs: f64| {
        println!(
            "{name}: {secs:.2} s, {:.0} blocks/s, {:.0} tx/s",
            blocks / secs,
            txs / secs
        );
    };
    println!("best of {runs}:");
    line(
        "kakehi, every block durable, scripts verified",
        best.per_block,
    );
    line(
        "kakehi, groups while catching up (kakehi import), scripts verified",
        best.grouped,
    );
    line(
        "kakehi, groups, best chain assumed valid (stale blocks checked)",
        best.assumed,
    );
    println!(
        "scripts: {} inputs verified in {:.2} s of verification (overlapping filter and MuHash work)",
        best.scripts.inputs_verified,
        best.scripts.script_micros as f64 / 1e6
    );
    println!(
        "grouped, scripts verified / assumed valid: {:.2}x the time",
        best.grouped / best.assumed
    );
    if let Some(workers) = core_workers {
        line(
            &format!("Bitcoin Core's engine (scripts checked, {workers} worker thread(s))"),
            best.core,
        );
        println!(
            "Core's time / kakehi's: grouped {:.2}x, per block {:.2}x, grouped assumevalid {:.2}x",
            best.core / best.grouped,
            best.core / best.per_block,
            best.core / best.assumed
        );
    }
    println!("decode only (baseline): {:.3} s", best.decode);
    println!(
        "grouped vs per block: {:.2}x",
        best.per_block / best.grouped
    );
}
