//! One generation run, height by height: plan the block's transactions
//! (sequential, the seeded stream), sign them (in parallel), assemble the
//! block, file its outputs in the ledger, and hand it to the writer; hold
//! the best chain's blocks while a rival branch is due; at the end, the
//! invalid cases, the UTXO digest and the manifest.

use std::path::PathBuf;
use std::time::Instant;

use bitcoin::hashes::{sha256, Hash, HashEngine};
use bitcoin::{Block, BlockHash, OutPoint, Transaction};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::assemble;
use crate::coins::{Coin, Ledger, COINBASE_MATURITY};
use crate::invalid::{Reserve, Tip, CSV_LOCK};
use crate::keys::{KeyPool, Kind, POOL_SIZE};
use crate::manifest::{Parameters, Reorg, Stats};
use crate::output::{Item, OutputError, Writer, Written};
use crate::plan::{OutMeta, Planned, Planner, Targets};
use crate::reorg::{rival_branch, MainBlock};
use crate::sign::sign_all;

/// First height with transactions: the coinbase of height 1 is mature.
pub const FIRST_SPEND: u32 = 1 + COINBASE_MATURITY;
/// The coins kept for the invalid cases are made this many blocks below
/// the tip (deeper than any rival branch, older than the CSV lock).
const RESERVE_DEPTH: u32 = 150;
/// Rival branches are 1 to this many blocks deep.
const MAX_REORG_DEPTH: u32 = 6;
/// Value of each coin kept for the invalid cases, sats.
const RESERVE_VALUE: u64 = 100_000;
/// Seconds between blocks; each block adds 0–299 s of jitter, so times
/// strictly increase along the chain (above every median-time-past).
const SPACING: u32 = 600;

/// Errors of a generation run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GenerateError {
    /// Writing the chain, the cases or the manifest failed.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// The chain holds too little value to fund the coins kept for the
    /// invalid cases (too few blocks or transactions).
    #[error("nothing left to fund the invalid cases' coins at height {height}")]
    NoReserve {
        /// The height the coins were due at.
        height: u32,
    },
}

/// What to generate.
pub struct Config {
    /// The profile's name (for the manifest).
    pub profile: String,
    /// The seed.
    pub seed: u64,
    /// The sizes.
    pub parameters: Parameters,
    /// Signing threads.
    pub threads: usize,
    /// The output directory (exists, empty).
    pub out: PathBuf,
}

/// The state of a run between heights.
pub struct Run<'a> {
    cfg: &'a Config,
    keys: &'a KeyPool,
    /// The planner (seeded stream and ledger).
    pub planner: Planner,
    writer: Writer,
    /// The best chain's last block: hash, height, time.
    tip: (BlockHash, u32, u32),
    /// Best-chain blocks held back while a rival branch is built.
    held: Vec<MainBlock>,
    /// The pending rival branch: fork hash, fork height, depth.
    pending: Option<(BlockHash, u32, u32)>,
    /// The reorganisations so far.
    pub reorgs: Vec<Reorg>,
    /// Blocks on rival branches so far.
    pub stale: u64,
    /// What the best chain is made of.
    pub stats: Stats,
    reserve: Vec<Coin>,
    coinbases: Vec<Coin>,
    genesis_time: u32,
    started: Instant,
    last_report: Instant,
}

