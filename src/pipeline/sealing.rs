//! Sealing the archive epochs of final blocks (`docs/archive.md`), off the
//! writer: at a durable boundary that makes an epoch complete (its last
//! height 100 blocks below the tip), the writer hands a snapshot of
//! itself to a sealing thread and goes on; the thread reads the epoch's
//! spent outputs from the flat files, seals the epoch with bounded memory
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

use std::thread::JoinHandle;
use std::time::Instant;

use bitcoin::hex::DisplayHex;

use crate::archive::{Archive, EpochHeader};
use crate::sozu::PURGE_DEPTH;

use super::{Chainstate, PipelineError};
use crate::snapshot::ReadError;

/// What a sealing thread returns: the archive with the epoch added, its
/// header and leaf count.
type Sealed = Result<(Archive, EpochHeader, usize), PipelineError>;

/// A seal running on its own thread.
#[derive(Debug)]
pub(super) struct SealJob {
    epoch: u32,
    started: Instant,
    handle: JoinHandle<Sealed>,
}

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
    /// [`PipelineError::Read`] for the spent outputs it reads. Writes stop then ([`PipelineError::Failed`],
    /// naming the file); the next start seals the epoch again.
    pub(super) fn seal_final_epochs(&mut self) -> Result<(), PipelineError> {
        if self
            .sealing
            .as_ref()
            .is_some_and(|j| j.handle.is_finished())
        {
            let installed = self.install_seal();
            self.guard_writes(installed)?;
        }
        if self.sealing.is_none() {
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
        if self.sealing.is_none() {
            self.start_seal();
        }
        while self.sealing.is_some() {
            let installed = self.install_seal();
            self.guard_writes(installed)?;
            self.start_seal();
        }
        let settled = self.store.settle_rows().map_err(PipelineError::from);
        self.guard_writes(settled)?;
        self.publish();
        Ok(())
    }

    /// Starts sealing the next complete epoch, if there is one.
    fn start_seal(&mut self) {
        let Some(final_height) = self.index.tip_height().checked_sub(PURGE_DEPTH) else {
            return;
        };
        let Some(epoch) = self.archive.next_sealable(final_height) else {
            return;
        };
        let snapshot = self.current();
        let mut archive = self.archive.clone();
        let span = tracing::Span::current();
        let handle = std::thread::spawn(move || -> Sealed {
            let _entered = span.enter();
            let mut builder = archive.epoch_builder(epoch);
            snapshot.for_each_archive_leaf(epoch, &mut |leaf| {
                builder.push(leaf).map_err(ReadError::from)
            })?;
            let count = builder.len();
            let header = archive.seal_built(builder)?;
            Ok((archive, header, count))
        });
        self.sealing = Some(SealJob {
            epoch,
            started: Instant::now(),
            handle,
        });
    }

    /// Waits for the running seal (if any) and installs its archive.
    fn install_seal(&mut self) -> Result<(), PipelineError> {
        let Some(job) = self.sealing.take() else {
            return Ok(());
        };
        let (archive, header, leaves) = job.handle.join().unwrap_or_else(|_| {
            Err(PipelineError::Inconsistent {
                reason: format!("the thread sealing archive epoch {} panicked", job.epoch),
            })
        })?;
        self.archive = archive;
        let commitment = self.archive.commitment().to_lower_hex_string();
        tracing::info!(
            epoch = job.epoch,
            first_height = header.first_height,
            last_height = header.last_height,
            leaves,
            ms = job.started.elapsed().as_millis() as u64,
            commitment,
            "sealed archive epoch"
        );
        Ok(())
    }

    /// Waits for a running seal on drop (a sealing thread must not outlive
    /// its chain state: a new one may open the same archive directory).
    pub(super) fn join_seal(&mut self) {
        if let Err(e) = self.install_seal() {
            tracing::error!(error = %e, "sealing an archive epoch");
        }
    }
}
