//! A crash loop: `kill -9` of the `kakehi` binary again and again, across
//! an import of regtest-a's first 250 blocks (`kakehi import`), a P2P sync
//! of the next 347 blocks of its best chain (`kakehi run --connect A`, A a
//! node of this test serving them on loopback), and then 20 forced reorgs
//! of random depth (1–20 blocks: each a chain of coinbase-only blocks
//! forking below the tip and overtaking it), delivered alternately by
//! import and over P2P; every job resumed by the next start.
//!
//! After every kill the datadir is opened (the start-up's recovery runs)
//! and compared with an uninterrupted run that submitted the same blocks
//! in the same order, one durable block at a time: the tip must be a tip
//! that run had, with the same MuHash of the UTXO set and the same filter
//! header, and the archive's sealed epochs must be a prefix of that run's
//! (same headers, hence the same commitment). At the end the tip, MuHash,
//! filter header and archive commitment equal the uninterrupted run's.
//!
//! CI: 100 kills that land in a running process before its job is done,
//! each at a random moment of the job's uninterrupted time (start-up
//! included): a quarter planned for the import, a quarter for the P2P
//! sync, half for the reorgs (half of those over P2P); a job that a run
//! finishes before its kill hands its remaining kills to the next job, so
//! the counts by kind are printed. `KAKEHI_LONG=1`: 1,000. The seed is
//! printed; `KAKEHI_SEED=<n>` replays it.

use crate::common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bitcoin::hex::DisplayHex;
use bitcoin::{Amount, Block, BlockHash, Network, ScriptBuf, TxOut};
use common::blockgen::{coinbase, framed, mine, subsidy};
use common::child::{free_port, http_tip, stop};
use common::{data, json, ListeningP2p, Rng};
use kakehi::archive::{commitment, EpochHeader};
use kakehi::chain::ChainParams;
use kakehi::import::read_file;
use kakehi::node::{open_chainstate, DataDir};
use kakehi::pipeline::{Chainstate, GroupLimits, SubmitOutcome};
use parking_lot::Mutex;

/// Blocks of regtest-a (file order) in the import job.
const IMPORT_BLOCKS: usize = 250;
/// End (file order, exclusive) of the P2P sync job, which takes the best
/// chain's blocks of regtest-a's records `IMPORT_BLOCKS..SYNC_END`.
const SYNC_END: usize = 600;
/// Forced reorgs after it.
const REORGS: u32 = 20;
/// Deepest forced reorg, blocks.
const MAX_DEPTH: u32 = 20;
/// Upper bound of one uninterrupted job.
const JOB_TIMEOUT: Duration = Duration::from_secs(120);

/// What a datadir holds, as compared after each restart.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Digest {
    muhash: String,
    filter_header: String,
}

/// How a job's blocks reach the node under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// `kakehi import FILE`, which exits when done.
    Import,
    /// `kakehi run --connect A`, A a node of this test holding the job's
    /// blocks; done when the node's HTTP API reports A's tip.
    P2p,
}

/// One job of the loop: blocks, in order, and how they are delivered.
struct Job {
    blocks: Vec<Block>,
    /// The blocks, blk-framed (what `kakehi import` reads).
    path: PathBuf,
    delivery: Delivery,
    /// What the kills of this job are counted as.
    kind: &'static str,
}

impl Job {
    fn new(blocks: Vec<Block>, path: PathBuf, delivery: Delivery, kind: &'static str) -> Self {
        let file: Vec<u8> = blocks.iter().flat_map(framed).collect();
        std::fs::write(&path, file).unwrap();
        Job {
            blocks,
            path,
            delivery,
            kind,
        }
    }
}

fn kakehi(datadir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kakehi"));
    // No JSON-RPC server: tests run nodes side by side (its port is fixed).
    c.env("KAKEHI_RPC", "off");
    c.arg("--network")
        .arg("regtest")
        .arg("--datadir")
        .arg(datadir)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
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
    /// block, submitted; its blocks.
    fn fork(&mut self, depth: u32, tag: u32) -> Vec<Block> {
        let snap = self.cs.snapshot();
        let index = snap.index();
        let base = index.active_at(index.tip_height() - depth).unwrap();
        let (mut prev, mut height) = ((base.hash, base.header.time), base.height);
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
            blocks.push(block);
        }
        drop(snap);
        for b in &blocks {
            self.submit(b);
        }
        assert_eq!(self.cs.index().tip().hash, prev.0, "fork {tag} did not win");
        blocks
    }
}

