//! The row store against a `BTreeSet` model: random inserts, flushes,
//! compactions, reopens (rows not flushed are lost, as in a crash) with
//! crash leftovers in the directory; and damaged files.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;

#[derive(Clone, Debug)]
enum Op {
    Insert(Vec<[u8; TX_KEY]>),
    Flush,
    Compact,
    /// Reopen, after leaving a stray run and a manifest temp file.
    Reopen,
    Query([u8; 8], Option<[u8; TX_KEY]>),
}

/// Keys over few 8-byte prefixes, so queries hit many runs.
fn key() -> impl Strategy<Value = [u8; TX_KEY]> {
    (0u8..6, any::<u64>()).prop_map(|(p, rest)| {
        let mut k = [0u8; TX_KEY];
        k[..8].copy_from_slice(&[p; 8]);
        k[8..].copy_from_slice(&(rest % 64).to_be_bytes());
        k
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec(key(), 0..40).prop_map(Op::Insert),
        3 => Just(Op::Flush),
        1 => Just(Op::Compact),
        1 => Just(Op::Reopen),
        3 => ((0u8..7), prop::option::of(key())).prop_map(|(p, b)| Op::Query([p; 8], b)),
    ]
}

fn check(
    sets: &RowSets,
    model: &BTreeSet<[u8; TX_KEY]>,
    prefix: [u8; 8],
    below: Option<[u8; TX_KEY]>,
) {
    let want: Vec<_> = model.iter().filter(|k| k[..8] == prefix).copied().collect();
    assert_eq!(sets.txs().scan_prefix(&prefix).unwrap(), want);
    assert_eq!(sets.txs().has_prefix(&prefix).unwrap(), !want.is_empty());
    let mut rev = Vec::new();
    sets.txs()
        .scan_prefix_rev(&prefix, below.as_ref(), &mut |k| {
            rev.push(*k);
            true
        })
        .unwrap();
    let want_rev: Vec<_> = want
        .iter()
        .rev()
        .filter(|k| below.is_none_or(|b| **k < b))
        .copied()
        .collect();
    assert_eq!(rev, want_rev);
    if let Some(k) = want.first() {
        assert!(sets.txs().has_prefix(k).unwrap());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn row_store_matches_a_btreeset(ops in prop::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows");
        let (mut sets, created) = RowSets::open(&path).unwrap();
        prop_assert!(created);
        let mut all = BTreeSet::new();
        let mut durable = BTreeSet::new();
        for op in ops {
            match op {
                Op::Insert(keys) => {
                    all.extend(keys.iter().copied());
                    sets.txs().insert(keys);
                }
                Op::Flush => {
                    sets.flush().unwrap();
                    durable = all.clone();
                }
                Op::Compact => sets.compact_now().unwrap(),
                Op::Reopen => {
                    drop(sets);
                    std::fs::write(path.join("tx-000000999999.run"), b"cut short").unwrap();
                    std::fs::write(path.join(manifest::TMP_NAME), b"cut").unwrap();
                    let (s, created) = RowSets::open(&path).unwrap();
                    prop_assert!(!created);
                    prop_assert!(!path.join("tx-000000999999.run").exists());
                    sets = s;
                    all = durable.clone();
                }
                Op::Query(prefix, below) => check(&sets, &all, prefix, below),
            }
        }
        for p in 0..7u8 {
            check(&sets, &all, [p; 8], None);
        }
    }
}

/// Many flushes (one small run each, as once synced) stay few runs, and a
/// reopen reads them back.
#[test]
fn compaction_bounds_the_run_count() {
    let dir = tempfile::tempdir().unwrap();
    let (sets, _) = RowSets::open(dir.path()).unwrap();
    let mut model = BTreeSet::new();
    for i in 0..300u32 {
        let keys: Vec<[u8; 20]> = (0..20u32)
            .map(|j| {
                let mut k = [0u8; 20];
                k[..4].copy_from_slice(&(j % 5).to_be_bytes());
                k[8..12].copy_from_slice(&i.to_be_bytes());
                k[16..].copy_from_slice(&j.to_be_bytes());
                k
            })
            .collect();
        model.extend(keys.iter().copied());
        sets.history().insert(keys);
        sets.flush().unwrap();
    }
    sets.settle().unwrap();
    let runs = sets.history().runs().len();
    assert!(runs < FAN_IN_BOUND, "{runs} runs after 300 flushes");
    drop(sets);
    let (sets, _) = RowSets::open(dir.path()).unwrap();
    let mut got = Vec::new();
    sets.history()
        .scan_prefix_rev(&[0, 0, 0, 3, 0, 0, 0, 0], None, &mut |k| {
            got.push(*k);
            got.len() < 7
        })
        .unwrap();
    let want: Vec<_> = model
        .iter()
        .rev()
        .filter(|k| k[3] == 3)
        .take(7)
        .copied()
        .collect();
    assert_eq!(got, want);
    let files = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(
        files,
        runs + sets.txs().runs().len() + sets.spends().runs().len() + 1
    );
}

/// The most runs a set keeps after settling in the test above: at most
/// three per tier, and 300 flushes of 20 keys fill tiers 0 and 1 only.
const FAN_IN_BOUND: usize = 7;

/// A damaged run or manifest: open fails with a typed error naming the
/// file, and changes nothing.
#[test]
fn damaged_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (sets, _) = RowSets::open(dir.path()).unwrap();
        sets.txs().insert(vec![[7u8; 16], [8u8; 16]]);
        sets.flush().unwrap();
    }
    let run = dir.path().join("tx-000000000000.run");
    let good = std::fs::read(&run).unwrap();
    std::fs::write(&run, &good[..good.len() - 3]).unwrap();
    let err = RowSets::open(dir.path()).unwrap_err();
    assert!(matches!(err, RunError::Corrupt { .. }), "{err}");
    assert!(
        err.to_string().contains(&run.display().to_string()),
        "{err}"
    );
    assert!(run.exists());
    std::fs::write(&run, &good).unwrap();
    let manifest = dir.path().join(manifest::NAME);
    let mut m = std::fs::read(&manifest).unwrap();
    m[9] ^= 1;
    std::fs::write(&manifest, &m).unwrap();
    let err = RowSets::open(dir.path()).unwrap_err();
    assert!(
        err.to_string().contains(&manifest.display().to_string()),
        "{err}"
    );
}

