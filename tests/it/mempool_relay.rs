//! Transaction relay over P2P (Bitcoin Core's `net_processing.cpp`), against
//! real kakehi nodes with a mempool on a chain of the test's own (102 blocks
//! paying the test's wallet, so that it can sign valid spends), talked to
//! by hand-driven peers (`common::test_peer`) and by another kakehi node:
//!
//! - a transaction announced by `inv` (wtxid, BIP-339) is fetched with
//!   `getdata`, accepted, and announced to the other peers but not to its
//!   sender, nor to a peer whose BIP-133 `feefilter` is above its feerate;
//!   it is served on `getdata`, an unknown wtxid gets `notfound`, and the
//!   node sends its own `feefilter`;
//! - an invalid transaction (bad signature) is neither kept nor announced,
//!   its wtxid is not asked for again, and its sender stays connected
//!   (Core 30.0 does not punish transaction failures);
//! - a child received before its parent makes the node ask that peer for
//!   the parent, and is accepted once the parent arrives;
//! - between two kakehi nodes, a transaction in A's mempool before B
//!   connects, and one accepted after, both reach B's mempool.
//!
//! Every wait is bounded.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bitcoin::p2p::message::NetworkMessage;
use bitcoin::p2p::message_blockdata::Inventory;
use bitcoin::{Block, Network, Txid, Wtxid};
use common::blockgen::{mature_chain, spend_p2wpkh, Wallet};
use common::test_peer::TestPeer;
use kakehi::chain::ChainParams;
use kakehi::mempool::{Mempool, MempoolConfig};
use kakehi::node::{open_chainstate, start_p2p_with_mempool, DataDir};
use kakehi::p2p::{P2pConfig, P2pError, P2pHandle};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::timeout;

/// Longest wait for an announcement: the inbound trickle is Poisson with a
/// 5 s mean (a wait past 60 s has odds of e^-12).
const RELAY_TIMEOUT: Duration = Duration::from_secs(60);

/// A node with a mempool and a listening P2P layer relaying through it.
struct RelayNode {
    mempool: Arc<Mempool>,
    handle: P2pHandle,
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), P2pError>>,
    _datadir: DataDir,
    _dir: tempfile::TempDir,
}

impl RelayNode {
    /// `blocks[1..]` connected, P2P listening on loopback and dialing
    /// `connect`; accepted transactions are relayed as `main.rs` wires it.
    async fn start(blocks: &[Block], connect: Vec<SocketAddr>) -> RelayNode {
        let dir = common::tempdir();
        let datadir = DataDir::open(dir.path()).expect("datadir");
        let cs = open_chainstate(ChainParams::new(Network::Regtest), &datadir).expect("open");
        let chain = Arc::new(Mutex::new(cs));
        for b in &blocks[1..] {
            chain.lock().submit_block(b).expect("block");
        }
        let snapshots = chain.lock().snapshots();
        let mempool = Arc::new(Mempool::new(snapshots, MempoolConfig::default()));
        let mut c = P2pConfig::default();
        c.listen = Some("127.0.0.1:0".parse().unwrap());
        c.connect = connect;
        c.dns_seeds = false;
        let (stop, rx) = watch::channel(false);
        let (handle, task) = start_p2p_with_mempool(chain, Some(mempool.clone()), c, rx);
        let relay = handle.clone();
        mempool.on_accepted(Box::new(move |e| {
            let _ = relay.relay_transaction((*e.tx).clone());
        }));
        let addr = timeout(Duration::from_secs(10), handle.local_addr())
            .await
            .expect("listener up")
            .expect("address");
        RelayNode {
            mempool,
            handle,
            addr,
            stop,
            task,
            _datadir: datadir,
            _dir: dir,
        }
    }

    fn has(&self, txid: Txid) -> bool {
        self.mempool.snapshot().pool.contains(&txid)
    }

