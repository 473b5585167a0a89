//! A crash loop: `kill -9` of `kakehi import` again and again, across an
//! import of regtest-a's first 400 blocks and then 20 forced reorgs of
//! random depth (1–20 blocks: each a file of coinbase-only blocks forking
//! below the tip and overtaking it), every job resumed by the next start.
//!
//! After every kill the datadir is opened (the start-up's recovery runs)
//! and compared with an uninterrupted run that submitted the same blocks
//! in the same order, one durable block at a time: the tip must be a tip
//! that run had, with the same MuHash of the UTXO set and the same filter
//! header, and the archive's sealed epochs must be a prefix of that run's
//! (same headers, hence the same commitment). At the end the tip, MuHash,
//! filter header and archive commitment equal the uninterrupted run's.
//!
//! CI: 100 kills that land in a running process. `KAKEHI_LONG=1`: 1,000.
//! The seed is printed; `KAKEHI_SEED=<n>` replays it.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bitcoin::consensus::deserialize;
use bitcoin::hex::DisplayHex;
use bitcoin::{Amount, Block, BlockHash, Network, ScriptBuf, TxOut};
use common::blockgen::{coinbase, framed, mine, subsidy};
use common::Rng;
use kakehi::archive::{commitment, EpochHeader};
use kakehi::chain::ChainParams;
use kakehi::node::{open_chainstate, DataDir};
use kakehi::pipeline::{Chainstate, GroupLimits, SubmitOutcome};

/// Blocks of regtest-a in the first job.
const PREFIX_BLOCKS: usize = 400;
/// Forced reorgs after it.
const REORGS: u32 = 20;
/// Deepest forced reorg, blocks.
const MAX_DEPTH: u32 = 20;

/// What a datadir holds, as compared after each restart.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Digest {
    muhash: String,
    filter_header: String,
}

fn kakehi(datadir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kakehi"));
    c.arg("--network")
        .arg("regtest")
        .arg("--datadir")
        .arg(datadir)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// The blocks of a blk-framed file, in order.
fn blocks_of(path: &Path) -> Vec<Block> {
    let bytes = std::fs::read(path).unwrap();
    let mut at = 0;
    let mut out = Vec::new();
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        out.push(deserialize(&bytes[at + 8..at + 8 + len]).unwrap());
        at += 8 + len;
    }
    out
}

/// The tip of `cs` with its digest and sealed epochs.
fn observe(cs: &Chainstate) -> (BlockHash, u32, Digest, Vec<EpochHeader>) {
    let snap = cs.snapshot();
    let tip = snap.index().tip();
    let (_, fh) = snap.filter(tip.id).unwrap().unwrap();
    let digest = Digest {
        muhash: snap.utxo_stats().muhash,
        filter_header: fh.to_string(),
    };
    (
        tip.hash,
        tip.height,
        digest,
        snap.archive().epochs().to_vec(),
    )
}

/// The uninterrupted run: every block of every job submitted in order, each
/// durable on its own; the digest of every tip it had, and its epochs.
struct Reference {
    tips: HashMap<BlockHash, Digest>,
    cs: Chainstate,
    _datadir: DataDir,
}

impl Reference {
    fn submit(&mut self, block: &Block) {
        let outcome = self.cs.submit_block(block).unwrap();
        assert!(
            !matches!(outcome, SubmitOutcome::Rejected { .. }),
            "{outcome:?}"
        );
        let (tip, _, digest, _) = observe(&self.cs);
        self.tips.insert(tip, digest);
    }

    /// A fork of `depth` blocks below the tip that overtakes it by one
    /// block, written to `path` and submitted.
    fn fork(&mut self, depth: u32, tag: u32, path: &Path) {
        let snap = self.cs.snapshot();
        let index = snap.index();
        let base = index.active_at(index.tip_height() - depth).unwrap();
        let (mut prev, mut height) = ((base.hash, base.header.time), base.height);
        let mut file = Vec::new();
        let mut blocks = Vec::new();
        for _ in 0..=depth {
            height += 1;
            let out = TxOut {
                value: Amount::from_sat(subsidy(height)),
                script_pubkey: ScriptBuf::from_bytes(vec![0x51]),
            };
            // mine() stamps prev time + 600; one second later keeps every
            // fork well inside the 2-hour future limit.
            let block = mine(
                (prev.0, prev.1 - 599),
                coinbase(height, tag, vec![out]),
                vec![],
            );
            prev = (block.block_hash(), block.header.time);
            file.extend_from_slice(&framed(&block));
            blocks.push(block);
        }
        std::fs::write(path, file).unwrap();
        drop(snap);
        for b in &blocks {
            self.submit(b);
        }
        assert_eq!(self.cs.index().tip().hash, prev.0, "fork {tag} did not win");
    }
}

