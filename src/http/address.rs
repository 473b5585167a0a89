//! Esplora's address and script-hash routes (Blockstream `API.md`, shapes
//! and paging of electrs `src/rest.rs`), served from the address index
//! (`store::history`, `snapshot/history.rs`) and the mempool's script
//! index ([`crate::mempool::Pool::by_script_hash`]).
//!
//! - `/address/:address` and `/scripthash/:hash`: `{address|scripthash,
//!   chain_stats, mempool_stats}`;
//! - `…/txs`: up to [`MEMPOOL_TXS_PER_PAGE`] mempool transactions (newest
//!   first), then the first page of confirmed transactions, newest first,
//!   25 per page ([`TXS_PER_PAGE`]); `…/txs/chain[/:last_seen_txid]`: the
//!   confirmed page after `last_seen_txid`; `…/txs/mempool`: the mempool
//!   transactions alone;
//! - `…/utxo`: the unspent outputs, `{txid, vout, status, value}`: the
//!   confirmed ones no mempool transaction spends, then the mempool's
//!   outputs to the script that no other mempool transaction spends
//!   (`status: {"confirmed": false}`).
//!
//! An address is parsed by rust-bitcoin's `Address` and must be for the
//! node's network (`require_network`): anything else is a 400. A script
//! hash is the SHA-256 of the scriptPubKey in hex, digest order (64 hex).
//! Without a complete address index (`--no-address-index`, or while it is
//! built) these routes answer 503.

use std::str::FromStr;
use std::sync::Arc;

use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bitcoin::address::NetworkUnchecked;
use bitcoin::hex::FromHex;
use bitcoin::{Address, Txid};

use super::esplora_json::{
    parse_txid, tx_value_unconfirmed, tx_value_with, TransactionValue, TxStatus, TXS_PER_PAGE,
};
use super::{read, ApiError, ApiResult, AppState};
use crate::mempool::{MempoolEntry, MempoolSnapshot};
use crate::primitives::script_hash;
use crate::snapshot::{ChainSnapshot, ScriptStats, ScriptSummary};

/// Most bytes of script summaries the HTTP server keeps (32 MiB; an entry
/// weighs [`SUMMARY_ENTRY_BYTES`] plus [`SUMMARY_UTXO_BYTES`] per unspent
/// output).
pub const SUMMARY_CACHE_BYTES: u64 = 32 << 20;
/// Weight of a cached summary besides its unspent outputs, bytes.
const SUMMARY_ENTRY_BYTES: u64 = 128;
/// Weight of one unspent output of a cached summary, bytes.
const SUMMARY_UTXO_BYTES: u64 = std::mem::size_of::<crate::snapshot::ScriptUtxo>() as u64;
/// Transactions a script's history must hold for its summary to be
/// cached (electrs's `MIN_HISTORY_ITEMS_TO_CACHE`): a shorter one is read
/// again in a few block reads.
pub const SUMMARY_CACHE_MIN_TXS: u64 = 100;

/// Weighs a cached summary by the bytes it holds.
#[derive(Clone, Copy, Debug, Default)]
struct SummaryBytes;

impl quick_cache::Weighter<[u8; 32], Arc<ScriptSummary>> for SummaryBytes {
    fn weight(&self, _script_hash: &[u8; 32], summary: &Arc<ScriptSummary>) -> u64 {
        SUMMARY_ENTRY_BYTES + SUMMARY_UTXO_BYTES * summary.utxos.len() as u64
    }
}

/// The totals and unspent outputs of busy scripts (at least
/// [`SUMMARY_CACHE_MIN_TXS`] transactions), by script hash, at most
/// [`SUMMARY_CACHE_BYTES`] (`quick_cache`, weighed by bytes). `/address/:a`
/// and `/…/utxo` of a cached script read only the rows of blocks connected
/// since its summary ([`ChainSnapshot::script_summary_since`]), instead of
/// a block read per block of its whole history; a summary whose block left
/// the active chain is read again from the start. Entries never answer for
/// another chain state: each is checked against the request's snapshot.
pub(super) struct SummaryCache(
    quick_cache::sync::Cache<[u8; 32], Arc<ScriptSummary>, SummaryBytes>,
);

