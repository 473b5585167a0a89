//! Crash safety and corruption of the Sozu table.
//!
//! - `countdown_failures`: a storage backend that fails every I/O after N
//!   operations, then loses unsynced writes at random (power loss); the
//!   reopened table equals the model at its `committed()` block.
//! - `kill_minus_9`: re-executes this test binary as a child that commits
//!   a deterministic workload block by block; the parent kills it with
//!   SIGKILL at random moments, reopens, and compares with the model
//!   replayed to the committed block. 100 kills by default, 1,000 with
//!   `KAKEHI_LONG=1`.
//! - corruption: flipped page byte, truncated file, wrong magic or version,
//!   header field out of range under a valid checksum, damaged journal
//!   record → typed error, and opening wrote nothing.

use crate::sozu_common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bitcoin::hashes::Hash;
use bitcoin::{Amount, OutPoint, Txid};
use kakehi::sozu::journal;
use kakehi::sozu::model::ModelTable;
use kakehi::sozu::*;
use sozu_common::{gen_block, small_config, unspent_summary, Chain, Rng};

fn tag(id: u32, height: u32) -> CommitTag {
    CommitTag {
        block: BlockId(id),
        height,
        block_hash: [id as u8; 32],
    }
}

/// The table and the model agree on the unspent outputs under the view of
/// every live tip.
fn assert_matches_model(t: &mut SozuTable, model: &mut ModelTable, chain: &Chain, case: &str) {
    for tip in chain.live_tips(12) {
        let view = chain.view(tip);
        assert_eq!(
            unspent_summary(t, &view),
            unspent_summary(model, &view),
            "{case}: state differs from the model under the view of tip {tip}"
        );
    }
}

/// Writes and commits up to `blocks` blocks until the storage fails;
/// returns (model at the last commit, model if the failing commit had
/// completed).
fn run_until_failure(
    table: &mut SozuTable,
    rng: &mut Rng,
    chain: &mut Chain,
    mut model: ModelTable,
    blocks: u32,
) -> (ModelTable, Option<ModelTable>) {
    for _ in 0..blocks {
        // Mostly extend, sometimes a short competing branch.
        let parent = if rng.below(6) == 0 {
            chain.parent[chain.best as usize].unwrap_or(0)
        } else {
            chain.best
        };
        let id = chain.add(parent);
        let h = chain.height[id as usize];
        let view = chain.view(id);
        let w = gen_block(rng, &mut model, &view, id, h, 4);
        model.write_block(&w, &*chain, &mut |_| {}).expect("model");
        if table.write_block(&w, &*chain, &mut |_| {}).is_err() {
            model.crash();
            return (model, None);
        }
        // Sometimes an explicit checkpoint with the block still pending: it
        // must neither commit nor lose it.
        if rng.below(8) == 0 && table.checkpoint_now().is_err() {
            model.crash();
            return (model, None);
        }
        let mut attempted = model.clone();
        attempted.commit(tag(id, h)).expect("model");
        if table.commit(tag(id, h)).is_err() {
            model.crash();
            return (model, Some(attempted));
        }
        model = attempted;
    }
    (model, None)
}

/// Each seed fails the storage after a countdown, loses unsynced writes
/// (power loss), reopens and compares with the model — twice in a row on
/// the same table, since recovering from one crash (an interrupted
/// checkpoint, say) leaves state that the next crash must find intact.
#[test]
fn countdown_failures() {
    let rounds: u64 = if std::env::var("KAKEHI_LONG").is_ok() {
        2000
    } else {
        250
    };
    let mut tally = Tally::default();
    for seed in 0..rounds {
        countdown_seed(seed, &mut tally);
    }
    let Tally {
        outcomes,
        in_checkpoint,
        overlapping,
        disk_only,
    } = tally;
    eprintln!(
        "countdown: {} reopened at the last commit, {} at the failing commit, {in_checkpoint} with a checkpoint file left, {overlapping} during a background checkpoint that commits overlapped, {disk_only} during a checkpoint of the disk layers only that commits overlapped",
        outcomes[0], outcomes[1]
    );
    assert!(
        disk_only > 0,
        "no failure hit a checkpoint of the disk layers only with commits going on"
    );
    assert!(outcomes[0] > 0);
    assert!(
        in_checkpoint > 0,
        "no failure hit a checkpoint: the double write went untested"
    );
    assert!(
        overlapping > 0,
        "no failure hit a background checkpoint with commits going on"
    );
}

/// What the countdown crashes hit, over all seeds.
#[derive(Default)]
struct Tally {
    /// Reopened at the last commit, at the failing commit.
    outcomes: [u32; 2],
    /// Crashes that left a checkpoint's double write behind (the failure
    /// hit a checkpoint, or came right after one).
    in_checkpoint: u32,
    /// Crashes during a background checkpoint while commits went on.
    overlapping: u32,
    /// Crashes during a checkpoint of the disk layers only while commits
    /// went on.
    disk_only: u32,
}

