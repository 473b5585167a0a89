//! Bitcoin Core's REST interface (`src/rest.cpp`, `doc/REST-interface.md`):
//! `/rest/chaininfo.json`, `/rest/block/<hash>.<bin|hex|json>` and
//! `/rest/headers/<hash>.<bin|hex|json>?count=N` (and the older
//! `/rest/headers/<count>/<hash>.<ext>`). The filter routes live in the
//! parent module.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bitcoin::consensus::encode::serialize;

use super::{
    active_run, bin_or_hex, parse_count, parse_hash, read, split_format, ApiError, ApiResult,
    AppState, Format,
};
use crate::chain::index::IndexEntry;
use crate::snapshot::ChainSnapshot;

/// Largest `count` of `/rest/headers` (Core's `MAX_REST_HEADERS_RESULTS`).
pub const MAX_REST_HEADERS: u32 = 2000;

/// Core's `getblockheader` JSON of `e` (`blockheaderToJSON`).
pub(crate) fn header_json(cs: &ChainSnapshot, e: &IndexEntry) -> serde_json::Value {
    let index = cs.index();
    let active = index.is_active(e.id);
    let confirmations: i64 = if active {
        i64::from(index.tip_height()) - i64::from(e.height) + 1
    } else {
        -1
    };
    let h = &e.header;
    let mut v = serde_json::json!({
        "hash": e.hash.to_string(),
        "confirmations": confirmations,
        "height": e.height,
        "version": h.version.to_consensus(),
        "versionHex": format!("{:08x}", h.version.to_consensus()),
        "merkleroot": h.merkle_root.to_string(),
        "time": h.time,
        "mediantime": index.median_time_past(e.id),
        "nonce": h.nonce,
        "bits": format!("{:08x}", h.bits.to_consensus()),
        "difficulty": h.difficulty_float(),
        "chainwork": super::hex(&e.chainwork.to_be_bytes()),
    });
    if e.height > 0 {
        v["previousblockhash"] = h.prev_blockhash.to_string().into();
    }
    if active {
        if let Some(n) = index.active_at(e.height + 1) {
            v["nextblockhash"] = n.hash.to_string().into();
        }
    }
    v
}

/// `GET /rest/chaininfo.json`: the fields of Core's `getblockchaininfo`
/// that kakehi knows (no `size_on_disk`, `verificationprogress` is 1 at the
/// best known header).
pub(super) async fn chaininfo(State(s): State<AppState>) -> ApiResult<Response> {
    read(&s, |cs| Ok(Json(chaininfo_json(cs)).into_response())).await
}

/// Core's `getblockchaininfo` result, the fields kakehi knows (no
/// `size_on_disk`; `verificationprogress` is 1 at the best known header).
pub(crate) fn chaininfo_json(cs: &ChainSnapshot) -> serde_json::Value {
    let index = cs.index();
    let tip = index.tip();
    let headers = index.entries().map(|e| e.height).max().unwrap_or(0);
    serde_json::json!({
        "chain": cs.params().network.to_core_arg(),
        "blocks": tip.height,
        "headers": headers,
        "bestblockhash": tip.hash.to_string(),
        "difficulty": tip.header.difficulty_float(),
        "time": tip.header.time,
        "mediantime": index.median_time_past(tip.id),
        "verificationprogress": if headers == tip.height { 1.0 } else { f64::from(tip.height) / f64::from(headers.max(1)) },
        "initialblockdownload": headers > tip.height,
        "chainwork": super::hex(&tip.chainwork.to_be_bytes()),
        "pruned": false,
        "warnings": [],
    })
}

/// The serialized block of `e` (the genesis block from the chain's
/// parameters); `None` when its data is not stored.
///
/// # Errors
/// Reading the block files fails.
pub(crate) fn block_raw(
    cs: &ChainSnapshot,
    e: &IndexEntry,
) -> Result<Option<Vec<u8>>, crate::snapshot::ReadError> {
    if e.height == 0 && e.hash == cs.params().genesis_hash() {
        return Ok(Some(serialize(&cs.params().genesis_block())));
    }
    cs.read_block_raw(e.id)
}

