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
use bitcoin::{Block, BlockHash, Transaction};
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
    // One decoded message waits here while the reader reads the next: at
    // most ~2 payloads (≤ 8 MB) buffered per peer; TCP back-pressure does
    // the rest (Core bounds its receive buffer per peer likewise).
    let (msg_tx, msg_rx) = mpsc::channel(1);
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
        loop {
            let res = tokio::select! {
                m = msg_rx.recv() => match m {
                    Some(Ok(msg)) => self.on_message(msg).await,
                    Some(Err(e)) => Err(codec_disconnect(e)),
                    None => Err(Disconnect::Io(std::io::ErrorKind::UnexpectedEof.into())),
                },
                c = cmd_rx.recv() => match c {
                    Some(cmd) => self.on_command(cmd).await,
                    None => Err(Disconnect::Shutdown),
                },
                _ = tick.tick() => self.on_tick().await,
                _ = shutdown.changed() => Err(Disconnect::Shutdown),
            };
            if let Err(d) = res {
                return d;
            }
            if *shutdown.borrow() {
                return Disconnect::Shutdown;
            }
        }
    }

    fn version_message(&mut self) -> VersionMessage {
        let mut services = ServiceFlags::NETWORK | ServiceFlags::WITNESS;
        if self.net.backend.filter_index_synced() {
            services |= ServiceFlags::COMPACT_FILTERS;
        }
        if self.net.backend.archive_ready() {
            services |= archive_service();
        }
        self.our_services = services;
        let nonce = self.net.nonces.next();
        self.our_nonce = Some(nonce);
        self.net.our_nonces.lock().insert(nonce);
        let (height, _) = self.net.backend.tip();
        let timestamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
        VersionMessage {
            version: PROTOCOL_VERSION,
            services,
            timestamp,
            receiver: Address::new(&self.addr, ServiceFlags::NONE),
            sender: Address::new(&unspecified, services),
            nonce,
            user_agent: self.net.config.user_agent.clone(),
            start_height: height as i32,
            // We keep no mempool: ask peers not to send transactions.
            relay: false,
        }
    }

    async fn handshake(
        &mut self,
        msg_rx: &mut mpsc::Receiver<Result<NetworkMessage, CodecError>>,
        cmd_rx: &mut mpsc::Receiver<PeerCmd>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), Disconnect> {
        let deadline = tokio::time::Instant::now() + self.net.config.timeouts.handshake;
        if !self.inbound {
            let v = self.version_message();
            self.send(NetworkMessage::Version(v)).await?;
        }
        while self.version.is_none() || !self.verack {
            let msg = tokio::select! {
                m = msg_rx.recv() => match m {
                    Some(Ok(m)) => m,
                    Some(Err(CodecError::BadMagic { got, .. })) if self.version.is_none() => {
                        return Err(Disconnect::NotV1 { got })
                    }
                    Some(Err(e)) => return Err(codec_disconnect(e)),
                    None => return Err(Disconnect::Io(std::io::ErrorKind::UnexpectedEof.into())),
                },
                c = cmd_rx.recv() => match c {
                    Some(PeerCmd::Disconnect(d)) => return Err(d),
                    Some(PeerCmd::Shutdown) | None => return Err(Disconnect::Shutdown),
                    Some(_) => continue,
                },
                _ = tokio::time::sleep_until(deadline) => return Err(Disconnect::HandshakeTimeout),
                _ = shutdown.changed() => return Err(Disconnect::Shutdown),
            };
            match msg {
                NetworkMessage::Version(v) => {
                    if self.version.is_some() {
                        // Core: "redundant version message", ignored.
                        debug!(peer = %self.addr, "redundant version message ignored");
                        continue;
                    }
                    if v.user_agent.len() > MAX_SUBVERSION_LENGTH {
                        return Err(misbehaving(Misbehaviour::UserAgentTooLong {
                            len: v.user_agent.len(),
                            max: MAX_SUBVERSION_LENGTH,
                        }));
                    }
                    if v.version < super::MIN_PEER_PROTOCOL_VERSION {
                        return Err(Disconnect::ObsoleteVersion(v.version));
                    }
                    if self.inbound && self.net.our_nonces.lock().contains(&v.nonce) {
                        return Err(Disconnect::SelfConnection);
                    }
                    self.best_height = v.start_height.max(0) as u32;
                    if let Some(info) = self.net.shared.peers.lock().get_mut(&self.id) {
                        info.services = v.services.to_u64();
                        info.user_agent.clone_from(&v.user_agent);
                        info.start_height = v.start_height;
                    }
                    let their_version = v.version;
                    self.version = Some(v);
                    if self.inbound {
                        let ours = self.version_message();
                        self.send(NetworkMessage::Version(ours)).await?;
                    }
                    let mut msgs = Vec::new();
                    if their_version >= WTXID_RELAY_VERSION {
                        msgs.push(NetworkMessage::WtxidRelay);
                    }
                    msgs.push(NetworkMessage::SendAddrV2);
                    msgs.push(NetworkMessage::Verack);
                    self.send_all(msgs).await?;
                }
                NetworkMessage::Verack => {
                    if self.version.is_none() {
                        return Err(misbehaving(Misbehaviour::BeforeVersion {
                            command: "verack",
                        }));
                    }
                    self.verack = true;
                }
                NetworkMessage::WtxidRelay if self.version.is_some() => self.wtxid_relay = true,
                NetworkMessage::SendAddrV2 if self.version.is_some() => self.addrv2 = true,
                NetworkMessage::Unknown { .. } => {}
                other => {
                    if self.version.is_none() {
                        return Err(misbehaving(Misbehaviour::BeforeVersion {
                            command: other.cmd(),
                        }));
                    }
                    // Core ignores other messages before verack.
                }
            }
        }
        Ok(())
    }

    async fn after_handshake(&mut self) -> Result<(), Disconnect> {
        let their_version = self.version.as_ref().map(|v| v.version).unwrap_or(0);
        info!(peer = %self.addr, id = self.id, inbound = self.inbound, version = their_version,
              height = self.best_height, "peer connected");
        let services = self
            .version
            .as_ref()
            .map(|v| v.services.to_u64())
            .unwrap_or(0);
        self.net.addrs.lock().mark_good(self.addr, services);
        let mut msgs = Vec::new();
        if their_version >= SENDHEADERS_VERSION {
            msgs.push(NetworkMessage::SendHeaders);
        }
        if !self.inbound && self.net.config.connect.is_empty() {
            msgs.push(NetworkMessage::GetAddr);
        }
        msgs.push(NetworkMessage::Ping(self.new_ping_nonce()));
        self.send_all(msgs).await?;
        self.maybe_start_header_sync().await?;
        Ok(())
    }

    fn new_ping_nonce(&mut self) -> u64 {
        let n = self.net.nonces.next();
        self.ping = Some((n, Instant::now()));
        self.last_ping = Instant::now();
        n
    }

    fn locator(&self) -> Vec<BlockHash> {
        let mut loc = self.net.backend.locator();
        loc.truncate(101);
        loc
    }

    async fn send_getheaders(&mut self, locator: Vec<BlockHash>) -> Result<(), Disconnect> {
        let msg = GetHeadersMessage::new(locator, BlockHash::all_zeros());
        self.getheaders_at = Some(Instant::now());
        self.send(NetworkMessage::GetHeaders(msg)).await
    }

    /// Starts the initial header sync with this peer when it claims more
    /// than our best header and no other peer is doing it.
    async fn maybe_start_header_sync(&mut self) -> Result<(), Disconnect> {
        let (best, _) = self.net.backend.best_header_tip();
        if self.best_height <= best || !self.is_full_node() {
            return Ok(());
        }
        {
            let mut hs = self.net.header_sync.lock();
            if hs.is_some() {
                return Ok(());
            }
            *hs = Some((self.id, Instant::now()));
        }
        debug!(peer = %self.addr, from = best, to = self.best_height, "starting header sync");
        let loc = self.locator();
        self.send_getheaders(loc).await
    }

    fn is_full_node(&self) -> bool {
        self.version.as_ref().is_some_and(|v| {
            v.services.has(ServiceFlags::NETWORK) && v.services.has(ServiceFlags::WITNESS)
        })
    }

    async fn on_command(&mut self, cmd: PeerCmd) -> Result<(), Disconnect> {
        match cmd {
            PeerCmd::AnnounceTip => self.announce_tip().await,
            PeerCmd::RelayTx(tx) => {
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

    async fn announce_tip(&mut self) -> Result<(), Disconnect> {
        let (height, tip) = self.net.backend.tip();
        let (best_height, _) = self.net.backend.best_header_tip();
        // Catching up (initial download): announce nothing, as Core. Like
        // Core's `IsInitialBlockDownload` this latches: once caught up, a
        // peer feeding us a higher header chain it never delivers cannot
        // silence our announcements.
        if height < best_height && !self.net.caught_up.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.net.caught_up.store(true, Ordering::Relaxed);
        if self.last_announced == Some(tip) || self.best_hash == Some(tip) {
            return Ok(());
        }
        self.last_announced = Some(tip);
        if self.send_headers {
            // Headers only if they connect to a header the peer has (an
            // `inv` we sent does not count: the peer may not have fetched
            // it yet, and unconnecting headers are penalised).
            if let Some(since) = self.peer_has {
                let b = self.backend();
                let headers =
                    blocking(move || b.headers_after(&[since], tip, MAX_BLOCKS_TO_ANNOUNCE + 1))
                        .await
                        .unwrap_or_default();
                if !headers.is_empty()
                    && headers.len() <= MAX_BLOCKS_TO_ANNOUNCE
                    && headers.last().map(|h| h.block_hash()) == Some(tip)
                {
                    self.peer_has = Some(tip);
                    return self.send(NetworkMessage::Headers(headers)).await;
                }
            }
        }
        self.send(NetworkMessage::Inv(vec![Inventory::Block(tip)]))
            .await
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
        self.request_blocks().await
    }

    /// Fills this peer's download slots from the window; detects a staller.
    async fn request_blocks(&mut self) -> Result<(), Disconnect> {
        let (tip_height, _) = self.net.backend.tip();
        if !self.is_full_node() || self.best_height <= tip_height {
            return Ok(());
        }
        let window = self.net.backend.blocks_to_fetch(DOWNLOAD_WINDOW);
        if window.is_empty() {
            return Ok(());
        }
        let now = Instant::now();
        let (assigned, staller) = {
            let mut sched = self.net.sched.lock();
            // Only blocks the peer can have: at or below the height it is
            // known to have (Core's `pindexBestKnownBlock`, by height), and
            // not ones it said it does not have. Core sends no `notfound`
            // for blocks, so asking a lagging peer would only stall.
            // At the peer's own best height, only its best block: another
            // block there is on a branch it did not announce (say a header
            // whose body arrived mutated from someone else).
            let backend = &self.net.backend;
            let peer_height = self.best_height;
            let peer_best = self.best_hash;
            let assigned = sched.assign(
                self.id,
                &window,
                |h| {
                    self.not_found.contains(h)
                        || match backend.block_height(h) {
                            Some(x) if x < peer_height => false,
                            Some(x) if x == peer_height => peer_best.is_some_and(|b| b != *h),
                            _ => true,
                        }
                },
                now,
            );
            let mut staller = None;
            let (best, _) = self.net.backend.best_header_tip();
            let window_limits = best > tip_height + DOWNLOAD_WINDOW as u32;
            if assigned.is_empty()
                && sched.in_flight_of(self.id) < MAX_IN_FLIGHT_PER_PEER
                && window_limits
            {
                staller = sched.staller(&window, now).filter(|p| *p != self.id);
                if staller.is_some() {
                    sched.on_stall();
                }
            }
            (assigned, staller)
        };
        if let Some(p) = staller {
            warn!(
                staller = p,
                "block download stalled; disconnecting the staller"
            );
            self.net
                .send_to(p, PeerCmd::Disconnect(Disconnect::Stalling));
        }
        if assigned.is_empty() {
            return Ok(());
        }
        let inv = assigned.into_iter().map(Inventory::WitnessBlock).collect();
        self.send(NetworkMessage::GetData(inv)).await
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
            NetworkMessage::Tx(tx) => {
                // Our `version` said relay = false, and Core's -blocksonly
                // disconnects here; but BIP157 light clients (kyoto sends
                // to a random peer) broadcast whatever the flag, and would
                // lose their filter server. We keep no mempool: dropped.
                debug!(peer = %self.addr, txid = %tx.compute_txid(), "unsolicited tx ignored");
                Ok(())
            }
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
                if let Some((nonce, sent)) = self.ping {
                    if nonce == n {
                        self.net.note_ping(self.id, sent.elapsed());
                        self.ping = None;
                    }
                }
                Ok(())
            }
            NetworkMessage::GetHeaders(req) => self.on_getheaders(req).await,
            NetworkMessage::GetBlocks(req) => self.on_getblocks(req).await,
            NetworkMessage::GetData(inv) => self.on_getdata(inv).await,
            NetworkMessage::Headers(headers) => self.on_headers(headers).await,
            NetworkMessage::Inv(inv) => self.on_inv(inv).await,
            NetworkMessage::Block(block) => self.on_block(block).await,
            NetworkMessage::NotFound(inv) => {
                let mut sched = self.net.sched.lock();
                for i in inv {
                    if let Inventory::Block(h) | Inventory::WitnessBlock(h) = i {
                        sched.release(self.id, &h);
                        if self.not_found.len() < 10_000 {
                            self.not_found.insert(h);
                        }
                    }
                }
                Ok(())
            }
            NetworkMessage::GetCFilters(req) => self.on_getcfilters(req).await,
            NetworkMessage::GetCFHeaders(req) => self.on_getcfheaders(req).await,
            NetworkMessage::GetCFCheckpt(req) => self.on_getcfcheckpt(req).await,
            NetworkMessage::GetAddr => self.on_getaddr().await,
            NetworkMessage::Addr(list) => {
                let mut book = self.net.addrs.lock();
                for (time, a) in list {
                    if let Ok(sa) = a.socket_addr() {
                        book.add(sa, a.services.to_u64(), Some(time));
                    }
                }
                Ok(())
            }
            NetworkMessage::AddrV2(list) => {
                let mut book = self.net.addrs.lock();
                for m in list {
                    if let Ok(sa) = m.socket_addr() {
                        book.add(sa, m.services.to_u64(), Some(m.time));
                    }
                }
                Ok(())
            }
            NetworkMessage::Unknown { command, payload } => {
                let advertised = self.our_services.has(archive_service());
                let command = command.to_string();
                match archive_serve::on_message(self.backend(), advertised, &command, &payload)
                    .await
                {
                    Ok(Some(reply)) => self.send(reply).await,
                    Ok(None) => Ok(()),
                    Err(ArchiveMessageError::NotAdvertised { command }) => {
                        Err(Disconnect::NotAdvertised { command })
                    }
                    Err(e) => Err(misbehaving(Misbehaviour::Archive(e))),
                }
            }
            // sendcmpct (we never send one, so the peer asks full blocks),
            // cmpctblock, getblocktxn, blocktxn, merkleblock, reject, alert
            // and answers we did not ask for: ignored, as Core does with
            // what it does not use (docs/p2p.md).
            _ => Ok(()),
        }
    }

    async fn on_getheaders(&mut self, req: GetHeadersMessage) -> Result<(), Disconnect> {
        if req.locator_hashes.is_empty() {
            // The stop block's header alone, if it may be served (Core: a
            // way to fetch one header, used after an unconnecting
            // announcement); else nothing.
            let Some(header) = self.net.backend.header(&req.stop_hash) else {
                return Ok(());
            };
            return self.send(NetworkMessage::Headers(vec![header])).await;
        }
        let b = self.backend();
        let headers = blocking(move || {
            b.headers_after(&req.locator_hashes, req.stop_hash, MAX_HEADERS as usize)
        })
        .await
        .unwrap_or_default();
        if let Some(last) = headers.last() {
            self.last_announced = Some(last.block_hash());
            self.peer_has = Some(last.block_hash());
        }
        self.send(NetworkMessage::Headers(headers)).await
    }

    /// `getblocks`: an `inv` of up to [`MAX_GETBLOCKS`] active-chain blocks
    /// after the locator's fork point, the stop block excluded (Core's
    /// `ProcessMessage` for `GETBLOCKS`). A full batch remembers its last
    /// block as the continuation: when the peer asks for it, an `inv` of
    /// our tip follows ([`Peer::on_getdata`]), so a peer that syncs by
    /// `getblocks` (bcoin, btcd, old Core) asks for the next batch.
    async fn on_getblocks(&mut self, req: GetBlocksMessage) -> Result<(), Disconnect> {
        let b = self.backend();
        let stop = req.stop_hash;
        let mut headers =
            blocking(move || b.headers_after(&req.locator_hashes, stop, MAX_GETBLOCKS))
                .await
                .unwrap_or_default();
        if headers.last().is_some_and(|h| h.block_hash() == stop) {
            headers.pop();
        }
        let Some(last) = headers.last().map(|h| h.block_hash()) else {
            return Ok(());
        };
        if headers.len() == MAX_GETBLOCKS {
            self.continuation_block = Some(last);
        }
        let inv = headers
            .iter()
            .map(|h| Inventory::Block(h.block_hash()))
            .collect();
        self.send(NetworkMessage::Inv(inv)).await
    }

    /// After a block was sent: if it was the continuation of a full
    /// `getblocks` batch, an `inv` of our tip, sent even when redundant
    /// (Core's `m_continuation_block` in `ProcessGetBlockData`).
    async fn after_block_served(&mut self, hash: BlockHash) -> Result<(), Disconnect> {
        if self.continuation_block != Some(hash) {
            return Ok(());
        }
        self.continuation_block = None;
        let (_, tip) = self.net.backend.tip();
        self.send(NetworkMessage::Inv(vec![Inventory::Block(tip)]))
            .await
    }

    /// `getdata`: blocks from the block files (`MSG_CMPCT_BLOCK` answered
    /// with the full witness block, as Core does for blocks too deep for a
    /// compact one: kakehi offers no compact blocks), transactions from the
    /// few we relayed (`MSG_TX` without witness, `MSG_WITNESS_TX` and
    /// `MSG_WTX` with, as Core). Everything else, and what we do not have,
    /// is listed in one `notfound`.
    async fn on_getdata(&mut self, inv: Vec<Inventory>) -> Result<(), Disconnect> {
        let mut not_found = Vec::new();
        for item in inv {
            let served = match item {
                Inventory::Block(h) => self.serve_block(h, false).await?,
                Inventory::WitnessBlock(h) | Inventory::CompactBlock(h) => {
                    self.serve_block(h, true).await?
                }
                Inventory::Transaction(txid) => {
                    self.serve_tx(|t| t.compute_txid() == txid, false).await?
                }
                Inventory::WitnessTransaction(txid) => {
                    self.serve_tx(|t| t.compute_txid() == txid, true).await?
                }
                Inventory::WTx(wtxid) => {
                    self.serve_tx(|t| t.compute_wtxid() == wtxid, true).await?
                }
                _ => false,
            };
            if !served {
                not_found.push(item);
            }
        }
        if !not_found.is_empty() {
            self.send(NetworkMessage::NotFound(not_found)).await?;
        }
        Ok(())
    }

    /// Sends block `hash` (with or without witness); false when we do not
    /// have it (or its stored bytes do not parse).
    async fn serve_block(&mut self, hash: BlockHash, witness: bool) -> Result<bool, Disconnect> {
        let b = self.backend();
        let Some(bytes) = blocking(move || b.block_bytes(&hash)).await.flatten() else {
            return Ok(false);
        };
        let payload = if witness {
            bytes
        } else {
            match strip_witness(&bytes) {
                Some(p) => p,
                None => return Ok(false),
            }
        };
        let frame = codec::encode_raw(self.net.magic, "block", &payload);
        self.write(&frame).await?;
        self.after_block_served(hash).await?;
        Ok(true)
    }

    /// Sends the relayed transaction matching `pick`; false when there is
    /// none (we keep no mempool: Core answers `notfound` likewise).
    async fn serve_tx(
        &mut self,
        pick: impl Fn(&Transaction) -> bool,
        witness: bool,
    ) -> Result<bool, Disconnect> {
        let tx = self.net.recent_txs.lock().iter().find(|t| pick(t)).cloned();
        let Some(tx) = tx else { return Ok(false) };
        let mut tx = (*tx).clone();
        if !witness {
            for input in &mut tx.input {
                input.witness.clear();
            }
        }
        self.send(NetworkMessage::Tx(tx)).await?;
        Ok(true)
    }

    async fn on_inv(&mut self, inv: Vec<Inventory>) -> Result<(), Disconnect> {
        // Transaction entries are not fetched (no mempool) and, unlike
        // Core's -blocksonly, not punished (see the `tx` arm of
        // `on_message`).
        let mut unknown = false;
        for item in inv {
            if let Inventory::Block(h) | Inventory::WitnessBlock(h) = item {
                match self.net.backend.block_height(&h) {
                    Some(height) => {
                        self.peer_has = Some(h);
                        if height > self.best_height {
                            self.best_height = height;
                            self.best_hash = Some(h);
                        }
                    }
                    None => unknown = true,
                }
            }
        }
        if unknown {
            let loc = self.locator();
            self.send_getheaders(loc).await?;
        }
        self.request_blocks().await
    }

    async fn on_headers(&mut self, headers: Vec<Header>) -> Result<(), Disconnect> {
        let n = headers.len();
        let Some(last) = headers.last().map(|h| h.block_hash()) else {
            // Nothing beyond our locator: the peer's chain is no better than
            // our best header, whatever its `version` claimed.
            let (best, _) = self.net.backend.best_header_tip();
            self.best_height = self.best_height.min(best);
            self.getheaders_at = None;
            self.end_header_sync();
            return Ok(());
        };
        // A short announcement extending our tip: its blocks (Core's direct
        // fetch, `HeadersDirectFetchBlocks`).
        let direct: Vec<BlockHash> = if n <= MAX_BLOCKS_TO_ANNOUNCE
            && headers.first().map(|h| h.prev_blockhash) == Some(self.net.backend.tip().1)
        {
            headers.iter().map(|h| h.block_hash()).collect()
        } else {
            Vec::new()
        };
        let b = self.backend();
        let res = blocking(move || b.accept_headers(&headers)).await;
        let Some(res) = res else { return Ok(()) };
        match res {
            Ok(out) => {
                self.unconnecting = 0;
                self.getheaders_at = None;
                self.peer_has = Some(last);
                // Fetched from this peer even when the global plan follows
                // another header of equal or more work whose body nobody
                // serves (say one that arrived mutated): the peer announced
                // these, so it has them.
                if !direct.is_empty() && self.is_full_node() {
                    let assigned =
                        self.net
                            .sched
                            .lock()
                            .assign(self.id, &direct, |_| false, Instant::now());
                    if !assigned.is_empty() {
                        let inv = assigned.into_iter().map(Inventory::WitnessBlock).collect();
                        self.send(NetworkMessage::GetData(inv)).await?;
                    }
                }
                if out.last_height >= self.best_height || (n as u64) < MAX_HEADERS {
                    // A message that is not full ends at the peer's tip, so
                    // this also corrects a height claimed too high in
                    // `version` (else we would ask again every tick).
                    self.best_height = out.last_height;
                    self.best_hash = Some(last);
                }
                if n as u64 == MAX_HEADERS {
                    self.note_header_progress();
                    let mut loc = vec![last];
                    loc.extend(self.locator());
                    loc.truncate(101);
                    self.send_getheaders(loc).await?;
                } else {
                    self.end_header_sync();
                }
                self.request_blocks().await
            }
            Err(HeadersError::Unconnected { .. }) => {
                // Every unconnecting message counts, also while our
                // `getheaders` is unanswered (Core's
                // `MAX_NUM_UNCONNECTING_HEADERS_MSGS`); any message that
                // connects, the answer included, resets the count. An
                // honest peer's announcements racing our request are a few
                // per round trip, far below the limit.
                self.unconnecting += 1;
                if self.unconnecting > MAX_UNCONNECTING_HEADERS {
                    return Err(misbehaving(Misbehaviour::Unconnecting {
                        count: self.unconnecting,
                    }));
                }
                // While our `getheaders` is unanswered, announcements racing
                // it are expected not to connect: wait for the answer rather
                // than ask again.
                if self
                    .getheaders_at
                    .is_some_and(|t| t.elapsed() < GETHEADERS_ANSWER_WAIT)
                {
                    return Ok(());
                }
                let loc = self.locator();
                self.send_getheaders(loc).await
            }
            Err(e @ (HeadersError::NotContinuous { .. } | HeadersError::Invalid { .. })) => {
                Err(misbehaving(Misbehaviour::Headers(e)))
            }
            Err(HeadersError::BelowMinimumWork { last: below }) => {
                // Presync: the node keeps bounded state for this chain and
                // stores nothing yet; keep asking while the peer has more.
                if n as u64 == MAX_HEADERS {
                    self.note_header_progress();
                    self.send_getheaders(vec![below]).await
                } else {
                    debug!(peer = %self.addr, "peer's chain ends below the work threshold");
                    self.end_header_sync();
                    Ok(())
                }
            }
            Err(HeadersError::PresyncPassed { from }) => {
                // Enough work now: ask for the same chain again, from its
                // base; it is stored as it comes back.
                self.note_header_progress();
                self.send_getheaders(vec![from]).await
            }
            Err(e) => {
                warn!(peer = %self.addr, error = %e, "headers not stored");
                self.end_header_sync();
                Ok(())
            }
        }
    }

    /// Restarts the header-sync peer's progress timer (it answered).
    fn note_header_progress(&self) {
        if let Some((_, since)) = self.net.header_sync.lock().as_mut() {
            *since = Instant::now();
        }
    }

    fn end_header_sync(&self) {
        let mut hs = self.net.header_sync.lock();
        if matches!(*hs, Some((p, _)) if p == self.id) {
            *hs = None;
        }
    }

    async fn on_block(&mut self, block: Block) -> Result<(), Disconnect> {
        let hash = block.block_hash();
        let requested = self.net.sched.lock().received(self.id, &hash);
        if !requested && self.net.backend.block_height(&hash).is_none() {
            // Unsolicited block with an unknown header: its header must link.
            let b = self.backend();
            let header = block.header;
            match blocking(move || b.accept_headers(&[header])).await {
                Some(Ok(_)) => {}
                Some(Err(HeadersError::Unconnected { .. })) | None => return Ok(()),
                Some(Err(
                    e @ (HeadersError::NotContinuous { .. } | HeadersError::Invalid { .. }),
                )) => return Err(misbehaving(Misbehaviour::Headers(e))),
                Some(Err(_)) => return Ok(()),
            }
        }
        if !requested {
            // Core processes an unrequested block only if it could extend
            // the best chain; by height here (work is the node's business).
            let (tip_height, _) = self.net.backend.tip();
            if !matches!(self.net.backend.block_height(&hash), Some(h) if h > tip_height) {
                debug!(peer = %self.addr, block_hash = %hash, "unrequested block below our tip; ignored");
                return Ok(());
            }
        }
        let b = self.backend();
        match blocking(move || b.submit_block(block)).await {
            Some(Ok(SubmitOutcome::NewTip { height, hash })) => {
                self.net.note_block(self.id);
                debug!(height, block_hash = %hash, "new tip");
                self.net.broadcast(|| PeerCmd::AnnounceTip);
            }
            Some(Ok(_)) => {}
            Some(Err(e @ SubmitError::Invalid { .. })) => {
                return Err(misbehaving(Misbehaviour::Block(e)))
            }
            // Core punishes a known-invalid block from an outbound peer
            // only (MaybePunishNodeForBlock, BLOCK_CACHED_INVALID).
            Some(Err(e @ SubmitError::KnownInvalid { .. })) if !self.inbound => {
                return Err(misbehaving(Misbehaviour::Block(e)))
            }
            Some(Err(SubmitError::KnownInvalid { hash })) => {
                debug!(peer = %self.addr, block_hash = %hash, "known-invalid block from an inbound peer; ignored");
            }
            Some(Err(e)) => {
                warn!(peer = %self.addr, block_hash = %hash, error = %e, "block not stored")
            }
            None => {}
        }
        self.request_blocks().await
    }

    /// Checks a filter request: basic type, known stop, range within
    /// `max`. `Ok(None)`: ignore (unknown stop hash: a race at the tip).
    fn check_filter_request(
        &self,
        command: &'static str,
        filter_type: u8,
        start_height: u32,
        stop: &BlockHash,
        max: u32,
    ) -> Result<Option<u32>, Disconnect> {
        if filter_type != 0 {
            return Err(misbehaving(Misbehaviour::FilterType {
                command,
                filter_type,
            }));
        }
        let Some(stop_height) = self.net.backend.block_height(stop) else {
            debug!(peer = %self.addr, command, stop = %stop, "unknown stop hash; ignored");
            return Ok(None);
        };
        if start_height > stop_height || stop_height - start_height >= max {
            return Err(misbehaving(Misbehaviour::FilterRange {
                command,
                start_height,
                stop_height,
                max,
            }));
        }
        Ok(Some(stop_height))
    }

    fn filters_advertised(&self, command: &'static str) -> bool {
        let ok = self.our_services.has(ServiceFlags::COMPACT_FILTERS);
        if !ok {
            debug!(peer = %self.addr, command, "filter request while NODE_COMPACT_FILTERS not advertised; ignored");
        }
        ok
    }

    async fn on_getcfilters(&mut self, req: GetCFilters) -> Result<(), Disconnect> {
        if !self.filters_advertised("getcfilters") {
            return Ok(());
        }
        let stop = req.stop_hash;
        if self
            .check_filter_request(
                "getcfilters",
                req.filter_type,
                req.start_height,
                &stop,
                MAX_GETCFILTERS,
            )?
            .is_none()
        {
            return Ok(());
        }
        let b = self.backend();
        let start = req.start_height;
        match blocking(move || b.cfilters(start, stop)).await {
            Some(Ok(filters)) => {
                let msgs = filters
                    .into_iter()
                    .map(|(block_hash, filter)| {
                        NetworkMessage::CFilter(CFilter {
                            filter_type: 0,
                            block_hash,
                            filter,
                        })
                    })
                    .collect();
                self.send_all(msgs).await
            }
            Some(Err(e)) => self.filter_error("getcfilters", e),
            None => Ok(()),
        }
    }

    async fn on_getcfheaders(&mut self, req: GetCFHeaders) -> Result<(), Disconnect> {
        if !self.filters_advertised("getcfheaders") {
            return Ok(());
        }
        let stop = req.stop_hash;
        if self
            .check_filter_request(
                "getcfheaders",
                req.filter_type,
                req.start_height,
                &stop,
                MAX_GETCFHEADERS,
            )?
            .is_none()
        {
            return Ok(());
        }
        let b = self.backend();
        let start = req.start_height;
        match blocking(move || b.cfheaders(start, stop)).await {
            Some(Ok((previous_filter_header, filter_hashes))) => {
                self.send(NetworkMessage::CFHeaders(CFHeaders {
                    filter_type: 0,
                    stop_hash: stop,
                    previous_filter_header,
                    filter_hashes,
                }))
                .await
            }
            Some(Err(e)) => self.filter_error("getcfheaders", e),
            None => Ok(()),
        }
    }

    async fn on_getcfcheckpt(&mut self, req: GetCFCheckpt) -> Result<(), Disconnect> {
        if !self.filters_advertised("getcfcheckpt") {
            return Ok(());
        }
        if req.filter_type != 0 {
            return Err(misbehaving(Misbehaviour::FilterType {
                command: "getcfcheckpt",
                filter_type: req.filter_type,
            }));
        }
        let stop = req.stop_hash;
        if self.net.backend.block_height(&stop).is_none() {
            debug!(peer = %self.addr, stop = %stop, "getcfcheckpt: unknown stop hash; ignored");
            return Ok(());
        }
        let b = self.backend();
        match blocking(move || b.cfcheckpt(stop)).await {
            Some(Ok(filter_headers)) => {
                self.send(NetworkMessage::CFCheckpt(CFCheckpt {
                    filter_type: 0,
                    stop_hash: stop,
                    filter_headers,
                }))
                .await
            }
            Some(Err(e)) => self.filter_error("getcfcheckpt", e),
            None => Ok(()),
        }
    }

    fn filter_error(&self, command: &'static str, e: FilterQueryError) -> Result<(), Disconnect> {
        match e {
            FilterQueryError::StartAboveStop {
                start_height,
                stop_height,
            } => Err(misbehaving(Misbehaviour::FilterRange {
                command,
                start_height,
                stop_height,
                max: 0,
            })),
            other => {
                debug!(peer = %self.addr, command, error = %other, "filter request not answered");
                Ok(())
            }
        }
    }

    async fn on_getaddr(&mut self) -> Result<(), Disconnect> {
        // Answered once per connection, to inbound peers only (Core).
        if !self.inbound || self.sent_getaddr_answer {
            return Ok(());
        }
        self.sent_getaddr_answer = true;
        let entries = self.net.addrs.lock().sample(codec::MAX_ADDR as usize);
        if entries.is_empty() {
            return Ok(());
        }
        if self.addrv2 {
            let list = entries
                .into_iter()
                .map(|e| AddrV2Message {
                    time: e.last_seen,
                    services: ServiceFlags::from(e.services),
                    addr: match e.addr.ip() {
                        std::net::IpAddr::V4(ip) => AddrV2::Ipv4(ip),
                        std::net::IpAddr::V6(ip) => AddrV2::Ipv6(ip),
                    },
                    port: e.addr.port(),
                })
                .collect();
            self.send(NetworkMessage::AddrV2(list)).await
        } else {
            let list = entries
                .into_iter()
                .map(|e| {
                    (
                        e.last_seen,
                        Address::new(&e.addr, ServiceFlags::from(e.services)),
                    )
                })
                .collect();
            self.send(NetworkMessage::Addr(list)).await
        }
    }
}

/// Serialization of a block without witness data (for `MSG_BLOCK`
/// requests). `None` when the stored bytes do not parse.
fn strip_witness(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut block: Block = deserialize(bytes).ok()?;
    for tx in &mut block.txdata {
        for input in &mut tx.input {
            input.witness.clear();
        }
    }
    Some(serialize(&block))
}
