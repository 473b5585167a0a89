//! The HTTP API against `testnet-data/regtest-a` (a chain made and validated
//! by bcoin 2.2.0): BDK's `esplora-client` calls every Esplora-compatible
//! endpoint and must get what the chain data says; the Core-compatible
//! filter routes must return `filters.json` exactly; bad input must get a
//! JSON 4xx, never a 5xx.

use crate::common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::OnceLock;

use bitcoin::hashes::Hash;
use bitcoin::{BlockHash, Network, Txid};
use common::feed::{spent_lines, Chain};
use common::{data, json};
use esplora_client::BlockingClient;
use kakehi::http::AppState;

struct Server {
    addr: SocketAddr,
    state: AppState,
    _http: common::HttpServer,
    _dir: tempfile::TempDir,
}

/// One node imported from regtest-a and served on 127.0.0.1:<ephemeral>.
fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let (dir, state) = common::regtest_a_state();
        let http = common::spawn_http(state.clone(), config());
        Server {
            addr: http.addr,
            state,
            _http: http,
            _dir: dir,
        }
    })
}

/// The served limits: defaults, small enough to test, and CORS for one origin.
fn config() -> kakehi::http::HttpConfig {
    kakehi::http::HttpConfig {
        header_read_timeout: std::time::Duration::from_secs(1),
        cors_allowed_origins: vec!["https://wallet.example".into()],
        ..Default::default()
    }
}

fn chain() -> &'static Chain {
    static CHAIN: OnceLock<Chain> = OnceLock::new();
    CHAIN.get_or_init(Chain::load)
}

fn client() -> BlockingClient {
    esplora_client::Builder::new(&format!("http://{}", server().addr)).build_blocking()
}

/// Raw GET: (status, content type, body).
fn get(path: &str) -> (u16, String, Vec<u8>) {
    request("GET", path, &[])
}

fn request(method: &str, path: &str, body: &[u8]) -> (u16, String, Vec<u8>) {
    let (st, head, body) = request_h(method, path, "", body);
    let ctype = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    (st, ctype, body)
}

