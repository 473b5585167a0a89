//! Reads of the address index (`store::history`) on a snapshot: a script's
//! transactions newest first, paged, and its totals and unspent outputs.
//! Every row is filtered through the snapshot's active chain (its block
//! must be the active block at its height), so rows of stale blocks and of
//! blocks committed after the snapshot are invisible; then checked against
//! the stored transaction and its inputs' coins ([`TxReader`]): the row
//! only names a script-hash prefix, and the transaction must fund or spend
//! from the script's full hash to count. A row costs one transaction's
//! decode and hash, one txid-index lookup and a walk over its block's
//! spent-output record, not its whole block's decode and hashes: a
//! script's first totals read thousands of rows.

use std::collections::HashSet;

use bitcoin::{Block, OutPoint, Transaction, Txid};

use super::block_txs::BlockTxs;
use super::{ChainSnapshot, ReadError};
use crate::primitives::{script_hash, BlockId};
use crate::store::history::script_prefix;
use crate::store::{HistoryKey, SpentRecord};
use crate::validation::SpentOutput;

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

/// A script's totals and unspent outputs as of an active block
/// ([`ChainSnapshot::script_summary_since`]): 56 bytes per unspent output
/// held (`size_of::<ScriptUtxo>()` on 64-bit targets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScriptSummary {
    /// The active tip it was computed at.
    pub block: BlockId,
    /// That block's height.
    pub height: u32,
    /// The totals up to that block.
    pub stats: ScriptStats,
    /// The unspent outputs at that block, newest first.
    pub utxos: Vec<ScriptUtxo>,
}

/// What one transaction does to a script, read from the files.
struct TxMatch {
    txid: Txid,
    /// Outputs paying to the script: (vout, sats), in output order.
    funded: Vec<(u32, u64)>,
    /// Outputs of the script it spends: (outpoint, sats), in input order.
    spent: Vec<(OutPoint, u64)>,
    /// Every output it spends (its inputs' coins), in input order; empty
    /// for a coinbase.
    prevouts: Vec<SpentOutput>,
}

/// Checks rows of one script against the stored blocks, reading only the
/// row's transaction and its inputs' coins (`block_txs`,
/// [`SpentRecord::range`]), and keeping the last block's bytes and
/// spent-output record (a script's rows come grouped by block).
struct TxReader<'a> {
    cs: &'a ChainSnapshot,
    script_hash: [u8; 32],
    /// The last block read, and its spent-output record once a
    /// non-coinbase transaction of it was checked.
    block: Option<(BlockId, BlockTxs, Option<SpentRecord>)>,
}

impl<'a> TxReader<'a> {
    fn new(cs: &'a ChainSnapshot, script_hash: &[u8; 32]) -> Self {
        TxReader {
            cs,
            script_hash: *script_hash,
            block: None,
        }
    }

    /// The outputs of the script that the transaction of row `k` funds and
    /// spends; `None` when it does neither (a row of another script with
    /// the same prefix, or of another block once given the same id).
    ///
    /// The transaction is decoded from its own bytes, and its txid must be
    /// the one the txid index (`tx_by_txid_prefix`, written with the block)
    /// records at its place: a damaged block file fails here instead of
    /// feeding an answer. Its inputs' coins come from the block's
    /// spent-output record (checked by its checksum).
    fn check(&mut self, k: &HistoryKey) -> Result<Option<TxMatch>, ReadError> {
        let cs = self.cs;
        if self.block.as_ref().map(|(id, ..)| *id) != Some(k.block) {
            let txs = cs.block_txs(k.block)?.ok_or_else(|| no_data(k))?;
            self.block = Some((k.block, txs, None));
        }
        let Some((_, txs, record)) = &mut self.block else {
            return Ok(None);
        };
        let Some((tx, place)) = txs.tx(k.position)? else {
            return Ok(None);
        };
        let txid = tx.compute_txid();
        if !cs
            .store
            .tx_candidates(&txid)?
            .contains(&(k.block, k.position))
        {
            return Err(txs.corrupt("a transaction does not hash to the txid indexed at its place"));
        }
        let prevouts = if place.spent == 0 {
            Vec::new()
        } else {
            if record.is_none() {
                *record = Some(cs.spent_record(k.block)?.ok_or_else(|| no_data(k))?);
            }
            let range = place.first_spent..place.first_spent + place.spent;
            let prevouts = record
                .as_ref()
                .and_then(|r| r.range(range))
                .unwrap_or_default();
            // The record's outputs at the transaction's place must be its
            // inputs', in order.
            let inputs = (0..).map(|vin| (txid, vin)).take(place.spent);
            if !prevouts.iter().map(|s| (s.txid, s.vin)).eq(inputs) {
                return Err(no_data(k));
            }
            prevouts
        };
        let ours = |script: &[u8]| script_hash(script) == self.script_hash;
        let funded: Vec<(u32, u64)> = (0u32..)
            .zip(&tx.output)
            .filter(|(_, o)| ours(o.script_pubkey.as_bytes()))
            .map(|(vout, o)| (vout, o.value.to_sat()))
            .collect();
        let spent: Vec<(OutPoint, u64)> = prevouts
            .iter()
            .filter(|s| ours(&s.coin.script_pubkey))
            .map(|s| (s.outpoint, s.coin.value.to_sat()))
            .collect();
        if funded.is_empty() && spent.is_empty() {
            return Ok(None);
        }
        Ok(Some(TxMatch {
            txid,
            funded,
            spent,
            prevouts,
        }))
    }
}

