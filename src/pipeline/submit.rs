//! Submitting a block: the header and context checks, storage of its data,
//! and activation of the best chain (connecting blocks, switching tips).

use bitcoin::consensus::serialize;
use std::sync::Arc;

use bitcoin::{Block, BlockHash};

use crate::chain::index::BlockStatus;
use crate::primitives::BlockId;
use crate::sozu::PURGE_DEPTH;
use crate::store::{WriteBatch, META_FLAT_BLOCKS, META_TIP};
use crate::validation::{self, BlockError};

use super::connect::Lookahead;
use super::open::flat_pos_bytes;
use super::{now_secs, Chainstate, PipelineError, SubmitOutcome, DUPLICATE_INVALID};

impl Chainstate {
    /// Submits one block: header checks, context-free checks, storage, and
    /// activation of the best chain (which may connect it, or a whole branch).
    ///
    /// # Errors
    /// Storage failure only; invalid blocks are [`SubmitOutcome::Rejected`].
    pub fn submit_block(&mut self, block: &Block) -> Result<SubmitOutcome, PipelineError> {
        self.submit_block_with_next(Arc::new(block.clone()), None)
    }

    /// [`Chainstate::submit_block`] for a shared block, with the block the
    /// caller will submit next when it has it (an import: the next record
    /// of its file; P2P sync: a peer's next block, already read): while `block`'s scripts are verified, `next` is
    /// validated ahead (`pipeline/ahead.rs`), and its submission, when it
    /// comes next with the same `Arc`, starts from there. Outcomes are the
    /// same as without `next`.
    ///
    /// # Errors
    /// Storage failure only; invalid blocks are [`SubmitOutcome::Rejected`].
    pub fn submit_block_with_next(
        &mut self,
        block: Arc<Block>,
        next: Option<Arc<Block>>,
    ) -> Result<SubmitOutcome, PipelineError> {
        let started = std::time::Instant::now();
        let outcome = self.submit_block_timed(&block, next);
        let outcome = self.guard_writes(outcome);
        self.stats.submit_micros = self
            .stats
            .submit_micros
            .saturating_add(started.elapsed().as_micros() as u64);
        if outcome.is_ok() {
            self.publish();
        }
        outcome
    }

    pub(super) fn submit_block_timed(
        &mut self,
        block: &Arc<Block>,
        next: Option<Arc<Block>>,
    ) -> Result<SubmitOutcome, PipelineError> {
        // This block's validation ahead, if made; any other is dropped.
        let prepared = self.ahead.take().filter(|a| a.is_for(block));
        self.check_not_failed()?;
        let hash = block.block_hash();
        if let Some(outcome) = self.known_block(&hash) {
            return Ok(outcome);
        }
        let id = match self.index.accept_header(&block.header, now_secs()) {
            Ok(id) => id,
            Err(e) => return Ok(self.reject(e.reject_reason(), e.to_string())),
        };
        self.ensure_meta(id);
        let entry = self
            .index
            .get(id)
            .cloned()
            .ok_or_else(|| PipelineError::Inconsistent {
                reason: "accepted header vanished".into(),
            })?;
        let parent = entry.prev.unwrap_or(BlockId(0));
        let prepared = prepared.filter(|a| a.parent() == parent);
        // Validated ahead on the same parent: `check_block` passed there,
        // under the same context.
        if prepared.is_none() {
            let checked = self.with_context(entry.height, hash, parent, |ctx| {
                validation::check_block(block, ctx)
            });
            if let Err(e) = checked {
                return self.refuse_checked(id, entry.height, &hash, &e);
            }
        }
        let batch = self.store_block_data(id, block)?;
        let tip = self.index.tip().id;
        if entry.prev == Some(tip)
            && self.index.best_candidate() == id
            && !self.refused_tips.contains(&id)
        {
            // The block extends the active tip and is the best candidate
            // (the common case: import, sync): storing and connecting it is
            // one block boundary, one commit (or one block of a group
            // while catching up).
            let ahead = Lookahead { prepared, next };
            self.connect(id, Some(block), batch, ahead)?;
        } else {
            self.commit_boundary(batch)?;
        }
        self.activate_best_chain()?;
        Ok(self.outcome_of(id, &hash))
    }

    /// The outcome of submitting a block whose hash the index already
    /// holds with data (a duplicate) or as invalid; `None` for a new block.
    fn known_block(&mut self, hash: &BlockHash) -> Option<SubmitOutcome> {
        let status = self.index.by_hash(hash)?.status;
        if status.has_data() {
            return Some(SubmitOutcome::Duplicate);
        }
        status.is_invalid().then(|| {
            self.reject(
                DUPLICATE_INVALID,
                format!("block {hash} is already known invalid"),
            )
        })
    }

    /// Records that block `id` (at `height`) failed the context checks
    /// with `e`: a mutated body leaves the header headers-only (stored as
    /// such, so ids on disk stay dense); any other failure marks the block
    /// and its descendants invalid, durably.
    ///
    /// # Errors
    /// [`PipelineError`] when the index database fails.
    fn refuse_checked(
        &mut self,
        id: BlockId,
        height: u32,
        hash: &BlockHash,
        e: &BlockError,
    ) -> Result<SubmitOutcome, PipelineError> {
        let reason = e.reject_reason();
        let detail = e.to_string();
        let mut batch = self.take_batch();
        if e.is_mutation() {
            // A mutated block (CVE-2012-2459 and friends) says nothing
            // about the header: another body may be valid.
            self.put_record(&mut batch, id);
        } else {
            let changed = self.index.mark_invalid(id);
            self.meta[id.0 as usize].reject_reason = reason.to_string();
            for changed in changed {
                self.put_record(&mut batch, changed);
            }
        }
        self.commit_boundary(batch)?;
        if !e.is_mutation() {
            tracing::warn!(height, block_hash = %hash, reason, "block rejected: {detail}");
        }
        Ok(self.reject(reason, detail))
    }

