//! The mempool: acceptance rate against the raw verification of the same
//! inputs, the writer's block connection with a full mempool against an
//! empty one, accounted memory against the RSS growth, and `mempool.dat`
//! save and reload. Ratios are taken within one run (the machine is shared
//! and noisy).
//!
//! Material: a regtest chain made by `tests/common/blockgen.rs` (coinbases
//! paying its wallet), fan-out transactions splitting mature coinbases into
//! `KAKEHI_BENCH_TXS` P2WPKH coins (default 20,000), then one signed
//! 1-input P2WPKH spend per coin and, for the mixed case, 2-in/2-out spends
//! of pairs of coins (P2WPKH inputs).
//!
//! - **Acceptance**: transactions accepted per second by
//!   `Mempool::submit` (every check, Core's interpreter on every input),
//!   and inputs per second; beside it the same inputs verified alone in
//!   the same run (`PreparedTx::verify` under the same flags: the
//!   signature work acceptance cannot avoid), and the ratio.
//! - **Block connection**: `Chainstate::submit_block` of blocks of 500
//!   transactions, with the mempool empty, then with the pool full and
//!   its follower thread running (it removes the confirmed transactions
//!   concurrently); the ratio of the medians.
//! - **Memory**: the pool's accounted bytes against the process's RSS
//!   growth while it filled, and against the transactions' serialized
//!   size.
//! - **Restart**: `Mempool::save` and `Mempool::load_saved` of the pool.
//!
//! Run: `cargo bench --bench mempool` (`KAKEHI_BENCH_TXS=100000` for the
//! figure in BENCHMARKS.md).

#[path = "../tests/common/blockgen.rs"]
#[allow(dead_code)]
mod blockgen;
#[path = "common/env.rs"]
mod env;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use bitcoin::consensus::serialize;
use bitcoin::{Amount, Block, OutPoint, Sequence, Transaction, TxOut};
use blockgen::{block_on, mature_chain, signed_p2wpkh_spend, Kind, Wallet};
use env::env_or;
use kakehi::chain::ChainParams;
use kakehi::mempool::policy::STANDARD_SCRIPT_VERIFY_FLAGS;
use kakehi::mempool::{Mempool, MempoolConfig};
use kakehi::node::{open_chainstate, DataDir};
use kakehi::validation::script::{PreparedTx, SpentTxOut};

/// Coins each fan-out transaction makes (about 62 kvB: standard).
const FAN_OUT: usize = 2_000;

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// A version-2 transaction spending `coins` (the wallet's P2WPKH) into
/// `n_out` equal P2WPKH outputs for `fee` sats, signed.
fn spend(wallet: &Wallet, coins: &[(OutPoint, TxOut)], n_out: u64, fee: u64) -> Transaction {
    let total: u64 = coins.iter().map(|(_, o)| o.value.to_sat()).sum();
    let outputs = (0..n_out)
        .map(|_| TxOut {
            value: Amount::from_sat((total - fee) / n_out),
            script_pubkey: wallet.script_pubkey(Kind::P2wpkh),
        })
        .collect();
    signed_p2wpkh_spend(wallet, coins, outputs, Sequence::MAX, |_| {})
}

fn coins_of(tx: &Transaction) -> Vec<(OutPoint, TxOut)> {
    let txid = tx.compute_txid();
    tx.output
        .iter()
        .enumerate()
        .map(|(vout, o)| {
            (
                OutPoint {
                    txid,
                    vout: vout as u32,
                },
                o.clone(),
            )
        })
        .collect()
}

