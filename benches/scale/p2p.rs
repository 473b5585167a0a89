//! The scale bench's P2P part (`KAKEHI_SCALE_P2P=1`): an empty node B
//! syncs over loopback P2P from node A, the node that imported the files
//! (headers first, then the blocks of A's active chain, B validating
//! everything with A's settings: the same assumevalid block, address
//! index, groups of blocks made durable together while catching up).
//! Timed from the start of B's P2P layer until B's published tip is A's.
//! Prints a row per tenth of the heights (blocks/s, tx/s, inputs/s, RSS of
//! the process, which holds both nodes, and B's datadir bytes), the whole
//! sync against A's import, then compares A and B (tip, UTXO statistics,
//! SHA-256 of `dump-utxos`, the filter header at every 1,000th height, and
//! the bodies of HTTP answers) and times B's reopen.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bitcoin::BlockHash;
use kakehi::chain::assumevalid::AssumeValid;
use kakehi::http::{AppState, HttpConfig};
use kakehi::pipeline::GroupLimits;

use super::p2p_node::Node;
use super::{common, dump_sha256, filter_header_at, http_get, mib, tcommon, Totals};

/// Longest time B's tip may stay unmoved before the bench fails.
const STALL_LIMIT: Duration = Duration::from_secs(600);
/// How often B's published tip is polled.
const POLL: Duration = Duration::from_millis(10);

/// B's settings, taken from A's import.
pub struct Settings {
    /// The assumevalid block A used (`None`: every script verified).
    pub assume_valid: Option<BlockHash>,
    pub address_index: bool,
    /// Where B's temporary datadir goes (`None`: the system's).
    pub parent: Option<PathBuf>,
}

/// Syncs a fresh B from `a`, compares them, restarts B (see the module
/// docs). `import` is A's import, for the ratio and the per-block counts.
pub fn run(a: Node, import: &Totals, settings: &Settings) {
    let dir_b = match &settings.parent {
        Some(parent) => tempfile::tempdir_in(parent),
        None => tempfile::tempdir(),
    }
    .expect("tempdir");
    let b = open_b(dir_b.path(), settings);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let want = a.tip();
    warn_if_b_cannot_assume_valid(&a, settings);
    let per_height = per_height(&a, import);
    rt.block_on(async {
        let run_a = a.start(true, vec![]);
        let addr = run_a.handle.local_addr().await.expect("listen address");
        let mut tenths = TenthPrinter::new(&per_height, dir_b.path());
        let (t, cpu) = (Instant::now(), common::cpu_seconds());
        let run_b = b.start(false, vec![addr]);
        let secs = b
            .wait_for_tip(want, t, POLL, STALL_LIMIT, |h, at| tenths.moved(h, at))
            .await
            .as_secs_f64();
        let cpu = common::cpu_seconds() - cpu;
        run_b.stop().await;
        run_a.stop().await;
        print_sync(&b, &per_height, (secs, cpu), import);
    });
    drop(rt);
    compare(&a, &b);
    drop(b);
    let t = Instant::now();
    let b = open_b(dir_b.path(), settings);
    println!(
        "B restart: reopening its datadir at height {} took {:.2} s (RSS {} MiB, both nodes)",
        b.tip().0,
        t.elapsed().as_secs_f64(),
        common::status_mib("VmRSS:")
    );
}

/// B learns headers from A, which serves its active chain only (Core's
/// `getheaders`): an assumevalid block above A's tip
/// (`KAKEHI_SCALE_ASSUMEVALID=chain` with a prefix of the files) stays
/// unknown to B, which then verifies every script that A skipped. Says so,
/// since the ratio then compares unequal work.
fn warn_if_b_cannot_assume_valid(a: &Node, settings: &Settings) {
    let Some(hash) = settings.assume_valid else {
        return;
    };
    let snapshot = a.chain.lock().snapshot();
    let index = snapshot.index();
    if !index.id_of(&hash).is_some_and(|id| index.is_active(id)) {
        println!(
            "note: the assumevalid block {hash} is not on A's active chain, whose headers are all \
             B learns: B verifies every script, A verified none below that block, and the ratio \
             compares unequal work (use KAKEHI_SCALE_ASSUMEVALID=1 with KAKEHI_SCALE_P2P)"
        );
    }
}

