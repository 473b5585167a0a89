//! kakehi's own store of the index rows: three sets of fixed-size,
//! key-only rows (transactions 16 bytes, spends 16 bytes, address history
//! 20 bytes; `super::TxRowKey`, `super::SpendRowKey`, `super::HistoryKey`),
//! each an in-memory sorted set plus immutable sorted run files, with a
//! write-ahead row log, in the directory `index/rows/` of the datadir: an
//! LSM tree without levels of its own (size-tiered runs).
//!
//! - **Writes.** Rows applied ([`RowSet::insert`]) are visible to readers
//!   at once, not durable. [`RowSets::commit`] makes them durable: as one
//!   record appended to the row log (`log.rs`) and synced once
//!   (`fdatasync`, no directory sync), the rows staying in memory; or, when
//!   the memory holds [`RowOptions::memory_bound`] bytes of keys
//!   ([`MEMORY_BOUND`] by default), the commit brings a quarter of that
//!   or more, or an earlier write failed, by
//!   [`RowSets::flush`]: each set's rows in memory as one new run file
//!   (`run.rs`), fsynced, then the manifest (`manifest.rs`) replaced to
//!   name them and the log's next generation (the log restarts). The
//!   index database's commit calls it before its sled transaction, so rows
//!   are durable before the commit that connects their blocks; a crash
//!   between leaves rows of blocks not connected, which every reader
//!   ignores (index format 3.0), and a crash mid-append tears only the
//!   record of a commit that never returned.
//! - **Open** reads the manifest and each run's header and summary (the
//!   checksum of each partition of its filter and block index, about
//!   0.0016 bytes per key, checked by the file's trailer; not its keys,
//!   filter or block index, `run.rs`), deletes the files the manifest does not name
//!   (a run written by a flush or compaction that a crash cut short, the
//!   manifest's and log's temporary files), and replays the log's records
//!   of the manifest's generation into memory, up to the first torn or
//!   damaged one. A damaged run or manifest is [`RunError::Corrupt`]
//!   naming the file. A store written before the log existed (manifest
//!   `KKHRMAN1`, no `LOG`) opens with an empty log.
//! - **Compaction** (`compact.rs`) merges runs of similar size on a
//!   background thread, in fixed memory whatever their size (the writer
//!   keeps a few 4 KiB to 64 KiB buffers, `writer.rs`); its failure is reported by the next flush (the
//!   commit then fails and the node stops writing, as for any failed
//!   write of the index) and by [`RowSets::settle`].
//! - **Reads** merge memory and the runs (each run's filter skips most
//!   runs for a given 8-byte prefix), on a snapshot of the run list. The
//!   runs' filter and block-index partitions are read through one cache
//!   per store, of [`RowOptions::filter_cache`] bytes: the memory of the
//!   runs does not grow with the rows.
//!
//! Rows are never removed (readers filter them by the active chain), so a
//! set only grows; equal keys are kept once.
//!
//! Every write and fsync of these files passes the I/O fault seam
//! ([`crate::store::fault`]).

mod bloom;
mod compact;
mod error;
mod layout;
mod log;
mod manifest;
mod run;
mod set;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

pub use error::RunError;
use layout::PART_BYTES;
pub use log::LogPosition;
use log::RowLog;
use manifest::{Manifest, WriteError};
use run::{PartCache, Run};
pub use set::RowSet;
use writer::RunWriter;

/// Key length of the transaction rows.
pub const TX_KEY: usize = 16;
/// Key length of the spend rows.
pub const SPEND_KEY: usize = 16;
/// Key length of the address-history rows.
pub const HISTORY_KEY: usize = 20;
/// The sets' names, in manifest order: their run files' prefixes.
const SET_NAMES: [&str; manifest::SETS] = ["tx", "spend", "history"];
/// Bytes of keys the three sets may hold in memory (logged, not in runs)
/// before a commit flushes them to runs: 16 MiB, about 10⁶ rows. RAM
/// the node pays: about 1.5 times this in the sorted sets (B-tree nodes
/// about 70 % full), and this again on disk in the log file; the time to
/// replay the log at open grows with it (`docs/benchmarks-history.md`, "Row log").
pub const MEMORY_BOUND: usize = 16 << 20;
/// Default budget of the cache of the runs' filter and block-index
/// partitions: 256 MiB, enough for every partition of the whole
/// testnet4-sized chain (about 1.33 bytes per row; mainnet's ~8·10⁹ rows
/// would need ~10 GiB to keep them all, and read the others from the
/// files).
pub const DEFAULT_FILTER_CACHE: usize = 256 << 20;

/// The row store's memory knobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowOptions {
    /// Bytes of keys the three sets may hold in memory before a commit
    /// flushes them to runs ([`MEMORY_BOUND`] by default, config
    /// `index.rows_memory_mib`); a commit bringing a quarter of it or more
    /// writes runs rather than a log record (a large group of blocks while
    /// catching up: written once, not twice).
    pub memory_bound: usize,
    /// Budget of the cache of the runs' filter and block-index partitions,
    /// bytes ([`DEFAULT_FILTER_CACHE`], config `index.filter_cache_mib`).
    /// Answers are the same for every budget; a smaller one reads more
    /// partitions from the files (4 KiB each).
    pub filter_cache: usize,
}

