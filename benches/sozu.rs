//! Sozu table benchmark: one synthetic UTXO workload against the Sozu table
//! and three baselines (in-memory `HashMap`, sled flushed per block, redb
//! committed per block). Prints `vs <baseline>: <ratio>x` lines (Sozu's
//! block-connect throughput / the baseline's).
//!
//! ```text
//! cargo bench --bench sozu                      # CI size: ~1M live UTXOs
//! SOZU_BENCH_LIVE=20000000 cargo bench --bench sozu   # large
//! ```
//! Env: `SOZU_BENCH_LIVE` (initial live UTXOs, default 1,000,000),
//! `SOZU_BENCH_BLOCKS` (measured blocks, default 150),
//! `SOZU_BENCH_WARMUP` (blocks of 2,500 inputs / 3,000 outputs connected,
//! untimed, between the fill and the measured blocks, default 250; see
//! [`WARMUP`]), `SOZU_BENCH_DIR`
//! (default `target/sozu-bench`, a real disk: fsync matters),
//! `SOZU_BENCH_SKIP` (comma list of baselines to skip: sled,redb,hashmap),
//! `SOZU_BENCH_RAM_MIB` (the table's memory budget, default that of
//! `SozuConfig::default()`), `SOZU_BENCH_RAM_LAYERS` (overrides the pinned
//! layers the budget gives), `SOZU_BENCH_LAYER0_BITS` (default 10),
//! `SOZU_BENCH_SHARDS` (default 2: the calling thread and one worker),
//! `SOZU_BENCH_CHECKPOINT_MIB` (`checkpoint_bytes`: the most journal a
//! generation holds before a checkpoint starts the next, default 256; the
//! table's own share of its files, `JOURNAL_SHARE`, usually ends it first), `SOZU_BENCH_GROWTH_BITS` (g: 2^g children per bucket, default that of
//! `SozuConfig::default()`),
//! `SOZU_BENCH_ALPHA_DEEP` (α of layers 2 and deeper, default that of
//! `SozuConfig::default()`), `SOZU_BENCH_CAPACITY_DEEP` (capacity of
//! layers 2 and deeper, bytes, clamped to a page's payload; default that
//! of `SozuConfig::default()`), `SOZU_BENCH_ALPHA_DISK` (α of the layers
//! the budget does not pin, `SozuConfig::disk_alpha`; a number, or `none`
//! for the α of the layers list; default that of `SozuConfig::default()`),
//! `SOZU_BENCH_SPILL_CONSUMED` (`first`, `last-into-disk` or `last`:
//! `SozuConfig::spill_consumed`; default that of `SozuConfig::default()`;
//! `first` for rounds 1-16's policy), `SOZU_BENCH_SEED_SPILL` (set: first
//! run the table with the Sozu paper's literal spill policy too, for comparison
//! in the same run), `SOZU_BENCH_PERF_CTL`
//! (a `perf record --control fifo:PATH` control FIFO: the bench writes
//! `enable` to it before the first measured block and `disable` after the
//! last, so a profile started with `-D -1` covers the measured blocks only).
//!
//! The workload is generated on the fly (same seed for every backend), so
//! memory holds only the generator's outpoints, not the blocks. Only the
//! backend calls are timed; CPU time (all threads, /proc/self/stat) is
//! printed next to wall time because the machine may be shared.

#[allow(dead_code)]
#[path = "common/mod.rs"]
mod common;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bitcoin::hashes::Hash;
use bitcoin::{OutPoint, Txid};
use common::cpu_seconds as cpu_secs;
use kakehi::sozu::*;

/// The node's allocator (`src/main.rs`), for Sozu and every baseline alike.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn txid(&mut self) -> Txid {
        let mut b = [0u8; 32];
        for c in b.chunks_mut(8) {
            c.copy_from_slice(&self.next().to_le_bytes());
        }
        Txid::from_byte_array(b)
    }
}

fn script(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.below(10_000) {
        0 => 1000 + rng.below(9000) as usize,
        1..=50 => 100 + rng.below(400) as usize,
        51..=2000 => 34,
        2001..=5000 => 25,
        5001..=8000 => 22,
        _ => 23 + rng.below(11) as usize,
    };
    vec![0x51; len]
}

/// One block of the workload.
#[derive(Clone)]
struct Block {
    height: u32,
    /// (outpoint, spending txid, vin)
    spent: Vec<(OutPoint, Txid, u32)>,
    created: Vec<(OutPoint, Coin)>,
    /// Re-included on a competing branch (outputs may already be present).
    reinclude: bool,
}

/// Heavy-tailed spend ages: 3/4 of inputs spend outputs under 144 blocks
/// old (skewed to the newest), 1/4 spend uniformly from older outputs;
/// outputs never picked stay unspent forever.
struct Gen {
    rng: Rng,
    recent: VecDeque<(u32, Vec<OutPoint>)>,
    old: Vec<OutPoint>,
    height: u32,
}

