//! kakehi's own routes for light clients: BIP-158 basic filters in batches
//! and the filter-header checkpoints (BIP-157's `cfcheckpt` over HTTP).

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{hex, read, ApiError, ApiResult, AppState};

/// Most filters per `/filters/basic` response.
pub const MAX_FILTERS_PER_REQUEST: u32 = 1000;

/// Interval of `/filters/checkpoints`, blocks (BIP-157's
/// `CFCHECKPT` interval).
pub const CHECKPOINT_INTERVAL: u32 = 1000;

#[derive(serde::Deserialize)]
pub(super) struct RangeQuery {
    start_height: Option<String>,
    count: Option<String>,
}

/// `GET /filters/basic?start_height=H&count=N` (N in 1..=1000, default
/// 1000): `{"start_height", "filters": [{"height", "hash", "filter",
/// "filter_header"}]}` for the active-chain blocks H..H+N-1 that exist;
/// `filter` is the serialized BIP-158 filter in hex (CompactSize N ‖ the
/// Golomb-Rice set), `filter_header` in display byte order.
pub(super) async fn basic(
    State(s): State<AppState>,
    Query(q): Query<RangeQuery>,
) -> ApiResult<Response> {
    let start: u32 = q
        .start_height
        .as_deref()
        .ok_or_else(|| ApiError::bad_request("start_height is required"))?
        .parse()
        .map_err(|_| ApiError::bad_request("start_height must be a height (0..=2^32-1)"))?;
    let count: u32 = match q.count.as_deref() {
        None => MAX_FILTERS_PER_REQUEST,
        Some(c) => c
            .parse()
            .ok()
            .filter(|c| (1..=MAX_FILTERS_PER_REQUEST).contains(c))
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "count must be 1..={MAX_FILTERS_PER_REQUEST}, got {c:?}"
                ))
            })?,
    };
    read(&s, move |cs| {
        let index = cs.index();
        let tip = index.tip_height();
        if start > tip {
            return Err(ApiError::not_found(format!(
                "start_height {start} is above the tip ({tip})"
            )));
        }
        let end = start.saturating_add(count - 1).min(tip);
        let mut out = Vec::with_capacity((end - start + 1) as usize);
        for h in start..=end {
            let Some(e) = index.active_at(h) else { break };
            let Some((filter, header)) = cs.filter(e.id).map_err(ApiError::internal)? else {
                break;
            };
            out.push(serde_json::json!({
                "height": h,
                "hash": e.hash.to_string(),
                "filter": hex(&filter),
                "filter_header": header.to_string(),
            }));
        }
        Ok(Json(serde_json::json!({ "start_height": start, "filters": out })).into_response())
    })
    .await
}

/// `GET /filters/checkpoints`: `{"interval": 1000, "checkpoints":
/// [{"height", "hash", "filter_header"}]}` at heights 1000, 2000, … of the
/// active chain up to the tip.
pub(super) async fn checkpoints(State(s): State<AppState>) -> ApiResult<Response> {
    read(&s, |cs| {
        let index = cs.index();
        let mut out = Vec::new();
        let mut h = CHECKPOINT_INTERVAL;
        while h <= index.tip_height() {
            let Some(e) = index.active_at(h) else { break };
            let Some((_, header)) = cs.filter(e.id).map_err(ApiError::internal)? else {
                break;
            };
            out.push(serde_json::json!({
                "height": h,
                "hash": e.hash.to_string(),
                "filter_header": header.to_string(),
            }));
            h += CHECKPOINT_INTERVAL;
        }
        Ok(
            Json(serde_json::json!({ "interval": CHECKPOINT_INTERVAL, "checkpoints": out }))
                .into_response(),
        )
    })
    .await
}
