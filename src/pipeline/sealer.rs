//! [`Sealer`]: the part of the chain state that owns the archive of sealed
//! epochs and the one seal running on its own thread. It knows nothing of
//! the writer: the writer hands it a snapshot of itself to seal from and
//! decides when to install a finished seal (`sealing.rs`, at durable
//! boundaries), as zebra-state's finalized state is driven by its caller.

use std::thread::JoinHandle;
use std::time::Instant;

use bitcoin::hex::DisplayHex;

use crate::archive::{Archive, EpochHeader};
use crate::snapshot::{ChainSnapshot, ReadError};

use super::PipelineError;

/// What a sealing thread returns: the archive with the epoch added, its
/// header and leaf count.
type Sealed = Result<(Archive, EpochHeader, usize), PipelineError>;

/// A seal running on its own thread.
#[derive(Debug)]
struct SealJob {
    epoch: u32,
    started: Instant,
    handle: JoinHandle<Sealed>,
}

/// The archive of sealed epochs (`datadir/archive`) and the seal running
/// in the background, if any. One seal runs at a time, epochs in order.
#[derive(Debug)]
pub(super) struct Sealer {
    /// The sealed epochs as of the last installed seal.
    archive: Archive,
    /// The epoch seal running in the background, if any.
    job: Option<SealJob>,
}

impl Sealer {
    /// A sealer of `archive`, with no seal running.
    pub(super) fn new(archive: Archive) -> Self {
        Sealer { archive, job: None }
    }

    /// The archive as of the last installed seal (what snapshots publish).
    pub(super) fn archive(&self) -> &Archive {
        &self.archive
    }

    /// Whether a seal is running (or finished and not installed yet).
    pub(super) fn is_running(&self) -> bool {
        self.job.is_some()
    }

    /// Whether a seal is running and its thread has finished: installing
    /// it then does not wait.
    pub(super) fn is_finished(&self) -> bool {
        self.job.as_ref().is_some_and(|j| j.handle.is_finished())
    }

    /// The next epoch to seal once blocks up to `final_height` are final,
    /// if it is complete (see [`Archive::next_sealable`]).
    pub(super) fn next_sealable(&self, final_height: u32) -> Option<u32> {
        self.archive.next_sealable(final_height)
    }

    /// Starts sealing `epoch` on its own thread from `snapshot`'s spent
    /// outputs, with bounded memory ([`crate::archive::EpochBuilder`]).
    /// Call only when no seal is running ([`Sealer::is_running`]).
    pub(super) fn start(&mut self, epoch: u32, snapshot: ChainSnapshot) {
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
        self.job = Some(SealJob {
            epoch,
            started: Instant::now(),
            handle,
        });
    }

    /// Waits for the running seal (if any) and installs its archive.
    ///
    /// # Errors
    /// The seal's error ([`PipelineError::Archive`],
    /// [`PipelineError::Read`]), or [`PipelineError::Inconsistent`] when
    /// its thread panicked. The archive stays as it was then.
    pub(super) fn install(&mut self) -> Result<(), PipelineError> {
        let Some(job) = self.job.take() else {
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
}
