//! I/O faults everywhere the node writes outside the Sozu table: `ENOSPC`
//! on a write, `EIO` on a write and `EIO` on a sync, injected through the
//! storage seam (`kakehi::store::fault`) into the block, filter and
//! spent-output flat files, the index database's commits, the index rows'
//! log, run files, manifest and directory syncs (which carry the address index;
//! their background compaction included) and the archive's epoch files and
//! header list, at a
//! random point of an import of regtest-a's first 400 blocks; and into the
//! `headers/` flat files at a random point of a headers-only sync of
//! regtest-a's 1,529 headers (`accept_headers`, 100 per call, as the P2P
//! layer stores headers before their blocks).
//!
//! After each fault: the import fails with an error naming the file and
//! the system's error; writes stay stopped (a second import with the disk
//! healthy again is refused, the published tip does not move); the next
//! start opens the datadir at a tip at or above every tip published
//! before the fault (nothing reported committed is lost), with a MuHash
//! that equals one rebuilt from the UTXO table; and resuming the import
//! reaches the uninterrupted import's tip, MuHash, filter header and
//! archive commitment. The fault is one-shot (later operations succeed), so
//! a writer that ignored a failure would carry on, and fail the test.
//!
//! CI: each of the 18 (place, fault) pairs once at a random point.
//! `KAKEHI_LONG=1`: 8 points each (144). The seed is printed;
//! `KAKEHI_SEED=<n>` replays it.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use bitcoin::Network;

use common::faults::{
    check_recovery, end_state, error_chain, import, open, EndState, FaultedImport, Suite, BLOCKS,
};
use common::{json, ListeningP2p};
use kakehi::chain::ChainParams;
use kakehi::p2p::addrman::{AddrBook, AddrBookError};
use kakehi::reindex::{
    check_no_swap_pending, reindex_chainstate, ReindexError, CHAINSTATE_DIRS, NEW_DIR,
};
use kakehi::sozu::SozuConfig;
use kakehi::store::fault::{self, FaultPlan, FaultReport, Fired, IoOp};
use parking_lot::Mutex;

/// Where faults go: a name and a string the paths contain.
const PLACES: [(&str, &str); 6] = [
    ("block files", "/blocks/"),
    ("filter files", "/filters/"),
    ("spent-output files", "/spent/"),
    ("index database", "/index"),
    (
        "index rows (log, run files, manifest, their directory)",
        "/index/rows",
    ),
    ("archive", "/archive/"),
];

/// The faults: operation, errno, the system's message for it.
const FAULTS: [(IoOp, i32, &str); 3] = [
    (IoOp::Write, 28, "No space left on device"),
    (IoOp::Write, 5, "Input/output error"),
    (IoOp::Sync, 5, "Input/output error"),
];

/// One fault at the `after`-th matching operation; returns a line for the
/// log.
fn one_case(
    blocks: &Path,
    place: &str,
    contains: &str,
    fault: (IoOp, i32, &str),
    after: u64,
    reference: &EndState,
) -> String {
    let (op, errno, message) = fault;
    let run = FaultedImport::run(blocks, |under| FaultPlan {
        under,
        path_contains: contains.into(),
        path_excludes: None,
        op,
        after,
        errno,
    });
    let (chain, report) = (&run.chain, &run.report);
    let case = format!("{place}, {op:?} {message}, after {after}");
    let fired = report.fired.clone().unwrap_or_else(|| {
        panic!(
            "{case}: the fault never fired ({} matching operations)",
            report.matched
        )
    });
    let err = run
        .result
        .clone()
        .expect_err(&format!("{case}: the import succeeded"));
    assert!(
        err.contains(&fired.path.display().to_string()) && err.contains(message),
        "{case}: the error does not name {} and {message}: {err}",
        fired.path.display()
    );
    // Writes stay stopped, with the disk healthy again.
    let published = chain.lock().snapshot().index().tip_height();
    assert!(
        chain.lock().write_failure().is_some(),
        "{case}: writes not stopped"
    );
    let again = import(chain, blocks);
    assert!(
        again.is_err(),
        "{case}: a second import went on after the failure"
    );
    assert_eq!(
        chain.lock().snapshot().index().tip_height(),
        published,
        "{case}"
    );
    let (root, shown) = (run.root.clone(), run.shown(&fired.path));
    // Restart (the datadir stays: only the node closes): nothing published
    // is lost, the stores agree, the resumed import ends as the
    // uninterrupted one.
    let _datadir = run.close();
    let reopened = check_recovery(&root, blocks, published, reference, &case);
    format!("{case}: failed at {shown}, published {published}, reopened {reopened}")
}

