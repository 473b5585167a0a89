//! `/metrics`: Prometheus text exposition (format 0.0.4) of the chain
//! state's counters and per-route HTTP request counts and latency
//! histograms.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Extension;

use super::{read, ApiResult, AppState};

/// Upper bounds of the latency histogram buckets, seconds.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

#[derive(Default)]
struct RouteStats {
    by_status: BTreeMap<u16, u64>,
    buckets: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum_secs: f64,
}

/// Per-route HTTP counters, shared by the tracking middleware and
/// `/metrics`. Routes are the router's path templates (`/tx/{txid}`), so
/// the label set is bounded; unmatched paths count as `unmatched`.
#[derive(Default)]
pub struct HttpMetrics {
    routes: Mutex<BTreeMap<String, RouteStats>>,
}

impl HttpMetrics {
    fn record(&self, route: &str, status: u16, secs: f64) {
        let mut routes = self
            .routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let r = match routes.get_mut(route) {
            Some(r) => r,
            None => routes.entry(route.to_string()).or_default(),
        };
        *r.by_status.entry(status).or_default() += 1;
        for (i, le) in LATENCY_BUCKETS.iter().enumerate() {
            if secs <= *le {
                r.buckets[i] += 1;
            }
        }
        r.count += 1;
        r.sum_secs += secs;
    }

    fn render(&self, out: &mut String) {
        let routes = self
            .routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        out.push_str("# HELP kakehi_http_requests_total HTTP requests by route and status.\n");
        out.push_str("# TYPE kakehi_http_requests_total counter\n");
        for (route, r) in routes.iter() {
            for (code, n) in &r.by_status {
                let _ = writeln!(
                    out,
                    "kakehi_http_requests_total{{route=\"{route}\",code=\"{code}\"}} {n}"
                );
            }
        }
        out.push_str(
            "# HELP kakehi_http_request_duration_seconds HTTP request latency by route.\n",
        );
        out.push_str("# TYPE kakehi_http_request_duration_seconds histogram\n");
        for (route, r) in routes.iter() {
            for (i, le) in LATENCY_BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "kakehi_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"{le}\"}} {}",
                    r.buckets[i]
                );
            }
            let _ = writeln!(
                out,
                "kakehi_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"+Inf\"}} {}",
                r.count
            );
            let _ = writeln!(
                out,
                "kakehi_http_request_duration_seconds_sum{{route=\"{route}\"}} {}",
                r.sum_secs
            );
            let _ = writeln!(
                out,
                "kakehi_http_request_duration_seconds_count{{route=\"{route}\"}} {}",
                r.count
            );
        }
    }
}

/// Middleware: times each request and records it under its route template.
pub(super) async fn track(State(m): State<Arc<HttpMetrics>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let started = Instant::now();
    let resp = next.run(req).await;
    m.record(
        &route,
        resp.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    resp
}

fn gauge(out: &mut String, name: &str, kind: &str, help: &str, v: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
    );
}

/// `GET /metrics`.
pub(super) async fn metrics(
    State(s): State<AppState>,
    Extension(m): Extension<Arc<HttpMetrics>>,
) -> ApiResult<Response> {
    let mut out = read(&s, |cs| {
        let mut out = String::new();
        let st = cs.stats();
        let u = cs.utxo_stats();
        gauge(
            &mut out,
            "kakehi_tip_height",
            "gauge",
            "Height of the active tip, blocks.",
            u64::from(cs.index().tip_height()),
        );
        gauge(
            &mut out,
            "kakehi_blocks_connected_total",
            "counter",
            "Blocks connected since start-up.",
            st.blocks_connected,
        );
        gauge(
            &mut out,
            "kakehi_blocks_rejected_total",
            "counter",
            "Blocks rejected since start-up.",
            st.blocks_rejected,
        );
        gauge(
            &mut out,
            "kakehi_reorgs_total",
            "counter",
            "Reorganisations since start-up.",
            st.reorgs,
        );
        gauge(
            &mut out,
            "kakehi_reorgs_refused_total",
            "counter",
            "Reorgs refused (deeper than 100 blocks) since start-up.",
            st.reorgs_refused,
        );
        gauge(
            &mut out,
            "kakehi_utxo_txouts",
            "gauge",
            "Unspent outputs on the active chain.",
            u.txouts,
        );
        gauge(
            &mut out,
            "kakehi_utxo_total_amount_sats",
            "gauge",
            "Value of the unspent outputs, sats.",
            u.total_amount_sats,
        );
        Ok(out)
    })
    .await?;
    m.render(&mut out);
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response())
}
