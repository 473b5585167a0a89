//! The invalid cases: one block each on the best chain's tip (height tip +
//! 1, so it has more work than the tip and a node must validate it fully),
//! with valid proof of work, merkle root and witness commitment, a coinbase
//! that claims exactly the subsidy plus the fees, and exactly one fault.
//! `invalid/cases.json` lists them as testnet-data/regtest-a/invalid does,
//! with the reason Bitcoin Core rejects each for (`core_reject_reason`:
//! validation.cpp / consensus/tx_verify.cpp reject strings, and for script
//! failures `block-script-verify-flag-failed (<ScriptErrorString>)` as
//! Core 30's `CheckInputScripts` words it).
//!
//! `invalid/control.blk` is one more block on the tip holding every case's
//! transaction without its fault (the same coins, exact values, a correct
//! signature, the right script, nLockTime and nSequence at their bounds,
//! the coinbase at tip - 99 with exactly 100 confirmations): it must be
//! accepted, which shows each case fails for its one fault only.

use std::path::Path;

use bitcoin::hashes::Hash;
use bitcoin::{Amount, Block, BlockHash, Transaction, TxOut, Txid};
use rand::Rng;
use serde::Serialize;

use crate::assemble;
use crate::coins::Coin;
use crate::keys::{KeyPool, Kind, POOL_SIZE};
use crate::output::{write_single, OutputError};
use crate::sign::{sign, Draft};

/// The fee every case transaction pays, sats.
const FEE: u64 = 1_000;
/// Relative lock of the CSV coin kept for the failed-CSV case, blocks.
pub const CSV_LOCK: u32 = 10;

/// The coins the best chain keeps unspent for the cases.
pub struct Reserve {
    /// Three P2WPKH coins: overspend, double spend, bad ECDSA signature.
    pub p2wpkh: [Coin; 3],
    /// A P2TR coin: bad Schnorr signature.
    pub p2tr: Coin,
    /// A 2-of-3 P2WSH coin: wrong witness program.
    pub multisig: Coin,
    /// A CLTV coin locked to the tip's height: failed CLTV.
    pub cltv: Coin,
    /// A CSV coin with a `CSV_LOCK`-block lock: failed CSV.
    pub csv: Coin,
    /// The coinbase coin of tip - 98 (99 confirmations at tip + 1).
    pub immature: Coin,
    /// The coinbase coin of tip - 99 (100 confirmations at tip + 1).
    pub mature: Coin,
}

/// The tip the cases build on.
pub struct Tip {
    /// Its hash.
    pub hash: BlockHash,
    /// Its height.
    pub height: u32,
    /// Its timestamp.
    pub time: u32,
}

/// One entry of `invalid/cases.json`.
#[derive(Debug, Serialize)]
pub struct CaseEntry {
    /// The block's file in `invalid/`.
    pub file: String,
    /// Its hash.
    pub block_hash: String,
    /// The tip it builds on.
    pub parent_hash: String,
    /// The tip's height.
    pub parent_height: u32,
    /// The block's height.
    pub height: u32,
    /// What is wrong with it.
    pub reason: &'static str,
    /// Always `reject`.
    pub expected: &'static str,
    /// The reason Bitcoin Core rejects it with.
    pub core_reject_reason: &'static str,
    /// Serialized size, bytes.
    pub size: usize,
    /// Weight, WU.
    pub weight: u64,
    /// Transactions, coinbase included.
    pub tx_count: usize,
}

/// A transaction of a case block and the fee it claims (0 when its inputs
/// are missing or short).
struct CaseTx(Transaction, u64);

