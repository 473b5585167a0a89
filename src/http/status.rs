//! The status page at `/` (plain HTML and JavaScript embedded in the
//! binary, no build step: `src/http/status.html`) and the JSON it reads
//! first, `GET /node/status`. The page otherwise uses only the API's own
//! routes (`/blocks`, `/chain/tips`, `/archive/status/…`,
//! `/tx/…/outspend/…`, `/proof/outpoint/…`, and for the address lookup
//! `/address/…`, `/address/…/utxo`, `/address/…/txs/chain…` and `POST
//! /proof/outpoints`).
//!
//! Peers come from [`AppState::p2p`], the handle of the P2P layer running in
//! the same process; without one `peers` is `null`.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{read, ApiResult, AppState};
use crate::chain::index::{ChainIndex, IndexEntry};
use crate::p2p::P2pHandle;

/// The page's HTML (with its script and style inline).
pub const STATUS_HTML: &str = include_str!("status.html");

/// `GET /`: the status page.
pub(super) async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        STATUS_HTML,
    )
        .into_response()
}

/// The most-work header not known to be invalid (Core's
/// `pindexBestHeader`, [`ChainIndex::best_header`]); the active tip when
/// none has more work than it.
pub(crate) fn best_header(index: &ChainIndex) -> &IndexEntry {
    let best = index.best_header();
    if best.chainwork > index.tip().chainwork {
        best
    } else {
        index.tip()
    }
}

/// Peer counts and list of a P2P handle, as `/node/status` shows them:
/// `{"count", "inbound", "outbound", "list": [{"id", "addr", "inbound",
/// "user_agent", "services", "start_height"}], "discouraged": ["ip", …]}`
/// (the addresses discouraged for misbehaviour, Core's 24-hour
/// discouragement).
pub(crate) fn peers_json(p2p: &P2pHandle) -> serde_json::Value {
    let peers = p2p.peers();
    let inbound = peers.iter().filter(|p| p.inbound).count();
    let list: Vec<serde_json::Value> = peers
        .iter()
        .map(|p| {
            serde_json::json!({
                "id": p.id,
                "addr": p.addr.to_string(),
                "inbound": p.inbound,
                "user_agent": p.user_agent,
                "services": p.services,
                "start_height": p.start_height,
            })
        })
        .collect();
    serde_json::json!({
        "count": peers.len(),
        "inbound": inbound,
        "outbound": peers.len() - inbound,
        "list": list,
        "discouraged": p2p
            .discouraged()
            .iter()
            .map(|ip| ip.to_string())
            .collect::<Vec<_>>(),
    })
}

/// `GET /node/status`: `{"network", "version", "tip": {"height", "hash",
/// "time", "mediantime"}, "headers": {"height", "hash"}, "sync":
/// "synced"|"syncing", "validation": {"assumevalid", "inputs_verified",
/// "blocks_assumed_valid"}, "peers": null | {…}, "mempool": null |
/// {"count", "vbytes", "usage_bytes", "total_fee", "min_feerate",
/// "histogram"}}` (sats; `min_feerate` in sat/vB; `histogram` the fee
/// histogram of `/mempool`). `sync` is `syncing`
/// while a valid-looking header chain has more work than the active tip
/// (Core's `initialblockdownload` test on headers); times are Unix seconds.
/// `validation.assumevalid` is `"0"` (every script verified) or the
/// assumevalid block hash; the counters are since the node started.
pub(super) async fn node_status(State(s): State<AppState>) -> ApiResult<Response> {
    let peers = s.p2p.as_ref().map(peers_json);
    let mempool = super::mempool::snapshot(&s).map(|m| {
        let t = m.pool.totals();
        serde_json::json!({
            "count": t.count,
            "vbytes": t.vsize,
            "usage_bytes": t.usage,
            "total_fee": t.fees,
            "min_feerate": m.min_feerate as f64 / 1000.0,
            "histogram": super::mempool::fee_histogram(m.pool.iter_by_entry()),
        })
    });
    read(&s, move |cs| {
        let index = cs.index();
        let tip = index.tip();
        let best = best_header(index);
        let synced = best.chainwork <= tip.chainwork;
        Ok(Json(serde_json::json!({
            "network": cs.params().name(),
            "version": env!("CARGO_PKG_VERSION"),
            "tip": {
                "height": tip.height,
                "hash": tip.hash.to_string(),
                "time": tip.header.time,
                "mediantime": index.median_time_past(tip.id),
            },
            "headers": {
                "height": best.height,
                "hash": best.hash.to_string(),
            },
            "sync": if synced { "synced" } else { "syncing" },
            "validation": {
                "assumevalid": cs.assume_valid().to_string(),
                "inputs_verified": cs.stats().inputs_verified,
                "blocks_assumed_valid": cs.stats().blocks_assumed_valid,
            },
            "peers": peers,
            "mempool": mempool,
        }))
        .into_response())
    })
    .await
}
