//! The HTTP API (axum): an Esplora-compatible subset, Bitcoin Core's REST
//! filter paths, and kakehi's own routes. Every error is JSON
//! `{"code": <status>, "message": <text>}` with the matching status.
//! Reads run on a blocking thread against the latest published
//! [`ChainSnapshot`] (an immutable state as of a committed block boundary,
//! loaded without a lock): they never stall the executor, never see a
//! half-written block, and never hold up the writer, which publishes the
//! next snapshot while they still read theirs.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::{Json, Router};
use bitcoin::consensus::encode::{serialize, serialize_hex};
use bitcoin::hashes::Hash;
use bitcoin::hex::DisplayHex;
use bitcoin::BlockHash;

use crate::snapshot::{ChainSnapshot, Snapshots};

mod address;
pub mod archive;
pub(crate) mod core_rest;
pub(crate) mod core_tx;
pub mod esplora;
mod esplora_json;
pub mod fees;
mod light;
pub mod mempool;
pub mod metrics;
mod server;
mod status;

pub use server::{serve_listener, serve_with, HttpConfig, RateLimit};
pub use status::STATUS_HTML;

/// Largest `count` of `/rest/blockfilterheaders` (Core's `MAX_REST_HEADERS_RESULTS`).
pub const MAX_FILTER_HEADERS: u32 = 2000;

/// Shared state of the handlers.
#[derive(Clone)]
pub struct AppState {
    /// The chain state's published snapshots (the writer hands the handle
    /// out as `Chainstate::snapshots`): every handler reads the latest one.
    pub snapshots: Snapshots,
    /// The running P2P layer (`None`: no P2P).
    pub p2p: Option<crate::p2p::P2pHandle>,
    /// The node's mempool (`None`: none; `POST /tx` then answers 503 and
    /// the mempool routes answer as an empty mempool).
    pub mempool: Option<Arc<crate::mempool::Mempool>>,
}

/// An API error: status and message, rendered as `{"code","message"}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }
    fn bad_request(m: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, m)
    }
    fn not_found(m: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, m)
    }
    /// A 500: "stored data damaged" when `e` is stored data found damaged
    /// ([`is_damage`]), else "internal error"; the body names no path, the
    /// log has the whole error.
    fn internal(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        let e = e.into();
        tracing::error!("HTTP internal error: {e}");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, internal_message(&*e))
    }
}

/// The body of a 500 for `e`, without its paths: [`is_damage`] or not.
fn internal_message(e: &(dyn std::error::Error + 'static)) -> &'static str {
    if is_damage(e) {
        "stored data damaged (see the node's log; docs/operations.md, \"Corruption\")"
    } else {
        "internal error (see the node's log)"
    }
}

/// Whether `e`, or an error it wraps, is stored data that failed its checks
/// (a flat-file record, an index row, a UTXO-table page, a run file, an
/// archive file, a stored block or transaction that does not decode):
/// damage the operator must repair, not a passing failure.
fn is_damage(e: &(dyn std::error::Error + 'static)) -> bool {
    use crate::archive::ArchiveError;
    use crate::snapshot::ReadError;
    use crate::sozu::SozuError;
    use crate::store::runs::RunError;
    use crate::store::{FlatFileError, StoreError};
    let mut next = Some(e);
    while let Some(e) = next {
        // Transparent variants hand their own source on, not themselves:
        // look through them by hand.
        let found = match e.downcast_ref::<ReadError>() {
            Some(ReadError::CorruptRecord { .. } | ReadError::CorruptSpent { .. }) => true,
            Some(ReadError::Store(s)) => is_damage(s),
            Some(ReadError::Flat(f)) => is_damage(f),
            Some(ReadError::Sozu(t)) => is_damage(t),
            Some(ReadError::Archive(a)) => is_damage(a),
            Some(_) => false,
            None => match e.downcast_ref::<StoreError>() {
                Some(StoreError::Corrupt { .. }) => true,
                Some(StoreError::Flat(f)) => is_damage(f),
                Some(StoreError::Rows(r)) => is_damage(r),
                Some(_) => false,
                None => {
                    matches!(
                        e.downcast_ref::<FlatFileError>(),
                        Some(FlatFileError::Corrupt { .. } | FlatFileError::Truncated { .. })
                    ) || matches!(
                        e.downcast_ref::<SozuError>(),
                        Some(SozuError::Corrupt { .. })
                    ) || matches!(e.downcast_ref::<RunError>(), Some(RunError::Corrupt { .. }))
                        || matches!(
                            e.downcast_ref::<ArchiveError>(),
                            Some(ArchiveError::Corrupt { .. })
                        )
                        || e.downcast_ref::<bitcoin::consensus::encode::Error>()
                            .is_some()
                }
            },
        };
        if found {
            return true;
        }
        next = e.source();
    }
    false
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "code": self.status.as_u16(), "message": self.message });
        (self.status, Json(body)).into_response()
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// Runs `f` on the latest published chain snapshot, on a blocking thread
/// (flat-file and database reads block). Takes no lock: the writer goes on
/// and publishes newer snapshots while `f` runs.
async fn read<T: Send + 'static>(
    state: &AppState,
    f: impl FnOnce(&ChainSnapshot) -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    let snapshot = state.snapshots.load();
    tokio::task::spawn_blocking(move || f(&snapshot))
        .await
        .map_err(ApiError::internal)?
}

fn parse_hash(s: &str) -> ApiResult<BlockHash> {
    if s.len() != 64 {
        return Err(ApiError::bad_request(format!(
            "invalid block hash {s:?}: expected 64 hex characters"
        )));
    }
    s.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid block hash {s:?}")))
}

fn text(s: String) -> Response {
    ([(header::CONTENT_TYPE, "text/plain")], s).into_response()
}

/// The response formats of Core's REST interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Bin,
    Hex,
    Json,
}

