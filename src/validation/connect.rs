//! The economic checks of a block against the coins it spends
//! ([`connect_block`]: Core's `ConnectBlock` without scripts), and its
//! effects on the UTXO set.

use std::collections::{HashMap, HashSet};

use bitcoin::{Block, OutPoint, Script, Transaction, Txid};

use crate::chain::params::{ChainParams, MAX_BLOCK_SIGOPS_COST, MAX_MONEY};
use crate::primitives::Coin;

use super::sigops::{self, WITNESS_SCALE_FACTOR};
use super::{
    is_unspendable, script, BlockContext, BlockEffects, BlockError, SpentOutput,
    SEQUENCE_LOCKTIME_DISABLE_FLAG, SEQUENCE_LOCKTIME_GRANULARITY, SEQUENCE_LOCKTIME_MASK,
    SEQUENCE_LOCKTIME_TYPE_FLAG,
};

/// The coins the block sees while it is connected: the caller's map, minus
/// what the block spent so far, plus what it created so far.
struct BlockView<'c> {
    base: &'c HashMap<OutPoint, Coin>,
    created: Vec<(OutPoint, Coin)>,
    created_index: HashMap<OutPoint, usize>,
    spent: HashSet<OutPoint>,
}

impl BlockView<'_> {
    /// Adds the spendable outputs of `tx` (created at `height`) to the
    /// view.
    ///
    /// # Errors
    /// [`BlockError::Bip30`] when an output of the same txid created
    /// earlier in the block is still unspent.
    fn add_outputs(&mut self, tx: &Transaction, txid: Txid, height: u32) -> Result<(), BlockError> {
        for (vout, output) in tx.output.iter().enumerate() {
            if is_unspendable(output.script_pubkey.as_bytes()) {
                continue;
            }
            let outpoint = OutPoint {
                txid,
                vout: vout as u32,
            };
            // The same txid twice in one block with an unspent first copy.
            if self.created_index.contains_key(&outpoint) && !self.spent.contains(&outpoint) {
                return Err(BlockError::Bip30 { outpoint });
            }
            self.spent.remove(&outpoint);
            self.created_index.insert(outpoint, self.created.len());
            let coin = Coin {
                value: output.value,
                script_pubkey: output.script_pubkey.to_bytes(),
                height,
                coinbase: tx.is_coinbase(),
            };
            self.created.push((outpoint, coin));
        }
        Ok(())
    }

    fn get(&self, outpoint: &OutPoint) -> Option<&Coin> {
        if self.spent.contains(outpoint) {
            return None;
        }
        match self.created_index.get(outpoint) {
            Some(&i) => self.created.get(i).map(|(_, coin)| coin),
            None => self.base.get(outpoint),
        }
    }
}

