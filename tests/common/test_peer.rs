//! A hand-driven P2P peer on the node's codec over a `TcpStream`
//! (regtest magic), for tests that talk to a kakehi node message by
//! message. Every receive is bounded (30 s).

use std::net::SocketAddr;
use std::time::Duration;

use bitcoin::p2p::address::Address;
use bitcoin::p2p::message::NetworkMessage;
use bitcoin::p2p::message_network::VersionMessage;
use bitcoin::p2p::{Magic, ServiceFlags};
use kakehi::p2p::codec::{self, encode_message, CodecError};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::time::timeout;

const M: Magic = Magic::REGTEST;

/// A hand-driven peer on the node's codec.
pub struct TestPeer {
    /// The read half.
    pub rd: OwnedReadHalf,
    /// The write half.
    pub wr: OwnedWriteHalf,
    /// The node's `version`.
    pub version: VersionMessage,
    /// Messages the node sent between its `verack` and the `pong` that
    /// ends [`TestPeer::handshake`] (other than `ping`s).
    pub early: Vec<NetworkMessage>,
}

impl TestPeer {
    /// Connects and completes the handshake (`relay`: BIP37 flag).
    pub async fn handshake(addr: SocketAddr, relay: bool) -> TestPeer {
        let s = TcpStream::connect(addr).await.unwrap();
        let (rd, wr) = s.into_split();
        let me: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let v = VersionMessage {
            version: 70016,
            services: ServiceFlags::NONE,
            timestamp: 0,
            receiver: Address::new(&addr, ServiceFlags::NONE),
            sender: Address::new(&me, ServiceFlags::NONE),
            nonce: 7,
            user_agent: "/archive-test/".into(),
            start_height: 0,
            relay,
        };
        let mut p = TestPeer {
            rd,
            wr,
            version: v.clone(),
            early: Vec::new(),
        };
        for m in [
            NetworkMessage::Version(v),
            NetworkMessage::WtxidRelay,
            NetworkMessage::SendAddrV2,
            NetworkMessage::Verack,
        ] {
            p.send(m).await;
        }
        let (mut theirs, mut verack) = (None, false);
        while theirs.is_none() || !verack {
            match p.recv().await.expect("handshake") {
                NetworkMessage::Version(v) => theirs = Some(v),
                NetworkMessage::Verack => verack = true,
                _ => {}
            }
        }
        p.version = theirs.unwrap();
        // A pong proves the node finished the handshake (messages arriving
        // during it are dropped).
        p.send(NetworkMessage::Ping(1)).await;
        let mut early = Vec::new();
        p.recv_until(|m| match m {
            NetworkMessage::Pong(1) => Some(()),
            other => {
                early.push(other);
                None
            }
        })
        .await;
        p.early = early;
        p
    }

    /// Sends one message.
    pub async fn send(&mut self, msg: NetworkMessage) {
        self.wr.write_all(&encode_message(M, msg)).await.unwrap();
    }

    /// The next message (30 s at most).
    pub async fn recv(&mut self) -> Result<NetworkMessage, CodecError> {
        timeout(
            Duration::from_secs(30),
            codec::read_message(&mut self.rd, M, Duration::from_secs(30)),
        )
        .await
        .expect("a message within 30 s")
    }

    /// Receives until `f` returns Some, answering pings on the way.
    pub async fn recv_until<T>(&mut self, mut f: impl FnMut(NetworkMessage) -> Option<T>) -> T {
        loop {
            let m = self.recv().await.expect("connection open");
            if let NetworkMessage::Ping(n) = m {
                self.send(NetworkMessage::Pong(n)).await;
                continue;
            }
            if let Some(t) = f(m) {
                return t;
            }
        }
    }

    /// Sends a `ping` and waits for its `pong`.
    pub async fn ping(&mut self, nonce: u64) {
        self.send(NetworkMessage::Ping(nonce)).await;
        self.recv_until(|m| matches!(m, NetworkMessage::Pong(n) if n == nonce).then_some(()))
            .await;
    }
}
