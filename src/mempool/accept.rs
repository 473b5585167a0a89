//! Acceptance of one transaction: Bitcoin Core's `MemPoolAccept` for a
//! single transaction (`PreChecks`, `ReplacementChecks`,
//! `PolicyScriptChecks`, `ConsensusScriptChecks`), in Core's order, so the
//! first failure reported is the one Core reports, with Core's reason.
//!
//! It reads the pool and the chain snapshot and changes neither: it
//! returns the entry to add and the entries it replaces; the caller
//! ([`super::Mempool`]) applies them.
//!
//! Consensus rules come from [`crate::validation`] (the code blocks are
//! checked with, for a block at the tip's height + 1); standardness from
//! [`super::policy`]; scripts through Core's own interpreter.
//!
//! Source: Bitcoin Core 30.0 `src/validation.cpp` (`MemPoolAccept`),
//! `src/policy/rbf.cpp`, `src/policy/truc_policy.cpp`,
//! `src/txmempool.cpp` (`CalculateMemPoolAncestors`).

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use bitcoin::consensus::serialize;
use bitcoin::hashes::Hash;
use bitcoin::{BlockHash, OutPoint, Transaction, TxOut, Txid};

use super::entry::{feerate_sat_per_kvb, MempoolEntry};
use super::policy::truc::{TrucViolation, TxIds};
use super::policy::{self, fee_at_rate, PolicyConfig};
use super::pool::Pool;
use super::reject::{TxReject, TxRejectClass};
use super::MempoolConfig;
use crate::primitives::Coin;
use crate::snapshot::ChainSnapshot;
use crate::sozu::ViewStatus;
use crate::validation::script::{
    block_script_flags, PreparedTx, ScriptFlags, SpentTxOut, VerifyError,
};
use crate::validation::{self, BlockContext, BlockError};

