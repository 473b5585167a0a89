//! Import at scale: a generated chain (`kakehi-chaingen`'s blk files, e.g.
//! `--profile testnet4`: 120,000 blocks, 5M live UTXOs) through the whole
//! pipeline, block by block, as `kakehi import` runs it (groups of blocks
//! made durable together while catching up, `GroupLimits::NODE_DEFAULT`),
//! with Bitcoin Core's own engine importing the same files in the same run
//! as the anchor.
//!
//! Run: `KAKEHI_SCALE_CHAIN=DIR cargo bench --bench scale`, where DIR holds
//! the generator's `blk*.dat` and `manifest.json`.
//! `KAKEHI_SCALE_FILES=N` imports only the first N block files (a prefix
//! of the chain, when the whole would not fit the disk or the time; the
//! manifest, which describes the whole chain, is then only compared for
//! the filter headers at least 100 blocks below the prefix's tip, and may
//! be absent). `KAKEHI_SCALE_ASSUMEVALID=1` imports without verifying most
//! scripts, as a node with an assumevalid block does: every header of the
//! files is accepted first, and the best header chain's block 2,100 below
//! its tip (more than Core's two weeks of proof-equivalent work) is the
//! assumevalid block; without it every script is verified (regtest has no
//! default assumevalid block). `KAKEHI_SCALE_ASSUMEVALID=chain` takes the
//! headers of every file of the chain instead, so that with
//! `KAKEHI_SCALE_FILES` no imported block is within 2,100 of the
//! assumevalid block: the import then verifies no script at all (blocks
//! without scripts from first to last tenth, the flat cost of everything
//! else). `KAKEHI_SCALE_SKIP_CORE=1` skips the anchor; `KAKEHI_SCALE_CORE_FILES=N`
//! gives Core's engine only the first N block files (a prefix, when the
//! whole chain would take too long), and the ratio is then taken against
//! kakehi's time over the same files. `KAKEHI_SCALE_NO_ADDRESS_INDEX=1`
//! imports without the address index (on by default, as in the node).
//! `KAKEHI_SCALE_ROWS_CACHE_MIB=N` and `KAKEHI_SCALE_ARCHIVE_CACHE_MIB=N`
//! set the caches of the run files' partitions and of the epoch filters
//! (`index.filter_cache_mib`, `archive.filter_cache_mib`; default 256
//! each). `KAKEHI_SCALE_DATADIR=DIR` puts
//! kakehi's temporary datadir under DIR (default: the system's temporary
//! directory); it is deleted before Core's engine runs, unless
//! `KAKEHI_SCALE_KEEP=1` keeps it (its path is printed) for later runs of
//! the node, or for `KAKEHI_SCALE_ROUTES=DIR`: no import, only the
//! address routes' timings (`scale/address.rs`) on the kept datadir DIR
//! reopened (to compare two builds on the same chain state).
//! `KAKEHI_SCALE_P2P=1` then syncs an empty second node from the importing
//! one over loopback P2P, with the same settings (with
//! `KAKEHI_SCALE_ASSUMEVALID=1`: under `=chain` and a prefix of the files
//! the assumevalid block is above A's tip, so B, which learns only A's
//! active headers, verifies every script: a printed note says so), and compares the two
//! (`scale/p2p.rs`: per tenth, the ratio P2P sync vs import, tip, UTXO
//! dump, filter headers, HTTP answers, the second node's reopen).
//!
//! Prints, for each tenth of the blocks: blocks/s, tx/s, inputs/s
//! (non-coinbase inputs), the process's CPU µs per input, milliseconds per block at p50 and p99, the
//! process's RSS, what the UTXO table (page images and summaries), the
//! index rows (keys in memory, the cached partitions of the run files' block indexes and filters)
//! and the archive's cached epoch filters hold of it
//! (`ChainSnapshot::memory_use`), and the datadir's bytes; then the whole import (pipeline
//! time, and wall time with the reading and decoding of the files), the end
//! state against the manifest (tip, SHA-256 of the `dump-utxos` text, the
//! filter header at every 1,000th height), each datadir component's bytes
//! next to the raw block bytes, the time to reopen the datadir at the tip,
//! and Core's time (`pbk` `ChainstateManager.import_blocks`, default caches,
//! scripts checked) with the ratio.