fn no_data(k: &HistoryKey) -> ReadError {
    ReadError::Inconsistent {
        reason: format!(
            "active block {} at height {} lacks its block data or a spent output of its transaction {}",
            k.block.0, k.height, k.position
        ),
    }
}

impl ChainSnapshot {
    /// Whether the address index may be read: complete, and written by the
    /// node for every block it connects (off with `--no-address-index`, or
    /// while it is being built).
    pub fn address_index(&self) -> bool {
        self.address_index
    }

    /// Calls `f` with the rows of `script_hash`'s prefix whose block is the
    /// active block at their height, newest first, below `below`, until it
    /// returns false or fails.
    fn active_rows(
        &self,
        script_hash: &[u8; 32],
        below: Option<&HistoryKey>,
        f: &mut dyn FnMut(&HistoryKey) -> Result<bool, ReadError>,
    ) -> Result<(), ReadError> {
        let mut failed = None;
        self.store.history_rev(script_hash, below, &mut |k| {
            let active = self
                .index
                .active_at(k.height)
                .is_some_and(|e| e.id == k.block);
            if !active {
                return true;
            }
            f(&k).unwrap_or_else(|e| {
                failed = Some(e);
                false
            })
        })?;
        failed.map_or(Ok(()), Err)
    }

    /// The row of the active transaction `txid` in the script's history,
    /// if it funds or spends from the script.
    fn history_row_of(
        &self,
        reader: &mut TxReader<'_>,
        txid: &Txid,
    ) -> Result<Option<HistoryKey>, ReadError> {
        let located = self
            .tx_blocks(txid)?
            .into_iter()
            .find_map(|(id, position)| {
                let e = self.index.get(id).filter(|_| self.index.is_active(id))?;
                Some(HistoryKey {
                    prefix: script_prefix(&reader.script_hash),
                    height: e.height,
                    block: id,
                    position,
                })
            });
        match located {
            Some(k) if self.store.history_has(&k)? && reader.check(&k)?.is_some() => Ok(Some(k)),
            _ => Ok(None),
        }
    }

    /// Up to `limit` transactions funding or spending from the script
    /// `script_hash`, newest first (by height, then position in the block,
    /// descending), starting after the transaction `after` (Esplora's
    /// `last_seen_txid`); empty when `after` is not an active transaction
    /// of this script's history (as Esplora).
    ///
    /// # Errors
    /// Store failures; an active block without its block data or
    /// spent-output record.
    pub fn script_txs(
        &self,
        script_hash: &[u8; 32],
        after: Option<&Txid>,
        limit: usize,
    ) -> Result<Vec<HistoryTx>, ReadError> {
        self.script_txs_with(script_hash, after, limit, |h, _, _| *h)
    }

