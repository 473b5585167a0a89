//! The memory knobs change no answer. The first [`BLOCKS`] blocks of
//! regtest-a (`testnet-data/regtest-a`) imported with an index-rows bound
//! of [`ROWS_MEMORY`] (the rows go to run files every few blocks, and the
//! runs are compacted: tens of flushes) and caches of a few KiB (the run files' filter and
//! block-index partitions and the archive's epoch filters evicted all the
//! time, most read from the files at each lookup) answers exactly as a
//! node with the default knobs, whose rows stay in the row log:
//!
//! - transaction rows (`tx_blocks` of every transaction of the file),
//!   spend rows (`active_spender` of every spent output), address history
//!   (`script_txs`, `script_summary`, the Esplora `/address` routes' reads)
//!   of every twelfth script, `outpoint_status` and archival proofs
//!   (`prove_outpoints`, byte for byte) of spent and never-created
//!   outpoints, and `dump-utxos`;
//! - the same after a restart of the small node;
//! - and its caches hold no more than their budgets
//!   (`ChainSnapshot::memory_use`).

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use bitcoin::hashes::Hash;
use bitcoin::{OutPoint, Txid};
use common::{regtest_a_prefix, tempdir};
use kakehi::chain::ChainParams;
use kakehi::import::{import_files, read_file, Record};
use kakehi::node::{open_chainstate_with, DataDir};
use kakehi::pipeline::{Chainstate, GroupLimits};
use kakehi::primitives::script_hash;
use kakehi::store::runs::RowOptions;
use kakehi::store::Budgets;
use parking_lot::Mutex;

/// Blocks of regtest-a imported: past its first reorg, five sealed
/// archive epochs (144 blocks each on regtest).
const BLOCKS: usize = 800;
/// Durable boundaries every 8 blocks (a commit, so a log record or a
/// flush, per group).
const GROUPS: GroupLimits = GroupLimits {
    max_blocks: 8,
    max_bytes: 32 << 20,
    max_age: std::time::Duration::from_secs(1),
};
/// Index rows in memory before run files: 16 KiB of keys.
const ROWS_MEMORY: usize = 16 << 10;
/// The run partitions' cache: 12 KiB (two 4 KiB partitions and a few
/// small ones).
const ROWS_CACHE: usize = 12 << 10;
/// The archive's filter cache: 3 KiB (a regtest epoch's filter is a few
/// hundred bytes to a few KiB).
const ARCHIVE_CACHE: usize = 3 << 10;

fn small() -> Budgets {
    Budgets {
        rows: RowOptions {
            memory_bound: ROWS_MEMORY,
            filter_cache: ROWS_CACHE,
        },
        archive_filter_cache: ARCHIVE_CACHE,
        ..Budgets::default()
    }
}

/// What the test asks of each node.
struct Queries {
    txids: Vec<Txid>,
    spent: Vec<OutPoint>,
    absent: Vec<OutPoint>,
    scripts: Vec<[u8; 32]>,
}

fn queries(file: &Path) -> Queries {
    let params = ChainParams::new(bitcoin::Network::Regtest);
    let records = read_file(file, &params).expect("blocks.dat");
    let (mut txids, mut spent, mut scripts) = (Vec::new(), BTreeSet::new(), BTreeSet::new());
    for Record { block, .. } in records {
        for tx in &block.txdata {
            txids.push(tx.compute_txid());
            if !tx.is_coinbase() {
                spent.extend(tx.input.iter().map(|i| i.previous_output));
            }
            scripts.extend(
                tx.output
                    .iter()
                    .map(|o| script_hash(o.script_pubkey.as_bytes())),
            );
        }
    }
    let absent = (0..40u8)
        .map(|i| OutPoint {
            txid: Txid::from_byte_array([i.wrapping_mul(37); 32]),
            vout: u32::from(i),
        })
        .collect();
    Queries {
        txids,
        spent: spent.into_iter().collect(),
        absent,
        scripts: scripts.into_iter().step_by(12).collect(),
    }
}

