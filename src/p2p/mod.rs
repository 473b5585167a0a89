//! Bitcoin P2P layer (protocol 70016): bounded codec, handshake, one tokio
//! task per peer, headers-first sync, block download, serving headers,
//! blocks and BIP-157 filters, address book and ban list.
//!
//! The node plugs in through [`NodeBackend`] (see [`backend`] for which
//! calls may block); the node's own implementation is
//! `crate::node::p2p_backend`, so this module imports nothing of the
//! pipeline or its snapshots. Inside, the connection manager (`net`) and
//! the peer tasks (`peer`) share `state` and never import each other.
//! Wiring:
//!
//! ```ignore
//! let (handle, task) = kakehi::p2p::spawn(node.clone(), config, shutdown_rx);
//! // or: let (handle, control) = kakehi::p2p::handle();
//! //     tokio::spawn(kakehi::p2p::run(node.clone(), config, control, shutdown_rx));
//! // after the pipeline connects a block from elsewhere (import, HTTP):
//! handle.announce_tip();
//! ```
//!
//! Behaviour, limits and ban rules are documented in `docs/p2p.md`.
//! Reference: Bitcoin Core `net_processing.cpp`, `net.cpp`, `protocol.h`;
//! BIP 130 (sendheaders), 133 (feefilter), 155 (addrv2), 157/158 (filters),
//! 339 (wtxidrelay).

#![warn(missing_docs)]

pub mod addrman;
pub mod archive;
mod archive_serve;
pub mod backend;
pub mod codec;
mod misbehaviour;
mod net;
mod peer;
mod state;
pub mod sync;
mod txdownload;
pub mod txrequest;

#[cfg(test)]
mod mock;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bitcoin::Transaction;
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};

pub use backend::{
    ArchiveQueryError, BoxError, FilterQueryError, GenTxid, HeadersError, HeadersOutcome,
    MempoolTx, NodeBackend, SubmitError, SubmitOutcome, TxSubmitError,
};
pub use codec::CodecError;
pub use misbehaviour::{Disconnect, Misbehaviour};
pub use net::run;
pub use peer::relay::{
    INBOUND_INVENTORY_BROADCAST_INTERVAL, INVENTORY_BROADCAST_MAX,
    OUTBOUND_INVENTORY_BROADCAST_INTERVAL,
};
pub use peer::{
    MAX_BLOCKS_TO_ANNOUNCE, MAX_GETBLOCKS, MAX_GETCFHEADERS, MAX_GETCFILTERS,
    MAX_SUBVERSION_LENGTH, MAX_UNCONNECTING_HEADERS,
};
pub use sync::{PeerId, DOWNLOAD_WINDOW, MAX_IN_FLIGHT_PER_PEER};
pub use txdownload::{MAX_ORPHAN_TRANSACTIONS, MAX_RECENT_REJECTS, ORPHAN_TX_EXPIRE_TIME};

/// Filter headers are checkpointed every this many blocks in `cfcheckpt`
/// (BIP157 `CFCHECKPT_INTERVAL`).
pub const CFCHECKPT_INTERVAL: u32 = 1_000;

/// Protocol version we speak (Core's `PROTOCOL_VERSION`: wtxidrelay, BIP339).
pub const PROTOCOL_VERSION: u32 = 70016;
/// Oldest peer version accepted (Core's `MIN_PEER_PROTO_VERSION`).
pub const MIN_PEER_PROTOCOL_VERSION: u32 = 31800;
/// Protocol version from which peers understand `sendheaders` (BIP130).
pub const SENDHEADERS_VERSION: u32 = 70012;
/// Protocol version from which `wtxidrelay` is negotiated (BIP339).
pub const WTXID_RELAY_VERSION: u32 = 70016;