/// Raw request with extra header lines (`"Name: value\r\n"`): (status, head, body).
fn request_h(method: &str, path: &str, extra: &str, body: &[u8]) -> (u16, String, Vec<u8>) {
    common::raw_request(server().addr, method, path, extra, body)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// MuHash3072 of regtest-a's UTXO set (`utxos.txt`) by Bitcoin Core's Python
/// implementation (`tests/python/muhash_utxos.py`, verystable 28.1), as Core's
/// `gettxoutsetinfo muhash` prints it.
const REGTEST_A_MUHASH: &str = "7621cdc59b72640b7aa9d97d201aacf13027922448df03c13471c64abafe26d0";

#[test]
fn utxo_stats_serves_the_reference_summary_and_muhash() {
    let (st, ctype, body) = get("/utxo/stats");
    assert_eq!(st, 200);
    assert!(ctype.starts_with("application/json"), "{ctype}");
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let reference = json("regtest-a/utxo.json");
    assert_eq!(v["txouts"], reference["txouts"]);
    assert_eq!(v["total_amount_sats"], reference["total_amount_sats"]);
    assert_eq!(v["bestblock"], reference["bestblock"]);
    assert_eq!(v["muhash"], REGTEST_A_MUHASH);
}

/// Sample heights spread over the chain (coinbase-only and busy blocks).
const SAMPLE_HEIGHTS: [u32; 8] = [1, 100, 101, 432, 777, 1200, 1499, 1500];

#[test]
fn tip_blocks_and_block_summaries_match_chain_json() {
    let c = client();
    let meta = json("regtest-a/chain.json");
    assert_eq!(
        u64::from(c.get_height().unwrap()),
        meta["tip_height"].as_u64().unwrap()
    );
    assert_eq!(
        c.get_tip_hash().unwrap().to_string(),
        meta["tip_hash"].as_str().unwrap()
    );
    let best: HashMap<u64, &serde_json::Value> = meta["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["on_best_chain"].as_bool() == Some(true))
        .map(|b| (b["height"].as_u64().unwrap(), b))
        .collect();
    for h in SAMPLE_HEIGHTS {
        let m = best[&u64::from(h)];
        let hash: BlockHash = m["hash"].as_str().unwrap().parse().unwrap();
        assert_eq!(c.get_block_hash(h).unwrap(), hash);
        let info = c.get_block_info(&hash).unwrap();
        assert_eq!(info.id, hash);
        assert_eq!(u64::from(info.height), u64::from(h));
        assert_eq!(info.tx_count, m["tx_count"].as_u64().unwrap());
        assert_eq!(info.size as u64, m["size"].as_u64().unwrap());
        assert_eq!(info.weight.to_wu(), m["weight"].as_u64().unwrap());
        assert_eq!(info.timestamp, m["time"].as_u64().unwrap());
        assert_eq!(
            info.previousblockhash.unwrap().to_string(),
            m["prev_hash"].as_str().unwrap()
        );
        let block = &chain().blocks[h as usize - 1];
        assert_eq!(info.merkle_root, block.header.merkle_root);
        assert_eq!(info.bits, block.header.bits);
        assert_eq!(info.nonce, block.header.nonce);
        assert_eq!(c.get_header_by_hash(&hash).unwrap(), block.header);
        let st = c.get_block_status(&hash).unwrap();
        assert!(st.in_best_chain);
        assert_eq!(st.height, Some(h));
        let next = best
            .get(&(u64::from(h) + 1))
            .map(|n| n["hash"].as_str().unwrap().to_string());
        assert_eq!(st.next_best.map(|n| n.to_string()), next);
        // Whole block and txids.
        assert_eq!(c.get_block_by_hash(&hash).unwrap().as_ref(), Some(block));
        let txids: Vec<Txid> = block.txdata.iter().map(|t| t.compute_txid()).collect();
        assert_eq!(c.get_block_txids(&hash).unwrap(), txids);
        let last = txids.len() - 1;
        assert_eq!(
            c.get_txid_at_block_index(&hash, last).unwrap(),
            Some(txids[last])
        );
        assert_eq!(c.get_txid_at_block_index(&hash, last + 1).unwrap(), None);
    }
    // Pages of 10, newest first.
    let page = c.get_block_infos(None).unwrap();
    assert_eq!(page.len(), 10);
    assert_eq!(page[0].height, 1500);
    assert_eq!(page[9].height, 1491);
    let page = c.get_block_infos(Some(5)).unwrap();
    let heights: Vec<u32> = page.iter().map(|b| b.height).collect();
    assert_eq!(heights, vec![5, 4, 3, 2, 1, 0]);
    assert_eq!(page[5].previousblockhash, None);
    // A stale block: known, not in the best chain.
    let stale = meta["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["on_best_chain"].as_bool() == Some(false))
        .unwrap();
    let st = c
        .get_block_status(&stale["hash"].as_str().unwrap().parse().unwrap())
        .unwrap();
    assert!(!st.in_best_chain);
    assert_eq!(st.height, None);
}

#[test]
fn transactions_statuses_and_merkle_proofs_match_blocks_dat() {
    let c = client();
    for h in SAMPLE_HEIGHTS {
        let block = &chain().blocks[h as usize - 1];
        let hash = block.block_hash();
        // First, second and last transactions of the block.
        let n = block.txdata.len();
        for pos in [0, 1.min(n - 1), n - 1] {
            let tx = &block.txdata[pos];
            let txid = tx.compute_txid();
            assert_eq!(c.get_tx(&txid).unwrap().as_ref(), Some(tx));
            let info = c.get_tx_info(&txid).unwrap().expect("tx info");
            assert_eq!(info.txid, txid);
            assert_eq!(info.to_tx(), *tx);
            assert_eq!(info.weight, tx.weight());
            assert_eq!(info.size, tx.total_size());
            assert!(info.status.confirmed);
            assert_eq!(info.status.block_height, Some(h));
            assert_eq!(info.status.block_hash, Some(hash));
            assert_eq!(info.status.block_time, Some(u64::from(block.header.time)));
            // Fee = prevouts - outputs; prevouts match the spent outputs' creators.
            let out_sum: u64 = tx.output.iter().map(|o| o.value.to_sat()).sum();
            if tx.is_coinbase() {
                assert!(info.vin[0].is_coinbase && info.vin[0].prevout.is_none());
            } else {
                let mut in_sum = 0;
                for vin in &info.vin {
                    let p = vin.prevout.as_ref().expect("prevout");
                    let creator = c.get_tx(&vin.txid).unwrap().expect("creating tx");
                    let o = &creator.output[vin.vout as usize];
                    assert_eq!(p.value, o.value);
                    assert_eq!(p.scriptpubkey, o.script_pubkey);
                    in_sum += p.value.to_sat();
                }
                assert_eq!(info.fee.to_sat(), in_sum - out_sum);
            }
            assert_eq!(c.get_tx_status(&txid).unwrap(), info.status);
            // Merkle proof folds to the header's merkle root.
            let proof = c.get_merkle_proof(&txid).unwrap().expect("proof");
            assert_eq!(proof.block_height, h);
            assert_eq!(proof.pos, pos);
            let mut acc = txid.to_byte_array();
            let mut p = pos;
            for s in &proof.merkle {
                let mut buf = [0u8; 64];
                let (l, r) = if p % 2 == 0 {
                    (acc, s.to_byte_array())
                } else {
                    (s.to_byte_array(), acc)
                };
                buf[..32].copy_from_slice(&l);
                buf[32..].copy_from_slice(&r);
                acc = bitcoin::hashes::sha256d::Hash::hash(&buf).to_byte_array();
                p /= 2;
            }
            assert_eq!(
                acc,
                block.header.merkle_root.to_byte_array(),
                "height {h} pos {pos}"
            );
            let mb = c.get_merkle_block(&txid).unwrap().expect("merkleblock");
            assert_eq!(mb.header, block.header);
            let mut matches = Vec::new();
            let mut idx = Vec::new();
            assert_eq!(
                mb.txn.extract_matches(&mut matches, &mut idx).unwrap(),
                block.header.merkle_root
            );
            assert_eq!(matches, vec![txid]);
            assert_eq!(idx, vec![pos as u32]);
            // The hex form is the raw form.
            let (st, _, body) = get(&format!("/tx/{txid}/hex"));
            assert_eq!(st, 200);
            assert_eq!(
                String::from_utf8(body).unwrap(),
                hex(&bitcoin::consensus::serialize(tx))
            );
        }
    }
    // Unknown txid: 404 (None to the client).
    let unknown = Txid::from_byte_array([7; 32]);
    assert_eq!(c.get_tx_info(&unknown).unwrap(), None);
    assert_eq!(c.get_merkle_proof(&unknown).unwrap(), None);
}

/// `/block/:hash/txs[/:start_index]` pages, read through esplora-client, are
/// the block's transactions in order, 25 at a time, each the same JSON as
/// `/tx/:txid`; bad start indexes are electrs' 400 and 404.
#[test]
fn block_txs_pages_are_the_blocks_transactions_25_at_a_time() {
    let c = client();
    let mut paged = 0;
    for h in [1, 101, 169, 777] {
        let block = &chain().blocks[h as usize - 1];
        let hash = block.block_hash();
        let n = block.txdata.len();
        let mut got = Vec::new();
        for start in (0..n).step_by(25) {
            let page = c
                .get_block_txs(&hash, (start > 0).then_some(start as u32))
                .unwrap();
            assert_eq!(page.len(), (n - start).min(25), "height {h} start {start}");
            got.extend(page);
        }
        paged += usize::from(n > 25);
        let txs: Vec<_> = got.iter().map(|t| t.to_tx()).collect();
        assert_eq!(txs, block.txdata, "height {h}");
        for t in &got {
            assert_eq!(Some(t), c.get_tx_info(&t.txid).unwrap().as_ref());
        }
        let next = n.div_ceil(25) * 25;
        for (path, status) in [
            (format!("/block/{hash}/txs/{next}"), 404),
            (format!("/block/{hash}/txs/1"), 400),
            (format!("/block/{hash}/txs/-25"), 400),
            (format!("/block/{hash}/txs/x"), 400),
        ] {
            let (st, ct, body) = get(&path);
            assert_eq!((st, ct.as_str()), (status, "application/json"), "{path}");
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["code"], status, "{path}: {v}");
            assert!(v["message"].is_string(), "{path}: {v}");
        }
    }
    assert!(paged >= 1, "no sampled block spans two pages");
    let unknown = bitcoin::BlockHash::from_byte_array([7; 32]);
    assert_eq!(get(&format!("/block/{unknown}/txs")).0, 404);
}

#[test]
fn outspends_match_spent_txt_for_a_sample() {
    let c = client();
    let spent = spent_lines();
    let tip = 1500;
    let mut checked_with_spender = 0;
    // Every 37th spent output (spends at every depth, including those the
    // UTXO table purged): the spender from spent.txt.
    for (op, by, vin, height) in spent.iter().step_by(37) {
        let st = c
            .get_output_status(&op.txid, u64::from(op.vout))
            .unwrap()
            .expect("status");
        assert!(st.spent, "{op} is spent at {height}");
        assert_eq!(st.txid, Some(*by), "{op}");
        assert_eq!(st.vin, Some(u64::from(*vin)), "{op}");
        let status = st.status.expect("spender status");
        assert_eq!(status.block_height, Some(*height), "{op}");
        assert_eq!(
            status.block_hash,
            Some(chain().blocks[*height as usize - 1].block_hash())
        );
        checked_with_spender += 1;
    }
    assert!(spent.iter().step_by(37).any(|s| s.3 + 100 <= tip));
    assert!(spent.iter().step_by(37).any(|s| s.3 + 100 > tip));
    assert!(checked_with_spender >= 2000, "{checked_with_spender}");
    // Unspent outputs (utxos.txt) are reported unspent, in bulk via /outspends.
    let utxos = common::feed::utxo_lines();
    for (op, _) in utxos.iter().step_by(500) {
        let all = c.get_tx_outspends(&op.txid).unwrap();
        assert!(!all[op.vout as usize].spent, "{op} is unspent");
    }
}

#[test]
fn core_filter_routes_return_filters_json_in_all_formats() {
    let filters = json("regtest-a/filters.json");
    for f in filters.as_array().unwrap().iter().step_by(50) {
        let hash = f["hash"].as_str().unwrap();
        let filter = f["basic_filter"].as_str().unwrap();
        let fh = f["filter_header"].as_str().unwrap();
        let (st, _, body) = get(&format!("/rest/blockfilter/basic/{hash}.json"));
        assert_eq!(st, 200);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["filter"].as_str().unwrap(), filter);
        let (st, _, bin) = get(&format!("/rest/blockfilter/basic/{hash}.bin"));
        assert_eq!(st, 200);
        let h: BlockHash = hash.parse().unwrap();
        assert_eq!(bin[0], 0);
        assert_eq!(&bin[1..33], h.as_byte_array());
        // (served from the filter cache after the .json fetch)
        let want: Vec<u8> = bitcoin::consensus::encode::deserialize_hex::<Vec<u8>>(&format!(
            "{}{filter}",
            bitcoin::consensus::encode::serialize_hex(&bitcoin::VarInt(filter.len() as u64 / 2))
        ))
        .unwrap();
        assert_eq!(
            bitcoin::consensus::encode::serialize(&want),
            bin[33..].to_vec()
        );
        let (_, _, hx) = get(&format!("/rest/blockfilter/basic/{hash}.hex"));
        assert_eq!(String::from_utf8(hx).unwrap(), format!("{}\n", hex(&bin)));
        let (st, _, body) = get(&format!(
            "/rest/blockfilterheaders/basic/{hash}.json?count=1"
        ));
        assert_eq!(st, 200);
        let v: Vec<String> = serde_json::from_slice(&body).unwrap();
        assert_eq!(v, vec![fh.to_string()]);
        let (_, _, bin) = get(&format!("/rest/blockfilterheaders/basic/1/{hash}.bin"));
        let fh_hash: bitcoin::bip158::FilterHeader = fh.parse().unwrap();
        assert_eq!(bin, fh_hash.as_byte_array().to_vec());
    }
}

#[test]
fn bad_input_gets_json_4xx_never_5xx() {
    let genesis = "0f9188f13cb7b2c71f2a335e3a4fc328bf5beb436012afca590b1a11466e2206";
    let zeros = "0".repeat(64);
    let cases: Vec<(String, u16)> = vec![
        ("/block/xyz".into(), 400),
        (format!("/block/{}", "g".repeat(64)), 400),
        (format!("/block/{zeros}"), 404),
        (format!("/block/{zeros}/status"), 404),
        (format!("/block/{genesis}/txid/1"), 404),
        (format!("/block/{genesis}/txid/-1"), 400),
        (format!("/block/{genesis}/txid/99999999999"), 400),
        ("/blocks/1501".into(), 404),
        ("/blocks/abc".into(), 400),
        ("/block-height/4294967296".into(), 400),
        ("/block-height/1501".into(), 404),
        ("/tx/abc".into(), 400),
        (format!("/tx/{zeros}"), 404),
        (format!("/tx/{zeros}/outspend/0"), 404),
        (format!("/tx/{zeros}/outspend/x"), 400),
        (format!("/tx/{zeros}/merkle-proof"), 404),
        (format!("/rest/blockfilter/basic/{genesis}.xml"), 400),
        (format!("/rest/blockfilter/basic/{genesis}"), 400),
        (
            format!("/rest/blockfilterheaders/basic/{genesis}.json?count=0"),
            400,
        ),
        (
            format!("/rest/blockfilterheaders/basic/{genesis}.json?count=2001"),
            400,
        ),
        (
            format!("/rest/blockfilterheaders/basic/x/{genesis}.json"),
            400,
        ),
        ("/nope".into(), 404),
    ];
    for (path, want) in cases {
        let (st, ctype, body) = get(&path);
        assert_eq!(st, want, "{path}: {}", String::from_utf8_lossy(&body));
        assert!(ctype.starts_with("application/json"), "{path}: {ctype}");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["code"].as_u64(), Some(u64::from(want)), "{path}");
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    // An out-of-range vout on a real transaction.
    let txid = chain().blocks[200].txdata[0].compute_txid();
    let (st, _, _) = get(&format!("/tx/{txid}/outspend/1000"));
    assert_eq!(st, 404);
}

#[test]
fn post_tx_goes_through_mempool_acceptance_with_bitcoinds_errors() {
    // A confirmed transaction: outputs still unspent give Core's -27, all
    // spent its missing inputs (-25), as sendrawtransaction answers.
    for tx in [
        &chain().blocks[300].txdata[1],
        &chain().blocks[1400].txdata[1],
    ] {
        let txid = tx.compute_txid();
        let hexed = hex(&bitcoin::consensus::serialize(tx));
        let (_, _, outspends) = get(&format!("/tx/{txid}/outspends"));
        let outspends: serde_json::Value = serde_json::from_slice(&outspends).unwrap();
        let unspent = outspends
            .as_array()
            .unwrap()
            .iter()
            .zip(&tx.output)
            .any(|(o, out)| o["spent"] == false && !out.script_pubkey.is_op_return());
        let (st, _, body) = request("POST", "/tx", hexed.as_bytes());
        assert_eq!(st, 400);
        let want = if unspent {
            r#"sendrawtransaction RPC error: {"code":-27,"message":"Transaction outputs already in utxo set"}"#
        } else {
            r#"sendrawtransaction RPC error: {"code":-25,"message":"bad-txns-inputs-missingorspent"}"#
        };
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["message"], want, "{txid}");
    }
    // A coinbase: Core's "coinbase" (-26).
    let cb = hex(&bitcoin::consensus::serialize(
        &chain().blocks[300].txdata[0],
    ));
    let (st, _, body) = request("POST", "/tx", cb.as_bytes());
    assert_eq!(st, 400);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        v["message"],
        r#"sendrawtransaction RPC error: {"code":-26,"message":"coinbase"}"#
    );
    // Bodies that are not a transaction: the API's JSON errors.
    let (st, _, _) = request("POST", "/tx", b"zz");
    assert_eq!(st, 400);
    let (st, _, _) = request("POST", "/tx", b"0100");
    assert_eq!(st, 400);
    // Nothing entered the mempool.
    let (_, _, body) = get("/mempool");
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["count"], 0);
    assert_eq!(v["fee_histogram"], serde_json::json!([]));
    let (_, _, body) = get("/rest/mempool/info.json");
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["size"], 0);
    assert_eq!(v["minrelaytxfee"], 0.000001);
    assert_eq!(v["maxmempool"], 300u64 << 20);
}

