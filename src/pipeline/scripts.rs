//! Script verification at the block boundary: every input's scripts
//! through Core's interpreter ([`crate::validation::script`], Core 26.0's
//! `libbitcoinconsensus`) after the economic checks, on script threads
//! kept across blocks ([`ScriptPool`], Core's `CCheckQueue`), which also
//! build the block's BIP-158 filter and MuHash delta from the same spent
//! outputs when they have no checks left (`pipeline/digests.rs`), while the
//! writer validates the next block ahead (`pipeline/ahead.rs`), then joins
//! them; skipped for ancestors of the assumevalid block
//! ([`crate::chain::assumevalid`], Core's `ConnectBlock` rule). A failure
//! rejects the block with Core's reason
//! (`block-script-verify-flag-failed (<error>)`) and writes nothing else of
//! it.

use std::sync::Arc;
use std::time::Instant;

use bitcoin::bip158::BlockFilter;
use bitcoin::{Block, BlockHash};

use crate::chain::assumevalid::ScriptCheck;
use crate::chain::index::IndexEntry;
use crate::muhash::BlockDelta;
use crate::primitives::BlockId;
use crate::store::WriteBatch;
use crate::validation::script::{
    block_script_flags, BlockScriptError, OwnedBlockChecks, PendingChecks, PendingTask, ScriptPool,
};
use crate::validation::SpentOutput;

use super::digests::Digests;
use super::{Chainstate, PipelineError, ValidBlock};

/// Script verification in the block boundary.
impl Chainstate {
    /// Marks the block being connected invalid for `reason` (Core's reject
    /// string) and commits that with `batch` (the open group's rows and
    /// the block's own storage record, when this boundary stores it) in one
    /// durable boundary, which ends the open group: nothing else of the
    /// block is written. Returns `Ok(false)`, [`Chainstate::connect`]'s "invalid".
    ///
    /// # Errors
    /// Storage failure.
    pub(super) fn reject_connecting(
        &mut self,
        id: BlockId,
        entry: &IndexEntry,
        reason: &str,
        detail: &dyn std::fmt::Display,
        mut batch: WriteBatch,
    ) -> Result<bool, PipelineError> {
        tracing::warn!(height = entry.height, block_hash = %entry.hash, reason, "block invalid: {detail}");
        let changed = self.index.mark_invalid(id);
        self.ensure_meta(id);
        self.meta[id.0 as usize].reject_reason = reason.to_string();
        for changed in changed {
            self.put_record(&mut batch, changed);
        }
        self.commit_boundary(batch)?;
        self.stats.blocks_rejected += 1;
        self.last_reject = Some((id, detail.to_string()));
        Ok(false)
    }

    /// Whether `entry`'s scripts are verified (assumevalid), logging when
    /// the answer or Core's reason for it changes, as Core does.
    fn script_check(&mut self, entry: &IndexEntry) -> ScriptCheck {
        let check = self.assume_valid.decide(self.index.core(), entry);
        let reason = match check {
            ScriptCheck::Verify(reason) => Some(reason),
            ScriptCheck::Skip => None,
        };
        if self.last_script_check != Some(reason) {
            match reason {
                Some(reason) => tracing::info!(
                    height = entry.height,
                    block_hash = %entry.hash,
                    "enabling script verification: {reason}"
                ),
                None => tracing::info!(
                    height = entry.height,
                    block_hash = %entry.hash,
                    assumevalid = %self.assume_valid.setting(),
                    "disabling script verification: ancestor of the assumevalid block"
                ),
            }
            self.last_script_check = Some(reason);
        }
        check
    }

