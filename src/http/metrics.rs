//! `/metrics`: Prometheus text exposition (format 0.0.4, encoded by
//! `prometheus-client`) of the chain state's counters, the peers (when P2P
//! runs: [`AppState::p2p`]), the Sozu UTXO table's counters (fresh at every
//! scrape) and layer and size figures (refreshed at most every
//! [`SOZU_STATS_MAX_AGE`]: they need a scan of every page), and per-route
//! HTTP request counts and latency histograms.
//!
//! The HTTP families live as long as the router; everything read from the
//! chain state is registered afresh at each scrape, as constant metrics of
//! the snapshot being read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use parking_lot::Mutex;
use prometheus_client::encoding::prometheus_text::{encode, CONTENT_TYPE};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::{read, ApiError, ApiResult, AppState};
use crate::p2p::P2pHandle;
use crate::snapshot::ChainSnapshot;
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

/// Labels of `kakehi_http_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteCode {
    route: String,
    code: u16,
}

/// Labels of `kakehi_http_request_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: String,
}

/// Labels of the Sozu per-layer gauges (0 = the top layer, in RAM).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LayerLabel {
    layer: usize,
}

/// Labels of `kakehi_peers`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: &'static str,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// Per-route HTTP counters, shared by the tracking middleware and
/// `/metrics`. Routes are the router's path templates (`/tx/{txid}`), so
/// the label set is bounded; unmatched paths count as `unmatched`.
pub struct HttpMetrics {
    requests: Family<RouteCode, Counter>,
    latency: Family<RouteLabel, Histogram, fn() -> Histogram>,
    /// The last Sozu statistics and when they were computed.
    sozu: Mutex<Option<(Instant, Option<SozuStats>)>>,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        HttpMetrics {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            sozu: Mutex::new(None),
        }
    }
}

impl HttpMetrics {
    fn record(&self, route: &str, status: u16, secs: f64) {
        self.requests
            .get_or_create(&RouteCode {
                route: route.to_string(),
                code: status,
            })
            .inc();
        self.latency
            .get_or_create(&RouteLabel {
                route: route.to_string(),
            })
            .observe(secs);
    }

    fn register(&self, registry: &mut Registry) {
        registry.register(
            "kakehi_http_requests",
            "HTTP requests by route and status",
            self.requests.clone(),
        );
        registry.register(
            "kakehi_http_request_duration_seconds",
            "HTTP request latency by route",
            self.latency.clone(),
        );
    }

