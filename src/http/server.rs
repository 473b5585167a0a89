//! The HTTP server with its limits: a custom accept loop over hyper's
//! HTTP/1 connection builder (so a header-read timeout applies, which
//! `axum::serve` does not install), a cap on open connections, and
//! middleware for the per-request timeout, the concurrency limit with load
//! shedding, the body size limit and CORS. Every refusal uses the API's
//! `{"code","message"}` JSON shape.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tower::ServiceExt as _;

use super::{router_with, ApiError, AppState};

/// Limits and CORS of the HTTP server. `Default` gives the documented
/// defaults, suitable for a node exposed on a LAN.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// Largest request body, bytes (413 beyond). Default 262,144 (256 KiB:
    /// a 100,000-byte standard transaction in hex is 200,000).
    pub max_body_bytes: usize,
    /// Time a request may take from its head being read to its response
    /// being produced (503 beyond). Default 10 s.
    pub request_timeout: Duration,
    /// Time a client has to send a complete request head once a connection
    /// is open or idle on keep-alive (connection closed beyond). Default 5 s.
    pub header_read_timeout: Duration,
    /// Requests handled at once; more are shed with 503 at once rather
    /// than queued. Default 256.
    pub max_concurrent_requests: usize,
    /// Open connections; further connections wait in the kernel's accept
    /// queue. Default 1,024.
    pub max_connections: usize,
    /// Origins allowed to read responses from browsers (CORS): empty for
    /// no CORS headers, `"*"` for any origin. Default empty.
    pub cors_allowed_origins: Vec<String>,
    /// Optional per-client-IP rate limit (429 beyond). Default none.
    pub rate_limit_per_ip: Option<RateLimit>,
}

/// A token bucket per client IP address.
#[derive(Clone, Copy, Debug)]
pub struct RateLimit {
    /// Sustained requests per second per IP.
    pub per_second: f64,
    /// Requests an idle IP may send at once.
    pub burst: u32,
}

/// Most client IPs tracked by the rate limiter; beyond, full buckets are
/// dropped (an IP with a full bucket loses nothing by being forgotten).
const MAX_TRACKED_IPS: usize = 65_536;

/// Per-IP token buckets: tokens and the time they were counted.
#[derive(Default)]
pub(super) struct Buckets {
    map: parking_lot::Mutex<std::collections::HashMap<std::net::IpAddr, (f64, std::time::Instant)>>,
}

impl Buckets {
    /// Takes a token for `ip`; false when its bucket is empty.
    fn take(&self, ip: std::net::IpAddr, limit: RateLimit) -> bool {
        let now = std::time::Instant::now();
        let mut map = self.map.lock();
        let burst = f64::from(limit.burst.max(1));
        let refill = |(tokens, at): (f64, std::time::Instant)| {
            (tokens + now.duration_since(at).as_secs_f64() * limit.per_second).min(burst)
        };
        if map.len() >= MAX_TRACKED_IPS {
            map.retain(|_, v| refill(*v) < burst);
            if map.len() >= MAX_TRACKED_IPS {
                map.clear();
            }
        }
        let tokens = map.get(&ip).map_or(burst, |v| refill(*v));
        let ok = tokens >= 1.0;
        map.insert(ip, (if ok { tokens - 1.0 } else { tokens }, now));
        ok
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_body_bytes: 256 * 1024,
            request_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(5),
            max_concurrent_requests: 256,
            max_connections: 1024,
            cors_allowed_origins: Vec::new(),
            rate_limit_per_ip: None,
        }
    }
}

/// State of the limits middleware.
#[derive(Clone)]
pub(super) struct Limits {
    pub(super) permits: Arc<Semaphore>,
    pub(super) config: Arc<HttpConfig>,
    pub(super) buckets: Arc<Buckets>,
}

