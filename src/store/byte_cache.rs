//! A cache of immutable values read from files, bounded by a budget in
//! bytes: the index rows' filter and block-index partitions
//! (`store/runs/run.rs`) and the archive's epoch filters
//! (`archive/store.rs`) are read through one each, so the memory they hold
//! is the configured budget whatever the chain's size
//! (`index.filter_cache_mib`, `archive.filter_cache_mib`).
//!
//! `quick_cache` (CLOCK-Pro-like eviction) weighed by each value's bytes
//! plus [`ENTRY_OVERHEAD`]; a value heavier than the cache's hot share is
//! not kept (every lookup of it reads the file again). The cache's weight
//! never exceeds its budget (`quick_cache` keeps `hot + cold ≤ capacity`
//! per shard).

use std::hash::{BuildHasherDefault, Hash};
use std::sync::Arc;

use rustc_hash::FxHasher;

/// Bytes counted per entry beside its value's own: the key, the `Arc`'s
/// counters and the cache's slot (an estimate; a few words each).
pub const ENTRY_OVERHEAD: usize = 64;

/// A value that knows the heap bytes it holds.
pub trait Weighed {
    /// Bytes of heap the value holds (its buffers).
    fn heap_bytes(&self) -> usize;
}

/// Weighs an entry by its value's bytes plus [`ENTRY_OVERHEAD`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ByBytes;

impl<K, V: Weighed> quick_cache::Weighter<K, Arc<V>> for ByBytes {
    fn weight(&self, _: &K, v: &Arc<V>) -> u64 {
        (v.heap_bytes() + ENTRY_OVERHEAD) as u64
    }
}

/// The cache's table: `quick_cache`'s, hashed with FxHash rather than
/// SipHash (the keys are small integers the node makes, never input; a
/// probe of every run's filter for every transaction is the writer's hot
/// path).
type Inner<K, V> = quick_cache::sync::Cache<
    K,
    Arc<V>,
    ByBytes,
    BuildHasherDefault<FxHasher>,
    quick_cache::sync::DefaultLifecycle<K, Arc<V>>,
>;

/// A byte-budgeted cache of `Arc<V>` by `K`, shared by threads.
pub struct ByteCache<K, V> {
    inner: Inner<K, V>,
}

impl<K: Eq + Hash + Clone, V: Weighed> std::fmt::Debug for ByteCache<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByteCache")
            .field("budget", &self.inner.capacity())
            .field("weight", &self.inner.weight())
            .finish()
    }
}

impl<K: Eq + Hash + Clone, V: Weighed> ByteCache<K, V> {
    /// A cache of at most `budget` bytes, for values of about
    /// `typical_bytes` each (sizes the shards: one shard under 1 MiB of
    /// budget, so that a small budget still holds whole values).
    pub fn new(budget: usize, typical_bytes: usize) -> Self {
        let per_item = (typical_bytes + ENTRY_OVERHEAD) as u64;
        let items = (budget as u64 / per_item).clamp(1, 1 << 24) as usize;
        let shards = if budget < 1 << 20 { 1 } else { 8 };
        let options = quick_cache::OptionsBuilder::new()
            .weight_capacity(budget as u64)
            .estimated_items_capacity(items)
            .shards(shards)
            .build();
        let inner = match options {
            Ok(o) => Inner::with_options(o, ByBytes, Default::default(), Default::default()),
            // Not reached: both required options are set above.
            Err(_) => Inner::with(
                items,
                budget as u64,
                ByBytes,
                Default::default(),
                Default::default(),
            ),
        };
        ByteCache { inner }
    }

    /// The value of `key`, from the cache or else from `load` (kept when
    /// it fits).
    ///
    /// # Errors
    /// `load`'s error (nothing is kept).
    pub fn get_or_load<E>(
        &self,
        key: &K,
        load: impl FnOnce() -> Result<V, E>,
    ) -> Result<Arc<V>, E> {
        self.inner.get_or_insert_with(key, || load().map(Arc::new))
    }

    /// Bytes the cache holds now (its entries' weights), at most its
    /// budget.
    pub fn bytes(&self) -> usize {
        self.inner.weight() as usize
    }

    /// The budget, bytes.
    pub fn budget(&self) -> usize {
        self.inner.capacity() as usize
    }
}

impl Weighed for Vec<u8> {
    fn heap_bytes(&self) -> usize {
        self.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loads 1 KiB values under budgets of 8 KiB and 64 MiB: the cache's
    /// bytes never exceed its budget, and every value read back is the
    /// one loaded for its key (hit or miss).
    #[test]
    fn stays_within_its_budget_and_gives_each_key_its_value() {
        for budget in [8 << 10, 64 << 20] {
            let cache: ByteCache<u32, Vec<u8>> = ByteCache::new(budget, 1024);
            let mut loads = 0;
            for round in 0..3 {
                for k in 0..200u32 {
                    let v = cache
                        .get_or_load(&k, || {
                            loads += 1;
                            Ok::<_, ()>(vec![k as u8; 1024])
                        })
                        .unwrap();
                    assert_eq!(v[..], vec![k as u8; 1024][..], "round {round} key {k}");
                    assert!(cache.bytes() <= budget, "{} > {budget}", cache.bytes());
                }
            }
            if budget > 1 << 20 {
                // Everything fits: one load per key.
                assert_eq!(loads, 200);
                assert_eq!(cache.bytes(), 200 * (1024 + ENTRY_OVERHEAD));
            } else {
                assert!(loads > 200, "a small budget evicts: {loads}");
                assert!(cache.bytes() > 0);
            }
        }
    }
}