#[test]
fn core_rest_headers_blocks_and_chaininfo_match_the_chain() {
    let blocks = &chain().blocks;
    let h100 = blocks[99].block_hash();
    let (st, _, bin) = get(&format!("/rest/headers/{h100}.bin?count=7"));
    assert_eq!(st, 200);
    let want: Vec<u8> = blocks[99..106]
        .iter()
        .flat_map(|b| bitcoin::consensus::serialize(&b.header))
        .collect();
    assert_eq!(bin, want);
    let (_, _, hx) = get(&format!("/rest/headers/7/{h100}.hex"));
    assert_eq!(String::from_utf8(hx).unwrap(), format!("{}\n", hex(&want)));
    let (_, _, js) = get(&format!("/rest/headers/{h100}.json?count=2"));
    let v: serde_json::Value = serde_json::from_slice(&js).unwrap();
    assert_eq!(v[0]["hash"].as_str().unwrap(), h100.to_string());
    assert_eq!(v[0]["height"].as_u64(), Some(100));
    assert_eq!(v[0]["confirmations"].as_i64(), Some(1401));
    assert_eq!(
        v[0]["nextblockhash"].as_str().unwrap(),
        blocks[100].block_hash().to_string()
    );
    assert_eq!(
        v[1]["previousblockhash"].as_str().unwrap(),
        h100.to_string()
    );
    // Count past the tip stops at the tip.
    let tip = blocks[1499].block_hash();
    let (_, _, bin) = get(&format!(
        "/rest/headers/{}.bin?count=2000",
        blocks[1495].block_hash()
    ));
    assert_eq!(bin.len(), 5 * 80);
    let b = &blocks[776];
    let (_, _, raw) = get(&format!("/rest/block/{}.bin", b.block_hash()));
    assert_eq!(raw, bitcoin::consensus::serialize(b));
    let (_, _, js) = get(&format!("/rest/block/notxdetails/{}.json", b.block_hash()));
    let v: serde_json::Value = serde_json::from_slice(&js).unwrap();
    assert_eq!(v["nTx"].as_u64(), Some(b.txdata.len() as u64));
    for (i, tx) in b.txdata.iter().enumerate() {
        assert_eq!(v["tx"][i].as_str().unwrap(), tx.compute_txid().to_string());
    }
    assert_eq!(v["weight"].as_u64(), Some(b.weight().to_wu()));
    // Full transactions (Core's `getblock 2` shape), fees from the prevouts
    // found in the earlier blocks of blocks.dat.
    let (_, _, js) = get(&format!("/rest/block/{}.json", b.block_hash()));
    let v: serde_json::Value = serde_json::from_slice(&js).unwrap();
    assert_eq!(v["nTx"].as_u64(), Some(b.txdata.len() as u64));
    let mut outputs: HashMap<bitcoin::OutPoint, u64> = HashMap::new();
    for blk in &blocks[..=776] {
        for tx in &blk.txdata {
            for (n, o) in tx.output.iter().enumerate() {
                outputs.insert(
                    bitcoin::OutPoint::new(tx.compute_txid(), n as u32),
                    o.value.to_sat(),
                );
            }
        }
    }
    let btc = |sats: u64| sats as f64 / 1e8;
    for (i, tx) in b.txdata.iter().enumerate() {
        let t = &v["tx"][i];
        assert_eq!(t["txid"], tx.compute_txid().to_string());
        assert_eq!(t["hash"], tx.compute_wtxid().to_string());
        assert_eq!(t["hex"], bitcoin::consensus::encode::serialize_hex(tx));
        assert_eq!(t["size"].as_u64(), Some(tx.total_size() as u64));
        assert_eq!(t["weight"].as_u64(), Some(tx.weight().to_wu()));
        assert_eq!(t["vin"].as_array().unwrap().len(), tx.input.len());
        for (n, o) in tx.output.iter().enumerate() {
            let jo = &t["vout"][n];
            assert_eq!(jo["n"].as_u64(), Some(n as u64));
            assert_eq!(jo["value"].as_f64(), Some(btc(o.value.to_sat())));
            assert_eq!(jo["scriptPubKey"]["hex"], hex(o.script_pubkey.as_bytes()));
            let ty = jo["scriptPubKey"]["type"].as_str().unwrap();
            if o.script_pubkey.is_p2wpkh() {
                assert_eq!(ty, "witness_v0_keyhash");
            }
            if o.script_pubkey.is_p2pkh() {
                assert_eq!(ty, "pubkeyhash");
            }
            let desc = jo["scriptPubKey"]["desc"].as_str().unwrap();
            assert_eq!(desc.split_once('#').unwrap().1.len(), 8, "{desc}");
        }
        if i == 0 {
            assert!(t["vin"][0]["coinbase"].is_string());
            assert!(t.get("fee").is_none());
            continue;
        }
        let total_in: u64 = tx
            .input
            .iter()
            .map(|inp| outputs[&inp.previous_output])
            .sum();
        let total_out: u64 = tx.output.iter().map(|o| o.value.to_sat()).sum();
        assert_eq!(
            t["fee"].as_f64(),
            Some(btc(total_in - total_out)),
            "{}",
            t["txid"]
        );
        assert_eq!(
            t["vin"][0]["txid"],
            tx.input[0].previous_output.txid.to_string()
        );
    }
    let (st, _, js) = get("/rest/chaininfo.json");
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_slice(&js).unwrap();
    assert_eq!(v["chain"], "regtest");
    assert_eq!(v["blocks"].as_u64(), Some(1500));
    assert_eq!(v["bestblockhash"].as_str().unwrap(), tip.to_string());
}

