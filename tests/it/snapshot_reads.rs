//! Readers and the one writer (reads go through the committed
//! state and never hold up the writer), on `testnet-data/regtest-a`:
//!
//! - a reader that holds a chain snapshot, and reads from snapshots without
//!   pause, does not hold up the writer connecting the rest of the chain
//!   (with the former `RwLock` design, a reader holding the read guard made
//!   the writer wait: this test would time out);
//! - every snapshot is a committed block boundary (its tip has its block,
//!   filter and filter header), and a snapshot taken at height N keeps
//!   answering for N — tip, headers, filters as `filters.json` has them,
//!   transaction and spend rows, UTXO statuses — after the writer has moved
//!   far beyond N and through the chain's reorgs, while a fresh snapshot
//!   sees the new tip.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bitcoin::consensus::deserialize;
use bitcoin::hashes::Hash;
use bitcoin::{Block, BlockHash, Network};
use common::{data, json, TestNode};
use kakehi::archive::OutpointStatus;
use kakehi::import::{read_file, Record};
use kakehi::pipeline::{Chainstate, SubmitOutcome};
use kakehi::snapshot::ChainSnapshot;
use kakehi::sozu::ViewStatus;
use parking_lot::Mutex;

/// How long the writer may take to connect the rest of regtest-a (debug
/// build, 2 shared cores; it takes a few seconds): generous, so that only a
/// writer held up by a reader fails it.
const WRITER_DEADLINE: Duration = Duration::from_secs(120);

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// regtest-a's blocks, in file order.
fn records(cs: &Chainstate) -> Vec<Record> {
    let records = read_file(&data("regtest-a/blocks.dat"), cs.params()).expect("blocks.dat");
    assert_eq!(records.len(), 1529);
    records
}

fn submit(chain: &Mutex<Chainstate>, block: &Block) {
    let outcome = chain.lock().submit_block(block).expect("storage");
    assert!(
        matches!(outcome, SubmitOutcome::Accepted { .. }),
        "{outcome:?}"
    );
}

/// The reference active chain: (hash, filter hex, filter header hex) by height.
fn reference() -> Vec<(BlockHash, String, String)> {
    let filters = json("regtest-a/filters.json");
    let filters = filters.as_array().expect("array");
    assert_eq!(filters.len(), 1501);
    filters
        .iter()
        .enumerate()
        .map(|(h, f)| {
            assert_eq!(f["height"].as_u64(), Some(h as u64));
            (
                f["hash"].as_str().expect("hash").parse().expect("hash"),
                f["basic_filter"].as_str().expect("filter").to_string(),
                f["filter_header"].as_str().expect("header").to_string(),
            )
        })
        .collect()
}

/// Checks that `s` is a committed boundary: its tip's block is stored and
/// decodes to the tip's hash, and its filter and filter header are there.
fn assert_committed(s: &ChainSnapshot) {
    let tip = s.index().tip();
    let filter = s.filter(tip.id).expect("filter read");
    assert!(filter.is_some(), "tip {} has no filter", tip.height);
    if tip.height > 0 {
        let raw = s
            .read_block_raw(tip.id)
            .expect("block read")
            .expect("tip block stored");
        let block: Block = deserialize(&raw).expect("stored block decodes");
        assert_eq!(block.block_hash(), tip.hash);
        assert!(s.spent_outputs(tip.id).expect("spent read").is_some());
    }
    assert_eq!(s.utxo_stats().height, tip.height);
}

