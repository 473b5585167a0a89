//! The mempool against a chain the test builds and signs itself
//! (`common::blockgen`: 120 regtest blocks paying the test wallet), each
//! verdict asserted with Bitcoin Core 30.0's reject reason
//! (`validation.cpp` `MemPoolAccept`, `policy/rbf.cpp`, `policy/policy.cpp`;
//! the cases follow Core's functional tests `mempool_accept.py`,
//! `mempool_spend_coinbase.py`, `feature_rbf.py`, `mempool_reorg.py`,
//! `mempool_persist.py` and `mempool_package_onemore.py`).

use crate::common;

use bitcoin::absolute::LockTime;
use bitcoin::hashes::Hash;
use bitcoin::{Amount, Block, OutPoint, Sequence, Transaction, TxOut, Txid};
use common::blockgen::{block_on, mature_chain, signed_p2wpkh_spend, Kind, Wallet};
use common::TestNode;
use kakehi::mempool::{AcceptError, Mempool, MempoolConfig, TxRejectClass};

/// The chain's height: coinbases of blocks 1..=20 are mature for the next
/// block (121), those of 22..=120 are not.
const TIP: u32 = 120;

struct Fixture {
    node: TestNode,
    wallet: Wallet,
    chain: Vec<Block>,
    mempool: Mempool,
}

impl Fixture {
    fn new() -> Self {
        Self::with_config(MempoolConfig::default())
    }

    fn with_config(config: MempoolConfig) -> Self {
        let wallet = Wallet::new();
        let chain = mature_chain(&wallet, TIP);
        let node = TestNode::new(bitcoin::Network::Regtest);
        for b in &chain[1..] {
            node.chain.lock().submit_block(b).expect("submit");
        }
        let snapshots = node.chain.lock().snapshots();
        assert_eq!(snapshots.load().index().tip().height, TIP);
        let mempool = Mempool::new(snapshots, config);
        Fixture {
            node,
            wallet,
            chain,
            mempool,
        }
    }

    /// Output 0 of the coinbase of block `h`, as an input coin.
    fn coinbase_coin(&self, h: usize) -> (OutPoint, TxOut) {
        let cb = &self.chain[h].txdata[0];
        (
            OutPoint {
                txid: cb.compute_txid(),
                vout: 0,
            },
            cb.output[0].clone(),
        )
    }

    /// A signed version-2 transaction spending `coins` (the wallet's
    /// P2WPKH) into `n_out` equal P2WPKH outputs, paying `fee` sats.
    fn spend(&self, coins: &[(OutPoint, TxOut)], n_out: u64, fee: u64) -> Transaction {
        let total: u64 = coins.iter().map(|(_, o)| o.value.to_sat()).sum();
        let each = (total - fee) / n_out;
        let mut outputs: Vec<TxOut> = (0..n_out)
            .map(|_| TxOut {
                value: Amount::from_sat(each),
                script_pubkey: self.wallet.script_pubkey(Kind::P2wpkh),
            })
            .collect();
        outputs[0].value += Amount::from_sat(total - fee - each * n_out);
        self.build(coins, outputs, |_| {})
    }

    /// A transaction spending `coins` to `outputs`, changed by `edit`
    /// before it is signed.
    fn build(
        &self,
        coins: &[(OutPoint, TxOut)],
        outputs: Vec<TxOut>,
        edit: impl FnOnce(&mut Transaction),
    ) -> Transaction {
        signed_p2wpkh_spend(
            &self.wallet,
            coins,
            outputs,
            Sequence::ENABLE_RBF_NO_LOCKTIME,
            edit,
        )
    }

    fn submit(&self, tx: &Transaction) -> Result<kakehi::mempool::Submitted, AcceptError> {
        self.mempool.submit(tx.clone(), None)
    }

    /// Submits `tx` and returns Core's reject text (reason, then debug).
    fn reject(&self, tx: &Transaction) -> (TxRejectClass, String) {
        match self.submit(tx) {
            Err(AcceptError::Rejected(r)) => (r.class, r.to_string()),
            Err(e) => panic!("storage error: {e}"),
            Ok(_) => panic!("accepted {}", tx.compute_txid()),
        }
    }

    fn txids(&self) -> Vec<Txid> {
        let mut v: Vec<Txid> = self
            .mempool
            .snapshot()
            .pool
            .iter_by_entry()
            .map(|e| e.txid)
            .collect();
        v.sort();
        v
    }