#[path = "scale/address.rs"]
mod address;
#[path = "common/mod.rs"]
mod common;
#[path = "common/core.rs"]
mod core_engine;
#[path = "common/http_get.rs"]
mod http_get;
#[path = "scale/p2p.rs"]
mod p2p;
#[path = "common/p2p_node.rs"]
mod p2p_node;
// For `spawn_http`; its `python` module is also `core_engine`'s.
#[allow(clippy::duplicate_mod)]
#[path = "../tests/common/mod.rs"]
mod tcommon;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use bitcoin::block::Header;
use bitcoin::hashes::{sha256, Hash, HashEngine};
use bitcoin::{BlockHash, Network};
use kakehi::chain::assumevalid::AssumeValid;
use kakehi::chain::ChainParams;
use kakehi::import::scan_block_file;
use kakehi::node::{open_chainstate_with, DataDir};
use kakehi::pipeline::{Chainstate, GroupLimits, SubmitOutcome};
use kakehi::snapshot::MemoryUse;
use kakehi::store::Budgets;

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
    /// CPU time of the process (user + system, every thread: reading and
    /// decoding the files included) over the tenth.
    cpu_seconds: f64,
}

/// What the whole import measured.
#[derive(Default)]
struct Totals {
    blocks: u64,
    txs: u64,
    inputs: u64,
    /// Time inside `submit_block`.
    pipeline_seconds: f64,
    /// Pipeline time at the end of each block file.
    seconds_after_file: Vec<f64>,
    /// The process's CPU time since the import began (reading and decoding
    /// the files included), at the end of each block file.
    cpu_after_file: Vec<f64>,
    /// inputs/s of the first and the last tenth.
    first_rate: Option<f64>,
    last_rate: Option<f64>,
    /// CPU µs per input of the first and the last tenth (less sensitive to
    /// other tenants of a shared machine than the wall rate).
    first_cpu_per_input: Option<f64>,
    last_cpu_per_input: Option<f64>,
    rejected: u64,
    /// Wall time: headers first (with assumevalid), reading and decoding
    /// the files, the pipeline, the last group and seals.
    wall_seconds: f64,
    /// CPU time of the process over the same span (user + system).
    cpu_seconds: f64,
    /// (transactions, non-coinbase inputs) of every block submitted.
    per_block: HashMap<BlockHash, (u64, u64)>,
}

