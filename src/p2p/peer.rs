//! One peer: a reader task feeding decoded messages into a small channel,
//! and the peer task proper, a `select!` over messages, commands from the
//! network and a one-second tick. Handshake, serving, header sync and block
//! download for that peer live here.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bitcoin::block::Header;
use bitcoin::consensus::{deserialize, serialize};
use bitcoin::hashes::Hash;
use bitcoin::p2p::address::{AddrV2, AddrV2Message, Address};
use bitcoin::p2p::message::NetworkMessage;
use bitcoin::p2p::message_blockdata::{GetBlocksMessage, GetHeadersMessage, Inventory};
use bitcoin::p2p::message_filter::{
    CFCheckpt, CFHeaders, CFilter, GetCFCheckpt, GetCFHeaders, GetCFilters,
};
use bitcoin::p2p::message_network::VersionMessage;
use bitcoin::p2p::ServiceFlags;
use bitcoin::{Block, BlockHash, Transaction, Txid, Wtxid};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use super::archive::{archive_service, ArchiveMessageError};
use super::archive_serve;
use super::backend::*;
use super::codec::{self, CodecError, MAX_HEADERS};
use super::misbehaviour::{codec_disconnect, misbehaving, refused, Disconnect, Misbehaviour};
use super::state::{Net, PeerCmd};
use super::sync::{PeerId, DOWNLOAD_WINDOW, MAX_IN_FLIGHT_PER_PEER};
use super::{PROTOCOL_VERSION, SENDHEADERS_VERSION, WTXID_RELAY_VERSION};
use relay::TxRelay;

mod download;
mod filters;
mod handshake;
pub(crate) mod relay;
mod serve;

/// Maximum blocks per `getcfilters` (BIP157 `MAX_GETCFILTERS_SIZE`).
pub const MAX_GETCFILTERS: u32 = 1_000;
/// Maximum filter headers per `getcfheaders` (BIP157 `MAX_GETCFHEADERS_SIZE`).
pub const MAX_GETCFHEADERS: u32 = 2_000;
/// Unconnecting `headers` messages tolerated in a row (Core's
/// `MAX_NUM_UNCONNECTING_HEADERS_MSGS`); the next one disconnects and
/// discourages. Counted also while our `getheaders` is unanswered; reset
/// by any `headers` message that connects.
pub const MAX_UNCONNECTING_HEADERS: u32 = 10;
/// Headers sent in a `headers` announcement before falling back to `inv`
/// (Core's `MAX_BLOCKS_TO_ANNOUNCE`).
pub const MAX_BLOCKS_TO_ANNOUNCE: usize = 8;
/// How long an unanswered `getheaders` stops unconnecting `headers` from
/// triggering another `getheaders` (they are still counted against
/// [`MAX_UNCONNECTING_HEADERS`]).
const GETHEADERS_ANSWER_WAIT: Duration = Duration::from_secs(60);
/// Bytes gathered before a write when sending many messages.
const WRITE_BATCH: usize = 1 << 20;
/// Blocks listed in answer to `getblocks` (Core: 500).
pub const MAX_GETBLOCKS: usize = 500;
/// Longest user agent (`version` subver) accepted, in bytes (Core's
/// `MAX_SUBVERSION_LENGTH`, read with `LIMITED_STRING` in
/// net_processing.cpp). A longer one disconnects and discourages the peer.
pub const MAX_SUBVERSION_LENGTH: usize = 256;

/// Core's reason for refusing BIP37 messages when it does not offer
/// NODE_BLOOM.
const NO_BLOOM: &str = "received despite not offering bloom services";

async fn reader_loop(
    mut rd: OwnedReadHalf,
    magic: bitcoin::p2p::Magic,
    body_timeout: Duration,
    tx: mpsc::Sender<Result<NetworkMessage, CodecError>>,
) {
    loop {
        let res = codec::read_message(&mut rd, magic, body_timeout).await;
        let stop = res.is_err();
        if tx.send(res).await.is_err() || stop {
            return;
        }
    }
}

