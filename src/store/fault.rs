//! The I/O fault seam: every write and every sync of the node's own files
//! outside the Sozu table (flat files of blocks, filters, spent outputs and
//! headers; the index database's commits; the index rows' log, run
//! files, manifest and directory syncs, which carry the address index;
//! the archive's epoch files and header list; the address book
//! `peers.json`; `reindex-chainstate`'s marker, renames and directory
//! syncs, through [`super::durable`]) calls [`check`] first, with the path
//! it is about to touch.
//!
//! Disarmed (always, unless a test arms it), [`check`] is one relaxed
//! atomic load and returns `Ok`. Armed with a [`FaultPlan`], it counts the
//! operations of the planned kind on paths under the planned directory and
//! makes exactly one of them fail, the one after `after` successes, with
//! the planned `errno` (`ENOSPC`, `EIO`): the I/O countdown of redb's
//! fuzzer, here for the whole node. The fault is one-shot: later
//! operations succeed again, so a writer that ignored the failure would go
//! on storing blocks, and a test sees it.
//!
//! The Sozu table has its own countdown backend (`sozu::MemStorage`).
//! sled's own writes (its thread pool's log writes, its background
//! flusher's writes and fsyncs) do not pass here: the seam cannot reach
//! inside the dependency. Its commits ([`super::Store::commit`]: a write
//! before the transaction, a sync before the flush) do; what is and is not
//! covered is in `docs/reliability.md`.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

/// What kind of operation a fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum IoOp {
    /// A write (an append, a positional write, an index batch).
    Write,
    /// A sync (`fdatasync`/`fsync`, sled's flush).
    Sync,
}

/// One planned fault.
#[derive(Clone, Debug)]
pub struct FaultPlan {
    /// Only operations on paths under this directory count.
    pub under: PathBuf,
    /// And only those whose path contains this string (`"/filters/"`,
    /// `"/index"`; empty: all).
    pub path_contains: String,
    /// But not those whose path contains this one (`Some("/reindex.new/")`:
    /// a reindex's swap and directory syncs without the files of the chain
    /// state it builds); `None`: no exclusion.
    pub path_excludes: Option<String>,
    /// The kind of operation that fails.
    pub op: IoOp,
    /// Matching operations that succeed before the one that fails.
    pub after: u64,
    /// The error number it fails with (`libc` values: 28 = `ENOSPC`,
    /// 5 = `EIO`).
    pub errno: i32,
}

/// The fault that fired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fired {
    /// The path of the failed operation.
    pub path: PathBuf,
    /// Its kind.
    pub op: IoOp,
}

/// What an armed plan saw, returned by [`disarm`].
#[derive(Clone, Debug, Default)]
pub struct FaultReport {
    /// Matching operations seen (the failed one included).
    pub matched: u64,
    /// Every operation under the plan's directory, matching or not, counted
    /// by path and kind (a run armed with `after: u64::MAX` measures where
    /// a node writes).
    pub seen: BTreeMap<(PathBuf, IoOp), u64>,
    /// Each regular file's length when it was last synced (what a power
    /// cut keeps of an append-only file: the flat files); for a file
    /// overwritten in place, the end of the bytes that sync made durable
    /// ([`check_sync_to`]).
    pub synced_len: BTreeMap<PathBuf, u64>,
    /// The fault, if it fired.
    pub fired: Option<Fired>,
}

struct Armed {
    plan: FaultPlan,
    report: FaultReport,
}

static ARMED: AtomicBool = AtomicBool::new(false);
static STATE: Mutex<Option<Armed>> = Mutex::new(None);

/// Arms `plan` for the whole process (replacing any armed plan).
pub fn arm(plan: FaultPlan) {
    *STATE.lock() = Some(Armed {
        plan,
        report: FaultReport::default(),
    });
    ARMED.store(true, Ordering::SeqCst);
}

/// Disarms the seam; returns what the plan saw (default when none was
/// armed).
pub fn disarm() -> FaultReport {
    ARMED.store(false, Ordering::SeqCst);
    STATE.lock().take().map(|a| a.report).unwrap_or_default()
}

/// Called before each write or sync of `path`.
///
/// # Errors
/// The planned error, once, when the armed plan's countdown reaches this
/// operation.
pub fn check(op: IoOp, path: &Path) -> io::Result<()> {
    check_with(op, path, None)
}

/// Called before a sync of `path`, a file overwritten in place (the index
/// rows' log), that makes its bytes up to `synced_end` durable: the
/// report's [`FaultReport::synced_len`] records `synced_end`, not the
/// file's length (which counts bytes preallocated past the data).
///
/// # Errors
/// As [`check`].
pub fn check_sync_to(path: &Path, synced_end: u64) -> io::Result<()> {
    check_with(IoOp::Sync, path, Some(synced_end))
}

fn check_with(op: IoOp, path: &Path, synced_end: Option<u64>) -> io::Result<()> {
    if !ARMED.load(Ordering::Relaxed) {
        return Ok(());
    }
    let mut state = STATE.lock();
    let Some(armed) = state.as_mut() else {
        return Ok(());
    };
    let plan = &armed.plan;
    if !path.starts_with(&plan.under) {
        return Ok(());
    }
    *armed
        .report
        .seen
        .entry((path.to_path_buf(), op))
        .or_default() += 1;
    let shown = path.to_string_lossy();
    let matches = op == plan.op
        && shown.contains(plan.path_contains.as_str())
        && !plan
            .path_excludes
            .as_deref()
            .is_some_and(|x| shown.contains(x));
    if matches {
        armed.report.matched += 1;
    }
    let fires = matches && armed.report.fired.is_none() && armed.report.matched > plan.after;
    if !fires {
        // The file's length now is what this sync makes durable (its
        // writer is the caller, blocked here).
        if op == IoOp::Sync {
            let len = synced_end.or_else(|| {
                let m = std::fs::metadata(path).ok().filter(|m| m.is_file());
                m.map(|m| m.len())
            });
            if let Some(len) = len {
                armed.report.synced_len.insert(path.to_path_buf(), len);
            }
        }
        return Ok(());
    }
    armed.report.fired = Some(Fired {
        path: path.to_path_buf(),
        op,
    });
    Err(io::Error::from_raw_os_error(plan.errno))
}
