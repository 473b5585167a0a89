//! Script-check threads kept across blocks, as Bitcoin Core's `CCheckQueue`
//! (`src/checkqueue.h`) keeps its `-par` workers.
//!
//! The writer hands a block's checks to the pool ([`ScriptPool::start`])
//! and goes on with its own work on the block; the workers verify
//! meanwhile. When the writer needs the verdict
//! ([`PendingChecks::finish`]) it joins the checks itself (Core's master
//! thread does the same in `CCheckQueueControl::Wait`), then waits until
//! every worker has left them. No thread is started per block.
//!
//! A [`PendingChecks`] dropped without [`PendingChecks::finish`] cancels
//! its checks and waits for the workers to leave them, so no worker ever
//! runs a block's checks after its caller has moved on.
//!
//! Besides checks, the caller may hand the pool tasks of its own
//! ([`ScriptPool::run`], `task.rs`): a worker takes the oldest task only
//! when no started checks have inputs left to take, so tasks fill the
//! workers' idle time and never delay a verdict; the caller runs a task
//! itself when it wants the result before any worker took it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use super::block::{BlockScriptError, OwnedBlockChecks};
use super::task::{task, PendingTask, Task};

/// Checks handed to the pool and the workers inside them.
struct Live {
    checks: Arc<OwnedBlockChecks>,
    /// Workers running [`OwnedBlockChecks::work`] on them.
    active: Arc<AtomicUsize>,
}

/// What the workers and the callers share.
#[derive(Default)]
struct State {
    /// Checks started and not yet finished, oldest first.
    live: Vec<Live>,
    /// Tasks handed in ([`ScriptPool::run`]), oldest first; those taken
    /// by their caller meanwhile are skipped.
    tasks: VecDeque<Arc<dyn Task>>,
    shutdown: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Signalled when checks are started or a task handed in, and at
    /// shutdown.
    work: Condvar,
    /// Signalled when a worker leaves checks.
    left: Condvar,
}

impl Shared {
    /// Removes `checks` from the live list (no worker takes them again)
    /// and waits until every worker has left them.
    fn retire(&self, checks: &Arc<OwnedBlockChecks>) {
        let mut state = self.state.lock();
        let Some(at) = state
            .live
            .iter()
            .position(|l| Arc::ptr_eq(&l.checks, checks))
        else {
            return;
        };
        let live = state.live.remove(at);
        while live.active.load(Ordering::Acquire) > 0 {
            self.left.wait(&mut state);
        }
    }
}

/// A fixed set of script-check threads (`kakehi-script-N`), kept until the
/// pool is dropped.
pub struct ScriptPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for ScriptPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptPool")
            .field("workers", &self.threads.len())
            .finish()
    }
}

impl Default for ScriptPool {
    /// A pool without threads: the caller of [`PendingChecks::finish`]
    /// verifies alone.
    fn default() -> Self {
        ScriptPool {
            shared: Arc::new(Shared::default()),
            threads: Vec::new(),
        }
    }
}

impl ScriptPool {
    /// Starts `workers` threads (0: the caller of [`PendingChecks::finish`]
    /// verifies alone). A block's checks run on these and on the caller's
    /// thread, so `workers` is the cores to use minus one (Core's `-par`
    /// default).
    ///
    /// # Errors
    /// The operating system refused a thread (those already started are
    /// stopped).
    pub fn new(workers: usize) -> Result<Self, std::io::Error> {
        let mut pool = ScriptPool {
            shared: Arc::new(Shared::default()),
            threads: Vec::with_capacity(workers),
        };
        for n in 0..workers {
            let shared = Arc::clone(&pool.shared);
            let thread = std::thread::Builder::new()
                .name(format!("kakehi-script-{n}"))
                .spawn(move || worker(&shared))?;
            pool.threads.push(thread);
        }
        Ok(pool)
    }

    /// Worker threads (the caller's not counted).
    pub fn workers(&self) -> usize {
        self.threads.len()
    }

    /// Hands `job` to the workers: the first worker with no checks left
    /// to take runs it (checks started later come first). Its result is
    /// [`PendingTask::join`]'s, which runs it on the caller's thread when
    /// no worker took it yet (so a pool without workers runs every task
    /// there).
    pub fn run<T, F>(&self, job: F) -> PendingTask<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (cell, handle) = task(job);
        if !self.threads.is_empty() {
            self.shared.state.lock().tasks.push_back(cell);
            self.shared.work.notify_one();
        }
        handle
    }

    /// Hands `checks` to the workers, who start at once.
    pub fn start(&self, checks: Arc<OwnedBlockChecks>) -> PendingChecks {
        let active = Arc::new(AtomicUsize::new(0));
        self.shared.state.lock().live.push(Live {
            checks: Arc::clone(&checks),
            active,
        });
        self.shared.work.notify_all();
        PendingChecks {
            shared: Arc::clone(&self.shared),
            checks: Some(checks),
        }
    }
}

