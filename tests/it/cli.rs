//! The `kakehi` binary against bad input: each case must end with a clear
//! message, a non-zero exit status and the database unchanged (same UTXO
//! dump, same tip). Plus the datadir lock, `config show`, and a SIGTERM
//! during an import of regtest-a that stops at a block boundary and resumes.
//!
//! Data: testnet-data/regtest-a (bcoin) and testnet-data/mainnet-samples
//! (btcd fixtures); see testnet-data/README.md.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testnet-data")
        .join(rel)
}

/// The binary with a clean environment (no KAKEHI_*, no RUST_LOG; HOME in
/// the temp dir so no default datadir of the user is touched) and JSON logs.
fn kakehi(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kakehi"));
    // No JSON-RPC server: tests run nodes side by side (its port is fixed).
    c.env("KAKEHI_RPC", "off");
    c.env_clear()
        .env("HOME", home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(["--log-format", "json"]);
    c
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("spawn kakehi")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The records (frame included) of a blk-framed file.
fn records(path: &Path) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(path).expect("read blk file");
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 8 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().expect("4 bytes")) as usize;
        out.push(bytes[pos..pos + 8 + len].to_vec());
        pos += 8 + len;
    }
    out
}

/// (tip height, tip hash) from the "chain state opened" log line, and the
/// UTXO dump, of `datadir`.
fn snapshot(home: &Path, datadir: &Path) -> (u64, String, String) {
    let out = run(kakehi(home).arg("--datadir").arg(datadir).arg("dump-utxos"));
    assert!(out.status.success(), "dump-utxos: {}", text(&out.stderr));
    let stderr = text(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.contains("chain state opened"))
        .unwrap_or_else(|| panic!("no open line in {stderr}"));
    let v: serde_json::Value = serde_json::from_str(line).expect("json log line");
    let f = &v["fields"];
    (
        f["height"].as_u64().expect("height"),
        f["block_hash"].as_str().expect("hash").to_string(),
        text(&out.stdout),
    )
}

struct Fixture {
    home: tempfile::TempDir,
    datadir: PathBuf,
    /// All records of regtest-a/blocks.dat.
    records: Vec<Vec<u8>>,
}

/// A datadir with the first 20 blocks of regtest-a imported.
fn fixture() -> Fixture {
    let home = common::tempdir();
    let datadir = home.path().join("node");
    let records = records(&data("regtest-a/blocks.dat"));
    let first = home.path().join("first.dat");
    std::fs::write(&first, records[..20].concat()).expect("write");
    let out = run(kakehi(home.path())
        .arg("--datadir")
        .arg(&datadir)
        .arg("import")
        .arg(&first));
    assert!(out.status.success(), "{}", text(&out.stderr));
    Fixture {
        home,
        datadir,
        records,
    }
}

impl Fixture {
    /// Imports `bytes` as a file and checks: non-zero exit, `expect` in the
    /// message, database unchanged.
    fn refused(&self, name: &str, bytes: &[u8], expect: &str) {
        let before = snapshot(self.home.path(), &self.datadir);
        assert_eq!(before.0, 20, "fixture tip height");
        let path = self.home.path().join(name);
        std::fs::write(&path, bytes).expect("write");
        self.refused_file(&path, expect);
        assert_eq!(snapshot(self.home.path(), &self.datadir), before, "{name}");
    }

    fn refused_file(&self, path: &Path, expect: &str) {
        let out = run(kakehi(self.home.path())
            .arg("--datadir")
            .arg(&self.datadir)
            .arg("import")
            .arg(path));
        let stderr = text(&out.stderr);
        assert!(
            !out.status.success(),
            "{} accepted: {stderr}",
            path.display()
        );
        assert!(
            stderr.contains(expect) && stderr.contains(&path.display().to_string()),
            "{}: expected {expect:?} and the file name in: {stderr}",
            path.display()
        );
    }
}

