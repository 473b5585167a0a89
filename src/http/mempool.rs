//! The mempool over HTTP: Esplora's `POST /tx`, `GET /mempool`,
//! `/mempool/txids`, `/mempool/recent`, and Core REST's
//! `/rest/mempool/info.json` and `/rest/mempool/contents.json`.
//!
//! Every read takes the latest [`crate::mempool::MempoolSnapshot`]
//! (lock-free). `POST /tx` goes through the mempool's acceptance
//! ([`crate::mempool::Mempool::submit`]) on a blocking thread; a refusal
//! answers 400 with bitcoind's error as Esplora passes it through, as the
//! message of the API's JSON error:
//! `sendrawtransaction RPC error: {"code":-26,"message":"<Core's reason>"}`. An accepted transaction is announced to peers when P2P
//! runs; a node without peers keeps it and announces it when one connects.
//!
//! Source: Blockstream electrs `src/rest.rs` (shapes, the fee histogram's
//! bins), Bitcoin Core 30.0 `src/rest.cpp` and `src/rpc/mempool.cpp`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bitcoin::consensus::deserialize;
use bitcoin::hex::FromHex;
use bitcoin::Transaction;

use super::{text, ApiError, ApiResult, AppState};
use crate::mempool::{AcceptError, Mempool, MempoolEntry, MempoolSnapshot, TxRejectClass};

/// Largest transaction `POST /tx` accepts, bytes of hex: twice Core's
/// `MAX_STANDARD_TX_WEIGHT` (400,000), the most bytes a standard
/// transaction can serialize to (every byte witness). A larger body is 413
/// before any check: such a transaction could only be refused (`tx-size`).
pub const MAX_TX_HEX: usize = 800_000;

/// Largest `POST /tx` body, bytes: [`MAX_TX_HEX`] and a line ending.
pub const MAX_TX_BODY: usize = MAX_TX_HEX + 2;

/// Entries `/mempool/recent` lists (electrs' `RECENT_TXS_SIZE`).
pub const RECENT_TXS: usize = 10;

/// Vbytes per bin of `/mempool`'s `fee_histogram` before a new bin may
/// start (electrs' `VSIZE_BIN_WIDTH`).
pub const VSIZE_BIN_WIDTH: u64 = 50_000;

/// The mempool of this node, or 503 when it runs without one.
fn mempool(s: &AppState) -> ApiResult<Arc<Mempool>> {
    s.mempool.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this node runs without a mempool",
        )
    })
}

/// The latest mempool state, or an empty one when the node has no
/// mempool (the read routes then answer as an empty mempool).
pub(super) fn snapshot(s: &AppState) -> Option<Arc<MempoolSnapshot>> {
    s.mempool.as_ref().map(|m| m.snapshot())
}

/// Esplora's `fee_histogram`: `[feerate, vsize]` pairs, highest feerate
/// first; each bin holds at least [`VSIZE_BIN_WIDTH`] vbytes of
/// transactions paying at least its feerate (sat/vB), the last whatever is
/// left (electrs' `make_fee_histogram`).
pub fn fee_histogram<'a>(entries: impl Iterator<Item = &'a Arc<MempoolEntry>>) -> Vec<(f64, u64)> {
    let mut rates: Vec<(f64, u64)> = entries
        .map(|e| (e.fee as f64 / e.vsize.max(1) as f64, e.vsize))
        .collect();
    rates.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut out = Vec::new();
    let (mut bin, mut last) = (0u64, 0f64);
    for (rate, vsize) in rates {
        if bin > VSIZE_BIN_WIDTH && last != rate {
            out.push((last, bin));
            bin = 0;
        }
        last = rate;
        bin += vsize;
    }
    if bin > 0 {
        out.push((last, bin));
    }
    out
}