impl Gen {
    fn block(&mut self, n_in: usize, n_out: usize) -> Block {
        self.height += 1;
        let h = self.height;
        let mut spent = Vec::with_capacity(n_in);
        let mut tx = self.rng.txid();
        let mut vin = 0;
        for i in 0..n_in {
            if i % 3 == 0 {
                tx = self.rng.txid();
                vin = 0;
            }
            let op = if self.rng.below(4) < 3 && !self.recent.is_empty() {
                let n = self.recent.len() as u64;
                let a = self.rng.below(n).max(self.rng.below(n)) as usize;
                let bucket = &mut self.recent[a].1;
                if bucket.is_empty() {
                    continue;
                }
                let k = self.rng.below(bucket.len() as u64) as usize;
                bucket.swap_remove(k)
            } else if !self.old.is_empty() {
                let k = self.rng.below(self.old.len() as u64) as usize;
                self.old.swap_remove(k)
            } else {
                continue;
            };
            spent.push((op, tx, vin));
            vin += 1;
        }
        let mut created = Vec::with_capacity(n_out);
        let mut txid = self.rng.txid();
        for j in 0..n_out {
            if j % 2 == 0 {
                txid = self.rng.txid();
            }
            let op = OutPoint {
                txid,
                vout: (j % 2) as u32,
            };
            created.push((
                op,
                Coin {
                    value: bitcoin::Amount::from_sat(self.rng.below(1 << 30)),
                    script_pubkey: script(&mut self.rng),
                    height: h,
                    coinbase: j == 0,
                },
            ));
        }
        self.recent
            .push_back((h, created.iter().map(|(o, _)| *o).collect()));
        while self.recent.len() > 143 {
            if let Some((_, v)) = self.recent.pop_front() {
                self.old.extend(v);
            }
        }
        Block {
            height: h,
            spent,
            created,
            reinclude: false,
        }
    }
}

/// Default warm-up, blocks: the generator's young-output window (143
/// blocks) plus the table's purge depth (100 blocks), rounded up. The fill
/// creates outputs and spends none, so for 100 blocks after it nothing
/// spent can be purged yet and the table grows by every block's outputs;
/// a node's table (a chain that spends at every height) is never in that
/// state. Measuring after the warm-up measures the state a running node is
/// in: spends purged as fast as they come. With 0, the measured blocks
/// start right after the fill, as in rounds 1-16 of `docs/benchmarks-history.md`.
const WARMUP: usize = 250;

/// The workload's sizes, read from the environment (module docs).
#[derive(Clone, Copy)]
struct Workload {
    /// Outputs of the fill.
    live: usize,
    /// Untimed blocks between the fill and the measured blocks.
    warmup: usize,
    /// Measured blocks (reorged ones not counted).
    blocks: usize,
}

/// One step of the workload.
enum Step {
    /// A block of the initial fill (outputs only).
    Fill(Block),
    /// A block of the warm-up (untimed, as a measured block otherwise).
    Warm(Block),
    /// A measured block.
    Connect(Block),
    /// Replace the last `d` blocks by competing blocks with the same txs.
    Reorg(usize),
}

/// The workload, generated on the fly: fill blocks of 20,000 outputs up to
/// `live` UTXOs, `warmup` blocks, then `blocks` measured blocks with a
/// depth-1/2 reorg every 37. The same seed gives every backend the same
/// blocks, and a run holds only the generator's state (the outpoints not
/// yet spent), never the whole workload.
struct Steps {
    gen: Gen,
    fill_left: usize,
    warm_left: usize,
    measured: usize,
    blocks: usize,
    reorg: Option<usize>,
}

impl Steps {
    fn new(w: Workload) -> Self {
        Self {
            gen: Gen {
                rng: Rng(0x5eed_1234_5678_9abc),
                recent: VecDeque::new(),
                old: Vec::new(),
                height: 0,
            },
            fill_left: w.live,
            warm_left: w.warmup,
            measured: 0,
            blocks: w.blocks,
            reorg: None,
        }
    }
}

impl Iterator for Steps {
    type Item = Step;
    fn next(&mut self) -> Option<Step> {
        if self.fill_left > 0 {
            let n = self.fill_left.min(20_000);
            self.fill_left -= n;
            return Some(Step::Fill(self.gen.block(0, n)));
        }
        if self.warm_left > 0 {
            self.warm_left -= 1;
            return Some(Step::Warm(self.gen.block(2500, 3000)));
        }
        if let Some(d) = self.reorg.take() {
            return Some(Step::Reorg(d));
        }
        if self.measured == self.blocks {
            return None;
        }
        let i = self.measured;
        self.measured += 1;
        if i % 37 == 36 {
            self.reorg = Some(1 + (i / 37) % 2);
        }
        Some(Step::Connect(self.gen.block(2500, 3000)))
    }
}

// ------------------------------------------------------------------ backends

