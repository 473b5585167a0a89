//! The summary [`super::p2p_backend::NodeP2p`]'s cheap methods read: the
//! best header chain, its locator, the blocks to download, and whether
//! the filter index and the archive are ready; refreshed from the writer's [`Progress`] (and, for the archive,
//! the latest [`ChainSnapshot`]) when they changed.

use std::collections::VecDeque;

use bitcoin::hashes::Hash;
use bitcoin::pow::Work;
use bitcoin::BlockHash;

use crate::chain::index::{BlockStatus, ChainIndex, IndexEntry};
use crate::p2p::DOWNLOAD_WINDOW;
use crate::primitives::BlockId;
use crate::snapshot::{ChainSnapshot, Progress};

/// Most hashes remembered as "body arrived mutated" (oldest forgotten
/// first). Each one cost its sender a discouragement.
pub const MUTATED_MEMORY: usize = 64;

/// The summary the cheap backend methods read (see the module docs).
pub(super) struct View {
    /// (index length, tip id, blocks connected, blocks rejected, the
    /// readers' snapshot's tip id) at the last refresh.
    pub(super) key: Option<(usize, u32, u64, u64, u32)>,
    /// Index entries already folded into `best`.
    pub(super) scanned: usize,
    pub(super) rejected_seen: u64,
    /// The most-work non-invalid header; among equal work the first seen,
    /// unless its body arrived mutated and another's did not (below).
    pub(super) best: Option<(BlockId, Work)>,
    /// Headers whose body arrived mutated (bad merkle root, witness
    /// commitment, CVE-2012-2459 duplicates) and that stayed headers-only,
    /// as in Core: at most [`MUTATED_MEMORY`], oldest first. They lose ties
    /// for `best`, so the download plan follows an equal-work competitor
    /// instead of a block no honest peer may have.
    pub(super) mutated: VecDeque<BlockHash>,
    /// The chain ending at `best`, by height: (id, hash).
    pub(super) header_chain: Vec<(BlockId, BlockHash)>,
    pub(super) tip: (u32, BlockHash),
    pub(super) locator: Vec<BlockHash>,
    /// Missing blocks of the best header chain above the fork with the
    /// active chain, ≤ 1,024 heights above the tip, in chain order.
    pub(super) fetch: Vec<BlockHash>,
    pub(super) synced: bool,
    /// Whether the archive may be advertised, at the last refresh.
    pub(super) archive_ready: bool,
}

impl Default for View {
    fn default() -> Self {
        View {
            key: None,
            scanned: 0,
            rejected_seen: 0,
            best: None,
            mutated: VecDeque::new(),
            header_chain: Vec::new(),
            tip: (0, BlockHash::all_zeros()),
            locator: Vec::new(),
            fetch: Vec::new(),
            synced: false,
            archive_ready: false,
        }
    }
}

impl View {
    /// Brings the view up to the writer's `progress` (what to fetch next
    /// follows the blocks the writer has, durable or not: while catching
    /// up they are made durable in groups); `cs`, the readers' snapshot,
    /// tells whether archive proofs can be served.
    pub(super) fn refresh(&mut self, progress: &Progress, cs: &ChainSnapshot, force: bool) {
        let index = &progress.index;
        let stats = &progress.stats;
        let key = (
            index.len(),
            index.tip().id.0,
            stats.blocks_connected,
            stats.blocks_rejected,
            cs.index().tip().id.0,
        );
        if !force && self.key == Some(key) {
            return;
        }
        self.key = Some(key);
        // A rejection may have invalidated the best header: rescan all.
        if self.best.is_none() || stats.blocks_rejected != self.rejected_seen {
            self.best = None;
            for e in index.entries() {
                self.consider(index, e);
            }
            self.rejected_seen = stats.blocks_rejected;
        } else {
            for e in index.entries_from(self.scanned) {
                self.consider(index, e);
            }
        }
        self.scanned = index.len();
        let tip = index.tip();
        self.tip = (tip.height, tip.hash);
        let best = self.best.map(|b| b.0).unwrap_or(tip.id);
        self.update_header_chain(index, best);
        self.locator = locator(&self.header_chain);
        // Fork of the best header chain with the active chain.
        let best_height = self.header_chain.len().saturating_sub(1) as u32;
        let mut fork = tip.height.min(best_height);
        while fork > 0
            && index.active_at(fork).map(|e| e.id) != Some(self.header_chain[fork as usize].0)
        {
            fork -= 1;
        }
        let end = best_height.min(tip.height.saturating_add(DOWNLOAD_WINDOW as u32));
        self.fetch.clear();
        for h in fork + 1..=end {
            let (id, hash) = self.header_chain[h as usize];
            if index
                .get(id)
                .is_some_and(|e| e.status == BlockStatus::HeadersOnly)
            {
                self.fetch.push(hash);
            }
        }
        // The filter index is built at connect time, so it is complete up to
        // the tip; it has "caught up" when no downloaded block of the best
        // header chain waits to be connected (the tip is the best fully
        // downloaded block).
        self.synced = match self.header_chain.get(fork as usize + 1) {
            None => true,
            Some((id, _)) => !index.get(*id).is_some_and(|e| e.status.has_data()),
        };
        self.archive_ready = super::p2p_archive::ready(cs, best_height);
    }