/// `GET /mempool`: `{count, vsize, total_fee, fee_histogram}`.
pub(super) async fn summary(State(s): State<AppState>) -> Response {
    let Some(m) = snapshot(&s) else {
        return Json(
            serde_json::json!({"count": 0, "vsize": 0, "total_fee": 0, "fee_histogram": []}),
        )
        .into_response();
    };
    let t = m.pool.totals();
    Json(serde_json::json!({
        "count": t.count,
        "vsize": t.vsize,
        "total_fee": t.fees,
        "fee_histogram": fee_histogram(m.pool.iter_by_entry()),
    }))
    .into_response()
}

/// `GET /mempool/txids`: every txid, in entry order.
pub(super) async fn txids(State(s): State<AppState>) -> Response {
    let list: Vec<String> = snapshot(&s)
        .map(|m| m.pool.iter_by_entry().map(|e| e.txid.to_string()).collect())
        .unwrap_or_default();
    Json(list).into_response()
}

/// `GET /mempool/recent`: the last [`RECENT_TXS`] entries, newest first,
/// as `{txid, fee, vsize, value}` (value: the outputs' sum, sats).
pub(super) async fn recent(State(s): State<AppState>) -> Response {
    let list: Vec<serde_json::Value> = snapshot(&s)
        .map(|m| {
            m.pool
                .iter_by_entry()
                .rev()
                .take(RECENT_TXS)
                .map(|e| {
                    let value: u64 = e.tx.output.iter().map(|o| o.value.to_sat()).sum();
                    serde_json::json!({"txid": e.txid.to_string(), "fee": e.fee, "vsize": e.vsize, "value": value})
                })
                .collect()
        })
        .unwrap_or_default();
    Json(list).into_response()
}

/// Sats per 1,000 vbytes as BTC/kvB, the unit of Core's RPC and REST.
fn btc_per_kvb(sat_per_kvb: u64) -> f64 {
    sat_per_kvb as f64 / 1e8
}

/// `GET /rest/mempool/info.json`: Core's `getmempoolinfo` shape.
pub(super) async fn rest_info(State(s): State<AppState>) -> ApiResult<Response> {
    let m = mempool(&s)?;
    Ok(Json(info_json(&m)).into_response())
}

/// Core's `getmempoolinfo` result for `m`'s latest state.
pub fn info_json(m: &Mempool) -> serde_json::Value {
    let snap = m.snapshot();
    let t = snap.pool.totals();
    let cfg = m.config();
    serde_json::json!({
        "loaded": true,
        "size": t.count,
        "bytes": t.vsize,
        "usage": t.usage,
        "total_fee": t.fees as f64 / 1e8,
        "maxmempool": cfg.max_mib << 20,
        "mempoolminfee": btc_per_kvb(snap.min_feerate),
        "minrelaytxfee": btc_per_kvb(cfg.policy.min_relay_feerate),
        "incrementalrelayfee": btc_per_kvb(cfg.policy.incremental_relay_feerate),
        "unbroadcastcount": 0,
        "fullrbf": true,
    })
}

/// `GET /rest/mempool/contents.json`: Core's `getrawmempool true` shape,
/// keyed by txid.
pub(super) async fn rest_contents(State(s): State<AppState>) -> ApiResult<Response> {
    let m = mempool(&s)?;
    let snap = m.snapshot();
    let pool = &snap.pool;
    let mut out = serde_json::Map::new();
    for e in pool.iter_by_entry() {
        out.insert(e.txid.to_string(), entry_json(&snap, e));
    }
    Ok(Json(serde_json::Value::Object(out)).into_response())
}

