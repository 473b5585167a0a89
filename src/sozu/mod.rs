//! The Sozu table: kakehi's UTXO store (the Sozu paper, Vermorel 2018;
//! `docs/references.md`).
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
//!
//! # Design ([`SozuTable`])
//!
//! - **Layers of one-page buckets.** Layer 0 has 2^b0 buckets (all
//!   allocated, held in RAM with the next `ram_layers − 1` layers); layer
//!   i+1 has 2^g times more. A bucket's 2^g children are numbered as one
//!   group the first time it spills, and each child page is written only
//!   when an entry first flows into it (a written-children mask in the
//!   parent says which exist), so empty subtrees and empty siblings cost no
//!   disk and lookups stop at the parent. The bucket of a key at layer i is given by the top `b0 + i·g` bits
//!   of SipHash-2-4 keyed with a random 128-bit key stored in the header, so
//!   no peer can aim outpoints at one bucket.
//! - **Reads** ([`UtxoTable::get_batch`], [`SozuTable::get_batch_since`])
//!   descend layer by layer for the whole batch at once: the keys are
//!   grouped by bucket, so each bucket is read at most once per batch. A
//!   bucket's max-production-height stops the descent early when the caller
//!   gives a height floor (the Sozu paper's `ReadSozu(k, b, h)`).
//! - **Writes** ([`UtxoTable::write_block`], the Sozu paper's `WriteSozu` /
//!   `MergeEntries`): keys not `known_absent` (and every spent key) are
//!   located by one batched descent and merged where they live (unicity);
//!   new keys go to layer 0. Buckets are then rewritten top-down, each once
//!   per block: merge, purge the entries [`Entry::is_purgeable`] says are
//!   final (handed to the callback), and if the bucket exceeds its layer's
//!   capacity, spill until it holds α × capacity: the Sozu paper's order
//!   (consumed on the best chain first — last in spills into the disk
//!   layers, [`SpillConsumed`] — then oldest max production height, then
//!   key) picks what should flow, and the spill goes to the fewest
//!   children covering it, so a spill rewrites two pages, not 2^g + 1
//!   (`SozuConfig::spill_fewest_children`; `docs/sozu-format.md`, "Spill
//!   policy"). The spilled entries become inserts of the children,
//!   processed in the next layer's pass.
//! - **Scripts** longer than `inline_script_max` bytes live out of line in a
//!   per-shard records file (external records, as in Teranode's UTXO model), so a 10,000-byte
//!   script never breaks a page.
//! - **Durability** ([`UtxoTable::commit`]): a redo journal of page deltas.
//!   A commit appends one record — every page changed since the last commit
//!   (RAM layers included) as a delta against its committed image, the
//!   appended scripts, and the new header — with a CRC-32, and fsyncs once.
//!   Open replays the committed records over the page files and ignores a
//!   torn tail. The journal is checkpointed lazily into the page files with
//!   a double write (images to a checkpoint file, synced, then the header
//!   switch by atomic rename, then the page files), so the page files are a
//!   consistent base for the next generation's deltas. Between those, the
//!   memory bound on disk pages not yet in their files starts checkpoints
//!   of the disk layers only (the pinned layers' pages, rewritten by nearly
//!   every block, wait in the journal for the generation's end). A crash at any
//!   instant leaves exactly the last committed state; checksums are
//!   verified on every page read and, by default, on every page at open.
//! - **Sharding** by hash prefix (the Sozu paper): each shard is an independent
//!   tree with its own files and storage handle; `get_batch`, `write_block`
//!   and the publish of `commit` run the shards at once (the calling
//!   thread and `shards − 1` long-lived workers); one journal record and
//!   one fsync cover all shards, so a commit stays atomic across them.
//! - **Concurrent readers** ([`UtxoTable::reader`], [`SozuReader`]): the
//!   committed state, read from the journal's in-memory overlay or the
//!   page files, never from the writer's buckets; no lock is held during a
//!   file read (`docs/sozu-format.md`, "Concurrent readers").
//!
//! Size arithmetic (bytes per entry, layers for 10M and 180M live entries)
//! and the byte layout are in `docs/sozu-format.md`; measurements in
//! `BENCHMARKS.md`.

mod checkpoint;
mod commit;
pub mod config;
mod files;
mod geo;
pub mod header;
pub mod journal;
mod lookup;
pub mod model;
mod ops;
pub mod page;
mod purge;
mod reader;
mod records;
mod recovery;
mod shard;
mod spill;
mod stats;
pub mod storage;
mod store;
mod summary;
mod table;
pub mod types;
mod walk;
mod workers;
mod write;

