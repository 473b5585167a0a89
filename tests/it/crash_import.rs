//! Crash safety of the block pipeline: `kill -9` of `kakehi import` at
//! random moments (at least 20 times; `KAKEHI_LONG=1` for 200), each
//! followed by a restart that resumes; the end state (tip, UTXO dump,
//! MuHash, filters) equals the reference chain's, exactly as an
//! uninterrupted import. regtest-a's blocks are old, so the import makes
//! them durable in groups (`pipeline::GroupLimits`): the kills land inside
//! groups, whose blocks are lost and imported again.
//!
//! A crash between a group's index commit and the UTXO table's commit is
//! reproduced on disk (the table's directory as of the boundary before):
//! start-up replays the whole group; a table two boundaries behind is
//! refused.
//!
//! The address index built for an existing datadir survives SIGKILL too:
//! killed as the build starts and again mid-build, the restart resumes
//! from the last committed batch and ends equal to an index kept from the
//! start.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bitcoin::{BlockHash, Network};
use common::{copy_dir, data, json};
use kakehi::chain::ChainParams;
use kakehi::node::{open_chainstate, DataDir};

/// The height of the last "connected block" line of a log (the last block
/// the killed process connected, durable or not).
fn last_connected(log: &std::path::Path) -> Option<u32> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text.lines().rev().find(|l| l.contains("connected block"))?;
    let at = line.find(" height=")? + " height=".len();
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// The durable tip height of a datadir (opening it runs the crash recovery
/// a restart runs).
fn durable_height(dir: &std::path::Path) -> u32 {
    let datadir = DataDir::open(dir).unwrap();
    let cs = open_chainstate(ChainParams::new(Network::Regtest), &datadir).unwrap();
    cs.index().tip_height()
}

fn kakehi(datadir: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kakehi"));
    // No JSON-RPC server: tests run nodes side by side (its port is fixed).
    c.env("KAKEHI_RPC", "off");
    c.arg("--network")
        .arg("regtest")
        .arg("--datadir")
        .arg(datadir);
    c.env("RUST_LOG", "warn");
    c
}

