//! The block index: every accepted header with its [`BlockId`], height,
//! chainwork and status; header checks (proof of work, difficulty
//! retargeting, median-time-past, the 2-hour future limit); the active chain
//! and the list of chain tips.
//!
//! Source: Bitcoin Core `src/validation.cpp` (`ContextualCheckBlockHeader`,
//! `CheckBlockHeader`), `src/pow.cpp` (`GetNextWorkRequired`,
//! `CalculateNextWorkRequired`, BIP94), `src/chain.h` (`CBlockIndex`).

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use parking_lot::RwLock;

use bitcoin::block::Header;
use bitcoin::pow::{CompactTarget, Work};
use bitcoin::BlockHash;

use super::params::ChainParams;
use crate::primitives::BlockId;

/// Validation status of a block in the index.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BlockStatus {
    /// Header accepted; block data not stored.
    HeadersOnly,
    /// Block data stored, not validated yet.
    HaveData,
    /// Block validated and written to the UTXO table (it may be on a stale
    /// branch now).
    Valid,
    /// The block broke a consensus rule.
    Invalid,
    /// An ancestor is invalid.
    InvalidAncestor,
}

impl BlockStatus {
    /// One-byte code used on disk.
    pub fn to_u8(self) -> u8 {
        match self {
            BlockStatus::HeadersOnly => 0,
            BlockStatus::HaveData => 1,
            BlockStatus::Valid => 2,
            BlockStatus::Invalid => 3,
            BlockStatus::InvalidAncestor => 4,
        }
    }

    /// Inverse of [`BlockStatus::to_u8`]; `None` for an unknown code.
    pub fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            0 => BlockStatus::HeadersOnly,
            1 => BlockStatus::HaveData,
            2 => BlockStatus::Valid,
            3 => BlockStatus::Invalid,
            4 => BlockStatus::InvalidAncestor,
            _ => return None,
        })
    }

    /// Whether the block or an ancestor failed validation.
    pub fn is_invalid(self) -> bool {
        matches!(self, BlockStatus::Invalid | BlockStatus::InvalidAncestor)
    }

    /// Whether the block's data is stored (validated or not).
    pub fn has_data(self) -> bool {
        matches!(self, BlockStatus::HaveData | BlockStatus::Valid)
    }
}

/// One block of the index (Core's `CBlockIndex`, without the pointers).
#[derive(Clone, Debug)]
pub struct IndexEntry {
    /// The block's id (its position in the index).
    pub id: BlockId,
    /// Its hash.
    pub hash: BlockHash,
    /// Its 80-byte header.
    pub header: Header,
    /// Its height (genesis = 0).
    pub height: u32,
    /// Cumulative work of the chain ending at this block.
    pub chainwork: Work,
    /// Validation status.
    pub status: BlockStatus,
    /// The parent's id (`None` for genesis).
    pub prev: Option<BlockId>,
}

/// The read side of the block index: every entry by id, hash → id, and the
/// active chain (height → id). Built from persistent structures
/// ([`imbl`]) so a clone costs O(1) and shares everything with the
/// original: the writer's [`BlockIndex`] holds one and publishes clones of
/// it in every [`crate::snapshot::ChainSnapshot`]. Every read of the index
/// (lookups, tips, locators, views, fork points) is defined here, once.
#[derive(Clone, Debug)]
pub struct ChainIndex {
    params: Arc<ChainParams>,
    entries: imbl::Vector<IndexEntry>,
    by_hash: HashIds,
    /// The active chain: `active[h]` is the best block at height `h`.
    active: imbl::Vector<BlockId>,
    /// The most-work header not known to be invalid, first seen among
    /// equals (Core's `m_best_header`).
    best_header: BlockId,
}

/// hash → id of every entry of one index, shared by the writer's
/// [`BlockIndex`] and every clone of its read core. Entries are only ever
/// appended, with dense ids, so a clone holding `n` entries answers for the
/// ids below `n` and ignores later ones: no copy per publish (a persistent
/// map copied a path of nodes per insert after every published snapshot,
/// most of a headers sync's time and memory churn at millions of headers).
/// Readers take the read lock for one lookup; the writer takes the write
/// lock for one insert.
#[derive(Clone, Debug, Default)]
struct HashIds(Arc<RwLock<HashMap<BlockHash, BlockId>>>);