#[test]
fn the_writer_is_never_held_up_by_readers() {
    let node = TestNode::new(Network::Regtest);
    let TestNode { chain, dir, .. } = node;
    let records = records(&chain.lock());
    let (first, rest) = records.split_at(300);
    for r in first {
        submit(&chain, &r.block);
    }
    let snapshots = chain.lock().snapshots();
    let chain = Arc::new(chain);

    // The reader: takes a snapshot and keeps it for the whole run, reading
    // from it and from fresh snapshots without pause.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let (held_tx, held_rx) = mpsc::channel();
    let reader = {
        let (stop, reads, snapshots) = (stop.clone(), reads.clone(), snapshots.clone());
        std::thread::spawn(move || {
            let held = snapshots.load();
            let held_tip = (held.index().tip_height(), held.index().tip().hash);
            held_tx.send(held_tip).expect("send");
            let outpoints: Vec<bitcoin::OutPoint> = (1..=held_tip.0)
                .filter_map(|h| held.index().active_at(h))
                .filter_map(|e| held.read_block(e.id).ok().flatten())
                .map(|b| bitcoin::OutPoint {
                    txid: b.txdata[0].compute_txid(),
                    vout: 0,
                })
                .collect();
            let mut i = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let h = (i as u32 % held_tip.0) + 1;
                let e = held.index().active_at(h).expect("held height");
                assert!(held.filter(e.id).expect("filter").is_some());
                assert!(held.read_block_raw(e.id).expect("block").is_some());
                held.outpoint_status(&outpoints[i % outpoints.len()])
                    .expect("outpoint status");
                assert_committed(&snapshots.load());
                reads.fetch_add(1, Ordering::SeqCst);
                i += 1;
            }
            // Still the same boundary, whatever the writer did meanwhile.
            assert_eq!(
                (held.index().tip_height(), held.index().tip().hash),
                held_tip
            );
        })
    };
    let held_tip = held_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("reader holds its snapshot");
    assert!(held_tip.0 >= 250, "{held_tip:?}");

    let (done_tx, done_rx) = mpsc::channel();
    let writer = {
        let chain = chain.clone();
        let rest: Vec<Block> = rest.iter().map(|r| r.block.clone()).collect();
        std::thread::spawn(move || {
            let started = Instant::now();
            for b in &rest {
                submit(&chain, b);
            }
            done_tx.send(started.elapsed()).expect("send");
        })
    };
    let took = done_rx.recv_timeout(WRITER_DEADLINE).unwrap_or_else(|_| {
        panic!(
            "the writer did not connect the last 1,229 blocks within {WRITER_DEADLINE:?} \
             while a reader held a snapshot"
        )
    });
    let reads_during_write = reads.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    writer.join().expect("writer");
    reader.join().expect("reader");
    eprintln!(
        "writer: 1,229 blocks in {:.2} s while the reader made {reads_during_write} reads",
        took.as_secs_f64()
    );
    assert!(reads_during_write > 0, "the reader never read");
    let now = snapshots.load();
    let reference = json("regtest-a/chain.json");
    assert_eq!(
        now.index().tip().hash.to_string(),
        reference["tip_hash"].as_str().expect("tip")
    );
    drop(dir);
}