/// Economic checks of a block whose [`check_block`](super::check_block) passed, in Core's
/// `ConnectBlock` order, and the block's effects on the UTXO set.
///
/// `coins` must hold the coins *unspent on the block's branch* for (a)
/// every outpoint the block spends that is not created earlier in the same
/// block and (b) outputs of the block's own transactions that may already
/// exist (BIP30 candidates). Extra entries are harmless. Each coin's
/// `height` is its creation height on this branch.
///
/// Rules:
/// - BIP30: no output of the block is already among `coins`, except in
///   `params.bip30_exceptions` (`bad-txns-BIP30`); the check is as good as
///   the candidates supplied ([`bip30_check_needed`](super::bip30_check_needed) says when Core looks);
/// - every input spends a coin unspent on the branch or created by an
///   *earlier* transaction of the block, and no outpoint twice in the block
///   (`bad-txns-inputs-missingorspent`);
/// - coinbase outputs are spent at least 100 blocks after their block
///   (`bad-txns-premature-spend-of-coinbase`);
/// - input values and sums within 0..=MAX_MONEY
///   (`bad-txns-inputvalues-outofrange`), outputs ≤ inputs
///   (`bad-txns-in-belowout`), fees sum within MAX_MONEY;
/// - BIP68 relative lock-times of version ≥ 2 transactions once CSV is
///   active (`bad-txns-nonfinal`), from the coins' heights and, for time
///   locks, [`BlockContext::median_time_past_at`];
/// - sigop cost (legacy × 4 + P2SH × 4 + witness) ≤ 80,000
///   (`bad-blk-sigops`);
/// - coinbase outputs ≤ subsidy + fees (`bad-cb-amount`).
///
/// Scripts are not evaluated here ([`script::verify_block_scripts`] does,
/// with the returned [`BlockEffects::spent`]).
///
/// # Errors
///
/// The first failed rule as a [`BlockError`];
/// [`BlockError::MissingMedianTimePast`] if the context lacks an MTP a
/// BIP68 time lock needs.
pub fn connect_block(
    block: &Block,
    ctx: &BlockContext,
    coins: &HashMap<OutPoint, Coin>,
) -> Result<BlockEffects, BlockError> {
    let txids: Vec<Txid> = block.txdata.iter().map(Transaction::compute_txid).collect();
    check_bip30(block, &txids, ctx, coins)?;
    // Core's GetTransactionSigOpCost counts P2SH and witness sigops under
    // the block's script flags (WITNESS is on for every block but the
    // script-flag exceptions, as in Core).
    let flags = script::block_script_flags(ctx.params, ctx.height, &ctx.block_hash);
    let output_count: usize = block.txdata.iter().map(|t| t.output.len()).sum();
    let input_count: usize = block.txdata.iter().skip(1).map(|t| t.input.len()).sum();
    let mut view = BlockView {
        base: coins,
        created: Vec::with_capacity(output_count),
        created_index: HashMap::with_capacity(output_count),
        spent: HashSet::with_capacity(input_count),
    };
    let mut spent = Vec::with_capacity(input_count);
    let mut fees: u64 = 0;
    let mut sigop_cost: u64 = 0;
    for (tx, &txid) in block.txdata.iter().zip(&txids) {
        let mut tx_sigops = sigops::legacy_sigops(tx) * WITNESS_SCALE_FACTOR;
        if !tx.is_coinbase() {
            let (inputs, fee) = check_tx_inputs(tx, txid, |o| view.get(o), ctx)?;
            fees = match fees.checked_add(fee) {
                Some(f) if f <= MAX_MONEY => f,
                _ => return Err(BlockError::AccumulatedFeeOutOfRange { txid }),
            };
            // BIP68 relative lock-times (Core's SequenceLocks), after the
            // fee sum as in Core's ConnectBlock.
            if ctx.height >= ctx.params.csv_height && tx.version.0 as u32 >= 2 {
                check_sequence_locks(tx, txid, &inputs, ctx)?;
            }
            tx_sigops += sigops::input_sigop_cost(
                tx,
                inputs.iter().map(|c| Script::from_bytes(&c.script_pubkey)),
                flags,
            );
            for ((vin, input), coin) in tx.input.iter().enumerate().zip(inputs) {
                view.spent.insert(input.previous_output);
                spent.push(SpentOutput {
                    outpoint: input.previous_output,
                    coin,
                    txid,
                    vin: vin as u32,
                });
            }
        }
        sigop_cost += tx_sigops;
        if sigop_cost > MAX_BLOCK_SIGOPS_COST {
            return Err(BlockError::TooManySigops { cost: sigop_cost });
        }
        view.add_outputs(tx, txid, ctx.height)?;
    }
    check_coinbase_amount(block, fees, ctx)?;
    Ok(BlockEffects {
        created: view.created,
        spent,
        fees,
        sigop_cost,
    })
}

/// BIP30, against the coins as they were before the block: no output of
/// the block is already unspent, except in the network's BIP30 exceptions.
fn check_bip30(
    block: &Block,
    txids: &[Txid],
    ctx: &BlockContext,
    coins: &HashMap<OutPoint, Coin>,
) -> Result<(), BlockError> {
    for (tx, txid) in block.txdata.iter().zip(txids) {
        for vout in 0..tx.output.len() as u32 {
            let outpoint = OutPoint { txid: *txid, vout };
            if coins.contains_key(&outpoint)
                && !ctx.params.is_bip30_exception(ctx.height, &ctx.block_hash)
            {
                return Err(BlockError::Bip30 { outpoint });
            }
        }
    }
    Ok(())
}

