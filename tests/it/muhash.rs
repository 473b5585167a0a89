//! The UTXO set's MuHash3072 against Bitcoin Core's own implementation.
//!
//! - `tests/python/muhash_utxos.py` computes it with
//!   `verystable.core.crypto.muhash` (Core's Python MuHash) over
//!   `testnet-data/regtest-a/utxos.txt` (bcoin's UTXO set at the tip);
//! - kakehi's [`kakehi::muhash`] over the same file must agree;
//! - a node that imported regtest-a (1,529 blocks, 7 reorgs: the MuHash is
//!   kept per block, disconnects included) reports the same in its UTXO
//!   stats (what `/utxo/stats` serves), keeps it across a restart, and
//!   rebuilds it from the UTXO table when the stored state is missing (a
//!   datadir from before MuHash was kept).

use crate::common;

use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use bitcoin::{Block, Network, OutPoint, Txid};
use common::{data, muhash_of_table, TestNode};
use kakehi::muhash::{coin_bytes, MuHash3072};
use kakehi::node::open_chainstate;
use kakehi::primitives::Coin;
use kakehi::store::{Store, WriteBatch};

/// MuHash of `utxos.txt` by Core's Python implementation (display hex).
fn muhash_by_core_python() -> String {
    let python = common::python::venv_python();
    let out = Command::new(python)
        .arg(common::python::script("muhash_utxos.py"))
        .arg(data("regtest-a/utxos.txt"))
        .output()
        .expect("run muhash_utxos.py");
    assert!(
        out.status.success(),
        "muhash_utxos.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut lines = text.lines();
    let hex = lines.next().expect("muhash line").to_string();
    assert_eq!(lines.next(), Some("19778"), "coins read by the script");
    hex
}

/// MuHash of `utxos.txt` by kakehi's module.
fn muhash_by_kakehi() -> String {
    let text = std::fs::read_to_string(data("regtest-a/utxos.txt")).expect("utxos.txt");
    let mut acc = MuHash3072::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let (txid, vout) = f[0].split_once(':').expect("txid:vout");
        let op = OutPoint {
            txid: txid.parse::<Txid>().expect("txid"),
            vout: vout.parse().expect("vout"),
        };
        let script = (0..f[2].len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&f[2][i..i + 2], 16).expect("hex"))
            .collect();
        let coin = Coin {
            value: bitcoin::Amount::from_sat(f[1].parse().expect("value")),
            script_pubkey: script,
            height: f[3].parse().expect("height"),
            coinbase: f[4] == "1",
        };
        acc.insert(&coin_bytes(&op, &coin));
    }
    acc.core_hex()
}

#[test]
fn utxo_set_muhash_matches_core_and_survives_reorgs_and_restarts() {
    let core = muhash_by_core_python();
    assert_eq!(muhash_by_kakehi(), core, "kakehi's MuHash of utxos.txt");

    let node = TestNode::new(Network::Regtest);
    let summary = node.import(&[data("regtest-a/blocks.dat")]);
    assert!(summary.rejected.is_empty(), "{:?}", summary.rejected);
    let (stats, pipeline) = {
        let cs = node.chain.lock();
        (cs.snapshot().utxo_stats(), cs.stats().clone())
    };
    assert_eq!(stats.height, 1500);
    assert_eq!(stats.muhash, core, "MuHash after importing regtest-a");
    let blocks = pipeline.blocks_connected.max(1);
    eprintln!(
        "MuHash: {} blocks connected, {} reorgs, {:.1} ms in MuHash deltas ({:.0} µs per block), {:.1} s in submit_block",
        pipeline.blocks_connected,
        pipeline.reorgs,
        pipeline.muhash_micros as f64 / 1e3,
        pipeline.muhash_micros as f64 / blocks as f64,
        pipeline.submit_micros as f64 / 1e6,
    );
    let started = Instant::now();
    let again = node.chain.lock().snapshot().utxo_stats();
    eprintln!(
        "utxo_stats (one modular inversion): {:?}",
        started.elapsed()
    );
    assert_eq!(again.muhash, core);

    // Restart: the stored state is loaded, not rebuilt.
    let TestNode {
        dir,
        datadir,
        chain,
    } = node;
    drop(chain);
    let params = kakehi::chain::ChainParams::new(Network::Regtest);
    let cs = open_chainstate(params.clone(), &datadir).expect("reopen");
    assert_eq!(cs.snapshot().utxo_stats().muhash, core, "after restart");
    drop(cs);

    // A datadir without the stored state: built once from the UTXO table.
    {
        let store = Store::open(
            &dir.path().join("index"),
            &kakehi::store::Budgets::default(),
        )
        .expect("open index");
        let mut batch = WriteBatch::default();
        batch.put_meta("muhash", &[]);
        store.commit(batch).expect("commit");
    }
    let cs = open_chainstate(params, &datadir).expect("reopen");
    assert_eq!(cs.snapshot().utxo_stats().muhash, core, "after a rebuild");
    assert_ne!(core, MuHash3072::new().core_hex());
}

/// Block by block through regtest-a: right after each of the 7 reorgs (and
/// every 250 blocks), the kept MuHash equals a walk of the UTXO table under
/// the new active chain.
#[test]
fn kept_muhash_equals_a_table_walk_after_every_reorg() {
    let node = TestNode::new(Network::Regtest);
    let params = node.chain.lock().params().clone();
    let records =
        kakehi::import::read_file(&data("regtest-a/blocks.dat"), &params).expect("blocks.dat");
    let mut cs = node.chain.lock();
    let mut reorgs = 0;
    let mut checked = 0;
    // Each block submitted with the next (validated ahead, as
    // `kakehi import` does).
    let blocks: Vec<Arc<Block>> = records.into_iter().map(|r| Arc::new(r.block)).collect();
    for (i, b) in blocks.iter().enumerate() {
        let next = blocks.get(i + 1).cloned();
        cs.submit_block_with_next(Arc::clone(b), next)
            .expect("submit");
        let now = cs.stats().reorgs;
        if now != reorgs || i % 250 == 0 {
            reorgs = now;
            let kept = cs.snapshot().utxo_stats();
            assert_eq!(
                kept.muhash,
                muhash_of_table(&mut cs),
                "block {i} (height {}, {reorgs} reorgs so far)",
                kept.height
            );
            checked += 1;
        }
    }
    assert_eq!(reorgs, 7);
    // All but the first block and those that start a side branch.
    let ahead = cs.stats().blocks_validated_ahead;
    assert!(ahead >= 1_450, "{ahead} blocks validated ahead");
    eprintln!("kept MuHash = table walk at {checked} points, after each of the 7 reorgs");
}
