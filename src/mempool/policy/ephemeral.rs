//! Ephemeral dust (Core 28+): a transaction may have one dust output if it
//! pays no fee, and only a child that spends that dust, in the same package
//! or later, can get it mined.
//!
//! Source: Bitcoin Core 30.0 `src/policy/ephemeral_policy.cpp`
//! (`PreCheckEphemeralTx`, `CheckEphemeralSpends`), `src/validation.cpp`.

use std::collections::HashSet;

use bitcoin::{OutPoint, Transaction, Txid};

use super::{is_dust, REASON_DUST};
use crate::mempool::reject::{TxReject, TxRejectClass};

/// Core's reject reason for [`check_ephemeral_spends`].
pub const REASON_MISSING_EPHEMERAL_SPENDS: &str = "missing-ephemeral-spends";

/// A transaction with a dust output must pay no fee, so that no miner
/// takes it without the child that spends the dust (Core's
/// `PreCheckEphemeralTx`). `base_fee` is the fee the transaction pays,
/// `modified_fee` the fee after `prioritisetransaction`, both in sats
/// (signed: a priority delta may be negative).
///
/// # Errors
///
/// [`TxRejectClass::NotStandard`] with Core's reason `dust` and debug
/// message `tx with dust output must be 0-fee`.
pub fn pre_check_ephemeral_tx(
    tx: &Transaction,
    dust_relay_feerate: u64,
    base_fee: i64,
    modified_fee: i64,
) -> Result<(), TxReject> {
    let has_dust = tx.output.iter().any(|o| is_dust(o, dust_relay_feerate));
    if (base_fee != 0 || modified_fee != 0) && has_dust {
        return Err(TxReject::with_debug(
            TxRejectClass::NotStandard,
            REASON_DUST,
            "tx with dust output must be 0-fee",
        ));
    }
    Ok(())
}

/// Checks that `tx` spends every dust output of its unconfirmed parents
/// (Core's `CheckEphemeralSpends`, for one transaction of a package).
/// `parent` finds an unconfirmed parent by txid: in the same package
/// first, then in the mempool, as Core looks; a confirmed parent is `None`.
///
/// # Errors
///
/// [`TxRejectClass::MempoolPolicy`] with Core's reason
/// `missing-ephemeral-spends` and debug message `tx <txid> (wtxid=<wtxid>)
/// did not spend parent's ephemeral dust`.
pub fn check_ephemeral_spends<'a>(
    tx: &Transaction,
    dust_relay_feerate: u64,
    parent: impl Fn(&Txid) -> Option<&'a Transaction>,
) -> Result<(), TxReject> {
    let mut seen: HashSet<Txid> = HashSet::new();
    let mut unspent_dust: HashSet<OutPoint> = HashSet::new();
    for input in &tx.input {
        let txid = input.previous_output.txid;
        if !seen.insert(txid) {
            continue;
        }
        if let Some(p) = parent(&txid) {
            let dust = (0u32..)
                .zip(&p.output)
                .filter(|(_, o)| is_dust(o, dust_relay_feerate));
            unspent_dust.extend(dust.map(|(vout, _)| OutPoint { txid, vout }));
        }
    }
    for input in &tx.input {
        unspent_dust.remove(&input.previous_output);
    }
    if unspent_dust.is_empty() {
        return Ok(());
    }
    Err(TxReject::with_debug(
        TxRejectClass::MempoolPolicy,
        REASON_MISSING_EPHEMERAL_SPENDS,
        format!(
            "tx {} (wtxid={}) did not spend parent's ephemeral dust",
            tx.compute_txid(),
            tx.compute_wtxid()
        ),
    ))
}