trait Backend {
    /// Connects a block as a new tip (`replaces` > 0: on a competing branch
    /// that replaces that many blocks; the caller already disconnected them).
    fn connect(&mut self, b: &Block);
    /// Disconnects the tip block `b`.
    fn disconnect(&mut self, b: &Block);
    /// Called once, after the fill and before the first measured block.
    fn measure_start(&mut self) {}
}

fn coin_bytes(c: &Coin) -> Vec<u8> {
    let mut v = Vec::with_capacity(13 + c.script_pubkey.len());
    v.extend_from_slice(&c.value.to_sat().to_le_bytes());
    v.extend_from_slice(&c.height.to_le_bytes());
    v.push(c.coinbase as u8);
    v.extend_from_slice(&c.script_pubkey);
    v
}

struct MapBackend {
    map: HashMap<OutPointKey, Vec<u8>>,
    undo: HashMap<u32, Vec<(OutPointKey, Vec<u8>)>>,
}
impl Backend for MapBackend {
    fn connect(&mut self, b: &Block) {
        let mut undo = Vec::with_capacity(b.spent.len());
        for (op, _, _) in &b.spent {
            let k = outpoint_key(op);
            let v = self.map.remove(&k).expect("hashmap: spent output missing");
            undo.push((k, v));
        }
        for (op, c) in &b.created {
            self.map.insert(outpoint_key(op), coin_bytes(c));
        }
        self.undo.insert(b.height, undo);
    }
    fn disconnect(&mut self, b: &Block) {
        for (op, _) in &b.created {
            self.map.remove(&outpoint_key(op));
        }
        for (k, v) in self.undo.remove(&b.height).unwrap_or_default() {
            self.map.insert(k, v);
        }
    }
}

struct SledBackend {
    db: sled::Db,
    tree: sled::Tree,
    undo: HashMap<u32, Vec<(OutPointKey, Vec<u8>)>>,
}
impl Backend for SledBackend {
    fn connect(&mut self, b: &Block) {
        let mut batch = sled::Batch::default();
        let mut undo = Vec::with_capacity(b.spent.len());
        for (op, _, _) in &b.spent {
            let k = outpoint_key(op);
            let v = self
                .tree
                .get(k)
                .expect("sled get")
                .expect("sled: spent output missing");
            undo.push((k, v.to_vec()));
            batch.remove(&k[..]);
        }
        for (op, c) in &b.created {
            batch.insert(&outpoint_key(op)[..], coin_bytes(c));
        }
        self.tree.apply_batch(batch).expect("sled batch");
        self.db.flush().expect("sled flush");
        self.undo.insert(b.height, undo);
    }
    fn disconnect(&mut self, b: &Block) {
        let mut batch = sled::Batch::default();
        for (op, _) in &b.created {
            batch.remove(&outpoint_key(op)[..]);
        }
        for (k, v) in self.undo.remove(&b.height).unwrap_or_default() {
            batch.insert(&k[..], v);
        }
        self.tree.apply_batch(batch).expect("sled batch");
        self.db.flush().expect("sled flush");
    }
}

const REDB_TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("utxo");

struct RedbBackend {
    db: redb::Database,
    undo: HashMap<u32, Vec<(OutPointKey, Vec<u8>)>>,
}
impl Backend for RedbBackend {
    fn connect(&mut self, b: &Block) {
        let tx = self.db.begin_write().expect("redb tx");
        let mut undo = Vec::with_capacity(b.spent.len());
        {
            let mut t = tx.open_table(REDB_TABLE).expect("redb table");
            for (op, _, _) in &b.spent {
                let k = outpoint_key(op);
                let v = t
                    .remove(&k[..])
                    .expect("redb remove")
                    .expect("redb: spent output missing")
                    .value()
                    .to_vec();
                undo.push((k, v));
            }
            for (op, c) in &b.created {
                t.insert(&outpoint_key(op)[..], &coin_bytes(c)[..])
                    .expect("redb insert");
            }
        }
        tx.commit().expect("redb commit");
        self.undo.insert(b.height, undo);
    }
    fn disconnect(&mut self, b: &Block) {
        let tx = self.db.begin_write().expect("redb tx");
        {
            let mut t = tx.open_table(REDB_TABLE).expect("redb table");
            for (op, _) in &b.created {
                t.remove(&outpoint_key(op)[..]).expect("redb remove");
            }
            for (k, v) in self.undo.remove(&b.height).unwrap_or_default() {
                t.insert(&k[..], &v[..]).expect("redb insert");
            }
        }
        tx.commit().expect("redb commit");
    }
}

/// The Sozu table with a block tree for its oracle.
struct SozuBackend {
    table: SozuTable,
    /// height of each BlockId
    heights: Vec<u32>,
    /// best chain: BlockId per height
    best: Vec<u32>,
    lookup_absent: bool,
    connect_times: Vec<Duration>,
    /// Time in get_batch, write_block, commit during the measured blocks.
    phase: [Duration; 3],
    /// Counters when the measured blocks started.
    at_measure: Option<SozuStats>,
    /// Serialized payload the measured blocks changed, bytes: each new
    /// entry whole (key 36, value 8, height 4, flags 1, script, production
    /// 8) and 40 per consumption record.
    changed_payload: u64,
    /// The most bytes the journal files held after a measured block.
    journal_peak: u64,
}