    /// The Sozu statistics to show: the layer and byte figures of a scan at
    /// most [`SOZU_STATS_MAX_AGE`] old (scanning now if older), with the
    /// counters as of `cs`.
    fn sozu_stats(&self, cs: &ChainSnapshot) -> ApiResult<Option<SozuStats>> {
        let mut cache = self.sozu.lock();
        let fresh = matches!(&*cache, Some((at, _)) if at.elapsed() < SOZU_STATS_MAX_AGE);
        if !fresh {
            let st = cs.table_stats().map_err(ApiError::internal)?;
            *cache = Some((Instant::now(), st));
        }
        let Some((_, Some(scan))) = &*cache else {
            return Ok(None);
        };
        Ok(Some(match cs.table_counters() {
            Some(now) => SozuStats {
                layers: scan.layers.clone(),
                bytes_on_disk: scan.bytes_on_disk,
                journal_file_bytes: scan.journal_file_bytes,
                payload_bytes: scan.payload_bytes,
                ..now
            },
            None => scan.clone(),
        }))
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

/// A gauge of `value` (u64 counts and sums) registered under `name`.
fn gauge(r: &mut Registry, name: &str, help: &str, value: u64) {
    r.register(name, help, ConstGauge::new(value));
}

/// A counter of `value` registered under `name` (the `_total` suffix is
/// added by the encoder).
fn counter(r: &mut Registry, name: &str, help: &str, value: u64) {
    r.register(name, help, ConstCounter::new(value));
}

/// The chain state's figures of `cs`.
fn register_chain(r: &mut Registry, cs: &ChainSnapshot) {
    let st = cs.stats();
    let u = cs.utxo_stats();
    let tip = u64::from(cs.index().tip_height());
    gauge(
        r,
        "kakehi_tip_height",
        "Height of the active tip, blocks",
        tip,
    );
    counter(
        r,
        "kakehi_blocks_connected",
        "Blocks connected since start-up",
        st.blocks_connected,
    );
    counter(
        r,
        "kakehi_blocks_rejected",
        "Blocks rejected since start-up",
        st.blocks_rejected,
    );
    counter(
        r,
        "kakehi_reorgs",
        "Reorganisations since start-up",
        st.reorgs,
    );
    counter(
        r,
        "kakehi_reorgs_refused",
        "Reorgs refused (deeper than 100 blocks) since start-up",
        st.reorgs_refused,
    );
    gauge(
        r,
        "kakehi_utxo_txouts",
        "Unspent outputs on the active chain",
        u.txouts,
    );
    gauge(
        r,
        "kakehi_utxo_total_amount_sats",
        "Value of the unspent outputs, sats",
        u.total_amount_sats,
    );
}

/// The Sozu table's layer figures and counters.
fn register_sozu(r: &mut Registry, st: &SozuStats) {
    let entries: Family<LayerLabel, Gauge> = Family::default();
    let buckets: Family<LayerLabel, Gauge> = Family::default();
    let fill: Family<LayerLabel, Gauge<f64, std::sync::atomic::AtomicU64>> = Family::default();
    for (layer, ls) in st.layers.iter().enumerate() {
        let l = LayerLabel { layer };
        entries
            .get_or_create(&l)
            .set(i64::try_from(ls.entries).unwrap_or(i64::MAX));
        buckets
            .get_or_create(&l)
            .set(i64::try_from(ls.buckets).unwrap_or(i64::MAX));
        fill.get_or_create(&l).set(ls.fill);
    }
    r.register(
        "kakehi_sozu_layer_entries",
        "Entries stored in a Sozu table layer (0 = RAM top)",
        entries,
    );
    r.register(
        "kakehi_sozu_layer_buckets",
        "Allocated buckets (pages) of a Sozu table layer",
        buckets,
    );
    r.register(
        "kakehi_sozu_layer_fill_ratio",
        "Encoded entry bytes / page payload capacity of a layer, 0..1",
        fill,
    );
    let gauges: [(&str, &str, u64); 3] = [
        (
            "kakehi_sozu_bytes_on_disk",
            "Bytes of the Sozu table's files (pages, records, journal, header)",
            st.bytes_on_disk,
        ),
        (
            "kakehi_sozu_journal_file_bytes",
            "Bytes of the Sozu table's journal file",
            st.journal_file_bytes,
        ),
        (
            "kakehi_sozu_payload_bytes",
            "Serialized size of the Sozu table's live entries, bytes",
            st.payload_bytes,
        ),
    ];
    for (name, help, v) in gauges {
        gauge(r, name, help, v);
    }
    let counters: [(&str, &str, u64); 7] = [
        (
            "kakehi_sozu_spills",
            "Entries spilled to a lower Sozu layer since start-up",
            st.spills,
        ),
        (
            "kakehi_sozu_purges",
            "Entries purged from the Sozu table since start-up",
            st.purges,
        ),
        (
            "kakehi_sozu_children_allocated",
            "Sozu child groups allocated since start-up",
            st.children_allocated,
        ),
        (
            "kakehi_sozu_commits",
            "Sozu table commits since start-up",
            st.commits,
        ),
        (
            "kakehi_sozu_checkpoints",
            "Sozu table checkpoints since start-up",
            st.checkpoints,
        ),
        (
            "kakehi_sozu_disk_page_reads",
            "Page reads from the Sozu disk layers since start-up",
            st.disk_page_reads,
        ),
        (
            "kakehi_sozu_journal_written_bytes",
            "Bytes appended to the Sozu journal since start-up",
            st.journal_bytes,
        ),
    ];
    for (name, help, v) in counters {
        counter(r, name, help, v);
    }
}

/// A label of a mempool counter family: Core's reject reason, or why
/// transactions left.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

/// The mempool's size, minimum feerate, acceptances, refusals by Core's
/// reason and removals by cause.
fn register_mempool(r: &mut Registry, m: &crate::mempool::MempoolSnapshot) {
    let t = m.pool.totals();
    gauge(
        r,
        "kakehi_mempool_transactions",
        "Transactions in the mempool",
        t.count,
    );
    gauge(
        r,
        "kakehi_mempool_vbytes",
        "Virtual size of the mempool's transactions, vbytes",
        t.vsize,
    );
    gauge(
        r,
        "kakehi_mempool_usage_bytes",
        "Memory the mempool accounts for, bytes",
        t.usage,
    );
    gauge(
        r,
        "kakehi_mempool_fees_sats",
        "Fees of the mempool's transactions, sats",
        t.fees,
    );
    gauge(
        r,
        "kakehi_mempool_min_feerate_sat_per_kvb",
        "The mempool's minimum feerate, sats per 1,000 vbytes",
        m.min_feerate,
    );
    counter(
        r,
        "kakehi_mempool_accepted",
        "Transactions accepted to the mempool since start",
        m.counters.accepted,
    );
    let rejected: Family<ReasonLabel, Counter> = Family::default();
    for (reason, n) in &m.counters.rejected {
        rejected
            .get_or_create(&ReasonLabel {
                reason: reason.clone(),
            })
            .inc_by(*n);
    }
    r.register(
        "kakehi_mempool_rejected",
        "Transactions refused since start, by Bitcoin Core's reject reason",
        rejected,
    );
    let removed: Family<ReasonLabel, Counter> = Family::default();
    for (reason, n) in &m.counters.removed {
        removed
            .get_or_create(&ReasonLabel {
                reason: (*reason).to_string(),
            })
            .inc_by(*n);
    }
    r.register(
        "kakehi_mempool_removed",
        "Transactions that left the mempool since start, by cause (confirmed, conflict, replaced, sizelimit, expiry, reorg)",
        removed,
    );
}

/// The connected peers by direction.
fn register_peers(r: &mut Registry, p2p: &P2pHandle) {
    let peers = p2p.peers();
    let inbound = peers.iter().filter(|p| p.inbound).count();
    let family: Family<DirectionLabel, Gauge> = Family::default();
    for (direction, n) in [("inbound", inbound), ("outbound", peers.len() - inbound)] {
        family
            .get_or_create(&DirectionLabel { direction })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    r.register(
        "kakehi_peers",
        "Connected P2P peers (handshake done or in progress) by direction",
        family,
    );
}

/// `GET /metrics`.
pub(super) async fn metrics(
    State(s): State<AppState>,
    Extension(m): Extension<Arc<HttpMetrics>>,
) -> ApiResult<Response> {
    let p2p = s.p2p.clone();
    let mempool = super::mempool::snapshot(&s);
    let out = read(&s, move |cs| {
        let mut registry = Registry::default();
        register_chain(&mut registry, cs);
        if let Some(st) = m.sozu_stats(cs)? {
            register_sozu(&mut registry, &st);
        }
        if let Some(p2p) = &p2p {
            register_peers(&mut registry, p2p);
        }
        if let Some(mp) = &mempool {
            register_mempool(&mut registry, mp);
        }
        m.register(&mut registry);
        let mut out = String::new();
        encode(&mut out, &registry).map_err(ApiError::internal)?;
        Ok(out)
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, CONTENT_TYPE)], out).into_response())
}