    /// Appends block `id`'s bytes to the block files (durable with the
    /// commit that first points to them) and returns the batch holding its
    /// record and the files' new length.
    ///
    /// # Errors
    /// [`PipelineError`] when the block files fail.
    fn store_block_data(
        &mut self,
        id: BlockId,
        block: &Block,
    ) -> Result<WriteBatch, PipelineError> {
        let loc = self.blocks.append(&serialize(block))?;
        self.meta[id.0 as usize].data = Some(loc);
        self.meta[id.0 as usize].tx_count = block.txdata.len() as u32;
        self.index.set_status(id, BlockStatus::HaveData);
        let mut batch = self.take_batch();
        self.put_record(&mut batch, id);
        batch.put_meta(META_FLAT_BLOCKS, &flat_pos_bytes(self.blocks.position()));
        Ok(batch)
    }

    /// The outcome of a stored block `id` once the best chain is active:
    /// rejected (with the reason it was marked invalid for) or accepted
    /// (with the tip reached).
    fn outcome_of(&mut self, id: BlockId, hash: &BlockHash) -> SubmitOutcome {
        let status = self.index.get(id).map(|e| e.status);
        if status.is_some_and(|s| s.is_invalid()) {
            let m = &self.meta[id.0 as usize];
            let detail = match self.last_reject.take() {
                Some((rejected, detail)) if rejected == id => detail,
                _ => format!("block {hash} is invalid: {}", m.reject_reason),
            };
            return SubmitOutcome::Rejected {
                reason: m.reject_reason.clone(),
                detail,
            };
        }
        let tip = self.index.tip();
        SubmitOutcome::Accepted {
            tip: tip.hash,
            height: tip.height,
        }
    }

    /// Stops every later write after `cause` broke a block boundary
    /// half-way; returns the [`PipelineError::Failed`] to report, which
    /// keeps `cause` as its source.
    pub(super) fn stop_writes(&mut self, cause: PipelineError) -> PipelineError {
        // The index rows' background compaction stops too: nothing is
        // written after a failure (a restart reconciles from the disk).
        self.store.halt_rows();
        let source = Arc::new(cause);
        self.failed = Some(source.clone());
        PipelineError::Failed { source }
    }

    pub(super) fn check_not_failed(&self) -> Result<(), PipelineError> {
        match &self.failed {
            Some(source) => Err(PipelineError::Failed {
                source: source.clone(),
            }),
            None => Ok(()),
        }
    }

    pub(super) fn reject(&mut self, reason: &str, detail: String) -> SubmitOutcome {
        self.stats.blocks_rejected += 1;
        SubmitOutcome::Rejected {
            reason: reason.to_string(),
            detail,
        }
    }

    /// Moves the active tip to the most-work valid chain whose data is
    /// stored, connecting blocks one by one.
    pub(super) fn activate_best_chain(&mut self) -> Result<(), PipelineError> {
        loop {
            let candidate = self.index.best_candidate();
            let tip = self.index.tip().id;
            if candidate == tip || self.refused_tips.contains(&candidate) {
                return Ok(());
            }
            let Some(fork) = self.index.fork_point(tip, candidate) else {
                return Ok(());
            };
            let fork_height = self.index.get(fork).map(|e| e.height).unwrap_or(0);
            let depth = self.index.tip_height() - fork_height;
            if depth > PURGE_DEPTH {
                let c = self.index.get(candidate).map(|e| (e.hash, e.height));
                tracing::error!(depth, candidate = ?c, "reorg deeper than {PURGE_DEPTH} blocks refused");
                self.refused_tips.insert(candidate);
                self.stats.reorgs_refused += 1;
                return Ok(());
            }
            if fork != tip {
                self.stats.reorgs += 1;
                tracing::info!(depth, fork_height, "reorganisation");
                // A group is one branch: make it durable before leaving it.
                self.flush()?;
            }
            for id in self.index.path_from(fork, candidate) {
                let status = self.index.get(id).map(|e| e.status);
                let ok = match status {
                    Some(BlockStatus::Valid) => {
                        self.switch_tip(id)?;
                        true
                    }
                    Some(BlockStatus::HaveData) => {
                        let batch = self.take_batch();
                        self.connect(id, None, batch, Lookahead::default())?
                    }
                    _ => false,
                };
                if !ok {
                    break;
                }
            }
        }
    }

    /// Makes the already-validated block `id` the active tip (a view switch:
    /// no UTXO-table work) and commits.
    pub(super) fn switch_tip(&mut self, id: BlockId) -> Result<(), PipelineError> {
        let mut batch = self.take_batch();
        self.muhash_to(&mut batch, id, None)?;
        self.set_active(&mut batch, id);
        self.commit_boundary(batch)?;
        self.seal_final_epochs()?;
        self.publish();
        Ok(())
    }

    /// Sets `id` as active tip in memory and records the height rows and the
    /// tip marker in `batch`.
    pub(super) fn set_active(&mut self, batch: &mut WriteBatch, id: BlockId) {
        let old_height = self.index.tip_height();
        let fork_height = self.index.set_active_tip(id);
        let new_height = self.index.tip_height();
        for h in fork_height + 1..=new_height {
            if let Some(e) = self.index.active_at(h) {
                batch.put_active(h, e.id);
            }
        }
        for h in new_height + 1..=old_height {
            batch.remove_active(h);
        }
        batch.put_meta(META_TIP, &id.0.to_be_bytes());
    }
}
