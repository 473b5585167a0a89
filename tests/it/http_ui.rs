//! The status page in a real browser (Debian's headless Chromium, installed
//! by the test with `apt-get install -y chromium` when missing) and the
//! OpenAPI contract under `schemathesis` (PyPI, pinned in
//! `tests/python/requirements.txt`), both against one node imported from
//! `testnet-data/regtest-a` (made by bcoin 2.2.0) with its P2P layer
//! listening and one inbound TCP peer. Expected values come from the test
//! data (`chain.json`, `spent.txt`), never from kakehi.

use crate::common;

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bitcoin::Network;
use common::{data, json, TestNode};
use kakehi::http::{AppState, HttpConfig};

struct Node {
    addr: SocketAddr,
    _dir: tempfile::TempDir,
    /// An inbound P2P connection held open (the page must show it).
    _peer: std::net::TcpStream,
}

/// One node imported from regtest-a, its P2P layer listening on loopback
/// (no outbound peers), its HTTP API on 127.0.0.1:<ephemeral> carrying the
/// P2P handle.
fn node() -> &'static Node {
    static NODE: OnceLock<Node> = OnceLock::new();
    NODE.get_or_init(|| {
        let node = TestNode::new(Network::Regtest);
        let summary = node.import(&[data("regtest-a/blocks.dat")]);
        assert!(summary.rejected.is_empty(), "{:?}", summary.rejected);
        let TestNode { dir, chain, .. } = node;
        let chain = Arc::new(chain);
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        std_listener.set_nonblocking(true).expect("nonblocking");
        let addr = std_listener.local_addr().expect("addr");
        let (p2p_addr_tx, p2p_addr_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let mut cfg = kakehi::p2p::P2pConfig::default();
                cfg.listen = Some("127.0.0.1:0".parse().expect("addr"));
                cfg.dns_seeds = false;
                cfg.addr_file = None;
                cfg.timeouts.handshake = Duration::from_secs(600);
                let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
                let (p2p, _task) = kakehi::node::start_p2p(chain.clone(), cfg, stop_rx);
                let p2p_addr = p2p.local_addr().await.expect("p2p listening");
                p2p_addr_tx.send(p2p_addr).expect("send p2p addr");
                let config = HttpConfig::default();
                let snapshots = chain.lock().snapshots();
                let mempool = std::sync::Arc::new(kakehi::mempool::Mempool::new(
                    snapshots.clone(),
                    kakehi::mempool::MempoolConfig::default(),
                ));
                let state = AppState {
                    snapshots,
                    p2p: Some(p2p),
                    mempool: Some(mempool),
                };
                let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
                kakehi::http::serve_listener(listener, state, config, std::future::pending())
                    .await
                    .expect("serve");
            });
        });
        let p2p_addr = p2p_addr_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("P2P listener up");
        let peer = std::net::TcpStream::connect(p2p_addr).expect("connect to P2P");
        // Wait until the node lists the inbound peer.
        let started = Instant::now();
        loop {
            let s: serde_json::Value =
                serde_json::from_slice(&http_get(addr, "/node/status").1).expect("status JSON");
            if s["peers"]["inbound"] == 1 {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "{s}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Node {
            addr,
            _dir: dir,
            _peer: peer,
        }
    })
}

/// Raw `GET`: (status, body).
fn http_get(addr: SocketAddr, path: &str) -> (u16, Vec<u8>) {
    let (status, _, body) = common::raw_request(addr, "GET", path, "", &[]);
    (status, body)
}

/// Chromium's path, installing Debian's package when it is missing.
fn chromium() -> PathBuf {
    let found = |p: &str| Path::new(p).exists().then(|| PathBuf::from(p));
    if let Some(p) = found("/usr/bin/chromium") {
        return p;
    }
    let install = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
    };
    let mut out = install(&["install", "-y", "chromium"]);
    if !matches!(&out, Ok(o) if o.status.success()) {
        let _ = install(&["update"]);
        out = install(&["install", "-y", "chromium"]);
    }
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "Chromium is missing and `apt-get install -y chromium` failed ({}): {}{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!("Chromium is missing and apt-get cannot run: {e}"),
    }
    found("/usr/bin/chromium").expect("apt-get installed chromium but /usr/bin/chromium is missing")
}