impl HashIds {
    fn get(&self, hash: &BlockHash, len: usize) -> Option<BlockId> {
        self.0
            .read()
            .get(hash)
            .copied()
            .filter(|id| (id.0 as usize) < len)
    }

    fn insert(&self, hash: BlockHash, id: BlockId) {
        self.0.write().insert(hash, id);
    }
}

/// The writer's block index: the read core ([`ChainIndex`], reached
/// through `Deref`) and what only the writer needs to choose the next tip
/// (which blocks are complete, the tip candidates, the blocks waiting for
/// a parent's data), with the header checks and status changes.
#[derive(Debug)]
pub struct BlockIndex {
    core: ChainIndex,
    /// Per entry: the block and all its ancestors have their data and none
    /// is invalid (Core's `nChainTx != 0`).
    complete: Vec<bool>,
    /// Complete blocks with at least the active tip's chainwork, ordered by
    /// (chainwork, lower id first): the tip candidates (Core's
    /// `setBlockIndexCandidates`). Pruned below the tip's work when the tip
    /// moves; rebuilt whole when a block is marked invalid.
    candidates: BTreeSet<(Work, Reverse<u32>)>,
    /// Blocks with data whose parent is not complete yet, by parent (Core's
    /// `m_blocks_unlinked`): they become complete with it.
    unlinked: HashMap<BlockId, Vec<BlockId>>,
    /// Per entry: the `nBits` of the last block at or below it that is not
    /// a minimum-difficulty block of the 20-minute rule (a retarget height,
    /// genesis, or other bits than the pow limit). This is where Core's
    /// `GetNextWorkRequired` walks back to on networks that allow
    /// min-difficulty blocks; kept here, it costs O(1) per header instead of
    /// up to one retarget interval (2,016 steps on regtest and testnet,
    /// where every block may be at the limit). 4 bytes per entry.
    pow_anchor_bits: Vec<CompactTarget>,
}

impl std::ops::Deref for BlockIndex {
    type Target = ChainIndex;

    fn deref(&self) -> &ChainIndex {
        &self.core
    }
}

impl BlockIndex {
    /// An index holding only the network's genesis block (status valid,
    /// BlockId 0, on the active chain).
    pub fn new(params: ChainParams) -> Self {
        let header = params.genesis_header();
        let hash = header.block_hash();
        let genesis = IndexEntry {
            id: BlockId(0),
            hash,
            header,
            height: 0,
            chainwork: header.work(),
            status: BlockStatus::Valid,
            prev: None,
        };
        let by_hash = HashIds::default();
        by_hash.insert(hash, BlockId(0));
        let mut index = BlockIndex {
            core: ChainIndex {
                params: Arc::new(params),
                entries: imbl::vector![genesis],
                by_hash,
                active: imbl::vector![BlockId(0)],
                best_header: BlockId(0),
            },
            complete: Vec::new(),
            candidates: BTreeSet::new(),
            unlinked: HashMap::new(),
            pow_anchor_bits: vec![header.bits],
        };
        index.rebuild_candidates();
        index
    }

    /// Rebuilds an index from stored entries (ids dense from 0, parents
    /// before children) and the active chain's tip.
    ///
    /// # Errors
    /// [`IndexLoadError`] when the stored entries are inconsistent.
    pub fn from_entries(
        params: ChainParams,
        entries: Vec<IndexEntry>,
        tip: BlockId,
    ) -> Result<Self, IndexLoadError> {
        let ids = entries.iter().map(|e| (e.hash, e.id)).collect();
        Self::from_entries_and_ids(params, entries, ids, tip)
    }