/// One seed of [`countdown_failures`]: two I/O-countdown crashes, each
/// reopened and checked against the model, then one more block.
fn countdown_seed(seed: u64, tally: &mut Tally) {
    let storage = MemStorage::new();
    // Odd seeds checkpoint at almost every commit, so failures land
    // inside checkpoints too; one seed in four runs its checkpoints
    // inside the commits (deterministic), the others in the background.
    // Seeds ≡ 2 mod 3 start a checkpoint of the disk layers only past
    // 2 KiB of unflushed disk pages, between journal-bound checkpoints
    // every 48 KiB.
    let disk_only = seed % 3 == 2;
    let cfg = SozuConfig {
        checkpoint_bytes: match (disk_only, seed % 2) {
            (true, _) => 48 << 10,
            (false, 1) => 4 << 10,
            (false, _) => 256 << 10,
        },
        unflushed_bytes: disk_only.then_some(2 << 10),
        background_checkpoints: seed % 4 != 3,
        ..small_config()
    };
    let open = || {
        SozuTable::open_with_storage(Box::new(storage.clone()), cfg.clone())
            .unwrap_or_else(|e| panic!("seed {seed}: open failed: {e}"))
    };
    let mut table = open();
    let mut rng = Rng::new(seed);
    let mut chain = Chain::new();
    let mut model = ModelTable::new();
    for crash in 0..2u64 {
        storage.fail_after(Some((seed + 311 * crash) % 700));
        let (last, attempted) = run_until_failure(&mut table, &mut rng, &mut chain, model, 25);
        drop(table);
        storage.crash(seed ^ (crash << 32));
        if ["sozu.ckpt.0", "sozu.ckpt.1"]
            .iter()
            .any(|f| storage.read_file(f).is_some_and(|f| !f.is_empty()))
        {
            tally.in_checkpoint += 1;
        }
        tally.overlapping += u32::from(overlapped(&storage));
        tally.disk_only += u32::from(in_disk_only(&storage));
        table = open();
        let got = table.committed();
        model = if got == last.committed() {
            tally.outcomes[0] += 1;
            last
        } else {
            match attempted {
                Some(a) if a.committed() == got => {
                    tally.outcomes[1] += 1;
                    a
                }
                _ => panic!(
                    "seed {seed}, crash {crash}: reopened at {got:?}, last commit {:?}",
                    last.committed()
                ),
            }
        };
        assert_matches_model(
            &mut table,
            &mut model,
            &chain,
            &format!("seed {seed}, crash {crash}"),
        );
    }
    // The reopened table keeps working.
    let id = chain.add(chain.best);
    let h = chain.height[id as usize];
    let w = gen_block(&mut rng, &mut model, &chain.view(id), id, h, 3);
    table
        .write_block(&w, &chain, &mut |_| {})
        .expect("write after reopen");
    table.commit(tag(id, h)).expect("commit after reopen");
}

/// Reads a file of the table, through the test's handle or from a
/// directory.
trait Files {
    fn file(&self, name: &str) -> Vec<u8>;
}

impl Files for MemStorage {
    fn file(&self, name: &str) -> Vec<u8> {
        self.read_file(name).unwrap_or_default()
    }
}

impl Files for std::path::PathBuf {
    fn file(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.join(name)).unwrap_or_default()
    }
}

/// Whether the files show a crash during a checkpoint while commits went
/// on (`docs/sozu-format.md`, "Checkpoint"): the header names base b and
/// the next generation's journal already holds commits (the checkpoint of
/// b had not switched its header), or the checkpoint file of b is still
/// there beside commits of b (it had switched, and not finished its home
/// writes).
fn overlapped(files: &dyn Files) -> bool {
    let h = files.file("sozu.header");
    let Some(b) = h
        .get(40..48)
        .map(|g| u64::from_le_bytes(g.try_into().unwrap_or_default()))
    else {
        return false;
    };
    let gen_of = |name: String| kakehi::sozu::journal::record_generation(&files.file(&name));
    let next_commits = gen_of(format!("sozu.journal.{}", (b + 1) % 2)) == Some(b + 1);
    let mid_home = gen_of(format!("sozu.ckpt.{}", b % 2)) == Some(b)
        && gen_of(format!("sozu.journal.{}", b % 2)) == Some(b);
    next_commits || mid_home
}

/// Whether the files show a crash during a checkpoint of the disk layers
/// only while commits went on (`docs/sozu-format.md`, "Checkpoints of the
/// disk layers"): the base's checkpoint file starts with a record of the
/// base generation b tagged with a commit S past the header's last one (a
/// checkpoint that starts a generation tags its records with the header's
/// own), and b's journal holds a commit after S.
fn in_disk_only(files: &dyn Files) -> bool {
    let h = files.file("sozu.header");
    let le = |r: std::ops::Range<usize>| {
        h.get(r)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
    };
    let (Some(b), Some(c)) = (le(40..48), le(48..56)) else {
        return false;
    };
    let Some((g, s)) = journal::record_tag(&files.file(&format!("sozu.ckpt.{}", b % 2))) else {
        return false;
    };
    let j = files.file(&format!("sozu.journal.{}", b % 2));
    let mut pos = 0;
    let mut last = 0;
    while let journal::Parsed::Ok(r, n) = journal::parse(&j[pos..], 4096) {
        if r.generation != b {
            break;
        }
        last = r.seq;
        pos += n;
    }
    g == b && s > c && last > s
}

/// The generation in a table's header file and the name of its
/// checkpoint file (`docs/sozu-format.md`).
fn header_ckpt(storage: &MemStorage) -> Option<String> {
    let h = storage.read_file("sozu.header")?;
    let generation = u64::from_le_bytes(h.get(40..48)?.try_into().ok()?);
    Some(format!("sozu.ckpt.{}", generation % 2))
}

/// A checkpoint interrupted after its header switch (its page files half
/// rewritten) leaves its double write as the only copy of some images; the
/// table recovered from it must survive a second crash anywhere, notably
/// inside the next checkpoint before that one's header switch. Regression
/// test: one checkpoint file, rewritten by the next checkpoint, lost them.
#[test]
fn second_crash_after_an_interrupted_checkpoint() {
    let cfg = SozuConfig {
        checkpoint_bytes: 4 << 10,
        ..small_config()
    };
    second_crashes(&cfg, false);
}

