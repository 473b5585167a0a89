//! Errors of the row store ([`super::RowSets`]).

use std::path::PathBuf;

/// Errors of the row store: every one names the file it is about.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// Reading, writing or syncing a file of the row store failed (a full
    /// disk, an I/O error). A failed write or sync leaves the row set as
    /// it was before the operation (the manifest still names the old runs).
    #[error("index rows at {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A run file or the manifest is damaged: wrong size, bad magic or
    /// version, a checksum that does not match, keys out of order.
    #[error("index rows file {path} is damaged ({reason}); restore the datadir from a backup or rebuild it with `kakehi reindex-chainstate`")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: &'static str,
    },
}

impl RunError {
    /// A closure mapping an I/O error on `path` to [`RunError::Io`].
    pub(crate) fn io(path: &std::path::Path) -> impl Fn(std::io::Error) -> RunError + '_ {
        move |source| RunError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// [`RunError::Corrupt`] of `path`.
    pub(crate) fn corrupt(path: &std::path::Path, reason: &'static str) -> RunError {
        RunError::Corrupt {
            path: path.to_path_buf(),
            reason,
        }
    }
}