/// Core's `getblock` JSON of block `e` serialized as `raw`
/// (`blockToJSON`): `tx` as txids, or with `tx_details` as full
/// transaction objects with `fee` from the block's stored spent outputs.
///
/// # Errors
/// `raw` does not decode, or the spent outputs cannot be read.
pub(crate) fn block_json(
    cs: &ChainSnapshot,
    e: &IndexEntry,
    raw: &[u8],
    tx_details: bool,
) -> Result<serde_json::Value, Box<dyn std::error::Error + Send + Sync>> {
    let block: bitcoin::Block = bitcoin::consensus::deserialize(raw)?;
    let mut v = header_json(cs, e);
    v["size"] = raw.len().into();
    v["strippedsize"] = block
        .txdata
        .iter()
        .map(|t| t.base_size())
        .sum::<usize>()
        .saturating_add(80 + bitcoin::VarInt(block.txdata.len() as u64).size())
        .into();
    v["weight"] = block.weight().to_wu().into();
    v["nTx"] = block.txdata.len().into();
    v["tx"] = if tx_details {
        // Inputs' values per spending tx, from the block's spent outputs
        // (Core's undo data; absent for a block never connected).
        let mut input_totals: std::collections::HashMap<bitcoin::Txid, u64> =
            std::collections::HashMap::new();
        let spent = if e.height == 0 {
            None
        } else {
            cs.spent_outputs(e.id)?
        };
        if let Some(spent) = &spent {
            for so in spent {
                *input_totals.entry(so.txid).or_default() += so.coin.value.to_sat();
            }
        }
        let network = cs.params().network;
        block
            .txdata
            .iter()
            .map(|t| {
                let total = spent
                    .as_ref()
                    .map(|_| input_totals.get(&t.compute_txid()).copied().unwrap_or(0));
                super::core_tx::tx_json(t, network, total)
            })
            .collect::<Vec<_>>()
            .into()
    } else {
        block
            .txdata
            .iter()
            .map(|t| t.compute_txid().to_string())
            .collect::<Vec<_>>()
            .into()
    };
    Ok(v)
}

/// `GET /rest/block/<hash>.<ext>`: the serialized block, or Core's block
/// JSON with `tx` as full transaction objects (`getblock <hash> 2`, with
/// `fee` from the block's stored spent outputs).
pub(super) async fn block(
    State(s): State<AppState>,
    Path(file): Path<String>,
) -> ApiResult<Response> {
    block_common(s, file, true).await
}

/// `GET /rest/block/notxdetails/<hash>.<ext>`: as [`block`], but the JSON
/// `tx` is the list of txids (`getblock <hash> 1`).
pub(super) async fn block_notxdetails(
    State(s): State<AppState>,
    Path(file): Path<String>,
) -> ApiResult<Response> {
    block_common(s, file, false).await
}

async fn block_common(s: AppState, file: String, tx_details: bool) -> ApiResult<Response> {
    let (hash, format) = split_format(&file)?;
    let hash = parse_hash(hash)?;
    read(&s, move |cs| {
        let e = cs
            .index()
            .by_hash(&hash)
            .ok_or_else(|| ApiError::not_found(format!("block {hash} not found")))?;
        let raw = block_raw(cs, e)
            .map_err(ApiError::internal)?
            .ok_or_else(|| ApiError::not_found(format!("block {hash} data not stored")))?;
        if format != Format::Json {
            return Ok(bin_or_hex(raw, format));
        }
        let v = block_json(cs, e, &raw, tx_details).map_err(ApiError::internal)?;
        Ok(Json(v).into_response())
    })
    .await
}

#[derive(serde::Deserialize)]
pub(super) struct CountQuery {
    count: Option<String>,
}

/// `GET /rest/headers/<hash>.<ext>?count=N` (N defaults to 5, at most
/// [`MAX_REST_HEADERS`]): up to N headers of the active chain from `hash`
/// (only `hash` itself if it is not on the active chain).
pub(super) async fn headers(
    State(s): State<AppState>,
    Path(file): Path<String>,
    Query(q): Query<CountQuery>,
) -> ApiResult<Response> {
    headers_common(s, file, q.count.unwrap_or_else(|| "5".into())).await
}

/// `GET /rest/headers/<count>/<hash>.<ext>` (Core's older form).
pub(super) async fn headers_legacy(
    State(s): State<AppState>,
    Path((count, file)): Path<(String, String)>,
) -> ApiResult<Response> {
    headers_common(s, file, count).await
}

async fn headers_common(s: AppState, file: String, count: String) -> ApiResult<Response> {
    let (hash, format) = split_format(&file)?;
    let hash = parse_hash(hash)?;
    let count = parse_count(&count, MAX_REST_HEADERS)?;
    read(&s, move |cs| {
        let index = cs.index();
        let entries = active_run(index, &hash, count)?;
        if format == Format::Json {
            let v: Vec<serde_json::Value> = entries.iter().map(|e| header_json(cs, e)).collect();
            return Ok(Json(v).into_response());
        }
        let mut bytes = Vec::with_capacity(entries.len() * 80);
        for e in &entries {
            bytes.extend_from_slice(&serialize(&e.header));
        }
        Ok(bin_or_hex(bytes, format))
    })
    .await
}
