//! Helpers shared by the integration tests: paths to the real chain data and
//! a node imported from it.
#![allow(dead_code)]

pub mod blockgen;
pub mod child;
pub mod core_asm;
pub mod core_versions;
pub mod faults;
pub mod feed;
pub mod python;
pub mod rng;
pub mod test_peer;

pub use rng::Rng;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use bitcoin::Network;
use kakehi::chain::ChainParams;
use kakehi::import::{import_files, ImportSummary};
use kakehi::node::{open_chainstate, DataDir};
use kakehi::pipeline::Chainstate;
use parking_lot::Mutex;

/// `testnet-data/<rel>` in the repository.
pub fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testnet-data")
        .join(rel)
}

/// Parsed JSON of `testnet-data/<rel>`.
pub fn json(rel: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(data(rel)).expect("read test data"))
        .expect("parse test data")
}

/// A chain state in a temporary datadir.
pub struct TestNode {
    pub dir: tempfile::TempDir,
    pub datadir: DataDir,
    pub chain: Mutex<Chainstate>,
}

/// A temporary directory for a test's datadir or files, under cargo's
/// `CARGO_TARGET_TMPDIR` (`target/tmp/datadirs/kt-<pid>-…`), deleted when
/// dropped. A directory whose process is gone — a test killed, or a
/// fixture held in a `static`, which Rust never drops — is deleted by the
/// first call of the next test process (Linux: `/proc/<pid>`), so runs do
/// not pile datadirs up in the system's temporary directory.
pub fn tempdir() -> tempfile::TempDir {
    let parent = Path::new(env!("CARGO_TARGET_TMPDIR")).join("datadirs");
    std::fs::create_dir_all(&parent).expect("create target/tmp/datadirs");
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| sweep_dead(&parent));
    tempfile::Builder::new()
        .prefix(&format!("kt-{}-", std::process::id()))
        .tempdir_in(&parent)
        .expect("tempdir")
}

/// Deletes the `kt-<pid>-…` directories in `parent` of processes that no
/// longer run.
fn sweep_dead(parent: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix("kt-"))
            .and_then(|n| n.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if !Path::new("/proc").join(pid.to_string()).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

impl TestNode {
    pub fn new(network: Network) -> Self {
        Self::with_params(ChainParams::new(network))
    }

    pub fn with_params(params: ChainParams) -> Self {
        let dir = tempdir();
        let datadir = DataDir::open(dir.path()).expect("datadir");
        let chain = open_chainstate(params, &datadir).expect("open chainstate");
        TestNode {
            dir,
            datadir,
            chain: Mutex::new(chain),
        }
    }

    pub fn import(&self, files: &[PathBuf]) -> ImportSummary {
        import_files(&self.chain, files, &AtomicBool::new(false), false).expect("import")
    }

    /// The node's `dump-utxos` text.
    pub fn dump_utxos(&self) -> String {
        let mut out = Vec::new();
        self.chain.lock().dump_utxos(&mut out).expect("dump");
        String::from_utf8(out).expect("utf-8")
    }
}

/// A node's P2P layer listening on an OS-chosen 127.0.0.1 port, on a
/// runtime of its own (2 workers): no DNS seeds, default limits otherwise
/// (every test peer comes from 127.0.0.1, so the per-IP cap of 8 applies).
pub struct ListeningP2p {
    /// The runtime the P2P tasks run on.
    pub runtime: tokio::runtime::Runtime,
    /// The listening address.
    pub addr: std::net::SocketAddr,
    /// The P2P layer's handle (peers, discouraged addresses).
    pub handle: kakehi::p2p::P2pHandle,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), kakehi::p2p::P2pError>>,
}

impl ListeningP2p {
    /// Starts P2P for `chain` and waits (≤ 10 s) until it listens.
    pub fn start(chain: std::sync::Arc<Mutex<Chainstate>>) -> Self {
        let mut config = kakehi::p2p::P2pConfig::default();
        config.dns_seeds = false;
        Self::start_with(chain, config)
    }

