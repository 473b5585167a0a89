//! Reads of the address index (`store::history`) on a snapshot: a script's
//! transactions newest first, paged, and its totals and unspent outputs.
//! Every row is filtered through the snapshot's active chain (its block
//! must be the active block at its height), so rows of stale blocks and of
//! blocks committed after the snapshot are invisible.

use std::collections::HashSet;

use bitcoin::{OutPoint, Txid};

use super::ChainSnapshot;
use crate::pipeline::PipelineError;
use crate::primitives::BlockId;
use crate::store::history::tx_prefix;
use crate::store::{HistoryKey, RowKind};

/// One transaction of a script's history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryTx {
    /// The transaction.
    pub txid: Txid,
    /// The active block holding it.
    pub block: BlockId,
    /// That block's height.
    pub height: u32,
    /// Its position in the block.
    pub position: u32,
}

/// Totals of a script on the active chain (Esplora's `chain_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ScriptStats {
    /// Outputs paying to the script.
    pub funded_txo_count: u64,
    /// Their total, sats.
    pub funded_txo_sum: u64,
    /// Those outputs spent.
    pub spent_txo_count: u64,
    /// Their total, sats.
    pub spent_txo_sum: u64,
    /// Transactions funding or spending from the script.
    pub tx_count: u64,
}

/// An unspent output of a script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScriptUtxo {
    /// The output.
    pub outpoint: OutPoint,
    /// Its value, sats.
    pub value: u64,
    /// The active block that created it.
    pub block: BlockId,
    /// That block's height.
    pub height: u32,
}

impl ChainSnapshot {
    /// Whether the address index may be read: complete, and written by the
    /// node for every block it connects (off with `--no-address-index`, or
    /// while it is being built).
    pub fn address_index(&self) -> bool {
        self.address_index
    }

    fn row_active(&self, k: &HistoryKey) -> bool {
        self.index
            .active_at(k.height)
            .is_some_and(|e| e.id == k.block)
    }

    /// Up to `limit` transactions funding or spending from the script
    /// `script_hash`, newest first (by height, then position in the block,
    /// descending), starting after the transaction `after` (Esplora's
    /// `last_seen_txid`); empty when `after` is not an active transaction
    /// of this script's history (as Esplora).
    ///
    /// # Errors
    /// Store failures.
    pub fn script_txs(
        &self,
        script_hash: &[u8; 32],
        after: Option<&Txid>,
        limit: usize,
    ) -> Result<Vec<HistoryTx>, PipelineError> {
        let below = match after {
            None => None,
            Some(txid) => {
                let located = self.tx_blocks(txid)?.into_iter().find_map(|(id, pos)| {
                    let e = self.index.get(id).filter(|_| self.index.is_active(id))?;
                    Some(tx_prefix(script_hash, e.height, id, pos))
                });
                match located {
                    Some(p) if self.store.history_has_prefix(&p)? => Some(p),
                    _ => return Ok(Vec::new()),
                }
            }
        };
        let mut out: Vec<HistoryTx> = Vec::new();
        self.store
            .history_rev(script_hash, below.as_deref(), &mut |k, v| {
                if !self.row_active(&k) {
                    return true;
                }
                let same = out
                    .last()
                    .is_some_and(|t| t.block == k.block && t.position == k.position);
                if same {
                    return true;
                }
                if out.len() == limit {
                    return false;
                }
                out.push(HistoryTx {
                    txid: v.txid,
                    block: k.block,
                    height: k.height,
                    position: k.position,
                });
                true
            })?;
        Ok(out)
    }

    /// The totals of the script `script_hash` on the active chain and its
    /// unspent outputs, newest first.
    ///
    /// # Errors
    /// Store failures.
    pub fn script_summary(
        &self,
        script_hash: &[u8; 32],
    ) -> Result<(ScriptStats, Vec<ScriptUtxo>), PipelineError> {
        let mut stats = ScriptStats::default();
        let mut txs: HashSet<(BlockId, u32)> = HashSet::new();
        let mut funded: Vec<ScriptUtxo> = Vec::new();
        let mut spent: HashSet<OutPoint> = HashSet::new();
        self.store.history_rev(script_hash, None, &mut |k, v| {
            if !self.row_active(&k) {
                return true;
            }
            txs.insert((k.block, k.position));
            match (k.kind, v.spends) {
                (RowKind::Spending, Some(outpoint)) => {
                    stats.spent_txo_count += 1;
                    stats.spent_txo_sum += v.value;
                    spent.insert(outpoint);
                }
                _ => {
                    stats.funded_txo_count += 1;
                    stats.funded_txo_sum += v.value;
                    funded.push(ScriptUtxo {
                        outpoint: OutPoint {
                            txid: v.txid,
                            vout: k.index,
                        },
                        value: v.value,
                        block: k.block,
                        height: k.height,
                    });
                }
            }
            true
        })?;
        stats.tx_count = txs.len() as u64;
        funded.retain(|u| !spent.contains(&u.outpoint));
        Ok((stats, funded))
    }
}
