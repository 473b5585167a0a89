//! Power loss: what the disk holds after a power cut is what the last
//! fsync of each file guaranteed. An import of regtest-a's first 400
//! blocks is cut at a random write or sync (through the storage seam,
//! `kakehi::store::fault`: the operation fails and the node stops, as if
//! the machine had stopped there); the datadir is then copied as a power
//! cut leaves it: each flat file (blocks, filters, spent outputs) and each
//! run file of the index rows (`index/rows/*.run`) cut to its length at its
//! last fsync (none: empty), the index rows' log (`index/rows/LOG`,
//! overwritten in place) cut at the end of the records its last sync made
//! durable (none: empty), the archive's, the row manifest's and the log's
//! unrenamed temporary files dropped, the index database and the UTXO table as they
//! are on disk at that moment (sled's buffered writes and its pending flush
//! are not in the copy; their own crash safety is sled's and
//! `tests/it/sozu_crash.rs`'s).
//!
//! The copy must open at a tip at or above every tip published before the
//! cut (no block reported committed is lost), with a kept MuHash equal to
//! one rebuilt from the UTXO table, and the resumed import must end at the
//! uninterrupted import's tip, MuHash, filter header and archive
//! commitment. CI: 8 cuts; `KAKEHI_LONG=1`: 60. The seed is printed.

use crate::common;

use std::path::Path;

use common::faults::{self, check_recovery, EndState, FaultedImport, Suite};
use kakehi::store::fault::{FaultPlan, IoOp};

/// Flat-file directories: append-only, so a power cut keeps a prefix.
const FLAT_DIRS: [&str; 4] = ["blocks", "filters", "spent", "headers"];

/// Copies `from` to `to` as a power cut at this moment leaves it.
fn power_cut_copy(
    from: &Path,
    to: &Path,
    synced: &std::collections::BTreeMap<std::path::PathBuf, u64>,
) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if entry.file_type().unwrap().is_dir() {
            if entry.file_name() == "rows" {
                copy_rows(&src, &dst, synced);
                continue;
            }
            std::fs::create_dir_all(&dst).unwrap();
            power_cut_copy(&src, &dst, synced);
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tmp") {
            continue;
        }
        let Ok(mut bytes) = std::fs::read(&src) else {
            continue; // removed meanwhile (a rename of the archive)
        };
        let parent = src.parent().and_then(|p| p.file_name());
        let rows_file =
            parent.is_some_and(|p| p == "rows") && (name.ends_with(".run") || name == "LOG");
        if rows_file || parent.is_some_and(|p| FLAT_DIRS.iter().any(|d| p == *d)) {
            let keep = synced.get(&src).copied().unwrap_or(0) as usize;
            bytes.truncate(keep);
        }
        std::fs::write(&dst, bytes).unwrap();
    }
}

/// Copies the index rows' directory as of one instant: its background
/// compaction may replace the manifest and delete the runs it replaced
/// while the copy runs, so the copy is taken again until the manifest
/// did not change under it.
fn copy_rows(from: &Path, to: &Path, synced: &std::collections::BTreeMap<std::path::PathBuf, u64>) {
    let manifest = || std::fs::read(from.join("MANIFEST")).ok();
    for _ in 0..100 {
        let before = manifest();
        let _ = std::fs::remove_dir_all(to);
        std::fs::create_dir_all(to).unwrap();
        power_cut_copy(from, to, synced);
        if manifest() == before {
            return;
        }
    }
    panic!("the row manifest kept changing while copied");
}

/// An `EIO` at the `after`-th operation `op` anywhere in the datadir.
fn eio_at(op: IoOp, after: u64) -> impl FnOnce(std::path::PathBuf) -> FaultPlan {
    move |under| FaultPlan {
        under,
        path_contains: String::new(),
        path_excludes: None,
        op,
        after,
        errno: 5,
    }
}

