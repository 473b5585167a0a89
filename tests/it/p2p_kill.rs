//! `kill -9` of a syncing node at random moments.
//!
//! Node A (the library) holds `testnet-data/regtest-a/blocks.dat` (bcoin's
//! chain) up to the block before its 12-deep reorg and serves it on a
//! loopback port. Node B is the `kakehi` binary, `run --connect A` on its own
//! datadir; it is killed with SIGKILL at a random moment of its sync (0.3–2.5
//! s after each start), restarted on the same datadir, killed again. Once B
//! has A's tip, A gets the rest of the file (the reorg, then 300 more
//! blocks) while B runs; B is killed at a random moment of following it, and
//! again after restarts: 10 kills in all (`KAKEHI_LONG=1`: 40, 0.1–1.2 s
//! after each start). After every kill B's datadir is opened as its next
//! start would open it (recovery included): the tip it recovered to must
//! have bcoin's filter header for that block (`filters.json`,
//! `stale_filters.json`), the MuHash B keeps must equal a walk of its
//! UTXO table, and B's sealed archive epochs must be a prefix of A's (the
//! same headers, hence the same commitment). Then B runs to A's tip and is
//! stopped with SIGTERM, and its datadir must hold exactly A's state (and
//! know A's old tip as a stale block): the
//! `kakehi dump-utxos` bytes (= bcoin's `utxos.txt`), the UTXO summary, the
//! filter and filter header of every height (= bcoin's `filters.json`), and
//! the archive commitment.
//!
//! The kill moments come from a seed printed by the test; set
//! `KAKEHI_SEED=<n>` to replay a run. Every wait is bounded.

use crate::common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bitcoin::hex::DisplayHex;
use bitcoin::{BlockHash, Network};
use common::child::{free_port, http_tip};
use common::{data, json, muhash_of_table, regtest_a_filter_headers, Rng};
use kakehi::chain::ChainParams;
use kakehi::import::read_file;
use kakehi::node::{open_chainstate, DataDir};
use kakehi::pipeline::Chainstate;
use parking_lot::Mutex;

/// Upper bound of the final sync after the last kill.
const FINAL_SYNC_TIMEOUT: Duration = Duration::from_secs(120);