/// The input checks of non-coinbase `tx` in Core's order: every input
/// exists among the coins `coin_of` gives (`HaveInputs`), coinbase maturity
/// and value ranges (`Consensus::CheckTxInputs`), outputs ≤ inputs.
/// Returns the spent coins (input order) and the fee, sats.
///
/// Blocks call it with the coins unspent before the transaction in its
/// block; the mempool with the tip's coins plus its own, for a `ctx` of
/// the next block (height tip + 1).
///
/// # Errors
/// [`BlockError::MissingOrSpent`] (`bad-txns-inputs-missingorspent`),
/// [`BlockError::PrematureCoinbaseSpend`], [`BlockError::InputValuesOutOfRange`],
/// [`BlockError::InBelowOut`].
pub fn check_tx_inputs<'c>(
    tx: &Transaction,
    txid: Txid,
    coin_of: impl Fn(&OutPoint) -> Option<&'c Coin>,
    ctx: &BlockContext,
) -> Result<(Vec<Coin>, u64), BlockError> {
    let mut inputs: Vec<Coin> = Vec::with_capacity(tx.input.len());
    for (vin, input) in tx.input.iter().enumerate() {
        let Some(coin) = coin_of(&input.previous_output) else {
            return Err(BlockError::MissingOrSpent {
                txid,
                vin: vin as u32,
                outpoint: input.previous_output,
            });
        };
        inputs.push(coin.clone());
    }
    let maturity = coinbase_maturity(ctx.params);
    let mut value_in: u64 = 0;
    for (input, coin) in tx.input.iter().zip(&inputs) {
        if coin.coinbase && i64::from(ctx.height) - i64::from(coin.height) < i64::from(maturity) {
            return Err(BlockError::PrematureCoinbaseSpend {
                txid,
                outpoint: input.previous_output,
                coin_height: coin.height,
                spend_height: ctx.height,
            });
        }
        let coin_value = coin.value.to_sat();
        value_in = match value_in.checked_add(coin_value) {
            Some(v) if coin_value <= MAX_MONEY && v <= MAX_MONEY => v,
            _ => return Err(BlockError::InputValuesOutOfRange { txid }),
        };
    }
    // Output values were range-checked by check_block; sum defensively.
    let value_out = outputs_value(tx);
    if value_in < value_out {
        return Err(BlockError::InBelowOut {
            txid,
            value_in,
            value_out,
        });
    }
    Ok((inputs, value_in - value_out))
}

/// The sum of `tx`'s output values, sats (`u64::MAX` on overflow).
fn outputs_value(tx: &Transaction) -> u64 {
    tx.output
        .iter()
        .try_fold(0u64, |acc, o| acc.checked_add(o.value.to_sat()))
        .unwrap_or(u64::MAX)
}

/// The coinbase pays at most the subsidy plus the block's `fees`, sats
/// (`bad-cb-amount`).
fn check_coinbase_amount(block: &Block, fees: u64, ctx: &BlockContext) -> Result<(), BlockError> {
    let limit = fees.saturating_add(ctx.params.block_subsidy(ctx.height));
    let value_out = block.txdata.first().map_or(0, outputs_value);
    if value_out > limit {
        return Err(BlockError::CoinbaseAmount { value_out, limit });
    }
    Ok(())
}

/// Blocks a coinbase output must wait before it is spent (`ChainParams::coinbase_maturity`).
fn coinbase_maturity(params: &ChainParams) -> u32 {
    params.coinbase_maturity
}

/// BIP68: Core's `CalculateSequenceLocks` + `EvaluateSequenceLocks` for one
/// transaction whose inputs spend `inputs` (same order), as a block at
/// `ctx.height` would see it. The caller checks that BIP68 applies (CSV
/// active, version ≥ 2).
///
/// # Errors
/// [`BlockError::SequenceLocked`] (`bad-txns-nonfinal`; the mempool's
/// `non-BIP68-final`), or [`BlockError::MissingMedianTimePast`].
pub fn check_sequence_locks(
    tx: &Transaction,
    txid: Txid,
    inputs: &[Coin],
    ctx: &BlockContext,
) -> Result<(), BlockError> {
    let mut min_height: i64 = -1;
    let mut min_time: i64 = -1;
    for (input, coin) in tx.input.iter().zip(inputs) {
        let sequence = input.sequence.0;
        if sequence & SEQUENCE_LOCKTIME_DISABLE_FLAG != 0 {
            continue;
        }
        let value = i64::from(sequence & SEQUENCE_LOCKTIME_MASK);
        if sequence & SEQUENCE_LOCKTIME_TYPE_FLAG != 0 {
            // MTP of the block before the coin's block.
            let at = coin.height.saturating_sub(1);
            let coin_time = if ctx.height.checked_sub(1) == Some(at) {
                ctx.prev_median_time_past
            } else if at < ctx.height {
                (ctx.median_time_past_at)(at)
                    .ok_or(BlockError::MissingMedianTimePast { height: at })?
            } else {
                return Err(BlockError::MissingMedianTimePast { height: at });
            };
            min_time =
                min_time.max(i64::from(coin_time) + (value << SEQUENCE_LOCKTIME_GRANULARITY) - 1);
        } else {
            min_height = min_height.max(i64::from(coin.height) + value - 1);
        }
    }
    if min_height >= i64::from(ctx.height) || min_time >= i64::from(ctx.prev_median_time_past) {
        return Err(BlockError::SequenceLocked {
            txid,
            min_height,
            min_time,
        });
    }
    Ok(())
}
