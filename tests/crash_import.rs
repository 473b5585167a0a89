//! Crash safety of the block pipeline: `kill -9` of `kakehi import` at
//! random moments (at least 20 times; `KAKEHI_LONG=1` for 200), each
//! followed by a restart that resumes; the end state (tip, UTXO dump,
//! MuHash, filters) equals the reference chain's, exactly as an
//! uninterrupted import.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bitcoin::{BlockHash, Network};
use common::{data, json};
use kakehi::chain::ChainParams;
use kakehi::node::{open_chainstate, DataDir};

fn kakehi(datadir: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kakehi"));
    c.arg("--network")
        .arg("regtest")
        .arg("--datadir")
        .arg(datadir);
    c.env("RUST_LOG", "warn");
    c
}

/// A small deterministic PRNG (xorshift64*), so a failing run can be replayed
/// from the seed it prints.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn kill_9_during_import_then_resume_reaches_the_reference_state() {
    let kills: usize = if std::env::var_os("KAKEHI_LONG").is_some() {
        200
    } else {
        20
    };
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("crash test seed {seed}");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let blocks = data("regtest-a/blocks.dat");

    // Calibrate: how long does a full import take here, and how long a run
    // that finds every block already stored (start-up, the file scan, exit)?
    let calib = tempfile::tempdir().unwrap();
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
    drop(calib);
    // Each round is killed after the start-up plus a random share of the
    // work averaging 1/kills of it, so the kills spread over the whole
    // import whatever the machine's speed.
    let work_ms = full.saturating_sub(noop).as_millis().max(50) as u64;
    let max_ms = (2 * work_ms / kills as u64).max(10);

    let mut killed_mid_import = 0;
    for round in 0..kills {
        let mut child = kakehi(dir.path())
            .arg("import")
            .arg(&blocks)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let wait = noop / 2 + Duration::from_millis(rng.next() % max_ms);
        std::thread::sleep(wait);
        match child.try_wait().unwrap() {
            Some(status) => assert!(status.success(), "round {round}: import failed: {status}"),
            None => {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                killed_mid_import += 1;
            }
        }
    }
    eprintln!("{killed_mid_import} of {kills} kills landed mid-import (full import {full:?}, no-op run {noop:?})");
    assert!(
        killed_mid_import >= kills / 2,
        "only {killed_mid_import} of {kills} kills landed mid-import"
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
    // utxos.txt (tests/python/muhash_utxos.py; tests/muhash.rs checks it live).
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
}