/// Every answer of `cs` to `q`, as text, in order.
fn answers(cs: &mut Chainstate, q: &Queries) -> Vec<String> {
    let s = cs.snapshot();
    let mut out = Vec::new();
    for txid in &q.txids {
        out.push(format!(
            "tx {txid} {:?}",
            s.tx_blocks(txid).expect("tx rows")
        ));
    }
    for (i, op) in q.spent.iter().enumerate() {
        let spender = s.active_spender(op).expect("spend rows");
        out.push(format!("spent {op} {spender:?}"));
        if i % 8 == 0 {
            let status = s.outpoint_status(op).expect("status");
            out.push(format!("status {op} {status:?}"));
        }
    }
    for h in &q.scripts {
        let txs = s.script_txs(h, None, usize::MAX).expect("history");
        let summary = s.script_summary(h).expect("summary");
        out.push(format!("script {h:?} {txs:?} {summary:?}"));
    }
    let mut proofs: Vec<OutPoint> = q.spent.iter().step_by(40).copied().collect();
    proofs.extend(&q.absent);
    for batch in proofs.chunks(50) {
        let proof = s.prove_outpoints(batch).expect("proof");
        out.push(format!("proof {:?}", proof.to_bytes()));
    }
    let mut dump = Vec::new();
    cs.dump_utxos(&mut dump).expect("dump");
    out.push(String::from_utf8(dump).expect("utf-8"));
    out
}

fn import(dir: &Path, file: &Path, budgets: &Budgets) -> (DataDir, Mutex<Chainstate>) {
    let datadir = DataDir::open(dir).expect("datadir");
    let params = ChainParams::new(bitcoin::Network::Regtest);
    let mut cs = open_chainstate_with(params, &datadir, budgets).expect("open");
    cs.set_group_limits(GROUPS);
    let chain = Mutex::new(cs);
    let files = [file.to_path_buf()];
    import_files(&chain, &files, &AtomicBool::new(false), false).expect("import");
    (datadir, chain)
}

/// Run numbers of the index rows' run files of the set `set` in `dir`.
fn runs(dir: &Path, set: &str) -> Vec<u64> {
    let mut n: Vec<u64> = std::fs::read_dir(dir.join("index/rows"))
        .expect("rows dir")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let number = name
                .strip_prefix(&format!("{set}-"))?
                .strip_suffix(".run")?;
            number.parse().ok()
        })
        .collect();
    n.sort_unstable();
    n
}

/// Checks the small node's caches against their budgets.
fn assert_within_budgets(cs: &Chainstate) {
    let m = cs.snapshot().memory_use();
    // The rows' share: the cache plus the runs' partition checksums and
    // the keys not yet in runs (at most the bound plus one block's).
    assert!(m.archive_filters <= ARCHIVE_CACHE as u64, "{m:?}");
    assert!(
        m.index_rows <= (ROWS_CACHE + 2 * ROWS_MEMORY + (16 << 10)) as u64,
        "{m:?}"
    );
}

#[test]
fn tiny_budgets_give_the_default_nodes_answers_and_survive_a_restart() {
    let blocks = tempdir();
    let file = regtest_a_prefix(blocks.path(), BLOCKS);
    let q = queries(&file);
    let reference_dir = tempdir();
    let (_reference_lock, reference) = import(reference_dir.path(), &file, &Budgets::default());
    let want = answers(&mut reference.lock(), &q);
    assert!(
        runs(reference_dir.path(), "tx").is_empty(),
        "the default bound keeps regtest-a's rows in the row log"
    );
    drop(reference);

    let dir = tempdir();
    let (lock, chain) = import(dir.path(), &file, &small());
    let tx_runs = runs(dir.path(), "tx");
    // Flushes take three run numbers each, compactions one: many flushes
    // happened, and compaction merged their runs.
    let last = tx_runs.last().copied().unwrap_or(0);
    assert!(last > 60, "few flushes: {tx_runs:?}");
    assert!(tx_runs.len() < 12, "runs not compacted: {tx_runs:?}");
    let got = answers(&mut chain.lock(), &q);
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert!(g == w, "differs:\n got {g:.400}\nwant {w:.400}");
    }
    assert_within_budgets(&chain.lock());

    drop(chain);
    drop(lock);
    let datadir = DataDir::open(dir.path()).expect("datadir");
    let params = ChainParams::new(bitcoin::Network::Regtest);
    let mut cs = open_chainstate_with(params, &datadir, &small()).expect("reopen");
    assert_within_budgets(&cs);
    let again = answers(&mut cs, &q);
    assert!(again == want, "answers changed across the restart");
    assert_within_budgets(&cs);
}