    /// Makes `e` the best header if it has more work, or equal work and the
    /// current best's body arrived mutated while `e`'s did not.
    fn consider(&mut self, index: &ChainIndex, e: &IndexEntry) {
        if e.status.is_invalid() {
            return;
        }
        let better = match self.best {
            None => true,
            Some((_, w)) if e.chainwork > w => true,
            Some((id, w)) if e.chainwork == w && !self.mutated.is_empty() => {
                let best_mutated = index
                    .get(id)
                    .is_some_and(|b| self.mutated.contains(&b.hash));
                best_mutated && !self.mutated.contains(&e.hash)
            }
            Some(_) => false,
        };
        if better {
            self.best = Some((e.id, e.chainwork));
        }
    }

    /// Remembers that `hash`'s body arrived mutated (or forgets it, when a
    /// valid body was stored).
    pub(super) fn note_mutated(&mut self, hash: BlockHash, mutated: bool) {
        self.mutated.retain(|h| *h != hash);
        if mutated {
            if self.mutated.len() == MUTATED_MEMORY {
                self.mutated.pop_front();
            }
            self.mutated.push_back(hash);
        }
        // Re-choose the best header from scratch at the next refresh.
        self.best = None;
    }

    /// Rewrites `header_chain` to end at `best` (O(reorg depth)).
    fn update_header_chain(&mut self, index: &ChainIndex, best: BlockId) {
        let mut branch = Vec::new();
        let mut cur = index.get(best);
        while let Some(e) = cur {
            if self.header_chain.get(e.height as usize).map(|x| x.0) == Some(e.id) {
                break;
            }
            branch.push((e.id, e.hash));
            cur = e.prev.and_then(|p| index.get(p));
        }
        let keep = match cur {
            Some(e) => e.height as usize + 1,
            None => 0,
        };
        self.header_chain.truncate(keep);
        self.header_chain.extend(branch.into_iter().rev());
        let best_height = index.get(best).map(|e| e.height as usize).unwrap_or(0);
        self.header_chain.truncate(best_height + 1);
    }
}

/// Core's `LocatorEntries` over a chain given by height.
fn locator(chain: &[(BlockId, BlockHash)]) -> Vec<BlockHash> {
    let mut out = Vec::new();
    let mut height = chain.len() as i64 - 1;
    let mut step = 1i64;
    while height >= 0 {
        out.push(chain[height as usize].1);
        if out.len() >= 10 {
            step *= 2;
        }
        height -= step;
    }
    if let Some(g) = chain.first() {
        if out.last() != Some(&g.1) {
            out.push(g.1);
        }
    }
    out
}

/// The ids from `start_height` to `stop` on `stop`'s branch, in height
/// order (walks back to the active chain, then reads it).
pub(super) fn branch_ids(index: &ChainIndex, start_height: u32, stop: BlockId) -> Vec<BlockId> {
    let mut rev = Vec::new();
    let mut cur = index.get(stop);
    while let Some(e) = cur {
        if e.height < start_height {
            break;
        }
        if index.is_active(e.id) {
            for h in (start_height..=e.height).rev() {
                if let Some(a) = index.active_at(h) {
                    rev.push(a.id);
                }
            }
            break;
        }
        rev.push(e.id);
        cur = e.prev.and_then(|p| index.get(p));
    }
    rev.reverse();
    rev
}
