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
use bitcoin::pow::{CompactTarget, Target, Work};
use bitcoin::BlockHash;

use super::params::{ChainParams, MAX_FUTURE_BLOCK_TIME};
use crate::primitives::BlockId;
use crate::sozu::{BlockOracle, ChainView};

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

/// Why a header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// The parent is not in the index.
    #[error("header {hash}: unknown parent {prev}")]
    UnknownParent {
        /// The header's hash.
        hash: BlockHash,
        /// The missing parent.
        prev: BlockHash,
    },
    /// The parent (or an ancestor) is invalid (Core: `bad-prevblk`).
    #[error("header {hash}: parent is invalid (bad-prevblk)")]
    InvalidParent {
        /// The header's hash.
        hash: BlockHash,
    },
    /// `nBits` is not what the difficulty rules require (Core: `bad-diffbits`).
    #[error("header {hash} at height {height}: bits {got:#010x}, expected {expected:#010x} (bad-diffbits)")]
    BadDiffBits {
        /// The header's hash.
        hash: BlockHash,
        /// Its height.
        height: u32,
        /// Its bits.
        got: u32,
        /// The required bits.
        expected: u32,
    },
    /// The hash does not meet the target (Core: `high-hash`).
    #[error("header {hash}: proof of work does not meet its target (high-hash)")]
    HighHash {
        /// The header's hash.
        hash: BlockHash,
    },
    /// Timestamp not above the median of the last 11 blocks (Core: `time-too-old`).
    #[error("header {hash}: time {time} not after median-time-past {mtp} (time-too-old)")]
    TimeTooOld {
        /// The header's hash.
        hash: BlockHash,
        /// Its time (seconds since the epoch).
        time: u32,
        /// The parent's median-time-past.
        mtp: u32,
    },
    /// Timestamp more than 2 hours in the future (Core: `time-too-new`).
    #[error("header {hash}: time {time} more than 2 hours after now {now} (time-too-new)")]
    TimeTooNew {
        /// The header's hash.
        hash: BlockHash,
        /// Its time.
        time: u32,
        /// The node's clock.
        now: u64,
    },
    /// BIP94 timewarp rule on testnet4 (Core: `time-timewarp-attack`).
    #[error("header {hash}: first block of a period more than 600 s before its parent (time-timewarp-attack)")]
    TimeWarp {
        /// The header's hash.
        hash: BlockHash,
    },
    /// Version below what an active soft fork requires (Core: `bad-version`).
    #[error("header {hash}: version {version} obsolete at height {height} (bad-version)")]
    BadVersion {
        /// The header's hash.
        hash: BlockHash,
        /// Its version.
        version: i32,
        /// Its height.
        height: u32,
    },
    /// The index is full (more than `u32::MAX` blocks).
    #[error("block index is full")]
    IndexFull,
}

impl HeaderError {
    /// Bitcoin Core's reject string for this error.
    pub fn reject_reason(&self) -> &'static str {
        match self {
            HeaderError::UnknownParent { .. } => "prev-blk-not-found",
            HeaderError::InvalidParent { .. } => "bad-prevblk",
            HeaderError::BadDiffBits { .. } => "bad-diffbits",
            HeaderError::HighHash { .. } => "high-hash",
            HeaderError::TimeTooOld { .. } => "time-too-old",
            HeaderError::TimeTooNew { .. } => "time-too-new",
            HeaderError::TimeWarp { .. } => "time-timewarp-attack",
            HeaderError::BadVersion { .. } => "bad-version",
            HeaderError::IndexFull => "index-full",
        }
    }
}