/// The binary with a clean environment (HOME in a temp dir so no default
/// datadir is touched) and JSON logs.
fn kakehi(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kakehi"));
    // No JSON-RPC server: tests run nodes side by side (its port is fixed).
    c.env("KAKEHI_RPC", "off");
    c.env_clear()
        .env("HOME", home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(["--log-format", "json", "--network", "regtest"]);
    c
}

fn spawn_b(home: &Path, datadir: &Path, a: SocketAddr, http: u16, log: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    kakehi(home)
        .arg("--datadir")
        .arg(datadir)
        .args(["run", "--connect", &a.to_string()])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log file"))
        .stderr(log)
        .spawn()
        .expect("spawn kakehi")
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// A's state, read on the library side.
struct State {
    tip: (u32, bitcoin::BlockHash),
    stats: String,
    utxos: Vec<u8>,
    filters: Vec<(Vec<u8>, String)>,
    /// The archive commitment (the last sealed epoch's header hash).
    commitment: String,
}

fn state(chain: &Mutex<Chainstate>) -> State {
    let mut cs = chain.lock();
    let tip = cs.index().tip();
    let tip = (tip.height, tip.hash);
    let stats = format!("{:?}", cs.snapshot().utxo_stats());
    let mut utxos = Vec::new();
    cs.dump_utxos(&mut utxos).expect("dump utxos");
    let filters = (0..=tip.0)
        .map(|h| {
            let e = cs.index().active_at(h).expect("active height");
            let (f, hd) = cs
                .snapshot()
                .filter(e.id)
                .expect("filter read")
                .expect("filter");
            (f, hd.to_string())
        })
        .collect();
    let commitment = cs.snapshot().archive().commitment().to_lower_hex_string();
    State {
        tip,
        stats,
        utxos,
        filters,
        commitment,
    }
}

/// B's kills: the kill moments, what B reported before each, and the check
/// of B's datadir after each.
struct Kills<'a> {
    rng: Rng,
    long: bool,
    /// B's height just before each kill (`None`: not serving yet).
    heights: Vec<Option<u64>>,
    spawn: &'a dyn Fn() -> Child,
    http: u16,
    log: &'a Path,
    datadir: &'a Path,
    /// bcoin's filter header of every block of regtest-a, by hash.
    filter_headers: HashMap<String, String>,
    /// Node A, whose sealed epochs B's must begin with.
    a: &'a Mutex<Chainstate>,
}

impl Kills<'_> {
    /// Starts B `n` times and kills it (SIGKILL) at a random moment after
    /// each start, checking its datadir after each kill. Stops early once
    /// B is at `stop_height`.
    fn cycles(&mut self, n: usize, stop_height: u64) {
        for _ in 0..n {
            let mut b = (self.spawn)();
            // KAKEHI_LONG: shorter runs, so that 40 kills fit in one sync and
            // more of them land in startup (open, recovery, handshake).
            let at = if self.long {
                self.rng.millis(100, 1_200)
            } else {
                self.rng.millis(300, 2_500)
            };
            std::thread::sleep(at);
            let h = http_tip(self.http).map(|(h, _)| h);
            b.kill().expect("kill -9");
            let status = b.wait().expect("wait");
            assert!(
                status.code().is_none(),
                "B exited by itself before kill {}: {status}\n{}",
                self.heights.len() + 1,
                tail(self.log)
            );
            self.heights.push(h);
            eprintln!(
                "kill {}: after {at:?}, B at height {h:?}",
                self.heights.len()
            );
            self.check_datadir();
            if h == Some(stop_height) {
                return;
            }
        }
    }

    /// Opens B's datadir as its next start would (recovery included) and
    /// checks the state it recovered to: the tip's filter header is bcoin's
    /// for that block, and the MuHash B keeps equals a walk of its UTXO
    /// table (no coin lost or doubled by the kill).
    fn check_datadir(&self) {
        let kill = self.heights.len();
        let datadir = DataDir::open(self.datadir).expect("B's datadir after a kill");
        let mut cs = open_chainstate(ChainParams::new(Network::Regtest), &datadir)
            .unwrap_or_else(|e| panic!("kill {kill}: B's datadir does not open: {e}"));
        let snap = cs.snapshot();
        let tip = snap.index().tip().clone();
        let (_, header) = snap
            .filter(tip.id)
            .expect("filter read")
            .expect("the tip's filter");
        let want = self
            .filter_headers
            .get(&tip.hash.to_string())
            .unwrap_or_else(|| {
                panic!("kill {kill}: B's tip {} is not a regtest-a block", tip.hash)
            });
        assert_eq!(
            &header.to_string(),
            want,
            "kill {kill}: filter header of B's tip at height {}",
            tip.height
        );
        let epochs = snap.archive().epochs().to_vec();
        let a_epochs = self.a.lock().snapshot().archive().epochs().to_vec();
        assert!(
            a_epochs.starts_with(&epochs),
            "kill {kill}: B's {} sealed epochs are not the first of A's {}",
            epochs.len(),
            a_epochs.len()
        );
        eprintln!(
            "kill {kill}: B reopened at height {} with {} of A's {} sealed epochs",
            tip.height,
            epochs.len(),
            a_epochs.len()
        );
        let kept = snap.utxo_stats().muhash;
        drop(snap);
        assert_eq!(
            kept,
            muhash_of_table(&mut cs),
            "kill {kill}: B's kept MuHash at height {} against its UTXO table",
            tip.height
        );
    }
}