/// Opens `dir` (running the start-up recovery) and checks it against the
/// reference; returns the tip height.
fn check_restart(dir: &Path, reference: &Reference, all: &[EpochHeader], what: &str) -> u32 {
    let datadir = DataDir::open(dir).unwrap();
    let cs = open_chainstate(ChainParams::new(Network::Regtest), &datadir)
        .unwrap_or_else(|e| panic!("{what}: the restart failed: {e}"));
    let (tip, height, digest, epochs) = observe(&cs);
    if height > 0 {
        let want = reference
            .tips
            .get(&tip)
            .unwrap_or_else(|| panic!("{what}: tip {tip} at {height} was never the reference's"));
        assert_eq!(&digest, want, "{what}: tip {tip} at {height}");
    }
    assert!(
        epochs.len() <= all.len() && epochs[..] == all[..epochs.len()],
        "{what}: sealed epochs differ ({} of {})",
        epochs.len(),
        all.len()
    );
    assert_eq!(commitment(&epochs), commitment(&all[..epochs.len()]));
    height
}

#[test]
fn kill_9_loop_across_import_and_reorgs_matches_an_uninterrupted_run() {
    let kills: u32 = if std::env::var_os("KAKEHI_LONG").is_some() {
        1_000
    } else {
        100
    };
    let mut rng = Rng::from_env_or_clock("crash loop");
    let seed = rng.0;
    let scratch = common::tempdir();
    let mut jobs: Vec<PathBuf> = vec![common::regtest_a_prefix(scratch.path(), PREFIX_BLOCKS)];

    // The uninterrupted run, which also makes the fork files.
    let ref_dir = common::tempdir();
    let datadir = DataDir::open(ref_dir.path()).unwrap();
    let mut cs = open_chainstate(ChainParams::new(Network::Regtest), &datadir).unwrap();
    cs.set_group_limits(GroupLimits::PER_BLOCK);
    let mut reference = Reference {
        tips: HashMap::new(),
        cs,
        _datadir: datadir,
    };
    for b in blocks_of(&jobs[0]) {
        reference.submit(&b);
    }
    for k in 0..REORGS {
        let depth = 1 + (rng.next() % u64::from(MAX_DEPTH)) as u32;
        let path = scratch.path().join(format!("fork{k}.dat"));
        reference.fork(depth, 1_000 + k, &path);
        jobs.push(path);
    }
    reference.cs.finish_seals().unwrap();
    let (end_tip, _, end_digest, all) = observe(&reference.cs);
    assert!(all.len() >= 2, "only {} epochs sealed", all.len());

    // Calibrate: each job's uninterrupted run by the binary, and a run that
    // finds every block stored (start-up and exit).
    let calib = common::tempdir();
    let timed = |job: &Path| {
        let t = Instant::now();
        let ok = kakehi(calib.path())
            .arg("import")
            .arg(job)
            .status()
            .unwrap();
        assert!(ok.success(), "uninterrupted import of {}", job.display());
        t.elapsed()
    };
    // The fork jobs are alike (1–21 small blocks): the first one's time
    // stands for all.
    let job_time: Vec<Duration> = jobs[..2].iter().map(|j| timed(j)).collect();

    // The loop: each job killed up to its share of the kills, at a random
    // moment of its uninterrupted run's time (start-up included), then let
    // finish; after every kill, the restart is checked.
    let dir = common::tempdir();
    let share = kills.div_ceil(jobs.len() as u32);
    let (mut landed, mut finished_early) = (0u32, 0u32);
    for (j, job) in jobs.iter().enumerate() {
        // Capped, so a calibration slowed by a busy machine cannot make
        // the 100 waits long (a kill past the cap still lands mid-run).
        let cap = if j == 0 { 3_000 } else { 1_000 };
        let span = (job_time[j.min(1)].as_millis() as u64).clamp(20, cap);
        let mut job_kills = 0;
        while job_kills < share && landed < kills {
            let mut child = kakehi(dir.path()).arg("import").arg(job).spawn().unwrap();
            let wait = Duration::from_millis(rng.next() % span);
            std::thread::sleep(wait);
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "job {j} failed: {status} (seed {seed})");
                finished_early += 1;
                continue;
            }
            child.kill().unwrap();
            child.wait().unwrap();
            landed += 1;
            job_kills += 1;
            let what = format!("kill {landed} (job {j}, after {wait:?}, seed {seed})");
            check_restart(dir.path(), &reference, &all, &what);
        }
        let ok = kakehi(dir.path()).arg("import").arg(job).status().unwrap();
        assert!(ok.success(), "job {j} after its kills (seed {seed})");
    }
    eprintln!(
        "{landed} kills landed in a running import ({finished_early} runs finished before their kill), {} jobs, {} epochs",
        jobs.len(),
        all.len()
    );
    assert_eq!(landed, kills, "seed {seed}");

    let datadir = DataDir::open(dir.path()).unwrap();
    let mut cs = open_chainstate(ChainParams::new(Network::Regtest), &datadir).unwrap();
    cs.finish_seals().unwrap();
    let (tip, _, digest, epochs) = observe(&cs);
    assert_eq!((tip, &digest), (end_tip, &end_digest), "seed {seed}");
    assert_eq!(
        commitment(&epochs).to_lower_hex_string(),
        commitment(&all).to_lower_hex_string(),
        "seed {seed}"
    );
}
