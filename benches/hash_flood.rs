//! Hash flooding: outpoints chosen to collide under an unkeyed hash go into
//! the Sozu table as fast as random ones, because its bucket hash is SipHash
//! keyed with a per-table random key (`docs/sozu-format.md`).
//!
//! Three sets of `KAKEHI_BENCH_OUTPOINTS` outpoints (1,000,000 by default),
//! each written into a fresh table (two shards, the node's configuration)
//! in blocks of 2,000 new outputs, one commit per block:
//! - random txids, vout 0;
//! - txids sharing their first 8 bytes (what a table hashing the txid's
//!   leading bytes, "txids are random anyway", would put in one bucket);
//! - one txid, vout 0..N (what a table hashing the txid alone would put in
//!   one bucket).
//!
//! Then every 50th outpoint of each set is looked up cold (after a
//! checkpoint), in batches of 2,000.
//!
//! Prints each set's insert time per block at p50 and p99, its lookup time
//! per key and pages read per lookup below the RAM layers, and the ratios to
//! the random set measured in the same run. Target: insert p99 ≤ 2×.
//!
//! Run: `cargo bench --bench hash_flood`.

use std::time::{Duration, Instant};

use bitcoin::hashes::Hash;
use bitcoin::{OutPoint, Txid};
use kakehi::sozu::{
    BlockId, BlockOracle, BlockWrite, Coin, CommitTag, NewOutput, SozuConfig, SozuTable, UtxoTable,
};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// New outputs per block.
const PER_BLOCK: usize = 2_000;

/// Every block is on the best chain, at the height of its id.
struct Linear(u32);

impl BlockOracle for Linear {
    fn best_height(&self, b: BlockId) -> Option<u32> {
        (b.0 <= self.0).then_some(b.0)
    }
    fn height(&self, b: BlockId) -> Option<u32> {
        self.best_height(b)
    }
    fn tip_height(&self) -> u32 {
        self.0
    }
}

fn main() {
    let n: usize = std::env::var("KAKEHI_BENCH_OUTPOINTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let txid = |bytes: [u8; 32]| Txid::from_byte_array(bytes);
    let random: Vec<OutPoint> = (0..n)
        .map(|_| {
            let mut b = [0u8; 32];
            for chunk in b.chunks_mut(8) {
                chunk.copy_from_slice(&next().to_le_bytes());
            }
            OutPoint::new(txid(b), 0)
        })
        .collect();
    let prefix: Vec<OutPoint> = random
        .iter()
        .map(|o| {
            let mut b = o.txid.to_byte_array();
            b[..8].copy_from_slice(&[0xab; 8]);
            OutPoint::new(txid(b), 0)
        })
        .collect();
    let one_txid: Vec<OutPoint> = (0..n as u32)
        .map(|v| OutPoint::new(txid([0xcd; 32]), v))
        .collect();

    let sets = [
        ("random txids", random),
        ("txids sharing 8 leading bytes", prefix),
        ("one txid, vout 0..N", one_txid),
    ];
    // The three tables are written in lockstep, block i of each in turn,
    // so that the machine's noise falls on all of them alike.
    let dirs: Vec<_> = sets
        .iter()
        .map(|_| tempfile::tempdir().expect("tempdir"))
        .collect();
    let mut tables: Vec<SozuTable> = dirs
        .iter()
        .map(|d| {
            let config = SozuConfig {
                shards: 2,
                ..SozuConfig::default()
            };
            SozuTable::open(d.path(), config).expect("open table")
        })
        .collect();
    let mut times = vec![Vec::new(); sets.len()];
    for (i, _) in sets[0].1.chunks(PER_BLOCK).enumerate() {
        for (s, (_, set)) in sets.iter().enumerate() {
            let chunk = &set[i * PER_BLOCK..((i + 1) * PER_BLOCK).min(set.len())];
            times[s].push(write_block(&mut tables[s], i as u32 + 1, chunk));
        }
    }
    // Cold lookups: every 50th outpoint of each set, in batches of a
    // block's size, after a checkpoint so that pages come from the files.
    let mut lookups = Vec::new();
    for ((_, set), table) in sets.iter().zip(tables.iter_mut()) {
        table.checkpoint_now().expect("checkpoint");
        let before = table.counters();
        let keys: Vec<OutPoint> = set.iter().step_by(50).copied().collect();
        let t = Instant::now();
        for batch in keys.chunks(PER_BLOCK) {
            let found = table.get_batch(batch).expect("lookup");
            assert!(found.iter().all(Option::is_some), "every key was written");
        }
        let secs = t.elapsed().as_secs_f64();
        let after = table.counters();
        let deep = after.deep_lookups - before.deep_lookups;
        let pages = after.deep_lookup_pages - before.deep_lookup_pages;
        lookups.push((keys.len(), secs, deep, pages));
    }
    let mut base = None;
    for (((label, set), mut t), (keys, secs, deep, pages)) in sets.iter().zip(times).zip(lookups) {
        t.sort();
        let pct = |p: f64| t[((t.len() - 1) as f64 * p).round() as usize];
        let (p50, p99) = (pct(0.5), pct(0.99));
        let per_key = secs / keys as f64;
        let pages_per = pages as f64 / deep.max(1) as f64;
        println!(
            "{label}: {} outpoints in {} blocks, per block p50 {p50:.2?}, p99 {p99:.2?}; \
             {keys} lookups {:.2} µs each, {pages_per:.3} pages read per lookup below RAM",
            set.len(),
            t.len(),
            per_key * 1e6
        );
        match base {
            None => base = Some((p50, p99, per_key)),
            Some((b50, b99, bkey)) => println!(
                "  vs random: insert p50 {:.2}x, p99 {:.2}x (target p99 <= 2x); lookup {:.2}x",
                p50.as_secs_f64() / b50.as_secs_f64(),
                p99.as_secs_f64() / b99.as_secs_f64(),
                per_key / bkey
            ),
        }
    }
}

/// Writes `chunk` as the new outputs of block `height` and commits it;
/// returns the time taken.
fn write_block(table: &mut SozuTable, height: u32, chunk: &[OutPoint]) -> Duration {
    let block = BlockId(height);
    let write = BlockWrite {
        block,
        height,
        created: chunk
            .iter()
            .map(|o| NewOutput {
                outpoint: *o,
                coin: Coin {
                    value: bitcoin::Amount::from_sat(1_000),
                    script_pubkey: vec![0x51],
                    height,
                    coinbase: false,
                },
                known_absent: true,
            })
            .collect(),
        spent: Vec::new(),
    };
    let t = Instant::now();
    table
        .write_block(&write, &Linear(height), &mut |_| {})
        .expect("write block");
    table
        .commit(CommitTag {
            block,
            height,
            block_hash: [0; 32],
        })
        .expect("commit");
    t.elapsed()
}