/// Opens B on `path` with `settings`.
fn open_b(path: &std::path::Path, settings: &Settings) -> Node {
    let b = Node::open(path);
    {
        let mut cs = b.chain.lock();
        cs.set_group_limits(GroupLimits::NODE_DEFAULT);
        if let Some(hash) = settings.assume_valid {
            cs.set_assume_valid(AssumeValid::Block(hash));
        }
        cs.set_address_index(settings.address_index, &mut |_| {})
            .expect("address index setting");
    }
    b
}

/// (transactions, non-coinbase inputs) of A's active block at each height
/// (index 0: genesis, never downloaded).
fn per_height(a: &Node, import: &Totals) -> Vec<(u64, u64)> {
    let snapshot = a.chain.lock().snapshot();
    let index = snapshot.index();
    (0..=index.tip_height())
        .map(|h| {
            index
                .active_at(h)
                .and_then(|e| import.per_block.get(&e.hash).copied())
                .unwrap_or((0, 0))
        })
        .collect()
}

/// Prints a row each time B's tip passes a tenth of the heights.
struct TenthPrinter<'a> {
    per_height: &'a [(u64, u64)],
    datadir: &'a std::path::Path,
    tenth_size: u32,
    /// The next row's index (1-based) and where the last row ended.
    next: u32,
    last_height: u32,
    last_at: Duration,
}

impl<'a> TenthPrinter<'a> {
    fn new(per_height: &'a [(u64, u64)], datadir: &'a std::path::Path) -> Self {
        println!(
            "\nP2P sync of an empty node B from A (loopback), per tenth of the heights:\n{:>6} {:>8} {:>9} {:>9} {:>10} {:>8} {:>13}",
            "tenth", "blocks", "blocks/s", "tx/s", "inputs/s", "RSS MiB", "B datadir MiB"
        );
        let tip = per_height.len().saturating_sub(1) as u32;
        TenthPrinter {
            per_height,
            datadir,
            tenth_size: tip.div_ceil(10).max(1),
            next: 1,
            last_height: 0,
            last_at: Duration::ZERO,
        }
    }

    /// B's tip is at `height`, `at` after the sync started.
    fn moved(&mut self, height: u32, at: Duration) {
        let tip = self.per_height.len().saturating_sub(1) as u32;
        while self.next <= 10 && height >= (self.next * self.tenth_size).min(tip) {
            let end = (self.next * self.tenth_size).min(tip);
            let range = &self.per_height[self.last_height as usize + 1..=end as usize];
            let (txs, inputs) = range.iter().fold((0, 0), |s, r| (s.0 + r.0, s.1 + r.1));
            let secs = (at - self.last_at).as_secs_f64();
            println!(
                "{:>6} {:>8} {:>9.0} {:>9.0} {:>10.0} {:>8} {:>13.0}",
                self.next,
                range.len(),
                range.len() as f64 / secs,
                txs as f64 / secs,
                inputs as f64 / secs,
                common::status_mib("VmRSS:"),
                mib(common::dir_bytes(self.datadir))
            );
            (self.next, self.last_height, self.last_at) = (self.next + 1, end, at);
        }
    }
}

/// The whole sync's rates and its ratio to A's import.
/// `(secs, cpu)`: the sync's wall time and the process's CPU time over it
/// (both nodes: B syncing, A serving).
fn print_sync(b: &Node, per_height: &[(u64, u64)], (secs, cpu): (f64, f64), import: &Totals) {
    let (connected, busy) = {
        let cs = b.chain.lock();
        (
            cs.stats().blocks_connected,
            cs.stats().submit_micros as f64 / 1e6,
        )
    };
    let (txs, inputs) = per_height
        .iter()
        .fold((0, 0), |s, r| (s.0 + r.0, s.1 + r.1));
    let rate = inputs as f64 / secs;
    println!(
        "P2P sync: {connected} blocks, {txs} transactions, {inputs} inputs in {secs:.1} s \
         (from B's start to B's tip = A's): {:.0} blocks/s, {:.0} tx/s, {rate:.0} inputs/s; \
         B's pipeline (submit_block) busy {busy:.1} s = {:.0} % of it; CPU time {cpu:.1} s, both nodes \
         ({:.1} µs per input); peak RSS {} MiB (both nodes)",
        connected as f64 / secs,
        txs as f64 / secs,
        100.0 * busy / secs,
        cpu * 1e6 / inputs as f64,
        common::status_mib("VmHWM:")
    );
    println!(
        "P2P sync vs import (inputs/s): {:.2}x A's import wall time (headers, reading and decoding included), \
         {:.2}x A's pipeline time (target >= 0.8x); CPU per input: import {:.2}x the sync's",
        rate / (import.inputs as f64 / import.wall_seconds),
        rate / (import.inputs as f64 / import.pipeline_seconds),
        (import.cpu_seconds / import.inputs as f64) / (cpu / inputs as f64)
    );
}

