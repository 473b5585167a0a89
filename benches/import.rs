//! Import throughput of testnet-data/regtest-a (1,529 blocks, 22,543
//! non-coinbase transactions, 7 reorgs) through the full pipeline, against a
//! decode-only baseline measured in the same run.
//!
//! Run: `cargo bench --bench import` (`KAKEHI_BENCH_RUNS=N`, default 3).

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use bitcoin::Network;
use kakehi::chain::ChainParams;
use kakehi::import::{import_files, read_file};
use kakehi::node::{open_chainstate, DataDir};
use parking_lot::Mutex;

fn main() {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testnet-data/regtest-a/blocks.dat");
    let params = ChainParams::new(Network::Regtest);
    let runs: usize = std::env::var("KAKEHI_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let records = read_file(&file, &params).expect("read");
    let blocks = records.len() as f64;
    let txs: usize = records.iter().map(|r| r.block.txdata.len()).sum();
    drop(records);

    let mut best_import = f64::MAX;
    let mut best_decode = f64::MAX;
    for _ in 0..runs {
        let t = Instant::now();
        let r = read_file(&file, &params).expect("read");
        std::hint::black_box(&r);
        best_decode = best_decode.min(t.elapsed().as_secs_f64());

        let dir = tempfile::tempdir().expect("tempdir");
        let datadir = DataDir::open(dir.path()).expect("datadir");
        let chain = Mutex::new(open_chainstate(params.clone(), &datadir).expect("open"));
        let t = Instant::now();
        let s = import_files(
            &chain,
            std::slice::from_ref(&file),
            &AtomicBool::new(false),
            false,
        )
        .expect("import");
        best_import = best_import.min(t.elapsed().as_secs_f64());
        assert_eq!(s.tip_height, 1500);
    }
    println!(
        "regtest-a: {blocks} blocks, {txs} transactions (coinbases included), best of {runs} runs"
    );
    println!(
        "import (full pipeline, one commit per block): {:.2} s, {:.0} blocks/s, {:.0} tx/s",
        best_import,
        blocks / best_import,
        txs as f64 / best_import
    );
    println!(
        "decode only (baseline): {:.3} s, {:.0} blocks/s",
        best_decode,
        blocks / best_decode
    );
    println!("vs decode-only: {:.3}x", best_decode / best_import);
}