    /// Waits (≤ [`RELAY_TIMEOUT`]) until `txid` is in the mempool.
    async fn wait_for(&self, txid: Txid) {
        let started = Instant::now();
        while !self.has(txid) {
            assert!(
                started.elapsed() < RELAY_TIMEOUT,
                "{txid} not in the mempool"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
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

/// The test's wallet and a chain of 102 blocks paying it (the coinbases of
/// blocks 1 and 2 are spendable in the next block).
fn chain() -> (Wallet, Vec<Block>) {
    let wallet = Wallet::new();
    let blocks = mature_chain(&wallet, 102);
    (wallet, blocks)
}

/// Receives until an `inv` naming `wtxid` (other messages skipped).
async fn recv_inv_of(peer: &mut TestPeer, wtxid: Wtxid) -> Vec<Inventory> {
    timeout(
        RELAY_TIMEOUT,
        peer.recv_until(|m| match m {
            NetworkMessage::Inv(i) if i.contains(&Inventory::WTx(wtxid)) => Some(i),
            _ => None,
        }),
    )
    .await
    .expect("inv within the relay timeout")
}

/// The messages a peer receives until the `pong` of a `ping` sent now.
async fn drain(peer: &mut TestPeer, nonce: u64) -> Vec<NetworkMessage> {
    peer.send(NetworkMessage::Ping(nonce)).await;
    let mut seen = Vec::new();
    peer.recv_until(|m| match m {
        NetworkMessage::Pong(n) if n == nonce => Some(()),
        other => {
            seen.push(other);
            None
        }
    })
    .await;
    seen
}

fn announces(msgs: &[NetworkMessage], wtxid: Wtxid) -> bool {
    msgs.iter()
        .any(|m| matches!(m, NetworkMessage::Inv(i) if i.contains(&Inventory::WTx(wtxid))))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announced_tx_is_fetched_accepted_and_announced_to_others() {
    let (wallet, blocks) = chain();
    let tx = spend_p2wpkh(&wallet, &blocks[1].txdata[0], 1_000, false);
    let (txid, wtxid) = (tx.compute_txid(), tx.compute_wtxid());
    let node = RelayNode::start(&blocks, vec![]).await;

    let mut sender = TestPeer::handshake(node.addr, true).await;
    let mut other = TestPeer::handshake(node.addr, true).await;
    let mut filtered = TestPeer::handshake(node.addr, true).await;
    // 10,000 sat/vB: far above the transaction's ~9 sat/vB.
    filtered.send(NetworkMessage::FeeFilter(10_000_000)).await;
    filtered.ping(3).await;

    // inv by wtxid → getdata by wtxid (an inbound peer waits 2 s).
    sender
        .send(NetworkMessage::Inv(vec![Inventory::WTx(wtxid)]))
        .await;
    let asked = timeout(
        Duration::from_secs(10),
        sender.recv_until(|m| match m {
            NetworkMessage::GetData(i) => Some(i),
            _ => None,
        }),
    )
    .await
    .expect("getdata within 10 s");
    assert_eq!(asked, vec![Inventory::WTx(wtxid)]);
    sender.send(NetworkMessage::Tx(tx.clone())).await;
    node.wait_for(txid).await;

    // Announced to the other peer (by wtxid, it sent wtxidrelay), and
    // served to it; our own feefilter came first.
    let mut feefilter = other.early.iter().find_map(|m| match m {
        NetworkMessage::FeeFilter(f) => Some(*f),
        _ => None,
    });
    let inv = timeout(
        RELAY_TIMEOUT,
        other.recv_until(|m| match m {
            NetworkMessage::FeeFilter(f) => {
                feefilter = Some(f);
                None
            }
            NetworkMessage::Inv(i) => Some(i),
            _ => None,
        }),
    )
    .await
    .expect("inv within the relay timeout");
    assert_eq!(inv, vec![Inventory::WTx(wtxid)]);
    // Our feefilter: the mempool's minimum (100 sat/kvB), rounded to a
    // bucket within 10 %.
    let f = feefilter.expect("a feefilter before the first inv");
    assert!((90..=110).contains(&f), "feefilter {f} sat/kvB");
    other
        .send(NetworkMessage::GetData(vec![Inventory::WTx(wtxid)]))
        .await;
    let got = other
        .recv_until(|m| match m {
            NetworkMessage::Tx(t) => Some(t),
            _ => None,
        })
        .await;
    assert_eq!(got, tx);

    // Not back to its sender, nor to the peer whose feefilter is above its
    // feerate: inbound peers share one trickle timer, so theirs has fired
    // too by now (give their tasks a moment).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!announces(&drain(&mut sender, 4).await, wtxid));
    assert!(!announces(&drain(&mut filtered, 5).await, wtxid));

    // An unknown wtxid: notfound.
    let unknown = Inventory::WTx(Wtxid::from_raw_hash(
        bitcoin::hashes::Hash::from_byte_array([7; 32]),
    ));
    other.send(NetworkMessage::GetData(vec![unknown])).await;
    let nf = other
        .recv_until(|m| match m {
            NetworkMessage::NotFound(i) => Some(i),
            _ => None,
        })
        .await;
    assert_eq!(nf, vec![unknown]);
    assert_eq!(node.handle.peer_count(), 3);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_tx_is_not_kept_nor_relayed_nor_asked_again() {
    let (wallet, blocks) = chain();
    let bad = spend_p2wpkh(&wallet, &blocks[1].txdata[0], 1_000, true);
    let good = spend_p2wpkh(&wallet, &blocks[2].txdata[0], 1_000, false);
    let node = RelayNode::start(&blocks, vec![]).await;
    let mut sender = TestPeer::handshake(node.addr, true).await;
    let mut other = TestPeer::handshake(node.addr, true).await;

    sender.send(NetworkMessage::Tx(bad.clone())).await;
    sender.send(NetworkMessage::Tx(good.clone())).await;
    node.wait_for(good.compute_txid()).await;
    assert!(!node.has(bad.compute_txid()));
    // Only the valid one is announced.
    let inv = recv_inv_of(&mut other, good.compute_wtxid()).await;
    assert_eq!(inv, vec![Inventory::WTx(good.compute_wtxid())]);

    // The invalid one's wtxid is a recent reject: announced again, it is
    // not asked for (an inbound announcement is ready after 2 s, requests
    // leave on a 1 s tick). The sender is still connected.
    sender
        .send(NetworkMessage::Inv(vec![Inventory::WTx(
            bad.compute_wtxid(),
        )]))
        .await;
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let seen = drain(&mut sender, 9).await;
    assert!(
        !seen.iter().any(|m| matches!(m, NetworkMessage::GetData(_))),
        "{seen:?}"
    );
    assert_eq!(node.handle.peer_count(), 2);
    assert!(node.handle.discouraged().is_empty());
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_is_accepted_once_its_parent_arrives() {
    let (wallet, blocks) = chain();
    let parent = spend_p2wpkh(&wallet, &blocks[1].txdata[0], 1_000, false);
    let child = spend_p2wpkh(&wallet, &parent, 1_000, false);
    let node = RelayNode::start(&blocks, vec![]).await;
    let mut peer = TestPeer::handshake(node.addr, true).await;

    peer.send(NetworkMessage::Tx(child.clone())).await;
    // The node asks the sender for the missing parent, by txid.
    let asked = timeout(
        Duration::from_secs(10),
        peer.recv_until(|m| match m {
            NetworkMessage::GetData(i) => Some(i),
            _ => None,
        }),
    )
    .await
    .expect("getdata for the parent within 10 s");
    assert_eq!(
        asked,
        vec![Inventory::WitnessTransaction(parent.compute_txid())]
    );
    assert!(!node.has(child.compute_txid()));
    peer.send(NetworkMessage::Tx(parent.clone())).await;
    node.wait_for(parent.compute_txid()).await;
    node.wait_for(child.compute_txid()).await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_of_one_kakehi_reach_another() {
    let (wallet, blocks) = chain();
    let before = spend_p2wpkh(&wallet, &blocks[1].txdata[0], 1_000, false);
    let after = spend_p2wpkh(&wallet, &blocks[2].txdata[0], 2_000, false);
    let a = RelayNode::start(&blocks, vec![]).await;
    // Accepted while A has no peer: announced to B when B connects.
    a.mempool.submit(before.clone(), None).expect("accepted");
    let b = RelayNode::start(&blocks, vec![a.addr]).await;
    b.wait_for(before.compute_txid()).await;
    // Accepted while connected: relayed.
    a.mempool.submit(after.clone(), None).expect("accepted");
    b.wait_for(after.compute_txid()).await;
    b.stop().await;
    a.stop().await;
}