#[test]
fn a_snapshot_keeps_answering_for_its_boundary_after_the_writer_moved_on() {
    let node = TestNode::new(Network::Regtest);
    let reference = reference();
    let records = records(&node.chain.lock());
    let snapshots = node.chain.lock().snapshots();
    let mut records = records.into_iter();
    // Feeds blocks until the tip is on the reference chain at `min` or above.
    let mut feed_until = |min: u32| loop {
        let s = snapshots.load();
        let tip = s.index().tip();
        if tip.height >= min && reference[tip.height as usize].0 == tip.hash {
            return s;
        }
        let r = records.next().expect("the chain reaches the height");
        submit(&node.chain, &r.block);
    };
    let early = feed_until(400);
    let late = feed_until(1350);
    for r in records {
        submit(&node.chain, &r.block);
    }
    let now = snapshots.load();
    let n = early.index().tip_height();
    let m = late.index().tip_height();
    assert!((400..1350).contains(&n) && m >= 1350, "{n} {m}");

    // A fresh snapshot sees the final tip.
    let chain = json("regtest-a/chain.json");
    assert_eq!(now.index().tip_height(), 1500);
    assert_eq!(
        now.index().tip().hash.to_string(),
        chain["tip_hash"].as_str().expect("tip")
    );
    assert!(now.stats().blocks_connected > late.stats().blocks_connected);

    // The early snapshot: tip N, its headers and filters as filters.json
    // says, nothing above N.
    for s in [&early, &late] {
        assert_committed(s);
        let tip = s.index().tip_height();
        for (h, (hash, filter, header)) in reference.iter().enumerate().take(tip as usize + 1) {
            let e = s.index().active_at(h as u32).expect("active height");
            assert_eq!(e.hash, *hash, "height {h}");
            assert_eq!(e.header.block_hash(), *hash, "header at {h}");
            let (f, fh) = s.filter(e.id).expect("read").expect("filter");
            assert_eq!(hex(&f), *filter, "filter at {h}");
            assert_eq!(fh.to_string(), *header, "filter header at {h}");
        }
        assert!(s.index().active_at(tip + 1).is_none());
        assert_eq!(s.utxo_stats().height, tip);
    }
    assert_eq!(early.index().tip().hash, reference[n as usize].0);

    // Index-database rows of later blocks are not seen by the early
    // snapshot: the coinbase of the final block at N + 10.
    let later = now
        .read_block(now.index().active_at(n + 10).expect("height").id)
        .expect("read")
        .expect("stored");
    let coinbase = later.txdata[0].compute_txid();
    assert!(early.tx_blocks(&coinbase).expect("rows").is_empty());
    assert_eq!(now.tx_blocks(&coinbase).expect("rows").len(), 1);

    // UTXO statuses under each snapshot's own view: an output created at or
    // before M and spent above M (and above 1,400, so not purged from the
    // table yet) is unspent for the late snapshot, spent for the fresh one.
    let (spend_height, spent) = (m + 1..=1500)
        .rev()
        .filter_map(|h| {
            let e = now.index().active_at(h)?;
            let spent = now.spent_outputs(e.id).ok()??;
            spent
                .into_iter()
                .find(|s| s.coin.height <= m)
                .map(|s| (h, s))
        })
        .find(|(h, _)| *h > 1400)
        .expect("a later block spends an output the late snapshot knows");
    let op = spent.outpoint;
    assert_eq!(
        late.outpoint_status(&op).expect("status"),
        OutpointStatus::Unspent
    );
    assert!(late.active_spender(&op).expect("rows").is_none());
    let entry = late.lookup_outpoints(&[op]).expect("lookup")[0]
        .clone()
        .expect("entry in the table");
    assert!(matches!(
        entry.status_in(&late.active_view()),
        ViewStatus::Unspent
    ));
    assert_eq!(
        now.outpoint_status(&op).expect("status"),
        OutpointStatus::SpentNotSealed {
            block: now.index().active_at(spend_height).expect("height").hash,
            height: spend_height,
        }
    );
    assert!(now.active_spender(&op).expect("rows").is_some());
}

/// A node with regtest-a's first 150 blocks, the last active block that
/// spends an output, and its first spent output.
fn node_with_a_spend() -> (
    TestNode,
    kakehi::primitives::BlockId,
    kakehi::validation::SpentOutput,
) {
    let node = TestNode::new(Network::Regtest);
    let records = records(&node.chain.lock());
    for r in records.iter().take(150) {
        submit(&node.chain, &r.block);
    }
    let s = node.chain.lock().snapshots().load();
    let (block, spent) = (1..=s.index().tip_height())
        .rev()
        .find_map(|h| {
            let e = s.index().active_at(h)?;
            let spent = s.spent_outputs(e.id).ok()??;
            spent.into_iter().next().map(|x| (e.id, x))
        })
        .expect("a block that spends an output");
    drop(s);
    (node, block, spent)
}

