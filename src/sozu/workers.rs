//! The table's shard workers (the Sozu paper, "Sharding the Sozu table"):
//! long-lived threads that run each shard's part of a lookup batch, a
//! block's write and a commit's publish.
//!
//! Until 2026-11-25 the table spawned one scoped thread per busy shard at
//! every call, three times per block: each new thread started with an
//! empty allocator heap, and the kernel's zeroing of its fresh memory and
//! mimalloc's reclaiming of the dead threads' heaps were ~10 % of the
//! table's CPU at 1M entries (`docs/benchmarks-history.md`, Sozu round 8). The pool is
//! made once per open table: `shards − 1` threads, the calling thread
//! running the first busy shard itself.

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::SozuError;

/// The worker threads of one table (none with one shard).
pub(super) struct Workers {
    pool: Option<rayon::ThreadPool>,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field(
                "threads",
                &self.pool.as_ref().map_or(0, |p| p.current_num_threads()),
            )
            .finish()
    }
}

impl Workers {
    /// `shards − 1` worker threads, named `sozu-shard-N`.
    ///
    /// # Errors
    /// [`SozuError::Io`] when the operating system refuses a thread.
    pub(super) fn new(shards: usize) -> Result<Self, SozuError> {
        if shards <= 1 {
            return Ok(Self { pool: None });
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(shards - 1)
            .thread_name(|i| format!("sozu-shard-{}", i + 1))
            .build()
            .map_err(|e| SozuError::Io {
                path: "sozu shard worker threads".into(),
                source: std::io::Error::other(e),
            })?;
        Ok(Self { pool: Some(pool) })
    }

    /// Runs `f` on each shard ([`super::shard::Shard`]) that has work (`work[i]` for shard i): the
    /// first busy shard on the calling thread, the others on the workers,
    /// all at once; their results in shard order. A panic in `f` is
    /// reported as [`SozuError::Poisoned`].
    ///
    /// # Errors
    /// The first error of `f`, in shard order.
    pub(super) fn run<S: Send, T: Send, R: Send>(
        &self,
        shards: &mut [S],
        work: Vec<Vec<T>>,
        f: impl Fn(&mut S, Vec<T>) -> Result<R, SozuError> + Sync,
    ) -> Result<Vec<R>, SozuError> {
        let guarded = |s: &mut S, items: Vec<T>| {
            catch_unwind(AssertUnwindSafe(|| f(s, items))).unwrap_or(Err(SozuError::Poisoned))
        };
        let busy = work.iter().filter(|w| !w.is_empty()).count();
        let mut tasks = shards
            .iter_mut()
            .zip(work)
            .filter(|(_, items)| !items.is_empty());
        let pool = match &self.pool {
            Some(pool) if busy > 1 => pool,
            _ => return tasks.map(|(s, items)| guarded(s, items)).collect(),
        };
        let mut slots: Vec<Option<Result<R, SozuError>>> = (0..busy).map(|_| None).collect();
        let (first_slot, other_slots) = slots.split_at_mut(1);
        let first = tasks.next();
        pool.in_place_scope(|scope| {
            for ((s, items), slot) in tasks.zip(other_slots.iter_mut()) {
                let guarded = &guarded;
                scope.spawn(move |_| *slot = Some(guarded(s, items)));
            }
            if let Some((s, items)) = first {
                first_slot[0] = Some(guarded(s, items));
            }
        });
        slots
            .into_iter()
            .map(|r| r.unwrap_or(Err(SozuError::Poisoned)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every busy shard runs once, on its own work, results in shard
    /// order; idle shards are skipped; the pool is reused across calls.
    #[test]
    fn runs_each_busy_shard_in_order() {
        for n in [1usize, 2, 4] {
            let w = Workers::new(n).expect("threads");
            let mut shards: Vec<u32> = (0..n as u32).collect();
            for round in 0..50u32 {
                let work: Vec<Vec<u32>> = (0..n as u32)
                    .map(|i| if i == 1 { Vec::new() } else { vec![i, round] })
                    .collect();
                let out = w
                    .run(&mut shards, work, |s, items| {
                        *s += 1;
                        Ok((items[0], std::thread::current().name().map(str::to_owned)))
                    })
                    .expect("run");
                let ids: Vec<u32> = out.iter().map(|(i, _)| *i).collect();
                let want: Vec<u32> = (0..n as u32).filter(|&i| i != 1).collect();
                assert_eq!(ids, want);
                // The first busy shard runs on the calling thread.
                assert_eq!(out[0].1, std::thread::current().name().map(str::to_owned));
            }
            let runs: Vec<u32> = (0..n as u32)
                .map(|i| i + if i == 1 { 0 } else { 50 })
                .collect();
            assert_eq!(shards, runs);
        }
    }

    /// An error of any shard is returned; a panic is `Poisoned`, and the
    /// pool still works after it.
    #[test]
    fn errors_and_panics() {
        let w = Workers::new(3).expect("threads");
        let mut idx = [0u32, 1, 2];
        let work = || vec![vec![()], vec![()], vec![()]];
        let r = w.run(&mut idx, work(), |i, _| match *i {
            2 => Err(SozuError::ReorgTooDeep {
                height: 7,
                tip: 200,
            }),
            _ => Ok(*i),
        });
        assert!(matches!(r, Err(SozuError::ReorgTooDeep { height: 7, .. })));
        for panicking in 0..3u32 {
            let r = w.run(&mut idx, work(), |i, _| {
                assert!(*i != panicking, "planted panic");
                Ok(*i)
            });
            assert!(matches!(r, Err(SozuError::Poisoned)));
        }
        let r = w.run(&mut idx, work(), |i, _| Ok(*i));
        assert_eq!(r.expect("pool still works"), vec![0, 1, 2]);
    }
}
