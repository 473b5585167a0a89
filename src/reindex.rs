//! `kakehi reindex-chainstate`: rebuilds the chain state (block index, UTXO
//! table, BIP-158 filters, spent outputs, archive) from the datadir's own
//! block files, as Bitcoin Core's `-reindex-chainstate` does. It is the way
//! forward for a datadir whose UTXO table is of an older format.
//!
//! The blocks of `blocks/blk*.dat` are submitted in file order to a new chain
//! state built in `reindex.new/` (so the best chain and its first-seen ties
//! come out as they did). A torn append at the end of the last file (a crash
//! after its last committed block) is cut; damage anywhere else is an error.
//! The new state is marked complete (`reindex.new/COMPLETE`), then swapped in
//! directory by directory, the old ones going to `reindex.old/`, removed at
//! the end. Every step can be interrupted: a new run removes an incomplete
//! build and starts over, or finishes a swap that was under way. Every write
//! of the reindex's own (directories, the marker, the swap's renames and
//! syncs) passes the I/O fault seam (`store::durable`), as the new chain
//! state's writes do: a failure stops the run with an error naming the
//! path; before the swap the unfinished build is removed (the datadir is
//! as before the run), during it the node refuses the datadir until the
//! reindex is run again. The block
//! files are written again by the new state, so the run needs the disk of
//! the block files once more until the swap. Headers received without their
//! block are not kept: peers send them again.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use parking_lot::Mutex;

use crate::chain::ChainParams;
use crate::import::{scan_block_file, ImportError, ImportRun, ImportSummary};
use crate::pipeline::{Chainstate, PipelineError};
use crate::sozu::{SozuConfig, SozuError, SozuTable};
use crate::store::{durable, Budgets};

/// The datadir's chain-state directories (`src/node.rs`, datadir layout),
/// replaced by a reindex.
pub const CHAINSTATE_DIRS: [&str; 7] = [
    "index", "blocks", "filters", "spent", "headers", "archive", "utxo",
];

/// Where the new chain state is built, in the datadir.
pub const NEW_DIR: &str = "reindex.new";
/// Where the old chain state goes during the swap, in the datadir.
pub const OLD_DIR: &str = "reindex.old";
/// File of [`NEW_DIR`] that marks a finished build.
const COMPLETE: &str = "COMPLETE";