fn main() {
    if let Some(kept) = std::env::var_os("KAKEHI_SCALE_ROUTES") {
        let datadir = DataDir::open(Path::new(&kept)).expect("datadir");
        address::time_routes(&reopen(&ChainParams::new(Network::Regtest), &datadir));
        return;
    }
    let Some(dir) = std::env::var_os("KAKEHI_SCALE_CHAIN").map(PathBuf::from) else {
        eprintln!(
            "set KAKEHI_SCALE_CHAIN to a kakehi-chaingen output directory \
             (cargo run --release --bin kakehi-chaingen -- --profile testnet4 --seed 1 --out DIR)"
        );
        std::process::exit(2);
    };
    let mut files = blk_files(&dir);
    let chain_files = files.clone();
    let all_files = files.len();
    let prefix = env_usize("KAKEHI_SCALE_FILES").map(|n| n.clamp(1, all_files));
    files.truncate(prefix.unwrap_or(all_files));
    let whole = files.len() == all_files;
    let manifest: serde_json::Value = match std::fs::read(dir.join("manifest.json")) {
        Ok(bytes) => serde_json::from_slice(&bytes).expect("parse manifest.json"),
        Err(_) if !whole => serde_json::Value::Null,
        Err(e) => panic!("read manifest.json: {e}"),
    };
    let params = ChainParams::new(Network::Regtest);
    let total = count_records(&files);
    let raw_bytes: u64 = files.iter().map(|f| file_len(f)).sum();
    println!(
        "chain: {} ({} of {all_files} files, {total} blocks, {:.0} MiB; manifest of the whole chain: tip height {}, {} UTXOs, {} transactions)",
        dir.display(),
        files.len(),
        mib(raw_bytes),
        manifest["tip_height"],
        manifest["utxo_count"],
        manifest["stats"]["transactions"]
    );

    let mut datadir_tmp = match std::env::var_os("KAKEHI_SCALE_DATADIR") {
        Some(parent) => {
            std::fs::create_dir_all(&parent).unwrap_or_else(|e| {
                panic!("KAKEHI_SCALE_DATADIR {}: {e}", Path::new(&parent).display())
            });
            tempfile::tempdir_in(parent)
        }
        None => tempfile::tempdir(),
    }
    .expect("a temporary datadir");
    if std::env::var_os("KAKEHI_SCALE_KEEP").is_some() {
        datadir_tmp.disable_cleanup(true);
        println!("datadir: {} (kept)", datadir_tmp.path().display());
    }
    let datadir = DataDir::open(datadir_tmp.path()).expect("datadir");
    let b = budgets();
    println!(
        "caches: run partitions {} MiB, epoch filters {} MiB",
        b.rows.filter_cache >> 20,
        b.archive_filter_cache >> 20
    );
    let mut chain = open_chainstate_with(params.clone(), &datadir, &b).expect("open");
    chain.set_group_limits(GroupLimits::NODE_DEFAULT);
    if std::env::var_os("KAKEHI_SCALE_NO_ADDRESS_INDEX").is_some() {
        chain
            .set_address_index(false, &mut |_| {})
            .expect("address index off");
        println!("address index: off (`--no-address-index`)");
    }
    let address_index = std::env::var_os("KAKEHI_SCALE_NO_ADDRESS_INDEX").is_none();
    let (wall, cpu) = (Instant::now(), common::cpu_seconds());
    let assume_valid = if let Some(mode) = std::env::var_os("KAKEHI_SCALE_ASSUMEVALID") {
        let headers_of = if mode == "chain" {
            &chain_files
        } else {
            &files
        };
        Some(assume_valid(&mut chain, headers_of))
    } else {
        println!("scripts: every input's scripts verified (no assumevalid block)");
        None
    };
    let mut totals = import(&mut chain, &files, &params, total, datadir_tmp.path());
    let t = Instant::now();
    chain.finish_seals().expect("last group and seals");
    totals.pipeline_seconds += t.elapsed().as_secs_f64();
    totals.wall_seconds = wall.elapsed().as_secs_f64();
    totals.cpu_seconds = common::cpu_seconds() - cpu;
    print_totals(&totals);
    check_end_state(&mut chain, &manifest, whole);
    drop(chain);
    print_components(datadir_tmp.path(), raw_bytes);
    let chain = reopen(&params, &datadir);
    if address_index {
        address::time_routes(&chain);
    }
    if std::env::var_os("KAKEHI_SCALE_P2P").is_some() {
        let settings = p2p::Settings {
            assume_valid,
            address_index,
            parent: std::env::var_os("KAKEHI_SCALE_DATADIR").map(PathBuf::from),
        };
        p2p::run(p2p_node::Node::new(chain, datadir), &totals, &settings);
    } else {
        drop(chain);
        drop(datadir);
    }
    drop(datadir_tmp);

    if std::env::var_os("KAKEHI_SCALE_SKIP_CORE").is_none() {
        run_core(&files, &totals, &manifest, whole);
    }
}

