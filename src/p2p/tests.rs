//! Loopback tests of the P2P layer against the regtest-a data set (blocks
//! from bcoin, filters from bcoin's FilterIndexer, checked independently;
//! see testnet-data/regtest-a/README.md). Every test is bounded in time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bitcoin::bip158::{FilterHash, FilterHeader};
use bitcoin::block::Header;
use bitcoin::hashes::Hash;
use bitcoin::p2p::message::NetworkMessage;
use bitcoin::p2p::message_blockdata::{GetHeadersMessage, Inventory};
use bitcoin::p2p::message_filter::{GetCFCheckpt, GetCFHeaders, GetCFilters};
use bitcoin::p2p::message_network::VersionMessage;
use bitcoin::p2p::{address::Address, Magic, ServiceFlags};
use bitcoin::BlockHash;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::timeout;

use super::codec::{self, encode_message, CodecError};
use super::mock::{dataset, MockBackend};
use super::*;

const M: Magic = Magic::REGTEST;

fn test_config() -> P2pConfig {
    let mut c = P2pConfig {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        dns_seeds: false,
        ..Default::default()
    };
    c.timeouts.handshake = Duration::from_secs(2);
    c.timeouts.maintenance = Duration::from_millis(100);
    c
}

struct Node {
    backend: Arc<MockBackend>,
    handle: P2pHandle,
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), P2pError>>,
}

impl Node {
    async fn start(backend: MockBackend, config: P2pConfig) -> Node {
        let node = Self::start_with(backend, config).await;
        assert!(node.addr.port() != 0);
        node
    }

    /// Starts a node; `addr` is its listen address, or port 0 without one.
    async fn start_with(backend: MockBackend, config: P2pConfig) -> Node {
        let backend = Arc::new(backend);
        let listens = config.listen.is_some();
        let (stop, rx) = watch::channel(false);
        let (handle, task) = spawn(backend.clone(), config, rx);
        let addr = if listens {
            timeout(Duration::from_secs(5), handle.local_addr())
                .await
                .unwrap()
                .unwrap()
        } else {
            "127.0.0.1:0".parse().unwrap()
        };
        Node {
            backend,
            handle,
            addr,
            stop,
            task,
        }
    }