/// Why acceptance could not decide: the transaction is refused
/// ([`AcceptError::Rejected`], Core's reason), or the chain state could
/// not be read ([`AcceptError::Storage`]: nothing is known about the
/// transaction; try again).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AcceptError {
    /// Refused, with Core's reason.
    #[error("{0}")]
    Rejected(#[from] TxReject),
    /// The UTXO set or block index could not be read.
    #[error("chain state read failed: {0}")]
    Storage(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// What acceptance decided for a transaction that passes: the entry to
/// add and the mempool entries it replaces (its direct conflicts and
/// their descendants).
#[derive(Debug)]
pub struct Accepted {
    /// The new entry (its sequence number is given when it is added).
    pub entry: MempoolEntry,
    /// Txids the entry replaces (BIP-125-style full RBF).
    pub replaced: BTreeSet<Txid>,
}

/// What acceptance reads: the chain snapshot (the tip's UTXO set and
/// block index), the mempool's settings, the current time and the
/// mempool's current minimum feerate.
pub struct AcceptContext<'a> {
    /// The chain state the transaction is checked against (its tip).
    pub snapshot: &'a ChainSnapshot,
    /// The mempool's settings.
    pub config: &'a MempoolConfig,
    /// Now, seconds since the UNIX epoch.
    pub now: u64,
    /// The mempool's rolling minimum feerate, sats per 1,000 vbytes (0
    /// while the pool is not full).
    pub min_feerate: u64,
    /// Skip the fee and size limits (transactions of disconnected blocks
    /// returning after a reorg, as Core's `bypass_limits`).
    pub bypass_limits: bool,
}

/// The tip-relative facts a check needs, read once.
struct Tip {
    height: u32,
    median_time_past: u32,
}

/// Checks `tx` against the pool and the snapshot's tip by Core's rules, in
/// Core's phases: the checks of the transaction alone, duplicates, the
/// coins it spends (inputs, input policy, fees), its place in the pool
/// (TRUC, conflicts, replacement, package limits), then its scripts.
///
/// # Errors
/// [`AcceptError::Rejected`] with Core's reject reason;
/// [`AcceptError::Storage`] when the UTXO set cannot be read.
pub fn check(
    pool: &Pool,
    ctx: &AcceptContext<'_>,
    tx: Arc<Transaction>,
) -> Result<Accepted, AcceptError> {
    let index = ctx.snapshot.index();
    let tip_entry = index.tip();
    let tip = Tip {
        height: tip_entry.height,
        median_time_past: index.median_time_past(tip_entry.id),
    };
    let txid = tx.compute_txid();
    let wtxid = tx.compute_wtxid();
    pre_checks_context_free(&tx, &tip, &ctx.config.policy)?;
    check_not_in_pool(pool, txid, wtxid)?;
    let priced = coin_checks(pool, ctx, &tx, txid, &tip)?;
    let replaced = pool_checks(pool, ctx, &tx, txid, &priced)?;
    let flags = block_script_flags(index.params(), tip.height + 1, &BlockHash::all_zeros());
    script_checks(&tx, &priced.prevouts, flags)?;
    let entry = MempoolEntry {
        tx: tx.clone(),
        txid,
        wtxid,
        fee: priced.fee,
        vsize: priced.vsize,
        weight: priced.weight,
        size: tx.total_size() as u64,
        sigop_cost: priced.sigop_cost,
        time: ctx.now,
        height: tip.height,
        sequence: 0,
        spends_coinbase: priced.spends_coinbase,
        prevouts: priced.prevouts,
    };
    Ok(Accepted { entry, replaced })
}

/// What the coin checks learn about a transaction.
struct Priced {
    /// The outputs it spends, in input order.
    prevouts: Vec<TxOut>,
    /// Whether one of them is a coinbase output.
    spends_coinbase: bool,
    /// Inputs minus outputs, sats.
    fee: u64,
    /// Sigop cost (BIP-141 units).
    sigop_cost: u64,
    /// Weight, weight units.
    weight: u64,
    /// Sigop-adjusted virtual size, vbytes.
    vsize: u64,
}

/// `txn-already-in-mempool` (same wtxid) and
/// `txn-same-nonwitness-data-in-mempool` (same txid, another witness).
fn check_not_in_pool(pool: &Pool, txid: Txid, wtxid: bitcoin::Wtxid) -> Result<(), TxReject> {
    if pool.get_by_wtxid(&wtxid).is_some() {
        return Err(TxReject::new(
            TxRejectClass::Duplicate,
            "txn-already-in-mempool",
        ));
    }
    if pool.contains(&txid) {
        return Err(TxReject::new(
            TxRejectClass::Duplicate,
            "txn-same-nonwitness-data-in-mempool",
        ));
    }
    Ok(())
}

/// The checks of `PreChecks` that read the coins: the inputs exist and
/// pass the consensus input checks at the next block, the input policy,
/// sigops, ephemeral dust, then the fees against the minimums.
fn coin_checks(
    pool: &Pool,
    ctx: &AcceptContext<'_>,
    tx: &Transaction,
    txid: Txid,
    tip: &Tip,
) -> Result<Priced, AcceptError> {
    let index = ctx.snapshot.index();
    let policy_cfg = &ctx.config.policy;
    let coins = fetch_coins(pool, ctx.snapshot, tx, txid, tip.height)?;
    let block_ctx_mtp = |h: u32| index.active_at(h).map(|e| index.median_time_past(e.id));
    let block_ctx = BlockContext {
        params: index.params(),
        height: tip.height + 1,
        block_hash: BlockHash::all_zeros(),
        prev_median_time_past: tip.median_time_past,
        median_time_past_at: &block_ctx_mtp,
    };
    let (spent, fee) = check_inputs(tx, txid, &coins, &block_ctx)?;
    let prevouts: Vec<TxOut> = spent
        .iter()
        .map(|c| TxOut {
            value: c.value,
            script_pubkey: c.script_pubkey.clone().into(),
        })
        .collect();
    policy::are_inputs_standard(tx, &prevouts)?;
    policy::is_witness_standard(tx, &prevouts)?;
    let sigop_cost = policy::check_standard_sigops(tx, &prevouts)?;
    let signed_fee = i64::try_from(fee).unwrap_or(i64::MAX);
    policy::pre_check_ephemeral_tx(tx, policy_cfg.dust_relay_feerate, signed_fee, signed_fee)?;
    let weight = tx.weight().to_wu();
    let vsize = policy::sigop_adjusted_vsize(weight, sigop_cost, policy_cfg.bytes_per_sigop);
    if !ctx.bypass_limits {
        check_fee_rate(ctx, policy_cfg, fee, vsize)?;
    }
    Ok(Priced {
        spends_coinbase: spent.iter().any(|c| c.coinbase),
        prevouts,
        fee,
        sigop_cost,
        weight,
        vsize,
    })
}

/// The checks of the transaction's place in the pool: TRUC (with sibling
/// eviction), no spending of what it replaces, the replacement rules, the
/// package limits. Returns the txids it replaces.
fn pool_checks(
    pool: &Pool,
    ctx: &AcceptContext<'_>,
    tx: &Transaction,
    txid: Txid,
    priced: &Priced,
) -> Result<BTreeSet<Txid>, TxReject> {
    let mut conflicts: BTreeSet<Txid> = tx
        .input
        .iter()
        .filter_map(|i| pool.spender(&i.previous_output))
        .collect();
    // TRUC sibling eviction: a version-3 child whose parent already has a
    // child replaces that child under the replacement rules.
    let parents = pool.parents_of(tx);
    // Core skips the TRUC rules with the other limits for transactions
    // returning after a reorg (`m_bypass_limits`): a reorg may leave a
    // TRUC parent with two children, or a non-TRUC child of it.
    let sibling_eviction = if ctx.bypass_limits {
        false
    } else {
        truc_checks(pool, tx, priced.vsize, &parents, &mut conflicts)?
    };
    // Core's PreChecks refuses a transaction spending what it replaces
    // (EntriesAndTxidsDisjoint) before ReplacementChecks.
    let ancestors = pool.ancestors_from(parents.clone());
    if let Some(t) = ancestors.iter().find(|a| conflicts.contains(*a)) {
        return Err(TxReject::with_debug(
            TxRejectClass::Consensus,
            "bad-txns-spends-conflicting-tx",
            format!("{txid} spends conflicting transaction {t}"),
        ));
    }
    let replaced = replacement_checks(
        pool,
        ctx,
        tx,
        Replacing {
            txid,
            fee: priced.fee,
            vsize: priced.vsize,
            conflicts: &conflicts,
            parents: &parents,
            sibling_eviction,
        },
    )?;
    if !ctx.bypass_limits {
        check_package_limits(pool, &ctx.config.limits, priced.vsize, &parents, &replaced)?;
    }
    Ok(replaced)
}

/// The checks that need neither coins nor the pool: `CheckTransaction`,
/// coinbase, `IsStandardTx`, the minimum non-witness size, finality at
/// the next block.
fn pre_checks_context_free(
    tx: &Transaction,
    tip: &Tip,
    cfg: &PolicyConfig,
) -> Result<(), TxReject> {
    validation::check_transaction(tx).map_err(|e| consensus_reject(&e))?;
    if tx.is_coinbase() {
        return Err(TxReject::consensus("coinbase"));
    }
    policy::is_standard_tx(tx, cfg)?;
    policy::check_tx_size_small(tx)?;
    // Core's CheckFinalTxAtTip: the next block's height, and the tip's
    // median-time-past as the cutoff (BIP113).
    if !validation::is_final_tx(tx, tip.height + 1, tip.median_time_past) {
        return Err(TxReject::new(TxRejectClass::PrematureSpend, "non-final"));
    }
    Ok(())
}

/// A consensus failure of the transaction's own checks, with Core's
/// reason and the error's text as debug message.
fn consensus_reject(e: &BlockError) -> TxReject {
    TxReject::with_debug(TxRejectClass::Consensus, e.reject_reason(), e.to_string())
}

/// The coins `tx`'s inputs spend, and its own outputs when they are
/// already unspent on the chain (Core's `txn-already-known`): mempool
/// parents' outputs (at height tip + 1, as Core's `MEMPOOL_HEIGHT` coins
/// count for BIP68) first, the rest read from the UTXO table at the
/// snapshot's tip.
///
/// # Errors
/// `txn-already-known`, [`AcceptError::Storage`].
fn fetch_coins(
    pool: &Pool,
    snapshot: &ChainSnapshot,
    tx: &Transaction,
    txid: Txid,
    tip_height: u32,
) -> Result<HashMap<OutPoint, Coin>, AcceptError> {
    let mut coins = HashMap::with_capacity(tx.input.len());
    let mut to_read: Vec<OutPoint> = Vec::new();
    for input in &tx.input {
        let op = input.previous_output;
        match pool.get(&op.txid) {
            Some(parent) => {
                if let Some(out) = parent.tx.output.get(op.vout as usize) {
                    coins.insert(
                        op,
                        Coin {
                            value: out.value,
                            script_pubkey: out.script_pubkey.to_bytes(),
                            height: tip_height + 1,
                            coinbase: false,
                        },
                    );
                }
            }
            None => to_read.push(op),
        }
    }
    let own = (0..tx.output.len() as u32).map(|vout| OutPoint { txid, vout });
    to_read.extend(own.clone());
    let entries = snapshot
        .lookup_outpoints(&to_read)
        .map_err(|e| AcceptError::Storage(Box::new(e)))?;
    let view = snapshot.active_view();
    for e in entries.into_iter().flatten() {
        if let ViewStatus::Unspent = e.status_in(&view) {
            let height = e.creation_height_in(&view).unwrap_or(e.coin.height);
            coins.insert(
                e.outpoint,
                Coin {
                    height,
                    ..e.coin.clone()
                },
            );
        }
    }
    if own.clone().any(|op| coins.contains_key(&op)) {
        return Err(TxReject::new(TxRejectClass::Duplicate, "txn-already-known").into());
    }
    Ok(coins)
}

/// Inputs exist (`bad-txns-inputs-missingorspent`, an orphan), BIP68
/// (`non-BIP68-final`), then Core's `Consensus::CheckTxInputs` (maturity,
/// value ranges, fee ≥ 0). Returns the spent coins and the fee, sats.
fn check_inputs(
    tx: &Transaction,
    txid: Txid,
    coins: &HashMap<OutPoint, Coin>,
    ctx: &BlockContext<'_>,
) -> Result<(Vec<Coin>, u64), TxReject> {
    if tx
        .input
        .iter()
        .any(|i| !coins.contains_key(&i.previous_output))
    {
        return Err(TxReject::new(
            TxRejectClass::MissingInputs,
            "bad-txns-inputs-missingorspent",
        ));
    }
    let spent: Vec<Coin> = tx
        .input
        .iter()
        .filter_map(|i| coins.get(&i.previous_output).cloned())
        .collect();
    if ctx.height >= ctx.params.csv_height && tx.version.0 >= 2 {
        validation::check_sequence_locks(tx, txid, &spent, ctx).map_err(|e| {
            TxReject::with_debug(
                TxRejectClass::PrematureSpend,
                "non-BIP68-final",
                e.to_string(),
            )
        })?;
    }
    validation::check_tx_inputs(tx, txid, |o| coins.get(o), ctx).map_err(|e| match e {
        BlockError::PrematureCoinbaseSpend {
            coin_height,
            spend_height,
            ..
        } => TxReject::with_debug(
            TxRejectClass::PrematureSpend,
            e.reject_reason(),
            format!(
                "tried to spend coinbase at depth {}",
                spend_height - coin_height
            ),
        ),
        BlockError::InBelowOut {
            value_in,
            value_out,
            ..
        } => TxReject::with_debug(
            TxRejectClass::Consensus,
            e.reject_reason(),
            format!(
                "value in ({}) < value out ({})",
                btc(value_in),
                btc(value_out)
            ),
        ),
        other => consensus_reject(&other),
    })
}

/// Sats as Core's `FormatMoney` prints them: eight decimals, trailing
/// zeros trimmed down to two (`3.00`, `0.002`, `0.00000011`).
fn btc(sats: u64) -> String {
    let mut s = btc8(sats);
    while s.ends_with('0') && s.len() - s.find('.').unwrap_or(0) > 3 {
        s.pop();
    }
    s
}

/// Sats as BTC with all eight decimals (`0.00001000`), as Core's
/// `CFeeRate::ToString` prints a feerate's amount.
fn btc8(sats: u64) -> String {
    format!("{}.{:08}", sats / 100_000_000, sats % 100_000_000)
}

/// Core's `CheckFeeRate`: the mempool's rolling minimum, then the minimum
/// relay feerate (both `TX_RECONSIDERABLE`: a package may pay for it).
fn check_fee_rate(
    ctx: &AcceptContext<'_>,
    cfg: &PolicyConfig,
    fee: u64,
    vsize: u64,
) -> Result<(), TxReject> {
    let mempool_fee = fee_at_rate(ctx.min_feerate, vsize).to_sat();
    if ctx.min_feerate > 0 && fee < mempool_fee {
        return Err(TxReject::with_debug(
            TxRejectClass::Reconsiderable,
            "mempool min fee not met",
            format!("{fee} < {mempool_fee}"),
        ));
    }
    let relay_fee = fee_at_rate(cfg.min_relay_feerate, vsize).to_sat();
    if fee < relay_fee {
        return Err(TxReject::with_debug(
            TxRejectClass::Reconsiderable,
            "min relay fee not met",
            format!("{fee} < {relay_fee}"),
        ));
    }
    Ok(())
}

/// Core's `SingleTRUCChecks` (BIP-431): a version-3 transaction is at most
/// 10,000 vbytes, has at most one unconfirmed ancestor, which is version 3
/// too, and a child of at most 1,000 vbytes; a parent has at most one
/// child (a second one replaces the first: sibling eviction, added to
/// `conflicts`); a non-version-3 transaction spends no unconfirmed
/// version-3 output. Returns whether a sibling was added to `conflicts`
/// (Core's `m_sibling_eviction`).
fn truc_checks(
    pool: &Pool,
    tx: &Transaction,
    vsize: u64,
    parents: &BTreeSet<Txid>,
    conflicts: &mut BTreeSet<Txid>,
) -> Result<bool, TxReject> {
    let me = TxIds::of(tx);
    let is_truc = policy::truc::is_truc(tx);
    for p in parents.iter().filter_map(|p| pool.get(p)) {
        let parent = TxIds {
            txid: p.txid,
            wtxid: p.wtxid,
        };
        match (is_truc, policy::truc::is_truc(&p.tx)) {
            (true, false) => {
                return Err(TrucViolation::TrucSpendsNonTruc { tx: me, parent }.reject())
            }
            (false, true) => {
                return Err(TrucViolation::NonTrucSpendsTruc { tx: me, parent }.reject())
            }
            _ => {}
        }
    }
    if !is_truc {
        return Ok(false);
    }
    policy::truc::check_truc_size(tx, vsize)?;
    let Some(parent) = parents.iter().next() else {
        return Ok(false);
    };
    if parents.len() + pool.ancestors(parent).len() + 1 > policy::truc::TRUC_ANCESTOR_LIMIT {
        return Err(TrucViolation::TooManyAncestors { tx: me }.reject());
    }
    if vsize > policy::truc::TRUC_CHILD_MAX_VSIZE {
        return Err(TrucViolation::ChildTooBig { tx: me, vsize }.reject());
    }
    // Core's SingleTRUCChecks: the parent would have a second descendant,
    // unless one of its children is replaced by this transaction. A lone
    // child without other ancestors may then be evicted (sibling eviction,
    // Core 28+); with more descendants (after a reorg) it is refused.
    let children = pool.children_of(parent);
    let child_will_be_replaced = children.iter().any(|c| conflicts.contains(c));
    let descendants = pool.descendants(parent);
    if descendants.len() + 2 > policy::truc::TRUC_DESCENDANT_LIMIT && !child_will_be_replaced {
        let sibling = match children.iter().next() {
            Some(c) if descendants.len() == 1 && pool.ancestors(c).len() == 1 => *c,
            _ => {
                let p = pool.get(parent).map(|e| TxIds {
                    txid: e.txid,
                    wtxid: e.wtxid,
                });
                return Err(match p {
                    Some(parent) => TrucViolation::TooManyDescendants { parent }.reject(),
                    None => TrucViolation::TooManyAncestors { tx: me }.reject(),
                });
            }
        };
        conflicts.insert(sibling);
        return Ok(true);
    }
    Ok(false)
}

/// What a replacement is checked with: the new transaction's txid, fee
/// (sats) and sigop-adjusted vsize, the mempool transactions it conflicts
/// with directly, its in-mempool parents, and whether one conflict is a
/// TRUC sibling it evicts (Core's `m_sibling_eviction`).
#[derive(Clone, Copy)]
struct Replacing<'a> {
    txid: Txid,
    fee: u64,
    vsize: u64,
    conflicts: &'a BTreeSet<Txid>,
    parents: &'a BTreeSet<Txid>,
    sibling_eviction: bool,
}