/// [`second_crash_after_an_interrupted_checkpoint`] for a checkpoint of the
/// disk layers only interrupted after its header switch: its file is in the
/// same generation as the next checkpoint of the disk layers would rewrite,
/// so the recovered table must start a new generation at its next
/// checkpoint instead (`docs/sozu-format.md`, "Checkpoints of the disk
/// layers").
#[test]
fn second_crash_after_an_interrupted_disk_only_checkpoint() {
    let cfg = SozuConfig {
        checkpoint_bytes: 48 << 10,
        unflushed_bytes: Some(2 << 10),
        ..small_config()
    };
    second_crashes(&cfg, true);
}

/// Crashes a run at each I/O count in turn until 4 crashes leave a
/// checkpoint file that recovery must apply (with `disk_only`: one of a
/// checkpoint of the disk layers only, its commit named in the header),
/// then crashes each recovered table again at 120 I/O counts.
fn second_crashes(cfg: &SozuConfig, disk_only: bool) {
    let open = |s: &MemStorage| {
        SozuTable::open_with_storage(Box::new(s.clone()), cfg.clone()).expect("open")
    };
    let mut recovered_cases = 0;
    let mut second_crashes = 0;
    for n in 0..800u64 {
        if recovered_cases == 4 {
            break;
        }
        let storage = MemStorage::new();
        let mut table = open(&storage);
        let mut rng = Rng::new(n);
        let mut chain = Chain::new();
        storage.fail_after(Some(n));
        let (last, attempted) =
            run_until_failure(&mut table, &mut rng, &mut chain, ModelTable::new(), 25);
        drop(table);
        storage.crash(n);
        // Only crashes whose recovery must apply the checkpoint file.
        let needs_ckpt = header_ckpt(&storage)
            .and_then(|f| storage.read_file(&f))
            .is_some_and(|f| !f.is_empty());
        let names_disk_only = storage
            .read_file("sozu.header")
            .is_some_and(|h| h.get(100..108).is_some_and(|s| s != [0; 8]));
        if !needs_ckpt || names_disk_only != disk_only {
            continue;
        }
        recovered_cases += 1;
        let files = storage.snapshot();
        let got = open(&storage).committed();
        let model = match attempted {
            Some(a) if a.committed() == got => a,
            _ => last,
        };
        for m in 0..120u64 {
            let s2 = MemStorage::new();
            for (name, data) in &files {
                s2.write_file(name, data.clone());
            }
            let mut t = open(&s2);
            let mut chain2 = chain.clone();
            let mut rng2 = Rng::new(0x5ec0_0000_0000 ^ (n << 16) ^ m);
            s2.fail_after(Some(m));
            let (last2, attempted2) =
                run_until_failure(&mut t, &mut rng2, &mut chain2, model.clone(), 12);
            drop(t);
            s2.crash(m);
            second_crashes += 1;
            let mut t = SozuTable::open_with_storage(Box::new(s2.clone()), cfg.clone())
                .unwrap_or_else(|e| panic!("first crash {n}, second {m}: reopen failed: {e}"));
            let got = t.committed();
            let mut expected = match attempted2 {
                Some(a) if a.committed() == got => a,
                _ => last2,
            };
            assert_eq!(got, expected.committed(), "first crash {n}, second {m}");
            assert_matches_model(
                &mut t,
                &mut expected,
                &chain2,
                &format!("first crash {n}, second {m}"),
            );
        }
    }
    assert!(
        recovered_cases > 0,
        "no first crash left a checkpoint to recover from"
    );
    eprintln!(
        "{recovered_cases} recoveries from a checkpoint file, {second_crashes} second crashes"
    );
}

// ---------------------------------------------------------------- kill -9

const KILL_ENV: &str = "KAKEHI_SOZU_KILL_CHILD";
const OUTS: u32 = 8;

/// A pure, deterministic linear-chain workload: block `h` creates `OUTS`
/// outputs and spends the outputs whose (heavy-tailed) age ends at `h`.
fn kill_block(seed: u64, h: u32) -> BlockWrite {
    let txid = |h: u32, i: u32| {
        let mut r = Rng::new(seed ^ (u64::from(h) << 20) ^ u64::from(i));
        Txid::from_byte_array(r.bytes32())
    };
    // Spend age of output (h, j), or None if never spent.
    let age = |h: u32, j: u32| -> Option<u32> {
        let mut r = Rng::new(seed.wrapping_add(u64::from(h) * 131 + u64::from(j)));
        match r.below(100) {
            0..=4 => Some(0),
            5..=64 => Some(1 + r.below(20) as u32),
            65..=84 => Some(21 + r.below(180) as u32),
            _ => None,
        }
    };
    let block = BlockId(h);
    let mut w = BlockWrite {
        block,
        height: h,
        created: Vec::new(),
        spent: Vec::new(),
    };
    let spender = txid(h, 999);
    let mut rng = Rng::new(seed ^ u64::from(h));
    for j in 0..OUTS {
        let op = OutPoint {
            txid: txid(h, j / 2),
            vout: j % 2,
        };
        w.created.push(NewOutput {
            outpoint: op,
            coin: Coin {
                value: Amount::from_sat(u64::from(h) * 1000 + u64::from(j)),
                script_pubkey: sozu_common::script(&mut rng),
                height: h,
                coinbase: j == 0,
            },
            known_absent: true,
        });
    }
    let mut vin = 0;
    for back in 0..=200u32 {
        let Some(hp) = h.checked_sub(back) else { break };
        if hp == 0 {
            break;
        }
        for j in 0..OUTS {
            if age(hp, j) == Some(back) {
                w.spent.push((
                    OutPoint {
                        txid: txid(hp, j / 2),
                        vout: j % 2,
                    },
                    Consumption {
                        block,
                        txid: spender,
                        vin,
                    },
                ));
                vin += 1;
            }
        }
    }
    w
}