struct Oracle<'a> {
    heights: &'a [u32],
    best: &'a [u32],
}
impl BlockOracle for Oracle<'_> {
    fn best_height(&self, b: BlockId) -> Option<u32> {
        let h = *self.heights.get(b.0 as usize)?;
        (self.best.get(h as usize) == Some(&b.0)).then_some(h)
    }
    fn height(&self, b: BlockId) -> Option<u32> {
        self.heights.get(b.0 as usize).copied()
    }
    fn tip_height(&self) -> u32 {
        self.best.len() as u32 - 1
    }
}

impl Backend for SozuBackend {
    fn connect(&mut self, b: &Block) {
        let t0 = Instant::now();
        let id = self.heights.len() as u32;
        self.heights.push(b.height);
        self.best.truncate(b.height as usize);
        self.best.push(id);
        if self.at_measure.is_some() {
            let created: usize = b
                .created
                .iter()
                .map(|(_, c)| 57 + c.script_pubkey.len())
                .sum();
            self.changed_payload += (created + 40 * b.spent.len()) as u64;
        }
        let keys: Vec<OutPoint> = b.spent.iter().map(|(o, _, _)| *o).collect();
        let ta = Instant::now();
        let found = self.table.get_batch(&keys).expect("sozu read");
        self.phase[0] += ta.elapsed();
        assert!(
            found.iter().all(Option::is_some),
            "sozu: spent output missing"
        );
        let block = BlockId(id);
        let w = BlockWrite {
            block,
            height: b.height,
            created: b
                .created
                .iter()
                .map(|(o, c)| NewOutput {
                    outpoint: *o,
                    coin: c.clone(),
                    known_absent: !(b.reinclude || self.lookup_absent),
                })
                .collect(),
            spent: b
                .spent
                .iter()
                .map(|(o, t, v)| {
                    (
                        *o,
                        Consumption {
                            block,
                            txid: *t,
                            vin: *v,
                        },
                    )
                })
                .collect(),
        };
        let oracle = Oracle {
            heights: &self.heights,
            best: &self.best,
        };
        let ta = Instant::now();
        self.table
            .write_block(&w, &oracle, &mut |_| {})
            .expect("sozu write");
        self.phase[1] += ta.elapsed();
        let ta = Instant::now();
        self.table
            .commit(CommitTag {
                block,
                height: b.height,
                block_hash: [0; 32],
            })
            .expect("sozu commit");
        self.phase[2] += ta.elapsed();
        self.connect_times.push(t0.elapsed());
        if self.at_measure.is_some() {
            self.journal_peak = self.journal_peak.max(self.table.journal_live_bytes());
        }
    }
    fn disconnect(&mut self, _b: &Block) {
        // A reorg is a view switch: nothing to undo.
    }
    fn measure_start(&mut self) {
        self.at_measure = Some(self.table.counters());
        self.phase = [Duration::ZERO; 3];
    }
}

/// Runs the streamed workload; only the backend calls are timed (not the
/// generation). Returns the fill time, the measured time, the measured
/// blocks (reorged ones included), the CPU seconds of the measured blocks
/// and the generator, for more blocks.
fn run(backend: &mut dyn Backend, w: Workload) -> (Duration, Duration, usize, f64, Gen) {
    let mut fill = Duration::ZERO;
    let mut cpu = 0.0;
    let mut started = false;
    let mut measured = Duration::ZERO;
    let mut chain: VecDeque<Block> = VecDeque::new();
    let mut n = 0;
    let mut steps = Steps::new(w);
    for s in &mut steps {
        match s {
            Step::Fill(b) => {
                let t = Instant::now();
                backend.connect(&b);
                fill += t.elapsed();
            }
            Step::Warm(b) => backend.connect(&b),
            Step::Connect(b) => {
                if !started {
                    started = true;
                    backend.measure_start();
                    perf_ctl("enable");
                }
                let (t, c) = (Instant::now(), cpu_secs());
                backend.connect(&b);
                measured += t.elapsed();
                cpu += cpu_secs() - c;
                chain.push_back(b);
                if chain.len() > 2 {
                    chain.pop_front();
                }
                n += 1;
            }
            Step::Reorg(d) => {
                let k = chain.len() - d;
                let (t, c) = (Instant::now(), cpu_secs());
                for b in chain.range(k..).rev() {
                    backend.disconnect(b);
                }
                for b in chain.range_mut(k..) {
                    b.reinclude = true;
                    backend.connect(b);
                    n += 1;
                }
                measured += t.elapsed();
                cpu += cpu_secs() - c;
            }
        }
    }
    perf_ctl("disable");
    (fill, measured, n, cpu, steps.gen)
}