    /// [`BlockIndex::from_entries`] with the hash → id map of `entries`
    /// already built (the loader builds it to find parents), so it is not
    /// built twice.
    ///
    /// # Errors
    /// As [`BlockIndex::from_entries`]; [`IndexLoadError::DuplicateHash`]
    /// when `ids` is not one hash per entry.
    pub fn from_entries_and_ids(
        params: ChainParams,
        entries: Vec<IndexEntry>,
        ids: HashMap<BlockHash, BlockId>,
        tip: BlockId,
    ) -> Result<Self, IndexLoadError> {
        for (i, e) in entries.iter().enumerate() {
            if e.id.0 as usize != i {
                return Err(IndexLoadError::NotDense { id: e.id.0 });
            }
            if let Some(p) = e.prev {
                if p.0 as usize >= i {
                    return Err(IndexLoadError::ParentAfterChild { id: e.id.0 });
                }
            }
        }
        if ids.len() != entries.len() {
            return Err(IndexLoadError::DuplicateHash {
                entries: entries.len(),
                hashes: ids.len(),
            });
        }
        let by_hash = HashIds(Arc::new(RwLock::new(ids)));
        if entries.first().map(|g| g.hash) != Some(params.genesis_hash()) {
            return Err(IndexLoadError::WrongGenesis);
        }
        if tip.0 as usize >= entries.len() {
            return Err(IndexLoadError::UnknownTip { id: tip.0 });
        }
        let mut index = BlockIndex {
            core: ChainIndex {
                params: Arc::new(params),
                entries: entries.into_iter().collect(),
                by_hash,
                active: imbl::Vector::new(),
                best_header: BlockId(0),
            },
            complete: Vec::new(),
            candidates: BTreeSet::new(),
            unlinked: HashMap::new(),
            pow_anchor_bits: Vec::new(),
        };
        for e in index.core.entries.iter() {
            let anchor = index.pow_anchor_of(e);
            index.pow_anchor_bits.push(anchor);
        }
        index.set_active_tip(tip);
        index.rebuild_candidates();
        Ok(index)
    }

    /// The read core (what a snapshot of the index holds); clone it to
    /// publish (O(1)).
    pub fn core(&self) -> &ChainIndex {
        &self.core
    }
    /// Sets the status of `id`, keeping the tip candidates up to date (a
    /// block that gets its data may complete its chain and its waiting
    /// descendants'). Use [`BlockIndex::mark_invalid`] to invalidate.
    pub fn set_status(&mut self, id: BlockId, status: BlockStatus) {
        let Some(e) = self.core.entries.get_mut(id.0 as usize) else {
            return;
        };
        let old = e.status;
        e.status = status;
        if status.is_invalid() || (old.has_data() && !status.has_data()) {
            self.rebuild_candidates();
        } else if status.has_data() && !old.has_data() {
            self.on_data(id);
        }
    }

    /// `id` got its data: it is complete if its parent is, and then so are
    /// the blocks that waited for it (O(blocks completed)).
    fn on_data(&mut self, id: BlockId) {
        let parent_complete = match self.core.entries[id.0 as usize].prev {
            None => true,
            Some(p) => self.complete[p.0 as usize],
        };
        if !parent_complete {
            if let Some(p) = self.core.entries[id.0 as usize].prev {
                self.unlinked.entry(p).or_default().push(id);
            }
            return;
        }
        let tip_work = self.tip().chainwork;
        let mut stack = vec![id];
        while let Some(b) = stack.pop() {
            let (has_data, work) = {
                let e = &self.core.entries[b.0 as usize];
                (e.status.has_data(), e.chainwork)
            };
            if self.complete[b.0 as usize] || !has_data {
                continue;
            }
            self.complete[b.0 as usize] = true;
            if work >= tip_work {
                self.candidates.insert((work, Reverse(b.0)));
            }
            if let Some(children) = self.unlinked.remove(&b) {
                stack.extend(children);
            }
        }
    }

    /// Recomputes `complete`, `candidates`, `unlinked` and the best header
    /// from the entries (O(n); at load and when a block is marked invalid).
    fn rebuild_candidates(&mut self) {
        let mut best = BlockId(0);
        for e in self.core.entries.iter() {
            if !e.status.is_invalid() && e.chainwork > self.core.entries[best.0 as usize].chainwork
            {
                best = e.id;
            }
        }
        self.core.best_header = best;
        let tip_work = self.tip().chainwork;
        self.complete = vec![false; self.core.entries.len()];
        self.candidates.clear();
        self.unlinked.clear();
        // Parents come before children (ids are dense, parents first).
        for i in 0..self.core.entries.len() {
            let e = &self.core.entries[i];
            if !e.status.has_data() {
                continue;
            }
            match e.prev {
                Some(p) if !self.complete[p.0 as usize] => {
                    self.unlinked.entry(p).or_default().push(e.id);
                }
                _ => {
                    self.complete[i] = true;
                    if e.chainwork >= tip_work {
                        self.candidates.insert((e.chainwork, Reverse(e.id.0)));
                    }
                }
            }
        }
    }