/// Splits `"<hash>.<ext>"`.
fn split_format(s: &str) -> ApiResult<(&str, Format)> {
    let (name, ext) = s.rsplit_once('.').ok_or_else(|| {
        ApiError::bad_request("output format not found (available: .bin, .hex, .json)")
    })?;
    let f = match ext {
        "bin" => Format::Bin,
        "hex" => Format::Hex,
        "json" => Format::Json,
        _ => {
            return Err(ApiError::bad_request(format!(
                "unknown format .{ext} (available: .bin, .hex, .json)"
            )))
        }
    };
    Ok((name, f))
}

/// Renders raw bytes as `.bin` (octet-stream) or, for any other format,
/// `.hex` (lowercase hex and a newline, as Core does).
fn bin_or_hex(bytes: Vec<u8>, f: Format) -> Response {
    match f {
        Format::Bin => {
            ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response()
        }
        _ => text(format!("{}\n", hex(&bytes))),
    }
}

/// Lowercase hex of `bytes` (`bitcoin::hex`).
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.to_lower_hex_string()
}

async fn tip_height(State(s): State<AppState>) -> ApiResult<Response> {
    read(&s, |cs| Ok(text(cs.index().tip_height().to_string()))).await
}

async fn tip_hash(State(s): State<AppState>) -> ApiResult<Response> {
    read(&s, |cs| Ok(text(cs.index().tip().hash.to_string()))).await
}

async fn block_at_height(
    State(s): State<AppState>,
    Path(height): Path<String>,
) -> ApiResult<Response> {
    // Digits only: `str::parse` would take "+5" for 5.
    let height: u32 = Some(&height)
        .filter(|h| h.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|h| h.parse().ok())
        .ok_or_else(|| ApiError::bad_request(format!("invalid height {height:?}")))?;
    read(&s, move |cs| {
        cs.index()
            .active_at(height)
            .map(|e| text(e.hash.to_string()))
            .ok_or_else(|| ApiError::not_found(format!("no block at height {height}")))
    })
    .await
}

async fn block_header(State(s): State<AppState>, Path(hash): Path<String>) -> ApiResult<Response> {
    let hash = parse_hash(&hash)?;
    read(&s, move |cs| {
        cs.index()
            .by_hash(&hash)
            .map(|e| text(serialize_hex(&e.header)))
            .ok_or_else(|| ApiError::not_found(format!("block {hash} not found")))
    })
    .await
}

async fn chain_tips(State(s): State<AppState>) -> ApiResult<Response> {
    read(&s, |cs| Ok(Json(cs.index().tips()).into_response())).await
}

async fn utxo_stats(State(s): State<AppState>) -> ApiResult<Response> {
    read(&s, |cs| Ok(Json(cs.utxo_stats()).into_response())).await
}

async fn health(State(s): State<AppState>) -> ApiResult<Response> {
    read(&s, |cs| {
        let tip = cs.index().tip();
        Ok(Json(serde_json::json!({
            "status": "ok",
            "network": cs.params().name(),
            "tip_height": tip.height,
            "tip_hash": tip.hash,
        }))
        .into_response())
    })
    .await
}

