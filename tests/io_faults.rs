//! I/O faults everywhere the node writes outside the Sozu table: `ENOSPC`
//! on a write, `EIO` on a write and `EIO` on a sync, injected through the
//! storage seam (`kakehi::store::fault`) into the block, filter and
//! spent-output flat files, the index database's commits, the index rows'
//! run files, manifest and directory syncs (which carry the address index;
//! their background compaction included) and the archive's epoch files and
//! header list, at a
//! random point of an import of regtest-a's first 400 blocks.
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

mod common;

use std::path::Path;

use common::faults::{check_recovery, import, EndState, FaultedImport, Suite};
use common::json;
use kakehi::store::fault::{FaultPlan, IoOp};

/// Where faults go: a name and a string the paths contain.
const PLACES: [(&str, &str); 6] = [
    ("block files", "/blocks/"),
    ("filter files", "/filters/"),
    ("spent-output files", "/spent/"),
    ("index database", "/index"),
    (
        "index rows (run files, manifest, their directory)",
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

#[test]
fn io_faults_stop_writes_name_the_file_and_lose_nothing_committed() {
    let rounds: u64 = if std::env::var_os("KAKEHI_LONG").is_some() {
        8
    } else {
        1
    };
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
