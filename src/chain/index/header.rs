//! Header acceptance: the checks of a header against its parent and the
//! clock (Core's `CheckBlockHeader` and `ContextualCheckBlockHeader`) and
//! the difficulty rules (`pow.cpp`, with testnet's 20-minute rule and
//! BIP94).

use bitcoin::block::Header;
use bitcoin::pow::{CompactTarget, Target};
use bitcoin::BlockHash;

use super::{BlockIndex, BlockStatus, IndexEntry};
use crate::chain::params::MAX_FUTURE_BLOCK_TIME;
use crate::primitives::BlockId;

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

impl BlockIndex {
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
        self.check_header(header, &hash, prev, now)?;
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

    /// The rules `header` (hash `hash`) must meet as a child of `prev`,
    /// in Core's order: its bits are the required difficulty
    /// (`bad-diffbits`), its hash meets them (`high-hash`), its time is
    /// after the parent's median-time-past (`time-too-old`) and at most 2
    /// hours after `now` (`time-too-new`), BIP94's timewarp rule where
    /// enforced, and the version floor of BIP34/66/65 (`bad-version`).
    ///
    /// # Errors
    /// [`HeaderError`] naming the first broken rule.
    fn check_header(
        &self,
        header: &Header,
        hash: &BlockHash,
        prev: &IndexEntry,
        now: u64,
    ) -> Result<(), HeaderError> {
        let hash = *hash;
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
        let mtp = self.median_time_past(prev.id);
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
        let p = &self.core.params;
        let interval = (p.pow.pow_target_timespan / p.pow.pow_target_spacing) as u32;
        if p.enforce_bip94
            && height.is_multiple_of(interval)
            && header.time < prev.header.time.saturating_sub(MAX_TIMEWARP)
        {
            return Err(HeaderError::TimeWarp { hash });
        }
        let version = header.version.to_consensus();
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
        Ok(())
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
    pub(super) fn pow_anchor_of(&self, e: &IndexEntry) -> CompactTarget {
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
}
