//! What the chain state holds in memory, by component, as of a snapshot:
//! the figures that say which part of the process's RSS grows with the
//! chain and which is bounded by a configured cache (docs/operations.md,
//! "Memory"; printed per tenth by `benches/scale.rs`).

use super::ChainSnapshot;

/// Bytes held in memory by the parts of the chain state that keep their
/// own accounts. Not counted: the index database's page cache (sled,
/// bounded by `index.cache_mib`), the block index and per-block metadata
/// (one entry per header), and the allocator's free pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryUse {
    /// The UTXO table: page images (pinned layers, page cache, pages not
    /// yet checkpointed; bounded by `sozu.ram_mib`) plus its page summaries
    /// (about 3 bytes per entry), bytes ([`crate::sozu::SozuStats::memory_bytes`]
    /// as the writer published it; 0 for a table without counters).
    pub utxo_table: u64,
    /// The index rows: keys not yet in run files (at most about
    /// `index.rows_memory_mib` plus one commit's), the cache of the run
    /// files' filter and block-index partitions (at most
    /// `index.filter_cache_mib`) and each run's partition checksums (about
    /// 0.0014 bytes per row), bytes
    /// ([`crate::store::Store::rows_resident_bytes`]).
    pub index_rows: u64,
    /// The archive's epoch filters in their cache (at most
    /// `archive.filter_cache_mib`), bytes
    /// ([`crate::archive::Archive::filter_bytes`]).
    pub archive_filters: u64,
}

impl ChainSnapshot {
    /// The memory of the chain state's components ([`MemoryUse`]), read
    /// without I/O (O(run files + sealed epochs)).
    pub fn memory_use(&self) -> MemoryUse {
        MemoryUse {
            utxo_table: self.table_counters.as_ref().map_or(0, |c| c.memory_bytes),
            index_rows: self.store.rows_resident_bytes() as u64,
            archive_filters: self.archive.filter_bytes() as u64,
        }
    }
}
