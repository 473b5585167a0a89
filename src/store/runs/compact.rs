//! Size-tiered compaction of a row set's runs, on a thread of its own.
//!
//! A run's tier is ⌊log₄(bytes / [`TIER_BASE`])⌋ (runs under 4 ×
//! [`TIER_BASE`] are tier 0). When [`FAN_IN`] runs of one tier exist, the
//! oldest [`FAN_IN`] of them are merged (k-way, equal keys once) into one
//! new run, fsynced; the manifest then names it instead of its inputs
//! (one atomic replace), and the inputs are deleted. So each key is
//! rewritten about log₄(set bytes / [`TIER_BASE`]) times in all, and a set
//! holds at most `FAN_IN − 1` runs per tier, tens of runs in all, however
//! many flushes made them (one run per tree per block once the node is
//! synced).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::error::RunError;
use super::manifest::WriteError;
use super::run::Run;
use super::set::RowSet;
use super::writer::RunWriter;
use super::Core;

/// Bytes of a tier-0 run's scale: 64 KiB.
pub const TIER_BASE: u64 = 64 << 10;
/// Runs of one tier merged together.
pub const FAN_IN: usize = 4;

/// A run's tier.
fn tier(bytes: u64) -> u32 {
    (bytes / TIER_BASE).max(1).ilog(4)
}

/// The oldest [`FAN_IN`] runs of the lowest tier that has that many.
fn pick<const N: usize>(runs: &[Arc<Run<N>>]) -> Option<Vec<Arc<Run<N>>>> {
    let mut tiers: Vec<u32> = runs.iter().map(|r| tier(r.bytes())).collect();
    tiers.sort_unstable();
    tiers.dedup();
    tiers.into_iter().find_map(|t| {
        let same: Vec<_> = runs
            .iter()
            .filter(|r| tier(r.bytes()) == t)
            .take(FAN_IN)
            .cloned()
            .collect();
        (same.len() == FAN_IN).then_some(same)
    })
}

/// Compacts every set until no tier holds [`FAN_IN`] runs (or the store
/// is closing).
///
/// # Errors
/// The first [`RunError`]: the set stays as it was (the output of the
/// failed merge is deleted).
pub(super) fn compact_all(core: &Core) -> Result<(), RunError> {
    let _one_at_a_time = core.compact_lock.lock();
    loop {
        if core.stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut did = compact_one(core, &core.txs, 0)?;
        did |= compact_one(core, &core.spends, 1)?;
        did |= compact_one(core, &core.history, 2)?;
        if !did || core.stop.load(Ordering::Acquire) {
            return Ok(());
        }
    }
}

/// One merge in `set` (index `idx` in the manifest), if one is due.
/// Returns whether it merged.
fn compact_one<const N: usize>(core: &Core, set: &RowSet<N>, idx: usize) -> Result<bool, RunError> {
    let Some(inputs) = pick(&set.runs()) else {
        return Ok(false);
    };
    let number = core.allocate_number();
    let path = core.run_path(set.name, number);
    let merged = merge(core, &inputs, &path, number)
        .map_err(WriteError::Before)
        .and_then(|run| match run {
            Some(run) => core
                .replace_runs(set, idx, &inputs, Arc::new(run))
                .map(|()| true),
            None => Ok(false),
        });
    match merged {
        Ok(true) => {
            for run in &inputs {
                // Unlinked: readers holding the run keep its descriptor;
                // a failed delete leaves a file the next open removes.
                let _ = std::fs::remove_file(run.path());
            }
            Ok(true)
        }
        Ok(false) | Err(WriteError::Before(_)) => {
            let _ = std::fs::remove_file(&path);
            merged.map_err(WriteError::into_inner)
        }
        // Either manifest may stand: inputs and output stay (the next
        // open deletes the files the standing one does not name).
        Err(WriteError::After(e)) => Err(e),
    }
}

/// Writes the k-way merge of `inputs` to `path` (run `number`), fsynced.
/// Returns `None` when the store began closing meanwhile (nothing written
/// to keep).
fn merge<const N: usize>(
    core: &Core,
    inputs: &[Arc<Run<N>>],
    path: &std::path::Path,
    number: u64,
) -> Result<Option<Run<N>>, RunError> {
    let capacity: u64 = inputs.iter().map(|r| r.count()).sum();
    let mut out = RunWriter::<N>::create(path, capacity as usize)?;
    let mut next_block = vec![0usize; inputs.len()];
    let mut heap = BinaryHeap::new();
    let mut pending: Vec<std::vec::IntoIter<[u8; N]>> = Vec::with_capacity(inputs.len());
    for (i, run) in inputs.iter().enumerate() {
        let mut keys = if run.blocks() > 0 {
            run.read_block(0)?.into_iter()
        } else {
            Vec::new().into_iter()
        };
        next_block[i] = 1;
        if let Some(k) = keys.next() {
            heap.push(Reverse((k, i)));
        }
        pending.push(keys);
    }
    while let Some(Reverse((k, i))) = heap.pop() {
        out.push(&k)?;
        let next = match pending[i].next() {
            Some(n) => Some(n),
            None if next_block[i] < inputs[i].blocks() => {
                if core.stop.load(Ordering::Acquire) {
                    return Ok(None);
                }
                pending[i] = inputs[i].read_block(next_block[i])?.into_iter();
                next_block[i] += 1;
                pending[i].next()
            }
            None => None,
        };
        if let Some(n) = next {
            heap.push(Reverse((n, i)));
        }
    }
    if core.stop.load(Ordering::Acquire) {
        return Ok(None);
    }
    out.finish(number, &core.cache).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers() {
        assert_eq!(tier(0), 0);
        assert_eq!(tier(4 * TIER_BASE - 1), 0);
        assert_eq!(tier(4 * TIER_BASE), 1);
        assert_eq!(tier(16 * TIER_BASE), 2);
    }
}
