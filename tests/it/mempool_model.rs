//! Model-based property test of the mempool: random sequences of
//! submissions (spends, chained spends, double spends with higher and
//! lower fees), blocks confirming some of them or a conflict, and reorgs
//! to a longer empty branch, against a simple reference model of which
//! transactions must be in the pool.
//!
//! After every step:
//! - no two mempool transactions spend the same outpoint;
//! - every input is an output of a mempool transaction or unspent at the
//!   chain tip, and no mempool transaction is confirmed;
//! - the totals are the sums over the entries, and no transaction has
//!   more than 25 in-mempool ancestors (itself included);
//! - the pool holds exactly the model's transactions: the model accepts a
//!   spend whose inputs are available, replaces on a strictly higher
//!   feerate and fee (the workload keeps sizes equal, so Core's rules
//!   reduce to that), drops what a block confirms or conflicts with, and
//!   after a reorg to an empty branch takes back everything the
//!   disconnected blocks held that still has its inputs.

use std::collections::{BTreeMap, BTreeSet};

use bitcoin::absolute::LockTime;
use bitcoin::transaction::Version;
use bitcoin::{Amount, Block, OutPoint, Sequence, Transaction, TxIn, TxOut, Txid};
use kakehi::mempool::{Mempool, MempoolConfig};
use proptest::prelude::*;

use crate::common::blockgen::{block_on, mature_chain, Kind, Wallet};
use crate::common::TestNode;

/// Coinbases 1..=COINS are spendable at the tip (height 100 + COINS).
const COINS: usize = 12;

#[derive(Clone, Debug)]
enum Op {
    /// Spend a chain coin (index into the coinbases) at a fee.
    SpendCoin(usize, u64),
    /// Spend output 0 of a mempool transaction (index into the model's
    /// list) at a fee.
    SpendChild(usize, u64),
    /// Confirm some of the mempool (a mask over the model's list) in a
    /// block.
    Mine(u8),
    /// A longer branch from one block below the tip, empty.
    Reorg,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..COINS, 1_000u64..20_000).prop_map(|(c, f)| Op::SpendCoin(c, f)),
        3 => (0usize..16, 1_000u64..20_000).prop_map(|(i, f)| Op::SpendChild(i, f)),
        2 => any::<u8>().prop_map(Op::Mine),
        1 => Just(Op::Reorg),
    ]
}

struct World {
    node: TestNode,
    wallet: Wallet,
    mempool: Mempool,
    /// Active chain, genesis first.
    chain: Vec<Block>,
    /// Blocks of the active chain above the original tip, by height.
    coins: Vec<(OutPoint, TxOut)>,
    /// The model: transactions that must be in the pool, by txid.
    model: BTreeMap<Txid, Transaction>,
    /// Outpoints spent by the active chain's test blocks.
    chain_spent: BTreeSet<OutPoint>,
    tag: u32,
}

impl World {
    fn new() -> Self {
        let wallet = Wallet::new();
        let chain = mature_chain(&wallet, 100 + COINS as u32);
        let node = TestNode::new(bitcoin::Network::Regtest);
        for b in &chain[1..] {
            node.chain.lock().submit_block(b).expect("block");
        }
        let coins = (1..=COINS)
            .map(|h| {
                let cb = &chain[h].txdata[0];
                (
                    OutPoint {
                        txid: cb.compute_txid(),
                        vout: 0,
                    },
                    cb.output[0].clone(),
                )
            })
            .collect();
        let mempool = Mempool::new(node.chain.lock().snapshots(), MempoolConfig::default());
        World {
            node,
            wallet,
            mempool,
            chain,
            coins,
            model: BTreeMap::new(),
            chain_spent: BTreeSet::new(),
            tag: 0,
        }
    }

    fn spend(&self, coin: &(OutPoint, TxOut), fee: u64) -> Transaction {
        let mut tx = Transaction {
            version: Version::TWO,
            lock_time: LockTime::ZERO,
            input: vec![TxIn {
                previous_output: coin.0,
                sequence: Sequence::ENABLE_RBF_NO_LOCKTIME,
                ..TxIn::default()
            }],
            output: vec![TxOut {
                value: coin.1.value - Amount::from_sat(fee),
                script_pubkey: self.wallet.script_pubkey(Kind::P2wpkh),
            }],
        };
        self.wallet.sign(&mut tx, &[(Kind::P2wpkh, coin.1.clone())]);
        tx
    }