#[test]
fn filter_batches_and_checkpoints_match_filters_json() {
    let filters = json("regtest-a/filters.json");
    let filters = filters.as_array().unwrap();
    let (st, _, body) = get("/filters/basic?start_height=0&count=1000");
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let got = v["filters"].as_array().unwrap();
    assert_eq!(got.len(), 1000);
    for (g, f) in got.iter().zip(filters) {
        assert_eq!(g["height"], f["height"]);
        assert_eq!(g["hash"], f["hash"]);
        assert_eq!(g["filter"], f["basic_filter"]);
        assert_eq!(g["filter_header"], f["filter_header"]);
    }
    // The rest, clipped at the tip.
    let (_, _, body) = get("/filters/basic?start_height=1000");
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let got = v["filters"].as_array().unwrap();
    assert_eq!(got.len(), 501);
    assert_eq!(got[500]["filter_header"], filters[1500]["filter_header"]);
    for bad in [
        "?start_height=0&count=1001",
        "?start_height=0&count=0",
        "?count=5",
        "?start_height=-1",
    ] {
        let (st, _, _) = get(&format!("/filters/basic{bad}"));
        assert_eq!(st, 400, "{bad}");
    }
    assert_eq!(get("/filters/basic?start_height=1501").0, 404);
    let (_, _, body) = get("/filters/checkpoints");
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let cps = v["checkpoints"].as_array().unwrap();
    assert_eq!(cps.len(), 1);
    assert_eq!(cps[0]["filter_header"], filters[1000]["filter_header"]);
}