impl Default for SummaryCache {
    fn default() -> Self {
        // Estimated items: a few hundred busy scripts.
        SummaryCache(quick_cache::sync::Cache::with_weighter(
            1_024,
            SUMMARY_CACHE_BYTES,
            SummaryBytes,
        ))
    }
}

impl SummaryCache {
    /// The summary of `script_hash` at `cs`'s tip, from the cached one
    /// when there is one; caches the result when the script is busy.
    fn summary(&self, cs: &ChainSnapshot, script_hash: &[u8; 32]) -> ApiResult<Arc<ScriptSummary>> {
        let base = self.0.get(script_hash);
        if let Some(b) = base.as_ref().filter(|b| b.block == cs.index().tip().id) {
            return Ok(b.clone());
        }
        let summary = Arc::new(
            cs.script_summary_since(script_hash, base.as_deref())
                .map_err(ApiError::internal)?,
        );
        if summary.stats.tx_count >= SUMMARY_CACHE_MIN_TXS {
            self.0.insert(*script_hash, summary.clone());
        }
        Ok(summary)
    }
}

/// What the path names: an address or a script hash, as given.
#[derive(Clone, Debug)]
pub(super) enum Subject {
    /// `/address/:address`.
    Address(String),
    /// `/scripthash/:hash`.
    ScriptHash(String),
}

impl Subject {
    /// The script hash it names, checked: 400 for an address that does
    /// not parse or is of another network, or a hash that is not 64 hex.
    pub(super) fn resolve(&self, cs: &ChainSnapshot) -> ApiResult<[u8; 32]> {
        match self {
            Subject::Address(a) => {
                let unchecked = Address::<NetworkUnchecked>::from_str(a)
                    .map_err(|e| ApiError::bad_request(format!("invalid address {a:?}: {e}")))?;
                let network = cs.params().network;
                let address = unchecked.require_network(network).map_err(|_| {
                    ApiError::bad_request(format!(
                        "address {a:?} is not for this node's network ({})",
                        cs.params().name()
                    ))
                })?;
                Ok(script_hash(address.script_pubkey().as_bytes()))
            }
            Subject::ScriptHash(h) => {
                if h.len() != 64 {
                    return Err(ApiError::bad_request(format!(
                        "invalid script hash {h:?}: expected 64 hex characters"
                    )));
                }
                <[u8; 32]>::from_hex(h)
                    .map_err(|_| ApiError::bad_request(format!("invalid script hash {h:?}")))
            }
        }
    }

    fn field(&self) -> (&'static str, &str) {
        match self {
            Subject::Address(a) => ("address", a),
            Subject::ScriptHash(h) => ("scripthash", h),
        }
    }
}

/// The 503 of a node without a complete address index.
fn check_index(cs: &ChainSnapshot) -> ApiResult<()> {
    if cs.address_index() {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "address index not available (the node runs with --no-address-index, or is building it)",
        ))
    }
}

/// Mempool transactions `…/txs` lists before the confirmed ones, and
/// `…/txs/mempool` at most (electrs' `MAX_MEMPOOL_TXS`).
pub const MEMPOOL_TXS_PER_PAGE: usize = 50;

/// The mempool entries paying to or spending from the script `sh`, newest
/// first.
fn mempool_entries(mempool: Option<&MempoolSnapshot>, sh: &[u8; 32]) -> Vec<Arc<MempoolEntry>> {
    mempool
        .map(|m| m.pool.by_script_hash(sh).rev().cloned().collect())
        .unwrap_or_default()
}

/// Esplora's `mempool_stats` of the script `sh` over `entries` (those
/// [`mempool_entries`] gives).
fn mempool_stats(entries: &[Arc<MempoolEntry>], sh: &[u8; 32]) -> ScriptStats {
    let mut st = ScriptStats {
        tx_count: entries.len() as u64,
        ..ScriptStats::default()
    };
    for e in entries {
        for o in
            e.tx.output
                .iter()
                .filter(|o| script_hash(o.script_pubkey.as_bytes()) == *sh)
        {
            st.funded_txo_count += 1;
            st.funded_txo_sum += o.value.to_sat();
        }
        for o in e
            .prevouts
            .iter()
            .filter(|o| script_hash(o.script_pubkey.as_bytes()) == *sh)
        {
            st.spent_txo_count += 1;
            st.spent_txo_sum += o.value.to_sat();
        }
    }
    st
}

