//! The archive over P2P (`docs/archive.md` §8) and `POST /tx`
//! relay, against a real kakehi node that imported
//! `testnet-data/regtest-a` (a chain made by bcoin 2.2.0), talked to by a
//! test peer built on the node's codec and a `TcpStream`:
//!
//! - `getarchepoch` gives the epoch headers and commitment the node's
//!   library and HTTP route report, equal to those sealed from the
//!   independent feed (`tests/common/feed.rs`, blocks.dat + chain.json);
//! - `getarchproof` for every final spend of `spent.txt` and every output of
//!   `utxos.txt`: each returned proof verifies with the library's pure
//!   `verify_bytes` against that commitment and names the spender bcoin
//!   recorded (txid, input, height, the block's merkle root);
//! - malformed and over-limit requests disconnect; a node that does not
//!   advertise NODE_ARCHIVE_PROOFS disconnects requesters;
//! - two nodes syncing over P2P report the same commitment (over P2P);
//! - a transaction POSTed over HTTP reaches a connected peer as `inv`/`tx`.
//!
//! Every wait is bounded.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bitcoin::hashes::Hash;
use bitcoin::p2p::message::NetworkMessage;
use bitcoin::p2p::message_blockdata::Inventory;
use bitcoin::p2p::message_network::VersionMessage;
use bitcoin::p2p::Magic;
use bitcoin::{Network, OutPoint, Txid};
use common::data;
use common::feed::{self, Chain};
use common::test_peer::TestPeer;
use kakehi::archive::{verify_bytes, Anchor, Archive, EpochHeader, VerifiedStatus};
use kakehi::chain::ChainParams;
use kakehi::import::import_files;
use kakehi::node::start_p2p;
use kakehi::node::{open_chainstate, DataDir};
use kakehi::p2p::archive::{
    archive_service, ArchEpochs, ArchProof, ArchProofStatus, GetArchEpochs, GetArchProof,
    ARCHEPOCHS, ARCHPROOF, GETARCHEPOCH, GETARCHPROOF, MAX_ARCHPROOF_PROOF_BYTES,
};
use kakehi::p2p::codec::{self, encode_raw, CodecError};
use kakehi::p2p::{P2pConfig, P2pError, P2pHandle};
use kakehi::pipeline::Chainstate;
use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::timeout;

const M: Magic = Magic::REGTEST;
/// Upper bound of a P2P sync of regtest-a (debug build, 2 shared cores).
const SYNC_TIMEOUT: Duration = Duration::from_secs(120);

/// A chain state in its own datadir.
struct Node {
    chain: Arc<Mutex<Chainstate>>,
    _datadir: DataDir,
    _dir: tempfile::TempDir,
}

impl Node {
    fn empty() -> Node {
        let dir = common::tempdir();
        let datadir = DataDir::open(dir.path()).expect("datadir");
        let cs = open_chainstate(ChainParams::new(Network::Regtest), &datadir).expect("open");
        Node {
            chain: Arc::new(Mutex::new(cs)),
            _datadir: datadir,
            _dir: dir,
        }
    }

    fn imported() -> Node {
        let n = Node::empty();
        let summary = import_files(
            &n.chain,
            &[data("regtest-a/blocks.dat")],
            &AtomicBool::new(false),
            false,
        )
        .expect("import");
        assert!(summary.rejected.is_empty(), "{:?}", summary.rejected);
        n
    }

    fn epochs_and_commitment(&self) -> (Vec<EpochHeader>, [u8; 32]) {
        let cs = self.chain.lock().snapshot();
        (cs.archive().epochs().to_vec(), cs.archive().commitment())
    }
}

/// Node A: regtest-a imported (shared by the tests of this file).
fn node_a() -> &'static Node {
    static NODE: OnceLock<Node> = OnceLock::new();
    NODE.get_or_init(Node::imported)
}

fn chain() -> &'static Chain {
    static CHAIN: OnceLock<Chain> = OnceLock::new();
    CHAIN.get_or_init(Chain::load)
}