#[test]
fn bad_block_files_are_refused_whole_and_change_nothing() {
    let fx = fixture();
    let next = &fx.records[20..30];

    // Truncated: the last record loses its tail.
    let mut truncated = next.concat();
    truncated.truncate(truncated.len() - 100);
    fx.refused("truncated.dat", &truncated, "truncated record");

    // Garbage between records.
    let mut garbage = next[..5].concat();
    garbage.extend_from_slice(b"not a block record");
    garbage.extend(next[5..].concat());
    fx.refused("garbage.dat", &garbage, "garbage at offset");

    // A wrong magic on every record (no network uses it).
    let wrong: Vec<u8> = next
        .iter()
        .flat_map(|r| {
            let mut r = r.clone();
            r[..4].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
            r
        })
        .collect();
    fx.refused("wrong-magic.dat", &wrong, "garbage at offset 0");

    // Blocks of another network: mainnet blocks 0-4 into regtest.
    let before = snapshot(fx.home.path(), &fx.datadir);
    fx.refused_file(
        &data("mainnet-samples/blk_0_to_4.dat"),
        "belongs to network bitcoin",
    );
    assert_eq!(snapshot(fx.home.path(), &fx.datadir), before);

    // A missing file.
    fx.refused_file(&fx.home.path().join("absent.dat"), "cannot read");
    assert_eq!(snapshot(fx.home.path(), &fx.datadir), before);

    // The datadir opened as another network's: refused, and left intact.
    let out = run(kakehi(fx.home.path())
        .args(["--network", "signet", "--datadir"])
        .arg(&fx.datadir)
        .arg("dump-utxos"));
    assert_eq!(out.status.code(), Some(1));
    let msg = text(&out.stderr);
    assert!(
        msg.contains("holds another network's chain, not signet"),
        "{msg}"
    );
    assert_eq!(snapshot(fx.home.path(), &fx.datadir), before);

    // The same records, well formed, are accepted: the refusals above were
    // about the damage, not the blocks.
    let good = fx.home.path().join("good.dat");
    std::fs::write(&good, next.concat()).expect("write");
    let out = run(kakehi(fx.home.path())
        .arg("--datadir")
        .arg(&fx.datadir)
        .arg("import")
        .arg(&good));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(snapshot(fx.home.path(), &fx.datadir).0, 30);
}

