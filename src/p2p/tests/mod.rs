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

mod filters;
mod misbehaviour;
mod peers;
mod serving;
mod sync;

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

/// Waits up to `within` for `b`'s tip to be `want` (height, hash).
async fn wait_for_tip(b: &MockBackend, want: (u32, BlockHash), within: Duration) {
    let res = timeout(within, async {
        while b.tip() != want {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(res.is_ok(), "tip {:?}, wanted {want:?}", b.tip());
}