/// The epochs sealed from the independent feed.
fn reference() -> &'static (Vec<EpochHeader>, [u8; 32]) {
    static REF: OnceLock<(Vec<EpochHeader>, [u8; 32])> = OnceLock::new();
    REF.get_or_init(|| {
        let dir = common::tempdir();
        let mut a = Archive::open(dir.path(), feed::EPOCH_LENGTH).expect("open");
        let c = chain();
        for n in 0..c.complete_epochs() {
            a.seal(n, c.epoch_leaves(n)).expect("seal");
        }
        (a.epochs().to_vec(), a.commitment())
    })
}

/// A running P2P layer of a node.
struct P2p {
    handle: P2pHandle,
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), P2pError>>,
}

impl P2p {
    async fn start(node: &Node, connect: Vec<SocketAddr>) -> P2p {
        let mut c = P2pConfig::default();
        c.listen = Some("127.0.0.1:0".parse().unwrap());
        c.connect = connect;
        c.dns_seeds = false;
        let (stop, rx) = watch::channel(false);
        let (handle, task) = start_p2p(node.chain.clone(), c, rx);
        let addr = timeout(Duration::from_secs(10), handle.local_addr())
            .await
            .expect("listener up")
            .expect("address");
        P2p {
            handle,
            addr,
            stop,
            task,
        }
    }

    async fn stop(self) {
        self.stop.send_replace(true);
        timeout(Duration::from_secs(20), self.task)
            .await
            .expect("p2p stops")
            .expect("joins")
            .expect("ends cleanly");
    }
}

impl TestPeer {
    /// The next unknown-command message named `command`, its payload.
    async fn recv_custom(&mut self, command: &str) -> Vec<u8> {
        self.recv_until(|m| match m {
            NetworkMessage::Unknown {
                command: c,
                payload,
            } if c.to_string() == command => Some(payload),
            _ => None,
        })
        .await
    }

    async fn epochs(&mut self, start: u32, count: u16) -> ArchEpochs {
        self.send(GetArchEpochs { start, count }.to_message()).await;
        ArchEpochs::decode(&self.recv_custom(ARCHEPOCHS).await).expect("archepochs decodes")
    }

    async fn proof(&mut self, req: &GetArchProof) -> ArchProof {
        self.send(req.to_message()).await;
        let p = ArchProof::decode(&self.recv_custom(ARCHPROOF).await).expect("archproof decodes");
        assert_eq!(p.request_id, req.request_id);
        assert!(p.proof.len() <= MAX_ARCHPROOF_PROOF_BYTES);
        p
    }

    /// Whether the node closes the connection within `within`.
    async fn closed_within(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match timeout(
                left,
                codec::read_message(&mut self.rd, M, Duration::from_secs(5)),
            )
            .await
            {
                Err(_) => return false,
                Ok(Err(CodecError::Io { .. })) => return true,
                Ok(Err(e)) => panic!("unexpected codec error {e}"),
                Ok(Ok(_)) => continue,
            }
        }
    }
}

