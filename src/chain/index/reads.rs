//! The reads of the block index ([`ChainIndex`]): lookups by id and hash,
//! the active chain, ancestors, median-time-past, fork points, locators,
//! chain tips and branch views.

use bitcoin::BlockHash;

use super::{BlockStatus, ChainIndex, IndexEntry};
use crate::chain::params::ChainParams;
use crate::primitives::BlockId;
use crate::sozu::{BlockOracle, ChainView};

impl ChainIndex {
    /// The network parameters.
    pub fn params(&self) -> &ChainParams {
        &self.params
    }

    /// Number of blocks in the index (all branches).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Always false: the genesis block is always there.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry of `id`.
    pub fn get(&self, id: BlockId) -> Option<&IndexEntry> {
        self.entries.get(id.0 as usize)
    }

    /// The id of `hash`, if known.
    pub fn id_of(&self, hash: &BlockHash) -> Option<BlockId> {
        self.by_hash.get(hash, self.entries.len())
    }

    /// The entry of `hash`, if known.
    pub fn by_hash(&self, hash: &BlockHash) -> Option<&IndexEntry> {
        self.id_of(hash).and_then(|id| self.get(id))
    }

    /// All entries, in id order.
    pub fn entries(&self) -> impl ExactSizeIterator<Item = &IndexEntry> + '_ {
        self.entries.iter()
    }

    /// The entries from id `start` on, in id order (empty when `start` is
    /// past the end).
    pub fn entries_from(&self, start: usize) -> impl Iterator<Item = &IndexEntry> + '_ {
        (start..self.entries.len()).filter_map(move |i| self.entries.get(i))
    }

    /// The active chain's tip.
    pub fn tip(&self) -> &IndexEntry {
        // invariant: `active` always holds at least genesis, and every id
        // in it is an entry.
        let id = *self
            .active
            .last()
            .expect("invariant: active chain holds genesis");
        &self.entries[id.0 as usize]
    }

    /// The most-work header not known to be invalid, the first seen among
    /// equals (Core's `m_best_header`); its block data may be missing. O(1).
    pub fn best_header(&self) -> &IndexEntry {
        // invariant: `best_header` is always an entry (genesis at least).
        &self.entries[self.best_header.0 as usize]
    }

    /// The active chain's tip height.
    pub fn tip_height(&self) -> u32 {
        (self.active.len() - 1) as u32
    }

    /// The block at `height` on the active chain.
    pub fn active_at(&self, height: u32) -> Option<&IndexEntry> {
        self.active
            .get(height as usize)
            .and_then(|id| self.entries.get(id.0 as usize))
    }

    /// Whether `id` is on the active chain.
    pub fn is_active(&self, id: BlockId) -> bool {
        self.get(id)
            .is_some_and(|e| self.active.get(e.height as usize) == Some(&id))
    }

    /// The ancestor of `id` at `height` (walks parents: O(depth)).
    pub fn ancestor(&self, id: BlockId, height: u32) -> Option<&IndexEntry> {
        let mut e = self.get(id)?;
        if height > e.height {
            return None;
        }
        // Fast path: blocks of the active chain.
        if self.is_active(id) {
            return self.active_at(height);
        }
        while e.height > height {
            e = self.get(e.prev?)?;
            if self.is_active(e.id) {
                return self.active_at(height);
            }
        }
        Some(e)
    }

    /// Median of the timestamps of `id` and its 10 predecessors (BIP113's
    /// median-time-past of the chain ending at `id`).
    pub fn median_time_past(&self, id: BlockId) -> u32 {
        let mut times = Vec::with_capacity(11);
        let mut cur = self.get(id);
        while let Some(e) = cur {
            times.push(e.header.time);
            if times.len() == 11 {
                break;
            }
            cur = e.prev.and_then(|p| self.get(p));
        }
        times.sort_unstable();
        times.get(times.len() / 2).copied().unwrap_or(0)
    }

    /// The last common block of `a`'s chain and `b`'s chain.
    pub fn fork_point(&self, a: BlockId, b: BlockId) -> Option<BlockId> {
        let (mut x, mut y) = (self.get(a)?, self.get(b)?);
        while x.height > y.height {
            x = self.get(x.prev?)?;
        }
        while y.height > x.height {
            y = self.get(y.prev?)?;
        }
        while x.id != y.id {
            x = self.get(x.prev?)?;
            y = self.get(y.prev?)?;
        }
        Some(x.id)
    }

    /// The blocks after `ancestor` up to `tip`, in chain order.
    pub fn path_from(&self, ancestor: BlockId, tip: BlockId) -> Vec<BlockId> {
        let mut out = Vec::new();
        let mut cur = self.get(tip);
        while let Some(e) = cur {
            if e.id == ancestor {
                break;
            }
            out.push(e.id);
            cur = e.prev.and_then(|p| self.get(p));
        }
        out.reverse();
        out
    }

    /// A block locator for the active chain (Core's `LocatorEntries`): the
    /// last 10 blocks, then exponentially sparser, ending at genesis; at most
    /// 101 entries would be allowed, this yields about 10 + log2(height).
    pub fn locator(&self) -> Vec<BlockHash> {
        let mut out = Vec::new();
        let mut height = i64::from(self.tip_height());
        let mut step = 1i64;
        while height >= 0 {
            if let Some(e) = self.active_at(height as u32) {
                out.push(e.hash);
            }
            if out.len() >= 10 {
                step *= 2;
            }
            height -= step;
        }
        if out.last() != Some(&self.params.genesis_hash()) {
            out.push(self.params.genesis_hash());
        }
        out
    }

    /// Every chain tip (a block with no child): the active tip and every
    /// other leaf, with its fork point's height on the active chain.
    pub fn tips(&self) -> Vec<ChainTip> {
        let mut has_child = vec![false; self.entries.len()];
        for e in &self.entries {
            if let Some(p) = e.prev {
                has_child[p.0 as usize] = true;
            }
        }
        let tip = self.tip().id;
        let mut out = Vec::new();
        for e in &self.entries {
            if has_child[e.id.0 as usize] && e.id != tip {
                continue;
            }
            let fork = self.fork_point(e.id, tip).and_then(|f| self.get(f));
            let branch_len = fork.map(|f| e.height - f.height).unwrap_or(0);
            let status = if e.id == tip {
                TipStatus::Active
            } else if e.status.is_invalid() {
                TipStatus::Invalid
            } else if e.status == BlockStatus::Valid {
                TipStatus::ValidFork
            } else if e.status == BlockStatus::HaveData {
                TipStatus::ValidHeaders
            } else {
                TipStatus::HeadersOnly
            };
            out.push(ChainTip {
                height: e.height,
                hash: e.hash,
                branch_len,
                status,
            });
        }
        out.sort_by(|a, b| b.height.cmp(&a.height).then(a.hash.cmp(&b.hash)));
        out
    }

    /// A view of the branch ending at `tip`.
    pub fn view(&self, tip: BlockId) -> BranchView<'_> {
        BranchView { index: self, tip }
    }
}

