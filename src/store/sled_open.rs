//! Opening sled so that its panics on damaged files become an error.
//!
//! sled 0.34 panics instead of returning an error on some damaged files
//! while it recovers them inside `Config::open`, on the calling thread: an
//! index out of bounds in `pagecache/segment.rs` on a cut `db` file, and
//! `tried to serialize Uninitialized` in `serialization.rs` when recovery
//! skipped a page's base record and then writes its snapshot (sled issues
//! #1145 and #1387). [`open`] catches the unwind and returns
//! [`SledOpenError::Panicked`] with the panic's message and location, so the
//! store refuses the database like any other damaged file
//! ([`StoreError::Open`](super::StoreError::Open)).
//!
//! The default panic hook would still print `thread 'main' panicked at …`
//! to stderr before the unwind is caught, which reads as a crash. A hook
//! installed once per process ([`quiet_hook`]) passes every panic to the
//! hook that was there before it, except a panic on a thread that is inside
//! [`open`] (a thread-local flag): that one is recorded for the error
//! instead of printed. Panics of other threads, at any time, print as
//! before; no hook is swapped per call, so concurrent opens cannot lose the
//! previous hook.

use std::cell::{Cell, RefCell};
use std::panic::{self, AssertUnwindSafe, PanicHookInfo};
use std::sync::Once;

/// Why sled could not open the index database.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SledOpenError {
    /// sled refused the files with an error (damaged, or of another sled
    /// version).
    #[error(transparent)]
    Refused(#[from] sled::Error),
    /// sled panicked while recovering its files: they are damaged.
    #[error("sled panicked while recovering its files: {message} (at {location})")]
    Panicked {
        /// The panic's message.
        message: String,
        /// Where in sled it panicked (`file:line`), or `unknown`.
        location: String,
    },
}

thread_local! {
    /// Set while this thread is inside [`open`]: its panics are recorded,
    /// not printed.
    static QUIET: Cell<bool> = const { Cell::new(false) };
    /// The location of the last panic recorded on this thread.
    static CAUGHT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs, once per process, the hook that keeps panics inside [`open`]
/// quiet and passes every other panic to the hook that was installed
/// before (the default one prints it).
fn quiet_hook() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info: &PanicHookInfo<'_>| {
            if QUIET.with(Cell::get) {
                let at = info
                    .location()
                    .map(|l| format!("{}:{}", l.file(), l.line()));
                CAUGHT.with(|c| *c.borrow_mut() = at);
            } else {
                previous(info);
            }
        }));
    });
}

/// The text of a panic's payload (`panic!` with a literal or a format).
fn payload_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// Opens the database `config` describes, with sled's panics caught.
///
/// # Errors
/// [`SledOpenError::Refused`] for sled's own errors,
/// [`SledOpenError::Panicked`] when sled panicked while recovering the
/// files. `config` is dropped with whatever state a panic left (hence
/// `AssertUnwindSafe`): nothing of it is used afterwards.
pub(super) fn open(config: sled::Config) -> Result<sled::Db, SledOpenError> {
    quiet_hook();
    let was_quiet = QUIET.with(|q| q.replace(true));
    let opened = panic::catch_unwind(AssertUnwindSafe(move || config.open()));
    QUIET.with(|q| q.set(was_quiet));
    match opened {
        Ok(result) => Ok(result?),
        Err(payload) => Err(SledOpenError::Panicked {
            message: payload_text(payload.as_ref()),
            location: CAUGHT
                .with(|c| c.borrow_mut().take())
                .unwrap_or_else(|| "unknown".to_owned()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panic inside the quiet section is recorded with its location and
    /// becomes the error; the flag is cleared afterwards, so later panics
    /// of the thread go to the previous hook again.
    #[test]
    fn a_panic_inside_is_recorded_and_the_flag_restored() {
        quiet_hook();
        QUIET.with(|q| q.set(true));
        let caught = panic::catch_unwind(|| panic!("damaged page {}", 7));
        QUIET.with(|q| q.set(false));
        let payload = caught.expect_err("it panicked");
        assert_eq!(payload_text(payload.as_ref()), "damaged page 7");
        let at = CAUGHT.with(|c| c.borrow_mut().take()).expect("location");
        assert!(at.starts_with("src/store/sled_open.rs:"), "{at}");
        assert!(!QUIET.with(Cell::get));
    }

    /// A database that opens is returned, and a second open of the same
    /// directory in this process is sled's error, not a panic.
    #[test]
    fn opens_and_refuses_through_sled() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = open(sled::Config::new().path(dir.path())).expect("opens");
        match open(sled::Config::new().path(dir.path())) {
            Err(SledOpenError::Refused(_)) => {}
            other => panic!("expected sled's refusal, got {other:?}"),
        }
        drop(db);
        assert!(!QUIET.with(Cell::get));
    }
}