    /// Connects `block` on the current tip and lets the mempool follow.
    fn connect(&self, block: &Block) {
        self.node
            .chain
            .lock()
            .submit_block(block)
            .expect("submit block");
        self.mempool.sync_with_chain();
    }
}

fn out(tx: &Transaction, vout: u32) -> (OutPoint, TxOut) {
    (
        OutPoint {
            txid: tx.compute_txid(),
            vout,
        },
        tx.output[vout as usize].clone(),
    )
}

#[test]
fn accepts_a_valid_spend_and_refuses_it_twice() {
    let f = Fixture::new();
    let tx = f.spend(&[f.coinbase_coin(1)], 1, 1_000);
    let s = f.submit(&tx).expect("valid spend accepted");
    assert_eq!(s.entry.fee, 1_000);
    assert_eq!(s.entry.vsize, tx.vsize() as u64);
    assert!(s.replaced.is_empty());
    // mempool_accept.py: the same transaction again.
    assert_eq!(
        f.reject(&tx),
        (TxRejectClass::Duplicate, "txn-already-in-mempool".into())
    );
    // The same txid with another witness (mempool_wtxid.py).
    let mut malleated = tx.clone();
    let mut items: Vec<Vec<u8>> = malleated.input[0]
        .witness
        .iter()
        .map(<[u8]>::to_vec)
        .collect();
    items.push(vec![]);
    malleated.input[0].witness = bitcoin::Witness::from_slice(&items);
    assert_eq!(
        f.reject(&malleated).1,
        "txn-same-nonwitness-data-in-mempool"
    );
    assert_eq!(f.txids(), vec![tx.compute_txid()]);
}

#[test]
fn refuses_by_core_reasons_without_changing_the_pool() {
    let f = Fixture::new();
    let coin = f.coinbase_coin(2);
    // An input that exists nowhere: an orphan (-25 over RPC).
    let missing = (
        OutPoint {
            txid: Txid::from_byte_array([7; 32]),
            vout: 0,
        },
        coin.1.clone(),
    );
    let orphan = f.spend(&[missing], 1, 1_000);
    match f.submit(&orphan) {
        Err(AcceptError::Rejected(r)) => {
            assert_eq!(r.class, TxRejectClass::MissingInputs);
            assert_eq!(r.reason, "bad-txns-inputs-missingorspent");
            assert_eq!(
                r.rpc_error(),
                (-25, "bad-txns-inputs-missingorspent".to_string())
            );
        }
        other => panic!("{other:?}"),
    }
    // mempool_spend_coinbase.py: block 101's coinbase is spendable at 201
    // only; here block 22's is not at 121.
    let immature = f.spend(&[f.coinbase_coin(22)], 1, 1_000);
    assert_eq!(
        f.reject(&immature),
        (
            TxRejectClass::PrematureSpend,
            "bad-txns-premature-spend-of-coinbase, tried to spend coinbase at depth 99".into()
        )
    );
    // Outputs above inputs.
    let too_much = TxOut {
        value: coin.1.value + Amount::from_sat(1),
        script_pubkey: f.wallet.script_pubkey(Kind::P2wpkh),
    };
    let greedy = f.build(std::slice::from_ref(&coin), vec![too_much], |_| {});
    assert_eq!(
        f.reject(&greedy).1,
        "bad-txns-in-belowout, value in (50.00) < value out (50.00000001)"
    );
    // No fee at all: min relay fee (100 sat/kvB in Core 30).
    let free = f.spend(std::slice::from_ref(&coin), 1, 0);
    let (class, text) = f.reject(&free);
    assert_eq!(class, TxRejectClass::Reconsiderable);
    // Core 30's CFeeRate::GetFee: 100 sats per 1,000 vbytes, rounded up.
    let required = (free.vsize() as u64 * 100).div_ceil(1000);
    assert_eq!(text, format!("min relay fee not met, 0 < {required}"));
    // A locktime in the future (mempool_accept.py "non-final").
    let locked = f.build(
        std::slice::from_ref(&coin),
        f.spend(std::slice::from_ref(&coin), 1, 1_000).output,
        |tx| {
            tx.lock_time = LockTime::from_height(TIP + 2).expect("height");
        },
    );
    assert_eq!(
        f.reject(&locked),
        (TxRejectClass::PrematureSpend, "non-final".into())
    );
    // Core's IsFinalTx wants lock_time < the next block's height (121):
    // a locktime of 120 is final.
    let final_now = f.build(
        std::slice::from_ref(&coin),
        f.spend(std::slice::from_ref(&coin), 1, 1_000).output,
        |tx| {
            tx.lock_time = LockTime::from_height(TIP).expect("height");
        },
    );
    // BIP68: a relative lock of 200 blocks on a coin 119 deep.
    let relative = f.build(
        std::slice::from_ref(&coin),
        f.spend(std::slice::from_ref(&coin), 1, 1_000).output,
        |tx| {
            tx.input[0].sequence = Sequence::from_height(200);
        },
    );
    assert_eq!(f.reject(&relative).0, TxRejectClass::PrematureSpend);
    assert!(f.reject(&relative).1.starts_with("non-BIP68-final"));
    // A bad signature: Core's script error in the reason.
    let mut bad_sig = f.spend(std::slice::from_ref(&coin), 1, 1_000);
    let mut items: Vec<Vec<u8>> = bad_sig.input[0]
        .witness
        .iter()
        .map(<[u8]>::to_vec)
        .collect();
    let last = items[0].len() - 2;
    items[0][last] ^= 1;
    bad_sig.input[0].witness = bitcoin::Witness::from_slice(&items);
    let (class, text) = f.reject(&bad_sig);
    assert_eq!(class, TxRejectClass::NotStandard);
    assert!(
        text.starts_with("mempool-script-verify-flag-failed ("),
        "{text}"
    );
    // A coinbase is never accepted.
    assert_eq!(f.reject(&f.chain[3].txdata[0]).1, "coinbase");
    assert!(f.txids().is_empty(), "no refusal changed the pool");
    f.submit(&final_now)
        .expect("locktime at the tip's height is final");
}