impl Default for RowOptions {
    fn default() -> Self {
        RowOptions {
            memory_bound: MEMORY_BOUND,
            filter_cache: DEFAULT_FILTER_CACHE,
        }
    }
}

/// The run-number and log-generation counters, under one lock with every
/// change of the run lists and manifest.
struct Counters {
    /// The next run number.
    next: u64,
    /// The row log's generation named by the manifest.
    log_generation: u64,
}

/// The row log and whether the next commit must flush instead.
struct LogState {
    log: RowLog,
    /// A write of the log or of a flush failed: the next commit flushes
    /// (module doc of `log.rs`).
    must_flush: bool,
}

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
    /// Held while the run lists and manifest change (one change at a
    /// time).
    manifest: Mutex<Counters>,
    /// The row log; held by a commit (one at a time).
    log: Mutex<LogState>,
    /// Where the log's valid records ended at open.
    opened: LogPosition,
    /// The memory knobs.
    options: RowOptions,
    /// The runs' filter and block-index partitions.
    cache: Arc<PartCache>,
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
        let mut counters = self.manifest.lock();
        counters.next += 1;
        counters.next - 1
    }

    /// The manifest naming the current runs, with `counters`.
    fn manifest(&self, counters: &Counters) -> Manifest {
        Manifest {
            next: counters.next,
            log_generation: counters.log_generation,
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
        let counters = self.manifest.lock();
        let mut runs: Vec<Arc<Run<N>>> = set
            .runs()
            .iter()
            .filter(|r| inputs.iter().all(|i| i.number() != r.number()))
            .cloned()
            .collect();
        runs.push(output);
        let mut m = self.manifest(&counters);
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
        w.finish(number, &core.cache)
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
    /// `options` gives the memory knobs.
    ///
    /// # Errors
    /// [`RunError::Io`]; [`RunError::Corrupt`] for a damaged manifest or
    /// run (naming the file).
    pub fn open(dir: &Path, options: RowOptions) -> Result<(RowSets, bool), RunError> {
        let io = RunError::io(dir);
        let cache = Arc::new(PartCache::new(options.filter_cache, PART_BYTES));
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
        remove_unlisted(dir, &listed)?;
        let (txs, spends, history) = (
            RowSet::new(names[0], open_runs(dir, &listed[0], &cache)?),
            RowSet::new(names[1], open_runs(dir, &listed[1], &cache)?),
            RowSet::new(names[2], open_runs(dir, &listed[2], &cache)?),
        );
        let log = RowLog::open(dir, m.log_generation, &mut |record| {
            txs.load(record[0]);
            spends.load(record[1]);
            history.load(record[2]);
        })?;
        let core = Arc::new(Core {
            dir: dir.to_path_buf(),
            opened: log.position(),
            options,
            cache,
            txs,
            spends,
            history,
            manifest: Mutex::new(Counters {
                next: m.next,
                log_generation: m.log_generation,
            }),
            log: Mutex::new(LogState {
                log,
                must_flush: false,
            }),
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

    /// Bytes the three sets hold in memory ([`RowSet::resident_bytes`]):
    /// the keys not yet in runs (at most about
    /// [`RowOptions::memory_bound`] plus one commit's), for every run the
    /// checksums and first keys of its partitions (about 0.0014 bytes per
    /// row), and the partition cache ([`RowSets::cache_bytes`], at most
    /// [`RowOptions::filter_cache`]).
    pub fn resident_bytes(&self) -> usize {
        let c = &*self.core;
        c.txs.resident_bytes()
            + c.spends.resident_bytes()
            + c.history.resident_bytes()
            + self.cache_bytes()
    }

    /// Bytes the cache of run partitions holds now (at most
    /// [`RowOptions::filter_cache`]).
    pub fn cache_bytes(&self) -> usize {
        self.core.cache.bytes()
    }

    /// Makes every row inserted so far durable, the cheaper way: one
    /// record appended to the row log and synced (`log.rs`), or, when the
    /// rows in memory reach [`RowOptions::memory_bound`] bytes, the rows
    /// to log reach a quarter of it, or an earlier write failed, a flush
    /// to run files ([`RowSets::flush`]).
    ///
    /// # Errors
    /// A compaction failure not yet reported; [`RunError::Io`] naming the
    /// file that failed: the rows stay in memory (visible, not durable)
    /// and the next commit flushes them to runs.
    /// Returns where the log's durable records end then: the index
    /// database records it with the blocks the rows belong to, and checks
    /// at open that the log reaches it ([`RowSets::check_log`]).
    pub fn commit(&self) -> Result<LogPosition, RunError> {
        if let Some(e) = self.core.failed.lock().take() {
            return Err(e);
        }
        let core = &*self.core;
        let mut log = core.log.lock();
        let pending =
            core.txs.pending_bytes() + core.spends.pending_bytes() + core.history.pending_bytes();
        let memory =
            core.txs.memory_bytes() + core.spends.memory_bytes() + core.history.memory_bytes();
        let bound = core.options.memory_bound;
        if log.must_flush || memory >= bound || pending >= bound / 4 {
            self.flush_locked(&mut log)?;
            return Ok(log.log.position());
        } else if pending == 0 {
            return Ok(log.log.position());
        }
        let (t, s, h) = (
            core.txs.take_pending(),
            core.spends.take_pending(),
            core.history.take_pending(),
        );
        let appended = log
            .log
            .append(&[t.as_flattened(), s.as_flattened(), h.as_flattened()]);
        // The rows stay in memory; whether the record is on disk is
        // unknown: the next commit writes them to runs.
        log.must_flush |= appended.is_err();
        appended.map(|()| log.log.position())
    }

    /// Checks that the log, as opened, holds every record up to
    /// `committed` (a position [`RowSets::commit`] returned and the index
    /// database recorded with the blocks whose rows it holds): a torn
    /// append loses only records after it, so a log that ends before it,
    /// or a manifest of an older generation, is damaged.
    ///
    /// # Errors
    /// [`RunError::Corrupt`] naming the log.
    pub fn check_log(&self, committed: LogPosition) -> Result<(), RunError> {
        let opened = self.core.opened;
        let bad = |reason| Err(RunError::corrupt(&self.core.dir.join(log::NAME), reason));
        if committed.generation > opened.generation {
            return bad("the row manifest is older than the index's last commit");
        }
        if committed.generation == opened.generation && committed.end > opened.end {
            return bad("the row log ends before the rows of committed blocks");
        }
        Ok(())
    }

    /// Makes every row inserted so far durable in run files: one run file
    /// per set with rows in memory, fsynced (the three at once), then the
    /// manifest, naming the row log's next generation (the log restarts).
    ///
    /// # Errors
    /// A compaction failure not yet reported; or [`RunError::Io`] naming
    /// the file that failed: the rows stay in memory (visible, not
    /// durable) and the manifest names the old runs.
    pub fn flush(&self) -> Result<(), RunError> {
        if let Some(e) = self.core.failed.lock().take() {
            return Err(e);
        }
        self.flush_locked(&mut self.core.log.lock())
    }

    /// [`RowSets::flush`], the log's lock held.
    fn flush_locked(&self, log: &mut LogState) -> Result<(), RunError> {
        let core = &*self.core;
        let mut counters = core.manifest.lock();
        let base = counters.next;
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
        // After a failed write the manifest is written even with no rows:
        // it must name a generation after every record written before.
        if t.is_none() && s.is_none() && h.is_none() && !log.must_flush {
            return Ok(());
        }
        counters.next = base + 3;
        let generation = counters.log_generation + 1;
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
                next: counters.next,
                log_generation: generation,
                sets: [numbers(&lists.0), numbers(&lists.1), numbers(&lists.2)],
            };
            let written = m.write(&core.dir);
            if !matches!(written, Err(WriteError::Before(_))) {
                counters.log_generation = generation;
                core.txs.install(lists.0, true);
                core.spends.install(lists.1, true);
                core.history.install(lists.2, true);
            }
            written
        })();
        drop(counters);
        self.installed(log, installed, base, generation)
    }

    /// The end of a flush that wrote runs `base..base + 3` and tried the
    /// manifest naming `generation`: restarts the log, or undoes the runs.
    fn installed(
        &self,
        log: &mut LogState,
        installed: Result<(), WriteError>,
        base: u64,
        generation: u64,
    ) -> Result<(), RunError> {
        let core = &*self.core;
        // Every failure: the next commit flushes again, never logs (after
        // a failed directory sync either manifest may stand, so records of
        // neither generation may be written yet).
        log.must_flush = installed.is_err();
        match installed {
            Ok(()) => {
                log.log.restart(generation);
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

/// Deletes every file of `dir` but the manifest, the row log and the runs
/// `listed` (leftovers of a flush or compaction a crash cut short, the
/// manifest's and the log's temporary files).
fn remove_unlisted(dir: &Path, listed: &[Vec<(String, u64)>]) -> Result<(), RunError> {
    let io = RunError::io(dir);
    for entry in std::fs::read_dir(dir).map_err(&io)? {
        let entry = entry.map_err(&io)?;
        let name = entry.file_name();
        let keep = name == manifest::NAME
            || name == log::NAME
            || listed.iter().flatten().any(|(n, _)| name == n.as_str());
        if !keep {
            std::fs::remove_file(entry.path()).map_err(RunError::io(&entry.path()))?;
        }
    }
    Ok(())
}

fn open_runs<const N: usize>(
    dir: &Path,
    files: &[(String, u64)],
    cache: &Arc<PartCache>,
) -> Result<Vec<Arc<Run<N>>>, RunError> {
    files
        .iter()
        .map(|(name, n)| Run::open(&dir.join(name), *n, cache).map(Arc::new))
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
