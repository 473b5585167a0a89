//! Script verification at the block boundary: every input's scripts
//! through Core's interpreter ([`crate::validation::script`], Core 26.0's
//! `libbitcoinconsensus`) after the economic checks, on worker threads
//! while the writer builds the block's BIP-158 filter and MuHash delta from
//! the same spent outputs; skipped for ancestors of the assumevalid block
//! ([`crate::chain::assumevalid`], Core's `ConnectBlock` rule). A failure
//! rejects the block with Core's reason
//! (`block-script-verify-flag-failed (<error>)`) and writes nothing else of
//! it.

use bitcoin::bip158::BlockFilter;
use bitcoin::Block;

use crate::chain::assumevalid::ScriptCheck;
use crate::chain::index::IndexEntry;
use crate::filters;
use crate::muhash::BlockDelta;
use crate::primitives::BlockId;
use crate::store::WriteBatch;
use crate::validation::script::{block_script_flags, verify_block_scripts, BlockScriptError};
use crate::validation::SpentOutput;

use super::{Chainstate, PipelineError};

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
    /// assumevalid skips them) on worker threads, while this thread builds
    /// the block's BIP-158 filter and MuHash delta from the same spent
    /// outputs. [`ScriptsOutcome::Failed`] is a script failure: the block
    /// is invalid.
    ///
    /// # Errors
    /// [`PipelineError::ScriptEngine`] when the engine could not decide,
    /// [`PipelineError::Filter`], and [`PipelineError::Inconsistent`] when
    /// a verification thread panicked.
    pub(super) fn scripts_filter_delta(
        &mut self,
        block: &Block,
        entry: &IndexEntry,
        spent: &[SpentOutput],
    ) -> Result<ScriptsOutcome, PipelineError> {
        let verify = matches!(self.script_check(entry), ScriptCheck::Verify(_));
        let flags = block_script_flags(self.index.params(), entry.height, &entry.hash);
        let threads = self.script_threads;
        let (verdict, filter, delta) = std::thread::scope(|s| {
            let job = verify.then(|| {
                s.spawn(move || {
                    let started = std::time::Instant::now();
                    let verdict = verify_block_scripts(block, spent, flags, threads);
                    (verdict, started.elapsed())
                })
            });
            let scripts = spent.iter().map(|s| s.coin.script_pubkey.as_slice());
            let filter = filters::basic_filter(block, scripts);
            let delta = self.timed_delta(block, entry.height, spent);
            (job.map(|j| j.join()), filter, delta)
        });
        let verdict = match verdict {
            None => {
                self.stats.blocks_assumed_valid += 1;
                Ok(())
            }
            Some(Ok((verdict, elapsed))) => {
                self.stats.inputs_verified += spent.len() as u64;
                self.stats.script_micros = self
                    .stats
                    .script_micros
                    .saturating_add(elapsed.as_micros() as u64);
                verdict
            }
            Some(Err(_)) => {
                return Err(PipelineError::Inconsistent {
                    reason: "a script verification thread panicked".into(),
                })
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