/// Seconds a testnet4 block may go back in time at a period boundary (BIP94).
const MAX_TIMEWARP: u32 = 600;

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

    /// Checks `header` against its parent and the clock `now` (seconds since
    /// the epoch) and adds it with status [`BlockStatus::HeadersOnly`];
    /// returns its id. A header already known returns its id unchanged.
    ///
    /// # Errors
    /// [`HeaderError`] naming the broken rule; the index is unchanged.
    pub fn accept_header(&mut self, header: &Header, now: u64) -> Result<BlockId, HeaderError> {
        let hash = header.block_hash();
        if let Some(id) = self.id_of(&hash) {
            return Ok(id);
        }
        let prev_id = self
            .id_of(&header.prev_blockhash)
            .ok_or(HeaderError::UnknownParent {
                hash,
                prev: header.prev_blockhash,
            })?;
        let prev = &self.core.entries[prev_id.0 as usize];
        if prev.status.is_invalid() {
            return Err(HeaderError::InvalidParent { hash });
        }
        let height = prev.height + 1;
        let expected = self.next_work_required(prev, header.time);
        if header.bits != expected {
            return Err(HeaderError::BadDiffBits {
                hash,
                height,
                got: header.bits.to_consensus(),
                expected: expected.to_consensus(),
            });
        }
        let target = Target::from_compact(header.bits);
        if header.validate_pow(target).is_err() {
            return Err(HeaderError::HighHash { hash });
        }
        let mtp = self.median_time_past(prev_id);
        if header.time <= mtp {
            return Err(HeaderError::TimeTooOld {
                hash,
                time: header.time,
                mtp,
            });
        }
        if u64::from(header.time) > now + MAX_FUTURE_BLOCK_TIME {
            return Err(HeaderError::TimeTooNew {
                hash,
                time: header.time,
                now,
            });
        }
        let interval = (self.core.params.pow.pow_target_timespan
            / self.core.params.pow.pow_target_spacing) as u32;
        if self.core.params.enforce_bip94
            && height.is_multiple_of(interval)
            && header.time < prev.header.time.saturating_sub(MAX_TIMEWARP)
        {
            return Err(HeaderError::TimeWarp { hash });
        }
        let version = header.version.to_consensus();
        let p = &self.core.params;
        if (version < 2 && height >= p.bip34_height)
            || (version < 3 && height >= p.bip66_height)
            || (version < 4 && height >= p.bip65_height)
        {
            return Err(HeaderError::BadVersion {
                hash,
                version,
                height,
            });
        }
        let id = u32::try_from(self.core.entries.len()).map_err(|_| HeaderError::IndexFull)?;
        let id = BlockId(id);
        let chainwork = prev.chainwork + header.work();
        self.core.entries.push_back(IndexEntry {
            id,
            hash,
            header: *header,
            height,
            chainwork,
            status: BlockStatus::HeadersOnly,
            prev: Some(prev_id),
        });
        self.complete.push(false);
        self.core.by_hash.insert(hash, id);
        if chainwork > self.best_header().chainwork {
            self.core.best_header = id;
        }
        let anchor = self.pow_anchor_of(&self.core.entries[id.0 as usize]);
        self.pow_anchor_bits.push(anchor);
        Ok(id)
    }

    /// The `nBits` a child of `prev` must carry (Core's
    /// `GetNextWorkRequired`, with testnet's 20-minute rule and BIP94).
    ///
    /// `prev` must be an entry of this index.
    pub fn next_work_required(&self, prev: &IndexEntry, time: u32) -> CompactTarget {
        let pow = &self.params.pow;
        let pow_limit_bits = pow.max_attainable_target.to_compact_lossy();
        let interval = (pow.pow_target_timespan / pow.pow_target_spacing) as u32;
        let height = prev.height + 1;
        if !height.is_multiple_of(interval) {
            if pow.allow_min_difficulty_blocks {
                // Testnet: a block more than 2 * spacing after its parent may
                // use the minimum difficulty.
                if u64::from(time) > u64::from(prev.header.time) + pow.pow_target_spacing * 2 {
                    return pow_limit_bits;
                }
                // Otherwise the last non-min-difficulty block's bits.
                return self
                    .pow_anchor_bits
                    .get(prev.id.0 as usize)
                    .copied()
                    .unwrap_or(prev.header.bits);
            }
            return prev.header.bits;
        }
        if pow.no_pow_retargeting {
            return prev.header.bits;
        }
        let first_height = height - interval;
        let Some(first) = self.ancestor(prev.id, first_height) else {
            return prev.header.bits;
        };
        let timespan = u64::from(prev.header.time.saturating_sub(first.header.time));
        // BIP94: retarget from the first block of the period, not the last
        // (which may be a min-difficulty block).
        let base = if self.params.enforce_bip94 {
            first.header.bits
        } else {
            prev.header.bits
        };
        CompactTarget::from_next_work_required(base, timespan, pow)
    }

    /// [`BlockIndex::pow_anchor_bits`] of `e`, from its parent's (which
    /// must be stored already: parents come before children).
    fn pow_anchor_of(&self, e: &IndexEntry) -> CompactTarget {
        let pow = &self.core.params.pow;
        let interval = (pow.pow_target_timespan / pow.pow_target_spacing) as u32;
        let at_limit = e.header.bits == pow.max_attainable_target.to_compact_lossy();
        match e.prev {
            Some(p) if at_limit && !e.height.is_multiple_of(interval) => self
                .pow_anchor_bits
                .get(p.0 as usize)
                .copied()
                .unwrap_or(e.header.bits),
            _ => e.header.bits,
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::Network;

    fn mainnet_headers() -> Vec<Header> {
        let data = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/testnet-data/mainnet-samples/mainnet-blocks-1-256.dat"
        ))
        .unwrap();
        let mut out = Vec::new();
        let mut pos = 0;
        while pos + 8 <= data.len() {
            let len = u32::from_le_bytes(data[pos + 4..pos + 8].try_into().unwrap()) as usize;
            let block: bitcoin::Block =
                bitcoin::consensus::deserialize(&data[pos + 8..pos + 8 + len]).unwrap();
            out.push(block.header);
            pos += 8 + len;
        }
        out
    }

    /// Core's walk in `GetNextWorkRequired` (pow.cpp) for a block that is
    /// not at a retarget height and not 20 minutes after its parent: back
    /// from `prev` while the block is a min-difficulty block, to the first
    /// one that is not (or a retarget height, or genesis).
    fn walked_bits(index: &ChainIndex, prev: &IndexEntry) -> CompactTarget {
        let pow = &index.params().pow;
        let limit = pow.max_attainable_target.to_compact_lossy();
        let interval = (pow.pow_target_timespan / pow.pow_target_spacing) as u32;
        let mut e = prev;
        while let Some(parent) = e.prev.and_then(|p| index.get(p)) {
            if e.height.is_multiple_of(interval) || e.header.bits != limit {
                break;
            }
            e = parent;
        }
        e.header.bits
    }

    /// The per-entry anchor the writer keeps gives the bits of Core's walk
    /// at every height of a testnet-like chain that mixes min-difficulty
    /// runs of every length with ordinary blocks, across three retarget
    /// intervals; a load from stored entries rebuilds the same anchors.
    #[test]
    fn min_difficulty_anchor_equals_cores_walk() {
        let params = ChainParams::new(Network::Testnet);
        let limit = params.pow.max_attainable_target.to_compact_lossy();
        let genesis = params.genesis_header();
        let mut entries = vec![IndexEntry {
            id: BlockId(0),
            hash: genesis.block_hash(),
            header: genesis,
            height: 0,
            chainwork: genesis.work(),
            status: BlockStatus::Valid,
            prev: None,
        }];
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for height in 1..6_100u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Runs of min-difficulty blocks whose lengths vary widely.
            let bits = if x % 97 < 90 {
                limit
            } else {
                CompactTarget::from_consensus(0x1c00_0000 | (height % 0xffff))
            };
            let prev = &entries[height as usize - 1];
            let header = Header {
                prev_blockhash: prev.hash,
                bits,
                time: genesis.time + height * 600,
                ..genesis
            };
            entries.push(IndexEntry {
                id: BlockId(height),
                hash: header.block_hash(),
                header,
                height,
                chainwork: prev.chainwork,
                status: BlockStatus::Valid,
                prev: Some(BlockId(height - 1)),
            });
        }
        let tip = BlockId(entries.len() as u32 - 1);
        let index = BlockIndex::from_entries(params, entries, tip).unwrap();
        let mut differing_from_parent = 0;
        for e in index.entries() {
            if (e.height + 1).is_multiple_of(2016) {
                continue;
            }
            let want = walked_bits(&index, e);
            assert_eq!(
                index.next_work_required(e, e.header.time + 600),
                want,
                "height {}",
                e.height
            );
            differing_from_parent += usize::from(want != e.header.bits);
        }
        assert!(
            differing_from_parent > 1_000,
            "the walk matters in this chain"
        );
    }

    #[test]
    fn mainnet_headers_connect_and_tampering_is_refused() {
        let mut index = BlockIndex::new(ChainParams::new(Network::Bitcoin));
        let headers = mainnet_headers();
        // The fixture holds blocks 1-255 (btcd's blk_1_to_256 despite its name).
        assert_eq!(headers.len(), 255);
        let now = 2_000_000_000;
        for h in &headers {
            index.accept_header(h, now).unwrap();
        }
        assert_eq!(index.len(), 256);
        // A nonce change breaks the proof of work.
        let mut bad = headers[10];
        bad.nonce ^= 1;
        assert!(matches!(
            index.accept_header(&bad, now),
            Err(HeaderError::HighHash { .. })
        ));
        // Wrong bits.
        let mut bad = headers[10];
        bad.bits = CompactTarget::from_consensus(0x1d00fffe);
        assert!(matches!(
            index.accept_header(&bad, now),
            Err(HeaderError::BadDiffBits { .. })
        ));
        // A block from the future (against a clock in 2009).
        let mut index = BlockIndex::new(ChainParams::new(Network::Bitcoin));
        let first = headers[0];
        let err = index
            .accept_header(&first, u64::from(first.time) - 3 * 3600)
            .unwrap_err();
        assert!(matches!(err, HeaderError::TimeTooNew { .. }));
    }

    #[test]
    fn locator_and_mtp() {
        let mut index = BlockIndex::new(ChainParams::new(Network::Bitcoin));
        let headers = mainnet_headers();
        let mut last = BlockId(0);
        for h in &headers {
            last = index.accept_header(h, 2_000_000_000).unwrap();
            index.set_status(last, BlockStatus::Valid);
        }
        index.set_active_tip(last);
        assert_eq!(index.tip_height(), 255);
        let loc = index.locator();
        assert_eq!(loc[0], headers[254].block_hash());
        assert_eq!(*loc.last().unwrap(), index.params().genesis_hash());
        assert!(loc.len() <= 101);
        let mut times: Vec<u32> = headers[244..255].iter().map(|h| h.time).collect();
        times.sort_unstable();
        assert_eq!(index.median_time_past(last), times[5]);
    }
    /// Headers of testnet-data/regtest-a/blocks.dat (bcoin's regtest chain
    /// with 7 reorgs), in file order: parents before children.
    fn regtest_a_headers() -> Vec<Header> {
        let data = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/testnet-data/regtest-a/blocks.dat"
        ))
        .unwrap();
        let mut out = Vec::new();
        let mut pos = 0;
        while pos + 8 <= data.len() && data[pos..pos + 4] != [0, 0, 0, 0] {
            let len = u32::from_le_bytes(data[pos + 4..pos + 8].try_into().unwrap()) as usize;
            let header: Header = bitcoin::consensus::deserialize(&data[pos + 8..pos + 88]).unwrap();
            out.push(header);
            pos += 8 + len;
        }
        out
    }

    /// The hash → id map is shared by the writer and its published read
    /// cores: a core published before a header was accepted must not find
    /// it (its entries end before that id), the writer and later cores
    /// must; an index rebuilt from the entries finds every one.
    #[test]
    fn published_cores_see_only_their_own_hashes() {
        let headers = regtest_a_headers();
        let mut index = BlockIndex::new(ChainParams::new(bitcoin::Network::Regtest));
        let now = u64::from(u32::MAX);
        let half = headers.len() / 2;
        for h in &headers[..half] {
            index.accept_header(h, now).expect("valid header");
        }
        let before = index.core().clone();
        for h in &headers[half..] {
            index.accept_header(h, now).expect("valid header");
        }
        let after = index.core().clone();
        for (i, h) in headers.iter().enumerate() {
            let hash = h.block_hash();
            let id = index.id_of(&hash).expect("the writer knows every header");
            assert_eq!(after.id_of(&hash), Some(id));
            assert_eq!(before.id_of(&hash).is_some(), i < half, "header {i}");
            assert_eq!(before.by_hash(&hash).is_some(), i < half, "header {i}");
        }
        let entries: Vec<IndexEntry> = index.entries().cloned().collect();
        let tip = index.tip().id;
        let rebuilt = BlockIndex::from_entries(index.params().clone(), entries.clone(), tip)
            .expect("rebuilt");
        for e in &entries {
            assert_eq!(rebuilt.id_of(&e.hash), Some(e.id));
        }
        let mut twice = entries;
        twice[1].hash = twice[2].hash;
        assert!(matches!(
            BlockIndex::from_entries(index.params().clone(), twice, tip),
            Err(IndexLoadError::DuplicateHash { .. })
        ));
    }

    /// The reference for [`BlockIndex::best_candidate`]: a full scan (the
    /// former implementation): complete = has data and parent complete;
    /// the most-work complete block, lower id on ties, if it beats the tip.
    fn best_candidate_by_scan(index: &BlockIndex) -> BlockId {
        let entries = index.entries();
        let mut complete = vec![false; entries.len()];
        let tip = index.tip();
        let mut best = tip.id;
        let mut best_work = tip.chainwork;
        for e in entries {
            complete[e.id.0 as usize] =
                e.status.has_data() && e.prev.is_none_or(|p| complete[p.0 as usize]);
            if complete[e.id.0 as usize] && e.chainwork > best_work {
                best = e.id;
                best_work = e.chainwork;
            }
        }
        best
    }

    /// Model test: blocks of regtest-a get their data in random order, some
    /// are marked invalid, the tip follows the best candidate; after every
    /// step the kept candidate set gives the scan's answer.
    #[test]
    fn best_candidate_matches_a_full_scan_on_regtest_a() {
        let headers = regtest_a_headers();
        assert_eq!(headers.len(), 1529);
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            rng ^= rng >> 12;
            rng ^= rng << 25;
            rng ^= rng >> 27;
            rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        for round in 0..3 {
            let mut index = BlockIndex::new(ChainParams::new(Network::Regtest));
            for h in &headers {
                index.accept_header(h, 2_000_000_000).unwrap();
            }
            let n = index.len();
            // Round 0: data in file order (an import); later: random order
            // (out-of-order download).
            let mut order: Vec<usize> = (1..n).collect();
            if round > 0 {
                for i in (1..order.len()).rev() {
                    order.swap(i, (next() % (i as u64 + 1)) as usize);
                }
            }
            let mut moved = 0;
            for (step, i) in order.into_iter().enumerate() {
                let id = BlockId(i as u32);
                if index.get(id).unwrap().status == BlockStatus::HeadersOnly {
                    index.set_status(id, BlockStatus::HaveData);
                }
                if round == 2 && step % 97 == 0 {
                    // Invalidate a random block of the last 200 (heights
                    // ~1,300-1,500) off the active chain.
                    let victim = BlockId((n as u64 - 1 - next() % 200) as u32);
                    if !index.is_active(victim) {
                        index.mark_invalid(victim);
                    }
                }
                let best = index.best_candidate();
                assert_eq!(
                    best,
                    best_candidate_by_scan(&index),
                    "round {round} step {step}"
                );
                // The best header: the first-seen most-work header not
                // invalid, by a scan of every entry.
                let by_scan =
                    index
                        .entries()
                        .filter(|e| !e.status.is_invalid())
                        .fold(BlockId(0), |b, e| {
                            if e.chainwork > index.get(b).unwrap().chainwork {
                                e.id
                            } else {
                                b
                            }
                        });
                assert_eq!(index.best_header().id, by_scan, "round {round} step {step}");
                if next() % 3 == 0 && best != index.tip().id {
                    for b in index.path_from(index.fork_point(index.tip().id, best).unwrap(), best)
                    {
                        index.set_status(b, BlockStatus::Valid);
                    }
                    index.set_active_tip(best);
                    moved += 1;
                    assert_eq!(index.best_candidate(), best_candidate_by_scan(&index));
                }
            }
            eprintln!("round {round}: the tip moved {moved} times");
            assert!(moved > 0, "round {round}: the tip never moved");
            if round < 2 {
                let best = index.best_candidate();
                index.set_active_tip(best);
                assert_eq!(index.tip_height(), 1500, "round {round}");
            }
        }
    }
}
