//! The overlap of a block's UTXO-table write with the next block's script
//! checks, while blocks are grouped (catching up).
//!
//! In a group, the table write of the last connected block is kept in
//! memory and applied while the next block's scripts are verified; that
//! next block's own lookups read the kept write (`pipeline/connect.rs`,
//! `unwritten_coins`). Blocks mined here on regtest's genesis (old header
//! times: every block is catching up) check each side of it against a node
//! that connects the same blocks one durable boundary at a time:
//! - a block spending an output created by the block whose write is kept
//!   is accepted;
//! - a block spending again an output that block spent is rejected as a
//!   double spend (`bad-txns-inputs-missingorspent`);
//! - a block with a bad signature on top of it is rejected with Core's
//!   reason, and its parent stays connected;
//! - the UTXO set (dump), the tip and the stored MuHash, after a restart,
//!   are the per-block node's.

use crate::common;

use std::time::Duration;

use bitcoin::Block;
use common::blockgen::{block_on as block, mature_chain, spend_p2wpkh as spend, Wallet};
use common::{muhash_of_table, TestNode};
use kakehi::node::open_chainstate;
use kakehi::pipeline::{GroupLimits, SubmitOutcome};

/// Groups that only the test's own boundaries end (no time limit).
const WIDE: GroupLimits = GroupLimits {
    max_blocks: 10_000,
    max_bytes: 1 << 30,
    max_age: Duration::from_secs(3_600),
};

fn accepted(node: &TestNode, b: &Block, what: &str) {
    match node.chain.lock().submit_block(b).expect("storage") {
        SubmitOutcome::Accepted { .. } => {}
        other => panic!("{what}: {other:?}"),
    }
}

fn rejected(node: &TestNode, b: &Block, what: &str) -> String {
    match node.chain.lock().submit_block(b).expect("storage") {
        SubmitOutcome::Rejected { reason, .. } => reason,
        other => panic!("{what}: {other:?}"),
    }
}

/// Asserts two dumps are equal, showing only the lines that differ.
fn same_dump(got: &str, want: &str, what: &str) {
    let (g, w): (
        std::collections::BTreeSet<&str>,
        std::collections::BTreeSet<&str>,
    ) = (got.lines().collect(), want.lines().collect());
    let extra: Vec<_> = g.difference(&w).collect();
    let missing: Vec<_> = w.difference(&g).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "{what}: extra {extra:?}, missing {missing:?}"
    );
}

#[test]
fn the_next_block_reads_the_kept_table_write_and_a_failure_leaves_it_connected() {
    let wallet = Wallet::new();
    // 102 blocks paying the wallet: the coinbases of 1 and 2 are mature at
    // 103.
    let chain = mature_chain(&wallet, 102);
    let (cb1, cb2) = (chain[1].txdata[0].clone(), chain[2].txdata[0].clone());
    // 103 spends coinbase 1; 104 spends 103's output (created by the block
    // whose write is kept).
    let a = block(
        &wallet,
        &chain[102],
        103,
        0,
        vec![spend(&wallet, &cb1, 1_000, false)],
    );
    let c = block(
        &wallet,
        &a,
        104,
        0,
        vec![spend(&wallet, &a.txdata[1], 1_000, false)],
    );
    // On 104: spending 103's output again (104 spent it), and coinbase 1
    // again (103 spent it).
    // (Other fees: other transactions, not the same one again.)
    let double_c = block(
        &wallet,
        &c,
        105,
        1,
        vec![spend(&wallet, &a.txdata[1], 2_000, false)],
    );
    let double_a = block(
        &wallet,
        &c,
        105,
        2,
        vec![spend(&wallet, &cb1, 2_000, false)],
    );
    // 105 spends 104's output; on it, a bad signature, then the valid 106.
    let e = block(
        &wallet,
        &c,
        105,
        0,
        vec![spend(&wallet, &c.txdata[1], 1_000, false)],
    );
    let bad = block(&wallet, &e, 106, 1, vec![spend(&wallet, &cb2, 1_000, true)]);
    let good = block(
        &wallet,
        &e,
        106,
        0,
        vec![spend(&wallet, &cb2, 1_000, false)],
    );

    let grouped = TestNode::new(bitcoin::Network::Regtest);
    let single = TestNode::new(bitcoin::Network::Regtest);
    grouped.chain.lock().set_group_limits(WIDE);
    for b in &chain[1..] {
        accepted(&grouped, b, "the first 102 blocks");
        accepted(&single, b, "the first 102 blocks");
    }
    for node in [&grouped, &single] {
        accepted(node, &a, "103, spending coinbase 1");
        accepted(node, &c, "104, spending 103's output");
        for (b, what) in [
            (&double_c, "103's output again"),
            (&double_a, "coinbase 1 again"),
        ] {
            let reason = rejected(node, b, what);
            assert_eq!(reason, "bad-txns-inputs-missingorspent", "{what}");
        }
        // A rejection ends the group: 104's write is applied and durable.
        accepted(node, &e, "105, spending 104's output");
        let reason = rejected(node, &bad, "a bad signature on 105");
        assert!(
            reason.starts_with("block-script-verify-flag-failed ("),
            "bad signature: {reason}"
        );
        assert_eq!(node.chain.lock().index().tip().hash, e.block_hash());
        accepted(node, &good, "106");
        node.chain.lock().flush().expect("flush");
    }
    assert_eq!(grouped.chain.lock().stats().blocks_rejected, 3);
    let (want, got) = (single.dump_utxos(), grouped.dump_utxos());
    same_dump(&got, &want, "UTXO set, grouped against per block");
    assert!(got.contains(&format!("{}:0 ", good.txdata[1].compute_txid())));

    // After a restart: the same tip, UTXO set and MuHash.
    let muhash = muhash_of_table(&mut single.chain.lock());
    let TestNode {
        dir,
        datadir,
        chain,
    } = grouped;
    drop(chain);
    let params = kakehi::chain::ChainParams::new(bitcoin::Network::Regtest);
    let reopened = TestNode {
        dir,
        chain: parking_lot::Mutex::new(open_chainstate(params, &datadir).expect("reopen")),
        datadir,
    };
    assert_eq!(reopened.chain.lock().index().tip().hash, good.block_hash());
    same_dump(&reopened.dump_utxos(), &want, "UTXO set after a restart");
    assert_eq!(muhash_of_table(&mut reopened.chain.lock()), muhash);
}