/// Writes every case and the control block into `dir/invalid/`; the
/// entries of `cases.json` and the control block.
///
/// # Errors
/// [`OutputError::Io`] naming the file.
pub fn write(
    dir: &Path,
    tip: &Tip,
    reserve: &Reserve,
    keys: &KeyPool,
    rng: &mut impl Rng,
) -> Result<(Vec<CaseEntry>, Block), OutputError> {
    let dir = dir.join("invalid");
    std::fs::create_dir_all(&dir).map_err(|e| OutputError::io(&dir, e))?;
    let mut entries = Vec::new();
    for (n, (name, reason, core, txs)) in cases(tip, reserve, keys, rng).into_iter().enumerate() {
        let block = case_block(tip, txs, keys, n as u8 + 1);
        let file = format!("{:02}-{name}.blk", n + 1);
        write_single(&dir.join(&file), &block)?;
        entries.push(CaseEntry {
            file,
            block_hash: block.block_hash().to_string(),
            parent_hash: tip.hash.to_string(),
            parent_height: tip.height,
            height: tip.height + 1,
            reason,
            expected: "reject",
            core_reject_reason: core,
            size: block.total_size(),
            weight: block.weight().to_wu(),
            tx_count: block.txdata.len(),
        });
    }
    let control = case_block(tip, controls(tip, reserve, keys), keys, 0);
    write_single(&dir.join("control.blk"), &control)?;
    let json = serde_json::to_vec_pretty(&entries).expect("plain data serializes");
    let path = dir.join("cases.json");
    std::fs::write(&path, json).map_err(|e| OutputError::io(&path, e))?;
    Ok((entries, control))
}

/// Core's reject reason for a script that fails with `error` (Core 30,
/// validation.cpp `CheckInputScripts`; script/script_error.cpp strings).
macro_rules! script_failure {
    ($error:literal) => {
        concat!("block-script-verify-flag-failed (", $error, ")")
    };
}