struct Linear(u32);

impl BlockOracle for Linear {
    fn best_height(&self, block: BlockId) -> Option<u32> {
        (block.0 <= self.0).then_some(block.0)
    }
    fn height(&self, block: BlockId) -> Option<u32> {
        Some(block.0)
    }
    fn tip_height(&self) -> u32 {
        self.0
    }
}

struct All;
impl ChainView for All {
    fn contains(&self, _: BlockId) -> bool {
        true
    }
}

fn kill_config() -> SozuConfig {
    SozuConfig {
        // Small: checkpoints start every ~10 commits, and a kill often
        // lands in one while the next commits go on; in between, 8 KiB of
        // unflushed disk pages start checkpoints of the disk layers only.
        checkpoint_bytes: 96 << 10,
        unflushed_bytes: Some(8 << 10),
        layer0_bits: 4,
        ..small_config()
    }
}

/// The child: continues the workload from the committed block, forever.
/// Run only by [`kill_minus_9`], in the processes it kills.
#[test]
#[ignore = "the child process of kill_minus_9, which runs it"]
fn kill_child() {
    let spec = std::env::var(KILL_ENV).expect("run by kill_minus_9 only");
    let (dir, seed) = spec.split_once(',').expect("dir,seed");
    let seed: u64 = seed.parse().expect("seed");
    let mut t = SozuTable::open(std::path::Path::new(dir), kill_config()).expect("child open");
    let mut h = t.committed().map_or(1, |c| c.height + 1);
    loop {
        let w = kill_block(seed, h);
        t.write_block(&w, &Linear(h), &mut |_| {})
            .expect("child write");
        t.commit(tag(h, h)).expect("child commit");
        println!("committed {h}");
        h += 1;
    }
}

