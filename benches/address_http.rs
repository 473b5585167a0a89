//! The address routes over HTTP on loopback, end to end (request to the
//! last byte of the answer):
//! - `/address/:a/txs/chain/:last_seen_txid` for an address with 10,001
//!   transactions (a coinbase, then a chain of 10,000 transactions each
//!   spending the previous one's output back to the same P2WPKH, 100 per
//!   block), every page of its history: p50, p99 and max, warm (two passes
//!   after a first one) and cold (each sample: the node closed, the page
//!   cache dropped, the node reopened, one page at a random place);
//! - that address's totals (`/address/:a`): the first request, which reads
//!   every transaction of its history (one per row), then 20 more of it and of `/utxo`, both
//!   answered from the summary cache of busy scripts;
//! - a BDK wallet (`bdk_wallet` + `bdk_esplora`, blocking) `full_scan` of a
//!   wpkh descriptor whose first 200 addresses each received one
//!   transaction (stop gap 20: 220 addresses asked), end to end.
//!
//! The chain (203 blocks on regtest's genesis) is built here with
//! `tests/common/blockgen.rs` and submitted to a fresh datadir; every
//! signature is checked by kakehi's script engine.
//!
//! Cold page cache: as root, `sync` then `echo 3 > /proc/sys/vm/drop_caches`
//! (the whole machine's cache); otherwise each datadir file is evicted with
//! `dd iflag=nocache count=0` (POSIX_FADV_DONTNEED on the whole file), and
//! the bench says which it used.
//!
//! Run: `cargo bench --bench address_http` (`KAKEHI_BENCH_COLD=N` cold
//! samples, default 30).

#[path = "common/env.rs"]
mod env;
#[path = "common/http_get.rs"]
mod http_get;
#[path = "../tests/common/mod.rs"]
mod tcommon;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Instant;

use bdk_esplora::{esplora_client, EsploraExt};
use bdk_wallet::{KeychainKind, Wallet as BdkWallet};
use bitcoin::bip32::{DerivationPath, Xpriv, Xpub};
use bitcoin::{Amount, Block, Network, OutPoint, ScriptBuf, Transaction, TxOut, Txid};
use http_get::get;
use kakehi::chain::ChainParams;
use kakehi::http::{AppState, HttpConfig};
use kakehi::node::{open_chainstate, DataDir};
use kakehi::pipeline::{Chainstate, GroupLimits, SubmitOutcome};
use tcommon::blockgen::{coinbase, mine, subsidy, Kind, Wallet};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Chained transactions paying the busy address, and per block.
const CHAIN_TXS: usize = 10_000;
const PER_BLOCK: usize = 100;
/// Wallet addresses that receive one transaction each.
const WALLET_ADDRESSES: u32 = 200;

fn open(dir: &Path) -> Chainstate {
    let datadir = DataDir::open(dir).expect("datadir");
    let mut cs = open_chainstate(ChainParams::new(Network::Regtest), &datadir).expect("open");
    cs.set_group_limits(GroupLimits::NODE_DEFAULT);
    cs.set_address_index(true, &mut |_| {}).expect("index on");
    cs
}

/// A version-2 transaction spending `coin` (of `kind`) to `outputs`, signed.
fn spend(w: &Wallet, kind: Kind, coin: (OutPoint, TxOut), outputs: Vec<TxOut>) -> Transaction {
    let mut tx = Transaction {
        version: bitcoin::transaction::Version::TWO,
        lock_time: bitcoin::absolute::LockTime::ZERO,
        input: vec![bitcoin::TxIn {
            previous_output: coin.0,
            sequence: bitcoin::Sequence::MAX,
            ..Default::default()
        }],
        output: outputs,
    };
    w.sign(&mut tx, &[(kind, coin.1)]);
    tx
}

fn out(value: u64, script: &ScriptBuf) -> TxOut {
    TxOut {
        value: Amount::from_sat(value),
        script_pubkey: script.clone(),
    }
}

/// Mines and submits blocks on the tip of `cs`.
struct Miner<'a> {
    cs: &'a mut Chainstate,
    prev: (bitcoin::BlockHash, u32),
    height: u32,
}