/// Fault cases per (place, fault) pair: 1 in CI, 8 with `KAKEHI_LONG=1`.
fn rounds() -> u64 {
    if std::env::var_os("KAKEHI_LONG").is_some() {
        8
    } else {
        1
    }
}

#[test]
fn io_faults_stop_writes_name_the_file_and_lose_nothing_committed() {
    let _seam = common::faults::SEAM.lock();
    let rounds = rounds();
    let mut suite = Suite::new("io fault");
    let reference = &suite.reference;
    // The reference itself is bcoin's: the filter header at its tip.
    let filters = json("regtest-a/filters.json");
    let at_tip = filters
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["hash"].as_str() == Some(reference.tip.as_str()))
        .unwrap();
    assert_eq!(
        reference.filter_header,
        at_tip["filter_header"].as_str().unwrap()
    );

    for (place, contains) in PLACES {
        eprintln!(
            "{place}: {} writes, {} syncs in a whole import",
            suite.ops(contains, IoOp::Write),
            suite.ops(contains, IoOp::Sync)
        );
    }
    let mut cases = 0;
    for (place, contains) in PLACES {
        for fault in FAULTS {
            let total = suite.ops(contains, fault.0);
            assert!(
                total > 0,
                "no {:?} of the {place} in a whole import",
                fault.0
            );
            for _ in 0..rounds {
                let after = suite.rng.next() % total;
                eprintln!(
                    "{}",
                    one_case(
                        &suite.blocks,
                        place,
                        contains,
                        fault,
                        after,
                        &suite.reference
                    )
                );
                cases += 1;
            }
        }
    }
    eprintln!(
        "{cases} faults injected, each recovered (seed {})",
        suite.seed
    );
}

/// A book of `n` addresses (192.0.2.x, TEST-NET-1), pretty-printed: a save
/// by the node writes it compact, so any save shows.
fn book_json(n: u8) -> Vec<u8> {
    let addrs: Vec<_> = (1..=n)
        .map(|i| {
            serde_json::json!({"addr": format!("192.0.2.{i}:18444"), "services": 1033,
                "last_seen": 1_700_000_000, "failures": 0})
        })
        .collect();
    serde_json::to_vec_pretty(&serde_json::json!({"version": 1, "addrs": addrs})).unwrap()
}

/// One fault in a save of the address book (2 entries on disk, 3 in
/// memory): the error names the path and the system's message; before the
/// rename nothing changed (the old book, no temporary file), after it (the
/// directory's fsync) the new book is whole.
fn book_save_case(fault: (IoOp, i32, &str), after: u64) -> (String, Option<Fired>) {
    let (op, errno, message) = fault;
    let dir = common::tempdir();
    let root = dir.path().canonicalize().unwrap();
    let path = root.join("peers.json");
    let old = book_json(2);
    std::fs::write(&path, &old).unwrap();
    let mut book = AddrBook::load(&path, 1).unwrap();
    book.add(
        "192.0.2.3:18444".parse().unwrap(),
        1033,
        Some(1_700_000_000),
    );
    fault::arm(FaultPlan {
        under: root.clone(),
        path_contains: String::new(),
        path_excludes: None,
        op,
        after,
        errno,
    });
    let saved = book.save(&path);
    let fired = fault::disarm().fired;
    let case = format!("address book, {op:?} {message}, after {after}");
    let Some(at) = &fired else {
        assert!(saved.is_ok(), "{case}: {saved:?}");
        return (case, None);
    };
    let err = match saved {
        Err(e @ AddrBookError::Io { .. }) => error_chain(&e),
        other => panic!("{case}: {other:?}"),
    };
    assert!(
        err.contains(&at.path.display().to_string()) && err.contains(message),
        "{case}: the error does not name {} and {message}: {err}",
        at.path.display()
    );
    assert!(!root.join("peers.tmp").exists(), "{case}: peers.tmp left");
    let entries = AddrBook::load(&path, 1).unwrap().len();
    if at.path == root {
        assert_eq!(entries, 3, "{case}: the renamed book");
    } else {
        assert!(std::fs::read(&path).unwrap() == old, "{case}: book changed");
    }
    let shown = at.path.strip_prefix(&root).unwrap().display().to_string();
    (
        format!("{case}: failed at '{shown}', {entries} entries on disk"),
        fired,
    )
}

