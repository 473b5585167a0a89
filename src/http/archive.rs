//! HTTP routes of the archive of spent outputs (`docs/archive.md`).
//!
//! | route | answer |
//! | --- | --- |
//! | `GET /archive/epochs` | `{"epoch_length", "count", "commitment", "epochs": [header…]}` |
//! | `GET /archive/epoch/{n}` | header, `hash`, `root`, `leaf_count` (boundaries included), `spent_outputs`, `filter` (hex of the serialized fuse filter, `docs/archive.md` §4) |
//! | `GET /archive/commitment` | `{"commitment", "count", "last_height"}` (`last_height` null when none is sealed) |
//! | `GET /archive/status/{txid}/{vout}` | `{"outpoint", "status": {"status": "unspent" \| "spent_not_sealed" \| "archived" \| "unknown", …}}` |
//! | `GET /proof/outpoint/{txid}/{vout}` | the proof JSON (§6), verbatim what `kakehi proof verify --commitment` reads; the status in header `x-kakehi-outpoint-status` (compact JSON as above) |
//! | `POST /proof/outpoints` | body `{"outpoints": ["txid:vout", …]}` (1..=1,000 distinct) → one proof JSON for all |
//!
//! Hashes (roots, commitments) are lowercase hex in byte order; txids and
//! block hashes in display order. Errors are `{"code","message"}`: 400 for a
//! malformed request, 404 for an epoch not sealed, 413 for more than 1,000
//! outpoints, 503 when no epoch is sealed yet (no proof can be made), 500 on
//! storage failure. Mount with `.merge(crate::http::archive::routes())`.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bitcoin::hex::DisplayHex;
use bitcoin::{OutPoint, Txid};

use crate::archive::proof::MAX_ITEMS;
use crate::archive::{ArchiveError, OutpointStatus};
use crate::http::AppState;
use crate::snapshot::{ChainSnapshot, ReadError};

/// Response header carrying the outpoint's status on `GET /proof/outpoint/…`.
pub const STATUS_HEADER: &str = "x-kakehi-outpoint-status";

/// The routes, to merge into the API router.
pub fn routes() -> Router<AppState> {
    route_table()
        .into_iter()
        .fold(Router::new(), |r, (_, p, h)| r.route(p, h))
}

/// The archive routes as (method, path, handler), registered by the main
/// router so they appear in its route list (and the OpenAPI check).
pub(crate) fn route_table() -> Vec<super::RouteEntry> {
    vec![
        ("get", "/archive/epochs", get(epochs)),
        ("get", "/archive/epoch/{n}", get(epoch)),
        ("get", "/archive/commitment", get(commitment)),
        ("get", "/archive/status/{txid}/{vout}", get(status)),
        ("get", "/proof/outpoint/{txid}/{vout}", get(proof_one)),
        ("post", "/proof/outpoints", post(proof_many)),
    ]
}

/// An error answer, rendered `{"code","message"}` like the API's others.
#[derive(Debug)]
struct Error {
    status: StatusCode,
    message: String,
}

impl Error {
    fn new(status: StatusCode, message: impl Into<String>) -> Error {
        Error {
            status,
            message: message.into(),
        }
    }
    fn bad_request(m: impl Into<String>) -> Error {
        Error::new(StatusCode::BAD_REQUEST, m)
    }
    /// A 500, "stored data damaged" or "internal error" (as the API's
    /// other routes answer, `super::internal_message`).
    fn internal(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
        let e = e.into();
        tracing::error!("HTTP internal error: {e}");
        Error::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            super::internal_message(&*e),
        )
    }
    /// Maps snapshot read errors: request errors the archive reports are
    /// 400, the rest 500.
    fn from_read(e: ReadError) -> Error {
        match e {
            ReadError::Archive(
                a @ (ArchiveError::BadRequest { .. } | ArchiveError::DuplicateOutpoint { .. }),
            ) => Error::bad_request(a.to_string()),
            e => Error::internal(e),
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "code": self.status.as_u16(), "message": self.message });
        (self.status, Json(body)).into_response()
    }
}

type Result<T> = std::result::Result<T, Error>;

/// Runs `f` on the latest published chain snapshot on a blocking thread
/// (reads see committed block boundaries only and never wait for the
/// writer).
async fn read<T: Send + 'static>(
    state: &AppState,
    f: impl FnOnce(&ChainSnapshot) -> Result<T> + Send + 'static,
) -> Result<T> {
    let snapshot = state.snapshots.load();
    tokio::task::spawn_blocking(move || f(&snapshot))
        .await
        .map_err(Error::internal)?
}

fn parse_outpoint(txid: &str, vout: &str) -> Result<OutPoint> {
    if txid.len() != 64 {
        return Err(Error::bad_request(format!(
            "invalid txid {txid:?}: expected 64 hex characters"
        )));
    }
    let txid: Txid = txid
        .parse()
        .map_err(|_| Error::bad_request(format!("invalid txid {txid:?}")))?;
    let vout: u32 = vout
        .parse()
        .map_err(|_| Error::bad_request(format!("invalid output index {vout:?}")))?;
    Ok(OutPoint { txid, vout })
}