/// Middleware: per-IP rate limit, body size by `Content-Length` (bodies
/// without one are bounded by `DefaultBodyLimit` in the extractor), load
/// shedding, timeout.
pub(super) async fn limits(State(l): State<Limits>, req: Request, next: Next) -> Response {
    if let Some(limit) = l.config.rate_limit_per_ip {
        let peer = req
            .extensions()
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip());
        if let Some(ip) = peer {
            if !l.buckets.take(ip, limit) {
                let mut r = ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "rate limited: over {} requests/s from {ip}",
                        limit.per_second
                    ),
                )
                .into_response();
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return r;
            }
        }
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > l.config.max_body_bytes as u64) {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body over {} bytes", l.config.max_body_bytes),
        )
        .into_response();
    }
    let Ok(_permit) = l.permits.clone().try_acquire_owned() else {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "overloaded: {} requests in progress, retry later",
                l.config.max_concurrent_requests
            ),
        )
        .into_response();
    };
    match tokio::time::timeout(l.config.request_timeout, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "request took over {} s, abandoned",
                l.config.request_timeout.as_secs_f64()
            ),
        )
        .into_response(),
    }
}

/// Middleware: CORS for the configured origins (simple requests and
/// preflights; GET and POST, `Content-Type` header).
pub(super) async fn cors(State(l): State<Limits>, req: Request, next: Next) -> Response {
    let allowed = &l.config.cors_allowed_origins;
    let origin = req.headers().get(header::ORIGIN).cloned();
    let allow = origin.as_ref().and_then(|o| {
        let o_str = o.to_str().ok()?;
        if allowed.iter().any(|a| a == "*") {
            Some(HeaderValue::from_static("*"))
        } else if allowed.iter().any(|a| a == o_str) {
            Some(o.clone())
        } else {
            None
        }
    });
    let preflight = req.method() == Method::OPTIONS
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut resp = if preflight && allow.is_some() {
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("content-type"),
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
        r
    } else {
        next.run(req).await
    };
    if let Some(a) = allow {
        resp.headers_mut()
            .insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, a);
        resp.headers_mut()
            .append(header::VARY, HeaderValue::from_static("origin"));
    }
    resp
}

/// Largest error body (bytes) that [`json_errors`] carries over as the
/// message; axum's rejection texts are far shorter.
const MAX_REWRITTEN_ERROR: usize = 4096;

/// Middleware: an error response that is not JSON (axum's own rejections of
/// a path, query string or body, written as `text/plain`) becomes the API's
/// `{"code","message"}` with the same status and the text as the message.
pub(super) async fn json_errors(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let message = match axum::body::to_bytes(body, MAX_REWRITTEN_ERROR).await {
        Ok(b) if !b.is_empty() => String::from_utf8_lossy(&b).trim().to_string(),
        _ => status.canonical_reason().unwrap_or("error").to_string(),
    };
    let mut out = ApiError::new(status, message).into_response();
    for (k, v) in parts.headers.iter() {
        if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH {
            out.headers_mut().insert(k.clone(), v.clone());
        }
    }
    out
}

/// Serves the API on `addr` with `config` until `shutdown` resolves.
///
/// # Errors
/// Binding fails.
pub async fn serve_with(
    addr: SocketAddr,
    state: AppState,
    config: HttpConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "HTTP API listening");
    serve_listener(listener, state, config, shutdown).await
}

/// Serves the API on an already bound `listener` (tests bind port 0 and
/// read the port back) until `shutdown` resolves; then stops accepting and
/// waits up to `config.request_timeout` for open connections to finish.
///
/// # Errors
/// None today (accept errors are logged and retried); `io::Result` keeps
/// room for fatal listener errors.
pub async fn serve_listener(
    listener: tokio::net::TcpListener,
    state: AppState,
    config: HttpConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router_with(state, &config);
    let conns = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = conns.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        // The client's address for the rate limiter (axum's `ConnectInfo`).
        let svc = TowerToHyperService::new(app.clone().map_request(
            move |mut req: axum::http::Request<hyper::body::Incoming>| {
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                req
            },
        ));
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(config.header_read_timeout);
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), svc));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "HTTP connection ended with an error");
            }
            drop(permit);
        });
    }
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(config.request_timeout) => {
            tracing::warn!("HTTP shutdown: connections still open after the request timeout");
        }
    }
    Ok(())
}
