//! Planning a block: which outputs its transactions spend, what they pay
//! and to whom, with what fee, and when each new output is due to be spent.
//!
//! Planning is the sequential part of the generator: it owns the seeded
//! random stream and the ledger, so its order fixes the chain. Signing
//! happens afterwards, in parallel, on the drafts it returns.

use bitcoin::{Amount, ScriptBuf, TxOut};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::coins::{Coin, Ledger};
use crate::dist::{self, Mix, Shape};
use crate::keys::{KeyPool, Kind, POOL_SIZE};
use crate::sign::Draft;

/// Smallest payment output, sats (above every standard dust limit).
const MIN_VALUE: u64 = 1_000;
/// Weight a block's transactions may fill at most, leaving room for the
/// header, the transaction count and the coinbase (consensus limit
/// 4,000,000, `MAX_BLOCK_WEIGHT`).
const MAX_TXS_WEIGHT: u64 = 3_990_000;
/// A full block stops once its transactions weigh this much.
const FULL_WEIGHT: u64 = 3_960_000;
/// Signature-operation cost a block's transactions may use (consensus limit
/// 80,000, `MAX_BLOCK_SIGOPS_COST`, less the coinbase's).
const MAX_TXS_SIGOPS: u64 = 79_000;
/// Blocks ahead the live-UTXO controller aims at.
const HORIZON: u32 = 100;

/// A new output's future: how it is locked and when it is due to be spent.
#[derive(Clone, Copy, Debug)]
pub struct OutMeta {
    /// Its kind.
    pub kind: Kind,
    /// Its key.
    pub key: u32,
    /// Its lock (see [`Coin::lock`]).
    pub lock: u32,
    /// Height it is due to be spent at; `None`: never.
    pub due: Option<u32>,
}

/// A planned transaction.
pub struct Planned {
    /// What to sign.
    pub draft: Draft,
    /// Per output: what the ledger files once the txid is known (`None` for
    /// OP_RETURN outputs, which are unspendable).
    pub meta: Vec<Option<OutMeta>>,
}

impl Planned {
    /// Its fee, sats.
    pub fn fee(&self) -> u64 {
        self.draft.value_in() - self.draft.value_out()
    }
}

/// What the live-UTXO controller and the shapes need to know of the chain.
#[derive(Clone, Copy, Debug)]
pub struct Targets {
    /// Height of the last block.
    pub last: u32,
    /// First height with transactions (the first coinbase is mature).
    pub first: u32,
    /// Mean transactions per ordinary block.
    pub txs_per_block: u32,
    /// Unspent outputs wanted at the last block.
    pub live_utxos: u64,
    /// Probability that a new output is never spent.
    pub never: f64,
}

/// The planner: the seeded stream, the ledger and the targets.
pub struct Planner {
    /// The one random stream of the run.
    pub rng: ChaCha8Rng,
    /// The best chain's unspent outputs.
    pub ledger: Ledger,
    /// What to aim at.
    pub targets: Targets,
}

impl Planner {
    /// Plans the transactions of the block at `height`: about
    /// `txs_per_block` of them, or, when `full`, as many as fit in a block
    /// near the weight limit. Fewer when nothing is left to spend.
    pub fn plan_block(&mut self, height: u32, full: bool, keys: &KeyPool) -> Vec<Planned> {
        let tpb = f64::from(self.targets.txs_per_block);
        let count = if full {
            usize::MAX
        } else {
            (tpb * self.rng.gen_range(0.5..1.5)).round() as usize
        };
        let mix = Mix::for_growth(self.growth_per_tx(height, tpb));
        let (mut weight, mut sigops) = (0, 0);
        let mut txs = Vec::new();
        while txs.len() < count && (!full || weight < FULL_WEIGHT) {
            let shape = if self.ledger.live() < 2 * u64::from(self.targets.txs_per_block) {
                Shape::FanOut
            } else {
                mix.shape(&mut self.rng)
            };
            let Some(p) = self.plan_tx(height, shape, keys) else {
                break;
            };
            let (w, s) = (p.draft.max_weight(), p.draft.sigop_cost());
            if weight + w > MAX_TXS_WEIGHT || sigops + s > MAX_TXS_SIGOPS {
                self.ledger
                    .give_back(p.draft.inputs.into_iter().map(|(c, _)| c));
                break;
            }
            weight += w;
            sigops += s;
            txs.push(p);
        }
        txs
    }