fn parse_outpoint_str(s: &str) -> Result<OutPoint> {
    let (txid, vout) = s
        .split_once(':')
        .ok_or_else(|| Error::bad_request(format!("invalid outpoint {s:?}: expected txid:vout")))?;
    parse_outpoint(txid, vout)
}

fn status_json(op: &OutPoint, status: OutpointStatus) -> serde_json::Value {
    serde_json::json!({ "outpoint": op.to_string(), "status": status })
}

async fn epochs(State(s): State<AppState>) -> Result<Response> {
    read(&s, |cs| {
        let a = cs.archive();
        Ok(Json(serde_json::json!({
            "epoch_length": a.epoch_length(),
            "count": a.epochs().len(),
            "commitment": a.commitment().to_lower_hex_string(),
            "epochs": a.epochs(),
        }))
        .into_response())
    })
    .await
}

async fn epoch(State(s): State<AppState>, Path(n): Path<String>) -> Result<Response> {
    let n: u32 = n
        .parse()
        .map_err(|_| Error::bad_request(format!("invalid epoch number {n:?}")))?;
    read(&s, move |cs| {
        let a = cs.archive();
        let filter = a.filter(n).map_err(Error::internal)?;
        let (Some(header), Some(filter)) = (a.epochs().get(n as usize), filter) else {
            return Err(Error::new(
                StatusCode::NOT_FOUND,
                format!("epoch {n} is not sealed ({} sealed)", a.epochs().len()),
            ));
        };
        Ok(Json(serde_json::json!({
            "header": header,
            "hash": header.hash().to_lower_hex_string(),
            "root": header.root.to_lower_hex_string(),
            "leaf_count": header.leaf_count,
            "spent_outputs": header.leaf_count.saturating_sub(2),
            "filter": filter.to_bytes().to_lower_hex_string(),
        }))
        .into_response())
    })
    .await
}

async fn commitment(State(s): State<AppState>) -> Result<Response> {
    read(&s, |cs| {
        let a = cs.archive();
        Ok(Json(serde_json::json!({
            "commitment": a.commitment().to_lower_hex_string(),
            "count": a.epochs().len(),
            "last_height": a.epochs().last().map(|h| h.last_height),
        }))
        .into_response())
    })
    .await
}

async fn status(
    State(s): State<AppState>,
    Path((txid, vout)): Path<(String, String)>,
) -> Result<Response> {
    let op = parse_outpoint(&txid, &vout)?;
    read(&s, move |cs| {
        let st = cs.outpoint_status(&op).map_err(Error::from_read)?;
        Ok(Json(status_json(&op, st)).into_response())
    })
    .await
}

/// The proof of `ops` as its JSON body, or 503 when nothing is sealed.
fn proof_body(cs: &ChainSnapshot, ops: &[OutPoint]) -> Result<String> {
    if cs.archive().epochs().is_empty() {
        return Err(Error::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no archive epoch is sealed yet (the chain is shorter than one epoch plus 100 blocks)",
        ));
    }
    let proof = cs.prove_outpoints(ops).map_err(Error::from_read)?;
    Ok(proof.to_json())
}

fn json_response(body: String) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

async fn proof_one(
    State(s): State<AppState>,
    Path((txid, vout)): Path<(String, String)>,
) -> Result<Response> {
    let op = parse_outpoint(&txid, &vout)?;
    read(&s, move |cs| {
        let body = proof_body(cs, &[op])?;
        let st = cs.outpoint_status(&op).map_err(Error::from_read)?;
        let mut resp = json_response(body);
        let st = serde_json::to_string(&st).map_err(Error::internal)?;
        // invariant: serde_json output of this enum is ASCII without control
        // characters, a valid header value; on failure the header is left out.
        if let Ok(v) = HeaderValue::from_str(&st) {
            resp.headers_mut().insert(STATUS_HEADER, v);
        }
        Ok(resp)
    })
    .await
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ProofRequest {
    outpoints: Vec<String>,
}

async fn proof_many(State(s): State<AppState>, body: Bytes) -> Result<Response> {
    let req: ProofRequest = serde_json::from_slice(&body).map_err(|e| {
        Error::bad_request(format!(
            "expected {{\"outpoints\": [\"txid:vout\", …]}}: {e}"
        ))
    })?;
    if req.outpoints.len() > MAX_ITEMS {
        return Err(Error::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "{} outpoints requested, at most {MAX_ITEMS} per request",
                req.outpoints.len()
            ),
        ));
    }
    if req.outpoints.is_empty() {
        return Err(Error::bad_request("no outpoints requested"));
    }
    let ops = req
        .outpoints
        .iter()
        .map(|o| parse_outpoint_str(o))
        .collect::<Result<Vec<_>>>()?;
    read(&s, move |cs| Ok(json_response(proof_body(cs, &ops)?))).await
}
