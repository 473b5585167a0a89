//! `GET /fee-estimates` (Esplora's shape: confirmation target in blocks →
//! feerate in sat/vB), from the mempool's backlog and the feerates paid in
//! recent blocks.
//!
//! Method:
//! - **The backlog.** The mempool is cut into the blocks Core's block
//!   assembler would make next ([`crate::mempool::assemble`]). When the
//!   backlog fills more than `t` blocks, target `t` is the lowest package
//!   feerate of projected block `t`: what a transaction must beat to be
//!   mined within `t` blocks if miners follow Core's order.
//! - **History**, for targets the backlog does not reach (and without a
//!   mempool): the non-coinbase transactions of the last
//!   [`FEE_WINDOW_BLOCKS`] active blocks, each with its feerate (fee /
//!   vsize) weighted by its vsize; target `t` in 1..=25 maps to the
//!   weighted percentile `50 / t` (1 → the median of the block space, 2 →
//!   the 25th percentile, 25 → the 2nd), targets 144, 504 and 1008 to the
//!   lowest feerate paid.
//! - Never below the mempool's minimum feerate nor [`MIN_FEERATE`], and
//!   never higher for a longer target than for a shorter one.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::esplora::{block_spent, load_block};
use super::{read, ApiError, ApiResult, AppState};
use crate::mempool::assemble::{project_blocks, ProjectedBlock, BLOCK_MAX_VSIZE};
use crate::snapshot::ChainSnapshot;

/// Recent active blocks whose transactions are sampled.
pub const FEE_WINDOW_BLOCKS: u32 = 6;

/// Lowest estimate, sat/vB (Core's minimum relay feerate before 30.0,
/// which wallets still take as the floor).
pub const MIN_FEERATE: f64 = 1.0;

/// Projected blocks the backlog is read over (the largest target below
/// 144, plus one to tell whether block 25 is full).
pub const PROJECTED_BLOCKS: usize = 26;

/// Esplora's confirmation targets, blocks.
pub const TARGETS: [u16; 28] = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 144,
    504, 1008,
];

/// The weighted percentile (0..=50) a target maps to.
pub fn target_percentile(target: u16) -> f64 {
    if target > 25 {
        0.0
    } else {
        50.0 / f64::from(target.max(1))
    }
}

/// (feerate sat/vB, vsize vB) of every non-coinbase transaction of the
/// last [`FEE_WINDOW_BLOCKS`] active blocks, sorted by feerate.
fn recent_feerates(cs: &ChainSnapshot) -> ApiResult<Vec<(f64, u64)>> {
    let index = cs.index();
    let tip = index.tip_height();
    let mut rates = Vec::new();
    for h in tip.saturating_sub(FEE_WINDOW_BLOCKS - 1).max(1)..=tip {
        let Some(e) = index.active_at(h) else {
            continue;
        };
        let block = load_block(cs, e)?;
        let spent = block_spent(cs, e)?;
        let mut inputs: std::collections::HashMap<bitcoin::Txid, u64> = Default::default();
        for s in &spent {
            *inputs.entry(s.txid).or_default() += s.coin.value.to_sat();
        }
        for tx in block.txdata.iter().skip(1) {
            let out: u64 = tx.output.iter().map(|o| o.value.to_sat()).sum();
            let fee = inputs
                .get(&tx.compute_txid())
                .copied()
                .unwrap_or(0)
                .saturating_sub(out);
            let vsize = tx.vsize() as u64;
            rates.push((fee as f64 / vsize.max(1) as f64, vsize));
        }
    }
    rates.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(rates)
}

/// The vsize-weighted `p`-th percentile of sorted `rates` (0 = the lowest).
pub fn weighted_percentile(rates: &[(f64, u64)], p: f64) -> Option<f64> {
    let total: u64 = rates.iter().map(|r| r.1).sum();
    let goal = total as f64 * p / 100.0;
    let mut seen = 0u64;
    for &(rate, vsize) in rates {
        seen += vsize;
        if seen as f64 >= goal {
            return Some(rate);
        }
    }
    rates.last().map(|r| r.0)
}

