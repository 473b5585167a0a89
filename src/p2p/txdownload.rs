//! What the node knows about transactions it may download, shared by all
//! peer tasks (Bitcoin Core's `TxDownloadManager`, `txdownloadman.h`):
//! the request tracker ([`super::txrequest`]), the recent rejects and the
//! orphan pool.
//!
//! - **Recent rejects** (Core's `m_lazy_recent_rejects`): the hashes of
//!   transactions the mempool refused, at most [`MAX_RECENT_REJECTS`]
//!   (the oldest forgotten first), cleared when the chain tip changes
//!   (a refused transaction may be valid on the new tip). A hash found
//!   there is neither requested nor submitted again.
//! - **Orphans** (Core's `TxOrphanage` as of Core 28): transactions whose
//!   inputs are missing, at most [`MAX_ORPHAN_TRANSACTIONS`] (a random one
//!   evicted beyond), each at most [`MAX_ORPHAN_WEIGHT`] weight units,
//!   kept [`ORPHAN_TX_EXPIRE_TIME`], erased when the peer that sent them
//!   disconnects. When a transaction is accepted, the orphans spending
//!   its outputs are taken out to be submitted again.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bitcoin::{BlockHash, Transaction, Txid, Wtxid};

use super::backend::GenTxid;
use super::sync::PeerId;
use super::txrequest::TxRequestTracker;

/// Hashes remembered as rejected (Core's rolling filter of 120,000).
pub const MAX_RECENT_REJECTS: usize = 120_000;
/// Orphans kept (Core ≤ 28's `DEFAULT_MAX_ORPHAN_TRANSACTIONS`).
pub const MAX_ORPHAN_TRANSACTIONS: usize = 100;
/// Heaviest orphan kept, weight units (Core's `MAX_STANDARD_TX_WEIGHT`).
pub const MAX_ORPHAN_WEIGHT: u64 = 400_000;
/// How long an orphan is kept (Core ≤ 28's `ORPHAN_TX_EXPIRE_TIME`).
pub const ORPHAN_TX_EXPIRE_TIME: Duration = Duration::from_secs(20 * 60);

/// A bounded set of 32-byte hashes forgetting the oldest first.
#[derive(Debug)]
pub(crate) struct BoundedSet {
    set: HashSet<[u8; 32]>,
    order: VecDeque<[u8; 32]>,
    cap: usize,
}

impl BoundedSet {
    /// An empty set holding at most `cap` hashes.
    pub fn new(cap: usize) -> Self {
        BoundedSet {
            set: HashSet::new(),
            order: VecDeque::new(),
            cap,
        }
    }

