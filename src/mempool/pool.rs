//! The pool's contents: entries by txid and wtxid, which mempool
//! transaction spends each outpoint, entries by scriptPubKey and by entry
//! order; ancestors and descendants found by walking inputs and spenders
//! (Core's `CTxMemPool` maps, without its cached ancestor state).
//!
//! Every map is a persistent structure (`imbl`): cloning a [`Pool`] is
//! O(1), so readers get an immutable copy ([`super::MempoolSnapshot`])
//! after every change while the one writer goes on.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use bitcoin::{BlockHash, OutPoint, Txid, Wtxid};

use super::entry::MempoolEntry;
use crate::primitives::script_hash;

/// The mempool's transactions and indexes. See the module docs.
#[derive(Clone, Default)]
pub struct Pool {
    entries: imbl::HashMap<Txid, Arc<MempoolEntry>>,
    by_wtxid: imbl::HashMap<Wtxid, Txid>,
    /// Outpoint → the mempool transaction spending it (Core's `mapNextTx`).
    spenders: imbl::HashMap<OutPoint, Txid>,
    /// SHA256 of a scriptPubKey (Electrum's script hash, unreversed) →
    /// entries that pay to it or spend from it, by entry sequence.
    by_script: imbl::HashMap<[u8; 32], imbl::OrdSet<(u64, Txid)>>,
    /// Entry sequence → txid: the order transactions entered.
    order: imbl::OrdMap<u64, Txid>,
    /// (entry time, txid), for expiry (Core's `entry_time` index).
    by_time: imbl::OrdSet<(u64, Txid)>,
    totals: Totals,
    next_sequence: u64,
    /// The chain tip the pool is consistent with.
    tip: Option<BlockHash>,
}

/// Sums over the pool's entries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Number of transactions.
    pub count: u64,
    /// Sum of virtual sizes, vbytes.
    pub vsize: u64,
    /// Sum of serialized sizes, bytes.
    pub size: u64,
    /// Sum of fees, sats.
    pub fees: u64,
    /// Accounted memory ([`MempoolEntry::usage`]), bytes.
    pub usage: u64,
}

impl Pool {
    /// The entry of `txid`.
    pub fn get(&self, txid: &Txid) -> Option<&Arc<MempoolEntry>> {
        self.entries.get(txid)
    }

    /// The entry whose wtxid is `wtxid`.
    pub fn get_by_wtxid(&self, wtxid: &Wtxid) -> Option<&Arc<MempoolEntry>> {
        self.by_wtxid.get(wtxid).and_then(|t| self.entries.get(t))
    }

    /// Whether `txid` is in the pool.
    pub fn contains(&self, txid: &Txid) -> bool {
        self.entries.contains_key(txid)
    }

    /// The mempool transaction spending `outpoint`, if any.
    pub fn spender(&self, outpoint: &OutPoint) -> Option<Txid> {
        self.spenders.get(outpoint).copied()
    }

    /// Sums over the entries.
    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// Number of transactions.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the pool is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The chain tip the pool was last brought up to date with.
    pub fn tip(&self) -> Option<BlockHash> {
        self.tip
    }

    pub(super) fn set_tip(&mut self, tip: BlockHash) {
        self.tip = Some(tip);
    }

