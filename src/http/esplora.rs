//! The Esplora-compatible routes: same paths and JSON shapes as Blockstream's
//! Esplora (`Blockstream/esplora` `API.md`, served by `Blockstream/electrs`
//! `src/rest.rs`), so BDK's `esplora-client` works unchanged.
//!
//! A transaction is found through the txid index (`tx_by_txid_prefix`,
//! candidates checked against the stored block) in the block of the active
//! chain that holds it, else in the mempool (`status: {"confirmed":
//! false}`, its prevouts and fee from the mempool entry); a transaction
//! only in stale blocks and not in the mempool is 404.
//!
//! Outspends come from the spend index (`spend_by_outpoint_prefix`, written
//! at connect; the spender is read from the spent-output record of the
//! candidate block on the active chain), then from the UTXO table's records.
//! An output the table purged and no spend row names is reported
//! `spent: true` without the spender (`txid`, `vin`, `status` absent),
//! which Esplora's shape allows. An output no block spends but a mempool
//! transaction does is `spent: true` with that spender and an unconfirmed
//! status.

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bitcoin::consensus::encode::{deserialize, serialize, serialize_hex};
use bitcoin::merkle_tree::MerkleBlock;
use bitcoin::{Block, Script, Transaction, Txid};
use serde::Serialize;

use super::esplora_json::{
    parse_txid, tx_value_unconfirmed, tx_value_with, TransactionValue, TxStatus, TXS_PER_PAGE,
};
use super::{parse_hash, read, text, ApiError, ApiResult, AppState};
use crate::chain::index::IndexEntry;
use crate::mempool::{MempoolEntry, MempoolSnapshot};
use crate::snapshot::ChainSnapshot;
use crate::sozu::ViewStatus;
use crate::validation::SpentOutput;
use std::sync::Arc;

/// Blocks per page of `/blocks[/:start_height]` (Esplora's `BLOCK_LIMIT`).
pub const BLOCKS_PER_PAGE: u32 = 10;

/// Esplora's block summary (`BlockValue` in electrs `rest.rs`).
#[derive(Serialize)]
struct BlockValue {
    id: String,
    height: u32,
    version: i32,
    timestamp: u32,
    tx_count: usize,
    size: usize,
    weight: u64,
    merkle_root: String,
    previousblockhash: Option<String>,
    mediantime: u32,
    nonce: u32,
    bits: u32,
    difficulty: f64,
}

/// Esplora's spending status of an output.
#[derive(Serialize)]
struct SpendingValue {
    spent: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    txid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vin: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<TxStatus>,
}

fn not_found_block(hash: &bitcoin::BlockHash) -> ApiError {
    ApiError::not_found(format!("block {hash} not found"))
}

fn parse_u32(what: &str, s: &str) -> ApiResult<u32> {
    s.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid {what} {s:?}")))
}

/// The serialized block `e` (the genesis block from the parameters, as it
/// is not stored), 404 if its data is not stored (a header only).
fn load_block_raw(cs: &ChainSnapshot, e: &IndexEntry) -> ApiResult<Vec<u8>> {
    if e.height == 0 && e.hash == cs.params().genesis_hash() {
        return Ok(serialize(&cs.params().genesis_block()));
    }
    cs.read_block_raw(e.id)
        .map_err(ApiError::internal)?
        .ok_or_else(|| ApiError::not_found(format!("block {} data not stored", e.hash)))
}

/// The block `e`, decoded (see [`load_block_raw`]).
pub(super) fn load_block(cs: &ChainSnapshot, e: &IndexEntry) -> ApiResult<Block> {
    deserialize(&load_block_raw(cs, e)?).map_err(ApiError::internal)
}

fn entry_by_hash<'a>(cs: &'a ChainSnapshot, hash: &str) -> ApiResult<&'a IndexEntry> {
    let hash = parse_hash(hash)?;
    cs.index()
        .by_hash(&hash)
        .ok_or_else(|| not_found_block(&hash))
}

fn block_value(cs: &ChainSnapshot, e: &IndexEntry) -> ApiResult<BlockValue> {
    let raw = load_block_raw(cs, e)?;
    let block: Block = deserialize(&raw).map_err(ApiError::internal)?;
    let h = &e.header;
    Ok(BlockValue {
        id: e.hash.to_string(),
        height: e.height,
        version: h.version.to_consensus(),
        timestamp: h.time,
        tx_count: block.txdata.len(),
        size: raw.len(),
        weight: block.weight().to_wu(),
        merkle_root: h.merkle_root.to_string(),
        previousblockhash: (e.height > 0).then(|| h.prev_blockhash.to_string()),
        mediantime: cs.index().median_time_past(e.id),
        nonce: h.nonce,
        bits: h.bits.to_consensus(),
        difficulty: h.difficulty_float(),
    })
}