/// The estimate of every target in [`TARGETS`], sat/vB: the backlog's
/// projected blocks where it reaches (`projected`, from the mempool), else
/// `history` (sorted (feerate, vsize) of recent blocks), floored at
/// `floor` sat/vB and non-increasing with the target.
pub fn estimates(
    projected: &[ProjectedBlock],
    history: &[(f64, u64)],
    floor: f64,
) -> Vec<(u16, f64)> {
    let mut last = f64::INFINITY;
    TARGETS
        .iter()
        .map(|&t| {
            let i = usize::from(t) - 1;
            // Block t is full when the backlog spills past it.
            let rate = if i + 1 < projected.len() {
                projected[i].min_feerate as f64 / 1000.0
            } else {
                weighted_percentile(history, target_percentile(t)).unwrap_or(floor)
            };
            last = rate.max(floor).min(last);
            (t, (last * 1000.0).round() / 1000.0)
        })
        .collect()
}

/// `GET /fee-estimates`.
pub(super) async fn fee_estimates(State(s): State<AppState>) -> ApiResult<Response> {
    let mempool = super::mempool::snapshot(&s);
    read(&s, move |cs| {
        let history = recent_feerates(cs)?;
        let (projected, floor) = match &mempool {
            Some(m) => (
                project_blocks(&m.pool, PROJECTED_BLOCKS, BLOCK_MAX_VSIZE),
                (m.min_feerate as f64 / 1000.0).max(MIN_FEERATE),
            ),
            None => (Vec::new(), MIN_FEERATE),
        };
        let mut map = serde_json::Map::new();
        for (t, rate) in estimates(&projected, &history, floor) {
            let value = serde_json::Number::from_f64(rate)
                .ok_or_else(|| ApiError::internal(format!("feerate {rate} is not finite")))?;
            map.insert(t.to_string(), serde_json::Value::Number(value));
        }
        Ok(Json(map).into_response())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_weigh_by_vsize_and_targets_decrease() {
        let rates = [(1.0, 100), (5.0, 100), (20.0, 800)];
        assert_eq!(weighted_percentile(&rates, 0.0), Some(1.0));
        assert_eq!(weighted_percentile(&rates, 10.0), Some(1.0));
        assert_eq!(weighted_percentile(&rates, 15.0), Some(5.0));
        assert_eq!(weighted_percentile(&rates, 50.0), Some(20.0));
        assert_eq!(weighted_percentile(&[], 50.0), None);
        let ps: Vec<f64> = TARGETS.iter().map(|&t| target_percentile(t)).collect();
        assert!(ps.windows(2).all(|w| w[0] >= w[1]), "{ps:?}");
        assert_eq!(target_percentile(1), 50.0);
        assert_eq!(target_percentile(1008), 0.0);
    }

    #[test]
    fn the_backlog_sets_the_targets_it_fills_and_history_the_rest() {
        let block = |min_feerate| ProjectedBlock {
            min_feerate,
            ..ProjectedBlock::default()
        };
        // Three projected blocks: 1 and 2 are full (the backlog spills
        // past them), 3 is not.
        let projected = [block(30_000), block(12_000), block(2_000)];
        let history = [(4.0, 100), (8.0, 100)];
        let e: std::collections::HashMap<u16, f64> =
            estimates(&projected, &history, 1.0).into_iter().collect();
        assert_eq!(e[&1], 30.0);
        assert_eq!(e[&2], 12.0);
        // Target 3 on: history (50/3 ≈ 16.7th percentile → 4), capped by
        // the shorter targets, floored at 1 for 144+ only if history is
        // lower.
        assert_eq!(e[&3], 4.0);
        assert_eq!(e[&144], 4.0);
        // Never increasing with the target, never below the floor.
        let all = estimates(&projected, &[(50.0, 1)], 2.5);
        assert!(all.windows(2).all(|w| w[0].1 >= w[1].1), "{all:?}");
        assert!(all.iter().all(|(_, r)| *r >= 2.5));
        assert_eq!(estimates(&[], &[], 1.0)[0], (1, 1.0));
    }
}