/// Most bytes of basic filters the HTTP server keeps cached, in serialized
/// filter bytes (32 MiB).
pub const FILTER_CACHE_BYTES: usize = 32 << 20;

/// Weighs a cached filter by its bytes.
#[derive(Clone, Copy, Debug, Default)]
struct FilterBytes;

impl quick_cache::Weighter<BlockHash, Arc<Vec<u8>>> for FilterBytes {
    fn weight(&self, _hash: &BlockHash, filter: &Arc<Vec<u8>>) -> u64 {
        filter.len() as u64
    }
}

/// Basic filters recently served by `/rest/blockfilter`, by block hash,
/// at most [`FILTER_CACHE_BYTES`] of them (`quick_cache`, weighed by filter
/// bytes; its CLOCK-Pro-like policy keeps the filters fetched again over
/// those fetched once). A block's BIP-158 filter is fixed by the block and
/// the outputs it spends, so an entry never goes stale (reorgs included); a
/// hit is answered without a snapshot read or a blocking thread.
pub(crate) struct FilterCache(quick_cache::sync::Cache<BlockHash, Arc<Vec<u8>>, FilterBytes>);

impl Default for FilterCache {
    fn default() -> Self {
        // Estimated items: 32 MiB of filters of a few kB each.
        FilterCache(quick_cache::sync::Cache::with_weighter(
            8_192,
            FILTER_CACHE_BYTES as u64,
            FilterBytes,
        ))
    }
}

impl FilterCache {
    fn get(&self, hash: &BlockHash) -> Option<Arc<Vec<u8>>> {
        self.0.get(hash)
    }

    fn insert(&self, hash: BlockHash, filter: Arc<Vec<u8>>) {
        self.0.insert(hash, filter);
    }
}

/// Renders a basic filter as Core's REST does.
fn blockfilter_response(hash: &BlockHash, filter: &[u8], format: Format) -> Response {
    if format == Format::Json {
        return Json(serde_json::json!({ "filter": hex(filter) })).into_response();
    }
    // Core serializes a BlockFilter: type u8, block hash, CompactSize-prefixed filter.
    let mut bytes = Vec::with_capacity(filter.len() + 42);
    bytes.push(0u8);
    bytes.extend_from_slice(hash.as_byte_array());
    bytes.extend_from_slice(&serialize(&bitcoin::VarInt(filter.len() as u64)));
    bytes.extend_from_slice(filter);
    bin_or_hex(bytes, format)
}

async fn rest_blockfilter(
    State(s): State<AppState>,
    axum::Extension(cache): axum::Extension<Arc<FilterCache>>,
    Path(file): Path<String>,
) -> ApiResult<Response> {
    let (hash, format) = split_format(&file)?;
    let hash = parse_hash(hash)?;
    if let Some(filter) = cache.get(&hash) {
        return Ok(blockfilter_response(&hash, &filter, format));
    }
    let filter = read(&s, move |cs| {
        let id = cs
            .index()
            .id_of(&hash)
            .ok_or_else(|| ApiError::not_found(format!("block {hash} not found")))?;
        let (filter, _) = cs.filter(id).map_err(ApiError::internal)?.ok_or_else(|| {
            ApiError::not_found(format!("no filter for block {hash} (not connected)"))
        })?;
        Ok(Arc::new(filter))
    })
    .await?;
    cache.insert(hash, filter.clone());
    Ok(blockfilter_response(&hash, &filter, format))
}

#[derive(serde::Deserialize)]
struct CountQuery {
    count: Option<String>,
}

/// Parses a REST `count` (1..=`max`), or a 400 naming the range.
pub(crate) fn parse_count(count: &str, max: u32) -> ApiResult<u32> {
    count
        .parse()
        .ok()
        .filter(|c| (1..=max).contains(c))
        .ok_or_else(|| ApiError::bad_request(format!("count must be 1..={max}, got {count:?}")))
}

/// Core's REST walk for headers and filter headers: the block `hash`, then,
/// if it is on the active chain, its successors there, `count` in all at
/// most; 404 when the block is unknown.
pub(crate) fn active_run<'a>(
    index: &'a crate::chain::index::ChainIndex,
    hash: &BlockHash,
    count: u32,
) -> ApiResult<Vec<&'a crate::chain::index::IndexEntry>> {
    let start = index
        .by_hash(hash)
        .ok_or_else(|| ApiError::not_found(format!("block {hash} not found")))?;
    let mut entries = vec![start];
    if index.is_active(start.id) {
        for h in start.height + 1..start.height.saturating_add(count) {
            match index.active_at(h) {
                Some(e) => entries.push(e),
                None => break,
            }
        }
    }
    Ok(entries)
}