fn one_cut(blocks: &Path, op: IoOp, after: u64, reference: &EndState) -> String {
    let run = FaultedImport::run(blocks, eio_at(op, after));
    let published = run.chain.lock().snapshot().index().tip_height();
    // The image is taken before the node is dropped (a drop flushes sled).
    let image = common::tempdir();
    power_cut_copy(&run.root, image.path(), &run.report.synced_len);
    let case = format!("cut at {op:?} {after}");
    let fired = run
        .report
        .fired
        .clone()
        .unwrap_or_else(|| panic!("{case}: never reached"));
    assert!(run.result.is_err(), "{case}: the import did not stop");
    let shown = run.shown(&fired.path);
    drop(run.close());

    let reopened = check_recovery(image.path(), blocks, published, reference, &case);
    format!("{case} ({shown}): published {published}, reopened {reopened}")
}

/// `ci` cuts, or `long` with `KAKEHI_LONG` set.
fn cut_count(ci: usize, long: usize) -> usize {
    if std::env::var_os("KAKEHI_LONG").is_some() {
        long
    } else {
        ci
    }
}

/// The `i`-th cut: at writes and syncs in turn, at a random one of the
/// reference import's.
fn random_cut(suite: &mut Suite, i: usize) -> (IoOp, u64) {
    let op = if i.is_multiple_of(2) {
        IoOp::Write
    } else {
        IoOp::Sync
    };
    (op, suite.rng.next() % suite.ops("", op))
}

#[test]
fn power_cut_keeps_every_published_block() {
    let _seam = faults::SEAM.lock();
    let cuts = cut_count(8, 60);
    let mut suite = Suite::new("power loss");
    for i in 0..cuts {
        let (op, after) = random_cut(&mut suite, i);
        eprintln!("{}", one_cut(&suite.blocks, op, after, &suite.reference));
    }
    eprintln!("{cuts} power cuts, each recovered (seed {})", suite.seed);
}

use crate::lazyfs;

/// One power cut on the lazy file system: an import into a datadir on the
/// mount, stopped by a fault at `op` number `after` (`None`: not stopped,
/// the whole import done), then the image of what every file's last fsync
/// left — sled's and the UTXO table's files included — must open at or
/// above the published tip and resume to the reference.
fn lazy_cut(
    mounted: &lazyfs::Mounted,
    mount: &Path,
    blocks: &Path,
    cut: Option<(IoOp, u64)>,
    reference: &EndState,
) -> String {
    let dir = tempfile::tempdir_in(mount).unwrap();
    let (op, after) = cut.unwrap_or((IoOp::Write, u64::MAX));
    let run = FaultedImport::run_in(dir, blocks, eio_at(op, after));
    let published = run.chain.lock().snapshot().index().tip_height();
    let image = common::tempdir();
    let rel = run.root.strip_prefix(mount).unwrap().to_path_buf();
    let unsynced = mounted.fs.unsynced_pages(&rel);
    mounted.fs.synced_image(&rel, image.path()).unwrap();
    let case = match cut {
        Some((op, after)) => {
            assert!(
                run.result.is_err(),
                "cut at {op:?} {after}: the import did not stop"
            );
            format!("lazy cut at {op:?} {after}")
        }
        None => {
            assert!(run.result.is_ok(), "{:?}", run.result);
            "lazy cut after the whole import".to_string()
        }
    };
    drop(run.close());
    let reopened = check_recovery(image.path(), blocks, published, reference, &case);
    format!("{case}: published {published}, {unsynced} pages unsynced, reopened {reopened}")
}

/// A lazy file system mounted on a fresh directory (kept as long as the
/// returned one).
///
/// Panics, saying why, where FUSE cannot be mounted (not root, no
/// `/dev/fuse`).
fn mount_lazy() -> (tempfile::TempDir, lazyfs::Mounted) {
    let at = common::tempdir();
    match lazyfs::LazyFs::mount(&at.path().canonicalize().unwrap()) {
        Ok(m) => (at, m),
        Err(why) => panic!("cannot mount the lazy file system here: {why}"),
    }
}