impl Miner<'_> {
    fn block(&mut self, pay: &ScriptBuf, txs: Vec<Transaction>) -> Block {
        self.height += 1;
        let cb = coinbase(self.height, 0, vec![out(subsidy(self.height), pay)]);
        let b = mine(self.prev, cb, txs);
        let outcome = self.cs.submit_block(&b).expect("storage");
        assert!(
            matches!(outcome, SubmitOutcome::Accepted { .. }),
            "{outcome:?}"
        );
        self.prev = (b.block_hash(), b.header.time);
        b
    }
}

fn first_out(tx: &Transaction, vout: u32) -> (OutPoint, TxOut) {
    let op = OutPoint {
        txid: tx.compute_txid(),
        vout,
    };
    (op, tx.output[vout as usize].clone())
}

/// Builds the chain into a fresh datadir at `dir`; returns the busy
/// address.
fn build_chain(dir: &Path, wallet_spks: &[ScriptBuf]) -> bitcoin::Address {
    let w = Wallet::new();
    let busy = w.script_pubkey(Kind::P2wpkh);
    let fan = w.script_pubkey(Kind::P2tr);
    let mut cs = open(dir);
    let tip = cs.index().tip().clone();
    let mut m = Miner {
        cs: &mut cs,
        prev: (tip.hash, tip.header.time),
        height: 0,
    };
    let b1 = m.block(&busy, vec![]);
    let b2 = m.block(&fan, vec![]);
    for _ in 3..=101 {
        m.block(&fan, vec![]);
    }
    let mut coin = first_out(&b1.txdata[0], 0);
    for _ in 0..CHAIN_TXS / PER_BLOCK {
        let mut txs = Vec::with_capacity(PER_BLOCK);
        for _ in 0..PER_BLOCK {
            let value = coin.1.value.to_sat() - 200;
            let tx = spend(&w, Kind::P2wpkh, coin, vec![out(value, &busy)]);
            coin = first_out(&tx, 0);
            txs.push(tx);
        }
        m.block(&fan, txs);
    }
    let mut outs: Vec<TxOut> = (0..WALLET_ADDRESSES).map(|_| out(100_000, &fan)).collect();
    let total = b2.txdata[0].output[0].value.to_sat();
    outs.push(out(
        total - 100_000 * u64::from(WALLET_ADDRESSES) - 10_000,
        &fan,
    ));
    let fan_tx = spend(&w, Kind::P2tr, first_out(&b2.txdata[0], 0), outs);
    let pays: Vec<Transaction> = wallet_spks
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let c = first_out(&fan_tx, i as u32);
            spend(&w, Kind::P2tr, c, vec![out(90_000, s)])
        })
        .collect();
    m.block(&fan, vec![fan_tx]);
    m.block(&fan, pays);
    cs.flush().expect("flush");
    bitcoin::Address::from_script(&busy, Network::Regtest).expect("address")
}

/// One page after `last` (or the first): its txids and the time.
fn page(addr: SocketAddr, a: &bitcoin::Address, last: Option<Txid>) -> (Vec<Txid>, f64) {
    let path = match last {
        Some(t) => format!("/address/{a}/txs/chain/{t}"),
        None => format!("/address/{a}/txs/chain"),
    };
    let (status, body, ms) = get(addr, &path);
    assert_eq!(status, 200, "{path}");
    let v: Vec<serde_json::Value> = serde_json::from_slice(&body).expect("JSON");
    let ids = v
        .iter()
        .map(|t| t["txid"].as_str().expect("txid").parse().expect("txid"))
        .collect();
    (ids, ms)
}

/// Every page of the history: (all txids newest first, ms per page).
fn every_page(addr: SocketAddr, a: &bitcoin::Address) -> (Vec<Txid>, Vec<f64>) {
    let (mut all, mut times) = (Vec::new(), Vec::new());
    loop {
        let (ids, ms) = page(addr, a, all.last().copied());
        times.push(ms);
        if ids.is_empty() {
            return (all, times);
        }
        assert!(ids.len() <= 25);
        all.extend(ids);
    }
}

fn report(name: &str, mut v: Vec<f64>) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    println!(
        "{name}: {} samples, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        v.len(),
        at(0.5),
        at(0.99),
        v[v.len() - 1]
    );
}

/// Drops the page cache (see the module doc); returns how.
fn drop_page_cache(dir: &Path) -> &'static str {
    let _ = std::process::Command::new("sync").status();
    if std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok() {
        return "echo 3 > /proc/sys/vm/drop_caches";
    }
    evict(dir);
    "dd iflag=nocache count=0 on every datadir file"
}