/// Core 30's `ReplacementChecks` under full RBF (no BIP-125 signal
/// needed): at most 100 transactions evicted, no new unconfirmed inputs,
/// a higher feerate than every direct conflict, at least the evicted fees,
/// plus the incremental relay fee for the new transaction's size. Returns
/// every txid the transaction evicts (conflicts and their descendants).
fn replacement_checks(
    pool: &Pool,
    ctx: &AcceptContext<'_>,
    tx: &Transaction,
    r: Replacing<'_>,
) -> Result<BTreeSet<Txid>, TxReject> {
    let Replacing {
        txid,
        fee,
        vsize,
        conflicts,
        parents,
        sibling_eviction,
    } = r;
    if conflicts.is_empty() {
        return Ok(BTreeSet::new());
    }
    // Core words every refusal of a sibling eviction with this suffix.
    let policy_reject = |reason: &'static str, debug: String| {
        let reason: Cow<'static, str> = if sibling_eviction {
            format!("{reason} (including sibling eviction)").into()
        } else {
            reason.into()
        };
        TxReject::with_debug(TxRejectClass::MempoolPolicy, reason, debug)
    };
    // Core's order: PaysMoreThanConflicts (a higher feerate than each
    // direct conflict), the eviction count, no new unconfirmed inputs,
    // PaysForRBF.
    let new_rate = feerate_sat_per_kvb(fee, vsize);
    for c in conflicts.iter().filter_map(|c| pool.get(c)) {
        if u128::from(fee) * u128::from(c.vsize) <= u128::from(c.fee) * u128::from(vsize) {
            return Err(policy_reject(
                "insufficient fee",
                format!(
                    "rejecting replacement {txid}; new feerate {} <= old feerate {}",
                    fmt_feerate(new_rate),
                    fmt_feerate(c.feerate_sat_per_kvb())
                ),
            ));
        }
    }
    let mut evicted: BTreeSet<Txid> = BTreeSet::new();
    for c in conflicts {
        evicted.insert(*c);
        evicted.extend(pool.descendants(c));
        if evicted.len() > MAX_REPLACEMENT_CANDIDATES {
            return Err(policy_reject(
                "too many potential replacements",
                format!(
                    "rejecting replacement {txid}; too many potential replacements ({} > {MAX_REPLACEMENT_CANDIDATES})",
                    evicted.len()
                ),
            ));
        }
    }
    // HasNoNewUnconfirmedParents: unconfirmed inputs must come from
    // parents of the replaced transactions.
    let conflict_parents: BTreeSet<Txid> = conflicts
        .iter()
        .filter_map(|c| pool.get(c))
        .flat_map(|e| pool.parents_of(&e.tx))
        .collect();
    for (idx, input) in tx.input.iter().enumerate() {
        let p = input.previous_output.txid;
        if parents.contains(&p) && !conflict_parents.contains(&p) {
            return Err(policy_reject(
                "replacement-adds-unconfirmed",
                format!("replacement {txid} adds unconfirmed input, idx {idx}"),
            ));
        }
    }
    // PaysForRBF: at least the evicted fees, plus relay of its own size.
    let (_, evicted_fees) = pool.sum_of(&evicted);
    if fee < evicted_fees {
        return Err(policy_reject(
            "insufficient fee",
            format!(
                "rejecting replacement {txid}, less fees than conflicting txs; {} < {}",
                btc(fee),
                btc(evicted_fees)
            ),
        ));
    }
    let additional = fee - evicted_fees;
    let relay = fee_at_rate(ctx.config.policy.incremental_relay_feerate, vsize).to_sat();
    if additional < relay {
        return Err(policy_reject(
            "insufficient fee",
            format!(
                "rejecting replacement {txid}, not enough additional fees to relay; {} < {}",
                btc(additional),
                btc(relay)
            ),
        ));
    }
    Ok(evicted)
}

