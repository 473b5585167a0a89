//! State shared by the connection manager (`super::net`) and every peer
//! task (`super::peer`): the registry of connected peers with each one's
//! command channel, the ban list, the address book, the block download
//! scheduler, the header-sync slot, recent relayed transactions and our
//! `version` nonces.
//!
//! Neither side imports the other: a peer task reaches the manager only
//! through this state and its own command channel ([`PeerCmd`]), as kyoto's
//! `Peer` talks to its manager over channels. The locks are `parking_lot`
//! mutexes (no poisoning); each is held for one bookkeeping step, never
//! across an `.await`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hasher;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bitcoin::p2p::Magic;
use bitcoin::Transaction;
use parking_lot::Mutex;
use siphasher::sip::SipHasher13;
use tokio::sync::mpsc;
use tracing::warn;

use super::addrman::{AddrBook, BanList};
use super::misbehaviour::Disconnect;
use super::sync::{PeerId, Scheduler};
use super::txdownload::TxDownload;
use super::{HandleShared, NodeBackend, P2pConfig, P2pError, PeerInfo};

/// Commands from the network to a peer task.
pub(crate) enum PeerCmd {
    AnnounceTip,
    RelayTx(Arc<Transaction>),
    Disconnect(Disconnect),
    Shutdown,
}

/// A connected peer as the manager sees it.
pub(crate) struct PeerEntry {
    pub addr: SocketAddr,
    pub inbound: bool,
    pub manual: bool,
    pub tx: mpsc::Sender<PeerCmd>,
    /// When the connection was registered (eviction: uptime).
    pub connected_at: Instant,
    /// Best ping round trip seen (eviction: lowest pings are protected).
    pub min_ping: Option<Duration>,
    /// When the peer last gave us a block that moved our tip (eviction:
    /// protected).
    pub last_block: Option<Instant>,
}

/// Unpredictable 64-bit values (`version` and `ping` nonces, the address
/// book's selection seed): SipHash-1-3 of a counter under a 128-bit key
/// drawn once from the OS when the P2P layer starts.
pub(crate) struct Nonces {
    key: (u64, u64),
    counter: AtomicU64,
}

impl Nonces {
    /// Draws the key from the OS.
    ///
    /// # Errors
    /// [`P2pError::Entropy`] when the OS has no randomness to give.
    pub fn from_os() -> Result<Self, P2pError> {
        let (mut k0, mut k1) = ([0u8; 8], [0u8; 8]);
        for half in [&mut k0, &mut k1] {
            getrandom::getrandom(half).map_err(|source| P2pError::Entropy { source })?;
        }
        Ok(Nonces {
            key: (u64::from_le_bytes(k0), u64::from_le_bytes(k1)),
            counter: AtomicU64::new(0),
        })
    }

    /// The next value (never repeats within a process: distinct counters).
    pub fn next(&self) -> u64 {
        let mut h = SipHasher13::new_with_keys(self.key.0, self.key.1);
        h.write_u64(self.counter.fetch_add(1, Ordering::Relaxed));
        h.finish()
    }
}

/// State shared by the connection manager and every peer task.
pub(crate) struct Net {
    pub backend: Arc<dyn NodeBackend>,
    pub config: P2pConfig,
    pub magic: Magic,
    pub peers: Mutex<HashMap<PeerId, PeerEntry>>,
    pub addrs: Mutex<AddrBook>,
    pub sched: Mutex<Scheduler>,
    /// The peer doing the initial header sync, with the time of its last
    /// progress.
    pub header_sync: Mutex<Option<(PeerId, Instant)>>,
    pub recent_txs: Mutex<VecDeque<Arc<Transaction>>>,
    /// Transaction announcements, requests, recent rejects and orphans.
    pub txdownload: Mutex<TxDownload>,
    /// The next `inv` trickle of every inbound peer (Core's
    /// `m_next_inv_to_inbounds`: one timer, so that inbound peers cannot
    /// tell apart when we learned of a transaction).
    next_inv_to_inbounds: Mutex<Option<Instant>>,
    /// Nonces of our outbound `version` messages (self-connection check).
    pub our_nonces: Mutex<HashSet<u64>>,
    pub nonces: Nonces,
    pub shared: Arc<HandleShared>,
    /// Set once the tip has reached the best header (end of the initial
    /// download); latches.
    pub caught_up: AtomicBool,
    next_id: AtomicU64,
}

