//! One row set: the keys of one tree (fixed length `N`), in an in-memory
//! sorted set (the rows applied since the last flush; of them, the keys
//! not yet in the row log are also kept in order of arrival), the set being
//! written to a run (while a flush writes it), and the runs named by the
//! manifest. A key is in the set when it is in any of them; readers merge
//! them and give each key once.
//!
//! Readers take a snapshot of the run list (an `Arc`), so a flush or a
//! compaction that replaces it never blocks or breaks a read: a run file
//! unlinked by a compaction stays readable through its open descriptor.

use std::collections::{BTreeSet, BinaryHeap};
use std::ops::Bound;
use std::sync::Arc;

use parking_lot::RwLock;

use super::error::RunError;
use super::run::{prefix_u64, RevCursor, Run};

/// The run list of a set, oldest first.
pub type Runs<const N: usize> = Arc<Vec<Arc<Run<N>>>>;

struct State<const N: usize> {
    mem: BTreeSet<[u8; N]>,
    /// Keys inserted since the last log record or flush (also in `mem`).
    pending: Vec<[u8; N]>,
    frozen: Option<Arc<BTreeSet<[u8; N]>>>,
    runs: Runs<N>,
}

/// One tree's keys: memory, then runs.
pub struct RowSet<const N: usize> {
    /// Short name, the run files' prefix (`tx`, `spend`, `history`).
    pub name: &'static str,
    state: RwLock<State<N>>,
}

/// The range of keys starting with `prefix` (at least 8 bytes, at most
/// `N`), below `below` when given: `(lo, hi)`, `hi` exclusive, `None`
/// when unbounded.
fn range<const N: usize>(prefix: &[u8], below: Option<&[u8; N]>) -> ([u8; N], Option<[u8; N]>) {
    let mut lo = [0u8; N];
    lo[..prefix.len()].copy_from_slice(prefix);
    let mut end = [0u8; N];
    end[..prefix.len()].copy_from_slice(prefix);
    let carried = end[..prefix.len()].iter_mut().rev().all(|b| {
        *b = b.wrapping_add(1);
        *b == 0
    });
    let hi = (!carried).then_some(end);
    let hi = match (hi, below) {
        (Some(h), Some(b)) => Some(h.min(*b)),
        (h, b) => h.or(b.copied()),
    };
    // `below` under the prefix: an empty range (never start > end).
    (lo, hi.map(|h| h.max(lo)))
}

/// The runs whose filter may hold keys of the 8-byte `prefix`.
///
/// # Errors
/// A run's [`RunError`] reading a filter partition.
fn candidates<const N: usize>(runs: &[Arc<Run<N>>], prefix: u64) -> Result<Vec<&Run<N>>, RunError> {
    let mut out = Vec::new();
    for run in runs {
        if run.may_contain(prefix)? {
            out.push(&**run);
        }
    }
    Ok(out)
}

fn bounds<const N: usize>(lo: &[u8; N], hi: Option<&[u8; N]>) -> (Bound<[u8; N]>, Bound<[u8; N]>) {
    (
        Bound::Included(*lo),
        hi.map_or(Bound::Unbounded, |h| Bound::Excluded(*h)),
    )
}

impl<const N: usize> RowSet<N> {
    /// A set over `runs`, nothing in memory.
    pub fn new(name: &'static str, runs: Vec<Arc<Run<N>>>) -> Self {
        RowSet {
            name,
            state: RwLock::new(State {
                mem: BTreeSet::new(),
                pending: Vec::new(),
                frozen: None,
                runs: Arc::new(runs),
            }),
        }
    }

    /// Adds `keys`, visible to readers at once (not durable).
    pub fn insert(&self, keys: Vec<[u8; N]>) {
        if keys.is_empty() {
            return;
        }
        let mut s = self.state.write();
        s.mem.extend(keys.iter().copied());
        s.pending.extend(keys);
    }

    /// Adds `keys` read back from the row log (durable already).
    pub fn load(&self, keys: &[u8]) {
        let mut s = self.state.write();
        for key in keys.chunks_exact(N) {
            let mut k = [0u8; N];
            k.copy_from_slice(key);
            s.mem.insert(k);
        }
    }

    /// Takes the keys inserted since the last log record or flush, to be
    /// logged (they stay in memory).
    pub fn take_pending(&self) -> Vec<[u8; N]> {
        std::mem::take(&mut self.state.write().pending)
    }

    /// Bytes of keys inserted since the last log record or flush (counted
    /// each time inserted).
    pub fn pending_bytes(&self) -> usize {
        self.state.read().pending.len() * N
    }

    /// Bytes of keys in memory (not in runs).
    pub fn memory_bytes(&self) -> usize {
        self.state.read().mem.len() * N
    }

    /// Bytes of keys in memory, the frozen ones being written to a run
    /// included (the B-tree's node overhead not counted), plus what every
    /// run keeps in memory outside the partition cache (the checksums and
    /// first keys of its partitions, `Run::resident_bytes`).
    pub fn resident_bytes(&self) -> usize {
        let s = self.state.read();
        let frozen = s.frozen.as_ref().map_or(0, |f| f.len());
        let runs: usize = s.runs.iter().map(|r| r.resident_bytes()).sum();
        (s.mem.len() + frozen) * N + runs
    }