/// Runs headless Chromium on `url` with `args`; returns stdout.
fn run_chromium(args: &[&str], url: &str) -> String {
    let profile = common::tempdir();
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            "--virtual-time-budget=15000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The text inside the element with `id` in a serialized DOM (elements
/// whose content is plain text).
fn text_of<'a>(dom: &'a str, id: &str) -> &'a str {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no element #{id} in the DOM"));
    let start = at + dom[at..].find('>').expect("tag end") + 1;
    let end = start + dom[start..].find('<').expect("next tag");
    &dom[start..end]
}

/// A spent outpoint from `spent.txt` (line 1000, deep enough to be
/// archived or purged): (`txid:vout`, `spender_txid:vin`, height).
fn spent_sample() -> (String, String, u32) {
    let f = std::fs::File::open(data("regtest-a/spent.txt")).expect("spent.txt");
    let line = std::io::BufReader::new(f)
        .lines()
        .nth(1000)
        .expect("line 1000")
        .expect("read");
    let mut it = line.split_whitespace();
    let (op, by, h) = (it.next(), it.next(), it.next());
    (
        op.expect("outpoint").to_string(),
        by.expect("spender").to_string(),
        h.expect("height").parse().expect("height"),
    )
}

/// The page in headless Chromium shows the chain's real tip, its stale tips,
/// the connected peer, and the spender of a spent outpoint looked up through
/// the box (pre-filled from the URL fragment); the screenshot is a PNG of
/// the requested size that is not blank.
#[test]
fn status_page_in_headless_chromium_shows_the_real_tip_and_an_outspend() {
    let n = node();
    let chain = json("regtest-a/chain.json");
    let tip_height = chain["tip_height"].as_u64().expect("tip_height");
    let tip_hash = chain["tip_hash"].as_str().expect("tip_hash");
    let (outpoint, spender, spent_height) = spent_sample();
    let url = format!("http://{}/#outpoint={outpoint}", n.addr);

    let dom = run_chromium(&["--dump-dom"], &url);
    assert!(
        dom.contains("data-ready=\"yes\""),
        "page did not finish: {dom}"
    );
    assert_eq!(text_of(&dom, "tip-height"), tip_height.to_string());
    assert_eq!(text_of(&dom, "tip-hash"), tip_hash);
    assert_eq!(text_of(&dom, "sync-state"), "synced");
    assert_eq!(text_of(&dom, "sync-headers"), tip_height.to_string());
    assert_eq!(text_of(&dom, "network"), "regtest");
    assert_eq!(text_of(&dom, "peer-count"), "(1: 1 in, 0 out)");
    // Recent blocks: the 10 newest active blocks of chain.json.
    let blocks = chain["blocks"].as_array().expect("blocks");
    for h in tip_height - 9..=tip_height {
        let b = blocks
            .iter()
            .find(|b| b["on_best_chain"] == true && b["height"] == h)
            .expect("best-chain block");
        assert!(
            dom.contains(b["hash"].as_str().expect("hash")),
            "block {h} missing"
        );
    }
    // Chain tips: every reorg's old tip is a stale tip.
    let tips_at = dom.find("id=\"tips\"").expect("tips table");
    for r in chain["reorgs"].as_array().expect("reorgs") {
        let old = r["old_tip"].as_str().expect("old_tip");
        assert!(dom[tips_at..].contains(old), "stale tip {old} not listed");
    }
    // The outpoint box: spender and height from spent.txt.
    assert_eq!(text_of(&dom, "lookup-outpoint"), outpoint);
    assert_eq!(text_of(&dom, "lookup-spender"), spender);
    assert!(
        text_of(&dom, "lookup-spent-in").starts_with(&format!("{spent_height} ")),
        "{}",
        text_of(&dom, "lookup-spent-in")
    );
    let status = text_of(&dom, "lookup-status");
    assert!(
        status.starts_with("archived") || status.starts_with("spent_not_sealed"),
        "{status}"
    );
    assert!(!dom.contains("class=\"error\""), "an error is shown: {dom}");

    let shot_dir = common::tempdir();
    let shot = shot_dir.path().join("status.png");
    let (w, h) = (1000u32, 900u32);
    run_chromium(
        &[
            &format!("--screenshot={}", shot.display()),
            &format!("--window-size={w},{h}"),
        ],
        &url,
    );
    if let Ok(keep) = std::env::var("KAKEHI_KEEP_SCREENSHOT") {
        std::fs::copy(&shot, keep).expect("copy screenshot");
    }
    let report = png_report(&shot);
    assert_eq!(report["width"], w, "{report}");
    assert_eq!(report["height"], h, "{report}");
    assert!(
        report["distinct_colors"].as_u64().expect("colors") >= 16,
        "{report}"
    );
    assert!(
        report["non_background"].as_f64().expect("ratio") >= 0.02,
        "screenshot looks blank: {report}"
    );
}