/// Submits every block of `files` to `chain`, printing a row per tenth.
fn import(
    chain: &mut Chainstate,
    files: &[PathBuf],
    params: &ChainParams,
    total: u64,
    datadir: &Path,
) -> Totals {
    println!(
        "{:>6} {:>8} {:>9} {:>9} {:>10} {:>11} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>11}",
        "tenth",
        "blocks",
        "blocks/s",
        "tx/s",
        "inputs/s",
        "CPU µs/in",
        "p50 ms",
        "p99 ms",
        "RSS MiB",
        "UTXO MiB",
        "rows MiB",
        "arch MiB",
        "datadir MiB"
    );
    let tenth_size = total.div_ceil(10).max(1);
    let mut tenth = Tenth::default();
    let mut totals = Totals::default();
    let cpu_start = common::cpu_seconds();
    let mut tenth_cpu = common::cpu_seconds();
    for file in files {
        // As `kakehi import` reads them: the file's bytes, each block
        // decoded when reached.
        let (block_file, problem) = scan_block_file(file, params);
        if let Some(e) = problem {
            panic!("read block file: {e}");
        }
        for rec in block_file.records() {
            let rec = rec.expect("decode a scanned block");
            let inputs: u64 = rec
                .block
                .txdata
                .iter()
                .skip(1)
                .map(|t| t.input.len() as u64)
                .sum();
            totals.per_block.insert(
                rec.block.block_hash(),
                (rec.block.txdata.len() as u64, inputs),
            );
            let t = Instant::now();
            let outcome = chain.submit_block(&rec.block).expect("pipeline");
            let secs = t.elapsed().as_secs_f64();
            if matches!(outcome, SubmitOutcome::Rejected { .. }) {
                totals.rejected += 1;
            }
            tenth.blocks += 1;
            tenth.txs += rec.block.txdata.len() as u64;
            tenth.inputs += inputs;
            tenth.seconds += secs;
            tenth.block_ms.push(secs * 1e3);
            totals.blocks += 1;
            if totals.blocks.is_multiple_of(tenth_size) || totals.blocks == total {
                let rate = tenth.inputs as f64 / tenth.seconds;
                totals.first_rate.get_or_insert(rate);
                totals.last_rate = Some(rate);
                let cpu = common::cpu_seconds();
                tenth.cpu_seconds = cpu - std::mem::replace(&mut tenth_cpu, cpu);
                let per_input = tenth.cpu_seconds * 1e6 / tenth.inputs.max(1) as f64;
                totals.first_cpu_per_input.get_or_insert(per_input);
                totals.last_cpu_per_input = Some(per_input);
                totals.txs += tenth.txs;
                totals.inputs += tenth.inputs;
                totals.pipeline_seconds += tenth.seconds;
                let memory = chain.snapshot().memory_use();
                print_tenth(
                    totals.blocks.div_ceil(tenth_size),
                    &mut tenth,
                    datadir,
                    memory,
                );
            }
        }
        totals
            .seconds_after_file
            .push(totals.pipeline_seconds + tenth.seconds);
        totals
            .cpu_after_file
            .push(common::cpu_seconds() - cpu_start);
    }
    totals
}

fn print_totals(t: &Totals) {
    let wall = t.wall_seconds;
    println!(
        "\nkakehi import: {} blocks, {} transactions, {} inputs in {:.1} s of pipeline time \
         (last group and epoch seals included): {:.0} blocks/s, {:.0} tx/s, {:.0} inputs/s; \
         wall time with reading and decoding the files: {wall:.1} s ({:.0} inputs/s); CPU time {:.1} s \
         ({:.1} µs per input); {} rejected; peak RSS {} MiB",
        t.blocks,
        t.txs,
        t.inputs,
        t.pipeline_seconds,
        t.blocks as f64 / t.pipeline_seconds,
        t.txs as f64 / t.pipeline_seconds,
        t.inputs as f64 / t.pipeline_seconds,
        t.inputs as f64 / wall,
        t.cpu_seconds,
        t.cpu_seconds * 1e6 / t.inputs as f64,
        t.rejected,
        common::status_mib("VmHWM:")
    );
    if let (Some(f), Some(l)) = (t.first_rate, t.last_rate) {
        println!(
            "flat cost: inputs/s in the last tenth = {:.2}x the first",
            l / f
        );
    }
    if let (Some(f), Some(l)) = (t.first_cpu_per_input, t.last_cpu_per_input) {
        println!(
            "flat cost by CPU: µs per input in the first tenth / the last = {:.2}x",
            f / l
        );
    }
}