/// The active-chain block holding `txid` and the transaction's position.
fn locate_tx<'a>(cs: &'a ChainSnapshot, txid: &Txid) -> ApiResult<(&'a IndexEntry, u32)> {
    let blocks = cs.tx_blocks(txid).map_err(ApiError::internal)?;
    for (id, pos) in blocks {
        if cs.index().is_active(id) {
            if let Some(e) = cs.index().get(id) {
                return Ok((e, pos));
            }
        }
    }
    Err(ApiError::not_found(format!(
        "transaction {txid} not found on the active chain"
    )))
}

/// The block holding `txid` on the active chain, the transaction and its position.
fn load_tx<'a>(cs: &'a ChainSnapshot, txid: &Txid) -> ApiResult<(&'a IndexEntry, Block, usize)> {
    let (e, pos) = locate_tx(cs, txid)?;
    let block = load_block(cs, e)?;
    let pos = pos as usize;
    match block.txdata.get(pos) {
        Some(tx) if tx.compute_txid() == *txid => Ok((e, block, pos)),
        _ => Err(ApiError::internal(format!(
            "txid index points {txid} at position {pos} of block {}, which holds another",
            e.hash
        ))),
    }
}

/// A transaction found on the active chain or in the mempool.
enum Found<'a> {
    /// In block `.0` at position `.2` of the block `.1`.
    Confirmed(&'a IndexEntry, Block, usize),
    /// In the mempool.
    Unconfirmed(Arc<MempoolEntry>),
}

impl Found<'_> {
    fn tx(&self) -> &Transaction {
        match self {
            Found::Confirmed(_, block, pos) => &block.txdata[*pos],
            Found::Unconfirmed(e) => &e.tx,
        }
    }
}

/// `txid` on the active chain, else in the mempool snapshot `mempool`.
fn find_tx<'a>(
    cs: &'a ChainSnapshot,
    mempool: Option<&MempoolSnapshot>,
    txid: &Txid,
) -> ApiResult<Found<'a>> {
    match load_tx(cs, txid) {
        Ok((e, block, pos)) => Ok(Found::Confirmed(e, block, pos)),
        Err(not_found) => match mempool.and_then(|m| m.pool.get(txid)) {
            Some(entry) => Ok(Found::Unconfirmed(entry.clone())),
            None => Err(not_found),
        },
    }
}

/// The spent outputs of block `e`, for the prevouts of its transactions;
/// 503 when the block has none recorded (not connected).
pub(super) fn block_spent(cs: &ChainSnapshot, e: &IndexEntry) -> ApiResult<Vec<SpentOutput>> {
    cs.spent_outputs(e.id)
        .map_err(ApiError::internal)?
        .ok_or_else(|| {
            ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                format!("spent outputs of block {} not indexed", e.hash),
            )
        })
}

fn tx_value(cs: &ChainSnapshot, e: &IndexEntry, tx: &Transaction) -> ApiResult<TransactionValue> {
    let spent = if tx.is_coinbase() {
        Vec::new()
    } else {
        block_spent(cs, e)?
    };
    Ok(tx_value_with(e, tx, &spent, cs.params().network))
}

/// Whether an output never enters the UTXO table (OP_RETURN or a script
/// over 10,000 bytes): Esplora reports those unspent forever.
fn unspendable(s: &Script) -> bool {
    s.is_op_return() || s.len() > 10_000
}

fn outspends_of(
    cs: &ChainSnapshot,
    mempool: Option<&MempoolSnapshot>,
    found: &Found<'_>,
    vouts: &[u32],
) -> ApiResult<Vec<SpendingValue>> {
    let tx = found.tx();
    let txid = tx.compute_txid();
    let confirmed = match found {
        Found::Confirmed(..) => confirmed_outspends(cs, tx, vouts)?,
        // Outputs of a mempool transaction: no block spends them.
        Found::Unconfirmed(_) => vouts.iter().map(|_| SpendingValue::unspent()).collect(),
    };
    Ok(confirmed
        .into_iter()
        .zip(vouts)
        .map(|(v, &vout)| {
            let op = bitcoin::OutPoint { txid, vout };
            match mempool.and_then(|m| Some((m, m.pool.spender(&op)?))) {
                Some((m, spender)) if !v.spent => {
                    let vin = m
                        .pool
                        .get(&spender)
                        .and_then(|e| e.tx.input.iter().position(|i| i.previous_output == op));
                    SpendingValue {
                        spent: true,
                        txid: Some(spender.to_string()),
                        vin: vin.map(|i| i as u32),
                        status: Some(TxStatus::unconfirmed()),
                    }
                }
                _ => v,
            }
        })
        .collect())
}