/// The txid and spend rows are keyed by the txid's first 8 bytes: a txid
/// sharing them with a real transaction finds that transaction's rows,
/// and the readers must check each row against the block and spent-output
/// files before answering (here the real rows, not planted ones: the
/// other txid's rows would have the same keys).
#[test]
fn rows_found_by_txid_prefix_are_checked_against_the_files() {
    let (node, block, spent) = node_with_a_spend();
    let s = node.chain.lock().snapshots().load();
    let txs = s.read_block(block).expect("read").expect("stored").txdata;
    let position = txs
        .iter()
        .position(|t| t.compute_txid() == spent.txid)
        .expect("the spender is in the block") as u32;
    let same_prefix = |txid: &bitcoin::Txid| {
        let mut b = txid.to_byte_array();
        b[31] ^= 0x5a;
        bitcoin::Txid::from_byte_array(b)
    };
    // The real transaction and outpoint are found...
    assert_eq!(
        s.tx_blocks(&spent.txid).expect("rows"),
        vec![(block, position)]
    );
    let (by, record) = s
        .active_spender(&spent.outpoint)
        .expect("rows")
        .expect("spent");
    assert_eq!(
        (by, record.txid, record.vin),
        (block, spent.txid, spent.vin)
    );
    // ...and the txids sharing their 8-byte prefix are not.
    assert!(s
        .tx_blocks(&same_prefix(&spent.txid))
        .expect("rows")
        .is_empty());
    let other = bitcoin::OutPoint {
        txid: same_prefix(&spent.outpoint.txid),
        vout: spent.outpoint.vout,
    };
    assert!(s.active_spender(&other).expect("rows").is_none());
}

/// SHA-256 of a scriptPubKey (the address index's script hash).
fn script_hash(script: &bitcoin::Script) -> [u8; 32] {
    bitcoin::hashes::sha256::Hash::hash(script.as_bytes()).to_byte_array()
}

/// A script's whole history and summary on a snapshot, as compared here.
type History = (
    Vec<kakehi::snapshot::HistoryTx>,
    kakehi::snapshot::ScriptStats,
    Vec<kakehi::snapshot::ScriptUtxo>,
);

fn history(s: &ChainSnapshot, sh: &[u8; 32]) -> History {
    let txs = s.script_txs(sh, None, usize::MAX).expect("history");
    let (stats, utxos) = s.script_summary(sh).expect("summary");
    (txs, stats, utxos)
}

/// The address index's rows are keyed by the script hash's first 8 bytes:
/// a script hash sharing them with a real script finds that script's rows,
/// and the readers must check the full hash of each transaction's outputs
/// and spent outputs before answering.
#[test]
fn address_rows_found_by_script_prefix_are_checked_against_the_files() {
    let (node, _, spent) = node_with_a_spend();
    let s = node.chain.lock().snapshots().load();
    let real = script_hash(bitcoin::Script::from_bytes(&spent.coin.script_pubkey));
    let (txs, stats, _) = history(&s, &real);
    assert!(txs.iter().any(|t| t.txid == spent.txid), "{txs:?}");
    assert!(stats.funded_txo_count > 0 && stats.spent_txo_count > 0);
    let mut other = real;
    other[31] ^= 0x5a;
    assert_eq!(history(&s, &other), (vec![], Default::default(), vec![]));
    // Paging from a transaction of the real script finds nothing either.
    assert!(s
        .script_txs(&other, Some(&spent.txid), 25)
        .expect("page")
        .is_empty());
}

