//! The address routes at scale: the scripts paid by the transactions of a
//! block half-way up the imported chain, each asked for its totals
//! (`/address/:a`) twice, its unspent outputs and its first history page,
//! over HTTP on the reopened node; the first totals request reads every
//! transaction of the script's history (one per row), the second is answered from the summary
//! cache when the script has at least 100 transactions.

use std::time::Instant;

use kakehi::http::{AppState, HttpConfig};
use kakehi::pipeline::Chainstate;

use super::{http_get, tcommon};

/// Scripts asked for (distinct output addresses of the middle block).
const SCRIPTS: usize = 20;

/// Times the routes and prints one line per route: p50 and max in ms,
/// with the scripts' transaction counts.
pub fn time_routes(chain: &Chainstate) {
    let http = tcommon::spawn_http(
        AppState {
            snapshots: chain.snapshots(),
            p2p: None,
            mempool: None,
        },
        HttpConfig::default(),
    );
    let get = |path: &str| {
        let (status, body, ms) = http_get::get(http.addr, path);
        assert_eq!(status, 200, "{path}");
        (body, ms)
    };
    let tip = chain.snapshot().index().tip_height();
    let mid = tip / 2;
    let block = String::from_utf8(get(&format!("/block-height/{mid}")).0).expect("hash");
    let txids: Vec<String> =
        serde_json::from_slice(&get(&format!("/block/{block}/txids")).0).expect("txids");
    let mut addresses: Vec<String> = Vec::new();
    for txid in txids.iter().take(SCRIPTS) {
        let tx: serde_json::Value =
            serde_json::from_slice(&get(&format!("/tx/{txid}")).0).expect("tx");
        addresses.extend(
            tx["vout"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|o| o["scriptpubkey_address"].as_str().map(str::to_string)),
        );
    }
    addresses.sort();
    addresses.dedup();
    addresses.truncate(SCRIPTS);
    let routes = ["", "", "/utxo", "/txs"];
    let mut times = vec![Vec::new(); routes.len()];
    let mut tx_counts = Vec::new();
    let t = Instant::now();
    for a in &addresses {
        for (i, route) in routes.iter().enumerate() {
            let (body, ms) = get(&format!("/address/{a}{route}"));
            times[i].push(ms);
            if i == 0 {
                let v: serde_json::Value = serde_json::from_slice(&body).expect("stats");
                tx_counts.push(v["chain_stats"]["tx_count"].as_u64().unwrap_or(0));
            }
        }
    }
    tx_counts.sort_unstable();
    println!(
        "address routes at height {tip}: {} scripts paid in block {mid} ({} to {} transactions each, median {}), {:.1} s",
        addresses.len(),
        tx_counts.first().unwrap_or(&0),
        tx_counts.last().unwrap_or(&0),
        tx_counts.get(tx_counts.len() / 2).unwrap_or(&0),
        t.elapsed().as_secs_f64()
    );
    let names = [
        "/address/:a (first)",
        "/address/:a (again)",
        "/address/:a/utxo",
        "/address/:a/txs",
    ];
    for (name, mut v) in names.into_iter().zip(times) {
        v.sort_by(f64::total_cmp);
        if let (Some(max), Some(p50)) = (v.last(), v.get(v.len() / 2)) {
            println!("  {name}: p50 {p50:.2} ms, max {max:.2} ms");
        }
    }
}