    /// Adds `h`, forgetting the oldest hash when full.
    pub fn insert(&mut self, h: [u8; 32]) {
        if self.cap == 0 || !self.set.insert(h) {
            return;
        }
        self.order.push_back(h);
        while self.order.len() > self.cap {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    /// Whether `h` is in the set.
    pub fn contains(&self, h: &[u8; 32]) -> bool {
        self.set.contains(h)
    }

    /// Empties the set.
    pub fn clear(&mut self) {
        self.set.clear();
        self.order.clear();
    }
}

struct Orphan {
    tx: Arc<Transaction>,
    txid: Txid,
    from: PeerId,
    expires: Instant,
}

/// The shared download state. See the module docs.
pub(crate) struct TxDownload {
    /// Announcements and requests.
    pub requests: TxRequestTracker,
    rejects: BoundedSet,
    /// The tip `rejects` was filled on.
    rejects_tip: Option<BlockHash>,
    orphans: HashMap<Wtxid, Orphan>,
    /// Parent txid → orphans spending one of its outputs.
    orphans_by_parent: HashMap<Txid, HashSet<Wtxid>>,
}

impl Default for TxDownload {
    fn default() -> Self {
        TxDownload {
            requests: TxRequestTracker::default(),
            rejects: BoundedSet::new(MAX_RECENT_REJECTS),
            rejects_tip: None,
            orphans: HashMap::new(),
            orphans_by_parent: HashMap::new(),
        }
    }
}

impl TxDownload {
    /// Clears the recent rejects when the tip is no longer `tip`'s.
    fn on_tip(&mut self, tip: BlockHash) {
        if self.rejects_tip != Some(tip) {
            self.rejects.clear();
            self.rejects_tip = Some(tip);
        }
    }

    /// Whether `id` was rejected since the tip became `tip`.
    pub fn rejected(&mut self, id: GenTxid, tip: BlockHash) -> bool {
        self.on_tip(tip);
        self.rejects.contains(&id.bytes())
    }

    /// Remembers `id` as rejected on `tip`, and stops asking for it.
    pub fn reject(&mut self, id: GenTxid, tip: BlockHash) {
        self.on_tip(tip);
        self.rejects.insert(id.bytes());
        self.requests.forget(id);
    }

    /// Whether `id` is an orphan kept here.
    pub fn has_orphan(&self, id: GenTxid) -> bool {
        match id {
            GenTxid::Wtxid(w) => self.orphans.contains_key(&w),
            GenTxid::Txid(t) => self.orphans.values().any(|o| o.txid == t),
        }
    }

    /// Number of orphans kept.
    #[cfg(test)]
    pub fn orphan_count(&self) -> usize {
        self.orphans.len()
    }

    /// Keeps `tx` (from `from`) until its parents arrive; false when it is
    /// too heavy or already kept. Expired orphans go first, then a random
    /// one while over [`MAX_ORPHAN_TRANSACTIONS`].
    pub fn add_orphan(&mut self, tx: Arc<Transaction>, from: PeerId, now: Instant) -> bool {
        let wtxid = tx.compute_wtxid();
        if tx.weight().to_wu() > MAX_ORPHAN_WEIGHT || self.orphans.contains_key(&wtxid) {
            return false;
        }
        for input in &tx.input {
            self.orphans_by_parent
                .entry(input.previous_output.txid)
                .or_default()
                .insert(wtxid);
        }
        let txid = tx.compute_txid();
        self.orphans.insert(
            wtxid,
            Orphan {
                tx,
                txid,
                from,
                expires: now + ORPHAN_TX_EXPIRE_TIME,
            },
        );
        self.limit_orphans(now);
        true
    }

    fn limit_orphans(&mut self, now: Instant) {
        let expired: Vec<Wtxid> = self
            .orphans
            .iter()
            .filter(|(_, o)| o.expires <= now)
            .map(|(w, _)| *w)
            .collect();
        for w in expired {
            self.erase_orphan(&w);
        }
        // HashMap iteration order is randomized per process (SipHash with
        // random keys): the first key is an unpredictable victim.
        while self.orphans.len() > MAX_ORPHAN_TRANSACTIONS {
            let Some(w) = self.orphans.keys().next().copied() else {
                break;
            };
            self.erase_orphan(&w);
        }
    }

    fn erase_orphan(&mut self, wtxid: &Wtxid) -> Option<Orphan> {
        let o = self.orphans.remove(wtxid)?;
        for input in &o.tx.input {
            let parent = input.previous_output.txid;
            if let Some(set) = self.orphans_by_parent.get_mut(&parent) {
                set.remove(wtxid);
                if set.is_empty() {
                    self.orphans_by_parent.remove(&parent);
                }
            }
        }
        Some(o)
    }

    /// Takes out the orphans spending an output of `parent`, with the
    /// peer each came from, to be submitted again.
    pub fn take_children(&mut self, parent: &Txid) -> Vec<(Arc<Transaction>, PeerId)> {
        let wtxids: Vec<Wtxid> = self
            .orphans_by_parent
            .get(parent)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        wtxids
            .iter()
            .filter_map(|w| self.erase_orphan(w))
            .map(|o| (o.tx, o.from))
            .collect()
    }

    /// `peer` is gone: its announcements, requests and orphans go.
    pub fn disconnected(&mut self, peer: PeerId) {
        self.requests.disconnected(peer);
        let mine: Vec<Wtxid> = self
            .orphans
            .iter()
            .filter(|(_, o)| o.from == peer)
            .map(|(w, _)| *w)
            .collect();
        for w in mine {
            self.erase_orphan(&w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::hashes::Hash;
    use bitcoin::{absolute, transaction, Amount, OutPoint, TxIn, TxOut};

    fn tx_spending(parent: Txid, tag: u32) -> Arc<Transaction> {
        Arc::new(Transaction {
            version: transaction::Version::TWO,
            lock_time: absolute::LockTime::from_consensus(tag),
            input: vec![TxIn {
                previous_output: OutPoint {
                    txid: parent,
                    vout: 0,
                },
                ..TxIn::default()
            }],
            output: vec![TxOut {
                value: Amount::from_sat(1),
                script_pubkey: bitcoin::ScriptBuf::new(),
            }],
        })
    }

    #[test]
    fn bounded_set_forgets_the_oldest() {
        let mut s = BoundedSet::new(2);
        s.insert([1; 32]);
        s.insert([2; 32]);
        s.insert([3; 32]);
        assert!(!s.contains(&[1; 32]));
        assert!(s.contains(&[2; 32]) && s.contains(&[3; 32]));
    }

    #[test]
    fn rejects_are_cleared_by_a_new_tip() {
        let mut d = TxDownload::default();
        let id = GenTxid::Wtxid(Wtxid::from_byte_array([5; 32]));
        let (a, b) = (
            BlockHash::from_byte_array([1; 32]),
            BlockHash::from_byte_array([2; 32]),
        );
        d.reject(id, a);
        assert!(d.rejected(id, a));
        assert!(!d.rejected(id, b));
    }

    #[test]
    fn orphans_are_bounded_found_by_parent_and_dropped_with_their_peer() {
        let mut d = TxDownload::default();
        let now = Instant::now();
        let parent = Txid::from_byte_array([9; 32]);
        for i in 0..(MAX_ORPHAN_TRANSACTIONS as u32 + 20) {
            d.add_orphan(tx_spending(parent, i), 1, now);
        }
        assert_eq!(d.orphan_count(), MAX_ORPHAN_TRANSACTIONS);
        d.disconnected(1);
        assert_eq!(d.orphan_count(), 0);
        let child = tx_spending(Txid::from_byte_array([8; 32]), 0);
        assert!(d.add_orphan(child.clone(), 2, now));
        assert!(d.has_orphan(GenTxid::Txid(child.compute_txid())));
        assert!(d.has_orphan(GenTxid::Wtxid(child.compute_wtxid())));
        let got = d.take_children(&Txid::from_byte_array([8; 32]));
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1, 2);
        assert!(!d.has_orphan(GenTxid::Wtxid(child.compute_wtxid())));
        // Expiry.
        d.add_orphan(child.clone(), 2, now);
        d.add_orphan(tx_spending(parent, 1), 2, now + ORPHAN_TX_EXPIRE_TIME);
        assert_eq!(d.orphan_count(), 1);
    }
}