#[test]
fn kill_minus_9() {
    let kills: u32 = if std::env::var("KAKEHI_LONG").is_ok() {
        1000
    } else {
        100
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let seed = 42u64;
    let exe = std::env::current_exe().expect("exe");
    let mut model = ModelTable::new();
    let mut model_h = 0u32;
    let mut rng = Rng::new(seed);
    let start = Instant::now();
    let mut last_reported = 0u32;
    let mut overlaps = 0u32;
    let mut disk_only = 0u32;
    for round in 0..kills {
        let mut child = Command::new(&exe)
            .arg(crate::common::test_name(module_path!(), "kill_child"))
            .args([
                "--exact",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(KILL_ENV, format!("{},{seed}", dir.path().display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        std::thread::sleep(Duration::from_millis(30 + rng.below(120)));
        child.kill().expect("kill -9");
        let mut out = String::new();
        let _ = child
            .stdout
            .take()
            .expect("stdout")
            .read_to_string(&mut out);
        let _ = child.wait();
        if out.contains("panicked") {
            panic!("child failed in round {round}: {out}");
        }
        for line in out.lines() {
            if let Some(n) = line.strip_prefix("committed ") {
                last_reported = last_reported.max(n.trim().parse().expect("height"));
            }
        }
        overlaps += u32::from(overlapped(&dir.path().to_path_buf()));
        disk_only += u32::from(in_disk_only(&dir.path().to_path_buf()));
        let mut t = SozuTable::open(dir.path(), kill_config())
            .unwrap_or_else(|e| panic!("round {round}: reopen after kill failed: {e}"));
        let k = t.committed().map_or(0, |c| c.height);
        assert!(
            k >= last_reported,
            "round {round}: block {last_reported} was reported committed, table is at {k}"
        );
        assert!(
            k >= model_h,
            "round {round}: committed height went back from {model_h} to {k}"
        );
        while model_h < k {
            model_h += 1;
            model
                .write_block(&kill_block(seed, model_h), &Linear(model_h), &mut |_| {})
                .expect("model");
        }
        // Compare every entry's unspent state (all blocks are on the chain).
        assert_eq!(
            unspent_summary(&mut t, &All),
            unspent_summary(&mut model, &All),
            "round {round} at block {k}"
        );
    }
    eprintln!(
        "{kills} kills in {:?}, final committed block {model_h}, {overlaps} during a background checkpoint that commits overlapped, {disk_only} during one of the disk layers only",
        start.elapsed()
    );
    assert!(model_h > 0, "the child never committed");
    assert!(
        overlaps > 0,
        "no kill hit a background checkpoint with commits going on"
    );
    assert!(
        disk_only > 0,
        "no kill hit a checkpoint of the disk layers only with commits going on"
    );
}

// ------------------------------------------------- concurrent readers

/// A reader thread looks up outputs that no block ever spends, over and
/// over, while the writer commits 160 more blocks on real files: entries
/// spill to deeper layers and the journal is checkpointed several times
/// meanwhile. Every read must find every output with its coin (a reader
/// that saw a half-moved entry, a page torn by a checkpoint, or the
/// writer's uncommitted state would miss some).
#[test]
fn reader_during_writes_and_checkpoints() {
    let seed = 7u64;
    let last = 180u32;
    let blocks: Vec<BlockWrite> = (1..=last).map(|h| kill_block(seed, h)).collect();
    let watched = never_spent(&blocks, 20);
    assert!(watched.len() > 10, "{}", watched.len());
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = SozuConfig {
        shards: 2,
        ..kill_config()
    };
    let mut t = SozuTable::open(dir.path(), cfg).expect("open");
    let write = |t: &mut SozuTable, w: &BlockWrite| {
        t.write_block(w, &Linear(w.height), &mut |_| {})
            .expect("write");
        t.commit(tag(w.height, w.height)).expect("commit");
    };
    for w in &blocks[..20] {
        write(&mut t, w);
    }
    let reader = t.reader();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let keys: Vec<OutPoint> = watched.iter().map(|(o, _)| *o).collect();
    let n_keys = keys.len();
    let handle = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut rounds = 0u32;
            while !done.load(std::sync::atomic::Ordering::SeqCst) || rounds == 0 {
                let got = reader.get_batch(&keys).expect("reader get_batch");
                for ((op, value), e) in watched.iter().zip(got) {
                    let e = e.unwrap_or_else(|| panic!("round {rounds}: {op} not found"));
                    assert_eq!(e.coin.value, *value, "{op}");
                }
                rounds += 1;
            }
            rounds
        })
    };
    let checkpoints_before = t.counters().checkpoints;
    for w in &blocks[20..] {
        write(&mut t, w);
    }
    let stats = t.counters();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let rounds = handle.join().expect("reader thread");
    assert!(
        stats.checkpoints > checkpoints_before + 1 && stats.spills > 0,
        "the workload must checkpoint and spill: {stats:?}"
    );
    eprintln!(
        "{rounds} reader rounds of {n_keys} keys during {} blocks, {} checkpoints",
        last - 20,
        stats.checkpoints - checkpoints_before
    );
}

// ------------------------------------------------------------ corruption

/// A table with checkpointed pages in several layers and an empty journal
/// (checkpoint at every commit, then one commit without changes).
fn built() -> MemStorage {
    let storage = MemStorage::new();
    let cfg = SozuConfig {
        checkpoint_bytes: 0,
        ..small_config()
    };
    let mut t = SozuTable::open_with_storage(Box::new(storage.clone()), cfg).expect("open");
    let mut chain = Chain::new();
    let mut model = ModelTable::new();
    let mut rng = Rng::new(5);
    for _ in 0..30 {
        let id = chain.add(chain.best);
        let w = gen_block(&mut rng, &mut model, &chain.view(id), id, id, 4);
        model.write_block(&w, &chain, &mut |_| {}).expect("model");
        t.write_block(&w, &chain, &mut |_| {}).expect("write");
        t.commit(tag(id, id)).expect("commit");
    }
    t.commit(tag(99, 99)).expect("empty commit");
    // Checkpoints run in the background and skip a commit while busy: the
    // last one is made sure of.
    t.checkpoint_now().expect("checkpoint");
    let stats = t.stats().expect("stats");
    assert!(stats.layers.len() >= 3, "{stats:?}");
    storage
}

/// A generation's journal ends at its bound: `checkpoint_bytes` when that
/// is less than [`JOURNAL_FLOOR`], else 1/[`JOURNAL_SHARE`] of the table's
/// other files but at least the floor (a small table: the floor, not the
/// 256 MiB of `checkpoint_bytes`). The checkpoint that ends a generation
/// truncates its journal file when it finishes (`docs/sozu-format.md`,
/// "Checkpoint", step 5), and the table reopens at its last commit.
#[test]
fn journal_bound_and_ended_journal_truncated() {
    let storage = MemStorage::new();
    let cfg = SozuConfig {
        checkpoint_bytes: 256 << 20,
        background_checkpoints: false,
        // No checkpoint of the disk layers: the first checkpoint is the
        // journal bound's.
        unflushed_bytes: Some(u64::MAX),
        verify_on_open: false,
        ..SozuConfig::default()
    };
    let mut t = SozuTable::open_with_storage(Box::new(storage.clone()), cfg.clone()).expect("open");
    let mut chain = Chain::new();
    let mut rng = Rng::new(11);
    // Journal bytes appended after each commit.
    let mut appended = Vec::new();
    for _ in 0..1_000 {
        let id = chain.add(chain.best);
        let created = (0..2_000)
            .map(|_| NewOutput {
                outpoint: OutPoint {
                    txid: Txid::from_byte_array(rng.bytes32()),
                    vout: 0,
                },
                coin: Coin {
                    value: Amount::from_sat(1),
                    script_pubkey: sozu_common::script(&mut rng),
                    height: id,
                    coinbase: false,
                },
                known_absent: true,
            })
            .collect();
        let w = BlockWrite {
            block: BlockId(id),
            height: id,
            created,
            spent: Vec::new(),
        };
        t.write_block(&w, &chain, &mut |_| {}).expect("write");
        t.commit(tag(id, id)).expect("commit");
        appended.push(t.counters().journal_bytes);
        if t.counters().checkpoints > 0 {
            break;
        }
    }
    let c = t.counters();
    assert_eq!((c.checkpoints, c.disk_only_checkpoints), (1, 0), "{c:?}");
    assert_eq!(c.journal_bound_bytes, JOURNAL_FLOOR, "{c:?}");
    // The checkpoint ran inside commit n − 1 (before its record), after the
    // generation's journal had reached the floor at commit n − 2, not at
    // n − 3; commit n found it finished.
    let n = appended.len() - 1;
    assert!(n >= 3, "{appended:?}");
    assert!(appended[n - 2] >= JOURNAL_FLOOR, "{appended:?}");
    assert!(appended[n - 3] < JOURNAL_FLOOR, "{appended:?}");
    // The ended generation's file is empty; the current one holds commits
    // n − 1 and n.
    let files: Vec<u64> = ["sozu.journal.0", "sozu.journal.1"]
        .iter()
        .map(|f| storage.read_file(f).map_or(0, |d| d.len() as u64))
        .collect();
    assert!(files.contains(&0), "{files:?}");
    assert_eq!(t.journal_live_bytes(), files.iter().sum::<u64>());
    assert_eq!(t.journal_live_bytes(), appended[n] - appended[n - 2]);
    let committed = t.committed();
    drop(t);
    let t = SozuTable::open_with_storage(Box::new(storage), cfg).expect("reopen");
    assert_eq!(t.committed(), committed);
}

/// After a reopen the disk-layer pages are only in their files: spills
/// into existing children read them, and the counters say so.
#[test]
fn spills_into_children_on_disk_are_counted() {
    let storage = MemStorage::new();
    let cfg = SozuConfig {
        checkpoint_bytes: 0,
        ..small_config()
    };
    let mut t = SozuTable::open_with_storage(Box::new(storage.clone()), cfg.clone()).expect("open");
    let mut chain = Chain::new();
    let mut model = ModelTable::new();
    let mut rng = Rng::new(7);
    let mut blocks = |t: &mut SozuTable, n: usize| {
        for _ in 0..n {
            let id = chain.add(chain.best);
            let w = gen_block(&mut rng, &mut model, &chain.view(id), id, id, 4);
            model.write_block(&w, &chain, &mut |_| {}).expect("model");
            t.write_block(&w, &chain, &mut |_| {}).expect("write");
            t.commit(tag(id, id)).expect("commit");
        }
    };
    blocks(&mut t, 30);
    t.checkpoint_now().expect("checkpoint");
    drop(t);
    let mut t = SozuTable::open_with_storage(Box::new(storage), cfg).expect("reopen");
    blocks(&mut t, 10);
    let c = t.counters();
    assert!(c.spill_file_reads > 0, "{c:?}");
    assert!(c.spill_reads_avoidable <= c.spill_file_reads, "{c:?}");
    assert!(c.disk_page_reads >= c.spill_file_reads, "{c:?}");
}

/// The outputs the first `n` of `blocks` create that none of `blocks`
/// spends, with their values.
fn never_spent(blocks: &[BlockWrite], n: usize) -> Vec<(OutPoint, Amount)> {
    let spent: std::collections::HashSet<OutPoint> = blocks
        .iter()
        .flat_map(|w| w.spent.iter().map(|(o, _)| *o))
        .collect();
    blocks[..n]
        .iter()
        .flat_map(|w| w.created.iter())
        .filter(|n| !spent.contains(&n.outpoint))
        .map(|n| (n.outpoint, n.coin.value))
        .collect()
}

/// A batched lookup announces the disk pages it is about to read
/// (`SozuStats::disk_page_prefetches`, `posix_fadvise(WILLNEED)` on real
/// files) so their reads overlap: only pages it then reads from the files
/// (not those a summary rules out, nor those in memory), and only while its
/// reads wait for the device — once a batch's reads all came from the OS's
/// memory (`preadv2(RWF_NOWAIT)`), the next batch is not announced. It
/// finds every key either way.
#[cfg(target_os = "linux")]
#[test]
fn lookups_announce_the_pages_they_read_unless_cached() {
    let (dir, old) = table_on_disk(11);
    let cfg = kill_config();
    // (pages announced, pages read from the files) by one batch.
    let lookup = |t: &mut SozuTable, old: &[(OutPoint, Amount)]| {
        let before = t.counters();
        let keys: Vec<OutPoint> = old.iter().map(|(o, _)| *o).collect();
        let got = t.get_batch(&keys).expect("get_batch");
        for ((op, value), e) in old.iter().zip(got) {
            assert_eq!(e.map(|e| e.coin.value), Some(*value), "{op}");
        }
        let c = t.counters();
        (
            c.disk_page_prefetches - before.disk_page_prefetches,
            c.disk_page_reads - before.disk_page_reads,
        )
    };
    // Cached: just written, and read again by the open's check.
    let (first, second) = old.split_at(old.len() / 2);
    let mut t = SozuTable::open(dir.path(), cfg.clone()).expect("reopen");
    let (_, reads) = lookup(&mut t, first);
    assert!(reads > 0, "{:?}", t.counters());
    let (announced, reads) = lookup(&mut t, second);
    assert!(reads > 0, "{:?}", t.counters());
    assert_eq!(announced, 0, "read {reads} cached pages");
    drop(t);
    // Dropped from the OS's memory: the reads wait, and are announced.
    let mut t = SozuTable::open(dir.path(), cfg).expect("reopen");
    drop_from_page_cache(dir.path());
    let (announced, reads) = lookup(&mut t, &old);
    assert!(announced > 0, "{:?}", t.counters());
    assert!(announced <= reads, "announced {announced}, read {reads}");
}

/// The concurrent reader announces as the writer does, by handle: a batch
/// after one read wholly from the OS's memory announces nothing; once the
/// files are dropped from the page cache, a read that waits turns the
/// announcements back on for the next batch of the same lookup.
#[cfg(target_os = "linux")]
#[test]
fn concurrent_reads_announce_the_pages_they_read_unless_cached() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let (dir, old) = table_on_disk(12);
    let announced = std::sync::Arc::new(AtomicU64::new(0));
    let fs = FsStorage::new(dir.path()).expect("storage");
    let storage = Counting(Box::new(fs), announced.clone());
    let t = SozuTable::open_with_storage(Box::new(storage), kill_config()).expect("reopen");
    let reader = t.reader();
    // (pages announced) by one batch, every key found.
    let lookup = |keys: &[(OutPoint, Amount)]| {
        let before = announced.load(Ordering::Relaxed);
        let ops: Vec<OutPoint> = keys.iter().map(|(o, _)| *o).collect();
        let got = reader.get_batch(&ops).expect("get_batch");
        for ((op, value), e) in keys.iter().zip(got) {
            assert_eq!(e.map(|e| e.coin.value), Some(*value), "{op}");
        }
        announced.load(Ordering::Relaxed) - before
    };
    let (first, second) = old.split_at(old.len() / 2);
    lookup(first);
    assert_eq!(lookup(second), 0, "announced while the files are cached");
    drop_from_page_cache(dir.path());
    assert!(lookup(&old) > 0, "no announcement once reads waited");
}

/// A table of 120 `kill_block(seed, _)` blocks written, committed and
/// checkpointed in real files (on the project's file system: a tmpfs
/// cannot drop its pages), closed; with its outputs never spent in the
/// first 30 blocks (more than 50).
#[cfg(target_os = "linux")]
fn table_on_disk(seed: u64) -> (tempfile::TempDir, Vec<(OutPoint, Amount)>) {
    let blocks: Vec<BlockWrite> = (1..=120).map(|h| kill_block(seed, h)).collect();
    let old = never_spent(&blocks, 30);
    assert!(old.len() > 50, "{} keys", old.len());
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let mut t = SozuTable::open(dir.path(), kill_config()).expect("open");
    for w in &blocks {
        t.write_block(w, &Linear(w.height), &mut |_| {})
            .expect("write");
        t.commit(tag(w.height, w.height)).expect("commit");
    }
    t.checkpoint_now().expect("checkpoint");
    assert!(t.counters().checkpoint_cpu_nanos > 0, "{:?}", t.counters());
    (dir, old)
}

/// A storage that counts the pages announced to it
/// ([`Storage::prefetch`]), its clones included.
struct Counting(
    Box<dyn Storage>,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
);

impl Storage for Counting {
    fn exists(&mut self, name: &str) -> std::io::Result<bool> {
        self.0.exists(name)
    }
    fn len(&mut self, name: &str) -> std::io::Result<u64> {
        self.0.len(name)
    }
    fn allocated(&mut self, name: &str) -> std::io::Result<u64> {
        self.0.allocated(name)
    }
    fn read_at(&mut self, name: &str, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.0.read_at(name, offset, buf)
    }
    fn prefetch(&mut self, name: &str, offset: u64, len: u64) {
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.0.prefetch(name, offset, len);
    }
    fn read_cached(&mut self, name: &str, offset: u64, buf: &mut [u8]) -> bool {
        self.0.read_cached(name, offset, buf)
    }
    fn write_at(&mut self, name: &str, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.0.write_at(name, offset, data)
    }
    fn set_len(&mut self, name: &str, len: u64) -> std::io::Result<()> {
        self.0.set_len(name, len)
    }
    fn sync(&mut self, name: &str) -> std::io::Result<()> {
        self.0.sync(name)
    }
    fn remove(&mut self, name: &str) -> std::io::Result<()> {
        self.0.remove(name)
    }
    fn rename(&mut self, from: &str, to: &str) -> std::io::Result<()> {
        self.0.rename(from, to)
    }
    fn sync_dir(&mut self) -> std::io::Result<()> {
        self.0.sync_dir()
    }
    fn path_of(&self, name: &str) -> std::path::PathBuf {
        self.0.path_of(name)
    }
    fn try_clone(&self) -> std::io::Result<Box<dyn Storage>> {
        Ok(Box::new(Counting(self.0.try_clone()?, self.1.clone())))
    }
}

/// Asks the kernel to drop the (clean, synced) cached pages of every file
/// in `dir` (`posix_fadvise(DONTNEED)`).
#[cfg(target_os = "linux")]
fn drop_from_page_cache(dir: &std::path::Path) {
    for f in std::fs::read_dir(dir).expect("read_dir") {
        let file = std::fs::File::open(f.expect("entry").path()).expect("open");
        rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed).expect("fadvise");
    }
}