#[test]
fn replacement_follows_core_30_full_rbf() {
    let f = Fixture::new();
    let coin = f.coinbase_coin(3);
    let original = f.spend(std::slice::from_ref(&coin), 2, 10_000);
    f.submit(&original).expect("original");
    // A child of the original, evicted with it.
    let child = f.spend(&[out(&original, 1)], 1, 5_000);
    f.submit(&child).expect("child");
    // Same size and fee, other outputs: the same feerate is not enough
    // ("insufficient fee", PaysMoreThanConflicts).
    let mut outputs = original.output.clone();
    outputs[0].value += Amount::from_sat(1);
    outputs[1].value -= Amount::from_sat(1);
    let same = f.build(std::slice::from_ref(&coin), outputs, |_| {});
    assert_eq!(same.vsize(), original.vsize());
    let text = f.reject(&same).1;
    let rate = "0.00070921 BTC/kvB"; // 10,000 sats over 141 vbytes
    assert_eq!(
        text,
        format!(
            "insufficient fee, rejecting replacement {}; new feerate {rate} <= old feerate {rate}",
            same.compute_txid()
        )
    );
    // Higher feerate but less than the evicted fees (15,000).
    let cheap = f.spend(std::slice::from_ref(&coin), 1, 14_000);
    assert!(f
        .reject(&cheap)
        .1
        .contains("less fees than conflicting txs"));
    // Enough fees but not the relay of its own size on top (100 sat/kvB).
    let tight = f.spend(std::slice::from_ref(&coin), 1, 15_000);
    assert!(f
        .reject(&tight)
        .1
        .contains("not enough additional fees to relay"));
    // A replacement adding an unconfirmed input it did not have.
    let other = f.spend(&[f.coinbase_coin(4)], 1, 1_000);
    f.submit(&other).expect("other");
    let adds = f.spend(&[coin.clone(), out(&other, 0)], 1, 50_000);
    assert!(
        f.reject(&adds).1.starts_with(&format!(
            "replacement-adds-unconfirmed, replacement {} adds unconfirmed input, idx 1",
            adds.compute_txid()
        )),
        "{}",
        f.reject(&adds).1
    );
    // A good replacement evicts the original and its child.
    let good = f.spend(std::slice::from_ref(&coin), 1, 20_000);
    let s = f.submit(&good).expect("replacement");
    let mut replaced = s.replaced.clone();
    replaced.sort();
    let mut expected = vec![original.compute_txid(), child.compute_txid()];
    expected.sort();
    assert_eq!(replaced, expected);
    let mut now = vec![good.compute_txid(), other.compute_txid()];
    now.sort();
    assert_eq!(f.txids(), now);
}