/// Esplora's `{address|scripthash, chain_stats, mempool_stats}`.
fn stats_json(subject: &Subject, chain: &ScriptStats, mempool: &ScriptStats) -> serde_json::Value {
    let (field, name) = subject.field();
    serde_json::json!({
        field: name,
        "chain_stats": chain,
        "mempool_stats": mempool,
    })
}

async fn stats(s: AppState, cache: Arc<SummaryCache>, subject: Subject) -> ApiResult<Response> {
    let mempool = super::mempool::snapshot(&s);
    read(&s, move |cs| {
        let sh = subject.resolve(cs)?;
        check_index(cs)?;
        let summary = cache.summary(cs, &sh)?;
        let pending = mempool_stats(&mempool_entries(mempool.as_deref(), &sh), &sh);
        Ok(Json(stats_json(&subject, &summary.stats, &pending)).into_response())
    })
    .await
}

async fn txs(s: AppState, subject: Subject, last_seen: Option<String>) -> ApiResult<Response> {
    let last_seen: Option<Txid> = last_seen.as_deref().map(parse_txid).transpose()?;
    let mempool = super::mempool::snapshot(&s);
    read(&s, move |cs| {
        let sh = subject.resolve(cs)?;
        check_index(cs)?;
        let network = cs.params().network;
        let mut out: Vec<TransactionValue> = Vec::new();
        if last_seen.is_none() {
            out.extend(
                mempool_entries(mempool.as_deref(), &sh)
                    .iter()
                    .take(MEMPOOL_TXS_PER_PAGE)
                    .map(|e| tx_value_unconfirmed(e, network)),
            );
        }
        let page = cs
            .script_txs_with(&sh, last_seen.as_ref(), TXS_PER_PAGE, |h, tx, spent| {
                let e = cs.index().get(h.block).ok_or_else(|| {
                    ApiError::internal(format!("history row names unknown block {}", h.block.0))
                })?;
                Ok(tx_value_with(e, tx, spent, network))
            })
            .map_err(ApiError::internal)?;
        for v in page {
            out.push(v?);
        }
        Ok(Json(out).into_response())
    })
    .await
}

async fn mempool_txs(s: AppState, subject: Subject) -> ApiResult<Response> {
    let mempool = super::mempool::snapshot(&s);
    read(&s, move |cs| {
        let sh = subject.resolve(cs)?;
        let network = cs.params().network;
        let list: Vec<TransactionValue> = mempool_entries(mempool.as_deref(), &sh)
            .iter()
            .take(MEMPOOL_TXS_PER_PAGE)
            .map(|e| tx_value_unconfirmed(e, network))
            .collect();
        Ok(Json(list).into_response())
    })
    .await
}

async fn utxo(s: AppState, cache: Arc<SummaryCache>, subject: Subject) -> ApiResult<Response> {
    let mempool = super::mempool::snapshot(&s);
    read(&s, move |cs| {
        let sh = subject.resolve(cs)?;
        check_index(cs)?;
        let summary = cache.summary(cs, &sh)?;
        let pool = mempool.as_deref().map(|m| &m.pool);
        let spent_in_mempool =
            |op: &bitcoin::OutPoint| pool.is_some_and(|p| p.spender(op).is_some());
        let mut list = Vec::with_capacity(summary.utxos.len());
        for u in summary
            .utxos
            .iter()
            .filter(|u| !spent_in_mempool(&u.outpoint))
        {
            let status = cs.index().get(u.block).map(TxStatus::confirmed_in);
            list.push(serde_json::json!({
                "txid": u.outpoint.txid.to_string(),
                "vout": u.outpoint.vout,
                "status": status,
                "value": u.value,
            }));
        }
        for e in mempool_entries(mempool.as_deref(), &sh).iter().rev() {
            for (vout, o) in e.tx.output.iter().enumerate() {
                let op = bitcoin::OutPoint {
                    txid: e.txid,
                    vout: vout as u32,
                };
                if script_hash(o.script_pubkey.as_bytes()) == sh && !spent_in_mempool(&op) {
                    list.push(serde_json::json!({
                        "txid": e.txid.to_string(),
                        "vout": op.vout,
                        "status": TxStatus::unconfirmed(),
                        "value": o.value.to_sat(),
                    }));
                }
            }
        }
        Ok(Json(list).into_response())
    })
    .await
}