    /// Verifies `block`'s scripts with Core's interpreter (unless
    /// assumevalid skips them) on the script threads, which also build the
    /// block's BIP-158 filter and MuHash delta in their idle time
    /// (`pipeline/digests.rs`), while this thread applies the parent's kept
    /// table write and validates `next` ahead when given
    /// ([`Chainstate::prepare_ahead`]); then it takes the filter and delta
    /// (building them itself if no worker has taken them), and joins the
    /// verification.
    /// `prepared`: the work started when this block was validated ahead.
    /// [`ScriptsOutcome::Failed`] is a script failure: the block is invalid.
    ///
    /// # Errors
    /// [`PipelineError::ScriptEngine`] when the engine could not decide,
    /// [`PipelineError::Filter`].
    pub(super) fn scripts_filter_delta(
        &mut self,
        block: &Arc<Block>,
        entry: &IndexEntry,
        valid: &ValidBlock,
        prepared: Option<StartedWork>,
        next: Option<&Arc<Block>>,
    ) -> Result<ScriptsOutcome, PipelineError> {
        let verify = matches!(self.script_check(entry), ScriptCheck::Verify(_));
        let started = Instant::now();
        let spent = &valid.spent;
        // Checks started ahead are kept when they are to run (dropped,
        // that is cancelled, when assumevalid now skips them).
        let (pending, digests) = match prepared {
            Some(StartedWork {
                checks: Some(checks),
                digests,
            }) if verify => (Some(checks), digests),
            Some(StartedWork { digests, .. }) => {
                let checks =
                    verify.then(|| self.start_checks(block, entry.height, entry.hash, spent));
                (checks, digests)
            }
            None => {
                let work = self.start_block_work(block, entry.height, entry.hash, spent, verify);
                (work.checks, work.digests)
            }
        };
        // The parent's table write, kept from its connect, while the
        // scripts run.
        self.write_unwritten()?;
        if let Some(next) = next {
            self.prepare_ahead(next, entry, valid);
        }
        // The filter and delta first: built here unless a worker took them
        // (the workers take checks first), so this thread does its share
        // while the workers verify; then it joins the checks.
        let Digests { filter, delta, .. } = self.join_digests(digests);
        let verdict = match pending {
            None => {
                self.stats.blocks_assumed_valid += 1;
                Ok(())
            }
            Some(pending) => {
                let verdict = pending.and_then(PendingChecks::finish);
                self.stats.inputs_verified += spent.len() as u64;
                self.stats.script_micros = self
                    .stats
                    .script_micros
                    .saturating_add(started.elapsed().as_micros() as u64);
                verdict
            }
        };
        match verdict {
            Ok(()) => {}
            Err(e @ BlockScriptError::Script { .. }) => return Ok(ScriptsOutcome::Failed(e)),
            Err(source) => {
                return Err(PipelineError::ScriptEngine {
                    hash: entry.hash,
                    source,
                })
            }
        }
        let filter = filter.map_err(|source| PipelineError::Filter {
            hash: entry.hash,
            source,
        })?;
        Ok(ScriptsOutcome::Passed {
            filter,
            delta: Box::new(delta),
        })
    }

    /// Starts what follows `block`'s economic checks (at `height`, hashed
    /// `hash`, spending `spent`) on the script threads: its script checks
    /// when `verify`, and its filter and MuHash delta.
    pub(super) fn start_block_work(
        &mut self,
        block: &Arc<Block>,
        height: u32,
        hash: BlockHash,
        spent: &Arc<[SpentOutput]>,
        verify: bool,
    ) -> StartedWork {
        let checks = verify.then(|| self.start_checks(block, height, hash, spent));
        let digests = self.start_digests(block, height, spent);
        StartedWork { checks, digests }
    }

    /// Hands the checks of `block`'s inputs (at `height`, hashed `hash`)
    /// to the script threads, under the flags of its height (Core's
    /// `GetBlockScriptFlags`).
    ///
    /// # Errors
    /// [`BlockScriptError::SpentMismatch`] when `spent` is not the block's.
    pub(super) fn start_checks(
        &mut self,
        block: &Arc<Block>,
        height: u32,
        hash: BlockHash,
        spent: &Arc<[SpentOutput]>,
    ) -> Result<PendingChecks, BlockScriptError> {
        let flags = block_script_flags(self.index.params(), height, &hash);
        let checks = OwnedBlockChecks::new(Arc::clone(block), Arc::clone(spent), flags)?;
        Ok(self.script_pool().start(Arc::new(checks)))
    }

    /// The script threads: [`Chainstate::set_script_threads`] minus one
    /// (the writer joins every block's checks), started at first use.
    pub(super) fn script_pool(&mut self) -> &ScriptPool {
        let workers = self.script_threads.get() - 1;
        self.script_pool
            .get_or_insert_with(|| match ScriptPool::new(workers) {
                Ok(pool) => pool,
                Err(e) => {
                    tracing::warn!(workers, "no script threads, the writer verifies alone: {e}");
                    ScriptPool::default()
                }
            })
    }
}

/// A block's script checks as handed to the script threads; `None` when
/// assumevalid skips them.
pub(super) type StartedChecks = Option<Result<PendingChecks, BlockScriptError>>;

/// What [`Chainstate::start_block_work`] handed to the script threads.
pub(super) struct StartedWork {
    /// The block's script checks.
    pub checks: StartedChecks,
    /// Its filter and MuHash delta.
    pub digests: PendingTask<Digests>,
}

/// What [`Chainstate::scripts_filter_delta`] found, when the engine could
/// decide.
pub(super) enum ScriptsOutcome {
    /// Every script passed (or assumevalid skipped them): the block's
    /// filter and MuHash delta.
    Passed {
        /// The block's BIP-158 basic filter.
        filter: BlockFilter,
        /// The UTXO set's MuHash change (boxed: the large variant).
        delta: Box<BlockDelta>,
    },
    /// A script failed: the block is invalid.
    Failed(BlockScriptError),
}