#[test]
fn metrics_report_the_tip_and_per_route_requests() {
    let _ = get("/blocks/tip/height");
    let (st, ctype, body) = get("/metrics");
    assert_eq!(st, 200);
    assert!(ctype.starts_with("text/plain"));
    let text = String::from_utf8(body).unwrap();
    assert!(text.contains("\nkakehi_tip_height 1500\n"), "{text}");
    let reorgs = json("regtest-a/chain.json")["reorgs"]
        .as_array()
        .unwrap()
        .len();
    assert!(text.contains(&format!("\nkakehi_reorgs_total {reorgs}\n")));
    assert!(text.contains("kakehi_http_requests_total{route=\"/blocks/tip/height\",code=\"200\"}"));
    assert!(text.contains(
        "kakehi_http_request_duration_seconds_bucket{route=\"/blocks/tip/height\",le=\"+Inf\"}"
    ));
}

#[test]
fn limits_body_size_method_cors_and_slow_headers() {
    use std::io::{Read, Write};
    // Body over the limit: 413 JSON, by Content-Length and by a chunked body;
    // POST /tx has its own, larger one (any standard transaction in hex).
    let big = vec![b'0'; 300 * 1024];
    let (st, ctype, _) = request("POST", "/proof/outpoints", &big);
    assert_eq!(st, 413);
    assert!(ctype.starts_with("application/json"));
    let (st, _, body) = request("POST", "/tx", &big);
    assert_eq!(st, 400, "{}", String::from_utf8_lossy(&body));
    let bigger = vec![b'0'; kakehi::http::mempool::MAX_TX_BODY + 1];
    let (st, ctype, _) = request("POST", "/tx", &bigger);
    assert_eq!(st, 413);
    assert!(ctype.starts_with("application/json"));
    // Wrong method: 405 JSON.
    let (st, ctype, _) = request("POST", "/blocks", b"");
    assert_eq!(st, 405);
    assert!(ctype.starts_with("application/json"));
    // CORS for the configured origin only.
    let (_, head, _) = request_h(
        "GET",
        "/blocks/tip/hash",
        "Origin: https://wallet.example\r\n",
        b"",
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("access-control-allow-origin: https://wallet.example"),
        "{head}"
    );
    let (_, head, _) = request_h(
        "GET",
        "/blocks/tip/hash",
        "Origin: https://evil.example\r\n",
        b"",
    );
    assert!(!head
        .to_ascii_lowercase()
        .contains("access-control-allow-origin"));
    let (st, head, _) = request_h(
        "OPTIONS",
        "/filters/basic",
        "Origin: https://wallet.example\r\nAccess-Control-Request-Method: GET\r\n",
        b"",
    );
    // A successful preflight (tower-http answers 200; the Fetch standard
    // asks for any 2xx).
    assert!((200..300).contains(&st), "{st}");
    assert!(head
        .to_ascii_lowercase()
        .contains("access-control-allow-methods"));
    // Slow clients: 20 connections that never finish their request head are
    // closed after the header-read timeout (1 s here), and /health answers meanwhile.
    let started = std::time::Instant::now();
    let mut slow: Vec<std::net::TcpStream> = (0..20)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(server().addr).unwrap();
            s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
                .unwrap();
            s
        })
        .collect();
    let (st, _, _) = get("/health");
    assert_eq!(st, 200);
    for s in &mut slow {
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        // Closed (possibly after a 408), never answered 200.
        assert!(!String::from_utf8_lossy(&buf).contains(" 200 "));
    }
    let waited = started.elapsed();
    assert!(
        waited < std::time::Duration::from_secs(5),
        "slow clients held for {waited:?}"
    );
}

#[test]
fn openapi_document_lists_exactly_the_routes_and_each_is_routed() {
    let (st, _, body) = get("/openapi.json");
    assert_eq!(st, 200);
    let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let mut documented: Vec<(String, String)> = Vec::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for method in ops.as_object().unwrap().keys() {
            documented.push((method.clone(), path.clone()));
        }
    }
    let mut routed: Vec<(String, String)> = kakehi::http::route_list()
        .into_iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    documented.sort();
    routed.sort();
    assert_eq!(documented, routed);
    // Each documented path, its parameters filled with junk, reaches a
    // handler (a handler's error, never the fallback's "no such route").
    for (method, path) in &documented {
        let filled: String = path
            .split('/')
            .map(|seg| if seg.starts_with('{') { "junk" } else { seg })
            .collect::<Vec<_>>()
            .join("/");
        let (st, _, body) = request(&method.to_uppercase(), &filled, b"");
        assert!(st < 500 || st == 503, "{method} {filled}: {st}");
        assert!(
            !String::from_utf8_lossy(&body).contains("no such route"),
            "{method} {filled}"
        );
    }
}

#[test]
fn load_is_shed_and_slow_requests_time_out_with_json_503() {
    use std::io::{Read, Write};
    // One request at a time, 1 s per request.
    let http = common::spawn_http(
        server().state.clone(),
        kakehi::http::HttpConfig {
            max_concurrent_requests: 1,
            request_timeout: std::time::Duration::from_secs(1),
            ..Default::default()
        },
    );
    let addr = http.addr;
    std::thread::sleep(std::time::Duration::from_millis(100));
    // A POST whose body never completes holds the only slot...
    let mut slow = std::net::TcpStream::connect(addr).unwrap();
    slow.write_all(b"POST /tx HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0100")
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    // ...so another request is shed at once.
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /blocks/tip/height HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).unwrap();
    assert!(buf.starts_with("HTTP/1.1 503"), "{buf}");
    assert!(
        buf.contains("\"code\":503") && buf.contains("overloaded"),
        "{buf}"
    );
    // The slow one is abandoned after the request timeout with a JSON 503.
    slow.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = slow.read(&mut buf).unwrap();
    let resp = String::from_utf8_lossy(&buf[..n]);
    assert!(resp.starts_with("HTTP/1.1 503"), "{resp}");
    assert!(resp.contains("abandoned"), "{resp}");
    drop(slow);
    // Then the slot is free again.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /blocks/tip/height HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).unwrap();
    assert!(buf.starts_with("HTTP/1.1 200"), "{buf}");
    assert!(buf.ends_with("1500"), "{buf}");
}

