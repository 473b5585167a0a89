//! Two real kakehi nodes over loopback P2P (`p2p::start_p2p` over the chain
//! state): A imports `testnet-data/regtest-a/blocks.dat` (a chain made and
//! validated by bcoin), B starts empty and syncs from A. Checked against the
//! reference data: tip, UTXO set byte for byte (`utxos.txt`), filter headers
//! (`filters.json`), the 12-deep reorg at order 1200, and a restart mid-sync;
//! blocks received one behind the other are validated ahead.
//! Every wait is bounded (`SYNC_TIMEOUT`).

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bitcoin::{BlockHash, Network};
use common::{data, json};
use kakehi::chain::ChainParams;
use kakehi::import::{import_files, read_file};
use kakehi::node::{open_chainstate, DataDir};
use kakehi::node::{start_p2p, NodeP2p};
use kakehi::p2p::backend::{HeadersError, NodeBackend};
use kakehi::p2p::{P2pConfig, P2pError, P2pHandle};
use kakehi::pipeline::Chainstate;
use kakehi::snapshot::Snapshots;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Upper bound of any sync in these tests (debug build, 2 shared cores).
const SYNC_TIMEOUT: Duration = Duration::from_secs(90);

/// A chain state in a datadir, shared with its P2P layer.
struct Node {
    chain: Arc<Mutex<Chainstate>>,
    /// The chain state's published snapshots (reads never wait for its
    /// writer).
    snapshots: Snapshots,
    _datadir: DataDir,
}

impl Node {
    fn open(path: &Path, params: ChainParams) -> Node {
        let datadir = DataDir::open(path).expect("datadir");
        let chain = open_chainstate(params, &datadir).expect("open chainstate");
        Node {
            snapshots: chain.snapshots(),
            chain: Arc::new(Mutex::new(chain)),
            _datadir: datadir,
        }
    }

    fn tip(&self) -> (u32, BlockHash) {
        let cs = self.snapshots.load();
        let t = cs.index().tip();
        (t.height, t.hash)
    }
}

/// A running P2P layer and its shutdown switch.
struct P2p {
    handle: P2pHandle,
    task: JoinHandle<Result<(), P2pError>>,
    stop: watch::Sender<bool>,
}

impl P2p {
    async fn stop(self) {
        self.stop.send(true).ok();
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("p2p task stops within 20 s")
            .expect("p2p task joins")
            .expect("p2p task ends cleanly");
    }
}

fn config(listen: bool, connect: Vec<std::net::SocketAddr>) -> P2pConfig {
    let mut c = P2pConfig::default();
    c.listen = listen.then(|| "127.0.0.1:0".parse().unwrap());
    c.connect = connect;
    c.dns_seeds = false;
    c
}

fn start(node: &Node, config: P2pConfig) -> P2p {
    let (stop, rx) = watch::channel(false);
    let (handle, task) = start_p2p(node.chain.clone(), config, rx);
    P2p { handle, task, stop }
}

/// A serving node and the address it listens on.
async fn serve(node: &Node) -> (P2p, std::net::SocketAddr) {
    let p = start(node, config(true, vec![]));
    let addr = tokio::time::timeout(Duration::from_secs(10), p.handle.local_addr())
        .await
        .expect("listener up")
        .expect("listen address");
    (p, addr)
}

