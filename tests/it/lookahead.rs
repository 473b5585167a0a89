//! The next block validated ahead while the current block's scripts run
//! (`pipeline/ahead.rs`, `Chainstate::submit_block_with_next`, what
//! `kakehi import` does).
//!
//! Blocks mined here on regtest's genesis, each submitted with the block
//! that follows it, check every side of the lookahead against a node that
//! submits the same blocks one by one without it:
//! - a block spending an output its parent (being connected while it is
//!   validated ahead) creates is accepted from its validation ahead;
//! - a block spending again an output its parent spent is rejected as a
//!   double spend (its lookups ahead read the parent's spends);
//! - a bad signature in a block validated ahead is rejected with Core's
//!   reason; a bad signature in the parent rejects the parent, and the
//!   child validated on it is rejected as its descendant;
//! - a block validated ahead but not submitted next is dropped: its
//!   sibling, submitted instead, is connected;
//! - the UTXO set (dump), tip and kept MuHash end equal to the other node's.

use crate::common;

use std::sync::Arc;

use bitcoin::{Block, Transaction};
use common::blockgen::{block_on, mature_chain, spend_p2wpkh as spend, Wallet};
use common::{muhash_of_table, TestNode};
use kakehi::pipeline::SubmitOutcome;

/// [`block_on`], shared.
fn block(
    wallet: &Wallet,
    prev: &Block,
    height: u32,
    tag: u32,
    txs: Vec<Transaction>,
) -> Arc<Block> {
    Arc::new(block_on(wallet, prev, height, tag, txs))
}

/// Submits `b` with `next` to the lookahead node and `b` alone to the other;
/// both outcomes must be the same. Returns the reject reason, if any.
fn submit(nodes: &[TestNode; 2], b: &Arc<Block>, next: Option<&Arc<Block>>) -> Option<String> {
    let ahead = nodes[0]
        .chain
        .lock()
        .submit_block_with_next(Arc::clone(b), next.cloned())
        .expect("storage");
    let alone = nodes[1].chain.lock().submit_block(b).expect("storage");
    match (ahead, alone) {
        (SubmitOutcome::Accepted { tip: a, .. }, SubmitOutcome::Accepted { tip: b, .. }) => {
            assert_eq!(a, b, "tips");
            None
        }
        (SubmitOutcome::Rejected { reason: a, .. }, SubmitOutcome::Rejected { reason: b, .. }) => {
            assert_eq!(a, b, "reasons");
            Some(a)
        }
        (a, b) => panic!("with the lookahead {a:?}, without {b:?}"),
    }
}

fn ahead_count(node: &TestNode) -> u64 {
    node.chain.lock().stats().blocks_validated_ahead
}

#[test]
fn blocks_validated_ahead_get_the_verdicts_of_blocks_validated_alone() {
    let wallet = Wallet::new();
    let chain: Vec<Arc<Block>> = mature_chain(&wallet, 102)
        .into_iter()
        .map(Arc::new)
        .collect();
    let (cb1, cb2, cb3) = (
        chain[1].txdata[0].clone(),
        chain[2].txdata[0].clone(),
        chain[3].txdata[0].clone(),
    );
    // 103 spends coinbase 1; 104 spends 103's output; on 104, a block
    // spending 103's output again (104 spent it).
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
    let double = block(
        &wallet,
        &c,
        105,
        1,
        vec![spend(&wallet, &a.txdata[1], 2_000, false)],
    );
    // 105 valid; on it a bad signature, then its valid sibling.
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
    // On 106: a bad signature, and a child of it.
    let bad_parent = block(
        &wallet,
        &good,
        107,
        1,
        vec![spend(&wallet, &cb3, 1_000, true)],
    );
    let orphaned = block(&wallet, &bad_parent, 108, 0, vec![]);
    // The valid 107; on it, 108 validated ahead, then a sibling submitted
    // first.
    let mid = block(
        &wallet,
        &good,
        107,
        0,
        vec![spend(&wallet, &cb3, 1_000, false)],
    );
    let last = block(&wallet, &mid, 108, 0, vec![]);
    let sibling = block(&wallet, &mid, 108, 2, vec![]);

    let nodes = [
        TestNode::new(bitcoin::Network::Regtest),
        TestNode::new(bitcoin::Network::Regtest),
    ];
    for (i, b) in chain.iter().enumerate().skip(1) {
        let next = chain.get(i + 1).unwrap_or(&a);
        assert_eq!(submit(&nodes, b, Some(next)), None, "block {i}");
    }
    assert_eq!(ahead_count(&nodes[0]), 101, "blocks 2-102 validated ahead");
    assert_eq!(submit(&nodes, &a, Some(&c)), None, "103");
    assert_eq!(
        submit(&nodes, &c, Some(&double)),
        None,
        "104 on 103's output"
    );
    assert_eq!(ahead_count(&nodes[0]), 103, "103 and 104 validated ahead");
    let reason = submit(&nodes, &double, Some(&e));
    assert_eq!(reason.as_deref(), Some("bad-txns-inputs-missingorspent"));
    assert_eq!(submit(&nodes, &e, Some(&bad)), None, "105");
    let reason = submit(&nodes, &bad, Some(&good)).expect("a bad signature validated ahead");
    assert!(
        reason.starts_with("block-script-verify-flag-failed ("),
        "{reason}"
    );
    assert_eq!(
        ahead_count(&nodes[0]),
        104,
        "the bad signature validated ahead"
    );
    assert_eq!(submit(&nodes, &good, Some(&bad_parent)), None, "106");
    let reason = submit(&nodes, &bad_parent, Some(&orphaned)).expect("a bad signature");
    assert!(
        reason.starts_with("block-script-verify-flag-failed ("),
        "{reason}"
    );
    assert_eq!(
        ahead_count(&nodes[0]),
        105,
        "the bad signature validated ahead"
    );
    let reason = submit(&nodes, &orphaned, None).expect("a child of an invalid block");
    assert_eq!(reason, "bad-prevblk");
    let before = ahead_count(&nodes[0]);
    assert_eq!(submit(&nodes, &mid, Some(&last)), None, "107");
    assert_eq!(
        submit(&nodes, &sibling, None),
        None,
        "a sibling instead of 108"
    );
    assert_eq!(submit(&nodes, &last, None), None, "108, not connected");
    assert_eq!(ahead_count(&nodes[0]), before, "nothing used out of turn");
    for node in &nodes {
        assert_eq!(node.chain.lock().index().tip().hash, sibling.block_hash());
    }
    let want = nodes[1].dump_utxos();
    assert_eq!(nodes[0].dump_utxos(), want, "UTXO sets");
    let kept = nodes[0].chain.lock().snapshot().utxo_stats().muhash;
    assert_eq!(kept, nodes[1].chain.lock().snapshot().utxo_stats().muhash);
    assert_eq!(kept, muhash_of_table(&mut nodes[0].chain.lock()));
}
