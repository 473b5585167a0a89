//! bitcoind's JSON-RPC interface (Bitcoin Core 30.0 `src/httprpc.cpp`,
//! `src/rpc/request.cpp`): HTTP POST with Basic authentication (the
//! cookie, `rpcuser`/`rpcpassword`, `rpcauth`), JSON-RPC 1.0 and 2.0
//! requests and batches, named and positional parameters, Core's error
//! codes and HTTP statuses; the read-only calls of `src/rpc/blockchain.cpp`,
//! `rawtransaction.cpp`, `mempool.cpp` and `net.cpp` ([`methods`]).
//!
//! Like the HTTP API it reads the latest published
//! [`crate::snapshot::ChainSnapshot`] and the mempool's
//! [`crate::mempool::MempoolSnapshot`], on a blocking thread, never the
//! writer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

mod auth;
mod methods;

pub use auth::{basic_authorization, AuthError, Cookie, Credentials, COOKIE_USER};
pub use methods::METHODS;

/// Core's `RPC_INVALID_REQUEST`.
pub const RPC_INVALID_REQUEST: i32 = -32600;
/// Core's `RPC_METHOD_NOT_FOUND`.
pub const RPC_METHOD_NOT_FOUND: i32 = -32601;
/// Core's `RPC_INVALID_PARAMS` (unused by Core's handlers, kept for 2.0).
pub const RPC_INVALID_PARAMS: i32 = -32602;
/// Core's `RPC_PARSE_ERROR`.
pub const RPC_PARSE_ERROR: i32 = -32700;
/// Core's `RPC_MISC_ERROR`.
pub const RPC_MISC_ERROR: i32 = -1;
/// Core's `RPC_TYPE_ERROR`.
pub const RPC_TYPE_ERROR: i32 = -3;
/// Core's `RPC_INVALID_ADDRESS_OR_KEY`.
pub const RPC_INVALID_ADDRESS_OR_KEY: i32 = -5;
/// Core's `RPC_INVALID_PARAMETER`.
pub const RPC_INVALID_PARAMETER: i32 = -8;
/// Core's `RPC_CLIENT_P2P_DISABLED`.
pub const RPC_CLIENT_P2P_DISABLED: i32 = -9;
/// Core's `RPC_DESERIALIZATION_ERROR`.
pub const RPC_DESERIALIZATION_ERROR: i32 = -22;

/// Core's pause before answering 401 to wrong credentials
/// (`httprpc.cpp`: `UninterruptibleSleep(250ms)`), against brute force.
pub const BAD_AUTH_DELAY: Duration = Duration::from_millis(250);

/// An RPC error: Core's code and message.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    /// Core's code (`RPC_*`).
    pub code: i32,
    /// The message.
    pub message: String,
}

impl RpcError {
    /// An error with `code` and `message`.
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
        }
    }

    fn json(&self) -> Value {
        json!({"code": self.code, "message": self.message})
    }
}

/// Limits and credentials of the RPC server.
#[derive(Clone, Debug)]
pub struct RpcConfig {
    /// Accepted credentials (none: every request gets 401).
    pub credentials: Credentials,
    /// Largest request body, bytes (413 beyond). Default 4 MiB (a
    /// 400,000-weight transaction in hex is 800 kB; Core has no limit
    /// below its HTTP server's 32 MiB).
    pub max_body_bytes: usize,
    /// Most requests in one batch (a longer batch is refused whole with
    /// `RPC_INVALID_REQUEST`). Default 1,000.
    pub max_batch: usize,
    /// Time one request (or batch) may take (`RPC_MISC_ERROR` beyond).
    /// Default 30 s.
    pub request_timeout: Duration,
}