/// One address of regtest-a as the test data imply it: unspent outputs
/// from `utxos.txt` (outpoint → sats), spent outputs from the best chain's
/// blocks in `blocks.dat` (`common::feed::Chain`: the leaves, with their
/// spender and spend height), and the transactions touching it.
struct AddressTruth {
    address: bitcoin::Address,
    utxos: std::collections::BTreeMap<String, u64>,
    spent: Vec<kakehi::archive::Leaf>,
    txs: std::collections::BTreeSet<bitcoin::Txid>,
}

/// The address with the most spent outputs among those with an unspent
/// output and at most 100 transactions (the page shows 4 pages of 25).
fn address_truth() -> AddressTruth {
    use std::collections::{BTreeMap, BTreeSet};
    let mut utxos: BTreeMap<bitcoin::ScriptBuf, BTreeMap<String, u64>> = BTreeMap::new();
    let f = std::fs::File::open(data("regtest-a/utxos.txt")).expect("utxos.txt");
    for l in std::io::BufReader::new(f).lines() {
        let l = l.expect("read");
        let f: Vec<&str> = l.split_whitespace().collect();
        let script = bitcoin::ScriptBuf::from_hex(f[2]).expect("script hex");
        let value: u64 = f[1].parse().expect("value");
        utxos
            .entry(script)
            .or_default()
            .insert(f[0].to_string(), value);
    }
    let chain = common::feed::Chain::load();
    let mut spent: BTreeMap<bitcoin::ScriptBuf, Vec<kakehi::archive::Leaf>> = BTreeMap::new();
    for leaf in chain.leaves_by_height.into_iter().flatten() {
        spent
            .entry(leaf.script_pubkey.clone())
            .or_default()
            .push(leaf);
    }
    let txs = |script: &bitcoin::ScriptBuf| -> BTreeSet<bitcoin::Txid> {
        let u = utxos[script]
            .keys()
            .map(|op| op[..64].parse().expect("txid"));
        let s = spent[script]
            .iter()
            .flat_map(|l| [l.outpoint.txid, l.spend.txid]);
        u.chain(s).collect()
    };
    let script = utxos
        .keys()
        .filter(|s| spent.contains_key(*s))
        .filter(|s| bitcoin::Address::from_script(s, Network::Regtest).is_ok())
        .filter(|s| txs(s).len() <= 100)
        .max_by_key(|s| (spent[*s].len(), (*s).clone()))
        .expect("an address with spent and unspent outputs")
        .clone();
    AddressTruth {
        address: bitcoin::Address::from_script(&script, Network::Regtest).expect("address"),
        txs: txs(&script),
        utxos: utxos.remove(&script).expect("utxos"),
        spent: spent.remove(&script).expect("spent"),
    }
}

