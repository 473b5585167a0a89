//! The `kakehi` binary under load and faults: a low open-files limit with
//! a client holding idle HTTP connections.

use crate::common;

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
    // No JSON-RPC server: tests run nodes side by side (its port is fixed).
    c.env_clear()
        .env("KAKEHI_RPC", "off")
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

/// Spawns `command` with standard output and error to the file `log`.
fn spawn_logged(command: &mut Command, log: &Path) -> Child {
    let log_file = std::fs::File::create(log).expect("log file");
    command
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().expect("log file"))
        .stderr(log_file)
        .spawn()
        .expect("spawn kakehi")
}

/// `kakehi import` of regtest-a's first `blocks` records into `datadir`.
fn import_prefix(home: &Path, datadir: &Path, blocks: usize) {
    let prefix = common::regtest_a_prefix(home, blocks);
    let out = kakehi(home, None)
        .arg("--datadir")
        .arg(datadir)
        .arg("import")
        .arg(&prefix)
        .output()
        .expect("import");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
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
    import_prefix(home.path(), &datadir_b, FIRST);
    let log = home.path().join("b.log");
    let http = free_port();
    let mut b = spawn_logged(
        kakehi(home.path(), Some(256))
            .arg("--datadir")
            .arg(&datadir_b)
            .args(["run", "--connect", &p2p.addr.to_string()])
            .args(["--http", &format!("127.0.0.1:{http}")]),
        &log,
    );
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

/// `command` run to its end, with its wall time and, where `/usr/bin/time`
/// exists, its peak RSS in KiB.
fn timed(mut command: Command) -> (std::process::Output, Duration, Option<u64>) {
    let time = Path::new("/usr/bin/time");
    let (mut c, rss_file) = if time.exists() {
        let rss_file = common::tempdir();
        let mut c = Command::new(time);
        c.arg("-f")
            .arg("%M")
            .arg("-o")
            .arg(rss_file.path().join("rss"))
            .arg(command.get_program())
            .args(command.get_args());
        for (k, v) in command.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        (c, Some(rss_file))
    } else {
        (std::mem::replace(&mut command, Command::new("true")), None)
    };
    let started = Instant::now();
    let out = c.output().expect("spawn");
    let rss = rss_file.and_then(|d| {
        std::fs::read_to_string(d.path().join("rss"))
            .ok()?
            .trim()
            .lines()
            .last()?
            .parse()
            .ok()
    });
    (out, started.elapsed(), rss)
}

/// `kakehi import` streams its files: `/dev/zero` and a 1 GiB (sparse)
/// file of garbage are refused at once, naming offset 0, with a flat peak
/// RSS (both were read whole before: `/dev/zero` until out of memory); a
/// good record followed by a 1 GiB run of zeros is refused at the offset
/// where the zeros start, once they pass Core's 16 MiB pre-allocation.
#[test]
fn import_streams_its_files() {
    let home = common::tempdir();
    let datadir = home.path().join("d");
    let garbage = home.path().join("garbage.dat");
    let f = std::fs::File::create(&garbage).expect("create");
    std::io::Write::write_all(&mut &f, b"not a block file").expect("write");
    f.set_len(1 << 30).expect("sparse 1 GiB");
    let zero_tail = home.path().join("zero-tail.dat");
    let first = common::regtest_a_prefix(home.path(), 1);
    let first_len = std::fs::metadata(&first).expect("prefix").len();
    std::fs::rename(&first, &zero_tail).expect("rename");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&zero_tail)
        .and_then(|f| f.set_len(first_len + (1 << 30)))
        .expect("sparse zeros");
    for (file, offset) in [
        (Path::new("/dev/zero"), 0),
        (garbage.as_path(), 0),
        (zero_tail.as_path(), first_len),
    ] {
        let mut c = kakehi(home.path(), None);
        c.arg("--datadir").arg(&datadir).arg("import").arg(file);
        let (out, took, rss) = timed(c);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{}: accepted", file.display());
        assert!(
            stderr.contains(&format!("garbage at offset {offset} ")),
            "{}: {stderr}",
            file.display()
        );
        assert!(
            took < Duration::from_secs(20),
            "{}: {took:?}",
            file.display()
        );
        if let Some(kib) = rss {
            eprintln!("{}: {took:?}, peak RSS {} MiB", file.display(), kib >> 10);
            assert!(kib < 300 << 10, "{}: peak RSS {kib} KiB", file.display());
        }
    }
}