/// Errors of a reindex.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReindexError {
    /// A file or directory of the datadir cannot be read, written or moved.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The datadir holds no block file to rebuild from.
    #[error("no block files in {path}: nothing to reindex from")]
    NoBlocks {
        /// The blocks directory.
        path: PathBuf,
    },
    /// A block file other than the last is damaged (or the last cannot be
    /// read, or holds another network's blocks).
    #[error("block file damaged: {0}")]
    BlockFile(#[source] ImportError),
    /// The import of the blocks failed (storage).
    #[error(transparent)]
    Import(#[from] ImportError),
    /// The new chain state cannot be opened.
    #[error("opening the new chain state: {0}")]
    Pipeline(#[from] PipelineError),
    /// The new UTXO table cannot be created.
    #[error("creating the new UTXO table: {0}")]
    Sozu(#[from] SozuError),
    /// A shutdown request stopped the rebuild; the datadir is unchanged.
    #[error("interrupted at height {height}: the datadir is unchanged; run `kakehi reindex-chainstate` again to start over")]
    Interrupted {
        /// Height the new chain state had reached.
        height: u32,
    },
    /// A write of the swap failed (a rename, the datadir's sync, the
    /// marker's removal): the datadir mixes old and new directories, and
    /// the node refuses it until the reindex is run again.
    #[error("{path}: {source}; the reindex stopped while it swapped the chain state in: run `kakehi reindex-chainstate` again to finish it")]
    Swap {
        /// The file or directory.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A reindex stopped during its swap: the datadir mixes old and new
    /// directories until it is finished.
    #[error("datadir {path} holds a reindex stopped while it swapped the chain state in: run `kakehi reindex-chainstate` to finish it")]
    SwapPending {
        /// The datadir.
        path: PathBuf,
    },
}

fn swap_err(path: &Path) -> impl FnOnce(std::io::Error) -> ReindexError + '_ {
    move |source| ReindexError::Swap {
        path: path.to_path_buf(),
        source,
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ReindexError + '_ {
    move |source| ReindexError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Refuses a datadir whose reindex stopped during the swap (the node must
/// not open half-swapped state).
///
/// # Errors
/// [`ReindexError::SwapPending`].
pub fn check_no_swap_pending(datadir: &Path) -> Result<(), ReindexError> {
    if datadir.join(NEW_DIR).join(COMPLETE).exists() {
        return Err(ReindexError::SwapPending {
            path: datadir.to_path_buf(),
        });
    }
    Ok(())
}

/// Rebuilds the chain state of `datadir` (locked by the caller) from its
/// block files; `sozu` configures the new UTXO table, `budgets` the
/// memory of the new index database, row store and archive, and `configure` the
/// new chain state once opened (group limits, assumevalid, address index,
/// as the node sets them). Shows a progress bar
/// per block file on standard error when `progress`; stops between blocks
/// when `stop` is set. Returns the import's summary, or `None` when it only
/// finished the swap of an earlier run.
///
/// # Errors
/// [`ReindexError`], naming the path of a failed write; the old chain
/// state stays in place and the unfinished build is removed unless the
/// swap had started ([`ReindexError::Swap`]: run again to finish it).
pub fn reindex_chainstate(
    datadir: &Path,
    params: ChainParams,
    sozu: SozuConfig,
    budgets: Budgets,
    stop: &AtomicBool,
    progress: bool,
    configure: &mut dyn FnMut(&mut Chainstate) -> Result<(), PipelineError>,
) -> Result<Option<ImportSummary>, ReindexError> {
    let new = datadir.join(NEW_DIR);
    if new.join(COMPLETE).exists() {
        tracing::info!("finishing the swap of an earlier reindex");
        swap(datadir)?;
        return Ok(None);
    }
    for leftover in [&new, &datadir.join(OLD_DIR)] {
        if leftover.exists() {
            durable::remove_dir_all(leftover).map_err(io(leftover))?;
        }
    }
    let files = block_files(&datadir.join("blocks"))?;
    let built = build_complete(
        &new,
        (params, sozu, budgets),
        &files,
        stop,
        progress,
        configure,
    );
    let summary = match built {
        Ok(summary) => summary,
        Err(e) => {
            discard(&new);
            return Err(e);
        }
    };
    swap(datadir)?;
    Ok(Some(summary))
}

/// Builds the new chain state in `new` and marks it complete, durably.
fn build_complete(
    new: &Path,
    limits: (ChainParams, SozuConfig, Budgets),
    files: &[PathBuf],
    stop: &AtomicBool,
    progress: bool,
    configure: &mut dyn FnMut(&mut Chainstate) -> Result<(), PipelineError>,
) -> Result<ImportSummary, ReindexError> {
    durable::create_dir_all(new).map_err(io(new))?;
    let summary = build(new, limits, files, stop, progress, configure)?;
    for name in CHAINSTATE_DIRS {
        let d = new.join(name);
        durable::create_dir_all(&d).map_err(io(&d))?;
    }
    let complete = new.join(COMPLETE);
    durable::write_synced(&complete, &[]).map_err(io(&complete))?;
    durable::sync_dir(new).map_err(io(new))?;
    Ok(summary)
}

/// Removes an unfinished build after a failure before the swap, so that
/// the datadir is as before the run (its disk space freed); a removal that
/// fails is logged (the next reindex removes it).
fn discard(new: &Path) {
    match std::fs::remove_dir_all(new) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(
            path = %new.display(),
            error = %e,
            "cannot remove the unfinished reindex; the next reindex-chainstate removes it"
        ),
    }
}

/// `blocks/blk*.dat`, in name (= append) order.
fn block_files(blocks: &Path) -> Result<Vec<PathBuf>, ReindexError> {
    let mut files = Vec::new();
    let entries = match std::fs::read_dir(blocks) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ReindexError::NoBlocks {
                path: blocks.to_path_buf(),
            })
        }
        Err(e) => return Err(io(blocks)(e)),
    };
    for entry in entries {
        let name = entry.map_err(io(blocks))?.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("blk") && name.ends_with(".dat") {
            files.push(blocks.join(&*name));
        }
    }
    if files.is_empty() {
        return Err(ReindexError::NoBlocks {
            path: blocks.to_path_buf(),
        });
    }
    files.sort();
    Ok(files)
}

/// Imports the blocks of `files` into a new chain state in `new`.
fn build(
    new: &Path,
    (params, sozu, budgets): (ChainParams, SozuConfig, Budgets),
    files: &[PathBuf],
    stop: &AtomicBool,
    progress: bool,
    configure: &mut dyn FnMut(&mut Chainstate) -> Result<(), PipelineError>,
) -> Result<ImportSummary, ReindexError> {
    let table = SozuTable::open(&new.join("utxo"), sozu)?;
    let mut cs = Chainstate::open(params, new, Box::new(table), &budgets)?;
    configure(&mut cs)?;
    let chain = Mutex::new(cs);
    let mut run = ImportRun::new(&chain);
    for (i, path) in files.iter().enumerate() {
        let (file, problem) = scan_block_file(path, run.params());
        if let Some(e) = problem {
            let tail = matches!(
                e,
                ImportError::Truncated { .. }
                    | ImportError::BadMagic { .. }
                    | ImportError::Oversized { .. }
                    | ImportError::BadBlock { .. }
            );
            if !tail || i + 1 < files.len() {
                return Err(ReindexError::BlockFile(e));
            }
            tracing::warn!("the last block file ends in a torn append, cut: {e}");
        }
        tracing::info!(file = %path.display(), n = i + 1, of = files.len(), "reindexing");
        run.import(&file, stop, progress)?;
        if run.summary.interrupted {
            let summary = run.finish()?;
            return Err(ReindexError::Interrupted {
                height: summary.tip_height,
            });
        }
    }
    Ok(run.finish()?)
}

/// Moves every chain-state directory of `datadir` to [`OLD_DIR`] and the
/// new one from [`NEW_DIR`] in its place, then removes both. A directory
/// no longer in [`NEW_DIR`] was swapped by an earlier, interrupted run.
///
/// # Errors
/// [`ReindexError::Swap`] while the datadir mixes old and new directories
/// (until [`COMPLETE`] is removed: run again to finish);
/// [`ReindexError::Io`] for the removals and the directory sync after it
/// (the new chain state is in place).
fn swap(datadir: &Path) -> Result<(), ReindexError> {
    let (new, old) = (datadir.join(NEW_DIR), datadir.join(OLD_DIR));
    durable::create_dir_all(&old).map_err(swap_err(&old))?;
    for name in CHAINSTATE_DIRS {
        let (from, cur) = (new.join(name), datadir.join(name));
        if !from.exists() {
            continue;
        }
        if cur.exists() {
            let to = old.join(name);
            durable::rename(&cur, &to).map_err(swap_err(&to))?;
        }
        durable::rename(&from, &cur).map_err(swap_err(&cur))?;
    }
    durable::sync_dir(datadir).map_err(swap_err(datadir))?;
    let complete = new.join(COMPLETE);
    durable::remove_file(&complete).map_err(swap_err(&complete))?;
    durable::remove_dir_all(&new).map_err(io(&new))?;
    durable::remove_dir_all(&old).map_err(io(&old))?;
    durable::sync_dir(datadir).map_err(io(datadir))
}