    /// The model's verdict on `tx` and its effect.
    fn model_submit(&mut self, tx: &Transaction) {
        let op = tx.input[0].previous_output;
        let parent_ok = self.model.contains_key(&op.txid)
            || (self.coins.iter().any(|c| c.0 == op) && !self.chain_spent.contains(&op));
        if !parent_ok {
            return;
        }
        let conflict = self
            .model
            .values()
            .find(|t| t.input[0].previous_output == op)
            .map(Transaction::compute_txid);
        let fee = |t: &Transaction| -> u64 {
            let input = self
                .coins
                .iter()
                .find(|c| c.0 == t.input[0].previous_output)
                .map(|c| c.1.value)
                .or_else(|| {
                    self.model
                        .get(&t.input[0].previous_output.txid)
                        .map(|p| p.output[0].value)
                })
                .unwrap_or(Amount::ZERO);
            input.to_sat().saturating_sub(t.output[0].value.to_sat())
        };
        if let Some(c) = conflict {
            let old = self.model[&c].clone();
            // Core 30's rules for one direct conflict: a strictly higher
            // feerate, at least the evicted fees (descendants included),
            // plus the incremental relay fee (100 sat/kvB) of its own size.
            let evicted = self.descendants_and_self(c);
            let evicted_fees: u64 = evicted.iter().map(|t| fee(&self.model[t])).sum();
            let (new_v, old_v) = (tx.vsize() as u64, old.vsize() as u64);
            let relay = (new_v * 100).div_ceil(1000);
            if fee(tx) * old_v <= fee(&old) * new_v || fee(tx) < evicted_fees + relay {
                return;
            }
            for t in evicted {
                self.model.remove(&t);
            }
        }
        if self.ancestor_count(tx) > 25 {
            return;
        }
        self.model.insert(tx.compute_txid(), tx.clone());
    }

    fn descendants_and_self(&self, txid: Txid) -> Vec<Txid> {
        let mut out = vec![txid];
        let mut i = 0;
        while i < out.len() {
            let t = out[i];
            out.extend(
                self.model
                    .values()
                    .filter(|c| c.input[0].previous_output.txid == t)
                    .map(Transaction::compute_txid),
            );
            i += 1;
        }
        out
    }

    fn ancestor_count(&self, tx: &Transaction) -> usize {
        let mut n = 1;
        let mut cur = tx.input[0].previous_output.txid;
        while let Some(p) = self.model.get(&cur) {
            n += 1;
            cur = p.input[0].previous_output.txid;
        }
        n
    }

    fn connect(&mut self, txs: Vec<Transaction>) {
        self.tag += 1;
        let tip = self.chain.last().expect("tip");
        let b = block_on(&self.wallet, tip, self.chain.len() as u32, self.tag, txs);
        self.node.chain.lock().submit_block(&b).expect("block");
        self.chain.push(b);
        self.mempool.sync_with_chain();
    }

