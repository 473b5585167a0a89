//! Import at scale: a generated chain (`kakehi-chaingen`'s blk files, e.g.
//! `--profile testnet4`: 120,000 blocks, 5M live UTXOs) through the whole
//! pipeline, block by block, with Bitcoin Core's own engine importing the
//! same files in the same run as the anchor.
//!
//! Run: `KAKEHI_SCALE_CHAIN=DIR cargo bench --bench scale`, where DIR holds
//! the generator's `blk*.dat` and `manifest.json`.
//! `KAKEHI_SCALE_SKIP_CORE=1` skips the anchor.
//!
//! Prints, for each tenth of the blocks: blocks/s, tx/s, inputs/s
//! (non-coinbase inputs), milliseconds per block at p50 and p99, the
//! process's RSS and the datadir's bytes; then the whole import, the end
//! state against the manifest, each datadir component's bytes next to the
//! raw block bytes, and Core's time (`pbk` `ChainstateManager.import_blocks`,
//! default caches, scripts checked) with the ratio.

#[path = "common/mod.rs"]
mod common;
#[path = "common/core.rs"]
mod core_engine;

use std::path::{Path, PathBuf};
use std::time::Instant;

use bitcoin::Network;
use kakehi::chain::ChainParams;
use kakehi::import::read_file;
use kakehi::node::{open_chainstate, DataDir};
use kakehi::pipeline::SubmitOutcome;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What one tenth of the import measured.
#[derive(Default)]
struct Tenth {
    blocks: u64,
    txs: u64,
    inputs: u64,
    seconds: f64,
    block_ms: Vec<f64>,
}

fn main() {
    let Some(dir) = std::env::var_os("KAKEHI_SCALE_CHAIN").map(PathBuf::from) else {
        eprintln!(
            "set KAKEHI_SCALE_CHAIN to a kakehi-chaingen output directory \
             (cargo run --release --bin kakehi-chaingen -- --profile testnet4 --seed 1 --out DIR)"
        );
        std::process::exit(2);
    };
    let files = blk_files(&dir);
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join("manifest.json")).expect("read manifest.json"),
    )
    .expect("parse manifest.json");
    let params = ChainParams::new(Network::Regtest);
    let total = count_records(&files);
    let raw_bytes: u64 = files.iter().map(|f| file_len(f)).sum();
    println!(
        "chain: {} ({} files, {total} blocks, {:.0} MiB)",
        dir.display(),
        files.len(),
        mib(raw_bytes)
    );

    let datadir_tmp = tempfile::tempdir().expect("tempdir");
    let datadir = DataDir::open(datadir_tmp.path()).expect("datadir");
    let mut chain = open_chainstate(params.clone(), &datadir).expect("open");
    println!(
        "{:>6} {:>8} {:>9} {:>9} {:>10} {:>8} {:>8} {:>8} {:>10}",
        "tenth",
        "blocks",
        "blocks/s",
        "tx/s",
        "inputs/s",
        "p50 ms",
        "p99 ms",
        "RSS MiB",
        "datadir MiB"
    );
    let tenth_size = total.div_ceil(10).max(1);
    let mut tenth = Tenth::default();
    let (mut first, mut last) = (None, None);
    let (mut all_blocks, mut all_inputs, mut all_seconds) = (0u64, 0u64, 0f64);
    let mut rejected = 0u64;
    let mut n = 0u64;
    for file in &files {
        for rec in read_file(file, &params).expect("read block file") {
            let inputs: u64 = rec
                .block
                .txdata
                .iter()
                .skip(1)
                .map(|t| t.input.len() as u64)
                .sum();
            let t = Instant::now();
            let outcome = chain.submit_block(&rec.block).expect("pipeline");
            let secs = t.elapsed().as_secs_f64();
            if matches!(outcome, SubmitOutcome::Rejected { .. }) {
                rejected += 1;
            }
            tenth.blocks += 1;
            tenth.txs += rec.block.txdata.len() as u64;
            tenth.inputs += inputs;
            tenth.seconds += secs;
            tenth.block_ms.push(secs * 1e3);
            n += 1;
            if n.is_multiple_of(tenth_size) || n == total {
                let rate = tenth.inputs as f64 / tenth.seconds;
                first.get_or_insert(rate);
                last = Some(rate);
                all_blocks += tenth.blocks;
                all_inputs += tenth.inputs;
                all_seconds += tenth.seconds;
                print_tenth(n.div_ceil(tenth_size), &mut tenth, datadir_tmp.path());
            }
        }
    }
    let tip = chain.index().tip();
    let want_tip = manifest["tip_hash"].as_str().unwrap_or_default();
    println!(
        "\nkakehi import: {all_blocks} blocks in {all_seconds:.1} s of pipeline time: {:.0} blocks/s, {:.0} inputs/s; {rejected} rejected",
        all_blocks as f64 / all_seconds,
        all_inputs as f64 / all_seconds
    );
    if let (Some(f), Some(l)) = (first, last) {
        println!(
            "flat cost: inputs/s in the last tenth = {:.2}x the first",
            l / f
        );
    }
    println!(
        "tip: height {} {} ({} the manifest's)",
        tip.height,
        tip.hash,
        if tip.hash.to_string() == want_tip {
            "equals"
        } else {
            "DIFFERS FROM"
        }
    );
    drop(chain);
    print_components(datadir_tmp.path(), raw_bytes);

    if std::env::var_os("KAKEHI_SCALE_SKIP_CORE").is_some() {
        return;
    }
    let core = core_engine::import(&files, 0);
    let core_secs = core["seconds"].as_f64().unwrap_or(f64::NAN);
    println!(
        "Bitcoin Core's engine (pbk import_blocks, scripts checked): {core_secs:.1} s to height {} ({}); kakehi import vs Core: {:.2}x",
        core["height"],
        if core["tip"].as_str() == Some(want_tip) { "tip equals the manifest's" } else { "tip DIFFERS" },
        core_secs / all_seconds
    );
}

