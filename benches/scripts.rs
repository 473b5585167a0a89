//! Script verification rate: inputs verified per second by kakehi's block
//! verification (`verify_block_scripts`: Bitcoin Core 26.0's interpreter,
//! one `PreparedTx` per transaction) with 1 and 2 threads, per output type,
//! against libsecp256k1's raw signature-verify rate measured in the same
//! run (the `secp256k1` crate), and against the `bitcoinconsensus` crate's
//! own C API (`verify_with_flags`: one call per input, the transaction
//! decoded and its hashes recomputed at every call), and against
//! libbitcoinkernel's (Core 31.99's interpreter, PyPI `py-bitcoinkernel`:
//! `benches/kernel_verify.py`, one `ScriptPubkey.verify` per input with the
//! transaction's precomputed data, 1 thread; the Python call's own cost is
//! measured on `OP_TRUE` inputs and printed beside it).
//!
//! Each kind gets a block of `KAKEHI_BENCH_INPUTS` inputs (default 4,000),
//! 10 per transaction, signed with `tests/common/blockgen.rs`'s wallet;
//! best of `KAKEHI_BENCH_RUNS` (default 3).
//!
//! Run: `cargo bench --bench scripts`.

#[path = "../tests/common/blockgen.rs"]
#[allow(dead_code)]
mod blockgen;
#[path = "common/env.rs"]
mod env;
#[path = "../tests/common/python.rs"]
#[allow(dead_code)]
mod python;

use std::num::NonZeroUsize;
use std::path::Path;
use std::time::Instant;

use bitcoin::consensus::serialize;
use bitcoin::hashes::Hash;
use bitcoin::hex::DisplayHex;
use bitcoin::secp256k1::{Keypair, Message, Secp256k1, SecretKey};
use bitcoin::{Amount, Block, TxOut};
use blockgen::{coinbase, signed_spend, Kind, Wallet};
use env::env_or;
use kakehi::mempool::policy::MANDATORY_SCRIPT_VERIFY_FLAGS;
use kakehi::primitives::Coin;
use kakehi::validation::script::{verify_block_scripts, ScriptFlags};
use kakehi::validation::SpentOutput;

/// Regtest's flags at any height: every consensus flag (Core's
/// `MANDATORY_SCRIPT_VERIFY_FLAGS`).
const FLAGS: ScriptFlags = MANDATORY_SCRIPT_VERIFY_FLAGS;

/// A block of `inputs` inputs of `kind`, 10 per transaction, and its spent
/// outputs in block order.
fn signed_block(wallet: &Wallet, kind: Kind, inputs: usize) -> (Block, Vec<SpentOutput>) {
    let prevout = TxOut {
        value: Amount::from_sat(100_000),
        script_pubkey: wallet.script_pubkey(kind),
    };
    let mut txdata = vec![coinbase(1, 0, vec![TxOut::NULL])];
    let mut spent = Vec::with_capacity(inputs);
    for t in 0..inputs.div_ceil(10) {
        let n = (inputs - t * 10).min(10);
        let tx = signed_spend(wallet, kind, &prevout, (t, n), n as u64 * 99_000);
        let txid = tx.compute_txid();
        for (vin, i) in tx.input.iter().enumerate() {
            spent.push(SpentOutput {
                outpoint: i.previous_output,
                coin: Coin {
                    value: prevout.value,
                    script_pubkey: prevout.script_pubkey.to_bytes(),
                    height: 1,
                    coinbase: false,
                },
                txid,
                vin: vin as u32,
            });
        }
        txdata.push(tx);
    }
    let header = blockgen::mine(
        (bitcoin::BlockHash::all_zeros(), 0),
        txdata[0].clone(),
        vec![],
    )
    .header;
    (Block { header, txdata }, spent)
}

/// Best inputs/s of `verify_block_scripts` over `runs` runs.
fn kakehi_rate(block: &Block, spent: &[SpentOutput], threads: usize, runs: usize) -> f64 {
    let threads = NonZeroUsize::new(threads).expect("threads");
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            verify_block_scripts(block, spent, FLAGS, threads).expect("valid scripts");
            spent.len() as f64 / t.elapsed().as_secs_f64()
        })
        .fold(0.0, f64::max)
}

/// Best inputs/s of the `bitcoinconsensus` crate's C API, one call per
/// input, over `runs` runs.
fn libconsensus_rate(block: &Block, spent: &[SpentOutput], runs: usize) -> f64 {
    let mut best: f64 = 0.0;
    for _ in 0..runs {
        let t = Instant::now();
        let mut at = 0;
        for tx in block.txdata.iter().skip(1) {
            let bytes = serialize(tx);
            let mine = &spent[at..at + tx.input.len()];
            let utxos: Vec<bitcoinconsensus::Utxo> = mine
                .iter()
                .map(|s| bitcoinconsensus::Utxo {
                    script_pubkey: s.coin.script_pubkey.as_ptr(),
                    script_pubkey_len: s.coin.script_pubkey.len() as u32,
                    value: s.coin.value.to_sat() as i64,
                })
                .collect();
            for (i, s) in mine.iter().enumerate() {
                bitcoinconsensus::verify_with_flags(
                    &s.coin.script_pubkey,
                    s.coin.value.to_sat(),
                    &bytes,
                    Some(&utxos),
                    i,
                    FLAGS.bits(),
                )
                .expect("valid input");
            }
            at += tx.input.len();
        }
        best = best.max(spent.len() as f64 / t.elapsed().as_secs_f64());
    }
    best
}