    fn check(&self) {
        let snap = self.mempool.snapshot();
        let pool = &snap.pool;
        let mut spent = BTreeSet::new();
        let (mut vsize, mut fees) = (0, 0);
        for e in pool.iter_by_entry() {
            vsize += e.vsize;
            fees += e.fee;
            for i in &e.tx.input {
                assert!(
                    spent.insert(i.previous_output),
                    "two mempool txs spend {:?}",
                    i.previous_output
                );
            }
            assert!(pool.ancestors(&e.txid).len() < 25, "ancestor limit");
        }
        assert_eq!((pool.totals().vsize, pool.totals().fees), (vsize, fees));
        assert_eq!(pool.totals().count as usize, pool.len());
        let have: BTreeSet<Txid> = pool.iter_by_entry().map(|e| e.txid).collect();
        let want: BTreeSet<Txid> = self.model.keys().copied().collect();
        assert_eq!(have, want, "the pool is the model's");
        // Every input exists: in the pool, or unspent at the tip.
        let chain = self.node.chain.lock().snapshots().load();
        let view = chain.active_view();
        let outside: Vec<OutPoint> = spent
            .iter()
            .filter(|o| !pool.contains(&o.txid))
            .copied()
            .collect();
        for (op, entry) in outside
            .iter()
            .zip(chain.lookup_outpoints(&outside).expect("read"))
        {
            let entry = entry.unwrap_or_else(|| panic!("{op:?} unknown"));
            assert!(
                matches!(entry.status_in(&view), kakehi::sozu::ViewStatus::Unspent),
                "{op:?} not unspent"
            );
        }
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::SpendCoin(c, fee) => {
                let tx = self.spend(&self.coins[*c].clone(), *fee);
                let _ = self.mempool.submit(tx.clone(), None);
                self.model_submit(&tx);
            }
            Op::SpendChild(i, fee) => {
                let Some(parent) = self
                    .model
                    .values()
                    .nth(i % self.model.len().max(1))
                    .cloned()
                else {
                    return;
                };
                let coin = (
                    OutPoint {
                        txid: parent.compute_txid(),
                        vout: 0,
                    },
                    parent.output[0].clone(),
                );
                if coin.1.value.to_sat() <= *fee + 1_000 {
                    return;
                }
                let tx = self.spend(&coin, *fee);
                let _ = self.mempool.submit(tx.clone(), None);
                self.model_submit(&tx);
            }
            Op::Mine(mask) => {
                // A prefix-closed selection: a transaction only with its
                // parent, in the pool's entry order.
                let order: Vec<Transaction> = self
                    .mempool
                    .snapshot()
                    .pool
                    .iter_by_entry()
                    .map(|e| (*e.tx).clone())
                    .collect();
                let mut picked: Vec<Transaction> = Vec::new();
                let mut ids = BTreeSet::new();
                for (k, t) in order.iter().enumerate() {
                    let parent = t.input[0].previous_output.txid;
                    let parent_ok = !self.model.contains_key(&parent) || ids.contains(&parent);
                    if mask & (1 << (k % 8)) != 0 && parent_ok {
                        ids.insert(t.compute_txid());
                        picked.push(t.clone());
                    }
                }
                for t in &picked {
                    self.chain_spent.insert(t.input[0].previous_output);
                    self.model.remove(&t.compute_txid());
                }
                self.connect(picked);
            }
            Op::Reorg => {
                if self.chain.len() <= 101 + COINS {
                    return;
                }
                // Disconnect the tip block: its transactions return when
                // their inputs still exist (they do: only the chain's own
                // coins and the block's transactions are involved).
                let old = self.chain.pop().expect("tip");
                self.tag += 1;
                let base = self.chain.last().expect("base").clone();
                let a = block_on(
                    &self.wallet,
                    &base,
                    self.chain.len() as u32,
                    1000 + self.tag,
                    vec![],
                );
                let b = block_on(
                    &self.wallet,
                    &a,
                    self.chain.len() as u32 + 1,
                    1000 + self.tag,
                    vec![],
                );
                for t in old.txdata.iter().skip(1) {
                    self.chain_spent.remove(&t.input[0].previous_output);
                }
                let mut returning: BTreeMap<Txid, Transaction> = old
                    .txdata
                    .iter()
                    .skip(1)
                    .map(|t| (t.compute_txid(), t.clone()))
                    .collect();
                returning.append(&mut self.model);
                self.model = returning;
                self.node.chain.lock().submit_block(&a).expect("a");
                self.node.chain.lock().submit_block(&b).expect("b");
                self.chain.push(a);
                self.chain.push(b);
                self.mempool.sync_with_chain();
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, max_shrink_iters: 64, ..ProptestConfig::default() })]

    #[test]
    fn the_mempool_follows_the_model_through_submissions_blocks_and_reorgs(
        ops in proptest::collection::vec(op(), 1..30)
    ) {
        let mut w = World::new();
        for op in &ops {
            w.apply(op);
            w.check();
        }
    }
}