fn open_err(storage: &MemStorage) -> SozuError {
    let before = storage.snapshot();
    let r = SozuTable::open_with_storage(Box::new(storage.clone()), small_config());
    assert_eq!(before, storage.snapshot(), "open wrote to a corrupt table");
    match r {
        Ok(_) => panic!("corruption not detected"),
        Err(e) => e,
    }
}

#[test]
fn intact_table_opens() {
    let s = built();
    let mut t = SozuTable::open_with_storage(Box::new(s), small_config()).expect("open");
    assert_eq!(t.committed(), Some(tag(99, 99)));
    assert!(t.verify().expect("verify") > 0);
}

#[test]
fn flipped_byte_in_pages_is_corrupt() {
    // The second written page of each file (children never written are
    // holes: all zero, never read).
    for file in [
        "s0-layer-00.pages",
        "s0-layer-02.pages",
        "s0-layer-03.pages",
    ] {
        let s = built();
        let mut data = s.read_file(file).expect(file);
        let page = data
            .chunks(4096)
            .enumerate()
            .filter(|(_, p)| p.iter().any(|&b| b != 0))
            .nth(1)
            .map(|(i, _)| i as u64)
            .expect("two written pages");
        let at = (page * 4096 + 200) as usize;
        data[at] ^= 0x04;
        s.write_file(file, data);
        match open_err(&s) {
            SozuError::Corrupt { path, offset, .. } => {
                assert!(path.ends_with(file), "{path:?}");
                assert_eq!(offset, page * 4096);
            }
            e => panic!("{file}: unexpected error {e}"),
        }
    }
}