    /// Outputs minus inputs each transaction should add so the UTXO count
    /// follows a straight line to the target at the last block.
    fn growth_per_tx(&self, height: u32, txs_per_block: f64) -> f64 {
        let t = &self.targets;
        let aim = (height + HORIZON).min(t.last);
        let span = f64::from(t.last.saturating_sub(t.first).max(1));
        let want = t.live_utxos as f64 * f64::from(aim.saturating_sub(t.first)) / span;
        let per_block = (want - self.ledger.live() as f64) / f64::from(aim - height + 1);
        per_block / txs_per_block.max(1.0)
    }

    /// Plans one transaction of `shape`; `None` when nothing is spendable.
    fn plan_tx(&mut self, height: u32, shape: Shape, keys: &KeyPool) -> Option<Planned> {
        let (n_in, n_out) = shape.counts(&mut self.rng);
        let mut inputs = Vec::with_capacity(n_in);
        while inputs.len() < n_in {
            match self.ledger.take(height, &mut self.rng) {
                Some(c) => inputs.push(c),
                None if inputs.is_empty() => return None,
                None => break,
            }
        }
        let rate = dist::fee_rate(&mut self.rng);
        let mut metas: Vec<OutMeta> = (0..n_out).map(|_| self.payment_meta(height)).collect();
        let op_return = self.rng.gen_bool(0.03).then(|| self.op_return());
        loop {
            let draft = self.draft(height, &inputs, &metas, op_return.clone(), keys);
            let fee = rate * draft.max_weight().div_ceil(4);
            let value_in = draft.value_in();
            // The payments are still at 0: this is the OP_RETURN's burn.
            let burnt = draft.value_out();
            if value_in >= fee + burnt + MIN_VALUE * metas.len() as u64 {
                return Some(self.finish(draft, metas, value_in - fee - burnt));
            }
            if value_in >= fee + burnt + MIN_VALUE && metas.len() > 1 {
                metas.pop();
                continue;
            }
            // Too little value: spend one more output (dust gets gathered).
            match self.ledger.take(height, &mut self.rng) {
                Some(c) => inputs.push(c),
                None => {
                    self.ledger.give_back(inputs);
                    return None;
                }
            }
        }
    }

    /// A draft with its payment outputs at value 0 (values come last, once
    /// the fee is known) and the nVersion, nLockTime and nSequences a wallet
    /// would set: v2 and anti-fee-sniping nLockTime = height - 1 mostly;
    /// nLockTime = the CLTV lock and nSequence = the CSV lock where scripts
    /// need them.
    fn draft(
        &mut self,
        height: u32,
        inputs: &[Coin],
        metas: &[OutMeta],
        op_return: Option<TxOut>,
        keys: &KeyPool,
    ) -> Draft {
        let cltv = inputs
            .iter()
            .filter(|c| c.kind == Kind::P2wshCltv)
            .map(|c| c.lock)
            .max();
        let csv = inputs.iter().any(|c| c.kind == Kind::P2wshCsv);
        let version = if csv || self.rng.gen_bool(0.8) { 2 } else { 1 };
        let anti_snipe = self.rng.gen_bool(0.75);
        let lock_time = cltv.unwrap_or(if anti_snipe { height - 1 } else { 0 });
        let inputs = inputs
            .iter()
            .map(|c| {
                let seq = match c.kind {
                    Kind::P2wshCsv => c.lock,
                    Kind::P2wshCltv => 0xffff_fffe,
                    _ if anti_snipe || cltv.is_some() => 0xffff_fffd,
                    _ => 0xffff_ffff,
                };
                (*c, seq)
            })
            .collect();
        let mut outputs: Vec<TxOut> = metas
            .iter()
            .map(|m| TxOut {
                value: Amount::ZERO,
                script_pubkey: keys.script_pubkey(m.kind, m.key, m.lock),
            })
            .collect();
        if let Some(o) = op_return {
            let at = self.rng.gen_range(0..=outputs.len());
            outputs.insert(at, o);
        }
        Draft {
            version,
            lock_time,
            inputs,
            outputs,
        }
    }