    /// As [`ListeningP2p::start`], with `config` (its listen address is
    /// set to 127.0.0.1, port chosen by the OS).
    pub fn start_with(
        chain: std::sync::Arc<Mutex<Chainstate>>,
        mut config: kakehi::p2p::P2pConfig,
    ) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        config.listen = Some("127.0.0.1:0".parse().expect("addr"));
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let (handle, task) =
            runtime.block_on(async { kakehi::node::start_p2p(chain, config, stop_rx) });
        let addr = runtime
            .block_on(async {
                tokio::time::timeout(std::time::Duration::from_secs(10), handle.local_addr()).await
            })
            .expect("listener up within 10 s")
            .expect("listen address");
        Self {
            runtime,
            addr,
            handle,
            stop,
            task,
        }
    }

    /// Stops the P2P layer; `Ok` if its task ended without error within 20 s,
    /// else what happened.
    pub fn stop(self) -> Result<(), String> {
        self.stop.send(true).ok();
        let ended = self.runtime.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(20), self.task).await
        });
        match ended {
            Ok(Ok(Ok(()))) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    }
}

/// An HTTP server on 127.0.0.1:<ephemeral> ([`spawn_http`]); it stops when
/// this is dropped.
pub struct HttpServer {
    /// The listening address.
    pub addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serves `state` with `config` on 127.0.0.1:<ephemeral> from a runtime of
/// its own (2 workers, on its own thread) until the returned server is
/// dropped (then the runtime, and the snapshots it held, are gone).
pub fn spawn_http(state: kakehi::http::AppState, config: kakehi::http::HttpConfig) -> HttpServer {
    spawn_server(move |listener, shutdown| async move {
        kakehi::http::serve_listener(listener, state, config, shutdown)
            .await
            .expect("serve");
    })
}

/// Serves the JSON-RPC interface over `state` with `config`, as
/// [`spawn_http`] serves the HTTP API.
pub fn spawn_rpc(state: kakehi::http::AppState, config: kakehi::rpc::RpcConfig) -> HttpServer {
    spawn_server(move |listener, shutdown| async move {
        kakehi::rpc::serve_listener(listener, state, config, shutdown)
            .await
            .expect("serve");
    })
}

/// Runs `serve(listener, shutdown)` on 127.0.0.1:<ephemeral> from a
/// runtime of its own (2 workers, on its own thread); `shutdown` resolves
/// when the returned server is dropped.
fn spawn_server<F, Fut>(serve: F) -> HttpServer
where
    F: FnOnce(
            tokio::net::TcpListener,
            std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
        ) -> Fut
        + Send
        + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    std_listener.set_nonblocking(true).expect("nonblocking");
    let addr = std_listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
            let shutdown = Box::pin(async move {
                let _ = stopped.await;
            });
            serve(listener, shutdown).await;
        });
    });
    HttpServer {
        addr,
        stop: Some(stop),
        thread: Some(thread),
    }
}

/// A node imported from `testnet-data/regtest-a` with an empty mempool of
/// Core's defaults, and no P2P: its datadir and the handlers' state.
pub fn regtest_a_state() -> (tempfile::TempDir, kakehi::http::AppState) {
    let node = TestNode::new(bitcoin::Network::Regtest);
    let summary = node.import(&[data("regtest-a/blocks.dat")]);
    assert!(summary.rejected.is_empty(), "{:?}", summary.rejected);
    let TestNode { dir, chain, .. } = node;
    let snapshots = chain.lock().snapshots();
    let mempool = std::sync::Arc::new(kakehi::mempool::Mempool::new(
        snapshots.clone(),
        kakehi::mempool::MempoolConfig::default(),
    ));
    let state = kakehi::http::AppState {
        snapshots,
        p2p: None,
        mempool: Some(mempool),
    };
    (dir, state)
}

/// One raw HTTP/1.1 request to `addr` with extra header lines (`"Name:
/// value\r\n"`), `Connection: close`: (status, head, body, de-chunked).
pub fn raw_request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    extra: &str,
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("timeout");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}Content-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("write");
    let _ = s.write_all(body);
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response head");
    let head = String::from_utf8_lossy(&buf[..split]).to_string();
    let status: u16 = head
        .split(' ')
        .nth(1)
        .expect("status")
        .parse()
        .expect("status");
    let mut body = buf[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    (status, head, body)
}