/// Sends `cmd` to the perf control FIFO named by `SOZU_BENCH_PERF_CTL`, if
/// any (`perf record --control fifo:PATH -D -1`).
fn perf_ctl(cmd: &str) {
    if let Ok(path) = std::env::var("SOZU_BENCH_PERF_CTL") {
        if let Err(e) = std::fs::write(&path, format!("{cmd}\n")) {
            eprintln!("perf control {path}: {e}");
        }
    }
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .unwrap_or("0")
                    .parse::<f64>()
                    .unwrap_or(0.0)
            })
        })
        .unwrap_or(0.0)
        / 1024.0
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn sozu_config() -> SozuConfig {
    let ram_layers = std::env::var("SOZU_BENCH_RAM_LAYERS")
        .ok()
        .and_then(|v| v.parse::<u8>().ok());
    let layer0_bits = env_usize("SOZU_BENCH_LAYER0_BITS", 10) as u8;
    let shards = env_usize("SOZU_BENCH_SHARDS", 2) as u8;
    let growth_bits = env_usize(
        "SOZU_BENCH_GROWTH_BITS",
        SozuConfig::default().growth_bits.into(),
    ) as u8;
    let mut layers = SozuConfig::default().layers;
    // "none": the α of `layers` on the disk layers too.
    let disk_alpha = match std::env::var("SOZU_BENCH_ALPHA_DISK") {
        Ok(v) if v == "none" => None,
        Ok(v) => v.parse::<f64>().ok(),
        Err(_) => SozuConfig::default().disk_alpha,
    };
    let alpha_deep = std::env::var("SOZU_BENCH_ALPHA_DEEP")
        .ok()
        .and_then(|v| v.parse::<f64>().ok());
    let capacity_deep = std::env::var("SOZU_BENCH_CAPACITY_DEEP")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    for l in layers.iter_mut().skip(2) {
        l.alpha = alpha_deep.unwrap_or(l.alpha);
        l.capacity = capacity_deep.unwrap_or(l.capacity);
    }
    SozuConfig {
        layers,
        disk_alpha,
        shards,
        layer0_bits,
        growth_bits,
        ram_layers,
        ram_mib: env_usize("SOZU_BENCH_RAM_MIB", DEFAULT_RAM_MIB),
        spill_consumed: match std::env::var("SOZU_BENCH_SPILL_CONSUMED").as_deref() {
            Ok("first") => SpillConsumed::First,
            Ok("last") => SpillConsumed::Last,
            Ok("last-into-disk") => SpillConsumed::LastIntoDisk,
            _ => SozuConfig::default().spill_consumed,
        },
        verify_on_open: false,
        checkpoint_bytes: (env_usize("SOZU_BENCH_CHECKPOINT_MIB", 256) as u64) << 20,
        ..SozuConfig::default()
    }
}

/// Runs the workload on a fresh Sozu table and prints its figures. Returns
/// the measured wall time, CPU seconds and durability floor per block
/// ([`fsync_floor`] of the mean journal bytes per measured block).
fn run_sozu(
    base: &std::path::Path,
    label: &str,
    config: SozuConfig,
    w: Workload,
) -> (Duration, f64, Duration) {
    let dir = base.join(label);
    let config_checkpoint_mib = config.checkpoint_bytes >> 20;
    let table = SozuTable::open(&dir, config).expect("sozu open");
    let mut sozu = SozuBackend {
        table,
        heights: vec![0],
        best: vec![0],
        lookup_absent: false,
        connect_times: Vec::new(),
        phase: [Duration::ZERO; 3],
        at_measure: None,
        changed_payload: 0,
        journal_peak: 0,
    };
    let (fill, t_sozu, n, cpu, mut gen) = run(&mut sozu, w);
    // The measured blocks' counters, before the checkpoint and the scan
    // below (the scan reads every page not in memory).
    let at_end = sozu.table.counters();
    let extra_a: Vec<Block> = (0..6).map(|_| gen.block(2500, 3000)).collect();
    let extra_b: Vec<Block> = (0..6).map(|_| gen.block(2500, 3000)).collect();
    // Old outputs (most still unspent, deep in the table) for point reads.
    let step = (gen.old.len() / 20_000).max(1);
    let sample: Vec<OutPoint> = gen.old.iter().step_by(step).take(20_000).copied().collect();
    drop(gen);
    // The figures below describe the table at rest: the journal moved into
    // the page files (between checkpoints the current generation's journal
    // grows to its bound: its peak after a measured block is printed too).
    // A checkpoint inside the short reorg and proof-of-absence windows
    // further down would also dominate them: their 18 blocks stay far below
    // `checkpoint_bytes`.
    sozu.table.checkpoint_now().expect("sozu checkpoint");
    let checkpoints = sozu.table.counters().checkpoints;
    let stats = sozu.table.stats().expect("stats");
    let per_block = t_sozu / n as u32;
    let [read, write, commit] = sozu.phase.map(|d| d / n as u32);
    println!("{label}: fill {fill:.2?}, {n} blocks in {t_sozu:.2?} ({per_block:.2?}/block, CPU {:.1} ms/block); per measured block: get_batch {read:.2?}, write_block {write:.2?}, commit {commit:.2?}", 1000.0 * cpu / n as f64);
    let floor = print_block_figures(&sozu, &at_end, &dir, n);
    println!(
        "  the scan for the figures below read {} pages from files",
        stats.disk_page_reads - at_end.disk_page_reads
    );
    print_table_figures(&stats, config_checkpoint_mib, sozu.journal_peak);
    println!("  peak RSS after {label}: {:.0} MiB", peak_rss_mib());
    reorg_and_absence(&mut sozu, &extra_a, &extra_b);
    point_reads(&mut sozu, &sample);
    let inside = sozu.table.counters().checkpoints - checkpoints;
    if inside > 0 {
        println!("  ({inside} checkpoint(s) fell inside the reorg and proof-of-absence windows: read those rows with care)");
    }
    drop(sozu);
    let _ = std::fs::remove_dir_all(&dir);
    (t_sozu, cpu, floor)
}

