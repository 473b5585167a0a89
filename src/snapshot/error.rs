//! [`ReadError`]: why a read of a [`ChainSnapshot`](super::ChainSnapshot)
//! failed. Classified by what the caller does about it: a storage failure
//! (the index database, a flat file, the UTXO table: retry or stop), a
//! request the archive refuses (answer 400), or corruption (a stored
//! record that fails its check: stop serving it and tell the operator how
//! to rebuild it). The writer turns it into its own error where it reads
//! through a snapshot of its own state.

use bitcoin::BlockHash;

use crate::archive::ArchiveError;
use crate::filters::FilterError;
use crate::primitives::BlockId;
use crate::sozu::SozuError;
use crate::store::{FlatFileError, SpentRecordError, StoreError};

/// What an operator does about a damaged record of `what`
/// ([`ReadError::CorruptRecord`]): a block is the source every other
/// store is rebuilt from, so it comes from a backup or from peers; the rest
/// is rebuilt from the block files.
fn record_remedy(what: &str) -> &'static str {
    if what == "block" {
        "restore the datadir from a backup or resync"
    } else {
        "rebuild it from the block files with `kakehi reindex-chainstate`, or restore the datadir from a backup"
    }
}

/// A read of a snapshot that failed. Every message names the store, and
/// for corruption the file and the block.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The index database or its row files failed (storage or corruption:
    /// [`StoreError`] tells which).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The UTXO table failed.
    #[error("UTXO table: {0}")]
    Sozu(#[from] SozuError),
    /// A flat file failed.
    #[error(transparent)]
    Flat(#[from] FlatFileError),
    /// Stored data contradicts itself (an active block without its data or
    /// spent outputs).
    #[error("inconsistent datadir: {reason}")]
    Inconsistent {
        /// What does not match.
        reason: String,
    },
    /// The archive of spent outputs failed, or refused the request
    /// ([`ArchiveError::BadRequest`], [`ArchiveError::DuplicateOutpoint`]).
    #[error("archive: {0}")]
    Archive(#[from] ArchiveError),
    /// A record read back from a flat file contradicts what was committed
    /// for it (a filter the filter-header chain does not bind, a block whose
    /// hash, merkle root or witness commitment is wrong): the file is
    /// damaged. Nothing is served from it.
    #[error(
        "{path}: the stored {what} of block {block} is corrupt ({reason}); {}",
        record_remedy(what)
    )]
    CorruptRecord {
        /// The flat file.
        path: std::path::PathBuf,
        /// The block the record belongs to.
        block: BlockHash,
        /// Which record ("block", "filter").
        what: &'static str,
        /// What does not match.
        reason: &'static str,
    },
    /// A spent-output record of the `spent/` flat files does not decode.
    #[error("{path}: spent outputs of block {}: {source}; rebuild them from the block files with `kakehi reindex-chainstate`, or restore the datadir from a backup", block.0)]
    CorruptSpent {
        /// The flat file.
        path: std::path::PathBuf,
        /// The block whose record is corrupt.
        block: BlockId,
        /// What is wrong with it.
        #[source]
        source: SpentRecordError,
    },
    /// The genesis block's filter could not be built.
    #[error("filter of block {hash}: {source}")]
    Filter {
        /// The block.
        hash: BlockHash,
        /// The cause.
        #[source]
        source: FilterError,
    },
}