impl Drop for ScriptPool {
    fn drop(&mut self) {
        self.shared.state.lock().shutdown = true;
        self.shared.work.notify_all();
        for thread in self.threads.drain(..) {
            // A worker that panicked has nothing left to clean up.
            let _ = thread.join();
        }
    }
}

/// A worker: runs the oldest live checks that still have inputs to take,
/// else the oldest task not taken yet, until shutdown.
fn worker(shared: &Shared) {
    let mut state = shared.state.lock();
    loop {
        if state.shutdown {
            return;
        }
        let next = state.live.iter().find(|l| !l.checks.exhausted());
        let Some(live) = next else {
            if let Some(task) = next_task(&mut state.tasks) {
                drop(state);
                task.run();
                state = shared.state.lock();
            } else {
                shared.work.wait(&mut state);
            }
            continue;
        };
        let (checks, active) = (Arc::clone(&live.checks), Arc::clone(&live.active));
        // Counted under the lock: `retire` sees every worker that took them.
        active.fetch_add(1, Ordering::AcqRel);
        drop(state);
        checks.work();
        state = shared.state.lock();
        active.fetch_sub(1, Ordering::AcqRel);
        shared.left.notify_all();
    }
}

/// Takes the oldest task of `tasks` no one has taken yet, dropping those
/// their callers took or dropped meanwhile.
fn next_task(tasks: &mut VecDeque<Arc<dyn Task>>) -> Option<Arc<dyn Task>> {
    while let Some(task) = tasks.pop_front() {
        if task.queued() {
            return Some(task);
        }
    }
    None
}

/// A block's checks running on a [`ScriptPool`].
pub struct PendingChecks {
    shared: Arc<Shared>,
    /// `None` once finished.
    checks: Option<Arc<OwnedBlockChecks>>,
}

impl PendingChecks {
    /// Joins the checks on this thread until none is left, waits for the
    /// workers to leave them, and returns the verdict.
    ///
    /// # Errors
    /// As [`super::verify_block_scripts`].
    pub fn finish(mut self) -> Result<(), BlockScriptError> {
        let Some(checks) = self.checks.take() else {
            return Ok(());
        };
        checks.work();
        self.shared.retire(&checks);
        checks.verdict()
    }
}

impl Drop for PendingChecks {
    fn drop(&mut self) {
        if let Some(checks) = self.checks.take() {
            checks.cancel();
            self.shared.retire(&checks);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::script::block::tests::block;
    use crate::validation::script::ScriptFlags;

    fn owned(txs: usize, inputs: usize, failing: &[usize]) -> Arc<OwnedBlockChecks> {
        let (blk, spent) = block(txs, inputs, failing);
        let checks = OwnedBlockChecks::new(Arc::new(blk), spent.into(), ScriptFlags::P2SH);
        Arc::new(checks.expect("spent outputs match"))
    }

    #[test]
    fn the_first_failure_in_block_order_on_every_pool_size() {
        for workers in [0, 1, 3] {
            let pool = ScriptPool::new(workers).expect("threads");
            // Blocks one after the other on the same threads.
            for round in 0..20 {
                let failing = [round * 7 % 120 + 30, 171];
                match pool.start(owned(6, 30, &failing)).finish() {
                    Err(BlockScriptError::Script { vin, error, .. }) => {
                        assert_eq!(vin as usize, failing[0] % 30, "{workers} workers");
                        assert_eq!(error.name(), "EVAL_FALSE");
                    }
                    other => panic!("{workers} workers: {other:?}"),
                }
                assert_eq!(pool.start(owned(6, 30, &[])).finish(), Ok(()));
            }
        }
    }

    #[test]
    fn checks_started_together_finish_in_any_order() {
        let pool = ScriptPool::new(2).expect("threads");
        let good = pool.start(owned(4, 40, &[]));
        let bad = pool.start(owned(4, 40, &[100]));
        assert!(bad.finish().is_err());
        assert_eq!(good.finish(), Ok(()));
    }

    #[test]
    fn tasks_run_on_an_idle_worker_or_on_the_caller() {
        let caller = std::thread::current().id();
        let pool = ScriptPool::new(1).expect("threads");
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = pool.run(move || {
            let _ = tx.send(std::thread::current().id());
            7u32
        });
        let ran_on = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("an idle worker takes the task");
        assert_ne!(ran_on, caller);
        assert_eq!(handle.join(), 7);
        // Checks still run after tasks, and without workers the caller
        // runs the task itself.
        assert_eq!(pool.start(owned(2, 10, &[])).finish(), Ok(()));
        let alone = ScriptPool::new(0).expect("no threads");
        assert_eq!(alone.run(|| std::thread::current().id()).join(), caller);
    }

    #[test]
    fn dropped_checks_are_cancelled_and_left() {
        let pool = ScriptPool::new(1).expect("threads");
        let checks = owned(8, 50, &[]);
        drop(pool.start(Arc::clone(&checks)));
        assert!(checks.exhausted());
        // Nobody runs them any more: the pool's only reference is gone.
        assert_eq!(Arc::strong_count(&checks), 1);
        assert_eq!(pool.start(owned(2, 10, &[])).finish(), Ok(()));
    }
}