// ------------------------------------------------------------- handlers

pub(super) async fn address(
    State(s): State<AppState>,
    Extension(cache): Extension<Arc<SummaryCache>>,
    Path(a): Path<String>,
) -> ApiResult<Response> {
    stats(s, cache, Subject::Address(a)).await
}

pub(super) async fn address_txs(
    State(s): State<AppState>,
    Path(a): Path<String>,
) -> ApiResult<Response> {
    txs(s, Subject::Address(a), None).await
}

pub(super) async fn address_txs_after(
    State(s): State<AppState>,
    Path((a, last)): Path<(String, String)>,
) -> ApiResult<Response> {
    txs(s, Subject::Address(a), Some(last)).await
}

pub(super) async fn address_txs_mempool(
    State(s): State<AppState>,
    Path(a): Path<String>,
) -> ApiResult<Response> {
    mempool_txs(s, Subject::Address(a)).await
}

pub(super) async fn address_utxo(
    State(s): State<AppState>,
    Extension(cache): Extension<Arc<SummaryCache>>,
    Path(a): Path<String>,
) -> ApiResult<Response> {
    utxo(s, cache, Subject::Address(a)).await
}

pub(super) async fn scripthash(
    State(s): State<AppState>,
    Extension(cache): Extension<Arc<SummaryCache>>,
    Path(h): Path<String>,
) -> ApiResult<Response> {
    stats(s, cache, Subject::ScriptHash(h)).await
}

pub(super) async fn scripthash_txs(
    State(s): State<AppState>,
    Path(h): Path<String>,
) -> ApiResult<Response> {
    txs(s, Subject::ScriptHash(h), None).await
}

pub(super) async fn scripthash_txs_after(
    State(s): State<AppState>,
    Path((h, last)): Path<(String, String)>,
) -> ApiResult<Response> {
    txs(s, Subject::ScriptHash(h), Some(last)).await
}

pub(super) async fn scripthash_txs_mempool(
    State(s): State<AppState>,
    Path(h): Path<String>,
) -> ApiResult<Response> {
    mempool_txs(s, Subject::ScriptHash(h)).await
}

pub(super) async fn scripthash_utxo(
    State(s): State<AppState>,
    Extension(cache): Extension<Arc<SummaryCache>>,
    Path(h): Path<String>,
) -> ApiResult<Response> {
    utxo(s, cache, Subject::ScriptHash(h)).await
}

/// The route table of this module: (method, path, handler).
pub(super) fn route_table() -> Vec<super::RouteEntry> {
    use axum::routing::get;
    vec![
        ("get", "/address/{address}", get(address)),
        ("get", "/address/{address}/txs", get(address_txs)),
        ("get", "/address/{address}/txs/chain", get(address_txs)),
        (
            "get",
            "/address/{address}/txs/chain/{last_seen_txid}",
            get(address_txs_after),
        ),
        (
            "get",
            "/address/{address}/txs/mempool",
            get(address_txs_mempool),
        ),
        ("get", "/address/{address}/utxo", get(address_utxo)),
        ("get", "/scripthash/{scripthash}", get(scripthash)),
        ("get", "/scripthash/{scripthash}/txs", get(scripthash_txs)),
        (
            "get",
            "/scripthash/{scripthash}/txs/chain",
            get(scripthash_txs),
        ),
        (
            "get",
            "/scripthash/{scripthash}/txs/chain/{last_seen_txid}",
            get(scripthash_txs_after),
        ),
        (
            "get",
            "/scripthash/{scripthash}/txs/mempool",
            get(scripthash_txs_mempool),
        ),
        ("get", "/scripthash/{scripthash}/utxo", get(scripthash_utxo)),
        ("get", "/mempool", get(super::mempool::summary)),
        ("get", "/mempool/txids", get(super::mempool::txids)),
        ("get", "/mempool/recent", get(super::mempool::recent)),
    ]
}