/// Prints the per-measured-block counters (pages, journal against the
/// changed payload, spills) and returns the durability floor.
fn print_block_figures(
    sozu: &SozuBackend,
    stats: &SozuStats,
    dir: &std::path::Path,
    n: usize,
) -> Duration {
    let Some(m) = &sozu.at_measure else {
        return Duration::ZERO;
    };
    let nb = n as f64;
    let journal = (stats.journal_bytes - m.journal_bytes) as f64 / nb;
    let payload = sozu.changed_payload as f64 / nb;
    let floor = fsync_floor(dir, journal as usize);
    println!(
        "  per measured block: {:.0} buckets read, {:.0} buckets written (page images), {:.3} MB of journal for {:.3} MB of changed payload ({:.2}x), {:.0} spills, {:.0} purges",
        (stats.buckets_read - m.buckets_read) as f64 / nb,
        (stats.buckets_written - m.buckets_written) as f64 / nb,
        journal / 1e6,
        payload / 1e6,
        journal / payload.max(1.0),
        (stats.spills - m.spills) as f64 / nb,
        (stats.purges - m.purges) as f64 / nb,
    );
    println!(
        "  per measured block: {:.0} page reads from files, {:.0} lookups below the RAM layers, {:.0} spends filed as spend markers, {:.0} page images checkpointed ({:.0} of the pinned layers), {:.2} ms of checkpoint thread CPU; checkpoints in the measured blocks: {} (of the disk layers only: {})",
        (stats.disk_page_reads - m.disk_page_reads) as f64 / nb,
        (stats.deep_lookups - m.deep_lookups) as f64 / nb,
        (stats.spend_markers - m.spend_markers) as f64 / nb,
        (stats.checkpoint_pages - m.checkpoint_pages) as f64 / nb,
        (stats.checkpoint_pinned_pages - m.checkpoint_pinned_pages) as f64 / nb,
        (stats.checkpoint_cpu_nanos - m.checkpoint_cpu_nanos) as f64 / nb / 1e6,
        stats.checkpoints - m.checkpoints,
        stats.disk_only_checkpoints - m.disk_only_checkpoints,
    );
    println!(
        "  per measured block: {:.2} ms appending and syncing the journal; {:.2} ms waiting for a checkpoint ({} commits waited in the measured blocks)",
        (stats.journal_sync_nanos - m.journal_sync_nanos) as f64 / nb / 1e6,
        (stats.checkpoint_wait_nanos - m.checkpoint_wait_nanos) as f64 / nb / 1e6,
        stats.checkpoint_waits - m.checkpoint_waits,
    );
    let reads = (stats.disk_page_reads - m.disk_page_reads).max(1) as f64;
    println!(
        "  per measured block: {:.2} ms in page reads from files ({:.2} us each), {:.0} pages announced (prefetched) for lookups and spills; {:.0} of the reads made by spills into existing children, {:.0} of them avoidable (the child needed nothing else in its block)",
        (stats.disk_read_nanos - m.disk_read_nanos) as f64 / nb / 1e6,
        (stats.disk_read_nanos - m.disk_read_nanos) as f64 / reads / 1e3,
        (stats.disk_page_prefetches - m.disk_page_prefetches) as f64 / nb,
        (stats.spill_file_reads - m.spill_file_reads) as f64 / nb,
        (stats.spill_reads_avoidable - m.spill_reads_avoidable) as f64 / nb,
    );
    for (l, f) in stats.flow.iter().enumerate() {
        let f0 = m.flow.get(l).cloned().unwrap_or_default();
        println!(
            "  per measured block, layer {l}: {:.0} pages rewritten ({:.0} with merges), {:.0} entries spilled in over {:.0} spills, {:.1} page reads from files",
            (f.rewrites - f0.rewrites) as f64 / nb,
            (f.merge_pages - f0.merge_pages) as f64 / nb,
            (f.spilled_entries - f0.spilled_entries) as f64 / nb,
            (f.spill_targets - f0.spill_targets) as f64 / nb,
            (f.file_reads - f0.file_reads) as f64 / nb,
        );
    }
    println!("  durability floor: appending and fsyncing one block's journal alone takes {floor:.2?} (mean of 20)");
    floor
}