    /// The sequence number the next entry gets (Core's
    /// `GetSequence`-like counter, for `mempool_sequence`).
    pub fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    /// Entries in the order they entered (oldest first).
    pub fn iter_by_entry(&self) -> impl DoubleEndedIterator<Item = &Arc<MempoolEntry>> + '_ {
        self.order.values().filter_map(|t| self.entries.get(t))
    }

    /// Entries whose entry sequence is at least `sequence`, in entry order
    /// (the relay walks the pool from where it stopped).
    pub fn iter_from(&self, sequence: u64) -> impl Iterator<Item = &Arc<MempoolEntry>> + '_ {
        self.order
            .range(sequence..)
            .filter_map(|(_, t)| self.entries.get(t))
    }

    /// Txids of the entries that entered before `cutoff` (seconds since
    /// the UNIX epoch), oldest first.
    pub fn entered_before(&self, cutoff: u64) -> impl Iterator<Item = Txid> + '_ {
        self.by_time
            .iter()
            .take_while(move |(time, _)| *time < cutoff)
            .map(|(_, t)| *t)
    }

    /// Entries that pay to or spend from the scriptPubKey whose SHA256 is
    /// `script_hash`, oldest entry first.
    pub fn by_script_hash(
        &self,
        script_hash: &[u8; 32],
    ) -> impl DoubleEndedIterator<Item = &Arc<MempoolEntry>> + '_ {
        self.by_script
            .get(script_hash)
            .into_iter()
            .flat_map(|set| set.iter())
            .filter_map(|(_, t)| self.entries.get(t))
    }

    /// The in-pool parents of `tx`: mempool transactions whose outputs it
    /// spends.
    pub fn parents_of(&self, tx: &bitcoin::Transaction) -> BTreeSet<Txid> {
        tx.input
            .iter()
            .map(|i| i.previous_output.txid)
            .filter(|t| self.entries.contains_key(t))
            .collect()
    }

    /// The in-pool children of `txid`: mempool transactions spending its
    /// outputs.
    pub fn children_of(&self, txid: &Txid) -> BTreeSet<Txid> {
        let Some(e) = self.entries.get(txid) else {
            return BTreeSet::new();
        };
        (0..e.tx.output.len() as u32)
            .filter_map(|vout| self.spenders.get(&OutPoint { txid: *txid, vout }).copied())
            .collect()
    }

    /// Every in-pool ancestor of a transaction whose in-pool parents are
    /// `parents` (the parents included).
    pub fn ancestors_from(&self, parents: BTreeSet<Txid>) -> BTreeSet<Txid> {
        self.walk(parents, |t| {
            self.entries
                .get(t)
                .map(|e| self.parents_of(&e.tx))
                .unwrap_or_default()
        })
    }

    /// Every in-pool ancestor of `txid` (itself excluded).
    pub fn ancestors(&self, txid: &Txid) -> BTreeSet<Txid> {
        match self.entries.get(txid) {
            Some(e) => self.ancestors_from(self.parents_of(&e.tx)),
            None => BTreeSet::new(),
        }
    }

    /// Every in-pool descendant of `txid` (itself excluded).
    pub fn descendants(&self, txid: &Txid) -> BTreeSet<Txid> {
        self.walk(self.children_of(txid), |t| self.children_of(t))
    }

    /// The closure of `start` under `next`.
    fn walk(
        &self,
        start: BTreeSet<Txid>,
        next: impl Fn(&Txid) -> BTreeSet<Txid>,
    ) -> BTreeSet<Txid> {
        let mut seen = start.clone();
        let mut queue: VecDeque<Txid> = start.into_iter().collect();
        while let Some(t) = queue.pop_front() {
            for n in next(&t) {
                if seen.insert(n) {
                    queue.push_back(n);
                }
            }
        }
        seen
    }

    /// Sum of vsizes (vbytes) and fees (sats) of `txids`.
    pub fn sum_of(&self, txids: &BTreeSet<Txid>) -> (u64, u64) {
        txids
            .iter()
            .filter_map(|t| self.entries.get(t))
            .fold((0, 0), |(v, f), e| (v + e.vsize, f + e.fee))
    }

    /// Adds `entry`, giving it the next sequence number. The caller has
    /// removed every transaction it conflicts with.
    pub(super) fn insert(&mut self, mut entry: MempoolEntry) -> Arc<MempoolEntry> {
        entry.sequence = self.next_sequence;
        self.next_sequence += 1;
        let entry = Arc::new(entry);
        let txid = entry.txid;
        for input in &entry.tx.input {
            self.spenders.insert(input.previous_output, txid);
        }
        for script in scripts_of(&entry) {
            self.by_script
                .entry(script)
                .or_default()
                .insert((entry.sequence, txid));
        }
        self.by_wtxid.insert(entry.wtxid, txid);
        self.order.insert(entry.sequence, txid);
        self.by_time.insert((entry.time, txid));
        let t = &mut self.totals;
        t.count += 1;
        t.vsize += entry.vsize;
        t.size += entry.size;
        t.fees += entry.fee;
        t.usage += entry.usage();
        self.entries.insert(txid, entry.clone());
        entry
    }

    /// Sets the entry time of `txid` (seconds since the UNIX epoch),
    /// keeping its place in the entry order.
    pub(super) fn set_time(&mut self, txid: &Txid, time: u64) {
        if let Some(e) = self.entries.get_mut(txid) {
            self.by_time.remove(&(e.time, *txid));
            self.by_time.insert((time, *txid));
            Arc::make_mut(e).time = time;
        }
    }

    /// Removes `txid` alone (its descendants stay: the caller removes them
    /// too, or they were confirmed with it).
    pub(super) fn remove(&mut self, txid: &Txid) -> Option<Arc<MempoolEntry>> {
        let entry = self.entries.remove(txid)?;
        for input in &entry.tx.input {
            if self.spenders.get(&input.previous_output) == Some(txid) {
                self.spenders.remove(&input.previous_output);
            }
        }
        for script in scripts_of(&entry) {
            if let Some(set) = self.by_script.get_mut(&script) {
                set.remove(&(entry.sequence, *txid));
                if set.is_empty() {
                    self.by_script.remove(&script);
                }
            }
        }
        self.by_wtxid.remove(&entry.wtxid);
        self.order.remove(&entry.sequence);
        self.by_time.remove(&(entry.time, *txid));
        let t = &mut self.totals;
        t.count -= 1;
        t.vsize -= entry.vsize;
        t.size -= entry.size;
        t.fees -= entry.fee;
        t.usage -= entry.usage();
        Some(entry)
    }

    /// Removes `txid` and all its descendants; returns what was removed,
    /// `txid` first.
    pub(super) fn remove_with_descendants(&mut self, txid: &Txid) -> Vec<Arc<MempoolEntry>> {
        let mut order = vec![*txid];
        order.extend(self.descendants(txid));
        order.iter().filter_map(|t| self.remove(t)).collect()
    }
}

/// The script hashes an entry is indexed under: every output's
/// scriptPubKey and every spent output's, once each.
fn scripts_of(entry: &MempoolEntry) -> BTreeSet<[u8; 32]> {
    entry
        .tx
        .output
        .iter()
        .chain(entry.prevouts.iter())
        .map(|o| script_hash(o.script_pubkey.as_bytes()))
        .collect()
}