/// regtest-a's first two jobs: the import of its first records (stale
/// blocks and a reorg included), then its best chain's blocks up to
/// `SYNC_END` for the P2P sync. A P2P peer is sent the best chain only, so
/// that job holds no stale block: every block it delivers is a tip the
/// reference had.
fn regtest_a_jobs(dir: &Path) -> [Job; 2] {
    let records = read_file(
        &data("regtest-a/blocks.dat"),
        &ChainParams::new(Network::Regtest),
    )
    .unwrap();
    let chain = json("regtest-a/chain.json");
    let on_best = |i: usize| chain["blocks"][i]["on_best_chain"].as_bool().unwrap();
    // Both jobs end on the final best chain, so the best chain's blocks of
    // the second are exactly its node's active chain when it ends.
    assert!(on_best(IMPORT_BLOCKS - 1) && on_best(SYNC_END - 1));
    let import: Vec<Block> = records[..IMPORT_BLOCKS]
        .iter()
        .map(|r| r.block.clone())
        .collect();
    let sync: Vec<Block> = (IMPORT_BLOCKS..SYNC_END)
        .filter(|&i| on_best(i))
        .map(|i| records[i].block.clone())
        .collect();
    let mut prev = import.last().unwrap().block_hash();
    for b in &sync {
        assert_eq!(b.header.prev_blockhash, prev, "the sync job is one chain");
        prev = b.block_hash();
    }
    [
        Job::new(
            import,
            dir.join("import.dat"),
            Delivery::Import,
            "the import",
        ),
        Job::new(sync, dir.join("sync.dat"), Delivery::P2p, "the P2P sync"),
    ]
}

/// Node A: a chain state fed each job's blocks before the job runs,
/// serving them on loopback.
struct Server {
    chain: Arc<Mutex<Chainstate>>,
    p2p: ListeningP2p,
    _datadir: DataDir,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Self {
        let dir = common::tempdir();
        let datadir = DataDir::open(dir.path()).unwrap();
        let cs = open_chainstate(ChainParams::new(Network::Regtest), &datadir).unwrap();
        let chain = Arc::new(Mutex::new(cs));
        let p2p = ListeningP2p::start(chain.clone());
        Server {
            chain,
            p2p,
            _datadir: datadir,
            _dir: dir,
        }
    }

    /// Submits `job`'s blocks; the tip after them, as the node under test
    /// reports it over HTTP.
    fn feed(&self, job: &Job) -> (u64, String) {
        let mut cs = self.chain.lock();
        for b in &job.blocks {
            let outcome = cs.submit_block(b).unwrap();
            assert!(
                !matches!(outcome, SubmitOutcome::Rejected { .. }),
                "{outcome:?}"
            );
        }
        let tip = cs.index().tip();
        (u64::from(tip.height), tip.hash.to_string())
    }
}

/// The node under test: the binary on one datadir, given each job in the
/// job's own way.
struct Runner {
    dir: PathBuf,
    server: SocketAddr,
    http: u16,
}

impl Runner {
    fn new(dir: &Path, server: &Server) -> Self {
        Runner {
            dir: dir.to_owned(),
            server: server.p2p.addr,
            http: free_port(),
        }
    }

    fn spawn(&self, job: &Job) -> Child {
        let mut c = kakehi(&self.dir);
        match job.delivery {
            Delivery::Import => c.arg("import").arg(&job.path),
            Delivery::P2p => c
                .args(["run", "--connect", &self.server.to_string()])
                .args(["--http", &format!("127.0.0.1:{}", self.http)]),
        };
        c.spawn().unwrap()
    }

    /// Whether this start has done `job` (whose end is `target`): the
    /// import exited (it must succeed), or the node reports the server's
    /// tip (it must still run).
    fn done(&self, child: &mut Child, job: &Job, target: &(u64, String)) -> bool {
        let exited = child.try_wait().unwrap();
        match job.delivery {
            Delivery::Import => exited.is_some_and(|s| {
                assert!(s.success(), "{} failed: {s}", job.kind);
                true
            }),
            Delivery::P2p => {
                assert!(exited.is_none(), "the node exited by itself: {exited:?}");
                http_tip(self.http).as_ref() == Some(target)
            }
        }
    }