/// One entry as Core's `getrawmempool true` / `getmempoolentry` prints it.
pub fn entry_json(snap: &MempoolSnapshot, e: &MempoolEntry) -> serde_json::Value {
    let pool = &snap.pool;
    let ancestors = pool.ancestors(&e.txid);
    let descendants = pool.descendants(&e.txid);
    let (anc_vsize, anc_fees) = pool.sum_of(&ancestors);
    let (desc_vsize, desc_fees) = pool.sum_of(&descendants);
    let btc = |sats: u64| sats as f64 / 1e8;
    let depends: Vec<String> = pool
        .parents_of(&e.tx)
        .iter()
        .map(|t| t.to_string())
        .collect();
    let spentby: Vec<String> = pool
        .children_of(&e.txid)
        .iter()
        .map(|t| t.to_string())
        .collect();
    // Core's `IsRBFOptIn` (`policy/rbf.cpp`): BIP125 signalling by the
    // transaction or by one of its in-mempool ancestors. Full RBF replaces
    // either way; the field still reports the signal, as Core 30 does.
    let bip125 = e.tx.is_explicitly_rbf()
        || ancestors
            .iter()
            .filter_map(|a| pool.get(a))
            .any(|a| a.tx.is_explicitly_rbf());
    serde_json::json!({
        "vsize": e.vsize,
        "weight": e.weight,
        "time": e.time,
        "height": e.height,
        "descendantcount": descendants.len() + 1,
        "descendantsize": desc_vsize + e.vsize,
        "ancestorcount": ancestors.len() + 1,
        "ancestorsize": anc_vsize + e.vsize,
        "wtxid": e.wtxid.to_string(),
        "fees": {
            "base": btc(e.fee),
            "modified": btc(e.fee),
            "ancestor": btc(anc_fees + e.fee),
            "descendant": btc(desc_fees + e.fee),
        },
        "depends": depends,
        "spentby": spentby,
        "bip125-replaceable": bip125,
        "unbroadcast": false,
    })
}

/// Decodes `POST /tx`'s body: the transaction in hex.
fn decode_tx_body(body: &[u8]) -> ApiResult<Transaction> {
    if body.len() > MAX_TX_HEX {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("transaction hex over {MAX_TX_HEX} bytes"),
        ));
    }
    let hex_str = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request("body must be the transaction in hex"))?
        .trim();
    let bytes = Vec::<u8>::from_hex(hex_str)
        .map_err(|e| ApiError::bad_request(format!("body must be the transaction in hex: {e}")))?;
    deserialize(&bytes)
        .map_err(|e| ApiError::bad_request(format!("transaction does not decode: {e}")))
}

/// bitcoind's error as Esplora passes it through (400,
/// `sendrawtransaction RPC error: {"code":…,"message":…}`), as the
/// message of the API's JSON error.
fn rpc_error(code: i32, message: &str) -> ApiError {
    let body = serde_json::json!({"code": code, "message": message});
    ApiError::bad_request(format!("sendrawtransaction RPC error: {body}"))
}

/// `POST /tx`: the transaction (hex body) through mempool acceptance, with
/// `sendrawtransaction`'s default fee cap; its txid on acceptance (or when
/// it is already in the mempool, as Core answers), then announced to peers.
pub(super) async fn post_tx(
    State(s): State<AppState>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> ApiResult<Response> {
    let body = body.map_err(|e| ApiError::new(e.status(), e.body_text()))?;
    let tx = decode_tx_body(&body)?;
    let m = mempool(&s)?;
    let txid = tx.compute_txid();
    let max = m.config().max_feerate;
    let m2 = m.clone();
    let tx2 = tx.clone();
    let result = tokio::task::spawn_blocking(move || m2.submit(tx2, Some(max)))
        .await
        .map_err(ApiError::internal)?;
    match result {
        Ok(_) => Ok(text(txid.to_string())),
        Err(AcceptError::Rejected(r))
            if r.class == TxRejectClass::Duplicate && r.reason != "txn-already-known" =>
        {
            // Core's BroadcastTransaction: already in the mempool is a
            // success; the transaction is announced again.
            if let (Some(p2p), Some(e)) = (&s.p2p, m.snapshot().pool.get(&txid)) {
                let _ = p2p.relay_transaction((*e.tx).clone());
            }
            Ok(text(txid.to_string()))
        }
        Err(AcceptError::Rejected(r)) => {
            let (code, message) = r.rpc_error();
            Err(rpc_error(code, &message))
        }
        Err(e @ AcceptError::Storage(_)) => Err(ApiError::internal(e)),
    }
}