/// Waits (bounded) until B's HTTP API reports `tip`.
fn wait_for(b: &mut Child, http: u16, tip: &(u64, String), log: &Path) {
    let started = Instant::now();
    loop {
        if http_tip(http).as_ref() == Some(tip) {
            return;
        }
        if started.elapsed() > FINAL_SYNC_TIMEOUT || b.try_wait().ok().flatten().is_some() {
            let _ = b.kill();
            panic!(
                "B did not reach {tip:?} within {FINAL_SYNC_TIMEOUT:?} (at {:?})\n{}",
                http_tip(http),
                tail(log)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn kill_9_during_sync_resumes_to_the_same_state() {
    let long = std::env::var_os("KAKEHI_LONG").is_some();
    let kills = if long { 40 } else { 10 };
    let rng = Rng::from_env_or_clock("kill moments");

    // A: regtest-a up to the block before the 12-deep reorg, serving on
    // loopback.
    let params = ChainParams::new(Network::Regtest);
    let records = read_file(&data("regtest-a/blocks.dat"), &params).expect("read blocks.dat");
    let chain = json("regtest-a/chain.json");
    let reorg = chain["reorgs"]
        .as_array()
        .expect("reorgs")
        .iter()
        .find(|r| r["depth"].as_u64() == Some(12))
        .expect("the 12-deep reorg");
    let at = reorg["at_order_index"].as_u64().expect("order") as usize;
    let old_tip: BlockHash = reorg["old_tip"]
        .as_str()
        .expect("old tip")
        .parse()
        .expect("hash");
    let dir_a = common::tempdir();
    let datadir_a = DataDir::open(dir_a.path()).expect("datadir");
    let a = Arc::new(Mutex::new(
        open_chainstate(params, &datadir_a).expect("chainstate"),
    ));
    for r in &records[..at] {
        a.lock().submit_block(&r.block).expect("submit");
    }
    let first_tip = {
        let cs = a.lock();
        let t = cs.index().tip();
        (u64::from(t.height), t.hash.to_string())
    };
    assert_eq!(first_tip.1, old_tip.to_string());

    let p2p = common::ListeningP2p::start(a.clone());
    let addr = p2p.addr;

    // B: killed at random moments of its sync.
    let home = common::tempdir();
    let datadir_b = home.path().join("b");
    let log = home.path().join("b.log");
    let http = free_port();
    let started = Instant::now();
    // Phase 1: the sync to A's first tip, half of the kills.
    let spawn = || spawn_b(home.path(), &datadir_b, addr, http, &log);
    let mut k = Kills {
        rng,
        long,
        heights: Vec::new(),
        spawn: &spawn,
        http,
        log: &log,
        datadir: &datadir_b,
        filter_headers: regtest_a_filter_headers(),
        a: &a,
    };
    k.cycles(kills / 2, first_tip.0);
    let mut b = spawn();
    wait_for(&mut b, http, &first_tip, &log);
    eprintln!("B at A's first tip {first_tip:?}; A now takes the 12-deep reorg");
    // Phase 2: A reorganises and grows while B follows; kill B meanwhile.
    let feeder = {
        let a = a.clone();
        let rest: Vec<_> = records[at..].iter().map(|r| r.block.clone()).collect();
        std::thread::spawn(move || {
            for block in &rest {
                a.lock().submit_block(block).expect("submit");
            }
        })
    };
    // Kill it 0–200 ms after its tip first moves off A's old tip: just after
    // B switched branches, while it downloads the rest.
    let moved = Instant::now();
    while http_tip(http).is_some_and(|t| t == first_tip) {
        assert!(
            moved.elapsed() < FINAL_SYNC_TIMEOUT,
            "B does not follow A's reorg\n{}",
            tail(&log)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let after = k.rng.millis(1, 200);
    std::thread::sleep(after);
    let h = http_tip(http);
    b.kill().expect("kill -9");
    b.wait().expect("wait");
    k.heights.push(h.as_ref().map(|t| t.0));
    eprintln!(
        "kill {} (A reorganised): {after:?} after B's tip moved ({:.2} s after the feed began), B at {h:?}",
        k.heights.len(),
        moved.elapsed().as_secs_f64()
    );
    k.check_datadir();
    feeder.join().expect("feeder");
    let want = state(&a);
    assert_eq!(want.tip.1.to_string(), chain["tip_hash"].as_str().unwrap());
    let tip_height = u64::from(want.tip.0);
    let rest = kills.saturating_sub(k.heights.len());
    k.cycles(rest, tip_height);
    let heights = k.heights;
    let killed = heights.len();
    let while_running = heights.iter().filter(|h| h.is_some()).count();
    assert!(
        while_running >= killed / 2,
        "most kills must land while B runs: heights {heights:?}"
    );

    // The last run: to A's tip, then a clean stop.
    let mut b = spawn();
    let sync_started = Instant::now();
    wait_for(&mut b, http, &(tip_height, want.tip.1.to_string()), &log);
    eprintln!(
        "{killed} kills, then the tip {:.1} s after the last restart ({:.1} s in all)",
        sync_started.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    let status = common::child::stop(&mut b, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("B did not stop within 30 s of SIGTERM\n{}", tail(&log)));
    assert!(status.success(), "B's exit: {status}\n{}", tail(&log));
    let _ = p2p.stop();

    // B's datadir, through the binary: the UTXO dump, byte for byte.
    let out = kakehi(home.path())
        .arg("--datadir")
        .arg(&datadir_b)
        .args(["dump-utxos"])
        .output()
        .expect("dump-utxos");
    assert!(
        out.status.success(),
        "dump-utxos: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout == want.utxos, "B's dump-utxos differs from A's");
    assert!(
        out.stdout == std::fs::read(data("regtest-a/utxos.txt")).expect("utxos.txt"),
        "B's dump-utxos differs from bcoin's utxos.txt"
    );

    // ... and through the library: tip, UTXO summary, every filter and
    // filter header (= A's = bcoin's filters.json).
    let b_datadir = DataDir::open(&datadir_b).expect("B's datadir");
    let b_chain = Mutex::new(
        open_chainstate(ChainParams::new(Network::Regtest), &b_datadir).expect("B's chainstate"),
    );
    let got = state(&b_chain);
    {
        let cs = b_chain.lock();
        let id = cs.index().id_of(&old_tip).expect("B knows A's old tip");
        assert!(!cs.index().is_active(id), "A's old tip is stale in B");
    }
    assert_eq!(got.tip, want.tip);
    assert_eq!(got.stats, want.stats);
    assert_eq!(got.commitment, want.commitment, "archive commitment");
    let reference = json("regtest-a/filters.json");
    let reference = reference.as_array().expect("filters.json array");
    assert_eq!(got.filters.len(), reference.len());
    for (h, ((fb, hb), (fa, ha))) in got.filters.iter().zip(&want.filters).enumerate() {
        assert_eq!(
            hb,
            reference[h]["filter_header"].as_str().unwrap(),
            "height {h}"
        );
        assert_eq!((fb, hb), (fa, ha), "height {h}");
    }
}
