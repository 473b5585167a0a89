//! The JSON-RPC server against `testnet-data/regtest-a` (a chain made and
//! validated by bcoin 2.2.0): every call's result checked against the
//! chain data, bitcoind's transport (JSON-RPC 1.0 and 2.0, batches, named
//! parameters, Core's error codes and HTTP statuses), and its
//! authentication (the cookie file, `rpcauth`, 401 after a pause); then
//! Bitcoin Core's own client, `AuthServiceProxy` (verystable's
//! `test_framework.authproxy`), against it.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bitcoin::consensus::encode::serialize_hex;
use bitcoin::hashes::{hmac, sha256, Hash, HashEngine};
use common::data;
use common::feed::Chain;
use serde_json::{json, Value};

struct Server {
    addr: SocketAddr,
    cookie_path: std::path::PathBuf,
    _cookie: kakehi::rpc::Cookie,
    _rpc: common::HttpServer,
    _dir: tempfile::TempDir,
}

/// The `rpcauth` user the server accepts, and its password.
const ALICE: (&str, &str) = ("alice", "correct horse battery staple");
/// Body limit and batch limit of the served node (small, to test them).
const MAX_BODY: usize = 64 * 1024;
const MAX_BATCH: usize = 50;

/// `rpcauth` entry for `user`/`password` with `salt`, as Core's
/// `share/rpcauth/rpcauth.py` prints it.
fn rpcauth(user: &str, password: &str, salt: &str) -> String {
    let mut e = hmac::HmacEngine::<sha256::Hash>::new(salt.as_bytes());
    e.input(password.as_bytes());
    format!(
        "{user}:{salt}${}",
        hmac::Hmac::<sha256::Hash>::from_engine(e)
    )
}

/// One node imported from regtest-a, its RPC served on 127.0.0.1:<ephemeral>.
fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let (dir, state) = common::regtest_a_state();
        let cookie = kakehi::rpc::Cookie::write(dir.path()).expect("cookie");
        let mut credentials = kakehi::rpc::Credentials::default();
        credentials.add_plain(kakehi::rpc::COOKIE_USER, cookie.password());
        credentials
            .add_rpcauth(&rpcauth(ALICE.0, ALICE.1, "c0ffee0123456789abcdef"))
            .expect("rpcauth");
        let config = kakehi::rpc::RpcConfig {
            credentials,
            max_body_bytes: MAX_BODY,
            max_batch: MAX_BATCH,
            ..Default::default()
        };
        let rpc = common::spawn_rpc(state, config);
        Server {
            addr: rpc.addr,
            cookie_path: cookie.path().to_path_buf(),
            _cookie: cookie,
            _rpc: rpc,
            _dir: dir,
        }
    })
}

fn chain() -> &'static Chain {
    static CHAIN: OnceLock<Chain> = OnceLock::new();
    CHAIN.get_or_init(Chain::load)
}

fn chain_json() -> &'static Value {
    static META: OnceLock<Value> = OnceLock::new();
    META.get_or_init(|| {
        serde_json::from_slice(&std::fs::read(data("regtest-a/chain.json")).expect("chain.json"))
            .expect("json")
    })
}

/// The cookie file's `user:password`.
fn cookie() -> String {
    std::fs::read_to_string(&server().cookie_path).expect("read cookie")
}

/// Raw POST / with `auth` (`user:password`, or `None` for no header):
/// (status, head, body).
fn post(auth: Option<&str>, body: &[u8]) -> (u16, String, Vec<u8>) {
    let auth = auth
        .map(|a| format!("Authorization: {}\r\n", kakehi::rpc::basic_authorization(a)))
        .unwrap_or_default();
    let extra = format!("{auth}Content-Type: application/json\r\n");
    common::raw_request(server().addr, "POST", "/", &extra, body)
}

/// A JSON body posted with the cookie: (status, parsed reply).
fn raw(body: &Value) -> (u16, Value) {
    let (st, _, b) = post(Some(&cookie()), body.to_string().as_bytes());
    let v = serde_json::from_slice(&b).unwrap_or_else(|e| {
        panic!(
            "reply to {body} is not JSON ({e}): {:?}",
            String::from_utf8_lossy(&b)
        )
    });
    (st, v)
}

/// A JSON-RPC 1.0 call that must succeed: its result.
fn call(method: &str, params: Value) -> Value {
    let (st, v) = raw(&json!({"id": 1, "method": method, "params": params}));
    assert_eq!(st, 200, "{method} {params}: {v}");
    assert_eq!(v["error"], Value::Null, "{method} {params}: {v}");
    v["result"].clone()
}