/// A node whose first save of the address book fails goes on: it keeps
/// listening and its next save writes the book.
fn node_goes_on_after_a_failed_book_save() -> String {
    let dir = common::tempdir();
    let root = dir.path().canonicalize().unwrap();
    let (_datadir, cs) = open(&root.join("node"));
    let path = root.join("peers.json");
    let old = book_json(2);
    std::fs::write(&path, &old).unwrap();
    let mut config = kakehi::p2p::P2pConfig::default();
    config.dns_seeds = false;
    config.max_outbound_full_relay = 0;
    config.addr_file = Some(path.clone());
    config.timeouts.maintenance = std::time::Duration::from_millis(20);
    config.timeouts.addr_book_save = std::time::Duration::from_millis(50);
    fault::arm(FaultPlan {
        under: root.clone(),
        path_contains: "peers".into(),
        path_excludes: None,
        op: IoOp::Write,
        after: 0,
        errno: 28,
    });
    let p2p = ListeningP2p::start_with(std::sync::Arc::new(Mutex::new(cs)), config);
    let t = std::time::Instant::now();
    while std::fs::read(&path).unwrap() == old {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "no save of the book after the failed one"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let report = fault::disarm();
    let fired = report.fired.expect("the first save failed");
    assert_eq!(fired.path, root.join("peers.tmp"));
    std::net::TcpStream::connect(p2p.addr).expect("the node still listens");
    p2p.stop().expect("the P2P layer stops cleanly");
    assert_eq!(AddrBook::load(&path, 1).unwrap().len(), 2);
    format!(
        "address book: first save failed at peers.tmp (ENOSPC), saved {:?} later, node up",
        t.elapsed()
    )
}

/// `peers.json` (the address book, not consensus data): a failed save is a
/// typed error naming the file, changes nothing before its rename, and the
/// node goes on. Every write and sync of a save, each fault.
#[test]
fn address_book_faults_keep_the_old_book_and_the_node_goes_on() {
    let _seam = common::faults::SEAM.lock();
    let mut cases = 0;
    for fault in FAULTS {
        for after in 0.. {
            let (line, fired) = book_save_case(fault, after);
            if fired.is_none() {
                assert!(after > 0, "{line}: no {:?} in a save", fault.0);
                break;
            }
            eprintln!("{line}");
            cases += 1;
        }
    }
    eprintln!("{}", node_goes_on_after_a_failed_book_save());
    eprintln!("{cases} faults in saves of the address book, 1 in a running node");
}

/// Where faults go in `kakehi reindex-chainstate`: a name, a string the
/// paths contain, one they must not.
const REINDEX_PLACES: [(&str, &str, Option<&str>); 3] = [
    (
        "reindex: the new chain state's files",
        "/reindex.new/",
        None,
    ),
    (
        "reindex: its completion marker",
        "/reindex.new/COMPLETE",
        None,
    ),
    (
        "reindex: its directories, swap renames and syncs",
        "",
        Some("/reindex.new/"),
    ),
];

/// Reindexes `root` (regtest-a's first 400 blocks imported) with `plan`
/// armed; returns the result and what the seam saw.
fn reindex(
    root: &Path,
    plan: Option<FaultPlan>,
) -> (
    Result<Option<kakehi::import::ImportSummary>, ReindexError>,
    FaultReport,
) {
    let _lock = kakehi::node::DataDir::open(root).unwrap();
    if let Some(plan) = plan {
        fault::arm(plan);
    }
    let result = reindex_chainstate(
        root,
        ChainParams::new(Network::Regtest),
        SozuConfig::default(),
        kakehi::store::Budgets::default(),
        &AtomicBool::new(false),
        false,
        &mut |cs| {
            cs.set_group_limits(common::faults::LIMITS);
            Ok(())
        },
    );
    (result, fault::disarm())
}

/// Every file under `dir` with its bytes (the datadir's lock excepted).
fn dir_contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name() != Some(".lock".as_ref()) {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// The inode of each chain-state directory (a swapped one is another).
fn inodes(root: &Path) -> Vec<u64> {
    use std::os::unix::fs::MetadataExt;
    CHAINSTATE_DIRS
        .iter()
        .map(|d| std::fs::metadata(root.join(d)).unwrap().ino())
        .collect()
}

/// One fault in a reindex of a copy of `source`: the reindex stops with an
/// error naming the path and the system's message. Before the swap the
/// datadir is byte for byte as before (the unfinished build removed);
/// during it the node refuses the datadir until a second reindex finishes
/// the swap. Then the datadir opens at the uninterrupted import's state.
fn reindex_case(
    (source, tip): (&Path, u32),
    blocks: &Path,
    plan: FaultPlan,
    reference: &EndState,
) -> String {
    let (op, message, after) = (plan.op, errno_message(plan.errno), plan.after);
    let dir = common::tempdir();
    let root = dir.path().canonicalize().unwrap();
    common::copy_dir(source, &root);
    let (before, before_inodes) = (dir_contents(&root), inodes(&root));
    let case = format!(
        "reindex, paths with {:?} without {:?}, {op:?} {message}, after {}",
        plan.path_contains, plan.path_excludes, after
    );
    let (result, report) = reindex(
        &root,
        Some(FaultPlan {
            under: root.clone(),
            ..plan
        }),
    );
    let fired = report
        .fired
        .unwrap_or_else(|| panic!("{case}: never fired"));
    let err = result.expect_err(&format!("{case}: the reindex succeeded"));
    let shown = error_chain(&err);
    assert!(
        shown.contains(&fired.path.display().to_string()) && shown.contains(message),
        "{case}: the error does not name {} and {message}: {shown}",
        fired.path.display()
    );
    let what = if check_no_swap_pending(&root).is_err() {
        assert!(matches!(err, ReindexError::Swap { .. }), "{case}: {shown}");
        let (again, _) = reindex(&root, None);
        assert!(matches!(again, Ok(None)), "{case}: {again:?}");
        "swap finished by a second run"
    } else if inodes(&root) == before_inodes {
        assert!(!root.join(NEW_DIR).exists(), "{case}: the build is left");
        assert!(dir_contents(&root) == before, "{case}: the datadir changed");
        "datadir unchanged"
    } else {
        let now = inodes(&root);
        assert!(
            now.iter().zip(&before_inodes).all(|(a, b)| a != b),
            "{case}: half swapped without a refusal"
        );
        "swap done"
    };
    check_recovery(&root, blocks, tip, reference, &case);
    let at = fired
        .path
        .strip_prefix(&root)
        .unwrap()
        .display()
        .to_string();
    format!("{op:?} {message}, after {after}: failed at '{at}', {what}")
}

/// The system's message for the errnos of [`FAULTS`].
fn errno_message(errno: i32) -> &'static str {
    match errno {
        28 => "No space left on device",
        _ => "Input/output error",
    }
}

/// `kakehi reindex-chainstate` under I/O faults: its new chain state's
/// files, its completion marker, its directories, swap and syncs.
#[test]
fn reindex_faults_stop_it_naming_the_path_and_lose_nothing() {
    let _seam = common::faults::SEAM.lock();
    let mut rng = common::Rng::from_env_or_clock("reindex fault");
    let seed = rng.seed();
    let scratch = common::tempdir();
    let base = scratch.path().canonicalize().unwrap();
    let blocks = common::regtest_a_prefix(&base, BLOCKS);
    let source = base.join("source");
    let (reference, tip) = {
        let (_datadir, cs) = open(&source);
        let chain = Mutex::new(cs);
        import(&chain, &blocks).unwrap();
        let cs = chain.lock();
        (end_state(&cs), cs.snapshot().index().tip_height())
    };
    let counted = base.join("counted");
    common::copy_dir(&source, &counted);
    let (result, report) = reindex(
        &counted,
        Some(FaultPlan {
            under: counted.clone(),
            path_contains: String::new(),
            path_excludes: None,
            op: IoOp::Write,
            after: u64::MAX,
            errno: 5,
        }),
    );
    assert!(matches!(result, Ok(Some(_))), "{result:?}");
    let (_datadir, cs) = open(&counted);
    assert_eq!(end_state(&cs), reference, "the reindexed state");
    drop(cs);
    let mut cases = 0;
    for (i, (place, contains, excludes)) in REINDEX_PLACES.into_iter().enumerate() {
        let faults: Vec<_> = if std::env::var_os("KAKEHI_LONG").is_some() {
            FAULTS.to_vec()
        } else {
            vec![FAULTS[(i + seed as usize) % FAULTS.len()]]
        };
        for (op, errno, _) in faults {
            let total = count(&report.seen, contains, excludes, op);
            assert!(total > 0, "no {op:?} in {place}");
            for _ in 0..rounds() {
                let plan = FaultPlan {
                    under: PathBuf::new(),
                    path_contains: contains.into(),
                    path_excludes: excludes.map(Into::into),
                    op,
                    after: rng.next() % total,
                    errno,
                };
                let line = reindex_case((&source, tip), &blocks, plan, &reference);
                eprintln!("{place}: {line}");
                cases += 1;
            }
        }
    }
    eprintln!("{cases} faults injected in reindexes, each recovered (seed {seed})");
}

/// Operations of kind `op` in `seen` on paths containing `contains` and
/// not `excludes`.
fn count(seen: &common::faults::SeenOps, contains: &str, excludes: Option<&str>, op: IoOp) -> u64 {
    seen.iter()
        .filter(|((p, o), _)| {
            let p = p.to_string_lossy();
            *o == op && p.contains(contains) && !excludes.is_some_and(|x| p.contains(x))
        })
        .map(|(_, n)| n)
        .sum()
}

/// Headers per call of `accept_headers`, as a P2P `headers` message
/// brings them in a slow sync (the P2P layer takes up to 2,000).
const HEADERS_PER_BATCH: usize = 100;

/// An open datadir and its chain state.
type DataDirChain = (kakehi::node::DataDir, kakehi::pipeline::Chainstate);

/// Accepts `headers` in batches into the chain state of the datadir at
/// `root` until one fails; returns the node and the first error.
fn accept_all(
    root: &Path,
    headers: &[bitcoin::block::Header],
) -> (DataDirChain, Result<(), String>) {
    let (datadir, mut cs) = open(root);
    let mut result = Ok(());
    for batch in headers.chunks(HEADERS_PER_BATCH) {
        match cs.accept_headers(batch) {
            Ok(accepted) => assert!(accepted.refused.is_none(), "{accepted:?}"),
            Err(e) => {
                result = Err(error_chain(&e));
                break;
            }
        }
    }
    ((datadir, cs), result)
}

/// A headers-only sync of `headers` into a fresh datadir with a fault of
/// `op` (`errno`) planned after `after` operations of the `headers/` files
/// (`u64::MAX`: never, to count them): the datadir, its canonical root,
/// the node, the sync's result and what the seam saw.
fn faulted_sync(
    headers: &[bitcoin::block::Header],
    op: IoOp,
    after: u64,
    errno: i32,
) -> (
    tempfile::TempDir,
    PathBuf,
    DataDirChain,
    Result<(), String>,
    FaultReport,
) {
    let dir = common::tempdir();
    let root = dir.path().canonicalize().unwrap();
    fault::arm(FaultPlan {
        under: root.clone(),
        path_contains: "/headers/".into(),
        path_excludes: None,
        op,
        after,
        errno,
    });
    let (node, result) = accept_all(&root, headers);
    let report = fault::disarm();
    (dir, root, node, result, report)
}

/// One fault in the `headers/` files during a headers-only sync of
/// regtest-a's headers (file order, stale branches included): the sync
/// stops with an error naming the file, writes stay stopped, and the next
/// start knows every header published before the fault and accepts the
/// rest up to the same best header.
fn headers_case(
    headers: &[bitcoin::block::Header],
    fault: (IoOp, i32, &str),
    after: u64,
) -> String {
    let (op, errno, message) = fault;
    let (_dir, root, (datadir, cs), result, report) = faulted_sync(headers, op, after, errno);
    let case = format!("headers files, {op:?} {message}, after {after}");
    let fired = report
        .fired
        .unwrap_or_else(|| panic!("{case}: the fault never fired"));
    let err = result.expect_err(&format!("{case}: the headers sync succeeded"));
    assert!(
        err.contains(&fired.path.display().to_string()) && err.contains(message),
        "{case}: the error does not name {} and {message}: {err}",
        fired.path.display()
    );
    let mut cs = cs;
    let published = cs.snapshot().index().len();
    assert!(cs.write_failure().is_some(), "{case}: writes not stopped");
    assert!(
        cs.accept_headers(&headers[headers.len() - 1..]).is_err(),
        "{case}: a header was accepted after the failure"
    );
    assert_eq!(cs.snapshot().index().len(), published, "{case}");
    drop(cs);
    drop(datadir);
    let (datadir, cs) = open(&root);
    let known = cs.snapshot().index().len();
    assert!(
        known >= published,
        "{case}: {known} entries after the restart, {published} published"
    );
    drop(cs);
    drop(datadir);
    let (reopened, result) = accept_all(&root, headers);
    result.unwrap_or_else(|e| panic!("{case}: after the restart: {e}"));
    let index = reopened.1.snapshot().index().clone();
    assert_eq!(
        index.best_header().hash,
        headers[headers.len() - 1].block_hash(),
        "{case}"
    );
    format!(
        "{case}: failed at {}, {published} entries published, all {} headers after the restart",
        fired
            .path
            .strip_prefix(&root)
            .unwrap_or(&fired.path)
            .display(),
        index.len() - 1
    )
}

#[test]
fn header_file_faults_stop_the_sync_and_lose_no_published_header() {
    let _seam = common::faults::SEAM.lock();
    let mut rng = common::Rng::from_env_or_clock("headers fault");
    let headers: Vec<bitcoin::block::Header> = kakehi::import::read_file(
        &common::data("regtest-a/blocks.dat"),
        &ChainParams::new(Network::Regtest),
    )
    .unwrap()
    .into_iter()
    .map(|r| r.block.header)
    .collect();
    // The writes and syncs of the headers files in a whole headers sync.
    let (_dir, _, _node, result, report) = faulted_sync(&headers, IoOp::Write, u64::MAX, 5);
    result.unwrap();
    let seen = report.seen;
    let mut cases = 0;
    for fault in FAULTS {
        let total = count(&seen, "/headers/", None, fault.0);
        assert!(total > 1, "{total} {:?} of the headers files", fault.0);
        for _ in 0..rounds() {
            eprintln!("{}", headers_case(&headers, fault, rng.next() % total));
            cases += 1;
        }
    }
    eprintln!("{cases} faults injected in headers syncs, each recovered");
}