/// Timeouts and intervals of the P2P layer, in wall-clock time.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Timeouts {
    /// TCP connect for outbound peers (Core: 5 s).
    pub connect: Duration,
    /// version + verack must complete within this (Core: 60 s).
    pub handshake: Duration,
    /// A message's payload must arrive within this once its header has.
    pub message_body: Duration,
    /// A write (our send buffer drained by the peer) must finish within
    /// this, else the peer is a slow reader and is dropped.
    pub write: Duration,
    /// Interval between our pings (Core: 2 min).
    pub ping_interval: Duration,
    /// A ping unanswered this long disconnects (Core: 20 min).
    pub ping_timeout: Duration,
    /// The header-sync peer must answer a full `getheaders` within this.
    pub headers_response: Duration,
    /// Initial block stall timeout (Core: 2 s), doubled per stall.
    pub stall_base: Duration,
    /// Maximum block stall timeout (Core: 64 s).
    pub stall_max: Duration,
    /// Any single block request unanswered this long disconnects the peer
    /// (Core: 10 min base).
    pub block_request: Duration,
    /// Period of the connection manager (dialing, saving the book).
    pub maintenance: Duration,
    /// Interval between saves of the address book to
    /// [`P2pConfig::addr_file`] (also saved at shutdown); a failed save is
    /// logged and tried again at the next one.
    pub addr_book_save: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(5),
            handshake: Duration::from_secs(60),
            message_body: Duration::from_secs(120),
            write: Duration::from_secs(60),
            ping_interval: Duration::from_secs(120),
            ping_timeout: Duration::from_secs(20 * 60),
            headers_response: Duration::from_secs(120),
            stall_base: Duration::from_secs(2),
            stall_max: Duration::from_secs(64),
            block_request: Duration::from_secs(600),
            maintenance: Duration::from_secs(1),
            addr_book_save: Duration::from_secs(300),
        }
    }
}

/// Configuration of the P2P layer.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct P2pConfig {
    /// Address to accept inbound connections on (`None`: no listener).
    pub listen: Option<SocketAddr>,
    /// Connect only to these peers (`--connect`): no DNS seeds, no dialing
    /// of gossiped addresses. Retried with back-off.
    pub connect: Vec<SocketAddr>,
    /// Peers always kept connected in addition (`--addnode`).
    pub addnode: Vec<SocketAddr>,
    /// Maximum inbound peers (Core: 125 − 8 = 117).
    pub max_inbound: usize,
    /// Maximum peers in total (Core's `DEFAULT_MAX_PEER_CONNECTIONS`: 125).
    pub max_total: usize,
    /// Outbound full-relay peers dialed from the address book (Core: 8).
    pub max_outbound_full_relay: usize,
    /// Maximum simultaneous connections from one IP address.
    pub per_ip_limit: usize,
    /// How long a misbehaving peer's IP stays discouraged (Core: 24 h):
    /// never dialed, and accepted inbound only when it does not take the
    /// last inbound slot (Core's `CreateNodeFromAcceptedSocket`).
    pub ban_duration: Duration,
    /// Where the address book is persisted (`None`: memory only).
    pub addr_file: Option<PathBuf>,
    /// Query the network's DNS seeds when the book is small and `connect` is
    /// empty.
    pub dns_seeds: bool,
    /// Our BIP14 user agent.
    pub user_agent: String,
    /// Timeouts.
    pub timeouts: Timeouts,
}

impl Default for P2pConfig {
    fn default() -> Self {
        P2pConfig {
            listen: None,
            connect: Vec::new(),
            addnode: Vec::new(),
            max_inbound: 117,
            max_total: 125,
            max_outbound_full_relay: 8,
            per_ip_limit: 8,
            ban_duration: Duration::from_secs(24 * 3600),
            addr_file: None,
            dns_seeds: true,
            user_agent: format!("/kakehi:{}/", env!("CARGO_PKG_VERSION")),
            timeouts: Timeouts::default(),
        }
    }
}

/// Errors of the P2P layer as a whole (per-peer problems only disconnect
/// the peer and are logged).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum P2pError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The network task is not running (never started or stopped).
    #[error("the p2p network task is not running")]
    Stopped,
    /// The command queue to the network task is full; try again later.
    #[error("the p2p command queue is full")]
    Busy,
    /// The OS gave no randomness for the nonces (`version`, `ping`) and
    /// the address book's selection seed, at start.
    #[error("no randomness from the OS for p2p nonces: {source}")]
    Entropy {
        /// The OS error.
        #[source]
        source: getrandom::Error,
    },
}

/// A connected peer, as shown by [`P2pHandle::peers`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerInfo {
    /// Process-unique id.
    pub id: PeerId,
    /// Remote address.
    pub addr: SocketAddr,
    /// Whether the peer connected to us.
    pub inbound: bool,
    /// Its `version` (when the handshake got that far): service bits.
    pub services: u64,
    /// Its user agent (at most [`MAX_SUBVERSION_LENGTH`] bytes; a longer one
    /// disconnects, as in Core).
    pub user_agent: String,
    /// The height it announced in `version`.
    pub start_height: i32,
}

pub(crate) enum NetCommand {
    AnnounceTip,
    RelayTx(Arc<Transaction>),
}