/// Power cuts under everything the node writes, not only what passes the
/// storage seam: the datadir lives on [`lazyfs::LazyFs`], so sled's log and
/// the UTXO table's pages lose what their last fsync did not cover. The
/// first cut comes right after a whole import returned (every block
/// published); the others at a random write or sync of the seam. CI: 3
/// cuts; `KAKEHI_LONG=1`: 20. Needs root and `/dev/fuse` (ignored
/// unless asked for: README.md, "Tests").
#[test]
#[ignore = "needs root and /dev/fuse: mounts a FUSE file system"]
fn power_cut_under_sled_and_the_utxo_table_keeps_every_published_block() {
    let _seam = faults::SEAM.lock();
    let (at, mounted) = mount_lazy();
    let mount = at.path().canonicalize().unwrap();
    let cuts = cut_count(3, 20);
    let mut suite = Suite::new("lazy power loss");
    for i in 0..cuts {
        let cut = (i > 0).then(|| random_cut(&mut suite, i));
        let line = lazy_cut(&mounted, &mount, &suite.blocks, cut, &suite.reference);
        eprintln!("{line}");
    }
    eprintln!(
        "{cuts} power cuts on the lazy file system, each recovered (seed {})",
        suite.seed
    );
}

/// A failed fsync inside sled's own flusher thread (the lazy file system
/// fails it by the thread's name, as a disk would: the pages it covered
/// never reach the disk, and every other open file of `index/db` is told
/// at its next fsync, as Linux does), between two imports: the second
/// stops at its first index commit naming `index/db`, nothing published is
/// lost after a power cut, and the import resumes to the reference. Without the commit's own fsync
/// of sled's file the commits would go on over the lost pages. Needs root
/// and `/dev/fuse` (ignored unless asked for: README.md, "Tests").
#[test]
#[ignore = "needs root and /dev/fuse: mounts a FUSE file system"]
fn a_failed_fsync_in_sleds_flusher_stops_the_writes_and_loses_nothing_published() {
    let _seam = faults::SEAM.lock();
    let (at, mounted) = mount_lazy();
    let mount = at.path().canonicalize().unwrap();
    let suite = Suite::new("sled flusher fault");
    let dir = tempfile::tempdir_in(&mount).unwrap();
    let root = dir.path().canonicalize().unwrap();
    let (datadir, cs) = faults::open(&root);
    let chain = parking_lot::Mutex::new(cs);
    // Half the chain first; then sled's flusher fails (it fsyncs every
    // 500 ms, busy or not) while the node is idle, and the rest is
    // imported: its first commit must notice. Waiting for the failure makes
    // the order certain on a fast machine too.
    let scratch = common::tempdir();
    let half = common::regtest_a_prefix(scratch.path(), faults::BLOCKS / 2);
    faults::import(&chain, &half).expect("the first half");
    mounted.fs.fail_fsyncs("log flusher", "db", 0);
    let waited = std::time::Instant::now();
    while mounted.fs.fsyncs_failed() == 0 {
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(10),
            "sled's flusher did not fsync within 10 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let result = faults::import(&chain, &suite.blocks);
    let failed = mounted.fs.stop_failing();
    let err = result.expect_err("the import went on over a failed fsync");
    let db = root.join("index").join("db");
    assert!(
        err.contains(&db.display().to_string()) && err.contains("Input/output error"),
        "the error does not name {} and the failure: {err}",
        db.display()
    );
    let published = chain.lock().snapshot().index().tip_height();
    let image = common::tempdir();
    let rel = root.strip_prefix(&mount).unwrap().to_path_buf();
    mounted.fs.synced_image(&rel, image.path()).unwrap();
    drop(chain);
    drop(datadir);
    let case = "a failed fsync in sled's flusher";
    let reopened = check_recovery(
        image.path(),
        &suite.blocks,
        published,
        &suite.reference,
        case,
    );
    eprintln!("{case} ({failed} failed): stopped with \"{err}\", published {published}, reopened {reopened}");
}