/// One entry of [`ChainIndex::tips`] (Core's `getchaintips`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ChainTip {
    /// Height of the tip.
    pub height: u32,
    /// Hash of the tip.
    pub hash: BlockHash,
    /// Blocks between the tip and the active chain (0 for the active tip).
    pub branch_len: u32,
    /// Core's status string.
    pub status: TipStatus,
}

/// Status of a chain tip, with Core's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TipStatus {
    /// The active tip.
    Active,
    /// A fully validated branch not on the active chain.
    ValidFork,
    /// Data stored but not validated.
    ValidHeaders,
    /// Only the headers are known.
    HeadersOnly,
    /// The branch contains an invalid block.
    Invalid,
}

/// The branch ending at one tip, as a [`ChainView`] and a
/// [`BlockOracle`]-style height lookup. Membership is O(1) for blocks of
/// the active chain below the fork point, O(branch length) otherwise.
#[derive(Clone, Copy)]
pub struct BranchView<'a> {
    index: &'a ChainIndex,
    tip: BlockId,
}

impl BranchView<'_> {
    /// The view's tip.
    pub fn tip(&self) -> BlockId {
        self.tip
    }
}

impl ChainView for BranchView<'_> {
    fn contains(&self, block: BlockId) -> bool {
        let Some(e) = self.index.get(block) else {
            return false;
        };
        self.index
            .ancestor(self.tip, e.height)
            .is_some_and(|a| a.id == block)
    }
}

/// The active chain as seen by the UTXO table's purge rules.
impl BlockOracle for ChainIndex {
    fn best_height(&self, block: BlockId) -> Option<u32> {
        self.is_active(block)
            .then(|| self.entries[block.0 as usize].height)
    }

    fn height(&self, block: BlockId) -> Option<u32> {
        self.get(block).map(|e| e.height)
    }

    fn tip_height(&self) -> u32 {
        ChainIndex::tip_height(self)
    }
}