pub(crate) struct HandleShared {
    pub(crate) local_addr: watch::Sender<Option<SocketAddr>>,
    pub(crate) peers: Mutex<HashMap<PeerId, PeerInfo>>,
    /// The ban list (Core's discouragement), read by [`P2pHandle::discouraged`].
    pub(crate) bans: Mutex<addrman::BanList>,
}

/// Handle to a running P2P layer: announce tips, relay transactions, list
/// peers. Cheap to clone.
#[derive(Clone)]
pub struct P2pHandle {
    cmd_tx: mpsc::Sender<NetCommand>,
    shared: Arc<HandleShared>,
}

/// The receiving end of a [`P2pHandle`], consumed by [`run`].
pub struct P2pControl {
    pub(crate) cmd_rx: mpsc::Receiver<NetCommand>,
    pub(crate) shared: Arc<HandleShared>,
}

/// Creates a handle and the control end to pass to [`run`].
pub fn handle() -> (P2pHandle, P2pControl) {
    let (cmd_tx, cmd_rx) = mpsc::channel(256);
    let shared = Arc::new(HandleShared {
        local_addr: watch::channel(None).0,
        peers: Mutex::new(HashMap::new()),
        bans: Mutex::new(addrman::BanList::default()),
    });
    (
        P2pHandle {
            cmd_tx,
            shared: shared.clone(),
        },
        P2pControl { cmd_rx, shared },
    )
}

/// Starts [`run`] on the current tokio runtime and returns its handle and
/// join handle: the one-line wiring for the node.
pub fn spawn(
    backend: Arc<dyn NodeBackend>,
    config: P2pConfig,
    shutdown: watch::Receiver<bool>,
) -> (P2pHandle, tokio::task::JoinHandle<Result<(), P2pError>>) {
    let (h, control) = handle();
    (h, tokio::spawn(run(backend, config, control, shutdown)))
}

impl P2pHandle {
    /// Tells every peer about the node's current tip (`headers` to peers
    /// that sent `sendheaders`, else `inv`). Coalesced: if the queue is full
    /// an announcement is already pending. Blocks connected from P2P are
    /// announced automatically; call this for blocks connected otherwise.
    pub fn announce_tip(&self) {
        let _ = self.cmd_tx.try_send(NetCommand::AnnounceTip);
    }

    /// Relays a transaction: `inv` (by wtxid to wtxidrelay peers) to peers
    /// that asked for transaction relay. With a mempool behind the backend
    /// ([`NodeBackend::mempool_min_feerate`]) it is queued for each peer's
    /// next trickle, announced only while in the mempool, above the peer's
    /// `feefilter`, and not to peers known to have it (the one that sent
    /// it), and served from the mempool; without one, announced at once
    /// and served on `getdata` for a while (the 100 most recent are kept).
    ///
    /// # Errors
    /// [`P2pError::Stopped`] when the network task is gone,
    /// [`P2pError::Busy`] when its queue is full.
    pub fn relay_transaction(&self, tx: Transaction) -> Result<(), P2pError> {
        self.cmd_tx
            .try_send(NetCommand::RelayTx(Arc::new(tx)))
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => P2pError::Busy,
                mpsc::error::TrySendError::Closed(_) => P2pError::Stopped,
            })
    }

    /// Connected peers (handshake completed or in progress).
    pub fn peers(&self) -> Vec<PeerInfo> {
        let mut v: Vec<PeerInfo> = self.shared.peers.lock().values().cloned().collect();
        v.sort_by_key(|p| p.id);
        v
    }

    /// The IP addresses discouraged now (misbehaving peers, for
    /// [`P2pConfig::ban_duration`]), sorted.
    pub fn discouraged(&self) -> Vec<std::net::IpAddr> {
        self.shared.bans.lock().discouraged()
    }

    /// Number of connected peers.
    pub fn peer_count(&self) -> usize {
        self.shared.peers.lock().len()
    }

    /// The bound listen address (useful with port 0), waiting until the
    /// listener is up. Waits forever when [`P2pConfig::listen`] is `None`;
    /// `None` is never returned while this handle lives (the channel's
    /// sender is kept by the handle itself).
    pub async fn local_addr(&self) -> Option<SocketAddr> {
        let mut rx = self.shared.local_addr.subscribe();
        loop {
            if let Some(a) = *rx.borrow_and_update() {
                return Some(a);
            }
            if rx.changed().await.is_err() {
                return None;
            }
        }
    }
}