#[test]
fn truncated_file_is_corrupt() {
    let s = built();
    let mut data = s.read_file("s0-layer-02.pages").expect("layer 2");
    data.truncate(data.len() - 100);
    s.write_file("s0-layer-02.pages", data);
    match open_err(&s) {
        SozuError::Corrupt { path, .. } => assert!(path.ends_with("s0-layer-02.pages")),
        e => panic!("unexpected error {e}"),
    }
}

#[test]
fn wrong_magic_and_version() {
    let s = built();
    let mut h = s.read_file("sozu.header").expect("header");
    h[4] = b'X';
    s.write_file("sozu.header", h.clone());
    assert!(matches!(open_err(&s), SozuError::Corrupt { offset: 4, .. }));
    h[4] = b'S';
    let major = h[12];
    h[12] = 9; // major version 9
    s.write_file("sozu.header", h.clone());
    assert!(matches!(
        open_err(&s),
        SozuError::UnsupportedVersion { major: 9, .. }
    ));
    // Tables of formats 1 to 4 are refused (4: no checkpoints of the disk
    // layers only; 3: journal page deltas, checkpoints inside commits).
    for old in [1, 2, 3, 4] {
        h[12] = old;
        s.write_file("sozu.header", h.clone());
        assert!(matches!(
            open_err(&s),
            SozuError::UnsupportedVersion { major, .. } if major == u16::from(old)
        ));
    }
    h[12] = major;
    h[30] ^= 1; // key byte: checksum no longer matches
    s.write_file("sozu.header", h);
    assert!(matches!(open_err(&s), SozuError::Corrupt { offset: 0, .. }));
}