impl Default for RpcConfig {
    fn default() -> Self {
        RpcConfig {
            credentials: Credentials::default(),
            max_body_bytes: 4 << 20,
            max_batch: 1000,
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// The server's state.
#[derive(Clone)]
struct RpcState {
    app: crate::http::AppState,
    config: Arc<RpcConfig>,
    started: Instant,
}

/// The RPC router for `app` with `config` (POST on any path, as bitcoind
/// answers `/` and `/wallet/<name>` alike).
pub fn router(app: crate::http::AppState, config: RpcConfig) -> Router {
    let max = config.max_body_bytes;
    let state = RpcState {
        app,
        config: Arc::new(config),
        started: Instant::now(),
    };
    Router::new()
        .route("/", post(handle))
        .route("/{*rest}", post(handle))
        .layer(DefaultBodyLimit::max(max))
        .with_state(state)
}

/// Serves the RPC interface on `addr` until `shutdown` resolves.
///
/// # Errors
/// Binding fails.
pub async fn serve_with(
    addr: SocketAddr,
    app: crate::http::AppState,
    config: RpcConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "JSON-RPC listening");
    serve_listener(listener, app, config, shutdown).await
}

/// Serves the RPC interface on a bound `listener` until `shutdown`
/// resolves (tests bind port 0).
///
/// # Errors
/// The listener fails.
pub async fn serve_listener(
    listener: tokio::net::TcpListener,
    app: crate::http::AppState,
    config: RpcConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(app, config))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Core's `WWW-Authenticate` value.
const WWW_AUTH: &str = "Basic realm=\"jsonrpc\"";

fn unauthorized() -> Response {
    let mut r = StatusCode::UNAUTHORIZED.into_response();
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(WWW_AUTH));
    r
}

/// A reply with no request to answer to (`id` null), 1.0 style.
fn error_reply(status: StatusCode, e: &RpcError) -> Response {
    json_response(
        status,
        &json!({"result": null, "error": e.json(), "id": null}),
    )
}

fn json_response(status: StatusCode, v: &Value) -> Response {
    let mut body = v.to_string();
    body.push('\n');
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Core's `JSONErrorReply` status for an error code under JSON-RPC 1.0.
fn error_status(code: i32) -> StatusCode {
    match code {
        RPC_INVALID_REQUEST => StatusCode::BAD_REQUEST,
        RPC_METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

async fn handle(
    State(s): State<RpcState>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    // httprpc.cpp: no header, 401 at once; wrong ones, 401 after a pause.
    let Some(auth) = headers.get(header::AUTHORIZATION) else {
        return unauthorized();
    };
    if !auth.to_str().is_ok_and(|a| s.config.credentials.check(a)) {
        tracing::warn!("ThreadRPCServer incorrect password attempt");
        tokio::time::sleep(BAD_AUTH_DELAY).await;
        return unauthorized();
    }
    let body = match body {
        Ok(b) => b,
        Err(e) => return (e.status(), e.body_text()).into_response(),
    };
    let parsed: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(_) => {
            let e = RpcError::new(RPC_PARSE_ERROR, "Parse error");
            return error_reply(error_status(e.code), &e);
        }
    };
    let timeout = s.config.request_timeout;
    let s2 = s.clone();
    let work = tokio::task::spawn_blocking(move || dispatch(&s2, parsed));
    match tokio::time::timeout(timeout, work).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::error!("RPC task: {e}");
            let e = RpcError::new(RPC_MISC_ERROR, "internal error (see the node's log)");
            error_reply(StatusCode::INTERNAL_SERVER_ERROR, &e)
        }
        Err(_) => {
            let e = RpcError::new(RPC_MISC_ERROR, "request timed out");
            error_reply(StatusCode::INTERNAL_SERVER_ERROR, &e)
        }
    }
}

/// A parsed request (Core's `JSONRPCRequest::parse`).
struct Request {
    id: Value,
    /// Whether the request carried an `id` (a 2.0 request without one is a
    /// notification: no reply).
    has_id: bool,
    v2: bool,
    method: String,
    params: Value,
}

fn parse_request(v: &Value) -> Result<Request, (Value, bool, RpcError)> {
    let Some(o) = v.as_object() else {
        return Err((
            Value::Null,
            false,
            RpcError::new(RPC_INVALID_REQUEST, "Invalid Request object"),
        ));
    };
    let id = o.get("id").cloned().unwrap_or(Value::Null);
    let has_id = o.contains_key("id");
    let v2 = match o.get("jsonrpc") {
        None => false,
        Some(Value::String(s)) if s == "1.0" => false,
        Some(Value::String(s)) if s == "2.0" => true,
        Some(_) => {
            return Err((
                id,
                false,
                RpcError::new(RPC_INVALID_REQUEST, "JSON-RPC version not supported"),
            ))
        }
    };
    let method = match o.get("method") {
        None => {
            return Err((id, v2, RpcError::new(RPC_INVALID_REQUEST, "Missing method")));
        }
        Some(Value::String(m)) => m.clone(),
        Some(_) => {
            return Err((
                id,
                v2,
                RpcError::new(RPC_INVALID_REQUEST, "Method must be a string"),
            ))
        }
    };
    let params = match o.get("params") {
        None | Some(Value::Null) => Value::Array(Vec::new()),
        Some(p @ (Value::Array(_) | Value::Object(_))) => p.clone(),
        Some(_) => {
            return Err((
                id,
                v2,
                RpcError::new(RPC_INVALID_REQUEST, "Params must be an array or object"),
            ))
        }
    };
    Ok(Request {
        id,
        has_id,
        v2,
        method,
        params,
    })
}

/// Core's `JSONRPCReplyObj`: 1.0 carries both `result` and `error`, 2.0
/// only the one that applies.
fn reply(id: Value, v2: bool, r: Result<Value, RpcError>) -> Value {
    match (v2, r) {
        (false, Ok(v)) => json!({"result": v, "error": null, "id": id}),
        (false, Err(e)) => json!({"result": null, "error": e.json(), "id": id}),
        (true, Ok(v)) => json!({"jsonrpc": "2.0", "result": v, "id": id}),
        (true, Err(e)) => json!({"jsonrpc": "2.0", "error": e.json(), "id": id}),
    }
}

/// One request of a batch or alone: its reply, or `None` for a 2.0
/// notification; and the error code, if any.
fn execute(s: &RpcState, v: &Value) -> (Option<Value>, Option<i32>, bool) {
    match parse_request(v) {
        Err((id, v2, e)) => {
            let code = e.code;
            (Some(reply(id, v2, Err(e))), Some(code), v2)
        }
        Ok(req) => {
            let r = methods::call(s, &req.method, &req.params);
            let code = r.as_ref().err().map(|e| e.code);
            if req.v2 && !req.has_id {
                return (None, code, true);
            }
            (Some(reply(req.id, req.v2, r)), code, req.v2)
        }
    }
}

fn dispatch(s: &RpcState, parsed: Value) -> Response {
    match parsed {
        Value::Object(_) => {
            let (out, code, v2) = execute(s, &parsed);
            match out {
                None => StatusCode::NO_CONTENT.into_response(),
                Some(out) => {
                    let status = match code {
                        Some(c) if !v2 => error_status(c),
                        _ => StatusCode::OK,
                    };
                    json_response(status, &out)
                }
            }
        }
        Value::Array(batch) => {
            if batch.len() > s.config.max_batch {
                let e = RpcError::new(
                    RPC_INVALID_REQUEST,
                    format!(
                        "batch of {} requests, over {}",
                        batch.len(),
                        s.config.max_batch
                    ),
                );
                return error_reply(StatusCode::BAD_REQUEST, &e);
            }
            let out: Vec<Value> = batch.iter().filter_map(|v| execute(s, v).0).collect();
            json_response(StatusCode::OK, &Value::Array(out))
        }
        _ => {
            let e = RpcError::new(RPC_PARSE_ERROR, "Top-level object parse error");
            error_reply(error_status(e.code), &e)
        }
    }
}