/// Prints the layers, bytes on disk against the live payload, and the
/// page reads of lookups below the RAM layers.
fn print_table_figures(stats: &SozuStats, checkpoint_mib: u64, journal_peak: u64) {
    for (i, l) in stats.layers.iter().enumerate() {
        println!(
            "  layer {i}: {} buckets, {} entries, fill {:.2}",
            l.buckets, l.entries, l.fill
        );
    }
    println!(
        "  bytes on disk after a checkpoint {} MB (of which journal files {} MB) vs live payload {} MB: {:.2}x, {:.2}x without the journals; journal files at most {} MB after a measured block (generation bound now {} MB: 1/{} of the other files, {} MiB at most), {:.2}x with that peak; spills {}, purges {}, checkpoints {}, journal written {} MB",
        stats.bytes_on_disk / 1_000_000,
        stats.journal_file_bytes / 1_000_000,
        stats.payload_bytes / 1_000_000,
        stats.bytes_on_disk as f64 / stats.payload_bytes.max(1) as f64,
        (stats.bytes_on_disk - stats.journal_file_bytes) as f64 / stats.payload_bytes.max(1) as f64,
        journal_peak / 1_000_000,
        stats.journal_bound_bytes / 1_000_000,
        JOURNAL_SHARE,
        checkpoint_mib,
        (stats.bytes_on_disk - stats.journal_file_bytes + journal_peak) as f64
            / stats.payload_bytes.max(1) as f64,
        stats.spills,
        stats.purges,
        stats.checkpoints,
        stats.journal_bytes / 1_000_000
    );
    println!(
        "  lookups below the RAM layers: {}, disk-layer pages read per such lookup: {:.3}, page reads from files {}",
        stats.deep_lookups,
        stats.deep_lookup_pages as f64 / stats.deep_lookups.max(1) as f64,
        stats.disk_page_reads
    );
    println!(
        "  table memory now {:.0} MiB (page images {:.0} MiB, summaries {:.0} MiB); page images held twice while a checkpoint ran, at most {:.0} MiB; commits that waited for a checkpoint {}",
        stats.memory_bytes as f64 / (1u64 << 20) as f64,
        (stats.memory_bytes - stats.summary_bytes) as f64 / (1u64 << 20) as f64,
        stats.summary_bytes as f64 / (1u64 << 20) as f64,
        stats.held_twice_peak_bytes as f64 / (1u64 << 20) as f64,
        stats.checkpoint_waits,
    );
}

/// A 6-block reorg against connecting 6 blocks, then 6 blocks whose new
/// outputs are all looked up (proof of absence); returns the time to
/// connect the 6 blocks.
fn reorg_and_absence(sozu: &mut SozuBackend, extra_a: &[Block], extra_b: &[Block]) -> Duration {
    // Reorg cost: 6 new blocks, then a competing branch of 6 blocks with
    // the same transactions (view switch + re-included outputs looked up).
    let t = Instant::now();
    for b in extra_a {
        sozu.connect(b);
    }
    let connect6 = t.elapsed();
    let t = Instant::now();
    for b in extra_a {
        let mut b = b.clone();
        b.reinclude = true;
        sozu.connect(&b);
    }
    let reorg6 = t.elapsed();
    println!(
        "  6-block reorg: {reorg6:.2?} vs connecting 6 blocks {connect6:.2?}: {:.2}x",
        reorg6.as_secs_f64() / connect6.as_secs_f64()
    );
    // Proof of absence: 6 more blocks whose new outputs are all looked up
    // (known_absent = false) vs the 6 above trusting the chain index.
    sozu.lookup_absent = true;
    let r0 = sozu.table.counters();
    let t = Instant::now();
    for b in extra_b {
        sozu.connect(b);
    }
    let lookups = t.elapsed();
    let r1 = sozu.table.counters();
    println!(
        "  proof of absence: 6 blocks with every new output looked up {lookups:.2?} vs known_absent from the chain index {connect6:.2?} (+{:.0}%), {:.2} disk-layer pages read per lookup below RAM",
        100.0 * (lookups.as_secs_f64() / connect6.as_secs_f64() - 1.0),
        (r1.deep_lookup_pages - r0.deep_lookup_pages) as f64 / (r1.deep_lookups - r0.deep_lookups).max(1) as f64
    );
    connect6
}

