//! kakehi's own store of the index rows: three sets of fixed-size,
//! key-only rows (transactions 16 bytes, spends 16 bytes, address history
//! 20 bytes; `super::TxRowKey`, `super::SpendRowKey`, `super::HistoryKey`),
//! each an in-memory sorted set plus immutable sorted run files, in the
//! directory `index/rows/` of the datadir.
//!
//! - **Writes.** Rows applied ([`RowSet::insert`]) are visible to readers
//!   at once, not durable. [`RowSets::flush`] writes each set's rows in
//!   memory as one new run file (`run.rs`), fsynced, then replaces the
//!   manifest (`manifest.rs`) to name them: after it returns the rows are
//!   durable. The index database's commit calls it before its sled
//!   transaction, so rows are durable before the commit that connects
//!   their blocks; a crash between leaves rows of blocks not connected,
//!   which every reader ignores (index format 3.0).
//! - **Open** reads the manifest and each run's header, block index and
//!   filter (not its keys), and deletes the files the manifest does not
//!   name (a run written by a flush or compaction that a crash cut
//!   short, the manifest's temporary file). A damaged run or manifest is
//!   [`RunError::Corrupt`] naming the file.
//! - **Compaction** (`compact.rs`) merges runs of similar size on a
//!   background thread; its failure is reported by the next flush (the
//!   commit then fails and the node stops writing, as for any failed
//!   write of the index) and by [`RowSets::settle`].
//! - **Reads** merge memory and the runs (each run's filter skips most
//!   runs for a given 8-byte prefix), on a snapshot of the run list.
//!
//! Rows are never removed (readers filter them by the active chain), so a
//! set only grows; equal keys are kept once.
//!
//! Every write and fsync of these files passes the I/O fault seam
//! ([`crate::store::fault`]).

mod bloom;
mod compact;
mod error;
mod manifest;
mod run;
mod set;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

pub use error::RunError;
use manifest::{Manifest, WriteError};
use run::{Run, RunWriter};
pub use set::RowSet;

/// Key length of the transaction rows.
pub const TX_KEY: usize = 16;
/// Key length of the spend rows.
pub const SPEND_KEY: usize = 16;
/// Key length of the address-history rows.
pub const HISTORY_KEY: usize = 20;
/// The sets' names, in manifest order: their run files' prefixes.
const SET_NAMES: [&str; manifest::SETS] = ["tx", "spend", "history"];

/// What the three sets and their manifest share with the compaction
/// thread.
pub(crate) struct Core {
    dir: PathBuf,
    /// Transaction rows.
    pub txs: RowSet<TX_KEY>,
    /// Spend rows.
    pub spends: RowSet<SPEND_KEY>,
    /// Address-history rows.
    pub history: RowSet<HISTORY_KEY>,
    /// The next run number; held while the run lists and manifest change
    /// (one change at a time).
    manifest: Mutex<u64>,
    compact_lock: Mutex<()>,
    /// The first compaction failure not yet reported.
    failed: Mutex<Option<RunError>>,
    stop: AtomicBool,
    /// Compaction rounds requested and done, and its condition variable.
    rounds: Mutex<(u64, u64)>,
    rounds_done: Condvar,
}

/// The three row sets of the index (cheap to clone: shared).
#[derive(Clone)]
pub struct RowSets {
    core: Arc<Core>,
    _closer: Arc<Closer>,
}

impl std::fmt::Debug for RowSets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowSets")
            .field("dir", &self.core.dir)
            .finish()
    }
}

/// Stops and joins the compaction thread when the last handle drops.
struct Closer {
    core: Arc<Core>,
    thread: Mutex<Option<(SyncSender<()>, JoinHandle<()>)>>,
}

impl Drop for Closer {
    fn drop(&mut self) {
        self.core.stop.store(true, Ordering::Release);
        if let Some((sender, handle)) = self.thread.lock().take() {
            drop(sender);
            // A panic of the thread has nothing left to report to.
            let _ = handle.join();
        }
    }
}

impl Core {
    fn run_path(&self, set: &str, number: u64) -> PathBuf {
        self.dir.join(run_name(set, number))
    }

    fn allocate_number(&self) -> u64 {
        let mut next = self.manifest.lock();
        *next += 1;
        *next - 1
    }

    /// The manifest naming the current runs, with `next`.
    fn manifest(&self, next: u64) -> Manifest {
        Manifest {
            next,
            sets: [
                numbers(&self.txs.runs()),
                numbers(&self.spends.runs()),
                numbers(&self.history.runs()),
            ],
        }
    }