/// Core's `MAX_REPLACEMENT_CANDIDATES`: one replacement evicts at most
/// this many transactions (direct conflicts and their descendants).
pub const MAX_REPLACEMENT_CANDIDATES: usize = 100;

/// A feerate as Core's `CFeeRate::ToString` prints it:
/// `0.00001000 BTC/kvB`.
fn fmt_feerate(sat_per_kvb: u64) -> String {
    format!("{} BTC/kvB", btc8(sat_per_kvb))
}

/// Core's ancestor and descendant limits (`CalculateMemPoolAncestors`
/// with `-limitancestorcount`, `-limitancestorsize`,
/// `-limitdescendantcount`, `-limitdescendantsize`), counted on the pool
/// without the transactions it replaces, from the transaction's in-mempool
/// `parents` up, in Core's order, so the first limit reported is Core's.
fn check_package_limits(
    pool: &Pool,
    limits: &super::AncestorLimits,
    vsize: u64,
    parents: &BTreeSet<Txid>,
    replaced: &BTreeSet<Txid>,
) -> Result<(), TxReject> {
    let chain = |debug: String| {
        TxReject::with_debug(
            TxRejectClass::MempoolPolicy,
            "too-long-mempool-chain",
            debug,
        )
    };
    if parents.len() as u64 + 1 > limits.ancestor_count {
        return Err(chain(format!(
            "too many unconfirmed parents [limit: {}]",
            limits.ancestor_count
        )));
    }
    // Core's traversal: ancestors staged in txid order, each checked when
    // it is taken (its descendant size, its descendant count, the
    // ancestors' size so far), then the ancestor count with what is staged.
    let mut staged: BTreeSet<Txid> = parents.clone();
    let mut seen: BTreeSet<Txid> = parents.clone();
    let mut taken: u64 = 0;
    let mut ancestors_vsize = vsize;
    while let Some(a) = staged.pop_first() {
        let Some(entry) = pool.get(&a) else {
            continue;
        };
        taken += 1;
        ancestors_vsize += entry.vsize;
        let desc: BTreeSet<Txid> = pool
            .descendants(&a)
            .into_iter()
            .filter(|d| !replaced.contains(d))
            .collect();
        let (desc_vsize, _) = pool.sum_of(&desc);
        if entry.vsize + desc_vsize + vsize > limits.descendant_size_vbytes {
            return Err(chain(format!(
                "exceeds descendant size limit for tx {a} [limit: {}]",
                limits.descendant_size_vbytes
            )));
        }
        if desc.len() as u64 + 2 > limits.descendant_count {
            return Err(chain(format!(
                "too many descendants for tx {a} [limit: {}]",
                limits.descendant_count
            )));
        }
        if ancestors_vsize > limits.ancestor_size_vbytes {
            return Err(chain(format!(
                "exceeds ancestor size limit [limit: {}]",
                limits.ancestor_size_vbytes
            )));
        }
        for p in pool.parents_of(&entry.tx) {
            if seen.insert(p) {
                staged.insert(p);
            }
        }
        if staged.len() as u64 + taken + 1 > limits.ancestor_count {
            return Err(chain(format!(
                "too many unconfirmed ancestors [limit: {}]",
                limits.ancestor_count
            )));
        }
    }
    Ok(())
}