/// A configuration file is read up to 1 MiB: `--config /dev/zero` is a
/// configuration error (exit 2) at once, not a read without end.
#[test]
fn config_file_size_is_capped() {
    let home = common::tempdir();
    let (out, took, _) = timed({
        let mut c = kakehi(home.path(), None);
        c.args(["--config", "/dev/zero", "config", "show"]);
        c
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("/dev/zero is over 1048576 bytes"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// `GET path` on `127.0.0.1:port`: the status line's code and the body
/// (code 0: the connection closed without an answer).
fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut out = String::new();
    let answered = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .and_then(|()| s.read_to_string(&mut out));
    if answered.is_err() {
        return (0, out);
    }
    let code = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
    (code, body.unwrap_or_default())
}

/// `command run` on `datadir` with its HTTP API on `http` and `run_args`,
/// logging to `log`, waited for (≤ 30 s) until `/health` answers.
fn serve(mut command: Command, datadir: &Path, http: u16, log: &Path, run_args: &[&str]) -> Child {
    let mut child = spawn_logged(
        command
            .arg("--datadir")
            .arg(datadir)
            .args(["run", "--http", &format!("127.0.0.1:{http}")])
            .args(run_args),
        log,
    );
    let started = Instant::now();
    while http_json(http, "/health").is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(30)
                && child.try_wait().expect("wait").is_none(),
            "the node did not serve\n{}",
            tail(log)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    child
}

/// Start-up refusals: a `--listen` address in use is an error at start
/// (exit 1, before serving), as an HTTP address in use is; `dump-utxos` on
/// a datadir that does not exist refuses and creates nothing.
#[test]
fn start_up_refuses_what_it_cannot_do() {
    let home = common::tempdir();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr");
    let log = home.path().join("listen.log");
    let mut node = spawn_logged(
        kakehi(home.path(), None)
            .arg("--datadir")
            .arg(home.path().join("d"))
            .args(["run", "--listen", &addr.to_string()])
            .args(["--http", &format!("127.0.0.1:{}", free_port())]),
        &log,
    );
    let started = Instant::now();
    let status = loop {
        if let Some(status) = node.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = stop(&mut node, Duration::from_secs(10));
            panic!(
                "the node ran with its --listen address in use\n{}",
                tail(&log)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on {addr}")),
        "{stderr}"
    );

    let missing = home.path().join("missing");
    let out = kakehi(home.path(), None)
        .arg("--datadir")
        .arg(&missing)
        .arg("dump-utxos")
        .output()
        .expect("dump-utxos");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("does not exist"), "{stderr}");
    assert!(
        !missing.exists(),
        "dump-utxos created {}",
        missing.display()
    );
}

/// Answers about bad requests and damaged data: `/block-height/+5` is a
/// 400 (not height 5); a block whose stored record is damaged is a 500
/// saying "stored data damaged", naming no path.
#[test]
fn http_answers_bad_heights_and_damaged_records_honestly() {
    let home = common::tempdir();
    let datadir = home.path().join("d");
    import_prefix(home.path(), &datadir, 10);
    // Every record's magic in the block files overwritten.
    let blk = datadir.join("blocks/blk00000.dat");
    let mut bytes = std::fs::read(&blk).expect("blk00000.dat");
    let magic = [0xfa, 0xbf, 0xb5, 0xda];
    let mut damaged = 0;
    for i in 0..bytes.len().saturating_sub(3) {
        if bytes[i..i + 4] == magic {
            bytes[i..i + 4].copy_from_slice(b"oops");
            damaged += 1;
        }
    }
    assert!(damaged >= 10, "{damaged} records");
    std::fs::write(&blk, &bytes).expect("write");

    let http = free_port();
    let log = home.path().join("log");
    let mut node = serve(kakehi(home.path(), None), &datadir, http, &log, &[]);
    let (code, body) = http_get(http, "/block-height/+5");
    assert_eq!(code, 400, "{body}");
    let (code, hash) = http_get(http, "/block-height/5");
    assert_eq!(code, 200, "{hash}");
    let (code, body) = http_get(http, &format!("/block/{}/raw", hash.trim()));
    assert_eq!(code, 500, "{body}");
    assert!(body.contains("stored data damaged"), "{body}");
    let dir = datadir.display().to_string();
    assert!(!body.contains("blk") && !body.contains(&dir), "{body}");
    let _ = stop(&mut node, Duration::from_secs(30));
}

/// The per-IP connection cap and rate limit, from the three sources: the
/// cap (4) from the TOML file, the rate (1/s) from the environment, the
/// burst (3) from the command line. A fifth connection from one address
/// is closed without an answer while four are open, and served once they
/// close; past the burst, requests get 429.
#[test]
fn per_ip_connection_cap_and_rate_limit_are_settable() {
    let home = common::tempdir();
    let toml = home.path().join("kakehi.toml");
    std::fs::write(&toml, "[http]\nmax_connections_per_ip = 4\n").expect("config");
    let http = free_port();
    let log = home.path().join("log");
    let mut command = kakehi(home.path(), None);
    command
        .arg("--config")
        .arg(&toml)
        .env("KAKEHI_HTTP_RATE_LIMIT_PER_SECOND", "1");
    let datadir = home.path().join("d");
    let mut node = serve(command, &datadir, http, &log, &["--http-rate-burst", "3"]);
    // `config show` sees the three sources too.
    let out = kakehi(home.path(), None)
        .arg("--config")
        .arg(&toml)
        .env("KAKEHI_HTTP_RATE_LIMIT_PER_SECOND", "1")
        .args(["config", "show"])
        .output()
        .expect("config show");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("max_connections_per_ip = 4"), "{shown}");
    assert!(shown.contains("rate_limit_per_second = 1.0"), "{shown}");

    let held: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(("127.0.0.1", http)).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let (code, body) = http_get(http, "/health");
    assert_eq!(code, 0, "a fifth connection was served: {body}");
    drop(held);
    // The server notices the closes (allow for a loaded machine): the next
    // connection is served again.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while http_get(http, "/health").0 == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no connection served after the held ones closed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The bucket is full again after 3 s at 1/s (a margin for a loaded
    // machine: it never holds more than its burst).
    std::thread::sleep(Duration::from_secs(4));
    let codes: Vec<u16> = (0..5).map(|_| http_get(http, "/health").0).collect();
    assert_eq!(&codes[..3], &[200, 200, 200], "{codes:?}");
    assert!(codes[3..].contains(&429), "{codes:?}");
    let _ = stop(&mut node, Duration::from_secs(30));
}