/// libbitcoinkernel's inputs/s on 1 thread and the Python call's cost per
/// input in µs (`benches/kernel_verify.py`), best of `runs`.
fn kernel_rate(block: &Block, spent: &[SpentOutput], runs: usize) -> (f64, f64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("inputs.txt");
    let mut lines = String::new();
    let mut at = 0;
    for tx in block.txdata.iter().skip(1) {
        lines.push_str(&bitcoin::consensus::encode::serialize_hex(tx));
        for s in &spent[at..at + tx.input.len()] {
            let spk = s.coin.script_pubkey.to_lower_hex_string();
            lines.push_str(&format!(" {} {spk}", s.coin.value.to_sat()));
        }
        lines.push('\n');
        at += tx.input.len();
    }
    std::fs::write(&file, lines).expect("write inputs");
    let out = std::process::Command::new(python::venv_python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/kernel_verify.py"))
        .arg(runs.to_string())
        .arg(&file)
        .output()
        .expect("run benches/kernel_verify.py");
    assert!(
        out.status.success(),
        "kernel_verify.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON line");
    assert_eq!(v["inputs"].as_u64(), Some(spent.len() as u64));
    (
        v["inputs_per_second"].as_f64().expect("rate"),
        v["call_overhead_us"].as_f64().expect("overhead"),
    )
}

/// Raw libsecp256k1 verifies per second (ECDSA, Schnorr) on `threads`
/// threads, best of `runs`.
fn raw_rates(threads: usize, runs: usize) -> (f64, f64) {
    let secp = Secp256k1::new();
    let n = 2_000;
    let items: Vec<_> = (0..n as u32)
        .map(|i| {
            let mut k = [0x42u8; 32];
            k[..4].copy_from_slice(&(i + 1).to_be_bytes());
            let sk = SecretKey::from_slice(&k).expect("key");
            let kp = Keypair::from_secret_key(&secp, &sk);
            let msg = Message::from_digest(bitcoin::hashes::sha256::Hash::hash(&k).to_byte_array());
            let ecdsa = secp.sign_ecdsa(&msg, &sk);
            let schnorr = secp.sign_schnorr_no_aux_rand(&msg, &kp);
            (
                msg,
                sk.public_key(&secp),
                ecdsa,
                kp.x_only_public_key().0,
                schnorr,
            )
        })
        .collect();
    let time = |f: &(dyn Fn(usize) + Sync)| {
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                std::thread::scope(|s| {
                    for w in 0..threads {
                        s.spawn(move || f(w));
                    }
                });
                (n * threads) as f64 / t.elapsed().as_secs_f64()
            })
            .fold(0.0, f64::max)
    };
    let ecdsa = time(&|_| {
        for (msg, pk, sig, _, _) in &items {
            secp.verify_ecdsa(msg, sig, pk).expect("valid");
        }
    });
    let schnorr = time(&|_| {
        for (msg, _, _, xonly, sig) in &items {
            secp.verify_schnorr(sig, msg, xonly).expect("valid");
        }
    });
    (ecdsa, schnorr)
}

fn main() {
    let inputs: usize = env_or("KAKEHI_BENCH_INPUTS", 4_000);
    let runs: usize = env_or("KAKEHI_BENCH_RUNS", 3);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let wallet = Wallet::new();
    let (ecdsa1, schnorr1) = raw_rates(1, runs);
    let (ecdsa2, schnorr2) = raw_rates(2, runs);
    println!("{inputs} inputs per kind, best of {runs} runs, {cores} cores");
    println!(
        "libsecp256k1 raw verify/s: ECDSA {ecdsa1:.0} (1 thread), {ecdsa2:.0} (2); Schnorr {schnorr1:.0} (1), {schnorr2:.0} (2)"
    );
    println!(
        "| kind | sigs/input | kakehi 1 thread | kakehi 2 threads | 2 threads / 1 | sig checks/s, 1 thread, vs raw | sig checks/s, 2 threads, vs raw x2 | libbitcoinconsensus C API, 1 thread | libbitcoinkernel (pbk), 1 thread; Python call µs |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (kind, name, sigs, schnorr) in [
        (Kind::P2wpkh, "P2WPKH", 1.0, false),
        (Kind::P2tr, "P2TR key path", 1.0, true),
        (Kind::P2pkh, "P2PKH", 1.0, false),
        // Three signature checks per input, not two: Core's
        // CHECKMULTISIG pairs the signatures and keys from the last pushed
        // down, and the wallet signs with keys 0 and 1 of `2 <k0> <k1> <k2>
        // 3`, so key 2 is tried first against key 1's signature and fails.
        (Kind::P2shMultisig, "P2SH 2-of-3", 3.0, false),
        (Kind::P2wshMultisig, "P2WSH 2-of-3", 3.0, false),
    ] {
        let (block, spent) = signed_block(&wallet, kind, inputs);
        let one = kakehi_rate(&block, &spent, 1, runs);
        let two = kakehi_rate(&block, &spent, 2, runs);
        let api = libconsensus_rate(&block, &spent, runs);
        let (kernel, call_us) = kernel_rate(&block, &spent, runs);
        let (raw1, raw2) = if schnorr {
            (schnorr1, schnorr1 * 2.0)
        } else {
            (ecdsa1, ecdsa1 * 2.0)
        };
        println!(
            "| {name} | {sigs} | {one:.0} | {two:.0} | {:.2}x | {:.0} = {:.0} % | {:.0} = {:.0} % | {api:.0} ({:.2}x kakehi's 1 thread) | {kernel:.0} ({:.2}x); {call_us:.1} µs |",
            two / one,
            one * sigs,
            100.0 * one * sigs / raw1,
            two * sigs,
            100.0 * two * sigs / raw2,
            api / one,
            kernel / one,
        );
    }
}
