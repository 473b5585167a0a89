//! The memory knobs of the chain state's stores, in bytes (the
//! configuration gives them in MiB: `index.cache_mib`,
//! `index.rows_memory_mib`, `index.filter_cache_mib`,
//! `archive.filter_cache_mib`; docs/operations.md "Memory").

use super::runs::RowOptions;

/// Default budget of the cache of the archive's epoch filters, bytes:
/// 256 MiB, the filters of about 10⁸ spent outputs (the whole
/// testnet4-sized chain's are ~136 MiB; mainnet's ~7 GB). Config
/// `archive.filter_cache_mib`; the archive (built on the store) takes its
/// default from here.
pub const DEFAULT_ARCHIVE_FILTER_CACHE: usize = 256 << 20;

/// The memory knobs of the index database, its row store and the archive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budgets {
    /// Page cache of the index database (sled), MiB
    /// ([`super::DEFAULT_INDEX_CACHE_MIB`]).
    pub index_cache_mib: usize,
    /// The row store's bound on keys in memory and its cache of run
    /// partitions, bytes.
    pub rows: RowOptions,
    /// Budget of the cache of the archive's epoch filters, bytes
    /// ([`DEFAULT_ARCHIVE_FILTER_CACHE`]).
    pub archive_filter_cache: usize,
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            index_cache_mib: super::DEFAULT_INDEX_CACHE_MIB,
            rows: RowOptions::default(),
            archive_filter_cache: DEFAULT_ARCHIVE_FILTER_CACHE,
        }
    }
}