impl SpendingValue {
    fn unspent() -> Self {
        SpendingValue {
            spent: false,
            txid: None,
            vin: None,
            status: None,
        }
    }
}

/// The spending status of outputs `vouts` of `tx` (confirmed on the
/// active chain) by the chain alone.
fn confirmed_outspends(
    cs: &ChainSnapshot,
    tx: &Transaction,
    vouts: &[u32],
) -> ApiResult<Vec<SpendingValue>> {
    let txid = tx.compute_txid();
    let ops: Vec<bitcoin::OutPoint> = vouts
        .iter()
        .map(|&vout| bitcoin::OutPoint { txid, vout })
        .collect();
    let entries = cs.lookup_outpoints(&ops).map_err(ApiError::internal)?;
    let index = cs.index();
    let view = index.view(index.tip().id);
    let mut out = Vec::with_capacity(vouts.len());
    for (vout, entry) in vouts.iter().zip(entries) {
        let script = tx
            .output
            .get(*vout as usize)
            .map(|o| o.script_pubkey.as_script());
        let unspent = SpendingValue::unspent();
        let op = bitcoin::OutPoint { txid, vout: *vout };
        if let Some((block, spend)) = cs.active_spender(&op).map_err(ApiError::internal)? {
            out.push(SpendingValue {
                spent: true,
                txid: Some(spend.txid.to_string()),
                vin: Some(spend.vin),
                status: index.get(block).map(TxStatus::confirmed_in),
            });
            continue;
        }
        let v = match entry {
            Some(entry) => match entry.status_in(&view) {
                ViewStatus::Spent(c) => SpendingValue {
                    spent: true,
                    txid: Some(c.txid.to_string()),
                    vin: Some(c.vin),
                    status: index.get(c.block).map(TxStatus::confirmed_in),
                },
                // Absent under the view cannot happen for a transaction of
                // the active chain; report it unspent like Esplora would for
                // an output it does not track.
                ViewStatus::Unspent | ViewStatus::Absent => unspent,
            },
            None if script.is_some_and(unspendable) => unspent,
            // Not in the table although created on the active chain: unspent
            // entries are never purged, so it was consumed at least 100
            // blocks deep and purged; the spender is not known here.
            None => SpendingValue {
                spent: true,
                txid: None,
                vin: None,
                status: None,
            },
        };
        out.push(v);
    }
    Ok(out)
}

// ---------------------------------------------------------------- handlers

pub(super) async fn blocks_tip(State(s): State<AppState>) -> ApiResult<Response> {
    blocks_from(s, None).await
}

pub(super) async fn blocks_from_height(
    State(s): State<AppState>,
    Path(start): Path<String>,
) -> ApiResult<Response> {
    let start = parse_u32("height", &start)?;
    blocks_from(s, Some(start)).await
}

async fn blocks_from(s: AppState, start: Option<u32>) -> ApiResult<Response> {
    read(&s, move |cs| {
        let tip = cs.index().tip_height();
        let start = match start {
            Some(h) if h > tip => {
                return Err(ApiError::not_found(format!(
                    "height {h} is above the tip ({tip})"
                )))
            }
            Some(h) => h,
            None => tip,
        };
        let mut out = Vec::new();
        for h in (start.saturating_sub(BLOCKS_PER_PAGE - 1)..=start).rev() {
            if let Some(e) = cs.index().active_at(h) {
                out.push(block_value(cs, e)?);
            }
        }
        Ok(Json(out).into_response())
    })
    .await
}

pub(super) async fn block(
    State(s): State<AppState>,
    Path(hash): Path<String>,
) -> ApiResult<Response> {
    read(&s, move |cs| {
        let e = entry_by_hash(cs, &hash)?;
        Ok(Json(block_value(cs, e)?).into_response())
    })
    .await
}

pub(super) async fn block_status(
    State(s): State<AppState>,
    Path(hash): Path<String>,
) -> ApiResult<Response> {
    read(&s, move |cs| {
        let e = entry_by_hash(cs, &hash)?;
        let index = cs.index();
        let in_best = index.is_active(e.id);
        let mut v = serde_json::json!({ "in_best_chain": in_best });
        if in_best {
            v["height"] = e.height.into();
            v["next_best"] = match index.active_at(e.height + 1) {
                Some(n) => n.hash.to_string().into(),
                None => serde_json::Value::Null,
            };
        }
        Ok(Json(v).into_response())
    })
    .await
}