#[test]
fn damaged_journal_record_before_later_commits_is_corrupt() {
    let storage = MemStorage::new();
    let mut t =
        SozuTable::open_with_storage(Box::new(storage.clone()), small_config()).expect("open");
    let mut chain = Chain::new();
    let mut model = ModelTable::new();
    let mut rng = Rng::new(9);
    for _ in 0..4 {
        let id = chain.add(chain.best);
        let w = gen_block(&mut rng, &mut model, &chain.view(id), id, id, 3);
        model.write_block(&w, &chain, &mut |_| {}).expect("model");
        t.write_block(&w, &chain, &mut |_| {}).expect("write");
        t.commit(tag(id, id)).expect("commit");
    }
    drop(t);
    // A new table's first generation is 1: its journal is sozu.journal.1.
    let mut j = storage.read_file("sozu.journal.1").expect("journal");
    j[100] ^= 0xff; // inside the first record
    storage.write_file("sozu.journal.1", j);
    match open_err(&storage) {
        SozuError::Corrupt { path, offset, .. } => {
            assert!(path.ends_with("sozu.journal.1"));
            assert_eq!(offset, 0);
        }
        e => panic!("unexpected error {e}"),
    }
}

/// The header image `h` with byte `at` set to `value` and its crc32 (bytes
/// 0..4) made right again, so that open's field checks see the change.
fn with_byte_and_checksum(h: &[u8], at: usize, value: u8) -> Vec<u8> {
    let mut h = h.to_vec();
    h[at] = value;
    let crc = crc32fast::hash(&h[4..]);
    h[..4].copy_from_slice(&crc.to_le_bytes());
    h
}

#[test]
fn header_field_out_of_range_is_corrupt() {
    // A header whose checksum is right but whose geometry the page format
    // cannot hold (the child mask has 16 bits, so g ≤ 4; a layer-0 of 2^33
    // buckets) is refused with the typed error, before anything is read.
    for (at, value) in [(21, 5u8), (21, 8), (21, 0), (20, 33)] {
        let s = built();
        let h = s.read_file("sozu.header").expect("header");
        s.write_file("sozu.header", with_byte_and_checksum(&h, at, value));
        match open_err(&s) {
            SozuError::Corrupt { path, offset, .. } => {
                assert!(path.ends_with("sozu.header"), "{path:?}");
                assert_eq!(offset, 0, "byte {at} = {value}");
            }
            e => panic!("byte {at} = {value}: unexpected error {e}"),
        }
    }
}

#[test]
fn any_header_byte_changed_under_a_valid_checksum_never_panics() {
    // Every byte of the header rewritten three ways, the checksum made
    // right so the field checks see it: open either accepts the table
    // (bytes it does not interpret, or values it can take) or refuses it
    // with a typed error having written nothing; it never panics.
    // The journal emptied (as a checkpoint leaves it), so that open takes
    // the geometry from this header alone, not from a journal record's.
    let base = built();
    base.write_file("sozu.journal.0", Vec::new());
    base.write_file("sozu.journal.1", Vec::new());
    let files = base.snapshot();
    let h0 = base.read_file("sozu.header").expect("header");
    let (mut accepted, mut refused) = (0, 0);
    for at in 4..h0.len() {
        for v in [0u8, 0xff, h0[at] ^ 0x01] {
            if v == h0[at] {
                continue;
            }
            let s = MemStorage::new();
            for (name, data) in &files {
                s.write_file(name, data.clone());
            }
            s.write_file("sozu.header", with_byte_and_checksum(&h0, at, v));
            let before = s.snapshot();
            let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                SozuTable::open_with_storage(Box::new(s.clone()), small_config())
                    .and_then(|mut t| t.verify())
            }));
            match opened {
                Err(_) => panic!("open panicked with header byte {at} = {v:#04x}"),
                Ok(Ok(_)) => accepted += 1,
                Ok(Err(_)) => {
                    assert_eq!(
                        before,
                        s.snapshot(),
                        "byte {at} = {v:#04x}: refused, but wrote"
                    );
                    refused += 1;
                }
            }
        }
    }
    assert!(refused > 100, "refused {refused}, accepted {accepted}");
}