/// A chunked HTTP/1.1 body's content.
fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(nl) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let n = usize::from_str_radix(std::str::from_utf8(&b[..nl]).unwrap().trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[nl + 2..nl + 2 + n]);
        b = &b[nl + 2 + n + 2..];
    }
}

/// Sends the node's `tracing` output to stderr when `KAKEHI_TEST_LOG` is
/// set (an `EnvFilter` directive, e.g. `kakehi=debug`): for a failing
/// integration test's story. Does nothing otherwise.
pub fn init_test_log() {
    if let Ok(filter) = std::env::var("KAKEHI_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
}

/// libtest's name of the test function `test` of `module` (a
/// `module_path!()`): its path without the crate's name, what a child
/// process of the test binary is given with `--exact`.
pub fn test_name(module: &str, test: &str) -> String {
    match module.split_once("::") {
        Some((_, rest)) => format!("{rest}::{test}"),
        None => test.to_owned(),
    }
}

/// Whether the calling test runs here: `false` in the integration-test
/// process, after running it in a child process of this binary, alone;
/// `true` in that child, where the caller then runs its body.
///
/// libtest runs every test of a binary in one process, on its threads. A
/// test that needs the process to itself (process-wide state, such as
/// sled's log watch, or the process's own memory figures) calls this
/// first: `if !common::alone(module_path!(), "the_test_fn") { return; }`.
/// `module` is the caller's `module_path!()`, `test` its function name.
/// The child's output is printed (libtest captures it as the test's own).
///
/// Panics if the child cannot run, fails, or does not run exactly that
/// one test (a wrong name would otherwise pass by running nothing).
pub fn alone(module: &str, test: &str) -> bool {
    const VAR: &str = "KAKEHI_TEST_ALONE";
    let name = test_name(module, test);
    if std::env::var(VAR).is_ok_and(|v| v == name) {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args([
            name.as_str(),
            "--exact",
            "--include-ignored",
            "--test-threads=1",
        ])
        .arg("--nocapture")
        .env(VAR, &name)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {name} in a process of its own: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{}{stdout}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{name}, alone in a process of its own: {}",
        out.status
    );
    false
}

/// The first `blocks` records of regtest-a's `blocks.dat` (blk framing:
/// magic, length LE, block), written to `dir/prefix.dat`.
pub fn regtest_a_prefix(dir: &std::path::Path, blocks: usize) -> PathBuf {
    let bytes = std::fs::read(data("regtest-a/blocks.dat")).expect("blocks.dat");
    let mut end = 0;
    for _ in 0..blocks {
        let len = u32::from_le_bytes(bytes[end + 4..end + 8].try_into().expect("4 bytes")) as usize;
        end += 8 + len;
    }
    let path = dir.join("prefix.dat");
    std::fs::write(&path, &bytes[..end]).expect("write prefix");
    path
}

/// MuHash3072 of the UTXO table of `cs` as it stands (a full walk of the
/// active chain's coins, each with its creation height), display hex as
/// Core's `gettxoutsetinfo muhash` prints it.
pub fn muhash_of_table(cs: &mut Chainstate) -> String {
    use kakehi::muhash::{coin_bytes, MuHash3072};
    let mut acc = MuHash3072::new();
    cs.for_each_utxo(&mut |op, coin, height| {
        let coin = kakehi::primitives::Coin {
            height,
            ..coin.clone()
        };
        acc.insert(&coin_bytes(op, &coin));
    })
    .expect("walk the UTXO table");
    acc.core_hex()
}

/// bcoin's basic filter header of every block of regtest-a, best chain
/// (`filters.json`) and stale branches (`stale_filters.json`), by block
/// hash (display hex).
pub fn regtest_a_filter_headers() -> std::collections::HashMap<String, String> {
    ["regtest-a/filters.json", "regtest-a/stale_filters.json"]
        .iter()
        .flat_map(|f| json(f).as_array().expect("an array").clone())
        .map(|e| {
            let field = |k: &str| e[k].as_str().expect("a string field").to_owned();
            (field("hash"), field("filter_header"))
        })
        .collect()
}

/// Copies every file of `from` into `to` (recreated), as a disk image of a
/// directory at one instant.
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}
