//! The row store against a `BTreeSet` model: random inserts, commits
//! (the row log), flushes, compactions, reopens (rows not committed are
//! lost, as in a crash) with crash leftovers in the directory; damaged
//! files; the row log's replay (torn tail, bad CRC, older generations).

use std::collections::BTreeSet;
use std::path::Path;

use proptest::prelude::*;

use super::*;

#[derive(Clone, Debug)]
enum Op {
    Insert(Vec<[u8; TX_KEY]>),
    Commit,
    Flush,
    Compact,
    /// Reopen, after leaving a stray run and a manifest temp file.
    Reopen,
    Query([u8; 8], Option<[u8; TX_KEY]>),
}

/// The default knobs but a cache of run partitions of 8 KiB (two
/// partitions): every read goes through evictions, and must give the
/// model's answers all the same.
fn small_cache() -> RowOptions {
    RowOptions {
        filter_cache: 8 << 10,
        ..RowOptions::default()
    }
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
        3 => Just(Op::Commit),
        1 => Just(Op::Flush),
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
        let (mut sets, created) = RowSets::open(&path, small_cache()).unwrap();
        prop_assert!(created);
        let mut all = BTreeSet::new();
        let mut durable = BTreeSet::new();
        for op in ops {
            match op {
                Op::Insert(keys) => {
                    all.extend(keys.iter().copied());
                    sets.txs().insert(keys);
                }
                Op::Commit => {
                    sets.commit().unwrap();
                    durable = all.clone();
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
                    let (s, created) = RowSets::open(&path, small_cache()).unwrap();
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
    let (sets, _) = RowSets::open(dir.path(), small_cache()).unwrap();
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
    let (sets, _) = RowSets::open(dir.path(), small_cache()).unwrap();
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
        runs + sets.txs().runs().len() + sets.spends().runs().len() + 2
    );
}

/// The most runs a set keeps after settling in the test above: at most
/// three per tier, and 300 flushes of 20 keys fill tiers 0 and 1 only.
const FAN_IN_BOUND: usize = 7;

/// Held by each test that arms the fault seam (one plan per process).
static FAULTS: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// A damaged run or manifest: open fails with a typed error naming the
/// file, and changes nothing.
#[test]
fn damaged_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (sets, _) = RowSets::open(dir.path(), small_cache()).unwrap();
        sets.txs().insert(vec![[7u8; 16], [8u8; 16]]);
        sets.flush().unwrap();
    }
    let run = dir.path().join("tx-000000000000.run");
    let good = std::fs::read(&run).unwrap();
    std::fs::write(&run, &good[..good.len() - 3]).unwrap();
    let err = RowSets::open(dir.path(), small_cache()).unwrap_err();
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
    let err = RowSets::open(dir.path(), small_cache()).unwrap_err();
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
    let _alone = FAULTS.lock();
    for op in [IoOp::Write, IoOp::Sync] {
        for after in 0..8 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("rows");
            let (sets, _) = RowSets::open(&path, small_cache()).unwrap();
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
            drop(
                RowSets::open(copy.path(), small_cache())
                    .unwrap_or_else(|e| panic!("{op:?} {after}: {e}")),
            );
            sets.flush().unwrap();
            drop(sets);
            let (sets, _) = RowSets::open(&path, small_cache()).unwrap();
            for k in &keys {
                assert!(sets.txs().has_prefix(&k[..8]).unwrap(), "{op:?} {after}");
            }
            assert!(sets.history().has_prefix(&[3; 8]).unwrap());
        }
    }
}

/// Keys `[i; 16]` for `i` in `range` (one 8-byte prefix each).
fn keys(range: std::ops::Range<u8>) -> Vec<[u8; TX_KEY]> {
    range.map(|i| [i; TX_KEY]).collect()
}

/// Which of `keys` the store at `dir` has after a reopen, and the bytes of
/// keys it holds in memory (replayed from the log).
fn reopened(dir: &Path, keys: &[[u8; TX_KEY]]) -> (Vec<bool>, usize) {
    let (sets, _) = RowSets::open(dir, small_cache()).unwrap();
    let has = keys
        .iter()
        .map(|k| sets.txs().has_prefix(&k[..8]).unwrap())
        .collect();
    (has, sets.txs().memory_bytes())
}

/// Three small commits, each one record of the log (no run file); the
/// offsets where each record ends.
fn three_records(dir: &Path) -> [u64; 3] {
    let (sets, _) = RowSets::open(dir, small_cache()).unwrap();
    let mut ends = [0; 3];
    for (i, end) in ends.iter_mut().enumerate() {
        let at = 10 * i as u8;
        sets.txs().insert(keys(at..at + 10));
        sets.commit().unwrap();
        *end = sets.core.log.lock().log.end();
    }
    assert!(sets.txs().runs().is_empty(), "a small commit wrote a run");
    ends
}