/// Core's `PolicyScriptChecks` then `ConsensusScriptChecks`: every input
/// under the standard flags and the next block's, by Core's interpreter.
/// Core 30 words any failure in the mempool as
/// `mempool-script-verify-flag-failed (<script error>)`, a policy
/// failure (`TX_NOT_STANDARD`: transaction failures never get a peer
/// punished, `CheckInputScripts`).
fn script_checks(
    tx: &Transaction,
    prevouts: &[TxOut],
    consensus_flags: crate::validation::script::ScriptFlags,
) -> Result<(), TxReject> {
    let spent: Vec<SpentTxOut<'_>> = prevouts
        .iter()
        .map(|o| SpentTxOut {
            value: o.value,
            script_pubkey: o.script_pubkey.as_bytes(),
        })
        .collect();
    let bytes = serialize(tx);
    let flags = policy::STANDARD_SCRIPT_VERIFY_FLAGS | consensus_flags;
    let failed = |e: &VerifyError| {
        let message = match e {
            VerifyError::Script { error } => error.message().to_string(),
            other => other.to_string(),
        };
        TxReject::new(
            TxRejectClass::NotStandard,
            format!("mempool-script-verify-flag-failed ({message})"),
        )
    };
    let prepared = PreparedTx::new(&bytes, &spent).map_err(|e| failed(&e))?;
    for (index, prevout) in prevouts.iter().enumerate().take(prepared.inputs()) {
        // Core 28+'s interpreter succeeds on a bare pay-to-anchor spend
        // before the upgradable-witness-program policy check
        // (`IsPayToAnchor` in `VerifyWitnessProgram`); the Core 26.0
        // engine here predates it, so that policy flag is left out for such
        // an input (a P2SH-wrapped anchor keeps it).
        let input_flags = if policy::solver::is_pay_to_anchor(&prevout.script_pubkey) {
            flags.without(ScriptFlags::DISCOURAGE_UPGRADABLE_WITNESS_PROGRAM)
        } else {
            flags
        };
        prepared
            .verify(index, input_flags)
            .map_err(|e| failed(&e))?;
    }
    Ok(())
}
