//! sled's background flusher reports a failed fsync only with
//! `log::error!` (sled 0.34.7 `flusher.rs`). With kakehi's log layer
//! installed (`store::sled_watch`, as the `kakehi` binary does), that
//! record stops the node's writes: the next commit fails naming the index
//! database and sled's message, and the published tip does not move.
//!
//! The watch is process-wide: the test runs in a process of its own
//! ([`common::alone`]), so that the failure it plants stops no other
//! test's writes.

use crate::common;

use std::sync::atomic::AtomicBool;

use common::faults::{error_chain, open};
use kakehi::import::import_files;
use kakehi::store::sled_watch;
use parking_lot::Mutex;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// sled's own words (`flusher.rs`), as its flusher logs them.
const SLED_FSYNC_FAILED: &str =
    "failed to fsync from periodic flush thread: Input/output error (os error 5)";

#[test]
fn a_failed_background_fsync_of_sled_stops_the_writes() {
    if !common::alone(
        module_path!(),
        "a_failed_background_fsync_of_sled_stops_the_writes",
    ) {
        return;
    }
    tracing_subscriber::registry()
        .with(sled_watch::layer())
        .init();
    let dir = common::tempdir();
    let scratch = common::tempdir();
    let first = common::regtest_a_prefix(scratch.path(), 200);
    let blocks = common::data("regtest-a/blocks.dat");
    let (_datadir, cs) = open(dir.path());
    let chain = Mutex::new(cs);
    let stop = AtomicBool::new(false);
    import_files(&chain, &[first], &stop, false).expect("import");
    let tip = chain.lock().snapshot().index().tip_height();
    assert!(tip > 100, "{tip}");

    // Errors of other targets, sled's below ERROR, and sled's errors that
    // are no lost write are not failures of its writes.
    log::error!(target: "sledgehammer", "not sled");
    log::warn!(target: "sled::flusher", "a warning");
    log::error!(
        target: "sled::config",
        "cache capacity is limited to the cgroup memory limit: 1 bytes"
    );
    tracing::error!("an error of kakehi's own");
    assert_eq!(sled_watch::background_failure(), None);

    log::error!(target: "sled::flusher", "{SLED_FSYNC_FAILED}");
    assert_eq!(
        sled_watch::background_failure(),
        Some(format!("sled::flusher: {SLED_FSYNC_FAILED}").as_str())
    );
    let err = import_files(&chain, &[blocks], &stop, false).expect_err("writes stopped");
    let err = error_chain(&err);
    assert!(
        err.contains(&dir.path().join("index").display().to_string())
            && err.contains(SLED_FSYNC_FAILED),
        "{err}"
    );
    let chain = chain.lock();
    assert!(chain.write_failure().is_some());
    assert_eq!(chain.snapshot().index().tip_height(), tip);
}