/// Point reads, 100 keys per call, as HTTP asks them: the writer's
/// batched lookup against the concurrent reader (`SozuReader`); prints the
/// pages each cold lookup read from files.
fn point_reads(sozu: &mut SozuBackend, sample: &[OutPoint]) {
    let r0 = sozu.table.counters();
    let t = Instant::now();
    for chunk in sample.chunks(100) {
        sozu.table.get_batch(chunk).expect("sozu get_batch");
    }
    let t_writer = t.elapsed();
    let r1 = sozu.table.counters();
    let reader = sozu.table.reader();
    let t = Instant::now();
    let mut found = 0;
    for chunk in sample.chunks(100) {
        found += reader
            .get_batch(chunk)
            .expect("sozu reader")
            .iter()
            .flatten()
            .count();
    }
    let t_reader = t.elapsed();
    let per = |d: Duration| d.as_secs_f64() * 1e6 / sample.len().max(1) as f64;
    println!(
        "  point reads of {} old outputs ({found} in the table), 100 per call: writer's get_batch {:.1} µs per key, concurrent reader {:.1} µs per key ({:.1}x); writer: {:.3} disk-layer pages per lookup below RAM, {:.3} page reads from files per key",
        sample.len(),
        per(t_writer),
        per(t_reader),
        t_reader.as_secs_f64() / t_writer.as_secs_f64(),
        (r1.deep_lookup_pages - r0.deep_lookup_pages) as f64 / (r1.deep_lookups - r0.deep_lookups).max(1) as f64,
        (r1.disk_page_reads - r0.disk_page_reads) as f64 / sample.len().max(1) as f64,
    );
}

/// Mean time to append `bytes` to a file and fsync it (`sync_data`), over
/// 20 appends: the least a commit of that size costs on this disk.
fn fsync_floor(dir: &std::path::Path, bytes: usize) -> Duration {
    use std::io::Write;
    let path = dir.join("fsync-floor");
    let mut f = std::fs::File::create(&path).expect("floor file");
    let buf = vec![0x5au8; bytes];
    let t = Instant::now();
    for _ in 0..20 {
        f.write_all(&buf).expect("floor write");
        f.sync_data().expect("floor sync");
    }
    let mean = t.elapsed() / 20;
    drop(f);
    let _ = std::fs::remove_file(&path);
    mean
}

fn main() {
    let w = Workload {
        live: env_usize("SOZU_BENCH_LIVE", 1_000_000),
        warmup: env_usize("SOZU_BENCH_WARMUP", WARMUP),
        blocks: env_usize("SOZU_BENCH_BLOCKS", 150),
    };
    let skip = std::env::var("SOZU_BENCH_SKIP").unwrap_or_default();
    let base = PathBuf::from(
        std::env::var("SOZU_BENCH_DIR").unwrap_or_else(|_| "target/sozu-bench".into()),
    );
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).expect("bench dir");
    println!(
        "workload: {} initial UTXOs, {} warm-up blocks, {} measured blocks of 2,500 inputs / 3,000 outputs, reorgs of depth 1-2 every 37 blocks",
        w.live, w.warmup, w.blocks
    );
    if std::env::var("SOZU_BENCH_SEED_SPILL").is_ok() {
        // The Sozu paper's literal spill policy, for comparison in the same run.
        let cfg = SozuConfig {
            spill_fewest_children: false,
            spill_consumed: SpillConsumed::First,
            ..sozu_config()
        };
        run_sozu(&base, "sozu-seed-spill", cfg, w);
    }
    let (t_sozu, cpu_sozu, floor) = run_sozu(&base, "sozu", sozu_config(), w);

    let mut results: Vec<(&str, Duration, f64)> = Vec::new();
    if !skip.contains("hashmap") {
        let mut m = MapBackend {
            map: HashMap::new(),
            undo: HashMap::new(),
        };
        let (f, t, n, c, _) = run(&mut m, w);
        println!(
            "hashmap: fill {f:.2?}, blocks {t:.2?} ({:.2?}/block), CPU {c:.1}s; Sozu's durability floor alone is {:.1}x that block time",
            t / n as u32,
            floor.as_secs_f64() / (t.as_secs_f64() / n as f64)
        );
        results.push(("hashmap", t, c));
    }
    if !skip.contains("sled") {
        let db = sled::open(base.join("sled")).expect("sled");
        let tree = db.open_tree("utxo").expect("tree");
        let mut s = SledBackend {
            db,
            tree,
            undo: HashMap::new(),
        };
        let (f, t, _, c, _) = run(&mut s, w);
        println!("sled: fill {f:.2?}, blocks {t:.2?}, CPU {c:.1}s");
        results.push(("sled", t, c));
    }
    if !skip.contains("redb") {
        let db = redb::Database::create(base.join("redb.db")).expect("redb");
        let mut r = RedbBackend {
            db,
            undo: HashMap::new(),
        };
        let (f, t, _, c, _) = run(&mut r, w);
        println!("redb: fill {f:.2?}, blocks {t:.2?}, CPU {c:.1}s");
        results.push(("redb", t, c));
    }
    println!("peak RSS (whole run): {:.0} MiB", peak_rss_mib());
    for (name, t, c) in results {
        println!(
            "vs {name}: {:.2}x (CPU time: {:.2}x)",
            t.as_secs_f64() / t_sozu.as_secs_f64(),
            c / cpu_sozu.max(1e-9)
        );
    }
    let _ = std::fs::remove_dir_all(&base);
}
