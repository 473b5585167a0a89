//! Wiring: the datadir (layout, lock file), opening the chain state with its
//! UTXO table, and the shutdown signal.
//!
//! Datadir layout (`~/.kakehi/<network>/` by default):
//!
//! | path | what |
//! | --- | --- |
//! | `.lock` | held (advisory lock) while a process uses the datadir |
//! | `index/` | sled database: block index, active chain, tx locations, metadata |
//! | `blocks/blkNNNNN.dat` | raw blocks, Core blk framing |
//! | `filters/fltNNNNN.dat` | BIP-158 basic filters, same framing |
//! | `spent/spNNNNN.dat` | spent outputs (prevouts) per connected block |
//! | `utxo/` | the Sozu table |

mod p2p_archive;
pub mod p2p_backend;
mod p2p_mempool;
mod p2p_view;
pub mod presync;

pub use p2p_backend::{start_p2p, start_p2p_with_mempool, NodeP2p};

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::chain::ChainParams;
use crate::pipeline::{Chainstate, PipelineError};
use crate::sozu::{SozuConfig, SozuTable, UtxoTable};

/// Errors opening the node.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The datadir cannot be created or read.
    #[error("datadir {path}: {source}")]
    Datadir {
        /// The datadir.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Another process holds the datadir.
    #[error("datadir {path} is in use by another kakehi process (lock file {path}/.lock)")]
    Locked {
        /// The datadir.
        path: PathBuf,
    },
    /// Opening the chain state failed.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// Opening the UTXO table failed.
    #[error("UTXO table: {0}")]
    Sozu(#[from] crate::sozu::SozuError),
}

/// The default datadir of a network: `~/.kakehi/<network>` (`$HOME` unset:
/// `./.kakehi/<network>`).
pub fn default_datadir(params: &ChainParams) -> PathBuf {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".kakehi").join(params.name())
}

/// An opened, locked datadir. The lock is released on drop.
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    _lock: File,
}

impl DataDir {
    /// Creates `path` if needed and takes its lock file.
    ///
    /// # Errors
    /// [`NodeError::Datadir`] when it cannot be created or written,
    /// [`NodeError::Locked`] when another process holds it.
    pub fn open(path: &Path) -> Result<Self, NodeError> {
        let err = |source| NodeError::Datadir {
            path: path.into(),
            source,
        };
        std::fs::create_dir_all(path).map_err(err)?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.join(".lock"))
            .map_err(err)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(NodeError::Locked { path: path.into() })
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(err(e)),
        }
        Ok(DataDir {
            path: path.into(),
            _lock: lock,
        })
    }

    /// The datadir's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Opens the UTXO table of `datadir`.
///
/// # Errors
/// [`NodeError::Sozu`].
pub fn open_table(datadir: &Path) -> Result<Box<dyn UtxoTable + Send>, NodeError> {
    // Two shards: a block's reads and writes use both cores of a small machine.
    let config = SozuConfig {
        shards: 2,
        ..SozuConfig::default()
    };
    Ok(Box::new(SozuTable::open(&datadir.join("utxo"), config)?))
}

/// Opens the chain state in a locked datadir, with the default memory
/// knobs ([`crate::store::Budgets::default`]).
///
/// # Errors
/// [`NodeError`].
pub fn open_chainstate(params: ChainParams, datadir: &DataDir) -> Result<Chainstate, NodeError> {
    open_chainstate_with(params, datadir, &crate::store::Budgets::default())
}

/// Opens the chain state in a locked datadir with the memory knobs
/// `budgets` (the index rows' memory bound and partition cache, the
/// archive's filter cache, the index database's page cache).
///
/// # Errors
/// [`NodeError`].
pub fn open_chainstate_with(
    params: ChainParams,
    datadir: &DataDir,
    budgets: &crate::store::Budgets,
) -> Result<Chainstate, NodeError> {
    let table = open_table(datadir.path())?;
    Ok(Chainstate::open(params, datadir.path(), table, budgets)?)
}

/// A flag set by SIGINT/SIGTERM; long work checks it at block boundaries.
pub fn shutdown_flag() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}

/// Sets `flag` on the first SIGINT or SIGTERM (in a background task of the
/// current tokio runtime).
pub fn install_signal_handlers(flag: Arc<AtomicBool>) {
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                tracing::error!("cannot install signal handlers");
                return;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("shutdown requested: stopping at the next block boundary");
        flag.store(true, Ordering::SeqCst);
    });
}