#[test]
fn unknown_network_is_a_usage_error() {
    let home = common::tempdir();
    let datadir = home.path().join("node");
    let out = run(kakehi(home.path())
        .args(["--network", "mainnett", "--datadir"])
        .arg(&datadir)
        .arg("dump-utxos"));
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("unknown network \"mainnett\""));
    assert!(!datadir.exists(), "nothing created on a usage error");
    // The same from the environment and from a file.
    let out = run(kakehi(home.path())
        .env("KAKEHI_NETWORK", "mainnett")
        .args(["config", "show"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("KAKEHI_NETWORK"));
    let file = home.path().join("k.toml");
    std::fs::write(&file, "# kakehi\n\nnetwork = \"mainnett\"\n").expect("write");
    let out = run(kakehi(home.path())
        .arg("--config")
        .arg(&file)
        .args(["config", "show"]));
    assert_eq!(out.status.code(), Some(2));
    let msg = text(&out.stderr);
    assert!(
        msg.contains(&format!("{}:3: network:", file.display())),
        "{msg}"
    );
    // A missing config file names itself.
    let out = run(kakehi(home.path())
        .arg("--config")
        .arg(home.path().join("absent.toml"))
        .args(["config", "show"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot read config file"));
}

#[test]
fn unusable_datadir_is_a_clear_error() {
    let home = common::tempdir();
    // A file where the datadir should be.
    let file = home.path().join("plainfile");
    std::fs::write(&file, b"x").expect("write");
    let out = run(kakehi(home.path())
        .arg("--datadir")
        .arg(&file)
        .arg("dump-utxos"));
    assert_eq!(out.status.code(), Some(1));
    let msg = text(&out.stderr);
    assert!(msg.contains("is not a directory"), "{msg}");
    assert_eq!(std::fs::read(&file).expect("read"), b"x", "file untouched");
    // A datadir below a file: cannot be created.
    let out = run(kakehi(home.path())
        .arg("--datadir")
        .arg(file.join("sub"))
        .arg("dump-utxos"));
    assert_eq!(out.status.code(), Some(1));
    let msg = text(&out.stderr);
    assert!(
        msg.contains(&format!("datadir {}", file.join("sub").display())),
        "{msg}"
    );
}

/// The index database's own messages (sled logs with the `log` crate:
/// a failed fsync of its background flusher is only logged there) reach
/// the node's log, under the log filter's `sled` directive.
#[test]
fn the_index_databases_own_log_reaches_the_nodes_log() {
    let home = common::tempdir();
    let datadir = home.path().join("d");
    // dump-utxos refuses a datadir that does not exist: an empty one.
    std::fs::create_dir_all(&datadir).expect("datadir");
    let out = run(kakehi(home.path())
        .env("RUST_LOG", "info,sled=trace")
        .arg("--datadir")
        .arg(&datadir)
        .arg("dump-utxos"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let log = text(&out.stderr);
    assert!(
        log.lines()
            .any(|l| l.contains("\"target\":\"sled::") && l.contains("\"level\":\"TRACE\"")),
        "no message of sled in the log:\n{log}"
    );
}

#[test]
fn config_show_applies_precedence() {
    let home = common::tempdir();
    let file = home.path().join("k.toml");
    std::fs::write(
        &file,
        "network = \"testnet\"\n[http]\naddress = \"0.0.0.0:1111\"\n[log]\nformat = \"json\"\n",
    )
    .expect("write");
    let out = run(kakehi(home.path())
        .env("KAKEHI_HTTP", "0.0.0.0:2222")
        .arg("--config")
        .arg(&file)
        .args(["--network", "signet", "config", "show"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown: toml::Value = toml::from_str(&text(&out.stdout)).expect("shown toml");
    assert_eq!(shown["network"].as_str(), Some("signet"));
    assert_eq!(shown["http"]["address"].as_str(), Some("0.0.0.0:2222"));
    assert_eq!(shown["log"]["format"].as_str(), Some("json"));
    let expected_datadir = home.path().join(".kakehi").join("signet");
    assert_eq!(
        shown["datadir"].as_str(),
        Some(expected_datadir.to_str().expect("utf-8"))
    );
}

/// Spawns `kakehi ... args` and returns it with a reader of its stderr lines.
fn spawn(
    home: &Path,
    datadir: &Path,
    args: &[&str],
) -> (std::process::Child, BufReader<std::process::ChildStderr>) {
    let mut child = kakehi(home)
        .arg("--datadir")
        .arg(datadir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stderr = BufReader::new(child.stderr.take().expect("piped"));
    (child, stderr)
}

/// Reads lines until one contains `needle` (or panics after 60 s / EOF).
fn wait_for(r: &mut BufReader<std::process::ChildStderr>, needle: &str) -> String {
    let t = Instant::now();
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        let n = r.read_line(&mut line).expect("read stderr");
        assert!(
            n > 0 && t.elapsed() < Duration::from_secs(60),
            "no {needle:?} in: {seen}"
        );
        if line.contains(needle) {
            return line;
        }
        seen.push_str(&line);
    }
}

#[test]
fn second_process_on_a_locked_datadir_is_refused() {
    let home = common::tempdir();
    let datadir = home.path().join("node");
    let (mut node, mut stderr) = spawn(home.path(), &datadir, &["run", "--http", "127.0.0.1:0"]);
    wait_for(&mut stderr, "HTTP API listening");
    let out = run(kakehi(home.path())
        .arg("--datadir")
        .arg(&datadir)
        .arg("dump-utxos"));
    assert_eq!(out.status.code(), Some(1));
    let msg = text(&out.stderr);
    assert!(msg.contains("is in use by another kakehi process"), "{msg}");
    assert!(msg.contains(".lock"), "{msg}");
    common::child::sigterm(&node);
    wait_for(&mut stderr, "stopped");
    assert!(node.wait().expect("wait").success());
    // Released on exit: the datadir opens again.
    let out = run(kakehi(home.path())
        .arg("--datadir")
        .arg(&datadir)
        .arg("dump-utxos"));
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn lock_is_exclusive_within_one_process_too() {
    let dir = common::tempdir();
    let first = kakehi::node::DataDir::open(dir.path()).expect("first open");
    match kakehi::node::DataDir::open(dir.path()) {
        Err(kakehi::node::NodeError::Locked { path }) => assert_eq!(path, dir.path()),
        other => panic!("second open: {other:?}"),
    }
    drop(first);
    kakehi::node::DataDir::open(dir.path()).expect("open after release");
}

/// SIGTERM during `import regtest-a/blocks.dat`: exit 0 at a block boundary,
/// then a second import resumes to bcoin's tip with bcoin's UTXO set.
/// Takes about a minute (the whole chain is imported once, in two parts).
#[test]
fn sigterm_during_import_stops_at_a_boundary_and_resumes() {
    let home = common::tempdir();
    let datadir = home.path().join("node");
    let blocks = data("regtest-a/blocks.dat");
    let blocks_arg = blocks.to_str().expect("utf-8 path");
    let (child, mut stderr) = spawn(home.path(), &datadir, &["import", blocks_arg]);
    wait_for(&mut stderr, "\"importing\"");
    // Let some blocks connect, then ask to stop.
    wait_for(&mut stderr, "\"height\":50,");
    common::child::sigterm(&child);
    let line = wait_for(&mut stderr, "stopped at a block boundary");
    let v: serde_json::Value = serde_json::from_str(&line).expect("json");
    let stopped_at = v["fields"]["height"].as_u64().expect("height");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "exit {:?}", out.status);
    let summary = text(&out.stdout);
    assert!(summary.contains("(interrupted)"), "{summary}");
    assert!((50..1500).contains(&stopped_at), "stopped at {stopped_at}");

    // The stored state is exactly that boundary.
    let (height, _, _) = snapshot(home.path(), &datadir);
    assert_eq!(height, stopped_at);

    // Resume: the same file again; known blocks are skipped.
    let out = run(kakehi(home.path())
        .arg("--datadir")
        .arg(&datadir)
        .arg("import")
        .arg(&blocks));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let chain: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data("regtest-a/chain.json")).expect("read"))
            .expect("chain.json");
    let (height, hash, utxos) = snapshot(home.path(), &datadir);
    assert_eq!(Some(height), chain["tip_height"].as_u64());
    assert_eq!(Some(hash.as_str()), chain["tip_hash"].as_str());
    let reference = std::fs::read_to_string(data("regtest-a/utxos.txt")).expect("utxos.txt");
    assert!(
        utxos == reference,
        "dump-utxos differs from regtest-a/utxos.txt"
    );
}

/// A plain HTTP/1.1 GET on loopback; returns the body.
fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// The README's main job: `run --import regtest-a/blocks.dat` imports the
/// whole chain, serves HTTP with the reference tip, stops on SIGTERM, and a
/// second start on the same datadir reuses it (every block already known).
#[test]
fn main_job_imports_serves_and_restarts_on_the_same_datadir() {
    let home = common::tempdir();
    let datadir = home.path().join("node");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let http = format!("127.0.0.1:{port}");
    let blocks = data("regtest-a/blocks.dat");
    let args = [
        "run",
        "--http",
        http.as_str(),
        "--import",
        blocks.to_str().unwrap(),
    ];
    let tip = "4d03eb095dbd6156a7f4477ad4811d99b03399ad89ce528dd0048dd23b66e9bb";
    for round in 0..2 {
        let (node, mut stderr) = spawn(home.path(), &datadir, &args);
        wait_for(&mut stderr, "HTTP API listening");
        assert_eq!(
            http_get(port, "/blocks/tip/height").trim(),
            "1500",
            "round {round}"
        );
        assert_eq!(http_get(port, "/blocks/tip/hash").trim(), tip);
        common::child::sigterm(&node);
        wait_for(&mut stderr, "stopped");
        let out = node.wait_with_output().expect("wait");
        assert!(out.status.success());
        let summary = text(&out.stdout);
        let expected = if round == 0 {
            "1529 accepted"
        } else {
            "1529 already known"
        };
        assert!(summary.contains(expected), "round {round}: {summary}");
    }
}