/// Changes the bytes of the log of the store at `dir` with `f`.
fn damage_log(dir: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let log = dir.join(log::NAME);
    let mut b = std::fs::read(&log).unwrap();
    f(&mut b);
    std::fs::write(&log, &b).unwrap();
}

/// A record torn by a crash mid-append (its end zeros, as the file was):
/// the reopened store has the records before it, not its rows; the next
/// commit writes over it and is read back.
#[test]
fn log_replay_stops_at_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let ends = three_records(dir.path());
    damage_log(dir.path(), |b| {
        b[ends[2] as usize - 20..ends[2] as usize].fill(0)
    });
    let all = keys(0..40);
    let (has, memory) = reopened(dir.path(), &all);
    assert_eq!(has, (0..40).map(|i| i < 20).collect::<Vec<_>>());
    assert_eq!(memory, 20 * TX_KEY);
    {
        let (sets, _) = RowSets::open(dir.path(), small_cache()).unwrap();
        sets.txs().insert(keys(30..40));
        sets.commit().unwrap();
    }
    let (has, _) = reopened(dir.path(), &all);
    assert_eq!(
        has,
        (0..40).map(|i| !(20..30).contains(&i)).collect::<Vec<_>>()
    );
}

/// A bad CRC in the middle of the log: replay stops there (the records
/// after it are dropped).
#[test]
fn log_replay_stops_at_a_bad_crc() {
    let dir = tempfile::tempdir().unwrap();
    let ends = three_records(dir.path());
    damage_log(dir.path(), |b| b[ends[0] as usize + 20] ^= 1);
    let (has, _) = reopened(dir.path(), &keys(0..30));
    assert_eq!(has, (0..30).map(|i| i < 10).collect::<Vec<_>>());
}

/// After a flush the log restarts: the older generation's records left in
/// the file past the new ones are not replayed (their rows are in runs),
/// a reopen right after the flush replays nothing, and replaying the same
/// log twice (a crash after the runs were written, before the manifest)
/// changes nothing.
#[test]
fn log_replay_after_a_flush() {
    let dir = tempfile::tempdir().unwrap();
    three_records(dir.path());
    let all = keys(0..50);
    {
        let (sets, _) = RowSets::open(dir.path(), small_cache()).unwrap();
        assert_eq!(sets.txs().memory_bytes(), 30 * TX_KEY);
        sets.flush().unwrap();
    }
    let (has, memory) = reopened(dir.path(), &all);
    assert_eq!((has.iter().filter(|h| **h).count(), memory), (30, 0));
    {
        let (sets, _) = RowSets::open(dir.path(), small_cache()).unwrap();
        // The same size as the old first record: the old second record
        // follows it exactly, of the old generation.
        sets.txs().insert(keys(40..50));
        sets.commit().unwrap();
    }
    let (has, memory) = reopened(dir.path(), &all);
    assert_eq!(
        has,
        (0..50).map(|i| !(30..40).contains(&i)).collect::<Vec<_>>()
    );
    assert_eq!(memory, 10 * TX_KEY);
    // Idempotent: the log replayed over runs holding the same rows.
    let (has_again, _) = reopened(dir.path(), &all);
    assert_eq!(has_again, has);
}

/// A commit of a quarter of [`MEMORY_BOUND`] bytes or more, or one that
/// finds [`MEMORY_BOUND`] bytes in memory, writes runs (and restarts the
/// log).
#[test]
fn large_commits_write_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (sets, _) = RowSets::open(dir.path(), small_cache()).unwrap();
    let many = |from: u32, n: u32| -> Vec<[u8; 20]> {
        (from..from + n)
            .map(|i| {
                let mut k = [0u8; 20];
                k[..4].copy_from_slice(&i.to_be_bytes());
                k
            })
            .collect()
    };
    let per_record = (MEMORY_BOUND / 4 / 20) as u32;
    sets.history().insert(many(0, per_record - 1));
    sets.commit().unwrap();
    assert!(sets.history().runs().is_empty());
    sets.history().insert(many(per_record, per_record + 1));
    sets.commit().unwrap();
    assert_eq!(sets.history().runs().len(), 1);
    assert_eq!(sets.history().memory_bytes(), 0);
    let to_bound = (MEMORY_BOUND / 20) as u32;
    for i in 0..to_bound / (per_record - 1) + 1 {
        assert!(sets.history().runs().len() == 1, "flushed early at {i}");
        let from = 2 * per_record + i * per_record;
        sets.history().insert(many(from, per_record - 1));
        sets.commit().unwrap();
    }
    sets.history().insert(many(u32::MAX - 1, 1));
    sets.commit().unwrap();
    assert_eq!(sets.history().runs().len(), 2);
}