impl<'a> Run<'a> {
    /// A run writing into `cfg.out`.
    pub fn new(cfg: &'a Config, keys: &'a KeyPool) -> Run<'a> {
        let p = &cfg.parameters;
        let expected_outputs = f64::from(p.blocks - FIRST_SPEND) * f64::from(p.txs_per_block) * 2.3;
        let targets = Targets {
            last: p.blocks,
            first: FIRST_SPEND,
            txs_per_block: p.txs_per_block,
            live_utxos: p.live_utxos_target,
            // About a third of the tip's UTXO set is never meant to be spent;
            // the rest is due after the tip or left over.
            never: (0.35 * p.live_utxos_target as f64 / expected_outputs).clamp(0.005, 0.5),
        };
        let genesis = bitcoin::constants::genesis_block(bitcoin::Network::Regtest);
        let now = Instant::now();
        Run {
            cfg,
            keys,
            planner: Planner {
                rng: ChaCha8Rng::from_seed(stream_seed(cfg.seed)),
                ledger: Ledger::new(p.blocks),
                targets,
            },
            writer: Writer::start(&cfg.out),
            tip: (genesis.block_hash(), 0, genesis.header.time),
            held: Vec::new(),
            pending: None,
            reorgs: Vec::new(),
            stale: 0,
            stats: Stats::default(),
            reserve: Vec::new(),
            coinbases: Vec::new(),
            genesis_time: genesis.header.time,
            started: now,
            last_report: now,
        }
    }

    /// Generates every block; then the writer's result.
    ///
    /// # Errors
    /// [`GenerateError`]; a write error is the writer's own.
    pub fn blocks(mut self) -> Result<(Written, Finished), GenerateError> {
        let mut result = Ok(());
        for h in 1..=self.cfg.parameters.blocks {
            result = self.step(h);
            if result.is_err() {
                break;
            }
            self.report(h);
        }
        let written = self.writer.finish();
        // When the writer stopped, its own error says why the send failed.
        let written = written?;
        result?;
        let finished = Finished {
            tip: Tip {
                hash: self.tip.0,
                height: self.tip.1,
                time: self.tip.2,
            },
            reserve: reserve(&self.reserve, &self.coinbases),
            planner: self.planner,
            reorgs: self.reorgs,
            stale: self.stale,
            stats: self.stats,
        };
        Ok((written, finished))
    }

    fn step(&mut self, h: u32) -> Result<(), GenerateError> {
        self.planner.ledger.advance(h);
        self.maybe_start_reorg(h);
        let every = f64::from(self.cfg.parameters.full_block_every);
        let full = h >= FIRST_SPEND && self.planner.rng.gen_bool(1.0 / every);
        let reserve_height = self.cfg.parameters.blocks - RESERVE_DEPTH;
        // The reserve is planned first (funded before the block's payments)
        // and placed last in the block.
        let reserve = if h == reserve_height {
            Some(self.plan_reserve(h)?)
        } else {
            None
        };
        let mut planned = if h >= FIRST_SPEND {
            self.planner.plan_block(h, full, self.keys)
        } else {
            Vec::new()
        };
        planned.extend(reserve);
        let txs = sign_all(
            planned.iter().map(|p| &p.draft),
            self.keys,
            self.cfg.threads,
        );
        let main = self.connect(h, planned, txs);
        if h == reserve_height {
            self.keep_reserve(&main);
        }
        self.emit(main)
    }

    /// Files the transactions' outputs, builds the block, counts it.
    fn connect(&mut self, h: u32, planned: Vec<Planned>, txs: Vec<Transaction>) -> MainBlock {
        let mut spent = Vec::with_capacity(planned.len());
        let mut fees = Vec::with_capacity(planned.len());
        for (p, tx) in planned.into_iter().zip(&txs) {
            let txid = tx.compute_txid();
            self.count_tx(h, &p, tx);
            for (vout, (out, meta)) in tx.output.iter().zip(&p.meta).enumerate() {
                if let Some(m) = meta {
                    let coin = new_coin(OutPoint::new(txid, vout as u32), out.value.to_sat(), h, m);
                    self.planner.ledger.insert(coin, m.due);
                }
            }
            fees.push(p.fee());
            spent.push(p.draft.inputs.into_iter().map(|(c, _)| c).collect());
        }
        let block = self.assemble(h, fees.iter().sum(), txs);
        let weight = block.weight().to_wu();
        self.stats.max_block_weight = self.stats.max_block_weight.max(weight);
        self.stats.blocks_over_3_9m_wu += u64::from(weight >= 3_900_000);
        MainBlock {
            block,
            height: h,
            spent,
            fees,
        }
    }

    /// The coinbase (subsidy plus fees, 2% of coinbases claim up to 1,000
    /// sat less, which is valid) and the block; files the payouts.
    fn assemble(&mut self, h: u32, fees: u64, txs: Vec<Transaction>) -> Block {
        let rng = &mut self.planner.rng;
        let mut claim = assemble::subsidy(h) + fees;
        if rng.gen_bool(0.02) {
            claim -= claim.min(rng.gen_range(1..=1_000));
        }
        let time = self.genesis_time + SPACING * h + rng.gen_range(0..300);
        let metas = self.planner.coinbase_metas(h);
        let share = claim / metas.len() as u64;
        let values: Vec<u64> = (0..metas.len())
            .map(|i| {
                if i == 0 {
                    claim - share * (metas.len() as u64 - 1)
                } else {
                    share
                }
            })
            .collect();
        let payouts: Vec<_> = metas
            .iter()
            .zip(&values)
            .map(|(m, v)| (self.keys.script_pubkey(m.kind, m.key, m.lock), *v))
            .collect();
        let cb = assemble::coinbase(h, &payouts, b"kakehi-chaingen");
        let block = assemble::finish(self.tip.0, time, cb, txs);
        let cbid = block.txdata[0].compute_txid();
        for (vout, (m, v)) in metas.iter().zip(&values).enumerate() {
            let mut coin = new_coin(OutPoint::new(cbid, vout as u32), *v, h, m);
            coin.coinbase = true;
            self.planner.ledger.insert(coin, m.due);
            *self.stats.created_by_kind.entry(m.kind.name()).or_default() += 1;
            // The coinbases with 100 and 99 confirmations at tip + 1.
            let last = self.cfg.parameters.blocks;
            if vout == 0 && (h == last - COINBASE_MATURITY + 1 || h == last - COINBASE_MATURITY + 2)
            {
                self.coinbases.push(coin);
            }
        }
        self.stats.transactions += 1;
        self.stats.outputs += metas.len() as u64;
        block
    }

    fn count_tx(&mut self, h: u32, p: &Planned, tx: &Transaction) {
        let s = &mut self.stats;
        let (n_in, n_out) = (tx.input.len() as u64, tx.output.len() as u64);
        s.transactions += 1;
        s.inputs += n_in;
        s.outputs += n_out;
        s.fees_sats += p.fee();
        s.max_inputs = s.max_inputs.max(n_in);
        s.max_outputs = s.max_outputs.max(n_out);
        s.txs_with_50_plus_inputs += u64::from(n_in >= 50);
        s.txs_with_100_plus_outputs += u64::from(n_out >= 100);
        for (c, _) in &p.draft.inputs {
            *s.spent_by_kind.entry(c.kind.name()).or_default() += 1;
            s.spend(h - c.height);
        }
        for m in &p.meta {
            let name = m.map_or("op_return", |m| m.kind.name());
            *s.created_by_kind.entry(name).or_default() += 1;
        }
    }

    /// Starts a rival branch on the current tip now and then (never close
    /// to the coins kept for the invalid cases).
    fn maybe_start_reorg(&mut self, h: u32) {
        let p = &self.cfg.parameters;
        let quiet_from = p.blocks - RESERVE_DEPTH - MAX_REORG_DEPTH - 10;
        if self.pending.is_some() || h < FIRST_SPEND + 10 || h > quiet_from {
            return;
        }
        if self.planner.rng.gen_bool(1.0 / f64::from(p.reorg_every)) {
            let depth = self.planner.rng.gen_range(1..=MAX_REORG_DEPTH);
            self.pending = Some((self.tip.0, self.tip.1, depth));
        }
    }

    /// Sends `main` to the writer, or holds it for a pending rival branch;
    /// when the branch is due, sends the rival blocks, then the held ones.
    fn emit(&mut self, main: MainBlock) -> Result<(), GenerateError> {
        self.tip = (main.block.block_hash(), main.height, main.block.header.time);
        let Some((fork, fork_height, depth)) = self.pending else {
            return self.send_best(main);
        };
        self.held.push(main);
        if self.held.len() <= depth as usize {
            return Ok(());
        }
        let rival = rival_branch(
            &mut self.planner.rng,
            self.keys,
            fork,
            fork_height,
            &self.held,
        );
        self.reorgs.push(Reorg {
            fork_height,
            depth,
            stale_tip: rival
                .last()
                .map(|b| b.block_hash().to_string())
                .unwrap_or_default(),
            new_tip: self.tip.0.to_string(),
        });
        self.stale += rival.len() as u64;
        for block in rival {
            self.writer.send(Item::Stale(block))?;
        }
        self.pending = None;
        for main in std::mem::take(&mut self.held) {
            self.send_best(main)?;
        }
        Ok(())
    }

    fn send_best(&mut self, main: MainBlock) -> Result<(), GenerateError> {
        let spent = main
            .spent
            .iter()
            .flatten()
            .map(|c| (c.outpoint, self.keys.script_pubkey(c.kind, c.key, c.lock)))
            .collect();
        self.writer.send(Item::Best {
            block: main.block,
            height: main.height,
            spent,
        })?;
        Ok(())
    }

    /// The coins kept for the invalid cases, never spent: three P2WPKH, a
    /// P2TR, a 2-of-3 P2WSH, a CLTV locked to the tip's height and a CSV
    /// with a `CSV_LOCK`-block lock (keys from the end of the pool).
    fn reserve_metas(&self) -> Vec<OutMeta> {
        let tip = self.cfg.parameters.blocks;
        [
            (Kind::P2wpkh, 0),
            (Kind::P2wpkh, 0),
            (Kind::P2wpkh, 0),
            (Kind::P2tr, 0),
            (Kind::P2wshMultisig, 0),
            (Kind::P2wshCltv, tip),
            (Kind::P2wshCsv, CSV_LOCK),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, (kind, lock))| OutMeta {
            kind,
            key: POOL_SIZE - 10 - 3 * i as u32,
            lock,
            due: None,
        })
        .collect()
    }

    fn plan_reserve(&mut self, h: u32) -> Result<Planned, GenerateError> {
        let metas = self.reserve_metas();
        self.planner
            .plan_reserve(h, metas, RESERVE_VALUE, self.keys)
            .ok_or(GenerateError::NoReserve { height: h })
    }

    /// Remembers the reserve transaction's outputs (it is the block's last
    /// transaction, its outputs in `reserve_metas` order).
    fn keep_reserve(&mut self, main: &MainBlock) {
        let Some(tx) = main.block.txdata.last() else {
            return;
        };
        let txid = tx.compute_txid();
        self.reserve = self
            .reserve_metas()
            .iter()
            .enumerate()
            .map(|(vout, m)| {
                new_coin(
                    OutPoint::new(txid, vout as u32),
                    RESERVE_VALUE,
                    main.height,
                    m,
                )
            })
            .collect();
    }

    fn report(&mut self, h: u32) {
        if self.last_report.elapsed().as_secs() < 10 && h != self.cfg.parameters.blocks {
            return;
        }
        self.last_report = Instant::now();
        eprintln!(
            "height {h}/{}: {} transactions, {} live UTXOs, {:.0} s",
            self.cfg.parameters.blocks,
            self.stats.transactions,
            self.planner.ledger.live(),
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// What the blocks left for the invalid cases and the manifest.
pub struct Finished {
    /// The best chain's tip.
    pub tip: Tip,
    /// The coins kept for the invalid cases.
    pub reserve: Option<Reserve>,
    /// The planner (its stream goes on into the cases; its ledger is the
    /// tip's UTXO set).
    pub planner: Planner,
    /// The reorganisations.
    pub reorgs: Vec<Reorg>,
    /// Blocks on rival branches.
    pub stale: u64,
    /// What the best chain is made of.
    pub stats: Stats,
}

fn reserve(kept: &[Coin], coinbases: &[Coin]) -> Option<Reserve> {
    let [a, b, c, p2tr, multisig, cltv, csv] = kept else {
        return None;
    };
    let [mature, immature] = coinbases else {
        return None;
    };
    Some(Reserve {
        p2wpkh: [*a, *b, *c],
        p2tr: *p2tr,
        multisig: *multisig,
        cltv: *cltv,
        csv: *csv,
        immature: *immature,
        mature: *mature,
    })
}

fn new_coin(outpoint: OutPoint, value: u64, height: u32, m: &OutMeta) -> Coin {
    Coin {
        outpoint,
        value,
        height,
        key: m.key,
        lock: m.lock,
        kind: m.kind,
        coinbase: false,
    }
}

/// The seed of the run's random stream: SHA-256 of a label and the seed.
fn stream_seed(seed: u64) -> [u8; 32] {
    let mut e = sha256::Hash::engine();
    e.input(b"kakehi-chaingen/stream");
    e.input(&seed.to_le_bytes());
    sha256::Hash::from_engine(e).to_byte_array()
}
