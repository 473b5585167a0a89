//! The HTTP server with its limits: a custom accept loop over hyper's
//! HTTP/1 connection builder (so a header-read timeout applies, which
//! `axum::serve` does not install), a cap on open connections, and
//! middleware for the per-request timeout, the concurrency limit with load
//! shedding and the body size limit; tower-http's CORS layer and
//! tower_governor's per-IP rate limit. Every refusal uses the API's
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
    /// queue. Default 1,024; the node trims it to its share of the
    /// open-files limit ([`crate::fds::FdBudget`]).
    pub max_connections: usize,
    /// Open connections from one client IP address (an IPv6 address counts
    /// by its /64): a connection past it is closed at once. 0 (the
    /// default) for no cap: behind a reverse proxy every client has the
    /// proxy's address.
    pub max_connections_per_ip: usize,
    /// Origins allowed to read responses from browsers (CORS): empty for
    /// no CORS headers, `"*"` for any origin. Default empty.
    pub cors_allowed_origins: Vec<String>,
    /// Optional per-client-IP rate limit (429 beyond). Default none.
    pub rate_limit_per_ip: Option<RateLimit>,
}

/// A token bucket per client IP address (tower_governor's keyed GCRA).
#[derive(Clone, Copy, Debug)]
pub struct RateLimit {
    /// Sustained requests per second per IP (a token comes back every
    /// `1 / per_second` seconds).
    pub per_second: f64,
    /// Requests an idle IP may send at once.
    pub burst: u32,
}

/// How often the rate limiter forgets IPs whose bucket is full again
/// (governor's `retain_recent`): its memory is bounded by the IPs seen in
/// one such period.
const RATE_LIMIT_CLEANUP: Duration = Duration::from_secs(60);

/// The rate limiter's key: the client's IP address from the connection
/// (axum's `ConnectInfo`, inserted by [`serve_listener`]); an IPv6 address
/// counts by its /64 network (one host usually holds a whole /64). A
/// request without one (a router driven without this server) shares the
/// unspecified address's bucket.
#[derive(Clone, Copy, Debug)]
struct ClientIp;

impl tower_governor::key_extractor::KeyExtractor for ClientIp {
    type Key = std::net::IpAddr;

    fn extract<T>(
        &self,
        req: &axum::http::Request<T>,
    ) -> Result<Self::Key, tower_governor::GovernorError> {
        use std::net::{IpAddr, Ipv4Addr};
        let ip = req
            .extensions()
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
            .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip());
        Ok(client_key(ip))
    }
}

/// `ip` as clients are counted: an IPv6 address by its /64 network (one
/// host usually holds a whole /64).
fn client_key(ip: std::net::IpAddr) -> std::net::IpAddr {
    use std::net::{IpAddr, Ipv6Addr};
    match ip {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

/// Open connections per client ([`client_key`]), capped
/// ([`HttpConfig::max_connections_per_ip`]; 0: no cap, nothing counted).
#[derive(Clone)]
struct PerIp {
    cap: usize,
    open: Arc<parking_lot::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
}

/// One connection counted by [`PerIp`], uncounted when dropped.
struct PerIpSlot {
    ip: Option<std::net::IpAddr>,
    open: Arc<parking_lot::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
}

impl PerIp {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            open: Arc::default(),
        }
    }

    /// Counts a connection from `ip`: `None` when `ip` is at the cap.
    fn admit(&self, ip: std::net::IpAddr) -> Option<PerIpSlot> {
        if self.cap == 0 {
            return Some(PerIpSlot {
                ip: None,
                open: self.open.clone(),
            });
        }
        let key = client_key(ip);
        let mut open = self.open.lock();
        let n = open.entry(key).or_insert(0);
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(PerIpSlot {
            ip: Some(key),
            open: self.open.clone(),
        })
    }
}

impl Drop for PerIpSlot {
    fn drop(&mut self) {
        let Some(ip) = self.ip else {
            return;
        };
        let mut open = self.open.lock();
        if let Some(n) = open.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&ip);
            }
        }
    }
}