fn advertises_archive(v: &VersionMessage) -> bool {
    v.services.has(archive_service())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archepochs_equal_the_library_http_and_independent_feed() {
    let a = node_a();
    let p2p = P2p::start(a, vec![]).await;
    let mut peer = TestPeer::handshake(p2p.addr, false).await;
    assert!(
        advertises_archive(&peer.version),
        "{:?}",
        peer.version.services
    );
    let (lib_epochs, lib_commitment) = a.epochs_and_commitment();
    let (ref_epochs, ref_commitment) = reference();
    assert_eq!(lib_epochs.len(), chain().complete_epochs() as usize);

    let all = peer.epochs(0, 2000).await;
    assert_eq!(all.start, 0);
    assert_eq!(all.sealed as usize, ref_epochs.len());
    assert_eq!(&all.headers, ref_epochs);
    assert_eq!(all.headers, lib_epochs);
    assert_eq!(all.commitment, *ref_commitment);
    assert_eq!(all.commitment, lib_commitment);
    // The client's own check: the headers chain to the commitment.
    assert_eq!(kakehi::archive::commitment(&all.headers), all.commitment);
    for w in all.headers.windows(2) {
        assert_eq!(w[1].prev, w[0].hash());
    }

    // The HTTP route says the same.
    let http = serve_http(a.chain.clone(), None).await;
    let (status, body) = http_request(http, "GET", "/archive/epochs", "").await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let http_headers: Vec<EpochHeader> = serde_json::from_value(v["epochs"].clone()).unwrap();
    assert_eq!(http_headers, all.headers);
    assert_eq!(v["commitment"].as_str().unwrap(), hex(&all.commitment));

    // A window, and windows past the end: fewer headers, same commitment.
    let mid = peer.epochs(3, 2).await;
    assert_eq!((mid.start, mid.headers.as_slice()), (3, &ref_epochs[3..5]));
    let tail = peer.epochs(all.sealed - 1, 10).await;
    assert_eq!(tail.headers, ref_epochs[ref_epochs.len() - 1..]);
    let beyond = peer.epochs(all.sealed + 100, 1).await;
    assert!(beyond.headers.is_empty());
    assert_eq!(
        (beyond.sealed, beyond.commitment),
        (all.sealed, all.commitment)
    );
    p2p.stop().await;
}

/// Asks for proofs of `ops` (in requests of ≤ 1,000, following `partial`
/// answers) and returns each answer's verified facts, checked against
/// `anchor` with the pure verifier.
async fn prove_all(
    peer: &mut TestPeer,
    ops: &[OutPoint],
    epoch: Option<u32>,
    anchor: Anchor,
    stats: &mut (usize, usize),
) -> Vec<(OutPoint, VerifiedStatus)> {
    let mut out = Vec::with_capacity(ops.len());
    let mut rest = ops;
    let mut id = 100;
    while !rest.is_empty() {
        id += 1;
        let n = rest.len().min(1000);
        let req = GetArchProof {
            request_id: id,
            txoutproofs: true,
            epoch,
            outpoints: rest[..n].to_vec(),
        };
        let answer = peer.proof(&req).await;
        let answered = answer.answered as usize;
        match answer.status {
            ArchProofStatus::Ok => assert_eq!(answered, n),
            ArchProofStatus::Partial => {
                assert!(answered >= 1 && answered < n);
                stats.1 += 1;
            }
            other => panic!("unexpected status {other:?}"),
        }
        stats.0 += 1;
        let v = verify_bytes(&answer.proof, anchor).expect("P2P proof verifies");
        for op in &rest[..answered] {
            let st = v.status(op).unwrap_or_else(|| panic!("{op} not in proof"));
            out.push((*op, st.clone()));
        }
        // The proof speaks of the answered outpoints only.
        if answered < n {
            assert!(v.status(&rest[answered]).is_none());
        }
        rest = &rest[answered..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archproofs_for_spent_txt_and_utxos_txt_verify_and_name_the_spender() {
    let a = node_a();
    let p2p = P2p::start(a, vec![]).await;
    let mut peer = TestPeer::handshake(p2p.addr, false).await;
    let epochs = peer.epochs(0, 2000).await;
    assert_eq!(epochs.commitment, reference().1);
    let anchor = Anchor::Commitment(epochs.commitment);
    let sealed_through = epochs.headers.last().expect("sealed").last_height;
    let started = Instant::now();
    let mut stats = (0, 0);

    // Every final spend bcoin recorded, up to the last sealed height.
    let spends: Vec<_> = feed::spent_lines()
        .into_iter()
        .filter(|s| s.3 <= sealed_through)
        .collect();
    assert!(spends.len() > 50_000, "{} sealed spends", spends.len());
    let ops: Vec<OutPoint> = spends.iter().map(|s| s.0).collect();
    let got = prove_all(&mut peer, &ops, None, anchor, &mut stats).await;
    assert_eq!(got.len(), spends.len());
    for ((op, st), (op2, spender, vin, height)) in got.iter().zip(&spends) {
        assert_eq!(op, op2);
        match st {
            VerifiedStatus::Spent {
                epoch,
                leaf,
                inclusion,
            } => {
                assert_eq!(leaf.spend.txid, *spender, "{op}");
                assert_eq!(leaf.spend.vin, *vin, "{op}");
                assert_eq!(leaf.spend.height, *height, "{op}");
                assert_eq!(*epoch, height / feed::EPOCH_LENGTH, "{op}");
                let block = &chain().blocks[*height as usize - 1];
                let inc = inclusion.as_ref().expect("txoutproof asked and attached");
                assert_eq!(inc.block_hash, block.block_hash(), "{op}");
                assert_eq!(inc.merkle_root, block.header.merkle_root, "{op}");
            }
            other => panic!("{op}: {other:?}"),
        }
    }
    let spent_requests = stats.0;

    // Every live output: absent from every sealed epoch.
    let utxos: Vec<OutPoint> = feed::utxo_lines().into_iter().map(|u| u.0).collect();
    let got = prove_all(&mut peer, &utxos, None, anchor, &mut stats).await;
    assert_eq!(got.len(), utxos.len());
    let all_epochs: Vec<u32> = (0..epochs.sealed).collect();
    for (op, st) in &got {
        match st {
            VerifiedStatus::Absent { epochs } => assert_eq!(epochs, &all_epochs, "{op}"),
            other => panic!("{op} is in utxos.txt but proven {other:?}"),
        }
    }
    eprintln!(
        "{} spends and {} utxos proven over P2P in {} requests ({} partial) in {:?}",
        spends.len(),
        utxos.len(),
        stats.0,
        stats.1,
        started.elapsed()
    );
    assert!(spent_requests >= spends.len() / 1000);

    // Single-epoch (root-anchored) requests: the spends of epoch 3.
    let e = 3u32;
    let in_e: Vec<_> = spends
        .iter()
        .filter(|s| s.3 / feed::EPOCH_LENGTH == e)
        .take(1000)
        .collect();
    let ops: Vec<OutPoint> = in_e.iter().map(|s| s.0).collect();
    let root = Anchor::EpochRoot(epochs.headers[e as usize].root);
    let got = prove_all(&mut peer, &ops, Some(e), root, &mut stats).await;
    for ((op, st), s) in got.iter().zip(&in_e) {
        assert!(
            matches!(st, VerifiedStatus::Spent { epoch, leaf, .. } if *epoch == e && leaf.spend.txid == s.1),
            "{op}: {st:?}"
        );
    }
    // ... and the same proof does not verify against the commitment or
    // another epoch's root.
    let req = GetArchProof {
        request_id: 9,
        txoutproofs: false,
        epoch: Some(e),
        outpoints: ops[..1].to_vec(),
    };
    let p = peer.proof(&req).await;
    assert!(verify_bytes(&p.proof, root).is_ok());
    assert!(verify_bytes(&p.proof, anchor).is_err());
    assert!(verify_bytes(&p.proof, Anchor::EpochRoot(epochs.headers[2].root)).is_err());

    // Unknown epoch: unavailable. Unknown outpoint: proven absent.
    let req = GetArchProof {
        request_id: 10,
        txoutproofs: false,
        epoch: Some(epochs.sealed + 5),
        outpoints: ops[..1].to_vec(),
    };
    let p = peer.proof(&req).await;
    assert_eq!(
        (p.status, p.answered, p.proof.len()),
        (ArchProofStatus::Unavailable, 0, 0)
    );
    let nobody = OutPoint {
        txid: Txid::from_byte_array([0x5a; 32]),
        vout: 3,
    };
    let got = prove_all(&mut peer, &[nobody], None, anchor, &mut stats).await;
    assert!(matches!(&got[0].1, VerifiedStatus::Absent { epochs } if epochs == &all_epochs));
    p2p.stop().await;
}

/// A request payload framed as `command`.
fn frame(command: &str, payload: &[u8]) -> Vec<u8> {
    encode_raw(M, command, payload)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_over_limit_requests_disconnect() {
    let a = node_a();
    let p2p = P2p::start(a, vec![]).await;
    let op = |i: u32| OutPoint {
        txid: Txid::from_byte_array([7; 32]),
        vout: i,
    };
    let good = GetArchProof {
        request_id: 1,
        txoutproofs: false,
        epoch: None,
        outpoints: vec![op(0), op(1)],
    }
    .encode();
    let mut over = good[..13].to_vec();
    over.extend_from_slice(&[0xfd, 0xe9, 0x03]); // 1,001 outpoints
    for i in 0..1001 {
        over.extend_from_slice(&bitcoin::consensus::serialize(&op(i)));
    }
    let mut dup = good[..13].to_vec();
    dup.push(2);
    dup.extend_from_slice(&bitcoin::consensus::serialize(&op(0)));
    dup.extend_from_slice(&bitcoin::consensus::serialize(&op(0)));
    let mut bad_flag = good.clone();
    bad_flag[8] = 0x80;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "getarchepoch 5 bytes",
            frame(GETARCHEPOCH, &[0, 0, 0, 0, 1]),
        ),
        (
            "getarchepoch count 0",
            frame(GETARCHEPOCH, &[0, 0, 0, 0, 0, 0]),
        ),
        (
            "getarchepoch count 2,001",
            frame(GETARCHEPOCH, &[0, 0, 0, 0, 0xd1, 0x07]),
        ),
        ("getarchproof 1,001 outpoints", frame(GETARCHPROOF, &over)),
        (
            "getarchproof truncated",
            frame(GETARCHPROOF, &good[..good.len() - 1]),
        ),
        ("getarchproof duplicate", frame(GETARCHPROOF, &dup)),
        ("getarchproof unknown flag", frame(GETARCHPROOF, &bad_flag)),
    ];
    for (name, bytes) in cases {
        let mut peer = TestPeer::handshake(p2p.addr, false).await;
        // Well-formed requests first: answered, connection kept.
        let e = peer.epochs(0, 1).await;
        assert_eq!(e.headers.len(), 1, "{name}");
        peer.wr.write_all(&bytes).await.unwrap();
        assert!(
            peer.closed_within(Duration::from_secs(10)).await,
            "{name}: still connected"
        );
    }
    // The node is fine: a new peer is served.
    let mut peer = TestPeer::handshake(p2p.addr, false).await;
    let p = peer
        .proof(&GetArchProof {
            request_id: 2,
            txoutproofs: false,
            epoch: None,
            outpoints: vec![op(0)],
        })
        .await;
    assert_eq!(p.status, ArchProofStatus::Ok);
    p2p.stop().await;

    // A node with nothing sealed does not advertise the service and
    // disconnects a peer asking anyway.
    let empty = Node::empty();
    let p2p = P2p::start(&empty, vec![]).await;
    for req in [
        GetArchEpochs { start: 0, count: 1 }.to_message(),
        GetArchProof {
            request_id: 3,
            txoutproofs: false,
            epoch: None,
            outpoints: vec![op(0)],
        }
        .to_message(),
    ] {
        let mut peer = TestPeer::handshake(p2p.addr, false).await;
        assert!(!advertises_archive(&peer.version));
        peer.send(req).await;
        assert!(peer.closed_within(Duration::from_secs(10)).await);
    }
    p2p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_synced_over_p2p_report_the_same_commitment() {
    let a = node_a();
    let pa = P2p::start(a, vec![]).await;
    let b = Node::empty();
    let pb = P2p::start(&b, vec![pa.addr]).await;
    let want = {
        let cs = a.chain.lock();
        let t = cs.index().tip();
        (t.height, t.hash)
    };
    // B's published snapshots: polling them never waits for B's writer.
    let b_snapshots = b.chain.lock().snapshots();
    let started = Instant::now();
    loop {
        let tip = {
            let cs = b_snapshots.load();
            let t = cs.index().tip();
            (t.height, t.hash)
        };
        if tip == want {
            break;
        }
        assert!(
            started.elapsed() < SYNC_TIMEOUT,
            "B at {tip:?}, A at {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("B synced regtest-a from A in {:?}", started.elapsed());
    assert_eq!(b.epochs_and_commitment(), a.epochs_and_commitment());
    // Over P2P too: both advertise the service and send the same answer.
    let mut to_a = TestPeer::handshake(pa.addr, false).await;
    let mut to_b = TestPeer::handshake(pb.addr, false).await;
    assert!(advertises_archive(&to_b.version));
    let (ea, eb) = (to_a.epochs(0, 2000).await, to_b.epochs(0, 2000).await);
    assert_eq!(ea, eb);
    assert_eq!(eb.commitment, reference().1);
    pb.stop().await;
    pa.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posted_transaction_reaches_a_peer_as_inv_and_tx() {
    // A chain of the test's own (101 blocks paying its wallet), so that it
    // can sign a valid spend of block 1's coinbase.
    let a = Node::empty();
    let wallet = common::blockgen::Wallet::new();
    let blocks = common::blockgen::mature_chain(&wallet, 101);
    for b in &blocks[1..] {
        a.chain.lock().submit_block(b).expect("block");
    }
    let tx = common::blockgen::spend_p2wpkh(&wallet, &blocks[1].txdata[0], 1_000, false);
    let p2p = P2p::start(&a, vec![]).await;
    let http = serve_http(a.chain.clone(), Some(p2p.handle.clone())).await;
    let hexed = hex(&bitcoin::consensus::serialize(&tx));

    // No peer yet: accepted to the mempool all the same.
    let (st, body) = http_request(http, "POST", "/tx", &hexed).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(body, tx.compute_txid().to_string());

    let mut quiet = TestPeer::handshake(p2p.addr, false).await;
    let mut peer = TestPeer::handshake(p2p.addr, true).await;
    // Posted again once peers are there: in the mempool already, a success
    // that announces it again (Core's BroadcastTransaction).
    let (st, body) = http_request(http, "POST", "/tx", &hexed).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(body, tx.compute_txid().to_string());
    let inv = peer
        .recv_until(|m| match m {
            NetworkMessage::Inv(i) => Some(i),
            _ => None,
        })
        .await;
    // Our peer sent wtxidrelay: announced by wtxid (BIP339).
    assert_eq!(inv, vec![Inventory::WTx(tx.compute_wtxid())]);
    peer.send(NetworkMessage::GetData(inv)).await;
    let got = peer
        .recv_until(|m| match m {
            NetworkMessage::Tx(t) => Some(t),
            _ => None,
        })
        .await;
    assert_eq!(
        bitcoin::consensus::serialize(&got),
        bitcoin::consensus::serialize(&tx)
    );
    // The peer that asked for no relay gets no inv before its pong.
    quiet.send(NetworkMessage::Ping(11)).await;
    let first = quiet
        .recv_until(|m| match m {
            NetworkMessage::Inv(_) => Some(false),
            NetworkMessage::Pong(11) => Some(true),
            _ => None,
        })
        .await;
    assert!(first, "inv sent to a peer with relay = false");

    // A transaction of another chain, a coinbase, and junk are refused.
    let confirmed = &chain().blocks[299].txdata[1];
    let (st, body) = http_request(
        http,
        "POST",
        "/tx",
        &hex(&bitcoin::consensus::serialize(confirmed)),
    )
    .await;
    assert_eq!(st, 400, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let message = v["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("sendrawtransaction RPC error: "),
        "{body}"
    );
    let coinbase = &chain().blocks[299].txdata[0];
    let (st, _) = http_request(
        http,
        "POST",
        "/tx",
        &hex(&bitcoin::consensus::serialize(coinbase)),
    )
    .await;
    assert_eq!(st, 400);
    let (st, _) = http_request(http, "POST", "/tx", "0100").await;
    assert_eq!(st, 400);
    p2p.stop().await;

    // Without P2P: still accepted (in a mempool of its own here).
    let http = serve_http(a.chain.clone(), None).await;
    let (st, body) = http_request(http, "POST", "/tx", &hexed).await;
    assert_eq!(st, 200, "{body}");
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Serves the node's full HTTP API on 127.0.0.1:<ephemeral>.
async fn serve_http(chain: Arc<Mutex<Chainstate>>, p2p: Option<P2pHandle>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let snapshots = chain.lock().snapshots();
    let mempool = Arc::new(kakehi::mempool::Mempool::new(
        snapshots.clone(),
        kakehi::mempool::MempoolConfig::default(),
    ));
    let state = kakehi::http::AppState {
        snapshots,
        p2p,
        mempool: Some(mempool),
    };
    tokio::spawn(kakehi::http::serve_listener(
        listener,
        state,
        kakehi::http::HttpConfig::default(),
        std::future::pending(),
    ));
    addr
}

/// One HTTP/1.1 request over a fresh connection: (status, body).
async fn http_request(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    use tokio::io::AsyncReadExt;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    timeout(Duration::from_secs(60), s.read_to_end(&mut raw))
        .await
        .expect("HTTP answer within 60 s")
        .unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}