#[test]
fn per_ip_rate_limit_answers_json_429_after_the_burst() {
    use std::io::{Read, Write};
    let http = common::spawn_http(
        server().state.clone(),
        kakehi::http::HttpConfig {
            rate_limit_per_ip: Some(kakehi::http::RateLimit {
                per_second: 0.5,
                burst: 3,
            }),
            ..Default::default()
        },
    );
    let addr = http.addr;
    std::thread::sleep(std::time::Duration::from_millis(100));
    let status = || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /blocks/tip/height HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut buf = String::new();
        s.read_to_string(&mut buf).unwrap();
        buf
    };
    for _ in 0..3 {
        assert!(status().starts_with("HTTP/1.1 200"));
    }
    let r = status();
    assert!(r.starts_with("HTTP/1.1 429"), "{r}");
    assert!(r.contains("\"code\":429"), "{r}");
    assert!(r.to_ascii_lowercase().contains("retry-after: 1"), "{r}");
}

/// Every block of blocks.dat (best and stale), in file order.
fn all_blocks() -> Vec<bitcoin::Block> {
    let raw = std::fs::read(data("regtest-a/blocks.dat")).unwrap();
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 8 <= raw.len() {
        let len = u32::from_le_bytes(raw[pos + 4..pos + 8].try_into().unwrap()) as usize;
        out.push(bitcoin::consensus::deserialize(&raw[pos + 8..pos + 8 + len]).unwrap());
        pos += 8 + len;
    }
    out
}

#[test]
fn stale_blocks_are_served_and_their_transactions_resolve_to_the_active_chain_only() {
    let c = client();
    let meta = json("regtest-a/chain.json");
    let blocks = all_blocks();
    let on_best: Vec<bool> = meta["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["on_best_chain"].as_bool().unwrap())
        .collect();
    let best_txids: std::collections::HashSet<Txid> =
        chain().txids.iter().flatten().copied().collect();
    let (mut stale_only, mut reincluded) = (0, 0);
    for (b, best) in blocks.iter().zip(&on_best) {
        if *best {
            continue;
        }
        let hash = b.block_hash();
        let txids: Vec<Txid> = b.txdata.iter().map(|t| t.compute_txid()).collect();
        assert_eq!(c.get_block_txids(&hash).unwrap(), txids);
        assert!(!c.get_block_status(&hash).unwrap().in_best_chain);
        // Its transactions' JSON says where the active chain confirms them.
        let page = c.get_block_txs(&hash, None).unwrap();
        for (t, txid) in page.iter().zip(&txids) {
            assert_eq!(t.txid, *txid);
            if best_txids.contains(txid) {
                assert_eq!(t.status, c.get_tx_status(txid).unwrap());
            } else {
                assert!(!t.status.confirmed, "{txid} is only in stale blocks");
            }
        }
        for txid in &txids[1..] {
            let status = c.get_tx_status(txid);
            if best_txids.contains(txid) {
                // Re-included on the active chain: the active block answers.
                let st = status.unwrap();
                assert!(st.confirmed);
                let h = st.block_height.unwrap();
                assert_ne!(st.block_hash, Some(hash));
                assert!(chain().txids[h as usize - 1].contains(txid));
                reincluded += 1;
            } else {
                assert_eq!(
                    c.get_tx_info(txid).unwrap(),
                    None,
                    "{txid} is only in stale blocks"
                );
                stale_only += 1;
            }
        }
    }
    assert!(
        stale_only > 0 && reincluded > 0,
        "{stale_only} {reincluded}"
    );
}

/// docs/http.md's route reference is checked against the OpenAPI document
/// (which the test above checks against the router).
#[test]
fn http_doc_lists_every_openapi_path() {
    let spec: serde_json::Value = serde_json::from_str(kakehi::http::OPENAPI_JSON).unwrap();
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/http.md")).unwrap();
    for path in spec["paths"].as_object().unwrap().keys() {
        assert!(
            doc.contains(&format!("`{path}`")),
            "docs/http.md does not list {path}"
        );
    }
}

/// Without a P2P handle on the router, `/node/status` reports `peers: null`
/// and `/metrics` has no peer gauge; the tip is chain.json's.
#[test]
fn node_status_without_p2p_reports_null_peers_and_the_tip() {
    let (st, ctype, body) = get("/node/status");
    assert_eq!(st, 200);
    assert!(ctype.starts_with("application/json"), "{ctype}");
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let c = json("regtest-a/chain.json");
    assert_eq!(v["tip"]["height"], c["tip_height"]);
    assert_eq!(v["tip"]["hash"], c["tip_hash"]);
    assert_eq!(v["headers"]["hash"], c["tip_hash"]);
    assert!(v["peers"].is_null(), "{v}");
    let (_, _, m) = get("/metrics");
    assert!(!String::from_utf8_lossy(&m).contains("kakehi_peers"));
    let (st, ctype, page) = get("/");
    assert_eq!(st, 200);
    assert!(ctype.starts_with("text/html"), "{ctype}");
    assert_eq!(page, kakehi::http::STATUS_HTML.as_bytes());
}

/// The property of the `http_requests` fuzz target (`fuzz/`), in CI: any
/// route with any parameter and query text, GET or POST with any body,
/// is answered, and never with an internal error (500). `POST /tx` may
/// answer 503 (this server has no P2P to relay through).
mod random_requests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use proptest::prelude::*;
    use tower::ServiceExt;

    /// Parameter text: real hashes and outpoints, and the usual suspects.
    fn param() -> impl Strategy<Value = String> {
        let genesis = "0f9188f13cb7b2c71f2a335e3a4fc328bf5beb436012afca590b1a11466e2206";
        prop_oneof![
            Just(genesis.to_string()),
            Just(format!("{genesis}.json")),
            Just(format!("{genesis}.hex")),
            Just(format!("{genesis}.bin")),
            Just("0".repeat(64)),
            Just("%00".to_string()),
            Just("-1".to_string()),
            Just("18446744073709551616".to_string()),
            Just("4294967295".to_string()),
            Just("%F0%9F%92%A9".to_string()),
            "[0-9a-fA-F]{0,70}",
            "[ -~]{0,20}".prop_map(|s| s.replace(['/', '?', '#', '%', ' '], "_")),
        ]
    }

    fn request_of(template: &str, params: &[String], query: &str) -> String {
        let mut path = String::new();
        let mut i = 0;
        for seg in template.split('/').skip(1) {
            path.push('/');
            if seg.starts_with('{') {
                path.push_str(&params[i % params.len()]);
                i += 1;
            } else {
                path.push_str(seg);
            }
        }
        if !query.is_empty() {
            path.push('?');
            path.push_str(query);
        }
        path
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn any_request_is_answered_without_an_internal_error(
            route in 0usize..1_000,
            params in proptest::collection::vec(param(), 1..4),
            query in "([a-z_]{1,8}=[ -~]{0,12}&?){0,3}",
            post in any::<bool>(),
            body in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let routes = kakehi::http::route_list();
            let (_, template) = routes[route % routes.len()];
            let query = query.replace(['#', ' ', '%'], "_");
            let target = request_of(template, &params, &query);
            let Ok(req) = Request::builder()
                .method(if post { "POST" } else { "GET" })
                .uri(&target)
                .body(Body::from(body))
            else {
                return Ok(());
            };
            let state = server().state.clone();
            let status = runtime()
                .block_on(kakehi::http::router(state).oneshot(req))
                .expect("infallible")
                .status()
                .as_u16();
            let relay = post && template == "/tx" && status == 503;
            prop_assert!(status < 500 || relay, "{} {target}: {status}", if post { "POST" } else { "GET" });
        }
    }

    fn runtime() -> &'static tokio::runtime::Runtime {
        static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
        RT.get_or_init(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
        })
    }
}