    async fn stop(self) {
        self.stop.send_replace(true);
        timeout(Duration::from_secs(10), self.task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}

/// A hand-driven peer speaking raw protocol through our codec.
struct TestPeer {
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
    version: Option<VersionMessage>,
}

impl TestPeer {
    async fn connect(addr: SocketAddr) -> TestPeer {
        let s = TcpStream::connect(addr).await.unwrap();
        let (rd, wr) = s.into_split();
        TestPeer {
            rd,
            wr,
            version: None,
        }
    }

    async fn handshake(addr: SocketAddr) -> TestPeer {
        Self::handshake_with(addr, false).await
    }

    /// Handshake announcing `relay` (BIP37 flag: wants transactions).
    async fn handshake_with(addr: SocketAddr, relay: bool) -> TestPeer {
        let mut p = Self::connect(addr).await;
        let me: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let v = VersionMessage {
            version: 70016,
            services: ServiceFlags::NETWORK | ServiceFlags::WITNESS,
            timestamp: 0,
            receiver: Address::new(&addr, ServiceFlags::NONE),
            sender: Address::new(&me, ServiceFlags::NONE),
            nonce: 42,
            user_agent: "/test/".into(),
            start_height: 0,
            relay,
        };
        p.send(NetworkMessage::Version(v)).await;
        p.send(NetworkMessage::WtxidRelay).await;
        p.send(NetworkMessage::SendAddrV2).await;
        p.send(NetworkMessage::Verack).await;
        let mut got_verack = false;
        while p.version.is_none() || !got_verack {
            match p.recv().await.unwrap() {
                NetworkMessage::Version(v) => p.version = Some(v),
                NetworkMessage::Verack => got_verack = true,
                _ => {}
            }
        }
        p
    }

    async fn send(&mut self, msg: NetworkMessage) {
        self.wr.write_all(&encode_message(M, msg)).await.unwrap();
    }

    async fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.wr.write_all(bytes).await
    }

    /// Next message, within 10 s.
    async fn recv(&mut self) -> Result<NetworkMessage, CodecError> {
        match timeout(
            Duration::from_secs(10),
            codec::read_message(&mut self.rd, M, Duration::from_secs(10)),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => panic!("no message within 10 s"),
        }
    }

    /// Receives until `f` returns Some, skipping other messages; the
    /// node's pings are answered on the way, as a real peer would.
    async fn recv_until<T>(&mut self, mut f: impl FnMut(NetworkMessage) -> Option<T>) -> T {
        loop {
            let m = self.recv().await.expect("connection still open");
            if let NetworkMessage::Ping(n) = m {
                self.send(NetworkMessage::Pong(n)).await;
                continue;
            }
            if let Some(t) = f(m) {
                return t;
            }
        }
    }

    /// Pings and waits for the matching pong; returns the round trip.
    async fn ping(&mut self, nonce: u64) -> Duration {
        let t = Instant::now();
        self.send(NetworkMessage::Ping(nonce)).await;
        self.recv_until(|m| matches!(m, NetworkMessage::Pong(n) if n == nonce).then_some(()))
            .await;
        t.elapsed()
    }

    /// Whether the remote closes the connection within `within`.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_b_syncs_headers_and_blocks_from_a() {
    let data = dataset();
    let a = Node::start(MockBackend::regtest_a(), test_config()).await;
    let mut cb = test_config();
    cb.listen = None;
    cb.connect = vec![a.addr];
    let backend_b = Arc::new(MockBackend::genesis_only());
    let (hb, control) = handle();
    let (stop_b, rx) = watch::channel(false);
    let started = Instant::now();
    let task_b = tokio::spawn(run(backend_b.clone(), cb, control, rx));
    let target = *data.best_chain.last().unwrap();
    let done = timeout(Duration::from_secs(90), async {
        while backend_b.tip().1 != target {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let elapsed = started.elapsed();
    assert!(done.is_ok(), "B reached only {:?} in 90 s", backend_b.tip());
    assert_eq!(backend_b.tip(), (1500, target));
    assert_eq!(backend_b.best_header_tip(), (1500, target));
    // Every best-chain block is byte-identical to the data set's.
    let by_hash: std::collections::HashMap<_, _> = data.blocks.iter().cloned().collect();
    for h in &data.best_chain[1..] {
        assert_eq!(
            backend_b.block_bytes(h).as_ref(),
            by_hash.get(h),
            "block {h}"
        );
    }
    eprintln!(
        "p2p sync of regtest-a: 1500 blocks in {:.2} s ({:.0} blocks/s), {} submitted",
        elapsed.as_secs_f64(),
        1500.0 / elapsed.as_secs_f64(),
        backend_b.submitted()
    );
    assert_eq!(hb.peer_count(), 1);
    assert!(!a.handle.peers()[0].user_agent.is_empty());
    stop_b.send_replace(true);
    timeout(Duration::from_secs(10), task_b)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    a.stop().await;
}

fn display_filter_headers() -> Vec<FilterHeader> {
    let data = dataset();
    data.best_chain.iter().map(|h| data.filters[h].1).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_filters_consistent_with_filters_json() {
    let data = dataset();
    let expected = display_filter_headers();
    let a = Node::start(MockBackend::regtest_a(), test_config()).await;
    let mut p = TestPeer::handshake(a.addr).await;
    let services = p.version.as_ref().unwrap().services;
    assert!(
        services.has(ServiceFlags::COMPACT_FILTERS | ServiceFlags::NETWORK | ServiceFlags::WITNESS)
    );
    assert_eq!(p.version.as_ref().unwrap().version, 70016);
    let tip = *data.best_chain.last().unwrap();

    // getcfcheckpt: one checkpoint (height 1000) below tip 1500.
    p.send(NetworkMessage::GetCFCheckpt(GetCFCheckpt {
        filter_type: 0,
        stop_hash: tip,
    }))
    .await;
    let cp = p
        .recv_until(|m| match m {
            NetworkMessage::CFCheckpt(c) => Some(c),
            _ => None,
        })
        .await;
    assert_eq!(cp.stop_hash, tip);
    assert_eq!(cp.filter_headers, vec![expected[1000]]);

    // getcfheaders 0..=1500 (1501 ≤ 2000): hashes chain to every header.
    p.send(NetworkMessage::GetCFHeaders(GetCFHeaders {
        filter_type: 0,
        start_height: 0,
        stop_hash: tip,
    }))
    .await;
    let ch = p
        .recv_until(|m| match m {
            NetworkMessage::CFHeaders(c) => Some(c),
            _ => None,
        })
        .await;
    assert_eq!(ch.previous_filter_header, FilterHeader::all_zeros());
    assert_eq!(ch.filter_hashes.len(), 1501);
    let mut prev = ch.previous_filter_header;
    for (height, fh) in ch.filter_hashes.iter().enumerate() {
        prev = fh.filter_header(&prev);
        assert_eq!(prev, expected[height], "filter header at height {height}");
    }

    // getcfilters 0..=999: the maximum of 1,000; filters hash to cfheaders.
    let stop = data.best_chain[999];
    p.send(NetworkMessage::GetCFilters(GetCFilters {
        filter_type: 0,
        start_height: 0,
        stop_hash: stop,
    }))
    .await;
    for height in 0..1000 {
        let f = p
            .recv_until(|m| match m {
                NetworkMessage::CFilter(f) => Some(f),
                _ => None,
            })
            .await;
        assert_eq!(f.block_hash, data.best_chain[height]);
        assert_eq!(
            FilterHash::hash(&f.filter),
            ch.filter_hashes[height],
            "filter at {height}"
        );
    }

    // getcfheaders starting mid-chain: previous header is the one below.
    p.send(NetworkMessage::GetCFHeaders(GetCFHeaders {
        filter_type: 0,
        start_height: 700,
        stop_hash: data.best_chain[900],
    }))
    .await;
    let mid = p
        .recv_until(|m| match m {
            NetworkMessage::CFHeaders(c) => Some(c),
            _ => None,
        })
        .await;
    assert_eq!(mid.previous_filter_header, expected[699]);
    assert_eq!(mid.filter_hashes.len(), 201);

    // Stale branch, by stop hash: the deepest reorg's stale tip.
    let (stale_hash, stale_height) = data.stale.iter().copied().max_by_key(|(_, h)| *h).unwrap();
    let start = stale_height - 20;
    p.send(NetworkMessage::GetCFHeaders(GetCFHeaders {
        filter_type: 0,
        start_height: start,
        stop_hash: stale_hash,
    }))
    .await;
    let st = p
        .recv_until(|m| match m {
            NetworkMessage::CFHeaders(c) => Some(c),
            _ => None,
        })
        .await;
    assert_eq!(st.stop_hash, stale_hash);
    let mut prev = st.previous_filter_header;
    for fh in &st.filter_hashes {
        prev = fh.filter_header(&prev);
    }
    assert_eq!(
        prev, data.filters[&stale_hash].1,
        "stale branch header chain"
    );
    assert_ne!(prev, expected[stale_height as usize]);
    p.send(NetworkMessage::GetCFilters(GetCFilters {
        filter_type: 0,
        start_height: stale_height,
        stop_hash: stale_hash,
    }))
    .await;
    let sf = p
        .recv_until(|m| match m {
            NetworkMessage::CFilter(f) => Some(f),
            _ => None,
        })
        .await;
    assert_eq!(sf.block_hash, stale_hash);
    assert_eq!(sf.filter, data.filters[&stale_hash].0);

    // An unknown stop hash (race at the tip) is ignored, not punished.
    let unknown = BlockHash::from_byte_array([7; 32]);
    p.send(NetworkMessage::GetCFHeaders(GetCFHeaders {
        filter_type: 0,
        start_height: 0,
        stop_hash: unknown,
    }))
    .await;
    p.send(NetworkMessage::GetCFilters(GetCFilters {
        filter_type: 0,
        start_height: 0,
        stop_hash: unknown,
    }))
    .await;
    p.send(NetworkMessage::GetCFCheckpt(GetCFCheckpt {
        filter_type: 0,
        stop_hash: unknown,
    }))
    .await;
    p.send(NetworkMessage::Ping(99)).await;
    let first = p
        .recv_until(|m| match m {
            NetworkMessage::Pong(n) => Some(Ok(n)),
            NetworkMessage::CFHeaders(_)
            | NetworkMessage::CFilter(_)
            | NetworkMessage::CFCheckpt(_) => Some(Err(())),
            _ => None,
        })
        .await;
    assert_eq!(
        first,
        Ok(99),
        "unknown stop hash must be ignored, the ping answered"
    );

    // Over the limit: 1,001 filters → disconnect (Core's p2p_blockfilters.py).
    let mut q = TestPeer::handshake(a.addr).await;
    q.send(NetworkMessage::GetCFilters(GetCFilters {
        filter_type: 0,
        start_height: 0,
        stop_hash: data.best_chain[1000],
    }))
    .await;
    assert!(
        q.closed_within(Duration::from_secs(3)).await,
        "1,001 filters must disconnect"
    );
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_filter_requests_disconnect_good_ones_are_served() {
    let data = dataset();
    // 127.0.0.1 becomes discouraged after the first case; with inbound
    // slots to spare it may still connect (Core's discouragement).
    let a = Node::start(MockBackend::regtest_a(), test_config()).await;
    let mut ok = TestPeer::handshake(a.addr).await;
    let cases: Vec<(&str, NetworkMessage)> = vec![
        (
            "cfilters 1,001 blocks",
            NetworkMessage::GetCFilters(GetCFilters {
                filter_type: 0,
                start_height: 500,
                stop_hash: data.best_chain[1500],
            }),
        ),
        (
            "cfheaders type 1",
            NetworkMessage::GetCFHeaders(GetCFHeaders {
                filter_type: 1,
                start_height: 0,
                stop_hash: data.best_chain[10],
            }),
        ),
        (
            "cfcheckpt type 1",
            NetworkMessage::GetCFCheckpt(GetCFCheckpt {
                filter_type: 1,
                stop_hash: data.best_chain[10],
            }),
        ),
        (
            "cfilters start above stop",
            NetworkMessage::GetCFilters(GetCFilters {
                filter_type: 0,
                start_height: 11,
                stop_hash: data.best_chain[10],
            }),
        ),
        (
            "cfheaders start above stop",
            NetworkMessage::GetCFHeaders(GetCFHeaders {
                filter_type: 0,
                start_height: 11,
                stop_hash: data.best_chain[10],
            }),
        ),
    ];
    for (name, bad) in cases {
        let mut p = TestPeer::handshake(a.addr).await;
        p.send(bad).await;
        assert!(
            p.closed_within(Duration::from_secs(3)).await,
            "{name} must disconnect"
        );
        assert!(ok.ping(5).await < Duration::from_secs(2), "{name}");
    }
    // The largest legal requests are served: 1,000 filters, 1,501 headers.
    ok.send(NetworkMessage::GetCFilters(GetCFilters {
        filter_type: 0,
        start_height: 501,
        stop_hash: data.best_chain[1500],
    }))
    .await;
    for height in 501..=1500 {
        let f = ok
            .recv_until(|m| match m {
                NetworkMessage::CFilter(f) => Some(f),
                _ => None,
            })
            .await;
        assert_eq!(f.block_hash, data.best_chain[height]);
    }
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_headers_and_blocks() {
    let data = dataset();
    let a = Node::start(MockBackend::regtest_a(), test_config()).await;
    let mut p = TestPeer::handshake(a.addr).await;
    let genesis = data.best_chain[0];
    p.send(NetworkMessage::GetHeaders(GetHeadersMessage::new(
        vec![genesis],
        BlockHash::all_zeros(),
    )))
    .await;
    let hs: Vec<Header> = p
        .recv_until(|m| match m {
            NetworkMessage::Headers(h) => Some(h),
            _ => None,
        })
        .await;
    assert_eq!(hs.len(), 1500);
    for (i, h) in hs.iter().enumerate() {
        assert_eq!(h.block_hash(), data.best_chain[i + 1]);
    }
    // Stop hash limits the answer.
    p.send(NetworkMessage::GetHeaders(GetHeadersMessage::new(
        vec![data.best_chain[100]],
        data.best_chain[110],
    )))
    .await;
    let hs: Vec<Header> = p
        .recv_until(|m| match m {
            NetworkMessage::Headers(h) => Some(h),
            _ => None,
        })
        .await;
    assert_eq!(hs.len(), 10);
    assert_eq!(hs[9].block_hash(), data.best_chain[110]);

    // Witness block by getdata: byte-identical to blocks.dat; a stale block
    // too; an unknown one gives notfound.
    let by_hash: std::collections::HashMap<_, _> = data.blocks.iter().cloned().collect();
    let (stale, _) = data.stale[0];
    let unknown = BlockHash::from_byte_array([9; 32]);
    p.send(NetworkMessage::GetData(vec![
        Inventory::WitnessBlock(data.best_chain[1200]),
        Inventory::WitnessBlock(stale),
        Inventory::WitnessBlock(unknown),
    ]))
    .await;
    for want in [data.best_chain[1200], stale] {
        let b = p
            .recv_until(|m| match m {
                NetworkMessage::Block(b) => Some(b),
                _ => None,
            })
            .await;
        assert_eq!(b.block_hash(), want);
        assert_eq!(&bitcoin::consensus::serialize(&b), &by_hash[&want]);
    }
    let nf = p
        .recv_until(|m| match m {
            NetworkMessage::NotFound(n) => Some(n),
            _ => None,
        })
        .await;
    assert_eq!(nf, vec![Inventory::WitnessBlock(unknown)]);
    // Non-witness request: witnesses stripped, same txids and merkle root.
    let h = data.best_chain[1300];
    p.send(NetworkMessage::GetData(vec![Inventory::Block(h)]))
        .await;
    let b = p
        .recv_until(|m| match m {
            NetworkMessage::Block(b) => Some(b),
            _ => None,
        })
        .await;
    assert_eq!(b.block_hash(), h);
    assert!(b
        .txdata
        .iter()
        .all(|t| t.input.iter().all(|i| i.witness.is_empty())));
    assert!(b.check_merkle_root());
    a.stop().await;
}

/// A node with two inbound slots (so that a discouraged address may not
/// take the last one) and a well-behaved peer; a second peer (handshaken
/// first or not) sends `bytes` and must be disconnected within 2 s.
/// Returns the node and the well-behaved peer.
async fn sender_disconnected(
    name: &str,
    bytes: Vec<u8>,
    handshake_first: bool,
) -> (Node, TestPeer) {
    let mut config = test_config();
    config.max_inbound = 2;
    let a = Node::start(MockBackend::genesis_only(), config).await;
    let good = TestPeer::handshake(a.addr).await;
    let mut bad = if handshake_first {
        TestPeer::handshake(a.addr).await
    } else {
        TestPeer::connect(a.addr).await
    };
    let _ = bad.send_raw(&bytes).await;
    assert!(
        bad.closed_within(Duration::from_secs(2)).await,
        "{name}: sender not disconnected"
    );
    (a, good)
}

/// One malformed message: the sender is disconnected and discouraged, a
/// second peer's pings are answered within 2 s throughout.
async fn malformed_case(name: &str, bytes: Vec<u8>, handshake_first: bool) {
    let (a, mut good) = sender_disconnected(name, bytes, handshake_first).await;
    let rtt = good.ping(1).await;
    assert!(rtt < Duration::from_secs(2), "{name}: ping took {rtt:?}");
    // Discouraged: a new connection from the same IP may not take the
    // last inbound slot, so it is dropped at once.
    let mut again = TestPeer::connect(a.addr).await;
    assert!(
        again.closed_within(Duration::from_secs(2)).await,
        "{name}: banned IP accepted"
    );
    assert!(good.ping(2).await < Duration::from_secs(2));
    assert_eq!(a.handle.peer_count(), 1, "{name}");
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_traffic_disconnects_sender_only() {
    // Over-limit counts: disconnected and discouraged, as Core's
    // `Misbehaving` ("headers message size", "inv message size").
    let genesis = bitcoin::constants::genesis_block(bitcoin::Network::Regtest).header;
    let headers = encode_message(M, NetworkMessage::Headers(vec![genesis; 2001]));
    malformed_case("2001 headers", headers, true).await;

    let inv = vec![Inventory::Block(BlockHash::all_zeros()); 50_001];
    malformed_case(
        "50001 inv",
        encode_message(M, NetworkMessage::Inv(inv.clone())),
        true,
    )
    .await;
    malformed_case(
        "50001 getdata",
        encode_message(M, NetworkMessage::GetData(inv)),
        true,
    )
    .await;
    // Core's "addr message size" / "addrv2 message size" (MAX_ADDR_TO_SEND).
    let peer: SocketAddr = "10.0.0.1:18444".parse().expect("addr");
    let addr = vec![(1_700_000_000, Address::new(&peer, ServiceFlags::NETWORK)); 1_001];
    malformed_case(
        "1001 addr",
        encode_message(M, NetworkMessage::Addr(addr)),
        true,
    )
    .await;
    let v2 = bitcoin::p2p::address::AddrV2Message {
        time: 1_700_000_000,
        services: ServiceFlags::NETWORK,
        addr: bitcoin::p2p::address::AddrV2::Ipv4("10.0.0.1".parse().expect("ip")),
        port: 18444,
    };
    malformed_case(
        "1001 addrv2",
        encode_message(M, NetworkMessage::AddrV2(vec![v2; 1_001])),
        true,
    )
    .await;

    // Framing errors and undecodable payloads: disconnected, not
    // discouraged (Core never penalises them). Mid-stream bad magic (the
    // first bytes of a connection: `not_v1_first_bytes`).
    let mut bad_magic = encode_message(M, NetworkMessage::Ping(1));
    bad_magic[..4].copy_from_slice(&Magic::BITCOIN.to_bytes());
    refused_case("bad magic", bad_magic, true).await;

    let mut bad_checksum = encode_message(M, NetworkMessage::Ping(1));
    bad_checksum[20] ^= 0xff;
    refused_case("bad checksum", bad_checksum, true).await;

    // Header announcing 4,000,001 bytes; no payload follows.
    let mut oversized = codec::encode_raw(M, "block", &[]);
    oversized[16..20].copy_from_slice(&4_000_001u32.to_le_bytes());
    refused_case("oversized payload", oversized, true).await;

    // A 4-byte ping (undersized payload).
    refused_case(
        "4-byte ping",
        codec::encode_raw(M, "ping", &[1, 2, 3, 4]),
        true,
    )
    .await;

    // 80 junk messages of 4,000,000 bytes each (bad checksum): the first
    // one ends the connection.
    let mut junk = Vec::with_capacity(80 * 4_000_024);
    for i in 0..80u8 {
        let mut one = codec::encode_raw(M, "block", &vec![i; 4_000_000]);
        one[20] ^= 0xff;
        junk.extend_from_slice(&one);
    }
    refused_case("80 junk 4 MB messages", junk, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redundant_version_is_ignored() {
    let a = Node::start(MockBackend::genesis_only(), test_config()).await;
    let mut p = TestPeer::handshake(a.addr).await;
    p.send(version_with_agent(a.addr, "/again/".into())).await;
    assert!(p.ping(7).await < Duration::from_secs(2));
    a.stop().await;
}

/// One message Core answers by a disconnect without discouragement (or
/// first bytes that are not a v1 message): the sender is disconnected, and
/// a new connection from its IP may still take the last inbound slot.
async fn refused_case(name: &str, bytes: Vec<u8>, handshake_first: bool) {
    let (a, mut good) = sender_disconnected(name, bytes, handshake_first).await;
    assert!(good.ping(1).await < Duration::from_secs(2), "{name}");
    // Not discouraged: the same IP takes the last inbound slot.
    let mut again = TestPeer::handshake(a.addr).await;
    assert!(again.ping(2).await < Duration::from_secs(2), "{name}");
    assert_eq!(a.handle.peer_count(), 2, "{name}");
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_v1_first_bytes_close_without_discouragement() {
    // A BIP324 v2 initiator's first 64 bytes (an ElligatorSwift key: to us,
    // random bytes).
    let mut v2 = [0u8; 64];
    getrandom::getrandom(&mut v2).unwrap();
    if v2[..4] == M.to_bytes() {
        v2[0] ^= 1;
    }
    refused_case("v2 handshake bytes", v2.to_vec(), false).await;
    let mut other_net = encode_message(M, NetworkMessage::Ping(1));
    other_net[..4].copy_from_slice(&Magic::BITCOIN.to_bytes());
    refused_case("mainnet magic first", other_net, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_refusals_disconnect_without_discouragement() {
    let cases = [
        ("mempool", NetworkMessage::MemPool),
        ("filterclear", NetworkMessage::FilterClear),
        ("wtxidrelay after verack", NetworkMessage::WtxidRelay),
        ("sendaddrv2 after verack", NetworkMessage::SendAddrV2),
    ];
    for (name, msg) in cases {
        refused_case(name, encode_message(M, msg), true).await;
    }
}

/// Transactions and their `inv`, though our `version` said relay = false:
/// ignored, the peer kept (light clients broadcast to any peer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsolicited_transactions_are_ignored_not_punished() {
    let a = Node::start(MockBackend::genesis_only(), test_config()).await;
    let mut p = TestPeer::handshake(a.addr).await;
    let tx = bitcoin::constants::genesis_block(bitcoin::Network::Regtest).txdata[0].clone();
    let wtxid = tx.compute_wtxid();
    p.send(NetworkMessage::Inv(vec![Inventory::WTx(wtxid)]))
        .await;
    p.send(NetworkMessage::Tx(tx)).await;
    p.send(NetworkMessage::Ping(5)).await;
    let first = p
        .recv_until(|m| match m {
            NetworkMessage::GetData(_) => Some(false),
            NetworkMessage::Pong(5) => Some(true),
            _ => None,
        })
        .await;
    assert!(first, "the tx inv was fetched");
    assert_eq!(a.handle.peer_count(), 1);
    a.stop().await;
}

fn version_with_agent(addr: SocketAddr, user_agent: String) -> NetworkMessage {
    let me: SocketAddr = "127.0.0.1:1".parse().unwrap();
    NetworkMessage::Version(VersionMessage {
        version: 70016,
        services: ServiceFlags::NETWORK | ServiceFlags::WITNESS,
        timestamp: 0,
        receiver: Address::new(&addr, ServiceFlags::NONE),
        sender: Address::new(&me, ServiceFlags::NONE),
        nonce: 43,
        user_agent,
        start_height: 0,
        relay: false,
    })
}

/// Core reads the user agent with `LIMITED_STRING(.., MAX_SUBVERSION_LENGTH)`
/// (256 bytes): longer is refused, not truncated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_long_user_agent_disconnects() {
    // Exactly 256 bytes (multi-byte characters count in bytes): accepted.
    let a = Node::start(MockBackend::genesis_only(), test_config()).await;
    let agent = "é".repeat(MAX_SUBVERSION_LENGTH / 2);
    assert_eq!(agent.len(), MAX_SUBVERSION_LENGTH);
    let mut p = TestPeer::connect(a.addr).await;
    p.send(version_with_agent(a.addr, agent.clone())).await;
    p.send(NetworkMessage::Verack).await;
    p.recv_until(|m| matches!(m, NetworkMessage::Verack).then_some(()))
        .await;
    assert!(p.ping(5).await < Duration::from_secs(2));
    assert_eq!(a.handle.peers()[0].user_agent, agent);
    a.stop().await;

    let addr: SocketAddr = "127.0.0.1:8333".parse().unwrap();
    // 129 two-byte characters: 258 bytes but 129 chars.
    let v = version_with_agent(addr, "é".repeat(MAX_SUBVERSION_LENGTH / 2 + 1));
    malformed_case("258-byte user agent", encode_message(M, v), false).await;
    // Just under the 4,000,000-byte payload cap.
    let v = version_with_agent(addr, "x".repeat(3_999_000));
    malformed_case("3,999,000-byte user agent", encode_message(M, v), false).await;
}

/// Unconnecting `headers` count also while our `getheaders` to that peer is
/// unanswered: 11 in a row disconnect (Core's
/// `MAX_NUM_UNCONNECTING_HEADERS_MSGS` = 10), and a connecting message
/// resets the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unconnecting_headers_count_while_getheaders_unanswered() {
    let data = dataset();
    let by_hash: std::collections::HashMap<_, _> = data.blocks.iter().cloned().collect();
    let header = |height: usize| -> Header {
        bitcoin::consensus::deserialize(&by_hash[&data.best_chain[height]][..80]).unwrap()
    };
    let a = Node::start(MockBackend::genesis_only(), test_config()).await;
    let mut p = TestPeer::connect(a.addr).await;
    // A full node claiming a higher chain: A starts header sync with it.
    let mut v = version_with_agent(a.addr, "/test/".into());
    if let NetworkMessage::Version(v) = &mut v {
        v.start_height = 100;
    }
    p.send(v).await;
    p.send(NetworkMessage::Verack).await;
    p.recv_until(|m| matches!(m, NetworkMessage::GetHeaders(_)).then_some(()))
        .await;
    // Our getheaders is unanswered; 10 unconnecting messages are tolerated.
    for h in 50..60 {
        p.send(NetworkMessage::Headers(vec![header(h)])).await;
    }
    assert!(p.ping(6).await < Duration::from_secs(2));
    // A connecting answer resets the count: 10 more are tolerated.
    p.send(NetworkMessage::Headers((1..=5).map(header).collect()))
        .await;
    for h in 60..70 {
        p.send(NetworkMessage::Headers(vec![header(h)])).await;
    }
    assert!(p.ping(7).await < Duration::from_secs(2));
    assert_eq!(a.handle.peer_count(), 1);
    // The 11th in a row disconnects.
    p.send(NetworkMessage::Headers(vec![header(70)])).await;
    assert!(
        p.closed_within(Duration::from_secs(2)).await,
        "11 unconnecting headers messages tolerated"
    );
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_peer_hits_handshake_timeout_and_unknown_commands_are_ignored() {
    let a = Node::start(MockBackend::genesis_only(), test_config()).await;
    let mut silent = TestPeer::connect(a.addr).await;
    let mut p = TestPeer::handshake(a.addr).await;
    p.send_raw(&codec::encode_raw(M, "kakehi-zz", &[1, 2, 3]))
        .await
        .unwrap();
    assert!(p.ping(3).await < Duration::from_secs(2));
    let t = Instant::now();
    assert!(silent.closed_within(Duration::from_secs(5)).await);
    assert!(
        t.elapsed() >= Duration::from_millis(1500),
        "closed before the 2 s handshake timeout"
    );
    // Not discouraged: a handshake timeout is not misbehaviour.
    let mut again = TestPeer::handshake(a.addr).await;
    assert!(again.ping(4).await < Duration::from_secs(2));
    a.stop().await;
}

async fn wait_for_tip(b: &MockBackend, want: (u32, BlockHash), within: Duration) {
    let res = timeout(within, async {
        while b.tip() != want {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(res.is_ok(), "tip {:?}, wanted {want:?}", b.tip());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b_follows_announced_tips_through_every_reorg() {
    let data = dataset();
    let backend_a = Arc::new(MockBackend::regtest_a_prefix(200));
    let (ha, control) = handle();
    let (stop_a, rx) = watch::channel(false);
    let task_a = tokio::spawn(run(backend_a.clone(), test_config(), control, rx));
    let addr_a = timeout(Duration::from_secs(5), ha.local_addr())
        .await
        .unwrap()
        .unwrap();
    let mut cb = test_config();
    cb.listen = None;
    cb.connect = vec![addr_a];
    let b = Node::start_with(MockBackend::genesis_only(), cb).await;
    wait_for_tip(&b.backend, backend_a.tip(), Duration::from_secs(20)).await;
    // Then the rest of blocks.dat in file order: one block at a time around
    // the first reorgs (headers announcements), in chunks of 37 after that
    // (inv announcements, more than 8 blocks). Each of the 7 reorgs of the
    // data set replays on A, and B must follow through announcements only.
    let mut pos = 200;
    while pos < data.blocks.len() {
        let step = if pos < 440 { 1 } else { 37 };
        let end = (pos + step).min(data.blocks.len());
        backend_a.load_blocks(pos..end);
        ha.announce_tip();
        wait_for_tip(&b.backend, backend_a.tip(), Duration::from_secs(10)).await;
        pos = end;
    }
    assert_eq!(b.backend.tip(), (1500, *data.best_chain.last().unwrap()));
    // One connection throughout: no announcement was punished.
    assert_eq!(
        b.handle.peers().iter().map(|p| p.id).collect::<Vec<_>>(),
        vec![1]
    );
    assert_eq!(ha.peers().iter().map(|p| p.id).collect::<Vec<_>>(), vec![1]);
    b.stop().await;
    stop_a.send_replace(true);
    timeout(Duration::from_secs(10), task_a)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_reader_is_dropped_others_still_served() {
    let data = dataset();
    let mut config = test_config();
    config.timeouts.write = Duration::from_secs(1);
    let a = Node::start(MockBackend::regtest_a(), config).await;
    let mut good = TestPeer::handshake(a.addr).await;
    let mut slow = TestPeer::handshake(a.addr).await;
    // 1,500 blocks (17 MB) requested, never read.
    let inv = data.best_chain[1..]
        .iter()
        .map(|h| Inventory::WitnessBlock(*h))
        .collect();
    slow.send(NetworkMessage::GetData(inv)).await;
    let t = Instant::now();
    while a.handle.peer_count() > 1 {
        assert!(good.ping(7).await < Duration::from_secs(2));
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "slow reader never dropped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(good.ping(8).await < Duration::from_secs(2));
    a.stop().await;
}

/// A peer that serves headers but never blocks: B must detect the stall,
/// drop it and finish from A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalling_peer_is_replaced() {
    let data = dataset();
    let fake_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fake_addr = fake_listener.local_addr().unwrap();
    // Reserve a port for A, started later so the fake gets the first blocks.
    let addr_a = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let headers: Vec<Header> = {
        let by_hash: std::collections::HashMap<_, _> = data.blocks.iter().cloned().collect();
        data.best_chain[1..]
            .iter()
            .map(|h| bitcoin::consensus::deserialize::<Header>(&by_hash[h][..80]).unwrap())
            .collect()
    };
    let fake = tokio::spawn(async move {
        let (s, _) = fake_listener.accept().await.unwrap();
        drop(fake_listener);
        let (rd, wr) = s.into_split();
        let mut p = TestPeer {
            rd,
            wr,
            version: None,
        };
        let v = VersionMessage {
            version: 70016,
            services: ServiceFlags::NETWORK | ServiceFlags::WITNESS,
            timestamp: 0,
            receiver: Address::new(&fake_addr, ServiceFlags::NONE),
            sender: Address::new(&fake_addr, ServiceFlags::NONE),
            nonce: 7,
            user_agent: "/staller/".into(),
            start_height: 1500,
            relay: false,
        };
        p.send(NetworkMessage::Version(v)).await;
        p.send(NetworkMessage::Verack).await;
        let mut getdata = 0usize;
        loop {
            let m = match timeout(
                Duration::from_secs(30),
                codec::read_message(&mut p.rd, M, Duration::from_secs(5)),
            )
            .await
            {
                Ok(Ok(m)) => m,
                _ => return getdata,
            };
            match m {
                NetworkMessage::GetHeaders(_) => {
                    let _ = p
                        .wr
                        .write_all(&encode_message(M, NetworkMessage::Headers(headers.clone())))
                        .await;
                }
                NetworkMessage::Ping(n) => {
                    let _ =
                        p.wr.write_all(&encode_message(M, NetworkMessage::Pong(n)))
                            .await;
                }
                NetworkMessage::GetData(inv) => getdata += inv.len(),
                _ => {}
            }
        }
    });
    let mut cb = test_config();
    cb.listen = None;
    cb.connect = vec![fake_addr, addr_a];
    cb.timeouts.stall_base = Duration::from_secs(1);
    let b = Node::start_with(MockBackend::genesis_only(), cb).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut ca = test_config();
    ca.listen = Some(addr_a);
    let a = Node::start(MockBackend::regtest_a(), ca).await;
    let t = Instant::now();
    wait_for_tip(
        &b.backend,
        (1500, *data.best_chain.last().unwrap()),
        Duration::from_secs(40),
    )
    .await;
    let requested_from_fake = timeout(Duration::from_secs(5), fake)
        .await
        .expect("fake peer was not disconnected")
        .unwrap();
    assert!(
        requested_from_fake > 0,
        "the fake peer was never asked for blocks"
    );
    eprintln!("stall recovered: {requested_from_fake} blocks re-requested, synced {:.1} s after A came up", t.elapsed().as_secs_f64());
    b.stop().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addr_gossip_is_persisted_and_served_and_book_is_dialed() {
    use bitcoin::p2p::address::{AddrV2, AddrV2Message};
    let dir = tempfile::tempdir().unwrap();
    let book = dir.path().join("peers.json");
    // A (regtest-a) listens; C learns A's address by gossip from a test
    // peer, persists it, and after a restart dials it from the book alone.
    let a = Node::start(MockBackend::regtest_a(), test_config()).await;
    let mut cc = test_config();
    cc.addr_file = Some(book.clone());
    let c = Node::start(MockBackend::genesis_only(), cc.clone()).await;
    let mut p = TestPeer::handshake(c.addr).await;
    let std::net::IpAddr::V4(ip) = a.addr.ip() else {
        panic!("v4 loopback")
    };
    let gossip = vec![AddrV2Message {
        time: 1_700_000_000,
        services: ServiceFlags::NETWORK | ServiceFlags::WITNESS,
        addr: AddrV2::Ipv4(ip),
        port: a.addr.port(),
    }];
    p.send(NetworkMessage::AddrV2(gossip)).await;
    p.send(NetworkMessage::GetAddr).await;
    let back = p
        .recv_until(|m| match m {
            NetworkMessage::AddrV2(v) => Some(v),
            _ => None,
        })
        .await;
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].socket_addr().unwrap(), a.addr);
    drop(p);
    c.stop().await;
    let saved = std::fs::read_to_string(&book).unwrap();
    assert!(saved.contains(&a.addr.to_string()), "{saved}");
    // Restart C: no connect, no addnode, no DNS: it dials A from the book.
    let c = Node::start(MockBackend::genesis_only(), cc).await;
    wait_for_tip(&c.backend, a.backend.tip(), Duration::from_secs(20)).await;
    c.stop().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayed_transaction_is_announced_by_wtxid_and_served() {
    let data = dataset();
    let a = Node::start(MockBackend::genesis_only(), test_config()).await;
    let mut quiet = TestPeer::handshake_with(a.addr, false).await;
    let mut p = TestPeer::handshake_with(a.addr, true).await;
    // A real segwit transaction from regtest-a (block 1200, second tx).
    let block: bitcoin::Block = bitcoin::consensus::deserialize(
        &data
            .blocks
            .iter()
            .find(|(h, _)| *h == data.best_chain[1200])
            .unwrap()
            .1,
    )
    .unwrap();
    let tx = block.txdata[1].clone();
    // A pong proves the node finished both handshakes (commands that arrive
    // during a handshake are dropped).
    p.ping(1).await;
    quiet.ping(1).await;
    a.handle.relay_transaction(tx.clone()).unwrap();
    let inv = p
        .recv_until(|m| match m {
            NetworkMessage::Inv(i) => Some(i),
            _ => None,
        })
        .await;
    assert_eq!(inv, vec![Inventory::WTx(tx.compute_wtxid())]);
    p.send(NetworkMessage::GetData(inv)).await;
    let got = p
        .recv_until(|m| match m {
            NetworkMessage::Tx(t) => Some(t),
            _ => None,
        })
        .await;
    assert_eq!(got, tx);
    // The peer that asked for no relay got no inv before its pong.
    quiet.send(NetworkMessage::Ping(11)).await;
    let first = quiet
        .recv_until(|m| match m {
            NetworkMessage::Inv(_) => Some(false),
            NetworkMessage::Pong(11) => Some(true),
            _ => None,
        })
        .await;
    assert!(first);
    a.stop().await;
}

/// Filter-serving throughput on loopback (issue 4's benchmark). Run with
/// `cargo test --lib p2p::tests::bench_getcfilters -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run explicitly"]
async fn bench_getcfilters_throughput() {
    let data = dataset();
    let a = Node::start(MockBackend::regtest_a(), test_config()).await;
    let mut p = TestPeer::handshake(a.addr).await;
    let batches = 50;
    let t = Instant::now();
    let mut bytes = 0usize;
    for i in 0..batches {
        let start = (i % 2) * 500 + 1;
        let stop = data.best_chain[start + 999];
        p.send(NetworkMessage::GetCFilters(GetCFilters {
            filter_type: 0,
            start_height: start as u32,
            stop_hash: stop,
        }))
        .await;
        for _ in 0..1000 {
            let f = p
                .recv_until(|m| match m {
                    NetworkMessage::CFilter(f) => Some(f),
                    _ => None,
                })
                .await;
            bytes += f.filter.len() + 24 + 1 + 32 + 3;
        }
    }
    let s = t.elapsed().as_secs_f64();
    eprintln!(
        "getcfilters: {batches} batches of 1,000 in {s:.2} s = {:.1} batches/s, {:.1} MB/s",
        batches as f64 / s,
        bytes as f64 / s / 1e6
    );
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_tip_announced_by_headers_or_inv() {
    let data = dataset();
    let backend = Arc::new(MockBackend::regtest_a_prefix(100));
    let (h, control) = handle();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(run(backend.clone(), test_config(), control, rx));
    let addr = timeout(Duration::from_secs(5), h.local_addr())
        .await
        .unwrap()
        .unwrap();
    let mut with_headers = TestPeer::handshake(addr).await;
    with_headers.send(NetworkMessage::SendHeaders).await;
    // Tell A which block the peer has (its getheaders answer), so the next
    // announcement can connect to it.
    with_headers
        .send(NetworkMessage::GetHeaders(GetHeadersMessage::new(
            vec![data.best_chain[0]],
            BlockHash::all_zeros(),
        )))
        .await;
    let first = with_headers
        .recv_until(|m| match m {
            NetworkMessage::Headers(h) => Some(h),
            _ => None,
        })
        .await;
    assert_eq!(first.len(), 100);
    let mut with_inv = TestPeer::handshake(addr).await;
    assert!(with_inv.ping(1).await < Duration::from_secs(2));
    backend.load_blocks(100..101);
    h.announce_tip();
    let new_tip = data.best_chain[101];
    let hs = with_headers
        .recv_until(|m| match m {
            NetworkMessage::Headers(h) => Some(h),
            _ => None,
        })
        .await;
    assert_eq!(
        hs.iter().map(|x| x.block_hash()).collect::<Vec<_>>(),
        vec![new_tip]
    );
    let inv = with_inv
        .recv_until(|m| match m {
            NetworkMessage::Inv(i) => Some(i),
            _ => None,
        })
        .await;
    assert_eq!(inv, vec![Inventory::Block(new_tip)]);
    stop.send_replace(true);
    timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_service_bit_only_when_index_synced() {
    let b = Node::start(MockBackend::genesis_only(), test_config()).await;
    let mut p = TestPeer::handshake(b.addr).await;
    let services = p.version.as_ref().unwrap().services;
    assert!(services.has(ServiceFlags::NETWORK | ServiceFlags::WITNESS));
    assert!(!services.has(ServiceFlags::COMPACT_FILTERS));
    // Filter requests are then ignored (not answered, not punished).
    let genesis = dataset().best_chain[0];
    p.send(NetworkMessage::GetCFCheckpt(GetCFCheckpt {
        filter_type: 0,
        stop_hash: genesis,
    }))
    .await;
    p.send(NetworkMessage::Ping(3)).await;
    let first = p
        .recv_until(|m| match m {
            NetworkMessage::CFCheckpt(_) => Some(false),
            NetworkMessage::Pong(3) => Some(true),
            _ => None,
        })
        .await;
    assert!(first);
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syncs_from_two_peers_one_lagging_and_keeps_both() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("kakehi=debug")
        .with_test_writer()
        .try_init();
    let data = dataset();
    let full = Node::start(MockBackend::regtest_a(), test_config()).await;
    let lagging = Node::start(MockBackend::regtest_a_prefix(700), test_config()).await;
    let mut cb = test_config();
    cb.listen = None;
    cb.connect = vec![lagging.addr, full.addr];
    let b = Node::start_with(MockBackend::genesis_only(), cb).await;
    wait_for_tip(
        &b.backend,
        (1500, *data.best_chain.last().unwrap()),
        Duration::from_secs(30),
    )
    .await;
    // No connection was dropped and remade on either side: the lagging
    // peer was never asked for blocks above its height, and B's tip
    // announcements to it (while it was behind) never failed to connect.
    let ids = |h: &P2pHandle| h.peers().iter().map(|p| p.id).collect::<Vec<_>>();
    assert_eq!(ids(&b.handle), vec![1, 2]);
    assert_eq!(ids(&full.handle), vec![1]);
    assert_eq!(ids(&lagging.handle), vec![1]);
    b.stop().await;
    full.stop().await;
    lagging.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsolicited_blocks_only_when_extending() {
    let data = dataset();
    let by_hash: std::collections::HashMap<_, _> = data.blocks.iter().cloned().collect();
    let block =
        |h: &BlockHash| -> bitcoin::Block { bitcoin::consensus::deserialize(&by_hash[h]).unwrap() };
    let a = Node::start(MockBackend::regtest_a_prefix(100), test_config()).await;
    let mut p = TestPeer::handshake(a.addr).await;
    // The next block (height 101), pushed unrequested: accepted, new tip.
    p.send(NetworkMessage::Block(block(&data.best_chain[101])))
        .await;
    wait_for_tip(
        &a.backend,
        (101, data.best_chain[101]),
        Duration::from_secs(5),
    )
    .await;
    // A block that does not link (height 103, parent unknown): ignored,
    // not punished.
    p.send(NetworkMessage::Block(block(&data.best_chain[103])))
        .await;
    assert!(p.ping(2).await < Duration::from_secs(2));
    assert_eq!(a.backend.tip().0, 101);
    assert_eq!(a.backend.block_height(&data.best_chain[103]), None);
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_seed_fills_the_book_and_is_dialed() {
    let a = Node::start(MockBackend::regtest_a_prefix(300), test_config()).await;
    // "localhost" as the only DNS seed, on A's port: resolved with
    // tokio::net::lookup_host like a real seed, then dialed from the book.
    let mut cc = test_config();
    cc.listen = None;
    cc.dns_seeds = true;
    let c = Node::start_with(
        MockBackend::genesis_only().with_dns_seeds(&["localhost"], a.addr.port()),
        cc,
    )
    .await;
    wait_for_tip(&c.backend, a.backend.tip(), Duration::from_secs(20)).await;
    c.stop().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_inbound_slots_evict_an_unprotected_peer() {
    let mut config = test_config();
    config.max_inbound = 20;
    config.per_ip_limit = 30;
    let a = Node::start(MockBackend::genesis_only(), config).await;
    let mut peers = Vec::new();
    for _ in 0..20 {
        peers.push(TestPeer::handshake(a.addr).await);
    }
    // The 8 youngest answer the node's ping (sent after the handshake), so
    // they are protected by lowest ping; the others never answer it.
    for (i, p) in peers.iter_mut().enumerate().skip(12) {
        p.ping(i as u64).await;
    }
    // Let the node record the pongs.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(a.handle.peer_count(), 20);
    // A 21st peer: peers 12..20 protected by ping, the older half of peers
    // 0..12 by uptime; the youngest of the rest (peer 11) is evicted.
    let mut newcomer = TestPeer::handshake(a.addr).await;
    assert!(
        peers[11].closed_within(Duration::from_secs(2)).await,
        "peer 11 not evicted"
    );
    assert!(newcomer.ping(100).await < Duration::from_secs(2));
    for (i, p) in peers.iter_mut().enumerate() {
        if i != 11 {
            assert!(
                p.ping(200 + i as u64).await < Duration::from_secs(2),
                "peer {i} dropped"
            );
        }
    }
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn getaddr_answered_once_with_addr_gossip() {
    let a = Node::start(MockBackend::genesis_only(), test_config()).await;
    let mut p = TestPeer::handshake(a.addr).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as u32;
    let list: Vec<(u32, Address)> = (1..=5u8)
        .map(|i| {
            let sa: SocketAddr = format!("11.22.33.{i}:18444").parse().unwrap();
            (
                now,
                Address::new(&sa, ServiceFlags::NETWORK | ServiceFlags::WITNESS),
            )
        })
        .collect();
    p.send(NetworkMessage::Addr(list)).await;
    p.ping(1).await;
    p.send(NetworkMessage::GetAddr).await;
    // The test peer sent sendaddrv2: the answer is an addrv2.
    let back = p
        .recv_until(|m| match m {
            NetworkMessage::AddrV2(v) => Some(v),
            _ => None,
        })
        .await;
    assert_eq!(back.len(), 5, "{back:?}");
    p.send(NetworkMessage::GetAddr).await;
    p.send(NetworkMessage::Ping(77)).await;
    let second = p
        .recv_until(|m| match m {
            NetworkMessage::Addr(_) | NetworkMessage::AddrV2(_) => Some(false),
            NetworkMessage::Pong(77) => Some(true),
            _ => None,
        })
        .await;
    assert!(second, "a second getaddr was answered");
    a.stop().await;
}

/// `getheaders` with an empty locator: the stop block's header alone (a
/// stale validated block too), nothing for an unknown one (Core).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn getheaders_with_empty_locator_answers_the_stop_header() {
    let data = dataset();
    let a = Node::start(MockBackend::regtest_a(), test_config()).await;
    let mut p = TestPeer::handshake(a.addr).await;
    let (stale, _) = data.stale[0];
    for want in [data.best_chain[700], stale] {
        p.send(NetworkMessage::GetHeaders(GetHeadersMessage::new(
            vec![],
            want,
        )))
        .await;
        let got = p
            .recv_until(|m| match m {
                NetworkMessage::Headers(h) => Some(h),
                _ => None,
            })
            .await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].block_hash(), want);
    }
    let unknown = BlockHash::from_byte_array([7; 32]);
    p.send(NetworkMessage::GetHeaders(GetHeadersMessage::new(
        vec![],
        unknown,
    )))
    .await;
    p.send(NetworkMessage::Ping(9)).await;
    let answered = p
        .recv_until(|m| match m {
            NetworkMessage::Headers(_) => Some(true),
            NetworkMessage::Pong(9) => Some(false),
            _ => None,
        })
        .await;
    assert!(!answered, "an unknown stop hash was answered");
    a.stop().await;
}