    /// As [`ChainSnapshot::script_txs`], giving `f` each transaction of
    /// the page, read from its block checked whole as
    /// [`ChainSnapshot::read_block`] checks it, with the outputs it spends
    /// in input order (empty for a coinbase).
    ///
    /// # Errors
    /// As [`ChainSnapshot::script_txs`].
    pub fn script_txs_with<T>(
        &self,
        script_hash: &[u8; 32],
        after: Option<&Txid>,
        limit: usize,
        mut f: impl FnMut(&HistoryTx, &Transaction, &[SpentOutput]) -> T,
    ) -> Result<Vec<T>, ReadError> {
        let mut reader = TxReader::new(self, script_hash);
        let below = match after {
            None => None,
            Some(txid) => match self.history_row_of(&mut reader, txid)? {
                Some(k) => Some(k),
                None => return Ok(Vec::new()),
            },
        };
        let mut out = Vec::new();
        // The transactions answered come from their block checked whole
        // (hash, merkle root, witness commitment), as `/tx` serves them:
        // the txid `check` compares commits to no witness.
        let mut served: Option<(BlockId, Block)> = None;
        self.active_rows(script_hash, below.as_ref(), &mut |k| {
            if out.len() == limit {
                return Ok(false);
            }
            let Some(m) = reader.check(k)? else {
                return Ok(true);
            };
            if served.as_ref().map(|(id, _)| *id) != Some(k.block) {
                let block = self.read_block(k.block)?.ok_or_else(|| no_data(k))?;
                served = Some((k.block, block));
            }
            // The same bytes `check` decoded: no second txid to compare.
            let tx = served
                .as_ref()
                .and_then(|(_, b)| b.txdata.get(k.position as usize))
                .ok_or_else(|| no_data(k))?;
            let h = HistoryTx {
                txid: m.txid,
                block: k.block,
                height: k.height,
                position: k.position,
            };
            out.push(f(&h, tx, &m.prevouts));
            Ok(true)
        })?;
        Ok(out)
    }

    /// The totals of the script `script_hash` on the active chain and its
    /// unspent outputs, newest first (by block, position, then output index,
    /// descending).
    ///
    /// # Errors
    /// As [`ChainSnapshot::script_txs`].
    pub fn script_summary(
        &self,
        script_hash: &[u8; 32],
    ) -> Result<(ScriptStats, Vec<ScriptUtxo>), ReadError> {
        let summary = self.script_summary_since(script_hash, None)?;
        Ok((summary.stats, summary.utxos))
    }

    /// The summary of `script_hash` at this snapshot's tip. With `base`, a
    /// summary of the same script at an earlier block that is still on this
    /// snapshot's active chain, only the rows above `base`'s height are read
    /// (its blocks and spent-output records) and added to it: O(the
    /// script's transactions since then), as electrs's stats and UTXO
    /// caches do. A `base` whose block left the active chain (a reorg), or
    /// that is above this tip, is ignored and the whole history read.
    ///
    /// # Errors
    /// As [`ChainSnapshot::script_txs`].
    pub fn script_summary_since(
        &self,
        script_hash: &[u8; 32],
        base: Option<&ScriptSummary>,
    ) -> Result<ScriptSummary, ReadError> {
        let base = base.filter(|b| {
            self.index
                .active_at(b.height)
                .is_some_and(|e| e.id == b.block)
        });
        let from = base.map(|b| b.height);
        let mut reader = TxReader::new(self, script_hash);
        let mut stats = base.map(|b| b.stats).unwrap_or_default();
        let mut utxos: Vec<ScriptUtxo> = Vec::new();
        let mut spent: HashSet<OutPoint> = HashSet::new();
        self.active_rows(script_hash, None, &mut |k| {
            if from.is_some_and(|h| k.height <= h) {
                return Ok(false);
            }
            let Some(m) = reader.check(k)? else {
                return Ok(true);
            };
            stats.tx_count += 1;
            for &(vout, value) in m.funded.iter().rev() {
                stats.funded_txo_count += 1;
                stats.funded_txo_sum += value;
                utxos.push(ScriptUtxo {
                    outpoint: OutPoint { txid: m.txid, vout },
                    value,
                    block: k.block,
                    height: k.height,
                });
            }
            for (outpoint, value) in m.spent {
                stats.spent_txo_count += 1;
                stats.spent_txo_sum += value;
                spent.insert(outpoint);
            }
            Ok(true)
        })?;
        // Every output of `base` is older than the rows read here: newest
        // first still holds after appending them.
        utxos.extend(base.iter().flat_map(|b| b.utxos.iter().copied()));
        utxos.retain(|u| !spent.contains(&u.outpoint));
        let tip = self.index.tip();
        Ok(ScriptSummary {
            block: tip.id,
            height: tip.height,
            stats,
            utxos,
        })
    }
}
