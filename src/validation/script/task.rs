//! A task of the caller's run on the script threads
//! ([`super::ScriptPool::run`]): work the caller needs later (the writer: a
//! block's BIP-158 filter and MuHash delta), taken by a worker that has no
//! script checks left to run, or run by the caller itself when it asks for
//! the result ([`PendingTask::join`]) before any worker took it. Core's
//! `CCheckQueue` has no such tasks: it is how kakehi's writer hands the
//! work Core's engine does not do per block to the workers' idle time.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

/// A task's closure.
type Job<T> = Box<dyn FnOnce() -> T + Send>;

/// Where a task is.
enum Stage<T> {
    /// Not taken yet.
    Queued(Job<T>),
    /// Taken by a worker, running.
    Running,
    /// Run by a worker: its result, or its panic.
    Done(std::thread::Result<T>),
    /// Joined or dropped by its caller: nothing more to do.
    Gone,
}

/// A task and its result, shared by its caller and the pool.
pub(super) struct TaskCell<T> {
    stage: Mutex<Stage<T>>,
    /// Signalled when a worker has run the task.
    done: Condvar,
}

/// What the pool's workers see of a task, whatever its result's type.
pub(super) trait Task: Send + Sync {
    /// Whether no one has taken it yet.
    fn queued(&self) -> bool;
    /// Runs it on this thread if no one has taken it yet, keeping its
    /// result (or its panic) for its caller.
    fn run(&self);
}

impl<T: Send> Task for TaskCell<T> {
    fn queued(&self) -> bool {
        matches!(*self.stage.lock(), Stage::Queued(_))
    }

    fn run(&self) {
        let job = {
            let mut stage = self.stage.lock();
            match std::mem::replace(&mut *stage, Stage::Running) {
                Stage::Queued(job) => job,
                other => {
                    *stage = other;
                    return;
                }
            }
        };
        let result = catch_unwind(AssertUnwindSafe(job));
        let mut stage = self.stage.lock();
        // A caller that dropped its handle meanwhile left `Gone`: the
        // result is dropped.
        if matches!(*stage, Stage::Running) {
            *stage = Stage::Done(result);
        }
        self.done.notify_all();
    }
}

/// Makes a task of `job` and its caller's handle.
pub(super) fn task<T, F>(job: F) -> (Arc<TaskCell<T>>, PendingTask<T>)
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let cell = Arc::new(TaskCell {
        stage: Mutex::new(Stage::Queued(Box::new(job))),
        done: Condvar::new(),
    });
    let handle = PendingTask {
        cell: Arc::clone(&cell),
    };
    (cell, handle)
}

/// A task handed to a [`super::ScriptPool`], and the way to its result.
///
/// Dropped without [`PendingTask::join`], the task is cancelled when no
/// worker took it yet; a worker already running it finishes it (it owns
/// everything it reads) and its result is dropped.
pub struct PendingTask<T> {
    cell: Arc<TaskCell<T>>,
}

impl<T> std::fmt::Debug for PendingTask<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingTask").finish_non_exhaustive()
    }
}

impl<T> PendingTask<T> {
    /// The task's result: runs it on this thread when no worker took it
    /// yet, else waits for the worker running it.
    ///
    /// # Panics
    /// When the task itself panicked on a worker (the panic is resumed
    /// here, as if the task had run on this thread).
    pub fn join(self) -> T {
        let mut stage = self.cell.stage.lock();
        loop {
            match std::mem::replace(&mut *stage, Stage::Gone) {
                Stage::Queued(job) => {
                    drop(stage);
                    return job();
                }
                Stage::Done(Ok(result)) => return result,
                Stage::Done(Err(panic)) => {
                    drop(stage);
                    resume_unwind(panic)
                }
                Stage::Running => {
                    *stage = Stage::Running;
                    self.cell.done.wait(&mut stage);
                }
                // Only this handle leaves a task `Gone`, and `join` takes
                // it: a task still referred to is never `Gone` here.
                Stage::Gone => unreachable!("a joined task is joined once"),
            }
        }
    }
}

impl<T> Drop for PendingTask<T> {
    fn drop(&mut self) {
        *self.cell.stage.lock() = Stage::Gone;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joined_before_any_worker_runs_on_the_caller() {
        let (cell, handle) = task(|| std::thread::current().id());
        assert_eq!(handle.join(), std::thread::current().id());
        // A worker coming late finds nothing to run.
        assert!(!cell.queued());
        cell.run();
    }

    #[test]
    fn run_by_a_worker_then_joined() {
        let (cell, handle) = task(|| std::thread::current().id());
        let worker = std::thread::spawn(move || {
            cell.run();
            std::thread::current().id()
        });
        let ran_on = worker.join().expect("worker");
        assert_eq!(handle.join(), ran_on);
    }

    #[test]
    fn joined_while_a_worker_runs_it_waits_for_its_result() {
        let (cell, handle) = task(|| {
            std::thread::sleep(std::time::Duration::from_millis(50));
            std::thread::current().id()
        });
        let runner = Arc::clone(&cell);
        let worker = std::thread::spawn(move || {
            runner.run();
            std::thread::current().id()
        });
        while cell.queued() {
            std::thread::yield_now();
        }
        let got = handle.join();
        assert_eq!(got, worker.join().expect("worker"));
    }

    #[test]
    fn a_worker_panic_is_resumed_by_join() {
        let (cell, handle) = task(|| -> u32 { panic!("in the task") });
        cell.run();
        let joined = std::panic::catch_unwind(AssertUnwindSafe(|| handle.join()));
        assert!(joined.is_err());
    }

    #[test]
    fn dropped_before_a_worker_is_never_run() {
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&ran);
        let (cell, handle) = task(move || flag.store(true, std::sync::atomic::Ordering::SeqCst));
        drop(handle);
        assert!(!cell.queued());
        cell.run();
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    }
}