/// Inputs per second of Core's interpreter alone over `txs` (their
/// prevouts known), standard flags, one thread.
fn raw_verify_rate(txs: &[(Transaction, Vec<TxOut>)]) -> f64 {
    let started = Instant::now();
    let mut inputs = 0usize;
    for (tx, prevouts) in txs {
        let spent: Vec<SpentTxOut<'_>> = prevouts
            .iter()
            .map(|o| SpentTxOut {
                value: o.value,
                script_pubkey: o.script_pubkey.as_bytes(),
            })
            .collect();
        let p = PreparedTx::new(&serialize(tx), &spent).expect("prepared");
        for i in 0..p.inputs() {
            p.verify(i, STANDARD_SCRIPT_VERIFY_FLAGS).expect("valid");
            inputs += 1;
        }
    }
    inputs as f64 / started.elapsed().as_secs_f64()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n_txs: usize = env_or("KAKEHI_BENCH_TXS", 20_000);
    let wallet = Wallet::new();
    let fan_outs = n_txs.div_ceil(FAN_OUT) + 1;
    // Coinbases 1..=fan_outs mature at 101 + fan_outs.
    let tip = 100 + fan_outs as u32 + 1;
    let mut chain = mature_chain(&wallet, tip);
    let fan: Vec<Transaction> = (1..=fan_outs)
        .map(|h| {
            let cb = &chain[h].txdata[0];
            let coin = (
                OutPoint {
                    txid: cb.compute_txid(),
                    vout: 0,
                },
                cb.output[0].clone(),
            );
            spend(&wallet, &[coin], FAN_OUT as u64, 200_000)
        })
        .collect();
    let last = chain.last().expect("chain").clone();
    chain.push(block_on(&wallet, &last, tip + 1, 0, fan.clone()));
    let coins: Vec<(OutPoint, TxOut)> = fan.iter().flat_map(coins_of).collect();

    let dir = tempfile::tempdir().expect("tempdir");
    let datadir = DataDir::open(dir.path()).expect("datadir");
    let cs = open_chainstate(ChainParams::new(bitcoin::Network::Regtest), &datadir).expect("open");
    let cs = Arc::new(parking_lot::Mutex::new(cs));
    for b in &chain[1..] {
        cs.lock().submit_block(b).expect("block");
    }
    let snapshots = cs.lock().snapshots();
    println!(
        "mempool bench: {n_txs} transactions, chain of {} blocks, {} coins",
        chain.len() - 1,
        coins.len()
    );

    // --- Acceptance: 1-in/1-out P2WPKH, then 2-in/2-out.
    let t0 = Instant::now();
    let singles: Vec<(Transaction, Vec<TxOut>)> = coins[..n_txs / 2]
        .iter()
        .map(|c| {
            (
                spend(&wallet, std::slice::from_ref(c), 1, 1_000),
                vec![c.1.clone()],
            )
        })
        .collect();
    let pairs: Vec<(Transaction, Vec<TxOut>)> = coins[n_txs / 2..n_txs]
        .chunks(2)
        .filter(|c| c.len() == 2)
        .map(|c| {
            (
                spend(&wallet, c, 2, 2_000),
                vec![c[0].1.clone(), c[1].1.clone()],
            )
        })
        .collect();
    println!(
        "signed {} transactions in {:.1} s",
        singles.len() + pairs.len(),
        t0.elapsed().as_secs_f64()
    );
    let mempool = Arc::new(Mempool::new(snapshots.clone(), MempoolConfig::default()));
    let rss0 = rss_bytes();
    let mut serialized = 0u64;
    for (name, set) in [("1-in P2WPKH", &singles), ("2-in/2-out P2WPKH", &pairs)] {
        let raw = raw_verify_rate(set);
        let inputs: usize = set.iter().map(|(t, _)| t.input.len()).sum();
        let started = Instant::now();
        for (tx, _) in set.iter() {
            serialized += tx.total_size() as u64;
            mempool.submit(tx.clone(), None).expect("accepted");
        }
        let secs = started.elapsed().as_secs_f64();
        let accept = inputs as f64 / secs;
        println!(
            "accept {name}: {:.0} tx/s, {accept:.0} inputs/s; raw verification of the same inputs {raw:.0} inputs/s; ratio {:.2}",
            set.len() as f64 / secs,
            accept / raw
        );
    }
    let rss1 = rss_bytes();
    let usage = mempool.snapshot().pool.totals().usage;
    println!(
        "memory: accounted {:.1} MiB, RSS growth {:.1} MiB (accounted/RSS {:.2}), serialized {:.1} MiB (accounted/serialized {:.2})",
        usage as f64 / 1048576.0,
        (rss1.saturating_sub(rss0)) as f64 / 1048576.0,
        usage as f64 / (rss1.saturating_sub(rss0)).max(1) as f64,
        serialized as f64 / 1048576.0,
        usage as f64 / serialized as f64
    );

    // --- Restart: save and reload.
    let started = Instant::now();
    let saved = mempool.save().expect("save");
    let save_s = started.elapsed().as_secs_f64();
    let reloaded = Mempool::new(snapshots.clone(), MempoolConfig::default());
    let started = Instant::now();
    let (ok, refused) = reloaded.load_saved().expect("load");
    println!(
        "restart: saved {saved} in {save_s:.2} s, reloaded {ok} ({refused} refused) in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    drop(reloaded);

    // --- Block connection: blocks of 500 of the mempool's transactions,
    // first with an empty mempool (a second chain state), then with the
    // full one following the chain.
    let block_txs: Vec<Vec<Transaction>> = singles
        .chunks(500)
        .take(6)
        .map(|c| c.iter().map(|(t, _)| t.clone()).collect())
        .collect();
    let mut blocks: Vec<Block> = Vec::new();
    let mut prev = chain.last().expect("tip").clone();
    for (i, txs) in block_txs.into_iter().enumerate() {
        let b = block_on(&wallet, &prev, tip + 2 + i as u32, 0, txs);
        prev = b.clone();
        blocks.push(b);
    }
    let dir2 = tempfile::tempdir().expect("tempdir");
    let datadir2 = DataDir::open(dir2.path()).expect("datadir");
    let mut empty =
        open_chainstate(ChainParams::new(bitcoin::Network::Regtest), &datadir2).expect("open");
    for b in &chain[1..] {
        empty.submit_block(b).expect("block");
    }
    let mut with_empty: Vec<f64> = Vec::new();
    for b in &blocks {
        let started = Instant::now();
        empty.submit_block(b).expect("block");
        with_empty.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let follower = mempool.spawn_follower(stop.clone()).expect("follower");
    let before = mempool.snapshot().pool.len();
    let mut with_full: Vec<f64> = Vec::new();
    for b in &blocks {
        let started = Instant::now();
        cs.lock().submit_block(b).expect("block");
        with_full.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let caught_up = Instant::now();
    while mempool.snapshot().pool.tip() != Some(prev.block_hash()) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let lag = caught_up.elapsed().as_secs_f64() * 1000.0;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = follower.join();
    let (me, mf) = (median(&mut with_empty), median(&mut with_full));
    println!(
        "block connect (500 txs): median {me:.1} ms with an empty mempool, {mf:.1} ms with {before} transactions in it (ratio {:.2}); the mempool caught up {lag:.0} ms after the last block, {} left",
        mf / me,
        mempool.snapshot().pool.len()
    );
}
