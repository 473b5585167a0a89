//! `/metrics`: Prometheus text exposition (format 0.0.4) of the chain
//! state's counters, the peers (when P2P runs: [`AppState::p2p`]), the Sozu
//! UTXO table's counters (fresh at every scrape) and layer and size figures
//! (refreshed at most every [`SOZU_STATS_MAX_AGE`]: they need a scan of
//! every page), and per-route HTTP request counts and latency histograms.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use parking_lot::Mutex;

use super::{read, ApiError, ApiResult, AppState};
use crate::p2p::P2pHandle;
use crate::sozu::SozuStats;

/// Longest time a scrape reuses the Sozu table's layer and size figures of
/// an earlier one (computing them scans every committed page of the table
/// through its `UtxoReader`: it no longer holds up the writer, but reads the
/// whole table, seconds of I/O at 20M entries).
pub const SOZU_STATS_MAX_AGE: Duration = Duration::from_secs(600);

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
    /// The last Sozu statistics and when they were computed.
    sozu: Mutex<Option<(Instant, Option<SozuStats>)>>,
}

impl HttpMetrics {
    fn record(&self, route: &str, status: u16, secs: f64) {
        let mut routes = self.routes.lock();
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
        let routes = self.routes.lock();
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

fn render_sozu(out: &mut String, st: &SozuStats) {
    out.push_str(
        "# HELP kakehi_sozu_layer_entries Entries stored in a Sozu table layer (0 = RAM top).\n",
    );
    out.push_str("# TYPE kakehi_sozu_layer_entries gauge\n");
    for (l, ls) in st.layers.iter().enumerate() {
        let _ = writeln!(
            out,
            "kakehi_sozu_layer_entries{{layer=\"{l}\"}} {}",
            ls.entries
        );
    }
    out.push_str(
        "# HELP kakehi_sozu_layer_buckets Allocated buckets (pages) of a Sozu table layer.\n",
    );
    out.push_str("# TYPE kakehi_sozu_layer_buckets gauge\n");
    for (l, ls) in st.layers.iter().enumerate() {
        let _ = writeln!(
            out,
            "kakehi_sozu_layer_buckets{{layer=\"{l}\"}} {}",
            ls.buckets
        );
    }
    out.push_str("# HELP kakehi_sozu_layer_fill_ratio Encoded entry bytes / page payload capacity of a layer, 0..1.\n");
    out.push_str("# TYPE kakehi_sozu_layer_fill_ratio gauge\n");
    for (l, ls) in st.layers.iter().enumerate() {
        let _ = writeln!(
            out,
            "kakehi_sozu_layer_fill_ratio{{layer=\"{l}\"}} {}",
            ls.fill
        );
    }
    let rows: [(&str, &str, &str, u64); 10] = [
        (
            "kakehi_sozu_bytes_on_disk",
            "gauge",
            "Bytes of the Sozu table's files (pages, records, journal, header).",
            st.bytes_on_disk,
        ),
        (
            "kakehi_sozu_journal_file_bytes",
            "gauge",
            "Bytes of the Sozu table's journal file.",
            st.journal_file_bytes,
        ),
        (
            "kakehi_sozu_payload_bytes",
            "gauge",
            "Serialized size of the Sozu table's live entries, bytes.",
            st.payload_bytes,
        ),
        (
            "kakehi_sozu_spills_total",
            "counter",
            "Entries spilled to a lower Sozu layer since start-up.",
            st.spills,
        ),
        (
            "kakehi_sozu_purges_total",
            "counter",
            "Entries purged from the Sozu table since start-up.",
            st.purges,
        ),
        (
            "kakehi_sozu_children_allocated_total",
            "counter",
            "Sozu child groups allocated since start-up.",
            st.children_allocated,
        ),
        (
            "kakehi_sozu_commits_total",
            "counter",
            "Sozu table commits since start-up.",
            st.commits,
        ),
        (
            "kakehi_sozu_checkpoints_total",
            "counter",
            "Sozu table checkpoints since start-up.",
            st.checkpoints,
        ),
        (
            "kakehi_sozu_disk_page_reads_total",
            "counter",
            "Page reads from the Sozu disk layers since start-up.",
            st.disk_page_reads,
        ),
        (
            "kakehi_sozu_journal_written_bytes_total",
            "counter",
            "Bytes appended to the Sozu journal since start-up.",
            st.journal_bytes,
        ),
    ];
    for (name, kind, help, v) in rows {
        gauge(out, name, kind, help, v);
    }
}

fn render_peers(out: &mut String, p2p: &P2pHandle) {
    let peers = p2p.peers();
    let inbound = peers.iter().filter(|p| p.inbound).count();
    out.push_str(
        "# HELP kakehi_peers Connected P2P peers (handshake done or in progress) by direction.\n",
    );
    out.push_str("# TYPE kakehi_peers gauge\n");
    let _ = writeln!(out, "kakehi_peers{{direction=\"inbound\"}} {inbound}");
    let _ = writeln!(
        out,
        "kakehi_peers{{direction=\"outbound\"}} {}",
        peers.len() - inbound
    );
}

/// `GET /metrics`.
pub(super) async fn metrics(
    State(s): State<AppState>,
    Extension(m): Extension<Arc<HttpMetrics>>,
) -> ApiResult<Response> {
    let m2 = m.clone();
    let p2p = s.p2p.clone();
    let mut out = read(&s, move |cs| {
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
        let mut cache = m2.sozu.lock();
        let fresh = matches!(&*cache, Some((at, _)) if at.elapsed() < SOZU_STATS_MAX_AGE);
        if !fresh {
            let st = cs.table_stats().map_err(ApiError::internal)?;
            *cache = Some((Instant::now(), st));
        }
        if let Some((_, Some(scan))) = &*cache {
            // Layer and byte figures from the scan, counters as of now.
            let st = match cs.table_counters() {
                Some(now) => SozuStats {
                    layers: scan.layers.clone(),
                    bytes_on_disk: scan.bytes_on_disk,
                    journal_file_bytes: scan.journal_file_bytes,
                    payload_bytes: scan.payload_bytes,
                    ..now
                },
                None => scan.clone(),
            };
            render_sozu(&mut out, &st);
        }
        Ok(out)
    })
    .await?;
    if let Some(p2p) = &p2p {
        render_peers(&mut out, p2p);
    }
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