    /// Moves the keys in memory aside to be written as a run (they stay
    /// visible); `None` when there are none.
    pub fn freeze(&self) -> Option<Arc<BTreeSet<[u8; N]>>> {
        let mut s = self.state.write();
        if s.mem.is_empty() {
            return None;
        }
        let frozen = Arc::new(std::mem::take(&mut s.mem));
        s.pending.clear();
        s.frozen = Some(frozen.clone());
        Some(frozen)
    }

    /// After a failed flush: the frozen keys go back to memory, for the
    /// next flush.
    pub fn thaw(&self) {
        let mut s = self.state.write();
        if let Some(frozen) = s.frozen.take() {
            s.mem.extend(frozen.iter().copied());
        }
    }

    /// The current run list.
    pub fn runs(&self) -> Runs<N> {
        self.state.read().runs.clone()
    }

    /// Replaces the run list (the manifest names `runs` now) and drops the
    /// frozen keys (now in one of them) when `flushed`.
    pub fn install(&self, runs: Vec<Arc<Run<N>>>, flushed: bool) {
        let mut s = self.state.write();
        s.runs = Arc::new(runs);
        if flushed {
            s.frozen = None;
        }
    }

    /// The keys in memory in `lo..hi`, and the run snapshot.
    fn snapshot(&self, lo: &[u8; N], hi: Option<&[u8; N]>) -> (Vec<[u8; N]>, Runs<N>) {
        let s = self.state.read();
        let mut keys: Vec<[u8; N]> = s.mem.range(bounds(lo, hi)).copied().collect();
        if let Some(f) = &s.frozen {
            keys.extend(f.range(bounds(lo, hi)).copied());
        }
        (keys, s.runs.clone())
    }

    /// Every key starting with `prefix` (8 to `N` bytes), ascending, each
    /// once.
    ///
    /// # Errors
    /// A run's [`RunError`].
    pub fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<[u8; N]>, RunError> {
        let (lo, hi) = range::<N>(prefix, None);
        let (mut keys, runs) = self.snapshot(&lo, hi.as_ref());
        for run in candidates(&runs, prefix_u64(prefix))? {
            run.scan(&lo, hi.as_ref(), &mut |k| {
                keys.push(*k);
                true
            })?;
        }
        keys.sort_unstable();
        keys.dedup();
        Ok(keys)
    }

    /// Whether any key starts with `prefix` (8 to `N` bytes).
    ///
    /// # Errors
    /// A run's [`RunError`].
    pub fn has_prefix(&self, prefix: &[u8]) -> Result<bool, RunError> {
        let (lo, hi) = range::<N>(prefix, None);
        {
            let s = self.state.read();
            let in_mem = |m: &BTreeSet<[u8; N]>| m.range(bounds(&lo, hi.as_ref())).next().is_some();
            if in_mem(&s.mem) || s.frozen.as_deref().is_some_and(in_mem) {
                return Ok(true);
            }
        }
        for run in candidates(&self.runs(), prefix_u64(prefix))? {
            let mut found = false;
            run.scan(&lo, hi.as_ref(), &mut |_| {
                found = true;
                false
            })?;
            if found {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Calls `f` with the keys starting with `prefix` (8 to `N` bytes)
    /// below `below` (exclusive; `None`: all), descending, each once, until
    /// `f` returns false. Runs are read one block at a time as the merge
    /// needs them.
    ///
    /// # Errors
    /// A run's [`RunError`].
    pub fn scan_prefix_rev(
        &self,
        prefix: &[u8],
        below: Option<&[u8; N]>,
        f: &mut dyn FnMut(&[u8; N]) -> bool,
    ) -> Result<(), RunError> {
        let (lo, hi) = range::<N>(prefix, below);
        let (mut mem, runs) = self.snapshot(&lo, hi.as_ref());
        mem.sort_unstable();
        let mut cursors: Vec<RevCursor<'_, N>> = candidates(&runs, prefix_u64(prefix))?
            .into_iter()
            .map(|r| RevCursor::new(r, lo, hi))
            .collect::<Result<_, _>>()?;
        // Source 0 is memory; source i + 1 is cursor i.
        let mut heap = BinaryHeap::new();
        if let Some(k) = mem.pop() {
            heap.push((k, 0usize));
        }
        for (i, c) in cursors.iter_mut().enumerate() {
            if let Some(k) = c.next_key()? {
                heap.push((k, i + 1));
            }
        }
        let mut last: Option<[u8; N]> = None;
        while let Some((k, src)) = heap.pop() {
            let next = match src {
                0 => mem.pop(),
                i => cursors[i - 1].next_key()?,
            };
            if let Some(n) = next {
                heap.push((n, src));
            }
            if last == Some(k) {
                continue;
            }
            last = Some(k);
            if !f(&k) {
                break;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ranges() {
        let (lo, hi) = range::<10>(&[1, 2, 3, 4, 5, 6, 7, 0xff], None);
        assert_eq!(lo, [1, 2, 3, 4, 5, 6, 7, 0xff, 0, 0]);
        assert_eq!(hi, Some([1, 2, 3, 4, 5, 6, 8, 0, 0, 0]));
        assert_eq!(range::<8>(&[0xff; 8], None).1, None);
        let below = [1, 2, 3, 4, 5, 6, 7, 0xff, 0, 9];
        assert_eq!(range::<10>(&lo[..8], Some(&below)).1, Some(below));
    }
}
