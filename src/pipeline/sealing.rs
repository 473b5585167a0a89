//! Sealing the archive epochs of final blocks (`docs/archive.md`), off the
//! writer, through the chain state's [`Sealer`](super::sealer::Sealer): at
//! a durable boundary that makes an epoch complete (its last height 100
//! blocks below the tip), the writer hands a snapshot of itself to a
//! sealing thread and goes on; the thread reads the epoch's spent outputs
//! from the flat files, seals the epoch with bounded memory
//! ([`crate::archive::EpochBuilder`]) and returns the archive with the
//! epoch added, which the writer installs at the next durable boundary
//! that finds the thread done. One seal runs at a time, epochs in order;
//! the writer waits for one only in [`Chainstate::finish_seals`] (the end
//! of an import) and on drop.
//!
//! Crash safety is the archive's own: an epoch file and the header list
//! are each written to a temporary file, synced and renamed, and
//! [`Chainstate::open`] re-drives any seal a crash interrupted (sealing is
//! idempotent and its leaves are a function of the final chain, which no
//! allowed reorg changes: deeper than 100 blocks is refused).

use crate::sozu::PURGE_DEPTH;

use super::{Chainstate, PipelineError};

impl Chainstate {
    /// At a durable boundary: installs a finished seal, and starts sealing
    /// the next complete epoch of final blocks (final height = tip height −
    /// [`PURGE_DEPTH`]; epoch n is complete once `(n+1)·L − 1` is final)
    /// if none is running. Never waits.
    ///
    /// # Errors
    /// The finished seal's error: [`PipelineError::Archive`] (a
    /// `SealMismatch` means the archive directory disagrees with the
    /// chain: move it away and restart to rebuild it), or
    /// [`PipelineError::Read`] for the spent outputs it reads. Writes stop
    /// then ([`PipelineError::Failed`], naming the file); the next start
    /// seals the epoch again.
    pub(super) fn seal_final_epochs(&mut self) -> Result<(), PipelineError> {
        if self.sealer.is_finished() {
            let installed = self.sealer.install();
            self.guard_writes(installed)?;
        }
        if !self.sealer.is_running() {
            self.start_seal();
        }
        Ok(())
    }

    /// Makes an open group durable ([`Chainstate::flush`]), then waits for
    /// every complete epoch to be sealed and installed and for the index
    /// rows' background compaction, and publishes (the end of an import;
    /// tests).
    ///
    /// # Errors
    /// As [`Chainstate::flush`], the sealing of final epochs, and a failed
    /// compaction of the index rows (writes stop).
    pub fn finish_seals(&mut self) -> Result<(), PipelineError> {
        self.flush()?;
        if !self.sealer.is_running() {
            self.start_seal();
        }
        while self.sealer.is_running() {
            let installed = self.sealer.install();
            self.guard_writes(installed)?;
            self.start_seal();
        }
        let settled = self.store.settle_rows().map_err(PipelineError::from);
        self.guard_writes(settled)?;
        self.publish();
        Ok(())
    }

    /// Starts sealing the next complete epoch, if there is one, from a
    /// snapshot of the writer's current state.
    fn start_seal(&mut self) {
        let Some(final_height) = self.index.tip_height().checked_sub(PURGE_DEPTH) else {
            return;
        };
        let Some(epoch) = self.sealer.next_sealable(final_height) else {
            return;
        };
        let snapshot = self.current();
        self.sealer.start(epoch, snapshot);
    }

    /// Waits for a running seal on drop (a sealing thread must not outlive
    /// its chain state: a new one may open the same archive directory).
    pub(super) fn join_seal(&mut self) {
        if let Err(e) = self.sealer.install() {
            tracing::error!(error = %e, "sealing an archive epoch");
        }
    }
}