impl Net {
    /// The shared state at start: the address book loaded from
    /// [`P2pConfig::addr_file`] (an unreadable file starts an empty book,
    /// logged), no peers.
    ///
    /// # Errors
    /// [`P2pError::Entropy`] (see [`Nonces::from_os`]).
    pub fn new(
        backend: Arc<dyn NodeBackend>,
        config: P2pConfig,
        shared: Arc<HandleShared>,
    ) -> Result<Self, P2pError> {
        let magic = Magic::from_bytes(backend.params().magic());
        let nonces = Nonces::from_os()?;
        let seed = nonces.next();
        let book = match &config.addr_file {
            Some(path) => AddrBook::load(path, seed).unwrap_or_else(|e| {
                warn!(path = %path.display(), error = %e, "address book unreadable; starting empty");
                AddrBook::new(seed)
            }),
            None => AddrBook::new(seed),
        };
        let sched = Scheduler::new(config.timeouts.stall_base, config.timeouts.stall_max);
        Ok(Net {
            backend,
            magic,
            peers: Mutex::new(HashMap::new()),
            addrs: Mutex::new(book),
            sched: Mutex::new(sched),
            header_sync: Mutex::new(None),
            recent_txs: Mutex::new(VecDeque::new()),
            txdownload: Mutex::new(TxDownload::default()),
            next_inv_to_inbounds: Mutex::new(None),
            our_nonces: Mutex::new(HashSet::new()),
            nonces,
            shared,
            caught_up: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            config,
        })
    }

    /// The ban list (kept in the handle's shared part, which lists it).
    pub fn bans(&self) -> parking_lot::MutexGuard<'_, BanList> {
        self.shared.bans.lock()
    }

    pub fn is_banned(&self, ip: IpAddr) -> bool {
        self.bans().is_banned(ip)
    }

    pub fn ban(&self, ip: IpAddr) {
        self.bans().ban(ip, self.config.ban_duration);
    }

    /// Adds a peer to the registry and to the handle's list; returns its id
    /// and the receiving end of its command channel.
    pub fn register(
        &self,
        addr: SocketAddr,
        inbound: bool,
        manual: bool,
    ) -> (PeerId, mpsc::Receiver<PeerCmd>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(64);
        self.peers.lock().insert(
            id,
            PeerEntry {
                addr,
                inbound,
                manual,
                tx,
                connected_at: Instant::now(),
                min_ping: None,
                last_block: None,
            },
        );
        self.shared.peers.lock().insert(
            id,
            PeerInfo {
                id,
                addr,
                inbound,
                services: 0,
                user_agent: String::new(),
                start_height: 0,
            },
        );
        (id, rx)
    }

    pub fn unregister(&self, id: PeerId) {
        self.peers.lock().remove(&id);
        self.shared.peers.lock().remove(&id);
        self.sched.lock().release_peer(id);
        self.txdownload.lock().disconnected(id);
        let mut hs = self.header_sync.lock();
        if matches!(*hs, Some((p, _)) if p == id) {
            *hs = None;
        }
    }

    /// Sends `cmd` to every peer (dropped for a peer whose queue is full).
    pub fn broadcast(&self, cmd: impl Fn() -> PeerCmd) {
        for e in self.peers.lock().values() {
            let _ = e.tx.try_send(cmd());
        }
    }

    /// The next inbound trickle: the shared time, moved `rand_exp(mean)`
    /// past `now` once it has passed (Core's `NextInvToInbounds`).
    pub fn next_inv_to_inbounds(&self, now: Instant, mean: Duration) -> Instant {
        let mut next = self.next_inv_to_inbounds.lock();
        match *next {
            Some(t) if t > now => t,
            _ => {
                let t = now + super::peer::relay::rand_exp(mean, self.nonces.next());
                *next = Some(t);
                t
            }
        }
    }

    /// Records a ping round trip of peer `id`.
    pub fn note_ping(&self, id: PeerId, rtt: Duration) {
        if let Some(e) = self.peers.lock().get_mut(&id) {
            e.min_ping = Some(e.min_ping.map_or(rtt, |m| m.min(rtt)));
        }
    }

    /// Records that peer `id` gave us a block that moved our tip.
    pub fn note_block(&self, id: PeerId) {
        if let Some(e) = self.peers.lock().get_mut(&id) {
            e.last_block = Some(Instant::now());
        }
    }

    pub fn send_to(&self, id: PeerId, cmd: PeerCmd) {
        if let Some(e) = self.peers.lock().get(&id) {
            let _ = e.tx.try_send(cmd);
        }
    }

    /// (inbound, outbound) peers connected.
    pub fn counts(&self) -> (usize, usize) {
        let peers = self.peers.lock();
        let inbound = peers.values().filter(|e| e.inbound).count();
        (inbound, peers.len() - inbound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_differ_and_depend_on_the_key() {
        let a = Nonces::from_os().unwrap();
        let b = Nonces::from_os().unwrap();
        let xs: HashSet<u64> = (0..1000).map(|_| a.next()).collect();
        assert_eq!(xs.len(), 1000);
        assert_ne!(
            Nonces {
                key: a.key,
                counter: AtomicU64::new(0)
            }
            .next(),
            Nonces {
                key: b.key,
                counter: AtomicU64::new(0)
            }
            .next()
        );
    }
}