    /// Shares `available` sats among the payment outputs (each at least
    /// `MIN_VALUE`, random weights) and pairs each output with its future.
    fn finish(&mut self, mut draft: Draft, metas: Vec<OutMeta>, available: u64) -> Planned {
        let weights: Vec<u64> = metas
            .iter()
            .map(|_| self.rng.gen_range(1..=1_000))
            .collect();
        let total: u64 = weights.iter().sum();
        let spare = available - MIN_VALUE * metas.len() as u64;
        let mut left = available;
        let mut metas = metas.into_iter().zip(weights).peekable();
        let mut meta = Vec::with_capacity(draft.outputs.len());
        for out in &mut draft.outputs {
            if out.script_pubkey.is_op_return() {
                meta.push(None);
                continue;
            }
            let (m, w) = metas.next().expect("one meta per payment output");
            let value = if metas.peek().is_none() {
                left
            } else {
                MIN_VALUE + (u128::from(spare) * u128::from(w) / u128::from(total)) as u64
            };
            left -= value;
            out.value = Amount::from_sat(value);
            meta.push(Some(m));
        }
        Planned { draft, meta }
    }

    /// A payment output's kind, key, lock and due height.
    fn payment_meta(&mut self, height: u32) -> OutMeta {
        let kind = dist::output_kind(&mut self.rng);
        let key = self.rng.gen_range(0..POOL_SIZE);
        let lock = match kind {
            Kind::P2wshCltv => height + self.rng.gen_range(1..=50),
            Kind::P2wshCsv => self.rng.gen_range(1..=30),
            _ => 0,
        };
        let due = dist::spend_delay(&mut self.rng, self.targets.never).map(|d| {
            let due = height + d.max(1);
            match kind {
                Kind::P2wshCltv => due.max(lock + 1),
                Kind::P2wshCsv => due.max(height + lock),
                _ => due,
            }
        });
        OutMeta {
            kind,
            key,
            lock,
            due,
        }
    }

    /// An OP_RETURN output: 0–80 bytes of data, value 0 (a few burn sats).
    fn op_return(&mut self) -> TxOut {
        let len = self.rng.gen_range(0..=80usize);
        let data: Vec<u8> = (0..len).map(|_| self.rng.gen()).collect();
        let mut script = vec![0x6a];
        if len > 0 {
            if len > 75 {
                script.push(0x4c); // OP_PUSHDATA1
            }
            script.push(len as u8);
            script.extend(data);
        }
        let value = if self.rng.gen_bool(0.05) {
            self.rng.gen_range(1..=1_000)
        } else {
            0
        };
        TxOut {
            value: Amount::from_sat(value),
            script_pubkey: ScriptBuf::from_bytes(script),
        }
    }

    /// The coinbase payouts' futures: one payout, or two (5%).
    pub fn coinbase_metas(&mut self, height: u32) -> Vec<OutMeta> {
        let n = if self.rng.gen_bool(0.05) { 2 } else { 1 };
        (0..n)
            .map(|_| OutMeta {
                kind: dist::coinbase_kind(&mut self.rng),
                key: self.rng.gen_range(0..POOL_SIZE),
                lock: 0,
                due: dist::spend_delay(&mut self.rng, self.targets.never)
                    .map(|d| height + crate::coins::COINBASE_MATURITY + d),
            })
            .collect()
    }

    /// A transaction paying `metas` (all never spent, `value` sats each)
    /// from spendable outputs, kept for the invalid cases. `None` if the
    /// ledger cannot fund it.
    pub fn plan_reserve(
        &mut self,
        height: u32,
        metas: Vec<OutMeta>,
        value: u64,
        keys: &KeyPool,
    ) -> Option<Planned> {
        let fee = 1_000 * metas.len() as u64;
        let needed = value * metas.len() as u64 + fee + MIN_VALUE;
        let mut inputs = Vec::new();
        while inputs.iter().map(|c: &Coin| c.value).sum::<u64>() < needed {
            match self.ledger.take(height, &mut self.rng) {
                Some(c) => inputs.push(c),
                None => {
                    self.ledger.give_back(inputs);
                    return None;
                }
            }
        }
        let change = self.payment_meta(height);
        let mut all = metas;
        all.push(change);
        let mut draft = self.draft(height, &inputs, &all, None, keys);
        let change_value = draft.value_in() - fee - value * (all.len() as u64 - 1);
        let n = draft.outputs.len();
        for (i, out) in draft.outputs.iter_mut().enumerate() {
            out.value = Amount::from_sat(if i + 1 == n { change_value } else { value });
        }
        Some(Planned {
            draft,
            meta: all.into_iter().map(Some).collect(),
        })
    }
}