/// The serialized `<table id="…">` of a dumped DOM, up to its end.
fn table_of<'a>(dom: &'a str, id: &str) -> &'a str {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no table #{id}"));
    let end = at + dom[at..].find("</table>").expect("table end");
    &dom[at..end]
}

/// The address lookup in headless Chromium (`/#address=…`): balance,
/// totals, unspent outputs, history and every spent output with its
/// spender equal what regtest-a's records imply; the batch proof on the
/// page verifies against the archive commitment and proves each output
/// spent in a sealed epoch archived in the right epoch with its value and
/// script, and each later one absent.
#[test]
fn status_page_address_lookup_shows_balance_history_utxos_and_spent_output_proofs() {
    let t = address_truth();
    check_address_lookup(&t, &t.address.to_string());
}

/// The same lookup by the address's script hash (Esplora's: SHA-256 of
/// the scriptPubKey, byte order), as for a script without an address: the
/// page takes `/scripthash/…` and finds the script's outputs by hashing
/// every scriptPubKey of the history.
#[test]
fn status_page_script_hash_lookup_equals_the_address_lookup() {
    use bitcoin::hashes::{sha256, Hash};
    let t = address_truth();
    let hash = sha256::Hash::hash(t.address.script_pubkey().as_bytes());
    check_address_lookup(
        &t,
        &bitcoin::hex::DisplayHex::to_lower_hex_string(&hash[..]),
    );
}

/// Loads `/#address=<query>` and checks the page against `t` (see the
/// tests above).
fn check_address_lookup(t: &AddressTruth, query: &str) {
    let n = node();
    let url = format!("http://{}/#address={query}", n.addr);
    let dom = run_chromium(&["--dump-dom"], &url);
    assert!(
        dom.contains("data-ready=\"yes\""),
        "page did not finish: {dom}"
    );
    assert!(!dom.contains("class=\"error\""), "an error is shown: {dom}");
    let balance: u64 = t.utxos.values().sum();
    assert_eq!(text_of(&dom, "addr-query"), query);
    assert_eq!(text_of(&dom, "addr-balance"), format!("{balance} sats"));
    assert_eq!(text_of(&dom, "addr-tx-count"), t.txs.len().to_string());
    let spent_sum: u64 = t.spent.iter().map(|l| l.value).sum();
    assert_eq!(
        text_of(&dom, "addr-spent"),
        format!("{spent_sum} sats in {} outputs", t.spent.len())
    );
    let rows = |table: &str| table.matches("<tr>").count() - 1;
    let utxo_table = table_of(&dom, "addr-utxos");
    assert_eq!(rows(utxo_table), t.utxos.len());
    for (op, value) in &t.utxos {
        assert!(
            utxo_table.contains(op) && utxo_table.contains(&format!("<td>{value}</td>")),
            "{op}"
        );
    }
    let history = table_of(&dom, "addr-history");
    assert_eq!(rows(history), t.txs.len());
    assert!(t.txs.iter().all(|txid| history.contains(&txid.to_string())));
    let spent_table = table_of(&dom, "addr-spent-outputs");
    assert_eq!(rows(spent_table), t.spent.len());

    let (_, body) = http_get(n.addr, "/archive/commitment");
    let c: serde_json::Value = serde_json::from_slice(&body).expect("commitment JSON");
    let last = c["last_height"].as_u64().expect("an epoch is sealed") as u32;
    let anchor: kakehi::archive::Anchor =
        serde_json::from_value(serde_json::json!({ "commitment": c["commitment"] }))
            .expect("anchor");
    let proof = text_of(&dom, "addr-proof");
    let verified = kakehi::archive::verify_json(proof, anchor).expect("the page's proof verifies");
    let (mut archived, mut absent) = (0, 0);
    for leaf in &t.spent {
        let spender = format!(
            "{}:{} (block {})",
            leaf.spend.txid, leaf.spend.vin, leaf.spend.height
        );
        assert!(spent_table.contains(&spender), "{spender}");
        match verified
            .status(&leaf.outpoint)
            .expect("the proof covers it")
        {
            kakehi::archive::VerifiedStatus::Spent { epoch, leaf: l, .. } => {
                assert!(leaf.spend.height <= last, "{}", leaf.outpoint);
                assert_eq!(*epoch, leaf.spend.height / common::feed::EPOCH_LENGTH);
                assert_eq!(l, leaf);
                let shown = format!("archived: epoch {epoch}, leaf ");
                assert!(spent_table.contains(&shown), "{shown}");
                archived += 1;
            }
            kakehi::archive::VerifiedStatus::Absent { .. } => {
                assert!(
                    leaf.spend.height > last,
                    "{} spent at {}",
                    leaf.outpoint,
                    leaf.spend.height
                );
                absent += 1;
            }
        }
    }
    assert!(archived > 0, "{archived} archived, {absent} absent");
}