/// Accepts every header of `files` (the imported ones, or the whole
/// chain's) and makes the best header chain's block 2,100 below its tip
/// the assumevalid block, and returns its hash.
fn assume_valid(chain: &mut Chainstate, files: &[PathBuf]) -> BlockHash {
    let t = Instant::now();
    let mut headers = Vec::new();
    for f in files {
        let data = std::fs::read(f).expect("read block file");
        let mut pos = 0usize;
        while pos + 88 <= data.len() && data[pos..pos + 4] != [0, 0, 0, 0] {
            let len =
                u32::from_le_bytes([data[pos + 4], data[pos + 5], data[pos + 6], data[pos + 7]]);
            headers.push(
                bitcoin::consensus::deserialize::<Header>(&data[pos + 8..pos + 88])
                    .expect("header"),
            );
            pos += 8 + len as usize;
        }
    }
    for batch in headers.chunks(2_000) {
        let out = chain.accept_headers(batch).expect("index database");
        assert!(out.refused.is_none(), "refused: {:?}", out.refused);
    }
    let index = chain.index();
    let best = index.best_header();
    let block = index
        .ancestor(best.id, best.height.saturating_sub(2_100))
        .expect("ancestor")
        .clone();
    chain.set_assume_valid(AssumeValid::Block(block.hash));
    println!(
        "scripts: assumevalid block {} at height {} ({} headers accepted first in {:.1} s): scripts verified above it only",
        block.hash,
        block.height,
        headers.len(),
        t.elapsed().as_secs_f64()
    );
    block.hash
}

/// Feeds what is written to a SHA-256 engine.
struct HashWriter(sha256::HashEngine);