/// A write or sync of the log failing (the fault seam): the commit fails
/// naming the log, a copy of the directory as it is then opens with every
/// row committed before, and the next commit (a flush) makes every row
/// durable.
#[test]
fn a_failed_log_append_leaves_an_openable_store() {
    use crate::store::fault::{self, FaultPlan, IoOp};
    let _alone = FAULTS.lock();
    for op in [IoOp::Write, IoOp::Sync] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows");
        let (sets, _) = RowSets::open(&path, small_cache()).unwrap();
        sets.txs().insert(keys(0..10));
        sets.commit().unwrap();
        sets.txs().insert(keys(10..20));
        fault::arm(FaultPlan {
            under: path.clone(),
            path_contains: format!("/{}", log::NAME),
            path_excludes: None,
            op,
            after: 0,
            errno: 28,
        });
        let committed = sets.commit();
        let report = fault::disarm();
        let fired = report.fired.expect("the log was not written");
        assert_eq!(fired.path, path.join(log::NAME));
        let err = committed.unwrap_err();
        assert!(err.to_string().contains(log::NAME), "{err}");
        let copy = tempfile::tempdir().unwrap();
        for e in std::fs::read_dir(&path).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), copy.path().join(e.file_name())).unwrap();
        }
        let (has, _) = reopened(copy.path(), &keys(0..10));
        assert!(has.iter().all(|h| *h), "{op:?}");
        sets.commit().unwrap();
        assert_eq!(sets.txs().runs().len(), 1, "{op:?}: not flushed");
        drop(sets);
        let (has, _) = reopened(&path, &keys(0..20));
        assert!(has.iter().all(|h| *h), "{op:?}");
    }
}

/// The position a commit returns is checked at open: a log that ends
/// before it (a record of a commit that returned was damaged) or a
/// manifest of an older generation is refused, naming the log; a log
/// torn after it opens.
#[test]
fn a_log_short_of_a_committed_position_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ends = three_records(dir.path());
    let at = |end: u64| LogPosition {
        generation: manifest::FIRST_GENERATION,
        end,
    };
    damage_log(dir.path(), |b| b[ends[1] as usize + 20] ^= 1);
    let (sets, _) = RowSets::open(dir.path(), small_cache()).unwrap();
    sets.check_log(at(ends[1])).unwrap();
    let err = sets.check_log(at(ends[2])).unwrap_err();
    assert!(matches!(err, RunError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains(log::NAME), "{err}");
    sets.flush().unwrap();
    let next = LogPosition {
        generation: manifest::FIRST_GENERATION + 1,
        end: 0,
    };
    sets.txs().insert(keys(50..60));
    assert_eq!(sets.commit().unwrap().generation, next.generation);
    drop(sets);
    let (sets, _) = RowSets::open(dir.path(), small_cache()).unwrap();
    sets.check_log(at(ends[2])).unwrap();
    sets.check_log(next).unwrap();
    let newer = LogPosition {
        generation: next.generation + 1,
        end: 0,
    };
    assert!(sets.check_log(newer).is_err());
}

/// [`RowSets::resident_bytes`] counts the keys in memory, then, once they
/// are in a run, the run's partition checksums and first keys and the
/// partitions in the cache, which never holds more than its budget
/// however many runs and rows there are.
#[test]
fn resident_bytes_are_memory_keys_then_partitions_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 64 << 10;
    let options = RowOptions {
        filter_cache: budget,
        ..RowOptions::default()
    };
    let (sets, _) = RowSets::open(dir.path(), options).unwrap();
    let many = |from: u32, n: u32| -> Vec<[u8; TX_KEY]> {
        (from..from + n)
            .map(|i| {
                let mut k = [0u8; TX_KEY];
                k[..8].copy_from_slice(
                    &u64::from(i)
                        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                        .to_be_bytes(),
                );
                k
            })
            .collect()
    };
    sets.txs().insert(many(0, 5000));
    sets.spends().insert(many(0, 10));
    assert_eq!(sets.resident_bytes(), 5010 * TX_KEY);
    sets.flush().unwrap();
    assert_eq!(sets.cache_bytes(), 0, "nothing read yet");
    let first = sets.resident_bytes();
    assert!(first < 64, "{first}");
    // 20 runs of 50,000 rows: ~1.3 MB of filters and block indexes on
    // disk, looked up all over.
    for r in 0..20u32 {
        sets.txs().insert(many(10_000 + r * 50_000, 50_000));
        sets.flush().unwrap();
    }
    let on_disk: usize = sets.txs().runs().iter().map(|r| r.tail_bytes()).sum();
    assert!(on_disk > 16 * budget, "{on_disk}");
    for i in (0..1_020_000u32).step_by(499) {
        let k = many(i, 1)[0];
        let held = i < 5000 || (10_000..1_010_000).contains(&i);
        assert_eq!(sets.txs().has_prefix(&k[..8]).unwrap(), held, "{i}");
        assert!(
            sets.cache_bytes() <= budget,
            "{} > {budget}",
            sets.cache_bytes()
        );
    }
    assert!(sets.cache_bytes() > budget / 2, "{}", sets.cache_bytes());
    let summaries = sets.resident_bytes() - sets.cache_bytes();
    assert!(summaries < on_disk / 500, "{summaries} of {on_disk}");
}
