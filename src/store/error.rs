//! Errors of the store: one enum, [`StoreError`], naming the path and
//! the tree or file of every failure.

use std::path::PathBuf;

use super::{runs, FlatFileError, SledOpenError};

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Reading the index database failed: sled reported an I/O error or
    /// damaged data (a flipped byte in `db` shows here, at the first read
    /// of the damaged page, not at open).
    #[error("index database at {path}: reading failed: {source}; restore the datadir from a backup or rebuild it with `kakehi reindex-chainstate`")]
    Read {
        /// The database directory.
        path: PathBuf,
        /// sled's error.
        #[source]
        source: sled::Error,
    },
    /// The database files cannot be opened: sled refused them, or panicked
    /// while recovering them. Damaged files (`db`, `conf`, `snap.*` in the
    /// directory).
    #[error(
        "the index database at {path} cannot be opened ({source}); rebuild it from the block files with `kakehi reindex-chainstate`, or restore the datadir from a backup"
    )]
    Open {
        /// The database directory.
        path: PathBuf,
        /// sled's error or panic.
        source: SledOpenError,
    },
    /// Writing a batch to the index database failed (a full disk, an I/O
    /// error): nothing of the batch is durable.
    #[error("index database at {path}: writing failed: {source}")]
    Write {
        /// The database directory.
        path: PathBuf,
        /// sled's error.
        #[source]
        source: sled::Error,
    },
    /// sled's background flusher failed (its fsync or segment rewrite:
    /// [`sled_watch`](super::sled_watch)), which sled only logs: what it wrote since may not
    /// be durable, so no commit is made after it.
    #[error("index database at {path}: its background flush failed ({message}); writes stopped: restart the node (it recovers to the last commit every store agrees on), or `kakehi reindex-chainstate`")]
    Background {
        /// The database directory.
        path: PathBuf,
        /// sled's logged error, "target: message".
        message: String,
    },
    /// A flat file failed.
    #[error(transparent)]
    Flat(#[from] FlatFileError),
    /// A stored value does not decode, or the database files are damaged.
    #[error(
        "corrupt index database at {path} ({tree}): {reason}; restore the datadir from a backup or rebuild it with `kakehi reindex-chainstate`"
    )]
    Corrupt {
        /// The database directory.
        path: PathBuf,
        /// The tree.
        tree: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// The database was written by an incompatible version of kakehi.
    #[error("index database at {path} has format version {found_major}.{found_minor}; this build reads {major}.x: rebuild the chain state from the block files with `kakehi reindex-chainstate` (see docs/operations.md)")]
    FormatMismatch {
        /// The database directory.
        path: PathBuf,
        /// Its major version.
        found_major: u16,
        /// Its minor version.
        found_minor: u16,
        /// The major version this build reads.
        major: u16,
    },
    /// The row store (`index/rows/`) failed: I/O or a damaged file, named.
    #[error(transparent)]
    Rows(#[from] runs::RunError),
    /// The thread that applies a group's index rows ahead of its commit
    /// could not be started, or stopped: nothing after the last durable
    /// boundary may be committed.
    #[error("index database at {path}: the index rows thread failed: {source}")]
    Thread {
        /// The database directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}