async fn rest_filterheaders(
    State(s): State<AppState>,
    Path(file): Path<String>,
    Query(q): Query<CountQuery>,
) -> ApiResult<Response> {
    let count = q.count.unwrap_or_else(|| "5".into());
    filterheaders(s, file, count).await
}

async fn rest_filterheaders_legacy(
    State(s): State<AppState>,
    Path((count, file)): Path<(String, String)>,
) -> ApiResult<Response> {
    filterheaders(s, file, count).await
}

async fn filterheaders(s: AppState, file: String, count: String) -> ApiResult<Response> {
    let (hash, format) = split_format(&file)?;
    let hash = parse_hash(hash)?;
    let count = parse_count(&count, MAX_FILTER_HEADERS)?;
    read(&s, move |cs| {
        let index = cs.index();
        let ids: Vec<_> = active_run(index, &hash, count)?
            .iter()
            .map(|e| e.id)
            .collect();
        let mut headers = Vec::with_capacity(ids.len());
        for id in ids {
            match cs.filter(id).map_err(ApiError::internal)? {
                Some((_, h)) => headers.push(h),
                None => break,
            }
        }
        if headers.is_empty() {
            return Err(ApiError::not_found(format!(
                "no filter header for block {hash} (not connected)"
            )));
        }
        if format == Format::Json {
            let list: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
            return Ok(Json(list).into_response());
        }
        let mut bytes = Vec::with_capacity(headers.len() * 32);
        for h in &headers {
            bytes.extend_from_slice(h.as_byte_array());
        }
        Ok(bin_or_hex(bytes, format))
    })
    .await
}

async fn fallback() -> ApiError {
    ApiError::not_found("no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this route",
    )
}

/// The OpenAPI 3 document of this API (`docs/openapi.json`).
pub const OPENAPI_JSON: &str = include_str!("../../docs/openapi.json");

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON).into_response()
}

/// Every route as (method, path template), in the router's order; the
/// OpenAPI document must list exactly these (tested).
pub fn route_list() -> Vec<(&'static str, &'static str)> {
    let mut list = Vec::new();
    let _ = routes(&mut list);
    list
}

/// One route: (method, path template, handler).
pub(crate) type RouteEntry = (&'static str, &'static str, MethodRouter<AppState>);

fn routes(list: &mut Vec<(&'static str, &'static str)>) -> Router<AppState> {
    let tables = [
        esplora_block_routes(),
        archive::route_table(),
        esplora_tx_routes(),
        address::route_table(),
        node_routes(),
        core_rest_routes(),
        light_and_status_routes(),
    ];
    tables
        .into_iter()
        .flatten()
        .fold(Router::new(), |r, (m, p, h)| {
            list.push((m, p));
            r.route(p, h)
        })
}

/// Esplora's block routes.
fn esplora_block_routes() -> Vec<RouteEntry> {
    vec![
        ("get", "/blocks/tip/height", get(tip_height)),
        ("get", "/blocks/tip/hash", get(tip_hash)),
        ("get", "/block-height/{height}", get(block_at_height)),
        ("get", "/block/{hash}/header", get(block_header)),
        ("get", "/blocks", get(esplora::blocks_tip)),
        (
            "get",
            "/blocks/{start_height}",
            get(esplora::blocks_from_height),
        ),
        ("get", "/block/{hash}", get(esplora::block)),
        ("get", "/block/{hash}/status", get(esplora::block_status)),
        ("get", "/block/{hash}/txids", get(esplora::block_txids)),
        ("get", "/block/{hash}/txs", get(esplora::block_txs)),
        (
            "get",
            "/block/{hash}/txs/{start_index}",
            get(esplora::block_txs_from),
        ),
        (
            "get",
            "/block/{hash}/txid/{index}",
            get(esplora::block_txid_at),
        ),
        ("get", "/block/{hash}/raw", get(esplora::block_raw)),
        (
            "post",
            "/tx",
            post(mempool::post_tx)
                .layer(axum::extract::DefaultBodyLimit::max(mempool::MAX_TX_BODY)),
        ),
    ]
}