/// One script's history as regtest-a's records imply it.
#[derive(Default, Debug)]
struct ScriptTruth {
    /// (height, position, txid) of every transaction funding or spending it.
    txs: std::collections::BTreeSet<(u32, u32, Txid)>,
    funded: (u64, u64),
    spent: (u64, u64),
    /// Unspent outputs (outpoint, value).
    utxos: std::collections::BTreeSet<(bitcoin::OutPoint, u64)>,
}

/// Truth per script hash for every output of the best chain: which
/// outpoints are unspent comes from bcoin's `utxos.txt`, which are spent
/// and by whom from `spent.txt`; values, scripts and positions from the
/// best chain's blocks in `blocks.dat`.
fn script_truths() -> HashMap<[u8; 32], (bitcoin::ScriptBuf, ScriptTruth)> {
    let c = chain();
    let mut outputs: HashMap<bitcoin::OutPoint, (u64, bitcoin::ScriptBuf, u32, u32)> =
        HashMap::new();
    let mut position: HashMap<Txid, (u32, u32)> = HashMap::new();
    for (i, b) in c.blocks.iter().enumerate() {
        let height = i as u32 + 1;
        for (pos, (tx, txid)) in b.txdata.iter().zip(&c.txids[i]).enumerate() {
            position.insert(*txid, (height, pos as u32));
            for (vout, o) in tx.output.iter().enumerate() {
                let op = bitcoin::OutPoint {
                    txid: *txid,
                    vout: vout as u32,
                };
                outputs.insert(
                    op,
                    (
                        o.value.to_sat(),
                        o.script_pubkey.clone(),
                        height,
                        pos as u32,
                    ),
                );
            }
        }
    }
    let mut truths: HashMap<[u8; 32], (bitcoin::ScriptBuf, ScriptTruth)> = HashMap::new();
    let mut entry = |op: &bitcoin::OutPoint| {
        let (value, script, height, pos) =
            outputs.get(op).expect("outpoint of the best chain").clone();
        let sh = bitcoin::hashes::sha256::Hash::hash(script.as_bytes()).to_byte_array();
        let t = &mut truths
            .entry(sh)
            .or_insert_with(|| (script, ScriptTruth::default()))
            .1;
        t.funded.0 += 1;
        t.funded.1 += value;
        t.txs.insert((height, pos, op.txid));
        (sh, value)
    };
    let mut unspent = Vec::new();
    for (op, _) in common::feed::utxo_lines() {
        unspent.push((entry(&op), op));
    }
    let mut spends = Vec::new();
    for (op, txid, _vin, _height) in spent_lines() {
        spends.push((entry(&op), txid));
    }
    for ((sh, value), op) in unspent {
        truths.get_mut(&sh).unwrap().1.utxos.insert((op, value));
    }
    for ((sh, value), txid) in spends {
        let t = &mut truths.get_mut(&sh).unwrap().1;
        t.spent.0 += 1;
        t.spent.1 += value;
        let (h, p) = position[&txid];
        t.txs.insert((h, p, txid));
    }
    truths
}

/// Every page of a script's history through `esplora-client`, following
/// `last_seen` until an empty page.
fn all_history(c: &BlockingClient, script: &bitcoin::Script) -> Vec<Txid> {
    let mut out: Vec<Txid> = Vec::new();
    loop {
        let page = c.get_scripthash_txs(script, out.last().copied()).unwrap();
        assert!(page.len() <= 25, "{}", page.len());
        if page.is_empty() {
            return out;
        }
        out.extend(page.iter().map(|t| t.txid));
    }
}

/// 200 scripts of regtest-a (the 20 busiest and 180 spread over the
/// rest, by script hash): history, totals and UTXOs through esplora-client
/// equal what bcoin's `utxos.txt` and `spent.txt` imply.
#[test]
fn address_index_matches_bcoins_utxo_and_spent_records_for_200_scripts() {
    let truths = script_truths();
    let mut by_size: Vec<(&[u8; 32], usize)> =
        truths.iter().map(|(k, v)| (k, v.1.txs.len())).collect();
    by_size.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let mut chosen: Vec<[u8; 32]> = by_size.iter().take(20).map(|(k, _)| **k).collect();
    let mut rest: Vec<[u8; 32]> = by_size[20..].iter().map(|(k, _)| **k).collect();
    rest.sort();
    let step = rest.len() / 180;
    chosen.extend(rest.iter().step_by(step).take(180));
    assert_eq!(chosen.len(), 200);
    assert!(
        by_size[0].1 > 50,
        "the busiest script pages ({} txs)",
        by_size[0].1
    );
    let c = client();
    for sh in &chosen {
        let (script, truth) = &truths[sh];
        let want: Vec<Txid> = truth.txs.iter().rev().map(|t| t.2).collect();
        assert_eq!(all_history(&c, script), want, "history of {script}");
        let stats = c.get_scripthash_stats(script).unwrap().chain_stats;
        assert_eq!(
            (stats.funded_txo_count as u64, stats.funded_txo_sum.to_sat()),
            truth.funded,
            "{script}"
        );
        assert_eq!(
            (stats.spent_txo_count as u64, stats.spent_txo_sum.to_sat()),
            truth.spent,
            "{script}"
        );
        assert_eq!(stats.tx_count as usize, truth.txs.len());
        let utxos: std::collections::BTreeSet<_> = c
            .get_scripthash_utxos(script)
            .unwrap()
            .into_iter()
            .map(|u| {
                (
                    bitcoin::OutPoint {
                        txid: u.txid,
                        vout: u.vout,
                    },
                    u.value.to_sat(),
                )
            })
            .collect();
        assert_eq!(&utxos, &truth.utxos, "UTXOs of {script}");
    }
}