fn evict(dir: &Path) {
    for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            evict(&p);
        } else {
            let _ = std::process::Command::new("dd")
                .arg(format!("if={}", p.display()))
                .args(["iflag=nocache", "count=0", "status=none"])
                .status();
        }
    }
}

/// The wallet's watch-only descriptors (BIP84 account of a fixed seed).
fn descriptors() -> (String, String) {
    let secp = bitcoin::secp256k1::Secp256k1::new();
    let master = Xpriv::new_master(bitcoin::NetworkKind::Test, &[0x42; 32]).expect("master");
    let path: DerivationPath = "m/84'/1'/0'".parse().expect("path");
    let xpub = Xpub::from_priv(&secp, &master.derive_priv(&secp, &path).expect("derive"));
    (format!("wpkh({xpub}/0/*)"), format!("wpkh({xpub}/1/*)"))
}

fn wallet() -> BdkWallet {
    let (e, i) = descriptors();
    BdkWallet::create(e, i)
        .network(Network::Regtest)
        .create_wallet_no_persist()
        .expect("wallet")
}

fn full_scan(addr: SocketAddr) -> f64 {
    let mut w = wallet();
    let client = esplora_client::Builder::new(&format!("http://{addr}")).build_blocking();
    let t = Instant::now();
    let update = client
        .full_scan(w.start_full_scan().build(), 20, 5)
        .expect("full_scan");
    w.apply_update(update).expect("apply");
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(w.transactions().count(), WALLET_ADDRESSES as usize);
    assert_eq!(
        w.balance().confirmed.to_sat(),
        90_000 * u64::from(WALLET_ADDRESSES)
    );
    secs
}

fn serve(cs: &Chainstate) -> tcommon::HttpServer {
    let state = AppState {
        snapshots: cs.snapshots(),
        p2p: None,
        mempool: None,
    };
    tcommon::spawn_http(state, HttpConfig::default())
}

fn main() {
    let cold_samples: usize = env::env_or("KAKEHI_BENCH_COLD", 30);
    let dir = tempfile::tempdir().expect("tempdir");
    let w = wallet();
    let spks: Vec<ScriptBuf> = (0..WALLET_ADDRESSES)
        .map(|i| w.peek_address(KeychainKind::External, i).script_pubkey())
        .collect();
    let t = Instant::now();
    let busy = build_chain(dir.path(), &spks);
    println!("chain built: {:.1} s", t.elapsed().as_secs_f64());

    let cs = open(dir.path());
    let http = serve(&cs);
    let (all, _) = every_page(http.addr, &busy);
    assert_eq!(all.len(), CHAIN_TXS + 1, "history length");
    let mut warm = Vec::new();
    for _ in 0..2 {
        let (again, times) = every_page(http.addr, &busy);
        assert_eq!(again, all);
        warm.extend(times);
    }
    report("txs/chain warm", warm);
    // The totals read the whole history once; then they and the UTXOs
    // come from the summary cache.
    let (status, _, first) = get(http.addr, &format!("/address/{busy}"));
    assert_eq!(status, 200);
    println!("/address/:a, first request (every transaction of the history read): {first:.2} ms");
    for route in ["", "/utxo"] {
        let path = format!("/address/{busy}{route}");
        let (status, first_body, _) = get(http.addr, &path);
        assert_eq!(status, 200, "{path}");
        let mut again = Vec::new();
        for _ in 0..20 {
            let (status, body, ms) = get(http.addr, &path);
            assert_eq!((status, &body), (200, &first_body), "{path}");
            again.push(ms);
        }
        report(&format!("/address/:a{route}, summary cached"), again);
    }
    for run in 1..=3 {
        println!(
            "full_scan of {WALLET_ADDRESSES} addresses, run {run}: {:.2} s",
            full_scan(http.addr)
        );
    }
    drop(http);
    drop(cs);

    let mut cold = Vec::new();
    let mut how = "";
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..cold_samples {
        how = drop_page_cache(dir.path());
        let cs = open(dir.path());
        let http = serve(&cs);
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let k = (rng as usize) % (all.len() / 25);
        let last = (k > 0).then(|| all[k * 25 - 1]);
        let (ids, ms) = page(http.addr, &busy, last);
        assert_eq!(ids[..], all[k * 25..(k * 25 + 25).min(all.len())]);
        cold.push(ms);
    }
    println!("cold page cache by: {how}");
    report("txs/chain cold (first request after reopen)", cold);
}