/// Decodes a PNG with Python's standard library (zlib, CRCs, the five row
/// filters) and reports `{width, height, distinct_colors, non_background}`
/// (`non_background`: share of pixels unlike the most common colour).
fn png_report(path: &Path) -> serde_json::Value {
    const SCRIPT: &str = r#"
import json, struct, sys, zlib, collections
b = open(sys.argv[1], "rb").read()
assert b[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
pos, idat, ihdr = 8, [], None
while pos < len(b):
    n, = struct.unpack(">I", b[pos:pos+4]); kind = b[pos+4:pos+8]; body = b[pos+8:pos+8+n]
    crc, = struct.unpack(">I", b[pos+8+n:pos+12+n])
    assert zlib.crc32(kind + body) == crc, "bad CRC in " + kind.decode()
    if kind == b"IHDR": ihdr = struct.unpack(">IIBBBBB", body)
    if kind == b"IDAT": idat.append(body)
    pos += 12 + n
    if kind == b"IEND": break
w, h, depth, ctype, _, _, interlace = ihdr
assert depth == 8 and ctype in (2, 6) and interlace == 0, ihdr
bpp = 3 if ctype == 2 else 4
raw = zlib.decompress(b"".join(idat)); stride = w * bpp
prev = bytearray(stride); rows = []
for y in range(h):
    f = raw[y*(stride+1)]; line = bytearray(raw[y*(stride+1)+1:(y+1)*(stride+1)])
    if f == 1:
        for i in range(bpp, stride): line[i] = (line[i] + line[i-bpp]) & 255
    elif f == 2:
        line = bytearray((a + c) & 255 for a, c in zip(line, prev))
    elif f == 3:
        for i in range(stride): line[i] = (line[i] + ((line[i-bpp] if i >= bpp else 0) + prev[i]) // 2) & 255
    elif f == 4:
        for i in range(stride):
            a = line[i-bpp] if i >= bpp else 0; c = prev[i-bpp] if i >= bpp else 0; u = prev[i]
            p = a + u - c; pa, pb, pc = abs(p-a), abs(p-u), abs(p-c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else (u if pb <= pc else c))) & 255
    else:
        assert f == 0, "bad filter %d" % f
    rows.append(bytes(line)); prev = line
counts = collections.Counter()
for r in rows:
    for x in range(0, stride, bpp): counts[r[x:x+3]] += 1
bg = counts.most_common(1)[0][1]
print(json.dumps({"width": w, "height": h, "distinct_colors": len(counts), "non_background": 1 - bg / (w*h)}))
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(path)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "PNG check failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("PNG report JSON")
}

/// schemathesis configuration: dictionaries of real block hashes, txids and
/// outpoints from regtest-a (chain.json, spent.txt) that the fuzzer uses for
/// half of the path parameters of those names, so requests also reach the
/// found-it paths (200s whose bodies are checked against the schemas).
fn schemathesis_config() -> String {
    let chain = json("regtest-a/chain.json");
    let blocks = chain["blocks"].as_array().expect("blocks");
    let hashes: Vec<String> = blocks
        .iter()
        .step_by(97)
        .chain(
            blocks
                .iter()
                .filter(|b| b["on_best_chain"] == false)
                .take(3),
        )
        .map(|b| b["hash"].as_str().expect("hash").to_string())
        .collect();
    let f = std::fs::File::open(data("regtest-a/spent.txt")).expect("spent.txt");
    let lines: Vec<String> = std::io::BufReader::new(f)
        .lines()
        .step_by(5011)
        .map(|l| l.expect("read"))
        .collect();
    let mut txids = Vec::new();
    let mut vouts = Vec::new();
    for l in &lines {
        let mut it = l.split_whitespace();
        let (op, by) = (it.next().expect("outpoint"), it.next().expect("spender"));
        let (txid, vout) = op.split_once(':').expect("txid:vout");
        txids.push(txid.to_string());
        vouts.push(vout.to_string());
        txids.push(by.split_once(':').expect("txid:vin").0.to_string());
    }
    // Scripts of regtest-a's UTXOs: their addresses and script hashes.
    let f = std::fs::File::open(data("regtest-a/utxos.txt")).expect("utxos.txt");
    let mut addresses = Vec::new();
    let mut scripthashes = Vec::new();
    for l in std::io::BufReader::new(f).lines().step_by(997) {
        let l = l.expect("read");
        let script = l.split_whitespace().nth(2).expect("script");
        let script = bitcoin::ScriptBuf::from_hex(script).expect("hex");
        use bitcoin::hashes::Hash;
        scripthashes.push(bitcoin::hashes::sha256::Hash::hash(script.as_bytes()).to_string());
        if let Ok(a) = bitcoin::Address::from_script(&script, bitcoin::Network::Regtest) {
            addresses.push(a.to_string());
        }
    }
    let files: Vec<String> = hashes
        .iter()
        .zip(["json", "bin", "hex"].iter().cycle())
        .map(|(h, e)| format!("{h}.{e}"))
        .collect();
    let list = |v: &[String]| {
        v.iter()
            .map(|x| format!("\"{x}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "[dictionaries]\n\
         hashes = {{ values = [{}] }}\n\
         txids = {{ values = [{}] }}\n\
         vouts = {{ values = [{}] }}\n\
         files = {{ values = [{}] }}\n\
         addresses = {{ values = [{}] }}\n\
         scripthashes = {{ values = [{}] }}\n\
         starts = {{ values = [0, 25, 50] }}\n\
         [parameters]\n\
         \"path.hash\" = {{ dictionary = \"hashes\", probability = 0.5 }}\n\
         \"path.txid\" = {{ dictionary = \"txids\", probability = 0.5 }}\n\
         \"path.vout\" = {{ dictionary = \"vouts\", probability = 0.5 }}\n\
         \"path.file\" = {{ dictionary = \"files\", probability = 0.5 }}\n\
         \"path.address\" = {{ dictionary = \"addresses\", probability = 0.5 }}\n\
         \"path.scripthash\" = {{ dictionary = \"scripthashes\", probability = 0.5 }}\n\
         \"path.last_seen_txid\" = {{ dictionary = \"txids\", probability = 0.5 }}\n\
         \"path.start_index\" = {{ dictionary = \"starts\", probability = 0.5 }}\n",
        list(&hashes),
        list(&txids),
        vouts.join(", "),
        list(&files),
        list(&addresses),
        list(&scripthashes)
    )
}

/// schemathesis fuzzes every operation of `/openapi.json` against the live
/// node (bounded: 10 examples per operation, 45 s in all, fixed seed): no
/// 5xx, responses conform to the documented status codes, content types and
/// schemas.
#[test]
fn schemathesis_finds_no_server_error_and_no_schema_violation() {
    let n = node();
    let python = common::python::venv_python();
    let st = python.with_file_name("schemathesis");
    let report = common::tempdir();
    let config = report.path().join("schemathesis.toml");
    std::fs::write(&config, schemathesis_config()).expect("write config");
    let out = Command::new(&st)
        .arg("--config-file")
        .arg(&config)
        .arg("run")
        .arg(format!("http://{}/openapi.json", n.addr))
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
            "--max-examples",
            "10",
            "--max-time",
            "45",
            "--seed",
            "20261123",
            "--no-shrink",
            // One worker: Python 3.11's `ast.parse` (Hypothesis describing
            // its lambdas) is not thread-safe and errs under two.
            "--workers",
            "1",
            "--request-timeout",
            "10",
            "--phases",
            "examples,coverage,fuzzing",
            "--suppress-health-check",
            "all",
        ])
        .arg("--report-dir")
        .arg(report.path())
        .current_dir(report.path())
        .env("NO_COLOR", "1")
        .env("SCHEMATHESIS_TELEMETRY", "false")
        .output()
        .expect("run schemathesis");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "schemathesis failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // It really ran: operations were tested and passed.
    assert!(stdout.contains("passed"), "{stdout}");
}

/// `/metrics` carries the peers and the Sozu table statistics; the page's
/// own JSON route agrees with chain.json.
#[test]
fn metrics_show_peers_and_sozu_stats_and_node_status_matches_chain_json() {
    let n = node();
    let (st, body) = http_get(n.addr, "/metrics");
    assert_eq!(st, 200);
    let text = String::from_utf8_lossy(&body);
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
    };
    assert_eq!(value("kakehi_peers{direction=\"inbound\"}"), 1.0);
    assert_eq!(value("kakehi_peers{direction=\"outbound\"}"), 0.0);
    assert!(value("kakehi_sozu_bytes_on_disk") > 0.0);
    // The node's mempool, empty: its size and Core 30's minimum feerate.
    assert_eq!(value("kakehi_mempool_transactions"), 0.0);
    assert_eq!(value("kakehi_mempool_min_feerate_sat_per_kvb"), 100.0);
    assert!(value("kakehi_sozu_commits_total") >= 1.0);
    // Every live entry sits in some layer: at least the UTXOs at the tip
    // (spent entries not yet purged come on top).
    let utxo = json("regtest-a/utxo.json");
    let entries: f64 = text
        .lines()
        .filter(|l| l.starts_with("kakehi_sozu_layer_entries{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        entries >= utxo["txouts"].as_f64().expect("txouts"),
        "{entries}"
    );
    let fill = value("kakehi_sozu_layer_fill_ratio{layer=\"0\"}");
    assert!(fill > 0.0 && fill <= 1.0, "{fill}");

    let (st, body) = http_get(n.addr, "/node/status");
    assert_eq!(st, 200);
    let s: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    let chain = json("regtest-a/chain.json");
    assert_eq!(s["tip"]["height"], chain["tip_height"]);
    assert_eq!(s["tip"]["hash"], chain["tip_hash"]);
    let tip_time = chain["blocks"]
        .as_array()
        .expect("blocks")
        .iter()
        .find(|b| b["hash"] == chain["tip_hash"])
        .expect("tip block")["time"]
        .clone();
    assert_eq!(s["tip"]["time"], tip_time);
    assert_eq!(s["sync"], "synced");
    assert_eq!(s["peers"]["count"], 1);
    assert_eq!(s["mempool"]["count"], 0);
    assert_eq!(s["mempool"]["min_feerate"], 0.1);
    let (st, body) = http_get(n.addr, "/");
    assert_eq!(st, 200);
    assert!(String::from_utf8_lossy(&body).contains("id=\"lookup-form\""));
}
