//! Esplora's JSON shapes of a transaction and its status (`TransactionValue`,
//! `TxStatus` in electrs `src/rest.rs`), the txid parser and the page size
//! of transaction lists: shared by the Esplora routes (`esplora.rs`) and the
//! address routes (`address.rs`), which import them from here and not from
//! each other.

use bitcoin::{Address, Network, Script, Transaction, Txid};
use serde::Serialize;

use super::{hex, ApiError, ApiResult};
use crate::chain::index::IndexEntry;
use crate::mempool::MempoolEntry;
use crate::validation::SpentOutput;

/// Confirmed transactions per page of `…/txs` and `…/txs/chain` and of
/// `/block/:hash/txs` (electrs `CHAIN_TXS_PER_PAGE`).
pub const TXS_PER_PAGE: usize = 25;

/// Esplora's confirmation status of a transaction.
#[derive(Serialize, Clone)]
pub(super) struct TxStatus {
    confirmed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    block_height: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    block_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    block_time: Option<u32>,
}

impl TxStatus {
    /// Confirmed in block `e`.
    pub(super) fn confirmed_in(e: &IndexEntry) -> Self {
        TxStatus {
            confirmed: true,
            block_height: Some(e.height),
            block_hash: Some(e.hash.to_string()),
            block_time: Some(e.header.time),
        }
    }

    /// Not confirmed on the active chain.
    pub(super) fn unconfirmed() -> Self {
        TxStatus {
            confirmed: false,
            block_height: None,
            block_hash: None,
            block_time: None,
        }
    }
}

/// Esplora's output (`TxOutValue`).
#[derive(Serialize)]
struct TxOutValue {
    scriptpubkey: String,
    scriptpubkey_asm: String,
    scriptpubkey_type: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    scriptpubkey_address: Option<String>,
    value: u64,
}

/// Esplora's input (`TxInValue`).
#[derive(Serialize)]
struct TxInValue {
    txid: String,
    vout: u32,
    prevout: Option<TxOutValue>,
    scriptsig: String,
    scriptsig_asm: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    witness: Option<Vec<String>>,
    is_coinbase: bool,
    sequence: u32,
}

/// Esplora's transaction (`TransactionValue`).
#[derive(Serialize)]
pub(super) struct TransactionValue {
    txid: String,
    version: i32,
    locktime: u32,
    vin: Vec<TxInValue>,
    vout: Vec<TxOutValue>,
    size: usize,
    weight: u64,
    fee: u64,
    /// Where the transaction is confirmed (the block it was read from,
    /// unless the caller knows better: a stale block's transaction is
    /// reported where the active chain confirms it).
    pub(super) status: TxStatus,
}

/// Esplora's script type names (electrs `rest.rs`).
#[allow(deprecated)] // electrs names `provably_unspendable` scripts too
fn script_type(s: &Script) -> &'static str {
    if s.is_empty() {
        "empty"
    } else if s.is_op_return() {
        "op_return"
    } else if s.is_p2pk() {
        "p2pk"
    } else if s.is_p2pkh() {
        "p2pkh"
    } else if s.is_p2sh() {
        "p2sh"
    } else if s.is_p2wpkh() {
        "v0_p2wpkh"
    } else if s.is_p2wsh() {
        "v0_p2wsh"
    } else if s.is_p2tr() {
        "v1_p2tr"
    } else if s.is_provably_unspendable() {
        "provably_unspendable"
    } else {
        "unknown"
    }
}

fn txout_value(s: &Script, value: u64, network: Network) -> TxOutValue {
    TxOutValue {
        scriptpubkey: hex(s.as_bytes()),
        scriptpubkey_asm: s.to_asm_string(),
        scriptpubkey_type: script_type(s),
        scriptpubkey_address: Address::from_script(s, network).ok().map(|a| a.to_string()),
        value,
    }
}

/// The txid of a path segment: 64 hex characters in display order; 400
/// otherwise.
pub(super) fn parse_txid(s: &str) -> ApiResult<Txid> {
    if s.len() != 64 {
        return Err(ApiError::bad_request(format!(
            "invalid txid {s:?}: expected 64 hex characters"
        )));
    }
    s.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid txid {s:?}")))
}

/// Esplora's JSON of `tx`, confirmed in block `e`, with the prevouts taken
/// from `spent` (the block's spent outputs, or any superset of this
/// transaction's: those whose spending txid is this one's are used).
pub(super) fn tx_value_with(
    e: &IndexEntry,
    tx: &Transaction,
    spent: &[SpentOutput],
    network: Network,
) -> TransactionValue {
    let txid = tx.compute_txid();
    let mut prevouts: Vec<Option<TxOutValue>> = tx.input.iter().map(|_| None).collect();
    let mut in_sum = 0u64;
    if !tx.is_coinbase() {
        for s in spent.iter().filter(|s| s.txid == txid) {
            if let Some(slot) = prevouts.get_mut(s.vin as usize) {
                in_sum = in_sum.saturating_add(s.coin.value.to_sat());
                *slot = Some(txout_value(
                    Script::from_bytes(&s.coin.script_pubkey),
                    s.coin.value.to_sat(),
                    network,
                ));
            }
        }
    }
    let out_sum: u64 = tx.output.iter().map(|o| o.value.to_sat()).sum();
    let fee = if tx.is_coinbase() {
        0
    } else {
        in_sum.saturating_sub(out_sum)
    };
    tx_value_parts(tx, prevouts, fee, TxStatus::confirmed_in(e), network)
}

/// Esplora's JSON of a mempool transaction: prevouts and fee from its
/// entry, `status: {"confirmed": false}`.
pub(super) fn tx_value_unconfirmed(entry: &MempoolEntry, network: Network) -> TransactionValue {
    let prevouts = entry
        .prevouts
        .iter()
        .map(|o| Some(txout_value(&o.script_pubkey, o.value.to_sat(), network)))
        .collect();
    tx_value_parts(
        &entry.tx,
        prevouts,
        entry.fee,
        TxStatus::unconfirmed(),
        network,
    )
}

/// Esplora's JSON of `tx` from its parts.
fn tx_value_parts(
    tx: &Transaction,
    prevouts: Vec<Option<TxOutValue>>,
    fee: u64,
    status: TxStatus,
    network: Network,
) -> TransactionValue {
    let vin = tx
        .input
        .iter()
        .zip(prevouts)
        .map(|(i, prevout)| TxInValue {
            txid: i.previous_output.txid.to_string(),
            vout: i.previous_output.vout,
            prevout,
            scriptsig: hex(i.script_sig.as_bytes()),
            scriptsig_asm: i.script_sig.to_asm_string(),
            witness: (!i.witness.is_empty()).then(|| i.witness.iter().map(hex).collect()),
            is_coinbase: tx.is_coinbase(),
            sequence: i.sequence.0,
        })
        .collect();
    let vout = tx
        .output
        .iter()
        .map(|o| txout_value(&o.script_pubkey, o.value.to_sat(), network))
        .collect();
    TransactionValue {
        txid: tx.compute_txid().to_string(),
        version: tx.version.0,
        locktime: tx.lock_time.to_consensus_u32(),
        vin,
        vout,
        size: tx.total_size(),
        weight: tx.weight().to_wu(),
        fee,
        status,
    }
}