    /// Runs `job` to its end without a kill (a P2P run is then stopped by
    /// SIGTERM); the time it took to reach the end.
    fn finish(&self, job: &Job, target: &(u64, String)) -> Duration {
        let started = Instant::now();
        let mut child = self.spawn(job);
        while !self.done(&mut child, job, target) {
            assert!(
                started.elapsed() < JOB_TIMEOUT,
                "{} did not reach {target:?} within {JOB_TIMEOUT:?}",
                job.kind
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let took = started.elapsed();
        if job.delivery == Delivery::P2p {
            let status = stop(&mut child, Duration::from_secs(30));
            assert!(
                status.is_some_and(|s| s.success()),
                "{}: the node's exit on SIGTERM: {status:?}",
                job.kind
            );
        }
        took
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

/// The kills each job takes: a quarter of `kills` in each of the first two
/// jobs, the rest spread evenly over the forks (the earlier ones one more).
fn quotas(kills: u32, jobs: usize) -> Vec<u32> {
    let first = kills / 4;
    let forks = (jobs - 2) as u32;
    let rest = kills - 2 * first;
    let mut q = vec![first, first];
    q.extend((0..forks).map(|k| rest / forks + u32::from(k < rest % forks)));
    q
}

#[test]
fn kill_9_loop_across_import_p2p_sync_and_reorgs_matches_an_uninterrupted_run() {
    let kills: u32 = if std::env::var_os("KAKEHI_LONG").is_some() {
        1_000
    } else {
        100
    };
    let started = Instant::now();
    let mut rng = Rng::from_env_or_clock("crash loop");
    let seed = rng.seed();
    let scratch = common::tempdir();
    let mut jobs: Vec<Job> = regtest_a_jobs(scratch.path()).into();

    // The uninterrupted run, which also makes the forks.
    let ref_dir = common::tempdir();
    let datadir = DataDir::open(ref_dir.path()).unwrap();
    let mut cs = open_chainstate(ChainParams::new(Network::Regtest), &datadir).unwrap();
    cs.set_group_limits(GroupLimits::PER_BLOCK);
    let mut reference = Reference {
        tips: HashMap::new(),
        cs,
        _datadir: datadir,
    };
    for job in &jobs {
        for b in &job.blocks {
            reference.submit(b);
        }
    }
    for k in 0..REORGS {
        let depth = 1 + (rng.next() % u64::from(MAX_DEPTH)) as u32;
        let blocks = reference.fork(depth, 1_000 + k);
        let path = scratch.path().join(format!("fork{k}.dat"));
        jobs.push(if k % 2 == 0 {
            Job::new(blocks, path, Delivery::Import, "reorgs by import")
        } else {
            Job::new(blocks, path, Delivery::P2p, "reorgs over P2P")
        });
    }
    reference.cs.finish_seals().unwrap();
    let (end_tip, _, end_digest, all) = observe(&reference.cs);
    assert!(all.len() >= 2, "only {} epochs sealed", all.len());

    // Calibrate: the first four jobs (one of each kind) run uninterrupted,
    // each delivered its own way; the forks of a kind are alike (1–21
    // small blocks), so the first one's time stands for all.
    let calib_dir = common::tempdir();
    let calib_server = Server::start();
    let calib = Runner::new(calib_dir.path(), &calib_server);
    let job_time: Vec<Duration> = jobs[..4]
        .iter()
        .map(|job| calib.finish(job, &calib_server.feed(job)))
        .collect();
    eprintln!(
        "uninterrupted: {job_time:?} ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    drop(calib_server);

    // The loop: each job killed up to its quota at a random moment of its
    // uninterrupted run's time (start-up included), then let finish. Once
    // a run has finished the job before its kill, the job's later kills
    // land in restarts of a finished job (start-up, recovery, the P2P
    // handshake), each within the shortest time a finishing run was seen
    // to take. After every kill, the restart is checked.
    let dir = common::tempdir();
    let server = Server::start();
    let node = Runner::new(dir.path(), &server);
    let quota = quotas(kills, jobs.len());
    let (mut landed, mut finished_early, mut p2p_serving) = (0u32, 0u32, 0u32);
    // Per kind: kills before the job was first finished, and after.
    let mut by_kind: Vec<(&str, u32, u32)> = Vec::new();
    for (j, job) in jobs.iter().enumerate() {
        let target = server.feed(job);
        // Capped, so a calibration slowed by a busy machine cannot make
        // the waits long (a kill past the cap still lands mid-run).
        let cap = if j < 2 { 3_000 } else { 1_000 };
        let calibrated = job_time[if j < 4 { j } else { 2 + j % 2 }];
        let mut span = (calibrated.as_millis() as u64).clamp(20, cap);
        let (mut before, mut after, mut finished) = (0, 0, false);
        while before + after < quota[j] {
            let mut child = node.spawn(job);
            let wait = Duration::from_millis(rng.next() % span);
            std::thread::sleep(wait);
            if node.done(&mut child, job, &target) {
                finished_early += 1;
                finished = true;
                span = span.min((wait.as_millis() as u64).max(20));
                let _ = child.kill();
                child.wait().unwrap();
                continue;
            }
            // A P2P node that already answers HTTP is killed mid-sync, not
            // in its start-up.
            let serving = job.delivery == Delivery::P2p && http_tip(node.http).is_some();
            child.kill().unwrap();
            child.wait().unwrap();
            landed += 1;
            p2p_serving += u32::from(serving);
            if finished {
                after += 1;
            } else {
                before += 1;
            }
            let what = format!(
                "kill {landed} (job {j}, {}, after {wait:?}, seed {seed})",
                job.kind
            );
            check_restart(dir.path(), &reference, &all, &what);
        }
        match by_kind.iter_mut().find(|(k, _, _)| *k == job.kind) {
            Some((_, b, a)) => (*b, *a) = (*b + before, *a + after),
            None => by_kind.push((job.kind, before, after)),
        }
        node.finish(job, &target);
    }
    eprintln!(
        "{landed} kills landed in a running process (by kind: before the job was first finished, after: {by_kind:?}; {p2p_serving} of the P2P ones with the node serving HTTP, the others in its start-up; {finished_early} runs finished before their kill), {} jobs, {} epochs, {:.1} s",
        jobs.len(),
        all.len(),
        started.elapsed().as_secs_f64()
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