type Case = (&'static str, &'static str, &'static str, Vec<CaseTx>);

fn cases(tip: &Tip, r: &Reserve, keys: &KeyPool, rng: &mut impl Rng) -> Vec<Case> {
    let mut missing = r.p2wpkh[0];
    missing.outpoint.txid = Txid::from_byte_array(rng.gen());
    let double = |key| spend(&[r.p2wpkh[1]], FEE, key, tip, keys);
    vec![
        (
            "missing-input",
            "spends an outpoint that never existed",
            "bad-txns-inputs-missingorspent",
            vec![unfunded(spend(&[missing], FEE, 1, tip, keys))],
        ),
        (
            "overspend",
            "pays 1,000 sat more than its input holds",
            "bad-txns-in-belowout",
            vec![unfunded(overspend(&r.p2wpkh[0], tip, keys))],
        ),
        (
            "double-spend",
            "two transactions spend the same output",
            "bad-txns-inputs-missingorspent",
            vec![double(2), double(3)],
        ),
        (
            "immature-coinbase-spend",
            "spends the coinbase of tip - 98 (99 confirmations, 100 needed)",
            "bad-txns-premature-spend-of-coinbase",
            vec![spend(&[r.immature], FEE, 4, tip, keys)],
        ),
        (
            "bad-ecdsa-signature",
            "P2WPKH signature over other data (an output lowered by 1 sat after signing)",
            script_failure!(
                "Script evaluated without error but finished with a false/empty top stack element"
            ),
            vec![lower_after_signing(spend(
                &[r.p2wpkh[2]],
                FEE,
                5,
                tip,
                keys,
            ))],
        ),
        (
            "bad-schnorr-signature",
            "P2TR key-path signature over other data (an output lowered by 1 sat after signing)",
            script_failure!("Invalid Schnorr signature"),
            vec![lower_after_signing(spend(&[r.p2tr], FEE, 6, tip, keys))],
        ),
        (
            "wrong-witness-program",
            "P2WSH witness script whose SHA-256 is not the output's program",
            script_failure!("Witness program hash mismatch"),
            vec![wrong_witness_script(
                spend(&[r.multisig], FEE, 7, tip, keys),
                &r.multisig,
                keys,
            )],
        ),
        (
            "failed-cltv",
            "CLTV locked to the tip height, spent with nLockTime = tip - 1",
            script_failure!("Locktime requirement not satisfied"),
            vec![with_lock(&r.cltv, tip.height - 1, 0xffff_fffe, tip, keys)],
        ),
        (
            "failed-csv",
            "CSV lock of 10 blocks, spent with nSequence = 9",
            script_failure!("Locktime requirement not satisfied"),
            vec![with_lock(&r.csv, tip.height, CSV_LOCK - 1, tip, keys)],
        ),
    ]
}

/// The cases' transactions without their faults.
fn controls(tip: &Tip, r: &Reserve, keys: &KeyPool) -> Vec<CaseTx> {
    vec![
        spend(&[r.p2wpkh[0]], FEE, 1, tip, keys),
        spend(&[r.p2wpkh[1]], FEE, 2, tip, keys),
        spend(&[r.mature], FEE, 4, tip, keys),
        spend(&[r.p2wpkh[2]], FEE, 5, tip, keys),
        spend(&[r.p2tr], FEE, 6, tip, keys),
        spend(&[r.multisig], FEE, 7, tip, keys),
        with_lock(&r.cltv, r.cltv.lock, 0xffff_fffe, tip, keys),
        with_lock(&r.csv, tip.height, CSV_LOCK, tip, keys),
    ]
}

/// `coins` to one P2WPKH output of key `key`, paying `fee`; v2,
/// nLockTime = tip height (final in the next block), nSequence 0xfffffffd.
fn spend(coins: &[Coin], fee: u64, key: u32, tip: &Tip, keys: &KeyPool) -> CaseTx {
    let value: u64 = coins.iter().map(|c| c.value).sum();
    let draft = Draft {
        version: 2,
        lock_time: tip.height,
        inputs: coins.iter().map(|c| (*c, 0xffff_fffd)).collect(),
        outputs: vec![TxOut {
            value: Amount::from_sat(value - fee),
            script_pubkey: keys.script_pubkey(Kind::P2wpkh, POOL_SIZE - key, 0),
        }],
    };
    CaseTx(sign(&draft, keys), fee)
}

/// A spend of a lock-time coin with the given nLockTime and nSequence.
fn with_lock(coin: &Coin, lock_time: u32, sequence: u32, tip: &Tip, keys: &KeyPool) -> CaseTx {
    let CaseTx(tx, fee) = spend(&[*coin], FEE, 8, tip, keys);
    let draft = Draft {
        version: 2,
        lock_time,
        inputs: vec![(*coin, sequence)],
        outputs: tx.output,
    };
    CaseTx(sign(&draft, keys), fee)
}

/// Outputs worth the input plus 1,000 sat, correctly signed.
fn overspend(coin: &Coin, tip: &Tip, keys: &KeyPool) -> CaseTx {
    let CaseTx(mut tx, _) = spend(&[*coin], FEE, 1, tip, keys);
    tx.output[0].value = Amount::from_sat(coin.value + 1_000);
    let draft = Draft {
        version: 2,
        lock_time: tip.height,
        inputs: vec![(*coin, 0xffff_fffd)],
        outputs: tx.output,
    };
    CaseTx(sign(&draft, keys), 0)
}

/// A fee of 0 claimed by the coinbase (the inputs are missing or short).
fn unfunded(CaseTx(tx, _): CaseTx) -> CaseTx {
    CaseTx(tx, 0)
}

/// The output lowered by one sat after signing: the signature no longer
/// commits to the transaction; the fee grows by that sat.
fn lower_after_signing(CaseTx(mut tx, fee): CaseTx) -> CaseTx {
    tx.output[0].value -= Amount::from_sat(1);
    CaseTx(tx, fee + 1)
}

/// The last witness item (the witness script) replaced by the 2-of-3
/// script of the next three keys.
fn wrong_witness_script(CaseTx(mut tx, fee): CaseTx, coin: &Coin, keys: &KeyPool) -> CaseTx {
    let other = keys.witness_script(Kind::P2wshMultisig, coin.key.wrapping_add(1), 0);
    let mut items: Vec<Vec<u8>> = tx.input[0].witness.iter().map(<[u8]>::to_vec).collect();
    if let Some(last) = items.last_mut() {
        *last = other.into_bytes();
    }
    tx.input[0].witness = bitcoin::Witness::from_slice(&items);
    CaseTx(tx, fee)
}

/// A block on `tip` with `txs`; the coinbase claims the subsidy plus the
/// claimed fees and carries `tag` so every case has its own coinbase.
fn case_block(tip: &Tip, txs: Vec<CaseTx>, keys: &KeyPool, tag: u8) -> Block {
    let height = tip.height + 1;
    let fees: u64 = txs.iter().map(|t| t.1).sum();
    let payout = keys.script_pubkey(Kind::P2wpkh, u32::from(tag), 0);
    let cb = assemble::coinbase(
        height,
        &[(payout, assemble::subsidy(height) + fees)],
        &[b'k', b'c', b'g', tag],
    );
    let txs = txs.into_iter().map(|t| t.0).collect();
    assemble::finish(tip.hash, tip.time + 1, cb, txs)
}