/// Runs one peer to the end: handshake, message loop, cleanup (download
/// slots released, IP discouraged on misbehaviour).
pub(crate) async fn run_peer(
    net: Arc<Net>,
    stream: TcpStream,
    addr: SocketAddr,
    id: PeerId,
    inbound: bool,
    cmd_rx: mpsc::Receiver<PeerCmd>,
    shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    // Two decoded messages wait here while the reader reads the next (so
    // that a block being handled finds the next one already decoded, to
    // hand in with it: `Peer::block_with_next`): at most ~3 payloads
    // (≤ 12 MB) buffered per peer; TCP back-pressure does the rest (Core
    // bounds its receive buffer per peer likewise).
    let (msg_tx, msg_rx) = mpsc::channel(2);
    let reader = tokio::spawn(reader_loop(
        rd,
        net.magic,
        net.config.timeouts.message_body,
        msg_tx,
    ));
    let mut peer = Peer::new(net.clone(), wr, addr, id, inbound);
    let reason = peer.run(msg_rx, cmd_rx, shutdown).await;
    reader.abort();
    if let Some(n) = peer.our_nonce {
        net.our_nonces.lock().remove(&n);
    }
    if reason.discourage() {
        warn!(peer = %addr, id, %reason, "disconnecting and discouraging peer");
        net.ban(addr.ip());
    } else {
        debug!(peer = %addr, id, %reason, "peer disconnected");
    }
    net.unregister(id);
}

/// Sleeps until `at`, or for ever when `None` (a `select!` arm that is
/// off).
async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

/// A message taken from the reader before its turn, to see whether the
/// block being handled has its child right behind it (then handed to the
/// node with it: [`NodeBackend::submit_block_with_next`]); handled next.
enum Peeked {
    /// A `block` message, shared with the submission it was the next of.
    Block(Arc<Block>),
    /// Any other message, or the reader's error.
    Other(Result<NetworkMessage, CodecError>),
}

/// The next message to handle: the one taken ahead of its turn, else the
/// reader's next (`None`: the reader ended). Cancel safe: a peeked message
/// is taken only when this completes, and `recv` is cancel safe.
async fn next_message(
    peeked: &mut Option<Peeked>,
    msg_rx: &mut mpsc::Receiver<Result<NetworkMessage, CodecError>>,
) -> Option<Peeked> {
    if let Some(p) = peeked.take() {
        return Some(p);
    }
    Some(match msg_rx.recv().await? {
        Ok(NetworkMessage::Block(block)) => Peeked::Block(Arc::new(block)),
        other => Peeked::Other(other),
    })
}

struct Peer {
    net: Arc<Net>,
    wr: OwnedWriteHalf,
    addr: SocketAddr,
    id: PeerId,
    inbound: bool,
    version: Option<VersionMessage>,
    verack: bool,
    our_nonce: Option<u64>,
    our_services: ServiceFlags,
    send_headers: bool,
    wtxid_relay: bool,
    addrv2: bool,
    fee_filter: i64,
    ping: Option<(u64, Instant)>,
    last_ping: Instant,
    /// Best height the peer is known to have.
    best_height: u32,
    best_hash: Option<BlockHash>,
    last_announced: Option<BlockHash>,
    /// A block whose header the peer is known to have (it sent it, or we
    /// sent it in `headers`): the base of `headers` announcements.
    peer_has: Option<BlockHash>,
    /// When our last `getheaders` to this peer left, until answered.
    getheaders_at: Option<Instant>,
    unconnecting: u32,
    not_found: HashSet<BlockHash>,
    sent_getaddr_answer: bool,
    /// The last block of a full `getblocks` answer: when the peer asks for
    /// it, our tip is announced (Core's `m_continuation_block`).
    continuation_block: Option<BlockHash>,
    /// Transaction relay with this peer.
    relay: TxRelay,
}