    /// Makes `output` replace `inputs` in `set` (index `idx`): manifest
    /// first, then the in-memory list (also when only the manifest's last
    /// directory sync failed: the new manifest may stand).
    fn replace_runs<const N: usize>(
        &self,
        set: &RowSet<N>,
        idx: usize,
        inputs: &[Arc<Run<N>>],
        output: Arc<Run<N>>,
    ) -> Result<(), WriteError> {
        let next = self.manifest.lock();
        let mut runs: Vec<Arc<Run<N>>> = set
            .runs()
            .iter()
            .filter(|r| inputs.iter().all(|i| i.number() != r.number()))
            .cloned()
            .collect();
        runs.push(output);
        let mut m = self.manifest(*next);
        m.sets[idx] = numbers(&runs);
        let written = m.write(&self.dir);
        if !matches!(written, Err(WriteError::Before(_))) {
            set.install(runs, false);
        }
        written
    }
}

/// The numbers of `runs`, in order.
fn numbers<const N: usize>(runs: &[Arc<Run<N>>]) -> Vec<u64> {
    runs.iter().map(|r| r.number()).collect()
}

/// Writes `set`'s frozen rows as run `number`, if any.
fn write_frozen<const N: usize>(
    core: &Core,
    set: &RowSet<N>,
    number: u64,
) -> Option<Result<Arc<Run<N>>, RunError>> {
    let frozen = set.freeze()?;
    let path = core.run_path(set.name, number);
    let written = RunWriter::<N>::create(&path, frozen.len()).and_then(|mut w| {
        for key in frozen.iter() {
            w.push(key)?;
        }
        w.finish(number)
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&path);
    }
    Some(written.map(Arc::new))
}

/// The result of a run writer thread that panicked.
fn gone<T>(core: &Core) -> Option<Result<T, RunError>> {
    let e = std::io::Error::other("run writer thread panicked");
    Some(Err(RunError::io(&core.dir)(e)))
}

/// The new run list of `set` after a flush wrote `new`.
fn with_new<const N: usize>(set: &RowSet<N>, new: &Option<Arc<Run<N>>>) -> Vec<Arc<Run<N>>> {
    let mut runs = set.runs().to_vec();
    runs.extend(new.iter().cloned());
    runs
}

impl RowSets {
    /// Opens (or creates) the row store in `dir`: reads the manifest,
    /// opens the runs it names, deletes every other file, and starts the
    /// compaction thread. Returns the store and whether it was created
    /// (there was no manifest).
    ///
    /// # Errors
    /// [`RunError::Io`]; [`RunError::Corrupt`] for a damaged manifest or
    /// run (naming the file).
    pub fn open(dir: &Path) -> Result<(RowSets, bool), RunError> {
        let io = RunError::io(dir);
        std::fs::create_dir_all(dir).map_err(&io)?;
        let found = Manifest::read(dir)?;
        let created = found.is_none();
        let m = found.unwrap_or_default();
        let names = SET_NAMES;
        let files = |i: usize| -> Vec<(String, u64)> {
            m.sets[i]
                .iter()
                .map(|&n| (run_name(names[i], n), n))
                .collect()
        };
        let listed: Vec<Vec<(String, u64)>> = (0..names.len()).map(files).collect();
        for entry in std::fs::read_dir(dir).map_err(&io)? {
            let entry = entry.map_err(&io)?;
            let name = entry.file_name();
            let keep =
                name == manifest::NAME || listed.iter().flatten().any(|(n, _)| name == n.as_str());
            if !keep {
                std::fs::remove_file(entry.path()).map_err(RunError::io(&entry.path()))?;
            }
        }
        let core = Arc::new(Core {
            dir: dir.to_path_buf(),
            txs: RowSet::new(names[0], open_runs(dir, &listed[0])?),
            spends: RowSet::new(names[1], open_runs(dir, &listed[1])?),
            history: RowSet::new(names[2], open_runs(dir, &listed[2])?),
            manifest: Mutex::new(m.next),
            compact_lock: Mutex::new(()),
            failed: Mutex::new(None),
            stop: AtomicBool::new(false),
            rounds: Mutex::new((0, 0)),
            rounds_done: Condvar::new(),
        });
        if created {
            m.write(dir).map_err(WriteError::into_inner)?;
        }
        let thread = start_compactor(&core).map_err(&io)?;
        let sets = RowSets {
            _closer: Arc::new(Closer {
                core: core.clone(),
                thread: Mutex::new(Some(thread)),
            }),
            core,
        };
        Ok((sets, created))
    }

    /// The transaction rows.
    pub fn txs(&self) -> &RowSet<TX_KEY> {
        &self.core.txs
    }

    /// The spend rows.
    pub fn spends(&self) -> &RowSet<SPEND_KEY> {
        &self.core.spends
    }

    /// The address-history rows.
    pub fn history(&self) -> &RowSet<HISTORY_KEY> {
        &self.core.history
    }