    /// Marks `id` invalid and every known descendant invalid-ancestor;
    /// returns the ids whose status changed.
    pub fn mark_invalid(&mut self, id: BlockId) -> Vec<BlockId> {
        let mut changed = vec![id];
        if let Some(e) = self.core.entries.get_mut(id.0 as usize) {
            e.status = BlockStatus::Invalid;
        }
        // Children always have larger ids than their parents.
        for i in (id.0 as usize + 1)..self.core.entries.len() {
            let parent_bad = self.core.entries[i]
                .prev
                .is_some_and(|p| self.core.entries[p.0 as usize].status.is_invalid());
            if parent_bad && !self.core.entries[i].status.is_invalid() {
                self.core.entries[i].status = BlockStatus::InvalidAncestor;
                changed.push(BlockId(i as u32));
            }
        }
        self.rebuild_candidates();
        changed
    }

    /// Makes `tip` the active chain's tip: rewrites `active` from the fork
    /// point up (O(reorg depth)). Returns the fork height.
    pub fn set_active_tip(&mut self, tip: BlockId) -> u32 {
        let mut branch = Vec::new();
        let mut cur = tip;
        loop {
            let e = &self.core.entries[cur.0 as usize];
            if self.core.active.get(e.height as usize) == Some(&cur) {
                break;
            }
            branch.push(cur);
            match e.prev {
                Some(p) => cur = p,
                None => break,
            }
        }
        let fork_height = branch
            .last()
            .map(|id| self.core.entries[id.0 as usize].height.saturating_sub(1))
            .unwrap_or(self.core.entries[tip.0 as usize].height);
        let keep = if branch.is_empty() {
            self.core.entries[tip.0 as usize].height as usize + 1
        } else {
            self.core.entries[branch.last().map(|id| id.0 as usize).unwrap_or(0)].height as usize
        };
        self.core.active.truncate(keep);
        self.core.active.extend(branch.into_iter().rev());
        // Candidates below the new tip's work can no longer win (a tip only
        // loses work when a block is marked invalid, which rebuilds them).
        let tip_work = self.tip().chainwork;
        self.candidates = self.candidates.split_off(&(tip_work, Reverse(u32::MAX)));
        fork_height
    }

    /// The chainwork of the best header ([`ChainIndex::best_header`]):
    /// above the active tip's, the node knows blocks it has yet to connect.
    pub fn best_header_work(&self) -> Work {
        self.best_header().chainwork
    }

    /// The most-work block whose status is not invalid and all of whose
    /// ancestors have their data (the candidate for the active tip); ties go
    /// to the lower id (first seen). The tip itself unless a candidate has
    /// strictly more work. O(log n): the candidates are kept as blocks get
    /// their data (Core's `setBlockIndexCandidates`).
    pub fn best_candidate(&self) -> BlockId {
        let tip = self.tip();
        // The greatest (work, Reverse(id)) is the most work, lowest id.
        match self.candidates.last() {
            Some((work, Reverse(id))) if *work > tip.chainwork => BlockId(*id),
            _ => tip.id,
        }
    }
}

/// Errors rebuilding the index from storage.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IndexLoadError {
    /// Ids are not 0, 1, 2, …
    #[error("block index entry {id} out of sequence")]
    NotDense {
        /// The offending id.
        id: u32,
    },
    /// A parent is stored after its child.
    #[error("block index entry {id} names a later parent")]
    ParentAfterChild {
        /// The offending id.
        id: u32,
    },
    /// Entry 0 is not this network's genesis block.
    #[error("block index does not start with this network's genesis block")]
    WrongGenesis,
    /// Two entries have the same hash (the map of hashes is shorter than
    /// the entries).
    #[error("block index: {entries} entries but {hashes} distinct hashes")]
    DuplicateHash {
        /// Entries.
        entries: usize,
        /// Distinct hashes among them.
        hashes: usize,
    },
    /// The stored tip is not in the index.
    #[error("stored tip {id} is not in the block index")]
    UnknownTip {
        /// The stored tip id.
        id: u32,
    },
}

mod header;
mod reads;
#[cfg(test)]
mod tests;

pub use header::HeaderError;
pub use reads::{BranchView, ChainTip, TipStatus};
