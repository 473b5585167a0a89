//! Inputs verified per second, one thread, by three engines on the same
//! signed inputs (see Cargo.toml).

#[path = "../../../tests/common/blockgen.rs"]
#[allow(dead_code)]
mod blockgen;

use std::time::Instant;

use bitcoin::consensus::serialize;
use bitcoin::hashes::Hash;
use bitcoin::{Amount, TxOut};
use bitcoinkernel::prelude::*;
use blockgen::{Kind, Wallet};
use kakehi::validation::script::{PreparedTx, ScriptFlags, SpentTxOut};

const FLAGS: u32 = 1 | 1 << 2 | 1 << 4 | 1 << 9 | 1 << 10 | 1 << 11 | 1 << 17;

/// `n` transactions of 10 inputs of `kind`, signed; and the spent outputs.
fn txs(wallet: &Wallet, kind: Kind, n: usize) -> (Vec<Vec<u8>>, TxOut) {
    let prevout = TxOut {
        value: Amount::from_sat(100_000),
        script_pubkey: wallet.script_pubkey(kind),
    };
    let out = (0..n)
        .map(|t| {
            serialize(&blockgen::signed_spend(
                wallet,
                kind,
                &prevout,
                (t, 10),
                990_000,
            ))
        })
        .collect();
    (out, prevout)
}

fn rate(inputs: usize, f: impl Fn()) -> f64 {
    (0..3)
        .map(|_| {
            let t = Instant::now();
            f();
            inputs as f64 / t.elapsed().as_secs_f64()
        })
        .fold(0.0, f64::max)
}

fn main() {
    let wallet = Wallet::new();
    let n = 300;
    println!("| kind | kakehi (Core 26.0, glue) | libbitcoinconsensus C API (Core 26.0) | libbitcoinkernel (Core 31.99) |");
    println!("| --- | --- | --- | --- |");
    for (kind, name) in [
        (Kind::P2wpkh, "P2WPKH"),
        (Kind::P2tr, "P2TR key path"),
        (Kind::P2pkh, "P2PKH"),
        (Kind::P2shMultisig, "P2SH 2-of-3"),
        (Kind::P2wshMultisig, "P2WSH 2-of-3"),
    ] {
        let (txs, prevout) = txs(&wallet, kind, n);
        let spk = prevout.script_pubkey.as_bytes();
        let value = prevout.value.to_sat();
        let ours = rate(n * 10, || {
            let spent = vec![
                SpentTxOut {
                    value: prevout.value,
                    script_pubkey: spk
                };
                10
            ];
            for tx in &txs {
                let p = PreparedTx::new(tx, &spent).expect("prepare");
                for i in 0..10 {
                    p.verify(i, ScriptFlags::from_bits(FLAGS)).expect("valid");
                }
            }
        });
        let libconsensus = rate(n * 10, || {
            let utxos = vec![
                bitcoinconsensus::Utxo {
                    script_pubkey: spk.as_ptr(),
                    script_pubkey_len: spk.len() as u32,
                    value: value as i64,
                };
                10
            ];
            for tx in &txs {
                for i in 0..10 {
                    bitcoinconsensus::verify_with_flags(spk, value, tx, Some(&utxos), i, FLAGS)
                        .expect("valid");
                }
            }
        });
        let kernel = rate(n * 10, || {
            let script = bitcoinkernel::ScriptPubkey::new(spk).expect("script");
            let outs: Vec<bitcoinkernel::TxOut> = (0..10)
                .map(|_| bitcoinkernel::TxOut::new(&script, value as i64))
                .collect();
            for tx in &txs {
                let t = bitcoinkernel::Transaction::new(tx).expect("tx");
                let data = bitcoinkernel::PrecomputedTransactionData::new(&t, &outs).expect("data");
                for i in 0..10 {
                    bitcoinkernel::verify(&script, Some(value as i64), &t, i, Some(FLAGS), &data)
                        .expect("valid");
                }
            }
        });
        println!("| {name} | {ours:.0} | {libconsensus:.0} | {kernel:.0} |");
    }
}
