//! Memory and time of merging the index rows' largest runs: four run
//! files of `KAKEHI_BENCH_RUN_KEYS` uniform 16-byte keys each (default
//! 4,000,000: 64 MB a run), written by `make`, then merged into one by the
//! store's compaction in a fresh process, `merge`, which prints the
//! resident memory before the merge and the peak during it (`VmRSS`,
//! `VmHWM` of `/proc/self/status`, the peak reset first) and the seconds
//! the merge took, and the seconds and bytes read (`rchar`) of opening
//! the store first. The peak's growth is what writing the merged run holds.
//!
//! Run (the two steps in two processes, so that the memory of making the
//! runs is not counted):
//! `cargo bench --bench run_write -- make DIR` then
//! `/usr/bin/time -v target/release/deps/run_write-* merge DIR` (`DIR` new
//! or empty; delete it after).

use std::path::Path;
use std::time::Instant;

use kakehi::store::runs::{RowOptions, RowSets};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs merged at once by the store's compaction (its fan-in).
const RUNS: u64 = 4;

/// splitmix64: uniform keys, as the txid prefixes that lead the real rows.
fn key(i: u64) -> [u8; 16] {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&mix(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_be_bytes());
    k[8..].copy_from_slice(&i.to_be_bytes());
    k
}

/// `VmRSS` and `VmHWM` of this process, MiB.
fn memory() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(f64::NAN, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Bytes this process has read so far (`rchar` of `/proc/self/io`: every
/// read and positional read, from the page cache or the disk).
fn bytes_read() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn options() -> RowOptions {
    RowOptions {
        memory_bound: usize::MAX,
        ..RowOptions::default()
    }
}

fn make(dir: &Path, per_run: u64) {
    let (sets, _) = RowSets::open(dir, options()).expect("open");
    for r in 0..RUNS {
        if r == RUNS - 1 {
            // The merge is the next process's.
            sets.halt();
        }
        let start = Instant::now();
        sets.txs()
            .insert((r * per_run..(r + 1) * per_run).map(key).collect());
        sets.flush().expect("flush");
        println!(
            "run {r}: {per_run} keys in {:.1} s",
            start.elapsed().as_secs_f64()
        );
    }
}

fn merge(dir: &Path) {
    let (start, read) = (Instant::now(), bytes_read());
    let (sets, _) = RowSets::open(dir, options()).expect("open");
    println!(
        "open: {:.3} s, {} bytes read",
        start.elapsed().as_secs_f64(),
        bytes_read() - read
    );
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let (before, _) = memory();
    let start = Instant::now();
    sets.txs().insert(vec![[0u8; 16]]);
    sets.flush().expect("flush");
    sets.settle().expect("merge");
    let secs = start.elapsed().as_secs_f64();
    let (_, peak) = memory();
    let runs = sets.txs().runs();
    let keys: u64 = runs.iter().map(|r| r.count()).sum();
    println!(
        "merge: {secs:.1} s, {} runs ({keys} keys) now; RSS before {before:.1} MiB, \
         peak during {peak:.1} MiB (+{:.1} MiB)",
        runs.len(),
        peak - before
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let per_run = std::env::var("KAKEHI_BENCH_RUN_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4_000_000);
    match (args.first().map(String::as_str), args.get(1)) {
        (Some("make"), Some(dir)) => make(Path::new(dir), per_run),
        (Some("merge"), Some(dir)) => merge(Path::new(dir)),
        _ => eprintln!("usage: run_write (make | merge) DIR"),
    }
}