/// Esplora's transaction routes.
fn esplora_tx_routes() -> Vec<RouteEntry> {
    vec![
        ("get", "/tx/{txid}", get(esplora::tx)),
        ("get", "/tx/{txid}/hex", get(esplora::tx_hex)),
        ("get", "/tx/{txid}/raw", get(esplora::tx_raw)),
        ("get", "/tx/{txid}/status", get(esplora::tx_status)),
        (
            "get",
            "/tx/{txid}/merkle-proof",
            get(esplora::tx_merkle_proof),
        ),
        (
            "get",
            "/tx/{txid}/merkleblock-proof",
            get(esplora::tx_merkleblock_proof),
        ),
        (
            "get",
            "/tx/{txid}/outspend/{vout}",
            get(esplora::tx_outspend),
        ),
        ("get", "/tx/{txid}/outspends", get(esplora::tx_outspends)),
    ]
}

/// Fee estimates, chain tips, UTXO set statistics, health.
fn node_routes() -> Vec<RouteEntry> {
    vec![
        ("get", "/fee-estimates", get(fees::fee_estimates)),
        ("get", "/chain/tips", get(chain_tips)),
        ("get", "/utxo/stats", get(utxo_stats)),
        ("get", "/health", get(health)),
    ]
}

/// Bitcoin Core's REST interface (`rest.cpp`): filters, headers, blocks.
fn core_rest_routes() -> Vec<RouteEntry> {
    vec![
        (
            "get",
            "/rest/blockfilter/basic/{file}",
            get(rest_blockfilter),
        ),
        (
            "get",
            "/rest/blockfilterheaders/basic/{file}",
            get(rest_filterheaders),
        ),
        (
            "get",
            "/rest/blockfilterheaders/basic/{count}/{file}",
            get(rest_filterheaders_legacy),
        ),
        ("get", "/rest/chaininfo.json", get(core_rest::chaininfo)),
        ("get", "/rest/mempool/info.json", get(mempool::rest_info)),
        (
            "get",
            "/rest/mempool/contents.json",
            get(mempool::rest_contents),
        ),
        ("get", "/rest/block/{file}", get(core_rest::block)),
        (
            "get",
            "/rest/block/notxdetails/{file}",
            get(core_rest::block_notxdetails),
        ),
        ("get", "/rest/headers/{file}", get(core_rest::headers)),
        (
            "get",
            "/rest/headers/{count}/{file}",
            get(core_rest::headers_legacy),
        ),
    ]
}

/// Light-client filters, metrics, the OpenAPI document and the status page.
fn light_and_status_routes() -> Vec<RouteEntry> {
    vec![
        ("get", "/filters/basic", get(light::basic)),
        ("get", "/filters/checkpoints", get(light::checkpoints)),
        ("get", "/metrics", get(metrics::metrics)),
        ("get", "/openapi.json", get(openapi)),
        ("get", "/node/status", get(status::node_status)),
        ("get", "/", get(status::page)),
    ]
}

/// The router with every route and the default [`HttpConfig`] limits.
pub fn router(state: AppState) -> Router {
    router_with(state, &HttpConfig::default())
}

/// The router with every route and `config`'s limits (the connection-level
/// ones, header-read timeout and connection cap, are [`serve_with`]'s).
pub fn router_with(state: AppState, config: &HttpConfig) -> Router {
    let metrics = Arc::new(metrics::HttpMetrics::default());
    let limits = server::Limits {
        permits: Arc::new(tokio::sync::Semaphore::new(
            config.max_concurrent_requests.max(1),
        )),
        config: Arc::new(config.clone()),
    };
    let mut router: Router = routes(&mut Vec::new())
        .fallback(fallback)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(axum::middleware::from_fn(server::json_errors))
        .layer(axum::extract::DefaultBodyLimit::max(config.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(limits, server::limits));
    if let Some(limit) = config.rate_limit_per_ip {
        router = server::rate_limited(router, limit);
    }
    server::with_cors(router, &config.cors_allowed_origins)
        .layer(axum::Extension(Arc::new(FilterCache::default())))
        .layer(axum::Extension(Arc::new(address::SummaryCache::default())))
        .layer(axum::Extension(metrics.clone()))
        .layer(axum::middleware::from_fn_with_state(
            metrics,
            metrics::track,
        ))
}

/// Serves the API on `addr` with the default [`HttpConfig`] until
/// `shutdown` resolves (see [`serve_with`]).
///
/// # Errors
/// Binding fails.
pub async fn serve(
    addr: SocketAddr,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(addr, state, HttpConfig::default(), shutdown).await
}