pub(super) async fn block_txids(
    State(s): State<AppState>,
    Path(hash): Path<String>,
) -> ApiResult<Response> {
    read(&s, move |cs| {
        let e = entry_by_hash(cs, &hash)?;
        let block = load_block(cs, e)?;
        let ids: Vec<String> = block
            .txdata
            .iter()
            .map(|t| t.compute_txid().to_string())
            .collect();
        Ok(Json(ids).into_response())
    })
    .await
}

/// `GET /block/:hash/txs[/:start_index]`: Esplora's JSON of the block's
/// transactions `start_index..start_index + 25` in block order (electrs'
/// `CHAIN_TXS_PER_PAGE`, [`TXS_PER_PAGE`]).
///
/// As electrs answers: a `start_index` that is not a multiple of 25 is a 400,
/// one at or past the block's transaction count a 404. A block off the active
/// chain is served too; each transaction's `status` is then where the active
/// chain confirms it, or unconfirmed (electrs' `prepare_txs` reads the status
/// the same way). Unlike electrs, a `start_index` that is not a number is a
/// 400, not page 0.
///
/// # Errors
/// 400 for a bad hash or index, 404 for an unknown block or an index out of
/// range, 503 when the block's spent outputs are not indexed (not connected).
pub(super) async fn block_txs(
    State(s): State<AppState>,
    Path(hash): Path<String>,
) -> ApiResult<Response> {
    read(&s, move |cs| block_txs_page(cs, &hash, 0)).await
}

/// `GET /block/:hash/txs/:start_index` (see [`block_txs`]).
pub(super) async fn block_txs_from(
    State(s): State<AppState>,
    Path((hash, start)): Path<(String, String)>,
) -> ApiResult<Response> {
    let start = parse_u32("start index", &start)? as usize;
    read(&s, move |cs| block_txs_page(cs, &hash, start)).await
}

fn block_txs_page(cs: &ChainSnapshot, hash: &str, start: usize) -> ApiResult<Response> {
    if !start.is_multiple_of(TXS_PER_PAGE) {
        return Err(ApiError::bad_request(format!(
            "start index {start} is not a multiple of {TXS_PER_PAGE}"
        )));
    }
    let e = entry_by_hash(cs, hash)?;
    let block = load_block(cs, e)?;
    let page = block.txdata.get(start..).unwrap_or_default();
    if page.is_empty() {
        return Err(ApiError::not_found(format!(
            "block {} has {} transactions, no index {start}",
            e.hash,
            block.txdata.len()
        )));
    }
    let page = &page[..page.len().min(TXS_PER_PAGE)];
    let spent = if page.iter().all(Transaction::is_coinbase) {
        Vec::new()
    } else {
        block_spent(cs, e)?
    };
    let active = cs.index().is_active(e.id);
    let network = cs.params().network;
    let txs = page
        .iter()
        .map(|tx| {
            let mut v = tx_value_with(e, tx, &spent, network);
            if !active {
                v.status = match locate_tx(cs, &tx.compute_txid()) {
                    Ok((at, _)) => TxStatus::confirmed_in(at),
                    Err(_) => TxStatus::unconfirmed(),
                };
            }
            v
        })
        .collect::<Vec<_>>();
    Ok(Json(txs).into_response())
}

pub(super) async fn block_txid_at(
    State(s): State<AppState>,
    Path((hash, index)): Path<(String, String)>,
) -> ApiResult<Response> {
    let i = parse_u32("transaction index", &index)?;
    read(&s, move |cs| {
        let e = entry_by_hash(cs, &hash)?;
        let block = load_block(cs, e)?;
        block
            .txdata
            .get(i as usize)
            .map(|t| text(t.compute_txid().to_string()))
            .ok_or_else(|| {
                ApiError::not_found(format!(
                    "block {} has {} transactions, no index {i}",
                    e.hash,
                    block.txdata.len()
                ))
            })
    })
    .await
}

pub(super) async fn block_raw(
    State(s): State<AppState>,
    Path(hash): Path<String>,
) -> ApiResult<Response> {
    read(&s, move |cs| {
        let e = entry_by_hash(cs, &hash)?;
        let raw = load_block_raw(cs, e)?;
        Ok(([(header::CONTENT_TYPE, "application/octet-stream")], raw).into_response())
    })
    .await
}

