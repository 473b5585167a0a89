//! The next block validated ahead, while the current block's scripts run.
//!
//! A caller that already holds the next block (the import: the next record
//! of its file; P2P sync: a peer's next message, already read) hands it in with the current one
//! ([`Chainstate::submit_block_with_next`]). While block N's scripts are
//! verified on the script threads, the writer checks block N+1 as far as it
//! can without N's verdict: its context checks (`check_block`) under the
//! context it will have (height, parent's median-time-past), its lookups
//! in the UTXO table under N's branch with N's own table write read from
//! memory (`connect::unwritten_coins`), Core's `ConnectBlock` rules but
//! scripts; then it hands N+1's script checks to the script threads,
//! behind N's, with the building of N+1's filter and MuHash delta, which
//! they take when they have no checks left (`pipeline/digests.rs`). When N+1 is submitted next, its connect takes these results
//! instead of doing the work again, so the script threads verify N+1 while
//! the writer ends N's boundary and starts N+1's, where without the
//! lookahead they would wait for the writer's lookups.
//!
//! Nothing is written ahead: no table write, no row, no record, no header
//! (N+1 has no block id until its header is accepted by its own
//! submission). The results are used only by N+1's own connect, when it is
//! the very next submission, the same shared block (`Arc`), with N the
//! active tip and no other block connected in between; otherwise they are
//! dropped and their checks cancelled (also when N is rejected). Every
//! block's verdict is the one its own checks give, as without the
//! lookahead.

use std::sync::Arc;

use bitcoin::Block;

use crate::chain::assumevalid::ScriptCheck;
use crate::chain::index::IndexEntry;
use crate::primitives::BlockId;
use crate::validation;

use super::scripts::StartedWork;
use super::{Chainstate, CheckedUtxos, ValidBlock};

/// A block validated ahead of its submission.
pub(super) struct Ahead {
    /// The block, as the caller shares it.
    block: Arc<Block>,
    /// The block it was validated on (being connected then).
    parent: BlockId,
    /// [`super::PipelineStats::blocks_connected`] once the parent is
    /// connected: any other connect since may change what the lookups read.
    connects: u64,
    /// Its UTXO checks.
    checked: CheckedUtxos,
    /// Its script checks, filter and MuHash delta, running.
    work: StartedWork,
}

impl Ahead {
    /// Whether these are the results of `block`, submitted now.
    pub(super) fn is_for(&self, block: &Arc<Block>) -> bool {
        Arc::ptr_eq(&self.block, block)
    }

    /// The block it was validated on.
    pub(super) fn parent(&self) -> BlockId {
        self.parent
    }
}

/// What a connect takes from its block's validation ahead.
pub(super) struct Prepared {
    /// Its UTXO checks.
    pub checked: CheckedUtxos,
    /// Its script checks, filter and MuHash delta, running.
    pub work: StartedWork,
}

impl Chainstate {
    /// Validates `next` ahead on `entry` (the block being connected, whose
    /// checks are `valid`), and hands its script checks, filter and MuHash
    /// delta to the script threads; keeps the results for its submission. Nothing when `next`
    /// is not `entry`'s child, is already stored, or fails a check (its
    /// own submission finds that again and reports it).
    pub(super) fn prepare_ahead(
        &mut self,
        next: &Arc<Block>,
        entry: &IndexEntry,
        valid: &ValidBlock,
    ) {
        self.ahead = None;
        if next.header.prev_blockhash != entry.hash {
            return;
        }
        let hash = next.block_hash();
        let known = self.index.by_hash(&hash).cloned();
        if known.as_ref().is_some_and(|e| e.status.has_data()) {
            return;
        }
        let height = entry.height + 1;
        let checked_ok = self.with_context(height, hash, entry.id, |ctx| {
            validation::check_block(next, ctx).is_ok()
        });
        if !checked_ok {
            return;
        }
        let checked = match self.check_utxos(next, height, hash, entry.id, Some(valid)) {
            Ok(Ok(checked)) => checked,
            _ => return,
        };
        // A header the index does not hold is no ancestor of the
        // assumevalid block (which is in the index when it skips any).
        let verify = known.is_none_or(|e| {
            matches!(
                self.assume_valid.decide(self.index.core(), &e),
                ScriptCheck::Verify(_)
            )
        });
        let work = self.start_block_work(next, height, hash, &checked.spent, verify);
        self.ahead = Some(Ahead {
            block: Arc::clone(next),
            parent: entry.id,
            connects: self.stats.blocks_connected + 1,
            checked,
            work,
        });
    }

    /// The results of `ahead` for the connect of its block on `parent`,
    /// when still exact (see the module docs); `None` drops them.
    pub(super) fn take_prepared(&self, ahead: Ahead, parent: BlockId) -> Option<Prepared> {
        let exact = ahead.parent == parent
            && self.index.tip().id == parent
            && ahead.connects == self.stats.blocks_connected;
        exact.then_some(Prepared {
            checked: ahead.checked,
            work: ahead.work,
        })
    }
}