/// The rows of a block are made durable before its block record: a crash
/// between the two leaves rows under a block id the index never recorded,
/// and the next block accepted after the restart gets that id. Here the
/// rows that another block (regtest-a's block 40 positions further on)
/// would have written are planted under the next id and height, then the
/// real next block connects with that id: every answer for the planted
/// scripts equals a node's that never saw them.
#[test]
fn orphan_address_rows_of_a_reused_block_id_are_not_attributed_to_it() {
    use kakehi::store::history::script_prefix;
    use kakehi::store::{HistoryKey, Store, WriteBatch};
    const K: usize = 140;
    let params = || kakehi::chain::ChainParams::new(Network::Regtest);
    let dir = common::tempdir();
    let datadir = kakehi::node::DataDir::open(dir.path()).expect("datadir");
    let open = || Mutex::new(kakehi::node::open_chainstate(params(), &datadir).expect("open"));
    let chain = open();
    let records = records(&chain.lock());
    for r in &records[..K] {
        submit(&chain, &r.block);
    }
    let s = chain.lock().snapshots().load();
    let (next, next_block) = (
        kakehi::primitives::BlockId(s.index().len() as u32),
        &records[K].block,
    );
    let parent = s.index().by_hash(&next_block.header.prev_blockhash);
    let height = parent.expect("parent known").height + 1;
    drop((s, chain));
    // The rows the other block's outputs would have had under `next`.
    let other = &records[K + 40].block;
    let mut planted = Vec::new();
    let mut batch = WriteBatch::default();
    for (position, tx) in (0u32..).zip(&other.txdata) {
        for o in &tx.output {
            let sh = script_hash(&o.script_pubkey);
            planted.push((sh, position));
            batch.put_history(&HistoryKey {
                prefix: script_prefix(&sh),
                height,
                block: next,
                position,
            });
        }
    }
    // The test means something: some planted row names a transaction of
    // the real block that does not pay the planted script.
    assert!(planted.iter().any(|(sh, p)| {
        next_block.txdata.get(*p as usize).is_some_and(|tx| {
            tx.output
                .iter()
                .all(|o| script_hash(&o.script_pubkey) != *sh)
        })
    }));
    let store = Store::open(
        &dir.path().join("index"),
        &kakehi::store::Budgets {
            index_cache_mib: 16,
            ..Default::default()
        },
    )
    .expect("index");
    store.commit(batch).expect("plant");
    drop(store);
    let chain = open();
    submit(&chain, next_block);
    let s = chain.lock().snapshots().load();
    assert_eq!(s.index().active_at(height).map(|e| e.id), Some(next));
    let reference = TestNode::new(Network::Regtest);
    for r in &records[..=K] {
        submit(&reference.chain, &r.block);
    }
    let want = reference.chain.lock().snapshots().load();
    for (sh, _) in &planted {
        assert_eq!(history(&s, sh), history(&want, sh));
    }
}

/// A script's summary carried from snapshot to snapshot
/// (`script_summary_since`: what the HTTP server's cache of busy scripts
/// does) equals the one read from the script's whole history at every
/// step of regtest-a, through its reorgs: a summary whose block left the
/// active chain is read again from the start, one still on it gains only
/// the rows above it.
#[test]
fn summaries_carried_across_blocks_and_reorgs_equal_whole_reads() {
    let node = TestNode::new(Network::Regtest);
    let records = records(&node.chain.lock());
    // The three scripts paid most often in the file.
    let mut paid: std::collections::HashMap<&bitcoin::Script, usize> = Default::default();
    for tx in records.iter().flat_map(|r| &r.block.txdata) {
        for o in &tx.output {
            *paid.entry(o.script_pubkey.as_script()).or_default() += 1;
        }
    }
    let mut busy: Vec<_> = paid.into_iter().collect();
    busy.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let scripts: Vec<[u8; 32]> = busy.iter().take(3).map(|(s, _)| script_hash(s)).collect();
    let snapshots = node.chain.lock().snapshots();
    let mut carried: Vec<Option<kakehi::snapshot::ScriptSummary>> = vec![None; scripts.len()];
    let (mut steps, mut reread, mut most_txs) = (0, 0, 0);
    for chunk in records.chunks(41) {
        for r in chunk {
            node.chain.lock().submit_block(&r.block).expect("storage");
        }
        let s = snapshots.load();
        for (sh, carried) in scripts.iter().zip(&mut carried) {
            if let Some(b) = carried.as_ref() {
                if s.index().active_at(b.height).map(|e| e.id) != Some(b.block) {
                    reread += 1;
                }
            }
            let next = s
                .script_summary_since(sh, carried.as_ref())
                .expect("summary");
            let whole = s.script_summary(sh).expect("summary");
            let height = s.index().tip_height();
            assert_eq!(next.stats, whole.0, "height {height}");
            assert!(
                next.utxos == whole.1,
                "height {height}: {} UTXOs carried, {} read whole",
                next.utxos.len(),
                whole.1.len()
            );
            assert_eq!(next.block, s.index().tip().id);
            most_txs = most_txs.max(next.stats.tx_count);
            *carried = Some(next);
        }
        steps += 1;
    }
    assert!(
        reread > 0,
        "no carried summary met a reorg in {steps} steps"
    );
    assert!(
        most_txs >= 100,
        "the busiest script has {most_txs} transactions"
    );
}