pub(super) async fn tx(State(s): State<AppState>, Path(txid): Path<String>) -> ApiResult<Response> {
    let txid = parse_txid(&txid)?;
    let mempool = super::mempool::snapshot(&s);
    read(&s, move |cs| {
        let value = match find_tx(cs, mempool.as_deref(), &txid)? {
            Found::Confirmed(e, block, pos) => tx_value(cs, e, &block.txdata[pos])?,
            Found::Unconfirmed(entry) => tx_value_unconfirmed(&entry, cs.params().network),
        };
        Ok(Json(value).into_response())
    })
    .await
}

pub(super) async fn tx_hex(
    State(s): State<AppState>,
    Path(txid): Path<String>,
) -> ApiResult<Response> {
    let txid = parse_txid(&txid)?;
    let mempool = super::mempool::snapshot(&s);
    read(&s, move |cs| {
        let found = find_tx(cs, mempool.as_deref(), &txid)?;
        Ok(text(serialize_hex(found.tx())))
    })
    .await
}

pub(super) async fn tx_raw(
    State(s): State<AppState>,
    Path(txid): Path<String>,
) -> ApiResult<Response> {
    let txid = parse_txid(&txid)?;
    let mempool = super::mempool::snapshot(&s);
    read(&s, move |cs| {
        let found = find_tx(cs, mempool.as_deref(), &txid)?;
        Ok((
            [(header::CONTENT_TYPE, "application/octet-stream")],
            serialize(found.tx()),
        )
            .into_response())
    })
    .await
}

pub(super) async fn tx_status(
    State(s): State<AppState>,
    Path(txid): Path<String>,
) -> ApiResult<Response> {
    let txid = parse_txid(&txid)?;
    let mempool = super::mempool::snapshot(&s);
    read(&s, move |cs| {
        let status = match locate_tx(cs, &txid) {
            Ok((e, _)) => TxStatus::confirmed_in(e),
            Err(_) if mempool.as_ref().is_some_and(|m| m.pool.contains(&txid)) => {
                TxStatus::unconfirmed()
            }
            // Esplora answers an unknown txid with an unconfirmed status.
            Err(_) => TxStatus::unconfirmed(),
        };
        Ok(Json(status).into_response())
    })
    .await
}

pub(super) async fn tx_merkle_proof(
    State(s): State<AppState>,
    Path(txid): Path<String>,
) -> ApiResult<Response> {
    let txid = parse_txid(&txid)?;
    read(&s, move |cs| {
        let (e, block, pos) = load_tx(cs, &txid)?;
        let leaves: Vec<Txid> = block.txdata.iter().map(|t| t.compute_txid()).collect();
        let merkle: Vec<String> = crate::validation::merkle::merkle_branch(&leaves, pos)
            .iter()
            .map(|h| h.to_string())
            .collect();
        Ok(Json(serde_json::json!({
            "block_height": e.height,
            "merkle": merkle,
            "pos": pos,
        }))
        .into_response())
    })
    .await
}

pub(super) async fn tx_merkleblock_proof(
    State(s): State<AppState>,
    Path(txid): Path<String>,
) -> ApiResult<Response> {
    let txid = parse_txid(&txid)?;
    read(&s, move |cs| {
        let (_, block, _) = load_tx(cs, &txid)?;
        let mb = MerkleBlock::from_block_with_predicate(&block, |t| *t == txid);
        Ok(text(serialize_hex(&mb)))
    })
    .await
}

pub(super) async fn tx_outspend(
    State(s): State<AppState>,
    Path((txid, vout)): Path<(String, String)>,
) -> ApiResult<Response> {
    let txid = parse_txid(&txid)?;
    let vout = parse_u32("output index", &vout)?;
    let mempool = super::mempool::snapshot(&s);
    read(&s, move |cs| {
        let found = find_tx(cs, mempool.as_deref(), &txid)?;
        let tx = found.tx();
        if vout as usize >= tx.output.len() {
            return Err(ApiError::not_found(format!(
                "transaction {txid} has {} outputs, no output {vout}",
                tx.output.len()
            )));
        }
        let mut v = outspends_of(cs, mempool.as_deref(), &found, &[vout])?;
        match v.pop() {
            Some(one) => Ok(Json(one).into_response()),
            None => Err(ApiError::internal("outspend lookup returned nothing")),
        }
    })
    .await
}

pub(super) async fn tx_outspends(
    State(s): State<AppState>,
    Path(txid): Path<String>,
) -> ApiResult<Response> {
    let txid = parse_txid(&txid)?;
    let mempool = super::mempool::snapshot(&s);
    read(&s, move |cs| {
        let found = find_tx(cs, mempool.as_deref(), &txid)?;
        let vouts: Vec<u32> = (0..found.tx().output.len() as u32).collect();
        Ok(Json(outspends_of(cs, mempool.as_deref(), &found, &vouts)?).into_response())
    })
    .await
}