/// A against B: tip, UTXO statistics and dump, filter headers, HTTP.
fn compare(a: &Node, b: &Node) {
    let verdict = |same: bool| if same { "equal" } else { "DIFFER" };
    let (ta, tb) = (a.tip(), b.tip());
    println!(
        "A vs B: tips {} (A height {} {}, B height {} {})",
        verdict(ta == tb),
        ta.0,
        ta.1,
        tb.0,
        tb.1
    );
    let (sa, sb) = (a.chain.lock().snapshot(), b.chain.lock().snapshot());
    println!(
        "A vs B: UTXO statistics {} ({} outputs)",
        verdict(sa.utxo_stats() == sb.utxo_stats()),
        sa.utxo_stats().txouts
    );
    let t = Instant::now();
    let (da, db) = (
        dump_sha256(&mut a.chain.lock()),
        dump_sha256(&mut b.chain.lock()),
    );
    println!(
        "A vs B: dump-utxos SHA-256 {} (A {da}, B {db}; both dumps {:.1} s)",
        verdict(da == db),
        t.elapsed().as_secs_f64()
    );
    let heights: Vec<u32> = (1..=ta.0 / 1_000).map(|k| k * 1_000).collect();
    let same = heights
        .iter()
        .filter(|&&h| {
            let fa = filter_header_at(&sa, h);
            fa.is_some() && fa == filter_header_at(&sb, h)
        })
        .count();
    println!(
        "A vs B: filter headers at every 1,000th height: {same} of {} equal",
        heights.len()
    );
    compare_http(a, b);
}

/// The same HTTP requests to A and B, answers compared byte for byte.
fn compare_http(a: &Node, b: &Node) {
    let serve = |n: &Node| {
        let state = AppState {
            snapshots: n.chain.lock().snapshots(),
            p2p: None,
            mempool: None,
        };
        tcommon::spawn_http(state, HttpConfig::default())
    };
    let (ha, hb) = (serve(a), serve(b));
    let get_a = |path: &str| http_get::get(ha.addr, path);
    // A block half-way up, its second transaction, and the address paid by
    // that transaction's first output.
    let mid = a.tip().0 / 2;
    let block = String::from_utf8_lossy(&get_a(&format!("/block-height/{mid}")).1).to_string();
    let txids: Vec<String> =
        serde_json::from_slice(&get_a(&format!("/block/{block}/txids")).1).expect("txids");
    let txid = txids.get(1).unwrap_or(&txids[0]).clone();
    let tx: serde_json::Value =
        serde_json::from_slice(&get_a(&format!("/tx/{txid}")).1).expect("tx");
    let address = tx["vout"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|o| o["scriptpubkey_address"].as_str())
        .unwrap_or_default()
        .to_string();
    let paths = [
        "/blocks/tip/hash".to_string(),
        format!("/block/{block}"),
        format!("/block/{block}/txids"),
        format!("/tx/{txid}"),
        format!("/tx/{txid}/outspends"),
        format!("/tx/{txid}/outspend/0"),
        format!("/address/{address}"),
        format!("/address/{address}/txs"),
        "/utxo/stats".to_string(),
    ];
    let (mut same, mut asked) = (0, Vec::new());
    for path in &paths {
        let (ra, rb) = (get_a(path), http_get::get(hb.addr, path));
        asked.push(format!("{path} {}", ra.0));
        if (ra.0, &ra.1) == (rb.0, &rb.1) {
            same += 1;
        } else {
            println!(
                "  HTTP {path}: A {} ({} bytes), B {} ({} bytes): DIFFER",
                ra.0,
                ra.1.len(),
                rb.0,
                rb.1.len()
            );
        }
    }
    println!(
        "A vs B: HTTP answers: {same} of {} equal byte for byte (path and A's status: {})",
        paths.len(),
        asked.join(", ")
    );
}