impl std::io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.input(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The tip, the UTXO dump's SHA-256 and the filter headers against the
/// manifest; for a prefix of the chain (`whole` false), only the filter
/// headers at least 100 blocks below its tip (no reorganisation of the
/// generator's is deeper than 6).
fn check_end_state(chain: &mut Chainstate, manifest: &serde_json::Value, whole: bool) {
    let verdict = |same: bool| match (whole, same) {
        (false, _) => "a prefix: not compared with",
        (true, true) => "equals",
        (true, false) => "DIFFERS FROM",
    };
    let tip = chain.index().tip();
    let want_tip = manifest["tip_hash"].as_str().unwrap_or_default();
    println!(
        "tip: height {} {} ({} the manifest's)",
        tip.height,
        tip.hash,
        verdict(tip.hash.to_string() == want_tip)
    );
    let t = Instant::now();
    let sha = dump_sha256(chain);
    let utxos = chain.snapshot().utxo_stats().txouts;
    println!(
        "UTXO set: {utxos} outputs (manifest {}), dump-utxos SHA-256 {sha} ({} the manifest's; dump took {:.1} s)",
        manifest["utxo_count"],
        verdict(manifest["utxos_sha256"].as_str() == Some(sha.as_str())),
        t.elapsed().as_secs_f64()
    );
    let snapshot = chain.snapshot();
    let tip_height = snapshot.index().tip_height();
    let below = if whole {
        tip_height
    } else {
        tip_height.saturating_sub(100)
    };
    let (mut same, mut checked) = (0, 0);
    for fh in manifest["filter_headers"].as_array().into_iter().flatten() {
        let height = fh["height"].as_u64().unwrap_or(u64::MAX) as u32;
        if height > below {
            continue;
        }
        let got = filter_header_at(&snapshot, height);
        checked += 1;
        if got.as_deref() == fh["filter_header"].as_str() {
            same += 1;
        }
    }
    println!("filter headers: {same} of {checked} equal the manifest's (every 1,000th height)");
}

/// SHA-256 of the `dump-utxos` text, hex.
fn dump_sha256(chain: &mut Chainstate) -> String {
    let mut w = HashWriter(sha256::Hash::engine());
    chain.dump_utxos(&mut w).expect("dump-utxos");
    sha256::Hash::from_engine(w.0).to_string()
}

/// The basic filter header of the active block at `height`, hex.
fn filter_header_at(snapshot: &kakehi::snapshot::ChainSnapshot, height: u32) -> Option<String> {
    snapshot
        .index()
        .active_at(height)
        .and_then(|e| snapshot.filter(e.id).ok().flatten())
        .map(|(_, header)| header.to_string())
}

/// The memory knobs: the defaults, the filter caches from
/// `KAKEHI_SCALE_ROWS_CACHE_MIB` and `KAKEHI_SCALE_ARCHIVE_CACHE_MIB`.
fn budgets() -> Budgets {
    let mut b = Budgets::default();
    if let Some(n) = env_usize("KAKEHI_SCALE_ROWS_CACHE_MIB") {
        b.rows.filter_cache = n << 20;
    }
    if let Some(n) = env_usize("KAKEHI_SCALE_ARCHIVE_CACHE_MIB") {
        b.archive_filter_cache = n << 20;
    }
    b
}

/// Reopens the datadir at the tip, prints how long it took, and returns
/// the chain state.
fn reopen(params: &ChainParams, datadir: &DataDir) -> Chainstate {
    let t = Instant::now();
    let chain = open_chainstate_with(params.clone(), datadir, &budgets()).expect("reopen");
    let secs = t.elapsed().as_secs_f64();
    println!(
        "restart: reopening the datadir at height {} took {secs:.2} s (RSS {} MiB)",
        chain.index().tip().height,
        common::status_mib("VmRSS:")
    );
    chain
}

/// Core's engine over all of `files` or the first `KAKEHI_SCALE_CORE_FILES`.
fn run_core(files: &[PathBuf], totals: &Totals, manifest: &serde_json::Value, whole: bool) {
    let n = env_usize("KAKEHI_SCALE_CORE_FILES").map_or(files.len(), |n| n.clamp(1, files.len()));
    let core = core_engine::import(&files[..n], 0);
    let core_secs = core["seconds"].as_f64().unwrap_or(f64::NAN);
    let core_cpu = core["cpu_seconds"].as_f64().unwrap_or(f64::NAN);
    let kakehi_secs = if n == files.len() {
        totals.pipeline_seconds
    } else {
        totals.seconds_after_file[n - 1]
    };
    let kakehi_cpu = totals.cpu_after_file[n - 1];
    let want_tip = manifest["tip_hash"].as_str().unwrap_or_default();
    println!(
        "Bitcoin Core's engine (pbk import_blocks, scripts checked), {n} of {} block files: {core_secs:.1} s (CPU {core_cpu:.1} s) to height {} ({}); kakehi over the same files: {kakehi_secs:.1} s (CPU {kakehi_cpu:.1} s, reading the files included); kakehi import vs Core: {:.2}x by wall, {:.2}x by CPU",
        files.len(),
        core["height"],
        if n < files.len() || !whole { "a prefix" } else if core["tip"].as_str() == Some(want_tip) { "tip equals the manifest's" } else { "tip DIFFERS" },
        core_secs / kakehi_secs,
        core_cpu / kakehi_cpu
    );
}

fn print_tenth(index: u64, t: &mut Tenth, datadir: &Path, memory: MemoryUse) {
    t.block_ms.sort_by(f64::total_cmp);
    let pct = |p: f64| t.block_ms[((t.block_ms.len() - 1) as f64 * p).round() as usize];
    println!(
        "{:>6} {:>8} {:>9.0} {:>9.0} {:>10.0} {:>11.1} {:>8.2} {:>8.2} {:>8} {:>8.0} {:>8.1} {:>8.1} {:>11.0}",
        index,
        t.blocks,
        t.blocks as f64 / t.seconds,
        t.txs as f64 / t.seconds,
        t.inputs as f64 / t.seconds,
        t.cpu_seconds * 1e6 / t.inputs.max(1) as f64,
        pct(0.5),
        pct(0.99),
        common::status_mib("VmRSS:"),
        mib(memory.utxo_table),
        mib(memory.index_rows),
        mib(memory.archive_filters),
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

/// A number from the environment variable `var`, if set and valid.
fn env_usize(var: &str) -> Option<usize> {
    std::env::var(var).ok().and_then(|s| s.parse().ok())
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}