/// Waits until `node`'s tip is `want`, polling its published snapshots
/// (which never wait for the writer, so this never stalls a tokio worker).
async fn wait_for_tip(node: &Node, want: (u32, BlockHash)) -> Duration {
    let started = Instant::now();
    let mut seen;
    loop {
        seen = Some(node.tip());
        if seen == Some(want) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < SYNC_TIMEOUT,
            "no sync to {want:?} within {SYNC_TIMEOUT:?}: at {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `wait_for_tip` reads the published snapshots: it returns while a writer
/// holds the chain state's mutex (on a current-thread runtime, where a
/// blocking wait would hang everything until the holder gives up).
#[tokio::test(flavor = "current_thread")]
async fn wait_for_tip_does_not_wait_for_a_writer_holding_the_chain_state() {
    let dir = common::tempdir();
    let node = Node::open(dir.path(), ChainParams::new(Network::Regtest));
    let genesis = node.tip();
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let chain = node.chain.clone();
    let holder = std::thread::spawn(move || {
        let guard = chain.lock();
        locked_tx.send(()).unwrap();
        // Released below once the tip was read, or after 10 s.
        let released = release_rx.recv_timeout(Duration::from_secs(10)).is_ok();
        drop(guard);
        released
    });
    locked_rx.recv().unwrap();
    // Reads the tip from the published snapshots while the writer's mutex
    // is held: it must not wait for it.
    wait_for_tip(&node, genesis).await;
    release_tx.send(()).ok();
    assert!(
        holder.join().unwrap(),
        "reading the tip waited for the writer's mutex"
    );
}

fn blocks_file() -> PathBuf {
    data("regtest-a/blocks.dat")
}

fn reference_tip() -> (u32, BlockHash) {
    let chain = json("regtest-a/chain.json");
    (
        chain["tip_height"].as_u64().unwrap() as u32,
        chain["tip_hash"].as_str().unwrap().parse().unwrap(),
    )
}

/// Imports the whole file into a fresh node.
fn imported_node(dir: &Path) -> (Node, f64) {
    let node = Node::open(dir, ChainParams::new(Network::Regtest));
    let started = Instant::now();
    let summary = import_files(
        &node.chain,
        &[blocks_file()],
        &AtomicBool::new(false),
        false,
    )
    .expect("import");
    let secs = started.elapsed().as_secs_f64();
    assert!(summary.rejected.is_empty(), "{:?}", summary.rejected);
    assert_eq!(node.tip(), reference_tip());
    (node, summary.blocks_read as f64 / secs)
}

/// B's state equals the reference: UTXO dump byte for byte, filter headers
/// at every height equal bcoin's `filters.json` and A's, and A's summary.
fn assert_same_state(a: &Node, b: &Node) {
    assert_eq!(b.tip(), reference_tip());
    assert_eq!(
        a.chain.lock().snapshot().utxo_stats(),
        b.chain.lock().snapshot().utxo_stats()
    );
    let mut dump = Vec::new();
    b.chain.lock().dump_utxos(&mut dump).unwrap();
    let expected = std::fs::read(data("regtest-a/utxos.txt")).unwrap();
    assert!(dump == expected, "B's UTXO dump differs from utxos.txt");
    let filters = json("regtest-a/filters.json");
    let (ca, cb) = (a.chain.lock().snapshot(), b.chain.lock().snapshot());
    for f in filters.as_array().unwrap() {
        let height = f["height"].as_u64().unwrap() as u32;
        let eb = cb.index().active_at(height).expect("B has the height");
        assert_eq!(eb.hash.to_string(), f["hash"].as_str().unwrap());
        let ea = ca.index().active_at(height).expect("A has the height");
        let (fb, hb) = cb.filter(eb.id).unwrap().expect("B filter");
        let (fa, ha) = ca.filter(ea.id).unwrap().expect("A filter");
        assert_eq!(
            hb.to_string(),
            f["filter_header"].as_str().unwrap(),
            "height {height}"
        );
        assert_eq!((fb, hb), (fa, ha), "height {height}");
    }
}

/// Node A with all of blocks.dat imported, shared by the tests of this file
/// (each serves it with its own P2P layer), and the import rate, blocks/s.
fn node_a() -> &'static (Node, f64, tempfile::TempDir) {
    static A: std::sync::OnceLock<(Node, f64, tempfile::TempDir)> = std::sync::OnceLock::new();
    A.get_or_init(|| {
        let dir = common::tempdir();
        let (node, rate) = imported_node(dir.path());
        (node, rate, dir)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_node_syncs_regtest_a_from_an_importing_node() {
    let db = common::tempdir();
    let (a, import_rate, _) = node_a();
    let (pa, addr) = serve(a).await;
    let b = Node::open(db.path(), ChainParams::new(Network::Regtest));
    let pb = start(&b, config(false, vec![addr]));
    let took = wait_for_tip(&b, reference_tip()).await;
    let stats = b.chain.lock().stats().clone();
    let blocks = stats.blocks_connected;
    eprintln!(
        "p2p sync: {blocks} blocks connected in {:.2} s = {:.0} blocks/s ({} validated ahead); file import: {import_rate:.0} blocks/s",
        took.as_secs_f64(),
        blocks as f64 / took.as_secs_f64(),
        stats.blocks_validated_ahead,
    );
    // Blocks asked in a window arrive one behind the other: a block whose
    // child is already received is submitted with it, and the child is
    // validated ahead while its parent's scripts run.
    assert!(stats.blocks_validated_ahead > 0, "no block validated ahead");
    assert_eq!(pb.handle.peer_count(), 1);
    pb.stop().await;
    pa.stop().await;
    assert_same_state(a, &b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_takes_the_twelve_deep_reorg() {
    let params = ChainParams::new(Network::Regtest);
    let records = read_file(&blocks_file(), &params).expect("read blocks.dat");
    let chain = json("regtest-a/chain.json");
    let reorg = chain["reorgs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["depth"].as_u64() == Some(12))
        .expect("the 12-deep reorg");
    let at = reorg["at_order_index"].as_u64().unwrap() as usize;
    let old_tip: BlockHash = reorg["old_tip"].as_str().unwrap().parse().unwrap();
    let (da, db) = (common::tempdir(), common::tempdir());
    let a = Node::open(da.path(), params.clone());
    for r in &records[..at] {
        a.chain.lock().submit_block(&r.block).unwrap();
    }
    assert_eq!(a.tip().1, old_tip, "A before the reorg is at its old tip");
    let (pa, addr) = serve(&a).await;
    let b = Node::open(db.path(), params);
    let pb = start(&b, config(false, vec![addr]));
    wait_for_tip(&b, a.tip()).await;
    assert_eq!(b.chain.lock().stats().reorgs, 0);
    // The rest, into A only: A reorganises at `at`; its tip watcher announces.
    for r in &records[at..] {
        a.chain.lock().submit_block(&r.block).unwrap();
    }
    assert_eq!(a.tip(), reference_tip());
    wait_for_tip(&b, reference_tip()).await;
    let seen = b.snapshots.load();
    assert!(seen.stats().reorgs >= 1, "B reorganised");
    assert!(seen
        .index()
        .id_of(&old_tip)
        .is_some_and(|id| !seen.index().is_active(id)));
    pb.stop().await;
    pa.stop().await;
    assert_same_state(&a, &b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_stopped_mid_sync_resumes_to_the_same_end_state() {
    let db = common::tempdir();
    let (a, _, _) = node_a();
    let (pa, addr) = serve(a).await;
    let stopped_at;
    {
        let b = Node::open(db.path(), ChainParams::new(Network::Regtest));
        let pb = start(&b, config(false, vec![addr]));
        let started = Instant::now();
        while b.tip().0 < 500 {
            assert!(started.elapsed() < SYNC_TIMEOUT, "B stuck at {:?}", b.tip());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        pb.stop().await;
        stopped_at = b.tip();
        // Every task holding the chain state is gone once the layer stopped.
        let started = Instant::now();
        while Arc::strong_count(&b.chain) > 1 {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "chain state still shared"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert!(stopped_at.0 < reference_tip().0, "stopped before the end");
    let b = Node::open(db.path(), ChainParams::new(Network::Regtest));
    assert_eq!(b.tip(), stopped_at, "reopened at the tip it stopped at");
    let pb = start(&b, config(false, vec![addr]));
    wait_for_tip(&b, reference_tip()).await;
    pb.stop().await;
    pa.stop().await;
    assert_same_state(a, &b);
}

/// Headers below the minimum chainwork are followed, not stored, until
/// their chain passes it; then the same chain is sent again and stored as
/// it comes (driven directly through the backend, as the P2P layer would).
#[test]
fn headers_below_minimum_chainwork_are_held_until_it_is_passed() {
    let mut params = ChainParams::new(Network::Regtest);
    let records = read_file(&blocks_file(), &params).expect("read blocks.dat");
    let best: Vec<bitcoin::block::Header> = {
        let chain = json("regtest-a/chain.json");
        let on_best: std::collections::HashSet<String> = chain["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["on_best_chain"].as_bool().unwrap())
            .map(|b| b["hash"].as_str().unwrap().to_string())
            .collect();
        records
            .iter()
            .map(|r| r.block.header)
            .filter(|h| on_best.contains(&h.block_hash().to_string()))
            .collect()
    };
    assert_eq!(best.len(), 1500);
    // Minimum chainwork: the work of the chain at height 1,000 (genesis'
    // work plus the first 1,000 headers').
    let mut work = params.genesis_header().work();
    for h in &best[..1000] {
        work = work + h.work();
    }
    params.minimum_chain_work = work.to_be_bytes();
    let params_genesis = params.genesis_block().block_hash();
    let dir = common::tempdir();
    let node = Node::open(dir.path(), params);
    let backend = NodeP2p::new(node.chain.clone());
    for chunk in best[..999].chunks(333) {
        match backend.accept_headers(chunk) {
            Err(HeadersError::BelowMinimumWork { last }) => {
                assert_eq!(last, chunk[chunk.len() - 1].block_hash())
            }
            other => panic!("expected BelowMinimumWork, got {other:?}"),
        }
        assert_eq!(node.chain.lock().index().len(), 1, "nothing stored");
    }
    match backend.accept_headers(&best[999..1200]) {
        Err(HeadersError::PresyncPassed { from }) => assert_eq!(from, params_genesis),
        other => panic!("expected PresyncPassed, got {other:?}"),
    }
    assert_eq!(node.chain.lock().index().len(), 1, "still nothing stored");
    // Sent again from genesis, in other chunks: stored as it comes.
    let mut out = None;
    for chunk in best[..1200].chunks(500) {
        out = Some(backend.accept_headers(chunk).expect("stored"));
    }
    let out = out.expect("three chunks");
    assert_eq!(node.chain.lock().index().len(), 1201);
    assert_eq!(out.best_header, (1200, best[1199].block_hash()));
    assert_eq!(backend.best_header_tip(), (1200, best[1199].block_hash()));
    assert_eq!(backend.blocks_to_fetch(10_000).len(), 1024);
    assert_eq!(backend.blocks_to_fetch(5)[0], best[0].block_hash());
    // A chain that does not connect to anything held or stored.
    assert!(matches!(
        backend.accept_headers(&best[1300..1301]),
        Err(HeadersError::Unconnected { .. })
    ));
    // Reopened: the stored headers are there, as headers only.
    let params = node.chain.lock().params().clone();
    drop(backend);
    drop(node);
    let node = Node::open(dir.path(), params);
    assert_eq!(node.chain.lock().index().len(), 1201);
    assert_eq!(node.tip().0, 0);
    let backend = NodeP2p::new(node.chain.clone());
    assert_eq!(backend.best_header_tip(), (1200, best[1199].block_hash()));
}

/// A first-seen header whose block arrives mutated stays headers-only (as in
/// Core), and the download plan then follows an equal-work competitor rather
/// than keep asking for it: regtest-a's first depth-1 reorg, whose stale
/// block's header is seen first, then the best chain's (driven directly
/// through the backend).
#[test]
fn plan_follows_the_equal_work_competitor_of_a_mutated_block() {
    use kakehi::p2p::backend::{SubmitError, SubmitOutcome};
    use std::collections::HashMap;

    let params = ChainParams::new(Network::Regtest);
    let records = read_file(&blocks_file(), &params).expect("read blocks.dat");
    let by_hash: HashMap<BlockHash, &bitcoin::Block> = records
        .iter()
        .map(|r| (r.block.block_hash(), &r.block))
        .collect();
    let chain = json("regtest-a/chain.json");
    let entries = chain["blocks"].as_array().unwrap();
    let hash =
        |b: &serde_json::Value, k: &str| -> BlockHash { b[k].as_str().unwrap().parse().unwrap() };
    let best: HashMap<u32, BlockHash> = entries
        .iter()
        .filter(|b| b["on_best_chain"].as_bool().unwrap())
        .map(|b| (b["height"].as_u64().unwrap() as u32, hash(b, "hash")))
        .collect();
    // The first stale block whose parent is on the best chain.
    let stale = entries
        .iter()
        .find(|b| {
            !b["on_best_chain"].as_bool().unwrap()
                && best.get(&(b["height"].as_u64().unwrap() as u32 - 1))
                    == Some(&hash(b, "prev_hash"))
        })
        .expect("a depth-1 fork in regtest-a");
    let height = stale["height"].as_u64().unwrap() as u32;
    let (stale, rival) = (by_hash[&hash(stale, "hash")], by_hash[&best[&height]]);
    assert_eq!(stale.header.work(), rival.header.work());

    let dir = common::tempdir();
    let node = Node::open(dir.path(), params);
    let backend = NodeP2p::new(node.chain.clone());
    let below: Vec<&bitcoin::Block> = (1..height).map(|h| by_hash[&best[&h]]).collect();
    let headers: Vec<_> = below.iter().map(|b| b.header).collect();
    backend
        .accept_headers(&headers)
        .expect("best chain headers");
    for b in &below {
        backend
            .submit_block((*b).clone())
            .expect("best chain block");
    }
    assert_eq!(node.tip(), (height - 1, best[&(height - 1)]));
    // First seen: the stale header, then its equal-work rival.
    backend.accept_headers(&[stale.header]).unwrap();
    backend.accept_headers(&[rival.header]).unwrap();
    assert_eq!(backend.blocks_to_fetch(10), vec![stale.block_hash()]);
    // The stale block arrives mutated (its last transaction repeated: a
    // CVE-2012-2459 duplicate or a merkle root mismatch): refused, and its
    // header stays headers-only, not invalid.
    let mut mutated = stale.clone();
    mutated
        .txdata
        .push(mutated.txdata[mutated.txdata.len() - 1].clone());
    assert!(matches!(
        backend.submit_block(mutated),
        Err(SubmitError::Invalid { .. })
    ));
    {
        let cs = node.chain.lock();
        let id = cs.index().id_of(&stale.block_hash()).expect("stored");
        assert_eq!(
            cs.index().get(id).map(|e| e.status),
            Some(kakehi::chain::index::BlockStatus::HeadersOnly)
        );
    }
    // The plan now follows the rival, which connects.
    assert_eq!(backend.blocks_to_fetch(10), vec![rival.block_hash()]);
    assert!(matches!(
        backend.submit_block(rival.clone()),
        Ok(SubmitOutcome::NewTip { .. })
    ));
    assert_eq!(node.tip(), (height, rival.block_hash()));
    assert!(backend.blocks_to_fetch(10).is_empty());
}

/// The kyoto light client (`bip157` crate) syncs headers, filter headers and
/// filters from node A over loopback and finds exactly the blocks that pay
/// to or spend from a set of scripts; the expected set is computed here from
/// the blocks of `blocks.dat` and `chain.json`, not from kakehi.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kyoto_light_client_finds_the_blocks_of_a_script_set() {
    use std::collections::{BTreeSet, HashMap, HashSet};

    let params = ChainParams::new(Network::Regtest);
    let chain = json("regtest-a/chain.json");
    let on_best: HashSet<BlockHash> = chain["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["on_best_chain"].as_bool().unwrap())
        .map(|b| b["hash"].as_str().unwrap().parse().unwrap())
        .collect();
    let records = read_file(&blocks_file(), &params).expect("read blocks.dat");
    // Best-chain blocks in height order (each one's parent comes first in the
    // file, and the best chain is one chain).
    let best: Vec<&bitcoin::Block> = records
        .iter()
        .map(|r| &r.block)
        .filter(|b| on_best.contains(&b.block_hash()))
        .collect();
    assert_eq!(best.len(), 1500);
    // Scripts: two paid to at heights ~300 and ~900 by non-coinbase outputs,
    // and the scripts of the outputs spent by the first inputs at ~600 and
    // ~1200.
    let mut scripts: HashSet<bitcoin::ScriptBuf> = HashSet::new();
    let mut script_of: HashMap<bitcoin::OutPoint, bitcoin::ScriptBuf> = HashMap::new();
    for (i, block) in best.iter().enumerate() {
        let height = i + 1;
        for tx in block.txdata.iter().skip(1) {
            if (height >= 600 && scripts.len() == 2) || (height >= 1200 && scripts.len() == 3) {
                if let Some(s) = tx
                    .input
                    .iter()
                    .find_map(|i| script_of.get(&i.previous_output))
                {
                    scripts.insert(s.clone());
                }
            }
            let first = &tx.output[0].script_pubkey;
            if ((height >= 300 && scripts.is_empty()) || (height >= 900 && scripts.len() == 1))
                && !first.is_op_return()
            {
                scripts.insert(first.clone());
            }
        }
        for tx in &block.txdata {
            let txid = tx.compute_txid();
            for (vout, o) in tx.output.iter().enumerate() {
                script_of.insert(
                    bitcoin::OutPoint::new(txid, vout as u32),
                    o.script_pubkey.clone(),
                );
            }
        }
    }
    assert_eq!(scripts.len(), 4, "chose four scripts");
    let mut expected = BTreeSet::new();
    for (i, block) in best.iter().enumerate() {
        let pays = block
            .txdata
            .iter()
            .flat_map(|tx| &tx.output)
            .any(|o| scripts.contains(&o.script_pubkey));
        let spends = block
            .txdata
            .iter()
            .skip(1)
            .flat_map(|tx| &tx.input)
            .any(|i| {
                script_of
                    .get(&i.previous_output)
                    .is_some_and(|s| scripts.contains(s))
            });
        if pays || spends {
            expected.insert((i as u32 + 1, block.block_hash()));
        }
    }
    assert!(expected.len() >= 4, "expected blocks: {expected:?}");

    let (a, _, _) = node_a();
    let (pa, addr) = serve(a).await;
    let peer = bip157::TrustedPeer::new(
        bip157::AddrV2::Ipv4(std::net::Ipv4Addr::LOCALHOST),
        Some(addr.port()),
        bip157::ServiceFlags::NETWORK
            | bip157::ServiceFlags::WITNESS
            | bip157::ServiceFlags::COMPACT_FILTERS,
    );
    let (light, client) = bip157::Builder::new(bip157::Network::Regtest)
        .add_peer(peer)
        .whitelist_only()
        .required_peers(1)
        .build();
    let light_task = tokio::spawn(async move { light.run().await });
    let bip157::Client {
        requester,
        mut event_rx,
        ..
    } = client;
    let mut found = BTreeSet::new();
    let started = Instant::now();
    let tip = loop {
        let left = SYNC_TIMEOUT.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, event_rx.recv()).await {
            Err(_) => panic!("light client not synced within {SYNC_TIMEOUT:?}"),
            Ok(None) => panic!("light client stopped"),
            Ok(Some(bip157::Event::IndexedFilter(f))) => {
                if f.contains_any(scripts.iter()) {
                    found.insert((f.height(), f.block_hash()));
                }
            }
            Ok(Some(bip157::Event::FiltersSynced(update))) => break update.tip(),
            Ok(Some(_)) => {}
        }
    };
    eprintln!(
        "kyoto: synced to {} in {:.2} s, {} matching blocks",
        tip.height,
        started.elapsed().as_secs_f64(),
        found.len()
    );
    requester.shutdown().ok();
    let _ = tokio::time::timeout(Duration::from_secs(10), light_task).await;
    pa.stop().await;
    assert_eq!((tip.height, tip.hash), reference_tip());
    assert_eq!(found, expected);
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// The filter queries the P2P layer serves (`getcfilters`, `getcfheaders`,
/// `getcfcheckpt`), answered by the real backend by stop hash, for the best
/// chain and for every stale block of regtest-a, against bcoin's filters.
#[test]
fn filter_queries_by_stop_hash_match_the_reference_on_every_branch() {
    use bitcoin::bip158::{FilterHash, FilterHeader};
    use bitcoin::hashes::Hash;
    use kakehi::p2p::backend::FilterQueryError;

    let (a, _, _) = node_a();
    let backend = NodeP2p::new(a.chain.clone());
    let best = json("regtest-a/filters.json");
    let best = best.as_array().unwrap();
    let header_at =
        |h: usize| -> FilterHeader { best[h]["filter_header"].as_str().unwrap().parse().unwrap() };
    let mut entries: Vec<&serde_json::Value> = best.iter().collect();
    let stale = json("regtest-a/stale_filters.json");
    entries.extend(stale.as_array().unwrap().iter());
    for f in entries {
        let height = f["height"].as_u64().unwrap() as u32;
        let hash: BlockHash = f["hash"].as_str().unwrap().parse().unwrap();
        let filter = unhex(f["basic_filter"].as_str().unwrap());
        let want: FilterHeader = f["filter_header"].as_str().unwrap().parse().unwrap();
        let start = height.saturating_sub(20);
        let filters = backend.cfilters(start, hash).expect("cfilters");
        assert_eq!(filters.len() as u32, height - start + 1);
        assert_eq!(
            filters.last().unwrap(),
            &(hash, filter.clone()),
            "filter of {hash}"
        );
        // Filter headers chain from the previous header to the reference.
        let (prev, hashes) = backend.cfheaders(start, hash).expect("cfheaders");
        // The node's header before `start` (on the stop block's branch)
        // chained with its filter hashes gives the reference header.
        if start == 0 {
            assert_eq!(prev, FilterHeader::all_zeros());
        }
        let mut header = if start == 0 {
            FilterHeader::all_zeros()
        } else {
            prev
        };
        for h in &hashes {
            header = h.filter_header(&header);
        }
        assert_eq!(header, want, "filter header of {hash} at {height}");
        assert_eq!(hashes.last(), Some(&FilterHash::hash(&filter)));
    }
    let tip = reference_tip();
    let checkpoints = backend.cfcheckpt(tip.1).expect("cfcheckpt");
    assert_eq!(checkpoints, vec![header_at(1000)]);
    assert!(matches!(
        backend.cfilters(0, BlockHash::all_zeros()),
        Err(FilterQueryError::UnknownStop { .. })
    ));
    assert!(matches!(
        backend.cfheaders(tip.0 + 1, tip.1),
        Err(FilterQueryError::StartAboveStop { .. })
    ));
}