/// A write or sync failing at any step of a flush (the fault seam): the
/// flush fails naming the file, the directory still opens (the manifest
/// names only files that exist: a failed directory sync after the
/// manifest's rename must not delete the runs it names), and a flush with
/// the disk healthy again makes every row durable.
#[test]
fn a_failed_flush_leaves_an_openable_store() {
    use crate::store::fault::{self, FaultPlan, IoOp};
    for op in [IoOp::Write, IoOp::Sync] {
        for after in 0..8 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("rows");
            let (sets, _) = RowSets::open(&path).unwrap();
            let keys: Vec<[u8; 16]> = (0..50u8).map(|i| [i; 16]).collect();
            sets.txs().insert(keys.clone());
            sets.history().insert(vec![[3; 20]]);
            fault::arm(FaultPlan {
                under: path.clone(),
                path_contains: String::new(),
                path_excludes: None,
                op,
                after,
                errno: 5,
            });
            let flushed = sets.flush();
            let report = fault::disarm();
            let Some(fired) = report.fired else {
                flushed.unwrap();
                continue;
            };
            let err = flushed.unwrap_err();
            assert!(
                err.to_string().contains(&fired.path.display().to_string()),
                "{err}"
            );
            // A copy as the disk is now (before the retry) opens.
            let copy = tempfile::tempdir().unwrap();
            for e in std::fs::read_dir(&path).unwrap() {
                let e = e.unwrap();
                std::fs::copy(e.path(), copy.path().join(e.file_name())).unwrap();
            }
            drop(RowSets::open(copy.path()).unwrap_or_else(|e| panic!("{op:?} {after}: {e}")));
            sets.flush().unwrap();
            drop(sets);
            let (sets, _) = RowSets::open(&path).unwrap();
            for k in &keys {
                assert!(sets.txs().has_prefix(&k[..8]).unwrap(), "{op:?} {after}");
            }
            assert!(sets.history().has_prefix(&[3; 8]).unwrap());
        }
    }
}
