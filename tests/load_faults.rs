//! The `kakehi` binary under load and faults: a low open-files limit with
//! a client holding idle HTTP connections.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bitcoin::Network;
use common::child::{free_port, http_json, http_tip, stop};
use common::data;
use kakehi::chain::ChainParams;
use kakehi::import::read_file;
use kakehi::node::{open_chainstate, DataDir};
use parking_lot::Mutex;

/// The binary with a clean environment (HOME in a temp dir so no default
/// datadir is touched), JSON logs, regtest, under `ulimit -n fds` (soft
/// and hard: the node cannot raise it) when given.
fn kakehi(home: &Path, fds: Option<u32>) -> Command {
    let mut c = match fds {
        Some(n) => {
            let mut c = Command::new("bash");
            c.arg("-c")
                .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                .arg(env!("CARGO_BIN_EXE_kakehi"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_kakehi")),
    };
    c.env_clear()
        .env("HOME", home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(["--log-format", "json", "--network", "regtest"]);
    c
}

/// The last lines of a log file.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Keeps `n` idle connections open to `addr` (none sends a byte; those
/// the server closes are opened again) until `done`.
fn hold_idle_connections(addr: SocketAddr, n: usize, done: Arc<AtomicBool>) {
    let mut held: Vec<TcpStream> = Vec::new();
    while !done.load(Ordering::SeqCst) {
        held.retain(|s| {
            let mut b = [0u8; 1];
            s.set_nonblocking(true).is_ok()
                && matches!(s.peek(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        });
        while held.len() < n {
            match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                Ok(s) => held.push(s),
                Err(_) => break,
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Node B runs `ulimit -n 256` with a peer, A; a client holds 400 idle
/// connections to B's HTTP port (more than B's whole limit), and only then
/// does A get 300 more blocks. B must sync them (headers and blocks
/// stored, the first `open` of its header file among them) while the
/// connections are held, must not stop on a "storage failure", logs its
/// descriptor budget, and answers `/health` once the connections go.
#[test]
fn idle_http_connections_do_not_starve_the_stores() {
    const FIRST: usize = 100;
    const ALL: usize = 400;
    let params = ChainParams::new(Network::Regtest);
    let records = read_file(&data("regtest-a/blocks.dat"), &params).expect("read blocks.dat");

    // A: the first FIRST blocks of regtest-a, serving on loopback.
    let dir_a = common::tempdir();
    let datadir_a = DataDir::open(dir_a.path()).expect("datadir");
    let a = Arc::new(Mutex::new(
        open_chainstate(params, &datadir_a).expect("chainstate"),
    ));
    for r in &records[..FIRST] {
        a.lock().submit_block(&r.block).expect("submit");
    }
    let p2p = common::ListeningP2p::start(a.clone());

    // B: the same blocks imported, then run with A as its only peer.
    let home = common::tempdir();
    let datadir_b = home.path().join("b");
    let prefix = common::regtest_a_prefix(home.path(), FIRST);
    let out = kakehi(home.path(), None)
        .arg("--datadir")
        .arg(&datadir_b)
        .arg("import")
        .arg(&prefix)
        .output()
        .expect("import");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = home.path().join("b.log");
    let log_file = std::fs::File::create(&log).expect("log file");
    let http = free_port();
    let mut b: Child = kakehi(home.path(), Some(256))
        .arg("--datadir")
        .arg(&datadir_b)
        .args(["run", "--connect", &p2p.addr.to_string()])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().expect("log file"))
        .stderr(log_file)
        .spawn()
        .expect("spawn kakehi");
    let started = Instant::now();
    while http_json(http, "/health").is_none() || p2p.handle.peer_count() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30) && b.try_wait().expect("wait").is_none(),
            "B did not start and connect to A\n{}",
            tail(&log)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("file descriptors: limit 256"),
        "B logs its descriptor budget\n{}",
        tail(&log)
    );

    // The flood, then A's new blocks while it lasts.
    let done = Arc::new(AtomicBool::new(false));
    let flood = {
        let done = done.clone();
        let addr = SocketAddr::from(([127, 0, 0, 1], http));
        std::thread::spawn(move || hold_idle_connections(addr, 400, done))
    };
    std::thread::sleep(Duration::from_secs(2));
    for r in &records[FIRST..ALL] {
        a.lock().submit_block(&r.block).expect("submit");
    }
    let tip = {
        let cs = a.lock();
        let t = cs.index().tip();
        (u64::from(t.height), t.hash.to_string())
    };
    // B syncs (or fails) while the connections are held.
    std::thread::sleep(Duration::from_secs(15));
    let running = b.try_wait().expect("wait").is_none();
    done.store(true, Ordering::SeqCst);
    flood.join().expect("flood thread");
    assert!(running, "B stopped under the flood\n{}", tail(&log));

    let started = Instant::now();
    while http_tip(http).as_ref() != Some(&tip) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "B did not reach A's tip {tip:?} (at {:?})\n{}",
            http_tip(http),
            tail(&log)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(http_json(http, "/health").is_some(), "/health answers 200");
    let status = stop(&mut b, Duration::from_secs(30)).expect("B stops on SIGTERM");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "B's exit: {status}\n{}", tail(&log));
    assert!(
        !text.contains("storage failure"),
        "no storage failure\n{}",
        tail(&log)
    );
    // The accept loop's failures, if any, are logged at most once per
    // 10 s, not at every retry.
    let accept_lines = text.matches("HTTP accept failed").count();
    assert!(accept_lines <= 3, "{accept_lines} accept-failure lines");
    p2p.stop().expect("A stops");
}
