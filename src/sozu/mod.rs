//! The Sozu table: kakehi's UTXO store (seed 000, Vermorel 2018).
//!
//! A layered hash table whose entries carry their lifecycle (production and
//! consumption blocks), so one table answers for every recent branch: an
//! outpoint is unspent under a [`ChainView`] when a block of the view
//! produced it and none consumed it. Reorgs switch the view; there is no
//! undo data. Durability is required only at block boundaries
//! ([`UtxoTable::commit`]).
//!
//! This module knows nothing of tokio, networking or sled.
//!
//! The API the pipeline calls, per block:
//! 1. [`UtxoTable::get_batch`] for every outpoint the block spends
//!    (batched: each bucket read at most once);
//! 2. [`UtxoTable::write_block`] with the block's [`BlockWrite`];
//! 3. [`UtxoTable::commit`] with the block's [`CommitTag`].

pub mod model;
pub mod types;

pub use types::*;

use bitcoin::OutPoint;

/// Errors of the Sozu table.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SozuError {
    /// A spend names an outpoint the table does not hold (the caller must
    /// have validated it first).
    #[error("spend of {outpoint} which the table does not hold")]
    MissingEntry {
        /// The outpoint.
        outpoint: OutPoint,
    },
    /// A production of an existing outpoint carries another amount or
    /// script (seed 000: the write is invalid).
    #[error("outpoint {outpoint} produced again with a different amount or script")]
    CoinMismatch {
        /// The outpoint.
        outpoint: OutPoint,
    },
    /// An I/O error from the storage backend.
    #[error("sozu I/O error on {path}: {source}")]
    Io {
        /// The file involved.
        path: std::path::PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// The operations the block pipeline needs from a UTXO table. Implemented by
/// the Sozu table and by [`model::ModelTable`].
pub trait UtxoTable {
    /// Reads the entries of `keys` (any order, duplicates allowed); `None`
    /// where the table holds no entry. Entries are returned whole: interpret
    /// them under a view with [`Entry::status_in`].
    ///
    /// # Errors
    /// Storage failure or corruption.
    fn get_batch(&mut self, keys: &[OutPoint]) -> Result<Vec<Option<Entry>>, SozuError>;

    /// Applies one block's productions and consumptions (`WriteSozu`), and
    /// hard-deletes entries that `oracle` says are final
    /// ([`Entry::is_purgeable`]), handing each purged entry to `purged`.
    /// Not durable until [`UtxoTable::commit`]. Writing the same block twice
    /// is idempotent.
    ///
    /// # Errors
    /// [`SozuError::MissingEntry`], [`SozuError::CoinMismatch`], storage
    /// failure. On error the uncommitted state is unspecified: the caller
    /// must not commit, and reopens (or drops) the table.
    fn write_block(
        &mut self,
        write: &BlockWrite,
        oracle: &dyn BlockOracle,
        purged: &mut dyn FnMut(Entry),
    ) -> Result<(), SozuError>;

    /// Makes everything written so far durable, atomically, tagged with
    /// `tag`. After a crash at any instant, reopening yields exactly the
    /// state of the last completed commit.
    ///
    /// # Errors
    /// Storage failure: the commit did not happen.
    fn commit(&mut self, tag: CommitTag) -> Result<(), SozuError>;

    /// The tag of the last completed commit, `None` for a new table.
    fn committed(&self) -> Option<CommitTag>;

    /// Calls `f` once for every entry in the table, in no particular order.
    ///
    /// # Errors
    /// Storage failure or corruption.
    fn for_each(&mut self, f: &mut dyn FnMut(&Entry)) -> Result<(), SozuError>;
}