pub use config::{
    LayerConfig, SozuConfig, SpillConsumed, DEFAULT_RAM_MIB, JOURNAL_FLOOR, JOURNAL_SHARE,
};
pub use reader::SozuReader;
pub use stats::{LayerFlow, LayerStats, SozuStats};
pub use storage::{FsStorage, MemStorage, Storage};
pub use table::SozuTable;
pub use types::*;

use std::sync::Arc;

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
    /// script (the Sozu paper: the write is invalid).
    #[error("outpoint {outpoint} produced again with a different amount or script")]
    CoinMismatch {
        /// The outpoint.
        outpoint: OutPoint,
    },
    /// A file of the table is damaged: a checksum, magic or structure check
    /// failed. Nothing was repaired; restore from a backup or rebuild.
    #[error("sozu table corrupt: {path} at byte {offset}: {reason}")]
    Corrupt {
        /// The damaged file.
        path: std::path::PathBuf,
        /// Byte offset of the damaged page, record or field.
        offset: u64,
        /// What failed.
        reason: String,
    },
    /// The table was written by an incompatible format version.
    #[error("sozu table {path} has format version {major}.{minor}; this build reads {}.x: rebuild the chain state from the block files with `kakehi reindex-chainstate`", header::FORMAT_MAJOR)]
    UnsupportedVersion {
        /// The header file.
        path: std::path::PathBuf,
        /// Major version found.
        major: u16,
        /// Minor version found.
        minor: u16,
    },
    /// A block more than [`PURGE_DEPTH`] below the tip was written: entries
    /// it would need may already be purged.
    #[error("block at height {height} is more than 100 blocks below the tip {tip}")]
    ReorgTooDeep {
        /// Height of the block written.
        height: u32,
        /// Height of the best tip.
        tip: u32,
    },
    /// A script longer than 10,000 bytes was written.
    #[error("output {outpoint} has a {len}-byte script (limit 10,000)")]
    ScriptTooLong {
        /// The outpoint.
        outpoint: OutPoint,
        /// Its script length in bytes.
        len: usize,
    },
    /// A bucket at the deepest layer (all 64 hash bits used) is full, or an
    /// entry's lists no longer fit a page.
    #[error("bucket {page} of layer {layer} is full")]
    BucketFull {
        /// Layer.
        layer: u8,
        /// Page number in the layer.
        page: u64,
    },
    /// An invalid configuration for a new table.
    #[error("invalid sozu configuration: {reason}")]
    Config {
        /// What is wrong.
        reason: &'static str,
    },
    /// An earlier write or commit failed; the in-memory state is unknown and
    /// the table must be reopened.
    #[error("sozu table needs reopening after an earlier failure")]
    Poisoned,
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

/// Concurrent reads of a UTXO table's committed state, for readers that
/// must never hold up the one writer (HTTP, P2P serving): any number of
/// threads, at any time, including while a block is being written. A read
/// sees the state as of a recent commit — never a block written and not yet
/// committed — and may see commits made after the caller's chain snapshot:
/// interpret entries under the caller's view ([`Entry::status_in`]), which
/// ignores blocks it does not contain.
pub trait UtxoReader: Send + Sync {
    /// The committed entries of `keys` (any order, duplicates allowed);
    /// `None` where the table holds none.
    ///
    /// # Errors
    /// Storage failure or corruption.
    fn get_batch(&self, keys: &[OutPoint]) -> Result<Vec<Option<Entry>>, SozuError>;

    /// Layer statistics ([`SozuStats::layers`], payload and bytes on disk)
    /// from a scan of the committed state, without the writer's counters;
    /// `None` for a table that keeps none. O(table size): callers cache it.
    ///
    /// # Errors
    /// Storage failure or corruption during the scan.
    fn scan_stats(&self) -> Result<Option<SozuStats>, SozuError> {
        Ok(None)
    }
}

/// The operations the block pipeline needs from a UTXO table. Implemented by
/// the Sozu table and by [`model::ModelTable`].
pub trait UtxoTable {
    /// A handle for concurrent readers of the committed state (cheap: an
    /// `Arc` shared by every caller).
    fn reader(&self) -> Arc<dyn UtxoReader>;

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

    /// Layer and maintenance statistics ([`SozuStats`]) for a table that
    /// keeps them (the Sozu table: a scan of every page, so O(table size));
    /// `None` for one that does not (the model). Used by `/metrics`.
    ///
    /// # Errors
    /// Storage failure or corruption during the scan.
    fn sozu_stats(&mut self) -> Result<Option<SozuStats>, SozuError> {
        Ok(None)
    }

    /// The counters of [`SozuStats`] without the scan (O(shards); `layers`
    /// empty, byte figures 0), `None` for a table that keeps none.
    fn sozu_counters(&self) -> Option<SozuStats> {
        None
    }
}