impl Peer {
    fn new(net: Arc<Net>, wr: OwnedWriteHalf, addr: SocketAddr, id: PeerId, inbound: bool) -> Self {
        Peer {
            net,
            wr,
            addr,
            id,
            inbound,
            version: None,
            verack: false,
            our_nonce: None,
            our_services: ServiceFlags::NONE,
            send_headers: false,
            wtxid_relay: false,
            addrv2: false,
            fee_filter: 0,
            ping: None,
            last_ping: Instant::now(),
            best_height: 0,
            best_hash: None,
            last_announced: None,
            peer_has: None,
            getheaders_at: None,
            unconnecting: 0,
            not_found: HashSet::new(),
            sent_getaddr_answer: false,
            continuation_block: None,
            relay: TxRelay::default(),
        }
    }

    fn backend(&self) -> Arc<dyn NodeBackend> {
        self.net.backend.clone()
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), Disconnect> {
        match tokio::time::timeout(self.net.config.timeouts.write, self.wr.write_all(bytes)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Disconnect::Io(e)),
            Err(_) => Err(Disconnect::WriteTimeout),
        }
    }

    async fn send(&mut self, msg: NetworkMessage) -> Result<(), Disconnect> {
        let bytes = codec::encode_message(self.net.magic, msg);
        self.write(&bytes).await
    }

    /// Sends several messages, batched into writes of about
    /// [`WRITE_BATCH`] bytes (few syscalls, bounded extra memory).
    async fn send_all(&mut self, msgs: Vec<NetworkMessage>) -> Result<(), Disconnect> {
        let mut buf = Vec::new();
        for m in msgs {
            buf.extend(codec::encode_message(self.net.magic, m));
            if buf.len() >= WRITE_BATCH {
                self.write(&buf).await?;
                buf.clear();
            }
        }
        if buf.is_empty() {
            return Ok(());
        }
        self.write(&buf).await
    }

    async fn run(
        &mut self,
        mut msg_rx: mpsc::Receiver<Result<NetworkMessage, CodecError>>,
        mut cmd_rx: mpsc::Receiver<PeerCmd>,
        mut shutdown: watch::Receiver<bool>,
    ) -> Disconnect {
        match self
            .handshake(&mut msg_rx, &mut cmd_rx, &mut shutdown)
            .await
        {
            Ok(()) => {}
            Err(d) => return d,
        }
        if let Err(d) = self.after_handshake().await {
            return d;
        }
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A message taken from the reader ahead of its turn, handled next.
        let mut peeked: Option<Peeked> = None;
        loop {
            let res = tokio::select! {
                // Shutdown, the node's commands and the tick first: a peer
                // whose next block is always read already (a fast sync, or
                // a stream of junk blocks) must not starve them.
                biased;
                _ = shutdown.changed() => Err(Disconnect::Shutdown),
                c = cmd_rx.recv() => match c {
                    Some(cmd) => self.on_command(cmd).await,
                    None => Err(Disconnect::Shutdown),
                },
                _ = tick.tick() => self.on_tick().await,
                _ = sleep_until_opt(self.relay.next_wake()) => self.relay_tick().await,
                m = next_message(&mut peeked, &mut msg_rx) => match m {
                    Some(Peeked::Block(block)) => {
                        self.block_with_next(block, &mut msg_rx, &mut peeked).await
                    }
                    Some(Peeked::Other(Ok(msg))) => self.on_message(msg).await,
                    Some(Peeked::Other(Err(e))) => Err(codec_disconnect(e)),
                    None => Err(Disconnect::Io(std::io::ErrorKind::UnexpectedEof.into())),
                },
            };
            if let Err(d) = res {
                return d;
            }
            if *shutdown.borrow() {
                return Disconnect::Shutdown;
            }
        }
    }

    fn new_ping_nonce(&mut self) -> u64 {
        let n = self.net.nonces.next();
        self.ping = Some((n, Instant::now()));
        self.last_ping = Instant::now();
        n
    }

    async fn on_command(&mut self, cmd: PeerCmd) -> Result<(), Disconnect> {
        match cmd {
            PeerCmd::AnnounceTip => self.announce_tip().await,
            PeerCmd::RelayTx(tx) if self.net.backend.mempool_min_feerate().is_some() => {
                self.queue_announcement(&tx);
                Ok(())
            }
            PeerCmd::RelayTx(tx) => {
                // No mempool: announced at once, served from the recent
                // relays.
                let relay = self.version.as_ref().is_some_and(|v| v.relay);
                if !relay {
                    return Ok(());
                }
                let inv = if self.wtxid_relay {
                    Inventory::WTx(tx.compute_wtxid())
                } else {
                    Inventory::Transaction(tx.compute_txid())
                };
                self.send(NetworkMessage::Inv(vec![inv])).await
            }
            PeerCmd::Disconnect(d) => Err(d),
            PeerCmd::Shutdown => Err(Disconnect::Shutdown),
        }
    }

    async fn on_tick(&mut self) -> Result<(), Disconnect> {
        let t = self.net.config.timeouts.clone();
        let now = Instant::now();
        match self.ping {
            Some((_, sent)) if now.duration_since(sent) > t.ping_timeout => {
                return Err(Disconnect::PingTimeout)
            }
            None if now.duration_since(self.last_ping) > t.ping_interval => {
                let n = self.new_ping_nonce();
                self.send(NetworkMessage::Ping(n)).await?;
            }
            _ => {}
        }
        let sync_stalled = {
            let hs = self.net.header_sync.lock();
            matches!(*hs, Some((p, since)) if p == self.id && now.duration_since(since) > t.headers_response)
        };
        if sync_stalled {
            return Err(Disconnect::HeadersTimeout);
        }
        if self
            .net
            .sched
            .lock()
            .oldest_wait(self.id, now)
            .is_some_and(|w| w > t.block_request)
        {
            return Err(Disconnect::BlockTimeout);
        }
        self.maybe_start_header_sync().await?;
        self.request_txs().await?;
        self.request_blocks().await
    }

    async fn on_message(&mut self, msg: NetworkMessage) -> Result<(), Disconnect> {
        match msg {
            NetworkMessage::Version(_) => {
                // Core: "redundant version message", ignored.
                debug!(peer = %self.addr, "redundant version message ignored");
                Ok(())
            }
            NetworkMessage::Verack => Ok(()),
            NetworkMessage::WtxidRelay => Err(refused("wtxidrelay", "received after verack")),
            NetworkMessage::SendAddrV2 => Err(refused("sendaddrv2", "received after verack")),
            NetworkMessage::MemPool => Err(refused(
                "mempool",
                "mempool request with bloom filters disabled",
            )),
            NetworkMessage::FilterLoad(_) => Err(refused("filterload", NO_BLOOM)),
            NetworkMessage::FilterAdd(_) => Err(refused("filteradd", NO_BLOOM)),
            NetworkMessage::FilterClear => Err(refused("filterclear", NO_BLOOM)),
            NetworkMessage::Tx(tx) => self.on_tx(tx).await,
            NetworkMessage::SendHeaders => {
                self.send_headers = true;
                Ok(())
            }
            NetworkMessage::FeeFilter(rate) => {
                self.fee_filter = rate;
                Ok(())
            }
            NetworkMessage::Ping(n) => self.send(NetworkMessage::Pong(n)).await,
            NetworkMessage::Pong(n) => {
                self.on_pong(n);
                Ok(())
            }
            NetworkMessage::GetHeaders(req) => self.on_getheaders(req).await,
            NetworkMessage::GetBlocks(req) => self.on_getblocks(req).await,
            NetworkMessage::GetData(inv) => self.on_getdata(inv).await,
            NetworkMessage::Headers(headers) => self.on_headers(headers).await,
            NetworkMessage::Inv(inv) => self.on_inv(inv).await,
            NetworkMessage::Block(block) => self.on_block(Arc::new(block), None).await,
            NetworkMessage::NotFound(inv) => {
                self.on_notfound(inv);
                Ok(())
            }
            NetworkMessage::GetCFilters(req) => self.on_getcfilters(req).await,
            NetworkMessage::GetCFHeaders(req) => self.on_getcfheaders(req).await,
            NetworkMessage::GetCFCheckpt(req) => self.on_getcfcheckpt(req).await,
            NetworkMessage::GetAddr => self.on_getaddr().await,
            NetworkMessage::Addr(list) => {
                let gossip = list
                    .into_iter()
                    .map(|(time, a)| (a.socket_addr(), a.services, time));
                self.on_addresses(gossip);
                Ok(())
            }
            NetworkMessage::AddrV2(list) => {
                let gossip = list
                    .into_iter()
                    .map(|m| (m.socket_addr(), m.services, m.time));
                self.on_addresses(gossip);
                Ok(())
            }
            NetworkMessage::Unknown { command, payload } => {
                self.on_unknown(command.to_string(), &payload).await
            }
            // sendcmpct (we never send one, so the peer asks full blocks),
            // cmpctblock, getblocktxn, blocktxn, merkleblock, reject, alert
            // and answers we did not ask for: ignored, as Core does with
            // what it does not use (docs/p2p.md).
            _ => Ok(()),
        }
    }

    /// A `pong`: the round trip of our last `ping`, when its nonce matches.
    fn on_pong(&mut self, n: u64) {
        if let Some((nonce, sent)) = self.ping {
            if nonce == n {
                self.net.note_ping(self.id, sent.elapsed());
                self.ping = None;
            }
        }
    }

    /// A `notfound`: the blocks it names go back to the download plan, and
    /// are not asked of this peer again (at most 10,000 remembered); the
    /// transactions it names may be asked of another announcer.
    fn on_notfound(&mut self, inv: Vec<Inventory>) {
        self.on_tx_notfound(inv.iter().filter_map(|i| match i {
            Inventory::Transaction(t) | Inventory::WitnessTransaction(t) => Some(GenTxid::Txid(*t)),
            Inventory::WTx(w) => Some(GenTxid::Wtxid(*w)),
            _ => None,
        }));
        let mut sched = self.net.sched.lock();
        for i in inv {
            if let Inventory::Block(h) | Inventory::WitnessBlock(h) = i {
                sched.release(self.id, &h);
                if self.not_found.len() < 10_000 {
                    self.not_found.insert(h);
                }
            }
        }
    }

    /// `addr` or `addrv2` gossip: each address that has a socket address
    /// (not Tor, I2P or CJDNS) goes into the book with its services and
    /// time (seconds since the epoch).
    fn on_addresses<E>(
        &self,
        gossip: impl Iterator<Item = (Result<SocketAddr, E>, ServiceFlags, u32)>,
    ) {
        let mut book = self.net.addrs.lock();
        for (addr, services, time) in gossip {
            if let Ok(sa) = addr {
                book.add(sa, services.to_u64(), Some(time));
            }
        }
    }

    /// A message of a command `NetworkMessage` does not know: the archive
    /// protocol's, answered when our services advertise it; anything else
    /// is ignored.
    async fn on_unknown(&mut self, command: String, payload: &[u8]) -> Result<(), Disconnect> {
        let advertised = self.our_services.has(archive_service());
        match archive_serve::on_message(self.backend(), advertised, &command, payload).await {
            Ok(Some(reply)) => self.send(reply).await,
            Ok(None) => Ok(()),
            Err(ArchiveMessageError::NotAdvertised { command }) => {
                Err(Disconnect::NotAdvertised { command })
            }
            Err(e) => Err(misbehaving(Misbehaviour::Archive(e))),
        }
    }
}