#[test]
fn ancestor_and_descendant_limits_hold() {
    let f = Fixture::new();
    // A chain of 25 transactions is the limit (mempool_package_onemore.py).
    let mut prev = f.spend(&[f.coinbase_coin(5)], 2, 1_000);
    f.submit(&prev).expect("root");
    let side = out(&prev, 1);
    for _ in 1..25 {
        let next = f.spend(&[out(&prev, 0)], 1, 1_000);
        f.submit(&next).expect("within the chain limit");
        prev = next;
    }
    let one_more = f.spend(&[out(&prev, 0)], 1, 1_000);
    assert_eq!(
        f.reject(&one_more),
        (
            TxRejectClass::MempoolPolicy,
            "too-long-mempool-chain, too many unconfirmed ancestors [limit: 25]".into()
        )
    );
    // A second child of the root: the root would have 26 descendants.
    let sibling = f.spend(&[side], 1, 1_000);
    let text = f.reject(&sibling).1;
    assert!(
        text.starts_with("too-long-mempool-chain, too many descendants for tx"),
        "{text}"
    );
    assert_eq!(f.txids().len(), 25);
}

#[test]
fn blocks_confirm_and_conflict_and_a_reorg_returns_transactions() {
    let f = Fixture::new();
    let a = f.spend(&[f.coinbase_coin(6)], 1, 2_000);
    let b = f.spend(&[f.coinbase_coin(7)], 1, 2_000);
    let b_child = f.spend(&[out(&b, 0)], 1, 2_000);
    let c = f.spend(&[f.coinbase_coin(8)], 1, 2_000);
    for t in [&a, &b, &b_child, &c] {
        f.submit(t).expect("accepted");
    }
    // Block 121 confirms a, and a conflicting spend of coinbase 7 (not b).
    let b_conflict = f.spend(&[f.coinbase_coin(7)], 1, 3_000);
    let block121 = block_on(
        &f.wallet,
        &f.chain[120],
        121,
        0,
        vec![a.clone(), b_conflict.clone()],
    );
    f.connect(&block121);
    assert_eq!(
        f.txids(),
        vec![c.compute_txid()],
        "a confirmed, b and its child conflicted"
    );
    // A heavier branch from 120 without block 121: a and b_conflict return
    // (mempool_reorg.py), c stays.
    let alt121 = block_on(&f.wallet, &f.chain[120], 121, 1, vec![]);
    let alt122 = block_on(&f.wallet, &alt121, 122, 1, vec![]);
    f.node.chain.lock().submit_block(&alt121).expect("alt 121");
    f.node.chain.lock().submit_block(&alt122).expect("alt 122");
    f.mempool.sync_with_chain();
    assert_eq!(f.mempool.snapshot().pool.tip(), Some(alt122.block_hash()));
    let mut expected = vec![
        a.compute_txid(),
        b_conflict.compute_txid(),
        c.compute_txid(),
    ];
    expected.sort();
    assert_eq!(f.txids(), expected);
}

#[test]
fn a_reorg_drops_spends_of_a_coinbase_no_longer_mature() {
    let f = Fixture::new();
    // Block 121 pays the wallet; at tip 220 its coinbase is mature for 221.
    let mut tip = f.chain[120].clone();
    let mut blocks = Vec::new();
    for h in 121..=220 {
        tip = block_on(&f.wallet, &tip, h, 0, vec![]);
        blocks.push(tip.clone());
        f.node.chain.lock().submit_block(&tip).expect("block");
    }
    f.mempool.sync_with_chain();
    let cb121 = out(&blocks[0].txdata[0], 0);
    let spend = f.spend(&[cb121], 1, 1_000);
    f.submit(&spend).expect("mature at 221");
    // A heavier branch from 219 (two blocks): 221's view is unchanged in
    // height, so replace from 120 instead: 101 blocks without 121's
    // coinbase paying the wallet first (tag 1 makes a different coinbase).
    let mut alt = f.chain[120].clone();
    for h in 121..=222 {
        alt = block_on(&f.wallet, &alt, h, 1, vec![]);
        f.node.chain.lock().submit_block(&alt).expect("alt block");
    }
    f.mempool.sync_with_chain();
    assert!(
        f.txids().is_empty(),
        "its coinbase is gone with the old branch"
    );
    assert_eq!(
        f.mempool.snapshot().counters.removed.get("reorg").copied(),
        Some(1)
    );
}