/// A JSON-RPC 1.0 call that must fail: (HTTP status, code, message).
fn call_err(method: &str, params: Value) -> (u16, i64, String) {
    let (st, v) = raw(&json!({"id": 1, "method": method, "params": params}));
    assert_eq!(v["result"], Value::Null, "{method}: {v}");
    (
        st,
        v["error"]["code"].as_i64().expect("code"),
        v["error"]["message"].as_str().expect("message").to_string(),
    )
}

#[test]
fn cookie_and_rpcauth_authenticate_and_wrong_credentials_get_401_after_a_pause() {
    let c = cookie();
    let (user, pass) = c.split_once(':').expect("user:password");
    assert_eq!(user, "__cookie__");
    assert_eq!(pass.len(), 64);
    assert!(pass.bytes().all(|b| b.is_ascii_hexdigit()), "{pass}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&server().cookie_path)
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let body = json!({"id": 7, "method": "getblockcount"}).to_string();
    for auth in [c.clone(), format!("{}:{}", ALICE.0, ALICE.1)] {
        let (st, _, b) = post(Some(&auth), body.as_bytes());
        assert_eq!(st, 200, "{auth}");
        let v: Value = serde_json::from_slice(&b).expect("json");
        assert_eq!(v, json!({"result": 1500, "error": null, "id": 7}));
    }
    // No header: 401 at once, with Core's challenge.
    let (st, head, _) = post(None, body.as_bytes());
    assert_eq!(st, 401);
    assert!(
        head.to_ascii_lowercase()
            .contains("www-authenticate: basic realm=\"jsonrpc\""),
        "{head}"
    );
    // Wrong password, wrong user, a cookie password with another user: 401
    // after Core's 250 ms.
    for bad in [
        format!("__cookie__:{}", "0".repeat(64)),
        format!("{}:wrong", ALICE.0),
        format!("bob:{}", ALICE.1),
        format!("alice:{pass}"),
    ] {
        let t = Instant::now();
        let (st, _, _) = post(Some(&bad), body.as_bytes());
        assert_eq!(st, 401, "{bad}");
        assert!(
            t.elapsed() >= Duration::from_millis(250),
            "{bad}: {:?}",
            t.elapsed()
        );
    }
}

#[test]
fn chain_calls_match_chain_json_and_the_blocks() {
    let c = chain();
    let meta = chain_json();
    let tip_hash = meta["tip_hash"].as_str().expect("tip");
    assert_eq!(call("getblockcount", json!([])), json!(1500));
    assert_eq!(call("getbestblockhash", json!([])), json!(tip_hash));
    let info = call("getblockchaininfo", json!([]));
    assert_eq!(info["chain"], "regtest");
    assert_eq!(info["blocks"], 1500);
    assert_eq!(info["bestblockhash"], tip_hash);
    assert_eq!(info["initialblockdownload"], false);
    assert_eq!(info["time"], json!(c.blocks[1499].header.time));
    let tip_difficulty = c.blocks[1499].header.difficulty_float();
    assert_eq!(
        call("getdifficulty", json!([])).as_f64(),
        Some(tip_difficulty)
    );

    assert_eq!(
        call("getblockhash", json!([0])),
        json!(meta["genesis"].as_str().expect("genesis"))
    );
    for h in [1usize, 2, 101, 750, 1499, 1500] {
        let b = &c.blocks[h - 1];
        let hash = b.block_hash().to_string();
        assert_eq!(call("getblockhash", json!([h])), json!(hash));
        // Named parameters give the same.
        let (st, v) = raw(
            &json!({"jsonrpc": "2.0", "id": "n", "method": "getblockhash", "params": {"height": h}}),
        );
        assert_eq!((st, &v["result"]), (200, &json!(hash)));

        let hdr = call("getblockheader", json!([hash]));
        assert_eq!(hdr["hash"], hash);
        assert_eq!(hdr["height"], h);
        assert_eq!(hdr["confirmations"], 1500 - h + 1);
        assert_eq!(hdr["merkleroot"], b.header.merkle_root.to_string());
        assert_eq!(
            hdr["previousblockhash"],
            b.header.prev_blockhash.to_string()
        );
        assert_eq!(hdr["time"], b.header.time);
        assert_eq!(hdr["nonce"], b.header.nonce);
        assert_eq!(hdr["bits"], format!("{:08x}", b.header.bits.to_consensus()));
        if h < 1500 {
            assert_eq!(hdr["nextblockhash"], c.blocks[h].block_hash().to_string());
        } else {
            assert!(hdr.get("nextblockhash").is_none());
        }
        assert_eq!(
            call("getblockheader", json!([hash, false])),
            json!(serialize_hex(&b.header))
        );

        assert_eq!(call("getblock", json!([hash, 0])), json!(serialize_hex(b)));
        let v1 = call("getblock", json!([hash]));
        let m = meta["blocks"]
            .as_array()
            .expect("blocks")
            .iter()
            .find(|m| m["hash"] == hash)
            .expect("meta");
        assert_eq!(v1["size"], m["size"]);
        assert_eq!(v1["weight"], m["weight"]);
        assert_eq!(v1["nTx"], m["tx_count"]);
        let txids: Vec<Value> = c.txids[h - 1]
            .iter()
            .map(|t| json!(t.to_string()))
            .collect();
        assert_eq!(v1["tx"], Value::Array(txids));
        // Verbosity as a bool (Core's ParseVerbosity): true is 1.
        assert_eq!(call("getblock", json!([hash, true])), v1);
        let v2 = call("getblock", json!({"blockhash": hash, "verbosity": 2}));
        let txs = v2["tx"].as_array().expect("tx");
        assert_eq!(txs.len(), b.txdata.len());
        for (t, tx) in txs.iter().zip(&b.txdata) {
            assert_eq!(t["txid"], tx.compute_txid().to_string());
            assert_eq!(t["hex"], serialize_hex(tx));
        }
    }
    // getblock 2's fee: the spent outputs (spent.txt's leaves) minus the
    // outputs, for every spending transaction of the chain's first blocks
    // with one.
    let mut checked = 0;
    for (i, b) in c.blocks.iter().enumerate().take(400) {
        let leaves = &c.leaves_by_height[i + 1];
        if leaves.is_empty() {
            continue;
        }
        let v2 = call("getblock", json!([b.block_hash().to_string(), 2]));
        for (t, tx) in v2["tx"]
            .as_array()
            .expect("tx")
            .iter()
            .zip(&b.txdata)
            .skip(1)
        {
            let txid = tx.compute_txid();
            let input: u64 = leaves
                .iter()
                .filter(|l| l.spend.txid == txid)
                .map(|l| l.value)
                .sum();
            let output: u64 = tx.output.iter().map(|o| o.value.to_sat()).sum();
            let fee = t["fee"].as_f64().expect("fee");
            assert!(
                (fee - (input - output) as f64 / 1e8).abs() < 1e-9,
                "{txid}: {fee}"
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "no spending transaction checked");

    // getchaintips: every block no other block builds on, with its branch.
    let blocks = meta["blocks"].as_array().expect("blocks");
    let parents: HashSet<&str> = blocks
        .iter()
        .filter_map(|m| m["prev_hash"].as_str())
        .collect();
    let by_hash: HashMap<&str, &Value> = blocks
        .iter()
        .map(|m| (m["hash"].as_str().expect("hash"), m))
        .collect();
    let mut want: Vec<(String, u64, u64, &str)> = Vec::new();
    for m in blocks {
        let hash = m["hash"].as_str().expect("hash");
        if parents.contains(hash) {
            continue;
        }
        let mut fork = m;
        while fork["on_best_chain"] != true {
            fork = by_hash[fork["prev_hash"].as_str().expect("prev")];
        }
        let height = m["height"].as_u64().expect("height");
        let status = if hash == tip_hash {
            "active"
        } else {
            "valid-fork"
        };
        want.push((
            hash.into(),
            height,
            height - fork["height"].as_u64().expect("h"),
            status,
        ));
    }
    want.sort();
    let mut got: Vec<(String, u64, u64, &str)> = call("getchaintips", json!([]))
        .as_array()
        .expect("tips")
        .iter()
        .map(|t| {
            (
                t["hash"].as_str().expect("hash").to_string(),
                t["height"].as_u64().expect("height"),
                t["branchlen"].as_u64().expect("branchlen"),
                match t["status"].as_str().expect("status") {
                    "active" => "active",
                    "valid-fork" => "valid-fork",
                    other => panic!("status {other}"),
                },
            )
        })
        .collect();
    got.sort();
    assert!(want.len() > 1, "regtest-a has stale branches");
    assert_eq!(got, want);
}

#[test]
fn getrawtransaction_finds_confirmed_transactions_through_the_txid_index() {
    let c = chain();
    for h in [1usize, 150, 1000, 1500] {
        let b = &c.blocks[h - 1];
        let tx = b.txdata.last().expect("tx");
        let txid = tx.compute_txid().to_string();
        assert_eq!(
            call("getrawtransaction", json!([txid])),
            json!(serialize_hex(tx))
        );
        let v = call("getrawtransaction", json!([txid, true]));
        assert_eq!(v["txid"], txid);
        assert_eq!(v["hex"], serialize_hex(tx));
        assert_eq!(v["blockhash"], b.block_hash().to_string());
        assert_eq!(v["confirmations"], 1500 - h + 1);
        assert_eq!(v["blocktime"], b.header.time);
        assert!(v.get("in_active_chain").is_none());
        let v = call(
            "getrawtransaction",
            json!({"txid": txid, "verbosity": 1, "blockhash": b.block_hash().to_string()}),
        );
        assert_eq!(v["in_active_chain"], true);
        assert_eq!(v["txid"], txid);
    }
    let coinbase = c.blocks[9].txdata[0].compute_txid().to_string();
    let other_block = c.blocks[10].block_hash().to_string();
    let (st, code, msg) = call_err("getrawtransaction", json!([coinbase, 1, other_block]));
    assert_eq!((st, code), (500, -5));
    assert!(
        msg.starts_with("No such transaction found in the provided block"),
        "{msg}"
    );
    let (st, code, msg) = call_err("getrawtransaction", json!(["11".repeat(32)]));
    assert_eq!((st, code), (500, -5));
    assert!(
        msg.starts_with("No such mempool or blockchain transaction"),
        "{msg}"
    );
    let (_, code, msg) = call_err(
        "getrawtransaction",
        json!(["11".repeat(32), 0, "22".repeat(32)]),
    );
    assert_eq!((code, msg.as_str()), (-5, "Block hash not found"));
}

#[test]
fn mempool_and_control_calls() {
    let info = call("getmempoolinfo", json!([]));
    assert_eq!(info["loaded"], true);
    assert_eq!(info["size"], 0);
    assert_eq!(info["minrelaytxfee"].as_f64(), Some(0.000_001));
    assert_eq!(call("getrawmempool", json!([])), json!([]));
    assert_eq!(call("getrawmempool", json!([true])), json!({}));
    assert_eq!(
        call("getrawmempool", json!([false, true])),
        json!({"txids": [], "mempool_sequence": 0})
    );
    let (_, code, msg) = call_err("getmempoolentry", json!(["33".repeat(32)]));
    assert_eq!((code, msg.as_str()), (-5, "Transaction not in mempool"));
    // A transaction already confirmed: Core's "already in the chain" error.
    let tx = &chain().blocks[200].txdata[0];
    let (_, code, _) = call_err("sendrawtransaction", json!([serialize_hex(tx)]));
    assert!(code == -27 || code == -25 || code == -26, "{code}");
    let (_, code, _) = call_err("sendrawtransaction", json!(["00zz"]));
    assert_eq!(code, -22);
    assert!(call("uptime", json!([])).as_u64().is_some());
    let (_, code, _) = call_err("getconnectioncount", json!([]));
    assert_eq!(code, -9, "no P2P here");
    let help = call("help", json!([]));
    let help = help.as_str().expect("help text");
    for (m, _, _) in kakehi::rpc::METHODS {
        assert!(
            help.lines().any(|l| l.split(' ').next() == Some(*m)),
            "{m} not in help"
        );
    }
    assert_eq!(
        call("help", json!(["getblockhash"])),
        json!("getblockhash \"height\"")
    );
}

#[test]
fn transport_batches_versions_errors_and_limits() {
    // Batch: replies in order, each with its id; a bad member gets its own
    // error, the rest still run.
    let (st, v) = raw(&json!([
        {"id": 1, "method": "getblockcount"},
        {"jsonrpc": "2.0", "id": "b", "method": "getblockhash", "params": [1]},
        {"id": 3, "method": "nosuchcall"},
        42,
        {"jsonrpc": "2.0", "method": "getblockcount"},
    ]));
    assert_eq!(st, 200);
    let v = v.as_array().expect("array");
    assert_eq!(v.len(), 4, "the 2.0 notification has no reply: {v:?}");
    assert_eq!(v[0], json!({"result": 1500, "error": null, "id": 1}));
    assert_eq!(
        v[1],
        json!({"jsonrpc": "2.0", "result": chain().blocks[0].block_hash().to_string(), "id": "b"})
    );
    assert_eq!(v[2]["error"]["code"], -32601);
    assert_eq!(v[2]["id"], 3);
    assert_eq!(v[3]["error"]["code"], -32600);

    // Core's statuses: 1.0 errors 500, method not found 404, invalid
    // request 400; 2.0 errors 200 without a result field.
    assert_eq!(call_err("nosuchcall", json!([])).0, 404);
    let (st, v) = raw(&json!({"jsonrpc": "2.0", "id": 1, "method": "nosuchcall"}));
    assert_eq!(st, 200);
    assert_eq!(
        v,
        json!({"jsonrpc": "2.0", "error": {"code": -32601, "message": "Method not found"}, "id": 1})
    );
    let (st, v) = raw(&json!({"id": 1, "method": 5}));
    assert_eq!((st, &v["error"]["code"]), (400, &json!(-32600)));
    let (st, v) = raw(&json!({"jsonrpc": "3.0", "id": 1, "method": "getblockcount"}));
    assert_eq!((st, &v["error"]["code"]), (400, &json!(-32600)));
    let (st, _, b) = post(Some(&cookie()), b"{\"id\": 1, \"method\": ");
    let v: Value = serde_json::from_slice(&b).expect("json");
    assert_eq!((st, &v["error"]["code"]), (500, &json!(-32700)));
    let (st, v) = raw(&json!("getblockcount"));
    assert_eq!((st, &v["error"]["code"]), (500, &json!(-32700)));
    let (st, _, b) = post(
        Some(&cookie()),
        json!({"jsonrpc": "2.0", "method": "getblockcount"})
            .to_string()
            .as_bytes(),
    );
    assert_eq!((st, b.len()), (204, 0), "a 2.0 notification gets no body");

    // Parameters: Core's codes for a wrong type, a bad hash, a height out
    // of range, an unknown named parameter, too many.
    assert_eq!(call_err("getblockhash", json!(["1"])).1, -3);
    assert_eq!(
        call_err("getblockhash", json!([1501])),
        (500, -8, "Block height out of range".into())
    );
    assert_eq!(call_err("getblockhash", json!([-1])).1, -8);
    assert_eq!(call_err("getblockhash", json!([])).1, -1);
    assert_eq!(call_err("getblockhash", json!({"heigth": 1})).1, -8);
    assert_eq!(call_err("getblockcount", json!([1])).1, -1);
    let (_, code, msg) = call_err("getblock", json!(["abcd"]));
    assert_eq!(code, -8);
    assert!(msg.contains("must be of length 64"), "{msg}");
    assert_eq!(call_err("getblock", json!(["zz".repeat(32)])).1, -8);
    assert_eq!(
        call_err("getblockheader", json!(["00".repeat(32)])),
        (500, -5, "Block not found".into())
    );

    // Limits: a body over the limit gets 413, a batch over the limit is
    // refused whole.
    let big = format!(
        "[{}]",
        vec!["{\"id\":1,\"method\":\"getblockcount\"}"; 2000].join(",")
    );
    assert!(big.len() > MAX_BODY);
    assert_eq!(post(Some(&cookie()), big.as_bytes()).0, 413);
    let batch: Vec<Value> = (0..=MAX_BATCH)
        .map(|i| json!({"id": i, "method": "getblockcount"}))
        .collect();
    let (st, v) = raw(&Value::Array(batch));
    assert_eq!((st, &v["error"]["code"]), (400, &json!(-32600)));
    let batch: Vec<Value> = (0..MAX_BATCH)
        .map(|i| json!({"id": i, "method": "getblockcount"}))
        .collect();
    let (st, v) = raw(&Value::Array(batch));
    assert_eq!((st, v.as_array().map(Vec::len)), (200, Some(MAX_BATCH)));
}

#[test]
fn core_authserviceproxy_drives_the_calls() {
    let python = common::python::venv_python();
    let s = server();
    let args: Vec<std::ffi::OsString> = vec![
        "--port".into(),
        s.addr.port().to_string().into(),
        "--cookie".into(),
        s.cookie_path.clone().into(),
        "--data".into(),
        data("regtest-a").into(),
        "--user".into(),
        format!("{}:{}", ALICE.0, ALICE.1).into(),
    ];
    let out = common::python::run_script(&python, "rpc_core.py", &args, Duration::from_secs(240))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(out.contains("ok:"), "{out}");
}
