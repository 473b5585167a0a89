//! Failures of sled's background threads, which sled only logs.
//!
//! sled 0.34.7 writes and fsyncs its file from a background flusher thread
//! (`flusher.rs`, every 500 ms) besides the flushes kakehi asks for. When
//! that thread's fsync (or its segment rewriting) fails, sled logs it with
//! `log::error!` ("failed to fsync from periodic flush thread: …") and
//! tells no caller. Linux reports a writeback error once per open file, so
//! the next commit's own fsync may then succeed over pages the kernel
//! dropped, and a commit reported durable may lack sled pages after a power
//! cut.
//!
//! [`layer`] is a tracing layer (sled's `log` records reach tracing through
//! `tracing-log`) that records the first ERROR event of sled's write paths
//! ([`WRITE_PATHS`]). From then on every [`super::Store::commit`] fails
//! with [`super::StoreError::Background`] and the node stops writing, as
//! after any failed write of the index: the next start recovers to the last
//! commit that all stores agree on, or refuses the datadir and names
//! `kakehi reindex-chainstate`. The `kakehi` binary installs the layer; a
//! program that uses the library without it watches nothing.

use std::sync::OnceLock;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::filter::{filter_fn, FilterFn, Filtered, LevelFilter};
use tracing_subscriber::layer::{Context, Layer};

/// The first error sled logged, as "target: message".
static FIRST: OnceLock<String> = OnceLock::new();

/// The first error sled's background threads logged in this process, if
/// any: "target: message".
pub fn background_failure() -> Option<&'static str> {
    FIRST.get().map(String::as_str)
}

/// Records sled's ERROR events (see the module doc).
#[derive(Clone, Copy, Debug, Default)]
pub struct SledErrors;

/// The message field of an event.
#[derive(Default)]
struct Message(String);

impl Visit for Message {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0 = value.to_owned();
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: Subscriber> Layer<S> for SledErrors {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut message = Message::default();
        event.record(&mut message);
        // A `log` record's own target is in its normalized metadata.
        let normalized = event.normalized_metadata();
        let target = normalized
            .as_ref()
            .map_or(event.metadata().target(), |m| m.target());
        let first = format!("{target}: {}", message.0);
        if FIRST.set(first).is_ok() {
            tracing::error!(
                error = background_failure().unwrap_or_default(),
                "the index database's background thread failed; writes stop"
            );
        }
    }
}

/// The modules of sled 0.34.7 that log a failed write, fsync or segment
/// rewrite of its file from a thread of its own: the periodic flusher
/// (`flusher.rs`), the log buffers written from its thread pool
/// (`pagecache/iobuf.rs`), file truncation (`pagecache/segment.rs`) and an
/// I/O thread that died (`threadpool.rs`). Its other ERROR records are not
/// lost writes (`config.rs`: a cache above the cgroup's memory limit;
/// `tree.rs`: a `Debug` print) and do not stop the node.
pub const WRITE_PATHS: [&str; 4] = [
    "sled::flusher",
    "sled::pagecache::iobuf",
    "sled::pagecache::segment",
    "sled::threadpool",
];

/// Whether `m` is an ERROR event of one of [`WRITE_PATHS`].
fn is_sled_write_error(m: &tracing::Metadata<'_>) -> bool {
    *m.level() == Level::ERROR && WRITE_PATHS.contains(&m.target())
}

/// [`SledErrors`] with its own filter (ERROR events of [`WRITE_PATHS`]),
/// so the log filter the operator sets (`log.filter`, which may silence
/// sled) never hides them from it and it asks for nothing more verbose
/// than ERROR.
pub fn layer<S>() -> Filtered<SledErrors, FilterFn, S>
where
    S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let filter: FilterFn = filter_fn(is_sled_write_error as fn(&tracing::Metadata<'_>) -> bool)
        .with_max_level_hint(LevelFilter::ERROR);
    SledErrors.with_filter(filter)
}