#[test]
fn mempool_dat_survives_a_restart_and_is_rechecked() {
    let f = Fixture::new();
    let a = f.spend(&[f.coinbase_coin(9)], 2, 1_500);
    let b = f.spend(&[out(&a, 0)], 1, 1_500);
    f.submit(&a).expect("a");
    f.submit(&b).expect("b");
    assert_eq!(f.mempool.save().expect("save"), 2);
    let again = Mempool::new(f.node.chain.lock().snapshots(), MempoolConfig::default());
    assert_eq!(again.load_saved().expect("load"), (2, 0));
    let times: Vec<u64> = f
        .mempool
        .snapshot()
        .pool
        .iter_by_entry()
        .map(|e| e.time)
        .collect();
    let reloaded: Vec<(Txid, u64)> = again
        .snapshot()
        .pool
        .iter_by_entry()
        .map(|e| (e.txid, e.time))
        .collect();
    assert_eq!(
        reloaded,
        vec![(a.compute_txid(), times[0]), (b.compute_txid(), times[1])]
    );
    // After a block confirms a conflicting spend, a reload drops both.
    let conflict = f.spend(&[f.coinbase_coin(9)], 1, 5_000);
    f.connect(&block_on(&f.wallet, &f.chain[120], 121, 0, vec![conflict]));
    let third = Mempool::new(f.node.chain.lock().snapshots(), MempoolConfig::default());
    assert_eq!(third.load_saved().expect("load"), (0, 2));
}

#[test]
fn a_full_mempool_evicts_the_lowest_feerate_and_raises_its_minimum() {
    let f = Fixture::with_config(MempoolConfig {
        max_mib: 0,
        ..MempoolConfig::default()
    });
    let tx = f.spend(&[f.coinbase_coin(10)], 1, 1_000);
    assert_eq!(
        f.reject(&tx),
        (TxRejectClass::MempoolPolicy, "mempool full".into())
    );
    let snapshot = f.mempool.snapshot();
    assert!(snapshot.pool.is_empty());
    assert!(
        snapshot.min_feerate > 1_000 * 1_000 / tx.vsize() as u64,
        "the floor rose past the evicted feerate"
    );
    assert_eq!(snapshot.counters.removed.get("sizelimit").copied(), Some(1));
}

#[test]
fn projected_blocks_follow_cores_ancestor_feerate_order() {
    use kakehi::mempool::assemble::{project_blocks, BLOCK_MAX_VSIZE};
    let f = Fixture::new();
    // A low-fee parent whose child pays for both (CPFP), and a middling
    // transaction alone.
    let parent = f.spend(&[f.coinbase_coin(11)], 1, 200);
    let child = f.spend(&[out(&parent, 0)], 1, 20_000);
    let alone = f.spend(&[f.coinbase_coin(12)], 1, 5_000);
    for t in [&parent, &child, &alone] {
        f.submit(t).expect("accepted");
    }
    let pool = f.mempool.snapshot().pool.clone();
    let ids =
        |txs: &[&Transaction]| -> Vec<Txid> { txs.iter().map(|t| t.compute_txid()).collect() };
    let blocks = project_blocks(&pool, 10, BLOCK_MAX_VSIZE);
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].txids, ids(&[&parent, &child, &alone]));
    assert_eq!(blocks[0].fees, 25_200);
    // Blocks of room for two: the package first, then the rest.
    let (pv, cv, av) = (
        parent.vsize() as u64,
        child.vsize() as u64,
        alone.vsize() as u64,
    );
    let blocks = project_blocks(&pool, 10, pv + cv);
    assert_eq!(
        blocks.iter().map(|b| b.txids.clone()).collect::<Vec<_>>(),
        vec![ids(&[&parent, &child]), ids(&[&alone])]
    );
    assert_eq!(blocks[0].min_feerate, 20_200 * 1000 / (pv + cv));
    assert_eq!(blocks[1].min_feerate, 5_000 * 1000 / av);
    // At most the blocks asked for.
    assert_eq!(project_blocks(&pool, 1, pv + cv).len(), 1);
}