fn print_tenth(index: u64, t: &mut Tenth, datadir: &Path) {
    t.block_ms.sort_by(f64::total_cmp);
    let pct = |p: f64| t.block_ms[((t.block_ms.len() - 1) as f64 * p).round() as usize];
    println!(
        "{:>6} {:>8} {:>9.0} {:>9.0} {:>10.0} {:>8.2} {:>8.2} {:>8} {:>10.0}",
        index,
        t.blocks,
        t.blocks as f64 / t.seconds,
        t.txs as f64 / t.seconds,
        t.inputs as f64 / t.seconds,
        pct(0.5),
        pct(0.99),
        common::status_mib("VmRSS:"),
        mib(common::dir_bytes(datadir))
    );
    *t = Tenth::default();
}

/// Each top-level component of the datadir (index, sozu, blocks, filters,
/// spent, archive, …) with its bytes, and the raw block bytes.
fn print_components(datadir: &Path, raw_bytes: u64) {
    println!(
        "datadir components (raw blocks: {:.0} MiB):",
        mib(raw_bytes)
    );
    let mut entries: Vec<_> = std::fs::read_dir(datadir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let bytes = common::dir_bytes(&e.path()).max(file_len(&e.path()));
        println!(
            "  {:<10} {:>10.1} MiB  {:.2}x raw",
            e.file_name().to_string_lossy(),
            mib(bytes),
            bytes as f64 / raw_bytes as f64
        );
    }
}

/// The generator's block files (`blk*.dat`), in name order.
fn blk_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read chain directory")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("blk") && n.ends_with(".dat"))
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no blk*.dat in {}", dir.display());
    files
}

/// Records in `files`, by their framing only (magic, length).
fn count_records(files: &[PathBuf]) -> u64 {
    let mut n = 0;
    for f in files {
        let data = std::fs::read(f).expect("read block file");
        let mut pos = 0usize;
        while pos + 8 <= data.len() && data[pos..pos + 4] != [0, 0, 0, 0] {
            let len =
                u32::from_le_bytes([data[pos + 4], data[pos + 5], data[pos + 6], data[pos + 7]]);
            pos += 8 + len as usize;
            n += 1;
        }
    }
    n
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}