/// Every address route through esplora-client, on an address of the
/// busiest script that has one: same answers as the script-hash routes,
/// and the page after a txid is the rest of the history; empty mempool.
#[test]
fn address_routes_through_esplora_client_agree_with_the_records() {
    let truths = script_truths();
    let (script, truth) = truths
        .values()
        .filter(|(s, _)| bitcoin::Address::from_script(s, Network::Regtest).is_ok())
        .max_by_key(|(s, t)| (t.txs.len(), s.clone()))
        .unwrap();
    let address = bitcoin::Address::from_script(script, Network::Regtest).unwrap();
    let c = client();
    let want: Vec<Txid> = truth.txs.iter().rev().map(|t| t.2).collect();
    assert!(want.len() > 25);
    let first = c.get_address_txs(&address, None).unwrap();
    assert_eq!(first.iter().map(|t| t.txid).collect::<Vec<_>>(), want[..25]);
    let second = c.get_address_txs(&address, Some(want[24])).unwrap();
    let n = (want.len() - 25).min(25);
    assert_eq!(
        second.iter().map(|t| t.txid).collect::<Vec<_>>(),
        want[25..25 + n]
    );
    // Full transactions with their prevouts and confirmation.
    let (height, _, txid) = *truth.txs.iter().next_back().unwrap();
    assert_eq!(first[0].txid, txid);
    assert_eq!(first[0].status.block_height, Some(height));
    assert!(first
        .iter()
        .all(|t| t.vin.iter().all(|i| i.is_coinbase || i.prevout.is_some())));
    let stats = c.get_address_stats(&address).unwrap();
    assert_eq!(stats.chain_stats.tx_count as usize, truth.txs.len());
    assert_eq!(stats.mempool_stats.tx_count, 0);
    assert_eq!(stats.address, address);
    let utxos = c.get_address_utxos(&address).unwrap();
    assert_eq!(utxos.len(), truth.utxos.len());
    assert!(utxos
        .iter()
        .all(|u| u.status.confirmed && u.status.block_hash.is_some()));
    assert!(c.get_mempool_address_txs(&address).unwrap().is_empty());
    assert!(c.get_mempool_scripthash_txs(script).unwrap().is_empty());
    let mempool = c.get_mempool_stats().unwrap();
    assert_eq!((mempool.count, mempool.vsize), (0, 0));
    assert!(c.get_mempool_txids().unwrap().is_empty());
    assert!(c.get_mempool_recent_txs().unwrap().is_empty());
    // `/txs/chain` without a txid is the first page, as `/txs`.
    let sh = bitcoin::hashes::sha256::Hash::hash(script.as_bytes());
    let (st, _, body) = get(&format!("/scripthash/{sh}/txs/chain"));
    assert_eq!(st, 200);
    let v: Vec<serde_json::Value> = serde_json::from_slice(&body).unwrap();
    let ids: Vec<String> = v
        .iter()
        .map(|t| t["txid"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        ids,
        want[..25].iter().map(|t| t.to_string()).collect::<Vec<_>>()
    );
    // A txid not in this history: an empty page, as Esplora.
    let other = chain().txids[0][0];
    assert!(c.get_address_txs(&address, Some(other)).unwrap().is_empty());
}

/// Addresses that do not parse or are of another network, and bad script
/// hashes, get a JSON 400.
#[test]
fn bad_addresses_and_script_hashes_get_json_400() {
    for path in [
        "/address/bc1qar0srrr7xfkvy5l643lydnw9re59gtzzwf5mdq",
        "/address/tb1qw508d6qejxtdg4y5r3zarvary0c5xw7kxpjzsx/txs",
        "/address/1BvBMSEYstWetqTFn5Au4m4GFg7xJaNVN2/utxo",
        "/address/bcrt1qnotanaddress/txs/chain",
        "/address/xyz",
        "/scripthash/00/txs",
        "/scripthash/zz00000000000000000000000000000000000000000000000000000000000000",
        "/address/bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080/txs/chain/nothex",
    ] {
        let (st, ctype, body) = get(path);
        assert_eq!(st, 400, "{path}: {}", String::from_utf8_lossy(&body));
        assert!(ctype.starts_with("application/json"), "{path}: {ctype}");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["code"], 400, "{path}");
    }
    // A valid regtest address nobody paid: empty history, zero stats.
    let (st, _, body) = get("/address/bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080");
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["chain_stats"]["tx_count"], 0);
    assert_eq!(v["address"], "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080");
}

/// `/fee-estimates` through esplora-client: the documented percentiles of
/// the feerates paid in the last 6 blocks, computed here from blocks.dat.
#[test]
fn fee_estimates_are_the_documented_percentiles_of_recent_blocks() {
    let c = chain();
    let mut values: HashMap<bitcoin::OutPoint, u64> = HashMap::new();
    let mut rates: Vec<(f64, u64)> = Vec::new();
    let n = c.blocks.len();
    for (i, b) in c.blocks.iter().enumerate() {
        for (tx, txid) in b.txdata.iter().zip(&c.txids[i]) {
            let inputs: u64 = tx
                .input
                .iter()
                .filter_map(|i| values.get(&i.previous_output))
                .sum();
            if i + 6 >= n && !tx.is_coinbase() {
                let out: u64 = tx.output.iter().map(|o| o.value.to_sat()).sum();
                let vsize = tx.vsize() as u64;
                rates.push(((inputs - out) as f64 / vsize as f64, vsize));
            }
            for (vout, o) in tx.output.iter().enumerate() {
                values.insert(
                    bitcoin::OutPoint {
                        txid: *txid,
                        vout: vout as u32,
                    },
                    o.value.to_sat(),
                );
            }
        }
    }
    rates.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert!(!rates.is_empty());
    let total: u64 = rates.iter().map(|r| r.1).sum();
    let percentile = |p: f64| {
        let mut seen = 0;
        rates
            .iter()
            .find(|r| {
                seen += r.1;
                seen as f64 >= total as f64 * p / 100.0
            })
            .unwrap()
            .0
    };
    let estimates = client().get_fee_estimates().unwrap();
    assert_eq!(estimates.len(), 28);
    for (target, p) in [
        (1u16, 50.0),
        (2, 25.0),
        (5, 10.0),
        (25, 2.0),
        (144, 0.0),
        (1008, 0.0),
    ] {
        let want = (percentile(p).max(1.0) * 1000.0).round() / 1000.0;
        let got = estimates[&target].to_sat_per_kwu() as f64 / 250.0;
        assert!(
            (got - want).abs() < 0.01,
            "target {target}: {got} vs {want}"
        );
    }
    assert!(estimates[&1] >= estimates[&25]);
}
