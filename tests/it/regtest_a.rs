//! Acceptance tests of the backbone against `testnet-data/regtest-a`, a real
//! regtest chain made and validated by an independent full node (bcoin
//! 2.2.0): tip, reorgs, BIP-158 filters of active and stale blocks, the UTXO
//! set byte for byte, and its summary.

use crate::common;

use std::collections::HashMap;
use std::sync::OnceLock;

use bitcoin::{BlockHash, Network};
use common::{data, json, TestNode};

/// One import shared by the tests of this file (it takes a few seconds).
fn node() -> &'static TestNode {
    static NODE: OnceLock<TestNode> = OnceLock::new();
    NODE.get_or_init(|| {
        let node = TestNode::new(Network::Regtest);
        let summary = node.import(&[data("regtest-a/blocks.dat")]);
        assert_eq!(summary.blocks_read, 1529);
        assert!(
            summary.rejected.is_empty(),
            "valid chain had rejections: {:?}",
            summary.rejected
        );
        node
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn import_ends_at_the_reference_tip_after_the_reference_reorgs() {
    let chain = json("regtest-a/chain.json");
    let cs = node().chain.lock().snapshot();
    let tip = cs.index().tip();
    assert_eq!(tip.hash.to_string(), chain["tip_hash"].as_str().unwrap());
    assert_eq!(u64::from(tip.height), chain["tip_height"].as_u64().unwrap());
    let reorgs = chain["reorgs"].as_array().unwrap();
    assert_eq!(cs.stats().reorgs, reorgs.len() as u64);
    // Every block the reference put on the best chain is on ours, and only those.
    for b in chain["blocks"].as_array().unwrap() {
        let hash: BlockHash = b["hash"].as_str().unwrap().parse().unwrap();
        let id = cs.index().id_of(&hash).expect("block known");
        assert_eq!(
            cs.index().is_active(id),
            b["on_best_chain"].as_bool().unwrap(),
            "block {hash}"
        );
    }
}

#[test]
fn filters_and_filter_headers_match_the_reference_for_active_and_stale_blocks() {
    let cs = node().chain.lock().snapshot();
    let filters = json("regtest-a/filters.json");
    let filters = filters.as_array().unwrap();
    assert_eq!(filters.len(), 1501);
    for f in filters {
        let hash: BlockHash = f["hash"].as_str().unwrap().parse().unwrap();
        let id = cs.index().id_of(&hash).unwrap();
        let (filter, header) = cs.filter(id).unwrap().expect("filter stored");
        assert_eq!(
            hex(&filter),
            f["basic_filter"].as_str().unwrap(),
            "filter at height {}",
            f["height"]
        );
        assert_eq!(
            header.to_string(),
            f["filter_header"].as_str().unwrap(),
            "header at height {}",
            f["height"]
        );
    }
    let stale = json("regtest-a/stale_filters.json");
    let stale = stale.as_array().unwrap();
    assert_eq!(stale.len(), 29);
    for f in stale {
        let hash: BlockHash = f["hash"].as_str().unwrap().parse().unwrap();
        let id = cs.index().id_of(&hash).unwrap();
        assert!(!cs.index().is_active(id));
        let (filter, header) = cs.filter(id).unwrap().expect("stale filter kept");
        assert_eq!(
            hex(&filter),
            f["basic_filter"].as_str().unwrap(),
            "stale filter {hash}"
        );
        assert_eq!(
            header.to_string(),
            f["filter_header"].as_str().unwrap(),
            "stale header {hash}"
        );
    }
}

#[test]
fn utxo_dump_equals_the_reference_byte_for_byte() {
    let mut out = Vec::new();
    node().chain.lock().dump_utxos(&mut out).unwrap();
    assert_dump_is_the_reference(&out);
}

/// The same dump through the sort's run files: runs of 64 KiB of lines
/// (~430 outputs each, ~46 runs for regtest-a's 19,778) merged back.
#[test]
fn utxo_dump_through_run_files_equals_the_reference() {
    let mut out = Vec::new();
    node()
        .chain
        .lock()
        .dump_utxos_in_runs(&mut out, 64 << 10)
        .unwrap();
    assert_dump_is_the_reference(&out);
}

fn assert_dump_is_the_reference(out: &[u8]) {
    let expected = std::fs::read(data("regtest-a/utxos.txt")).unwrap();
    if out != expected {
        let ours = String::from_utf8_lossy(out);
        let theirs = String::from_utf8_lossy(&expected);
        let a: std::collections::BTreeSet<&str> = ours.lines().collect();
        let b: std::collections::BTreeSet<&str> = theirs.lines().collect();
        let extra: Vec<_> = a.difference(&b).take(5).collect();
        let missing: Vec<_> = b.difference(&a).take(5).collect();
        panic!(
            "UTXO dump differs: {} lines vs {}; extra {extra:?}; missing {missing:?}",
            a.len(),
            b.len()
        );
    }
}

#[test]
fn utxo_stats_match_the_reference() {
    let reference = json("regtest-a/utxo.json");
    let stats = node().chain.lock().snapshot().utxo_stats();
    assert_eq!(stats.txouts, reference["txouts"].as_u64().unwrap());
    assert_eq!(
        stats.total_amount_sats,
        reference["total_amount_sats"].as_u64().unwrap()
    );
    assert_eq!(
        stats.bestblock.to_string(),
        reference["bestblock"].as_str().unwrap()
    );
    assert_eq!(
        u64::from(stats.height),
        reference["height"].as_u64().unwrap()
    );
}

#[test]
fn spent_outputs_are_recorded_with_their_spenders() {
    // spent.txt: `txid:vout spent_by_txid:vin spent_at_height` for every
    // output created and spent on the best chain.
    let cs = node().chain.lock().snapshot();
    let mut by_height: HashMap<u32, Vec<(String, String)>> = HashMap::new();
    let text = std::fs::read_to_string(data("regtest-a/spent.txt")).unwrap();
    for line in text.lines() {
        let mut it = line.split(' ');
        let (outpoint, spender, height) =
            (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
        by_height
            .entry(height.parse().unwrap())
            .or_default()
            .push((outpoint.to_string(), spender.to_string()));
    }
    let mut total = 0;
    for height in 1..=cs.index().tip_height() {
        let id = cs.index().active_at(height).unwrap().id;
        let spent = cs.spent_outputs(id).unwrap().expect("spent outputs stored");
        let mut ours: Vec<(String, String)> = spent
            .iter()
            .map(|s| (s.outpoint.to_string(), format!("{}:{}", s.txid, s.vin)))
            .collect();
        let mut theirs = by_height.remove(&height).unwrap_or_default();
        ours.sort();
        theirs.sort();
        assert_eq!(ours, theirs, "spends at height {height}");
        total += ours.len();
    }
    assert_eq!(total, 77169);
}