/// `router` behind a per-IP rate limit of `limit` (tower_governor),
/// answering 429 in the API's JSON shape with governor's `Retry-After`
/// (whole seconds until the next token). A limit that is not positive
/// limits nothing (`router` is returned as is, with a warning). Starts, on
/// the current tokio runtime if there is one, a task that forgets idle IPs
/// every [`RATE_LIMIT_CLEANUP`] and ends with the router.
pub(super) fn rate_limited(router: axum::Router, limit: RateLimit) -> axum::Router {
    let config = (limit.per_second.is_finite() && limit.per_second > 0.0)
        .then(|| {
            tower_governor::governor::GovernorConfigBuilder::default()
                .key_extractor(ClientIp)
                .period(Duration::from_secs_f64(1.0 / limit.per_second))
                .burst_size(limit.burst.max(1))
                .finish()
        })
        .flatten();
    let Some(config) = config else {
        tracing::warn!(
            per_second = limit.per_second,
            "rate limit is not positive: no limit applied"
        );
        return router;
    };
    let config = Arc::new(config);
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let limiter = Arc::downgrade(config.limiter());
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(RATE_LIMIT_CLEANUP).await;
                let Some(limiter) = limiter.upgrade() else {
                    break;
                };
                limiter.retain_recent();
                limiter.shrink_to_fit();
            }
        });
    }
    let per_second = limit.per_second;
    router.layer(
        tower_governor::GovernorLayer::new(config).error_handler(move |e| {
            let (wait, headers) = match e {
                tower_governor::GovernorError::TooManyRequests { wait_time, headers } => {
                    (wait_time, headers)
                }
                // The key extractor never fails; other errors are not ours.
                _ => (1, None),
            };
            let mut r = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!("rate limited: over {per_second} requests/s from this address, retry in {wait} s"),
            )
            .into_response();
            for (k, v) in headers.iter().flatten() {
                r.headers_mut().insert(k.clone(), v.clone());
            }
            r
        }),
    )
}

/// `router` behind tower-http's CORS layer for `origins` (`"*"` among them:
/// any origin): simple requests and preflights, methods GET, POST and
/// OPTIONS, header `Content-Type`, preflights cached 600 s. An empty list
/// returns `router` as is (no CORS headers). An origin that is not a valid
/// header value is skipped with a warning.
pub(super) fn with_cors(router: axum::Router, origins: &[String]) -> axum::Router {
    use tower_http::cors::{AllowOrigin, CorsLayer};
    if origins.is_empty() {
        return router;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| {
            HeaderValue::from_str(o)
                .inspect_err(|_| tracing::warn!(origin = %o, "CORS origin is not a valid header value: ignored"))
                .ok()
        }))
    };
    router.layer(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
            .allow_headers([header::CONTENT_TYPE])
            .max_age(Duration::from_secs(600)),
    )
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_body_bytes: 256 * 1024,
            request_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(5),
            max_concurrent_requests: 256,
            max_connections: 1024,
            max_connections_per_ip: 0,
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
}

/// Middleware: body size by `Content-Length` (bodies without one are
/// bounded by `DefaultBodyLimit` in the extractor), load shedding, timeout.
pub(super) async fn limits(State(l): State<Limits>, req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // `POST /tx` takes a standard transaction of any shape (up to
    // 400,000 bytes, 800,000 in hex): its own bound, checked again by its
    // extractor.
    let max = if req.uri().path() == "/tx" {
        l.config.max_body_bytes.max(super::mempool::MAX_TX_BODY)
    } else {
        l.config.max_body_bytes
    };
    if declared.is_some_and(|n| n > max as u64) {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body over {max} bytes"),
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

/// Pause of the accept loop after a failed accept (a connection reset
/// before it was accepted, and the like).
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);
/// Pause of the accept loop when the process is out of descriptors
/// (`EMFILE`, `ENFILE`): the connections it has must end first.
const ACCEPT_PAUSE_EXHAUSTED: Duration = Duration::from_millis(250);
/// At most one "accept failed" line per this period (with the count of
/// failures not logged).
const ACCEPT_LOG_PERIOD: Duration = Duration::from_secs(10);

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
    let mut accept_log = crate::fds::LogThrottle::new(ACCEPT_LOG_PERIOD);
    let mut per_ip_log = crate::fds::LogThrottle::new(ACCEPT_LOG_PERIOD);
    let per_ip = PerIp::new(config.max_connections_per_ip);
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
                    // Out of descriptors (EMFILE, ENFILE) is back-pressure:
                    // stop accepting for a moment, and say so once per
                    // ACCEPT_LOG_PERIOD rather than at every retry.
                    if let Some(missed) = accept_log.hit() {
                        tracing::warn!(error = %e, missed, "HTTP accept failed: pausing accepts");
                    }
                    let pause = if crate::fds::is_exhausted(&e) { ACCEPT_PAUSE_EXHAUSTED } else { ACCEPT_PAUSE };
                    tokio::time::sleep(pause).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Some(per_ip) = per_ip.admit(peer.ip()) else {
            // Past the per-IP cap: closed at once (dropped).
            if let Some(missed) = per_ip_log.hit() {
                tracing::warn!(%peer, missed, cap = config.max_connections_per_ip, "HTTP connection refused: too many from this address");
            }
            continue;
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
            drop(per_ip);
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