    /// Makes every row inserted so far durable: one run file per set with
    /// rows in memory, fsynced (the three at once), then the manifest.
    ///
    /// # Errors
    /// A compaction failure not yet reported; or [`RunError::Io`] naming
    /// the file that failed: the rows stay in memory (visible, not
    /// durable) and the manifest names the old runs.
    pub fn flush(&self) -> Result<(), RunError> {
        if let Some(e) = self.core.failed.lock().take() {
            return Err(e);
        }
        let core = &*self.core;
        let mut next = core.manifest.lock();
        let base = *next;
        let (t, s, h) = std::thread::scope(|scope| {
            // Numbers in SET_NAMES order: base, base + 1, base + 2.
            let s = scope.spawn(|| write_frozen(core, &core.spends, base + 1));
            let h = scope.spawn(|| write_frozen(core, &core.history, base + 2));
            let t = write_frozen(core, &core.txs, base);
            (
                t,
                s.join().unwrap_or_else(|_| gone(core)),
                h.join().unwrap_or_else(|_| gone(core)),
            )
        });
        if t.is_none() && s.is_none() && h.is_none() {
            return Ok(());
        }
        *next = base + 3;
        let installed = (|| {
            let before = WriteError::Before;
            let (t, s, h) = (
                t.transpose().map_err(before)?,
                s.transpose().map_err(before)?,
                h.transpose().map_err(before)?,
            );
            let lists = (
                with_new(&core.txs, &t),
                with_new(&core.spends, &s),
                with_new(&core.history, &h),
            );
            let m = Manifest {
                next: *next,
                sets: [numbers(&lists.0), numbers(&lists.1), numbers(&lists.2)],
            };
            let written = m.write(&core.dir);
            if !matches!(written, Err(WriteError::Before(_))) {
                core.txs.install(lists.0, true);
                core.spends.install(lists.1, true);
                core.history.install(lists.2, true);
            }
            written
        })();
        drop(next);
        match installed {
            Ok(()) => {
                self.request_compaction();
                Ok(())
            }
            Err(WriteError::After(e)) => Err(e),
            Err(WriteError::Before(e)) => {
                for (i, set) in SET_NAMES.iter().enumerate() {
                    let _ = std::fs::remove_file(core.run_path(set, base + i as u64));
                }
                core.txs.thaw();
                core.spends.thaw();
                core.history.thaw();
                Err(e)
            }
        }
    }

    fn request_compaction(&self) {
        self.core.rounds.lock().0 += 1;
        let thread = self._closer.thread.lock();
        if let Some((sender, _)) = thread.as_ref() {
            // Full: a round is queued already, and it will see this
            // request; disconnected: the store is closing.
            let _: Result<(), TrySendError<()>> = sender.try_send(());
        }
    }

    /// Waits until every compaction requested so far is done.
    ///
    /// # Errors
    /// A compaction failure not yet reported.
    pub fn settle(&self) -> Result<(), RunError> {
        let core = &self.core;
        let mut rounds = core.rounds.lock();
        let wanted = rounds.0;
        while rounds.1 < wanted && !core.stop.load(Ordering::Acquire) {
            core.rounds_done.wait(&mut rounds);
        }
        drop(rounds);
        core.failed.lock().take().map_or(Ok(()), Err)
    }

    /// Stops compaction for good; returns once none runs (a merge under
    /// way stops at its next block, its output deleted).
    pub fn halt(&self) {
        self.core.stop.store(true, Ordering::Release);
        let _none_runs = self.core.compact_lock.lock();
        self.core.rounds_done.notify_all();
    }

    /// Runs compaction now on the calling thread (tests).
    ///
    /// # Errors
    /// As a compaction.
    #[cfg(test)]
    pub fn compact_now(&self) -> Result<(), RunError> {
        compact::compact_all(&self.core)
    }
}

fn open_runs<const N: usize>(
    dir: &Path,
    files: &[(String, u64)],
) -> Result<Vec<Arc<Run<N>>>, RunError> {
    files
        .iter()
        .map(|(name, n)| Run::open(&dir.join(name), *n).map(Arc::new))
        .collect()
}

/// The file name of run `number` of the set `set`.
fn run_name(set: &str, number: u64) -> String {
    format!("{set}-{number:012}.run")
}

fn start_compactor(core: &Arc<Core>) -> std::io::Result<(SyncSender<()>, JoinHandle<()>)> {
    let (sender, receiver) = sync_channel::<()>(1);
    let core = core.clone();
    let span = tracing::Span::current();
    let handle = std::thread::Builder::new()
        .name("kakehi-compact".into())
        .spawn(move || {
            span.in_scope(|| {
                while receiver.recv().is_ok() {
                    if core.stop.load(Ordering::Acquire) {
                        break;
                    }
                    let wanted = core.rounds.lock().0;
                    if let Err(e) = compact::compact_all(&core) {
                        tracing::warn!(error = %e, "index rows compaction failed");
                        core.failed.lock().get_or_insert(e);
                    }
                    core.rounds.lock().1 = wanted;
                    core.rounds_done.notify_all();
                }
                // Closing: wake any waiter.
                core.rounds_done.notify_all();
            })
        })?;
    Ok((sender, handle))
}

#[cfg(test)]
mod tests;