#[test]
fn kill_9_during_import_then_resume_reaches_the_reference_state() {
    let kills: usize = if std::env::var_os("KAKEHI_LONG").is_some() {
        200
    } else {
        20
    };
    let mut rng = common::Rng::from_env_or_clock("crash test");
    let seed = rng.seed();
    let dir = common::tempdir();
    let blocks = data("regtest-a/blocks.dat");

    // Calibrate: how long does a full import take here, and how long a run
    // that finds every block already stored (start-up, the file scan, exit)?
    let calib = common::tempdir();
    let timed_import = || {
        let t = Instant::now();
        let ok = kakehi(calib.path())
            .arg("import")
            .arg(&blocks)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(ok.success());
        t.elapsed()
    };
    let full = timed_import();
    let noop = timed_import();
    // Each round is killed after the start-up plus a random share of the
    // work averaging 1/kills of it, so the kills spread over the whole
    // import whatever the machine's speed.
    let work_ms = full.saturating_sub(noop).as_millis().max(50) as u64;
    let max_ms = (2 * work_ms / kills as u64).max(10);

    let mut killed_mid_import = 0;
    let mut killed_in_group = 0;
    let log = dir.path().join("import.log");
    for round in 0..kills {
        let mut child = kakehi(dir.path())
            .arg("import")
            .arg(&blocks)
            .env("RUST_LOG", "warn,kakehi::pipeline=info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let wait = noop / 2 + Duration::from_millis(rng.next() % max_ms);
        std::thread::sleep(wait);
        match child.try_wait().unwrap() {
            Some(status) => assert!(
                status.success(),
                "round {round}: import failed: {status}; its log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ),
            None => {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                killed_mid_import += 1;
                // Blocks connected but not durable yet: the kill landed
                // inside a group, and they are gone after the restart.
                if let Some(connected) = last_connected(&log) {
                    if connected > durable_height(dir.path()) {
                        killed_in_group += 1;
                    }
                }
            }
        }
    }
    eprintln!("{killed_mid_import} of {kills} kills landed mid-import, {killed_in_group} inside a group (full import {full:?}, no-op run {noop:?})");
    assert!(
        killed_mid_import >= kills / 2,
        "only {killed_mid_import} of {kills} kills landed mid-import"
    );
    assert!(
        killed_in_group >= 1,
        "no kill landed inside a group of blocks not yet durable"
    );

    // Resume to the end.
    let out = kakehi(dir.path())
        .arg("import")
        .arg(&blocks)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dump = kakehi(dir.path()).arg("dump-utxos").output().unwrap();
    assert!(dump.status.success());
    assert!(
        dump.stdout == std::fs::read(data("regtest-a/utxos.txt")).unwrap(),
        "UTXO dump differs after {killed_mid_import} kills (seed {seed})"
    );

    let datadir = DataDir::open(dir.path()).unwrap();
    let cs = open_chainstate(ChainParams::new(Network::Regtest), &datadir)
        .unwrap()
        .snapshot();
    let chain = json("regtest-a/chain.json");
    assert_eq!(
        cs.index().tip().hash.to_string(),
        chain["tip_hash"].as_str().unwrap()
    );
    let reference = json("regtest-a/utxo.json");
    assert_eq!(
        cs.utxo_stats().txouts,
        reference["txouts"].as_u64().unwrap()
    );
    // MuHash kept through every kill and restart = Core's Python MuHash of
    // utxos.txt (tests/python/muhash_utxos.py; tests/it/muhash.rs checks it live).
    assert_eq!(
        cs.utxo_stats().muhash,
        "7621cdc59b72640b7aa9d97d201aacf13027922448df03c13471c64abafe26d0",
        "MuHash after {killed_mid_import} kills (seed {seed})"
    );
    for f in json("regtest-a/filters.json").as_array().unwrap() {
        let hash: BlockHash = f["hash"].as_str().unwrap().parse().unwrap();
        let (_, header) = cs
            .filter(cs.index().id_of(&hash).unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(
            header.to_string(),
            f["filter_header"].as_str().unwrap(),
            "seed {seed}"
        );
    }
    // The address index after every kill answers as the uninterrupted
    // import's (the calibration datadir).
    let reference = DataDir::open(calib.path()).unwrap();
    let reference = open_chainstate(ChainParams::new(Network::Regtest), &reference)
        .unwrap()
        .snapshot();
    assert!(cs.address_index() && reference.address_index());
    assert!(
        address_answers(&cs) == address_answers(&reference),
        "address index differs after {killed_mid_import} kills (seed {seed})"
    );
}

/// Script hashes of every 7th line of regtest-a's `utxos.txt` (their
/// histories hold spent outputs too).
fn sample_script_hashes() -> Vec<[u8; 32]> {
    use bitcoin::hashes::{sha256, Hash};
    let text = std::fs::read_to_string(data("regtest-a/utxos.txt")).unwrap();
    text.lines()
        .step_by(7)
        .map(|l| {
            let script = l.split_whitespace().nth(2).unwrap();
            let script = bitcoin::ScriptBuf::from_hex(script).unwrap();
            sha256::Hash::hash(script.as_bytes()).to_byte_array()
        })
        .collect()
}

/// What the address routes answer for the sample scripts: totals, UTXOs
/// and the whole history in order.
fn address_answers(cs: &kakehi::snapshot::ChainSnapshot) -> Vec<String> {
    let mut answers = Vec::new();
    for sh in sample_script_hashes() {
        let summary = cs.script_summary(&sh).unwrap();
        let txs = cs.script_txs(&sh, None, usize::MAX).unwrap();
        answers.push(format!("{summary:?} {txs:?}"));
    }
    assert!(answers.iter().any(|a| a.contains("HistoryTx")));
    answers
}

/// The `from` height of a log's "building the address index from the
/// block files" line (where a build starts or resumes), if any.
fn build_from(log: &str) -> Option<u32> {
    let line = log
        .lines()
        .find(|l| l.contains("building the address index from the block files"))?;
    let at = line.find("from=")? + "from=".len();
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Starts `kakehi dump-utxos` on `dir` (whose start builds the address
/// index), reads its log until a line containing `at`, then kills it with
/// SIGKILL; returns the log read. Panics if the process ends first.
fn kill_build_at(dir: &std::path::Path, at: &str) -> String {
    use std::io::BufRead;
    let mut child = kakehi(dir)
        .env("RUST_LOG", "info")
        .arg("dump-utxos")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut log = String::new();
    for line in std::io::BufReader::new(stderr).lines() {
        let line = line.unwrap();
        log.push_str(&line);
        log.push('\n');
        if line.contains(at) {
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
            return log;
        }
    }
    let status = child.wait().unwrap();
    panic!("the build ended ({status}) before {at:?}: {log}");
}

/// A datadir imported with `--no-address-index` has no index (the routes
/// answer 503). The next start without the flag builds it from the block
/// files: killed with SIGKILL as the build starts (nothing committed), then
/// again just after its first batch is committed (mid-way through the
/// second), the restarts resume from the last committed batch, and the
/// index finally answers as one kept from the start.
#[test]
fn address_index_built_from_the_block_files_equals_one_kept_from_the_start() {
    let blocks = data("regtest-a/blocks.dat");
    let (kept, later) = (common::tempdir(), common::tempdir());
    let ok = kakehi(kept.path())
        .arg("import")
        .arg(&blocks)
        .status()
        .unwrap();
    assert!(ok.success());
    let ok = kakehi(later.path())
        .arg("--no-address-index")
        .arg("import")
        .arg(&blocks)
        .status()
        .unwrap();
    assert!(ok.success());
    let open = |dir: &std::path::Path| {
        let datadir = DataDir::open(dir).unwrap();
        open_chainstate(ChainParams::new(Network::Regtest), &datadir)
            .unwrap()
            .snapshot()
    };
    assert!(
        !open(later.path()).address_index(),
        "no index after --no-address-index"
    );
    let log = kill_build_at(
        later.path(),
        "building the address index from the block files",
    );
    assert_eq!(build_from(&log), Some(1), "{log}");
    let log = kill_build_at(later.path(), "building the address index: ");
    assert_eq!(
        build_from(&log),
        Some(1),
        "nothing was committed before: {log}"
    );
    let out = kakehi(later.path())
        .env("RUST_LOG", "info")
        .arg("dump-utxos")
        .output()
        .unwrap();
    assert!(out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    let resumed = build_from(&log).expect("the build resumes");
    assert!(
        resumed > 1,
        "resumed from {resumed}, not after the committed batch: {log}"
    );
    assert!(log.contains("building the address index: 100.0%"), "{log}");
    let (kept, later) = (open(kept.path()), open(later.path()));
    assert!(later.address_index());
    assert!(address_answers(&kept) == address_answers(&later));
}

/// The crash a kill rarely hits: a group's index batch is flushed, the
/// UTXO table's commit is not. On disk that is the index of boundary G2
/// beside the table of boundary G1 (its directory is unchanged between two
/// commits). Start-up replays the whole group; the import then ends in the
/// reference state. A table two boundaries behind is refused.
#[test]
fn crash_between_a_groups_index_and_table_commits_replays_the_group() {
    use kakehi::pipeline::GroupLimits;
    let records = kakehi::import::read_file(
        &data("regtest-a/blocks.dat"),
        &ChainParams::new(Network::Regtest),
    )
    .unwrap();
    let limits = GroupLimits {
        max_blocks: 1_000,
        max_bytes: u64::MAX,
        max_age: Duration::from_secs(3600),
    };
    let open = |dir: &std::path::Path| {
        let datadir = DataDir::open(dir).unwrap();
        let mut cs = open_chainstate(ChainParams::new(Network::Regtest), &datadir).unwrap();
        cs.set_group_limits(limits);
        (datadir, cs)
    };
    let dir = common::tempdir();
    let saved = common::tempdir();
    let utxo = dir.path().join("utxo");
    {
        let (_datadir, mut cs) = open(dir.path());
        // G0: blocks 1-20; G1: 21-60; G2: 61-100 (no stale block before
        // the 238th record of regtest-a).
        for (range, name) in [(0..20, "g0"), (20..60, "g1"), (60..100, "g2")] {
            let before = cs.snapshot().index().tip_height();
            for rec in &records[range.clone()] {
                cs.submit_block(&rec.block).unwrap();
            }
            // One group: nothing was published (made durable) before the flush.
            assert_eq!(cs.snapshot().index().tip_height(), before, "{name}");
            cs.flush().unwrap();
            assert_eq!(cs.snapshot().index().tip_height(), range.end as u32);
            copy_dir(&utxo, &saved.path().join(name));
        }
    }
    // Table two boundaries behind: refused, naming the table.
    copy_dir(&saved.path().join("g0"), &utxo);
    let datadir = DataDir::open(dir.path()).unwrap();
    let err = open_chainstate(ChainParams::new(Network::Regtest), &datadir)
        .err()
        .expect("a table that lost a durable boundary is refused")
        .to_string();
    assert!(
        err.contains("lost commits") && err.contains("utxo"),
        "{err}"
    );
    drop(datadir);

    // Table one boundary behind: the group G2 is replayed.
    copy_dir(&saved.path().join("g1"), &utxo);
    let (_datadir, mut cs) = open(dir.path());
    assert_eq!(cs.index().tip_height(), 100);
    for rec in &records[100..] {
        cs.submit_block(&rec.block).unwrap();
    }
    cs.flush().unwrap();
    let mut dump = Vec::new();
    cs.dump_utxos(&mut dump).unwrap();
    assert!(
        dump == std::fs::read(data("regtest-a/utxos.txt")).unwrap(),
        "UTXO set after the replayed group differs from regtest-a's"
    );
    assert_eq!(
        cs.snapshot().utxo_stats().muhash,
        "7621cdc59b72640b7aa9d97d201aacf13027922448df03c13471c64abafe26d0"
    );
}
