//! Connecting a block: its economic checks against the UTXO table under its
//! branch's view, its scripts, filter and MuHash delta, its index rows, and
//! the durable end of the boundary.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use bitcoin::bip158::{BlockFilter, FilterHeader};
use bitcoin::hashes::Hash;
use bitcoin::{Block, BlockHash, OutPoint, Txid};

use crate::chain::index::{BlockStatus, IndexEntry};
use crate::filters;
use crate::primitives::{BlockId, Coin};
use crate::sozu::{BlockWrite, CommitTag, ViewStatus};
use crate::store::{
    sync_concurrently, WriteBatch, META_FLAT_FILTERS, META_FLAT_SPENT, META_SOZU_LAST,
};
use crate::validation::{self, BlockContext, BlockError};

use super::ahead::Ahead;
use super::group::GroupEntry;
use super::open::flat_pos_bytes;
use super::{address_index, scripts, Chainstate, CheckedUtxos, PipelineError, ValidBlock, Verdict};
use crate::store::spent::encode_spent;

/// What a connect gets besides its block (`pipeline/ahead.rs`).
#[derive(Default)]
pub(super) struct Lookahead {
    /// The block's own validation ahead, if made.
    pub prepared: Option<Ahead>,
    /// The next block, to validate ahead while this one's scripts run.
    pub next: Option<Arc<Block>>,
}

impl Chainstate {
    /// Validates block `entry` against the table under the view of its
    /// parent's branch.
    ///
    /// # Errors
    /// [`PipelineError`] when the table or the index database fails; an
    /// invalid block is a [`Verdict::Invalid`], not an error.
    pub(super) fn validate(
        &mut self,
        block: &Block,
        entry: &IndexEntry,
        parent: BlockId,
    ) -> Result<Verdict, PipelineError> {
        Ok(
            match self.check_utxos(block, entry.height, entry.hash, parent, None)? {
                Ok(checked) => Verdict::Valid(checked.into_valid(entry)),
                Err(e) => Verdict::Invalid(e),
            },
        )
    }

    /// The UTXO checks of `block` (at `height`, hashed `hash`) under the
    /// view of `parent`'s branch: its lookups in the table, then Core's
    /// `ConnectBlock` rules but scripts. `parent_ahead` is `parent` itself
    /// when it is being connected and its table write is neither applied
    /// nor kept yet (a block validated ahead, `pipeline/ahead.rs`): its
    /// write is read from memory and its transactions count as stored.
    ///
    /// # Errors
    /// [`PipelineError`] when the table or the index database fails; an
    /// invalid block is the inner `Err`.
    pub(super) fn check_utxos(
        &mut self,
        block: &Block,
        height: u32,
        hash: BlockHash,
        parent: BlockId,
        parent_ahead: Option<&ValidBlock>,
    ) -> Result<Result<CheckedUtxos, BlockError>, PipelineError> {
        let txids: Vec<Txid> = block.txdata.iter().map(|t| t.compute_txid()).collect();
        let parent_txids = parent_ahead.map(|v| v.txids.as_slice());
        let (keys, seen_before) = self.lookup_keys(block, &txids, parent_txids)?;
        let coins = self.coins_in_view(&keys, parent, parent_ahead.map(|v| &v.write))?;
        // `check_block` already passed when the block was stored
        // (`submit_block`), against the same parent: only the UTXO checks
        // remain.
        let effects = self.with_context(height, hash, parent, |ctx| {
            validation::connect_block(block, ctx, &coins)
        });
        Ok(effects.map(|effects| CheckedUtxos {
            spent: effects.spent.into(),
            created: effects.created,
            txids,
            seen_before,
        }))
    }

    /// Calls `f` with the context of a block at `height`, hashed `hash`,
    /// whose parent is `parent` (its median-time-past and its branch's).
    pub(super) fn with_context<R>(
        &self,
        height: u32,
        hash: BlockHash,
        parent: BlockId,
        f: impl FnOnce(&BlockContext<'_>) -> R,
    ) -> R {
        let ctx = BlockContext {
            params: self.index.params(),
            height,
            block_hash: hash,
            prev_median_time_past: self.index.median_time_past(parent),
            median_time_past_at: &|h| {
                self.index
                    .ancestor(parent, h)
                    .map(|a| self.index.median_time_past(a.id))
            },
        };
        f(&ctx)
    }

    /// The outpoints to look up in the UTXO table for `block` (whose
    /// transaction ids are `txids`, in block order): every input's
    /// outpoint not created in the block itself, and the outputs of every
    /// transaction whose txid was seen before (BIP30 candidates). Also
    /// returns those txids: the outputs of every other transaction are
    /// known absent from the table (proof of absence: BIP34 makes txids
    /// unique; a txid prefix shared with another transaction only adds
    /// keys the table answers exactly). `parent_txids`: the transactions
    /// of a parent not yet in the open group nor stored (validated ahead).
    ///
    /// # Errors
    /// [`PipelineError::Store`] when the index database fails.
    fn lookup_keys(
        &self,
        block: &Block,
        txids: &[Txid],
        parent_txids: Option<&[Txid]>,
    ) -> Result<(Vec<OutPoint>, HashSet<Txid>), PipelineError> {
        let in_block: HashSet<&Txid> = txids.iter().collect();
        let mut keys: Vec<OutPoint> = Vec::new();
        for tx in block.txdata.iter().skip(1) {
            for input in &tx.input {
                if !in_block.contains(&input.previous_output.txid) {
                    keys.push(input.previous_output);
                }
            }
        }
        let in_parent: HashSet<&Txid> = parent_txids.into_iter().flatten().collect();
        let mut seen_before = HashSet::new();
        for (tx, txid) in block.txdata.iter().zip(txids) {
            let in_group = self.group.as_ref().is_some_and(|g| g.has_tx(txid));
            if in_group || in_parent.contains(txid) || self.store.tx_maybe_known(txid)? {
                seen_before.insert(*txid);
                for vout in 0..tx.output.len() as u32 {
                    keys.push(OutPoint { txid: *txid, vout });
                }
            }
        }
        Ok((keys, seen_before))
    }

    /// The coins of `keys` unspent in the view of `parent`'s branch, each
    /// with its creation height on that branch. `parent_write`: `parent`'s
    /// own table write when it is neither applied nor kept yet (read from
    /// memory, as a kept write is).
    ///
    /// # Errors
    /// [`PipelineError::Sozu`] when the UTXO table fails.
    fn coins_in_view(
        &mut self,
        keys: &[OutPoint],
        parent: BlockId,
        parent_write: Option<&BlockWrite>,
    ) -> Result<HashMap<OutPoint, Coin>, PipelineError> {
        // The open group's last block, not yet written to the table, is
        // `parent` itself (its write is read from memory below) or is
        // written now.
        if parent_write.is_some() || self.unwritten.as_ref().is_some_and(|w| w.block != parent) {
            self.write_unwritten()?;
        }
        let entries = self.table.get_batch(keys)?;
        let view = self.index.view(parent);
        let mut coins = HashMap::with_capacity(keys.len());
        for e in entries.into_iter().flatten() {
            if let ViewStatus::Unspent = e.status_in(&view) {
                let height = e.creation_height_in(&view).unwrap_or(e.coin.height);
                let coin = Coin {
                    height,
                    ..e.coin.clone()
                };
                coins.insert(e.outpoint, coin);
            }
        }
        if let Some(write) = parent_write.or(self.unwritten.as_ref()) {
            unwritten_coins(&mut coins, keys, write);
        }
        Ok(coins)
    }

    /// Connects the stored block `id` (whose parent is the active tip).
    /// Returns false if the block is invalid (it is then marked so).
    ///
    /// `block` is the block when the caller has it decoded (else it is read
    /// back from the block files); `batch` holds index rows to commit with
    /// this block boundary (the block's storage record when it is stored
    /// and connected in one commit: its bytes, appended to the block files,
    /// are synced with the filter and spent-output files before the index
    /// commit that points to them); `ahead`: this block's validation ahead
    /// and the next block to validate ahead (`pipeline/ahead.rs`).
    pub(super) fn connect(
        &mut self,
        id: BlockId,
        block: Option<&Arc<Block>>,
        mut batch: WriteBatch,
        ahead: Lookahead,
    ) -> Result<bool, PipelineError> {
        let entry = self
            .index
            .get(id)
            .cloned()
            .ok_or_else(|| PipelineError::Inconsistent {
                reason: format!("block id {} not in index", id.0),
            })?;
        let parent = entry.prev.unwrap_or(BlockId(0));
        // Shared with the script threads.
        let block = match block {
            Some(b) => Arc::clone(b),
            None => Arc::new(self.current().read_block(id)?.ok_or_else(|| {
                PipelineError::Inconsistent {
                    reason: format!("block {} has no data", entry.hash),
                }
            })?),
        };
        let started = Instant::now();
        let prepared = ahead.prepared.and_then(|a| self.take_prepared(a, parent));
        let (valid, work) = match prepared {
            Some(p) => {
                self.stats.blocks_validated_ahead += 1;
                (p.checked.into_valid(&entry), Some(p.work))
            }
            None => match self.validate(&block, &entry, parent)? {
                Verdict::Valid(v) => (v, None),
                Verdict::Invalid(e) => {
                    return self.reject_connecting(id, &entry, e.reject_reason(), &e, batch)
                }
            },
        };
        // Economic checks passed: now the scripts, filter and MuHash
        // delta. Nothing is written before the scripts' verdict.
        let next = ahead.next.as_ref();
        let (filter, delta) = match self.scripts_filter_delta(&block, &entry, &valid, work, next) {
            Ok(scripts::ScriptsOutcome::Passed { filter, delta }) => (filter, *delta),
            Ok(scripts::ScriptsOutcome::Failed(e)) => {
                // The next block, validated ahead on this one, goes too.
                self.ahead = None;
                let reason = e
                    .reject_reason()
                    .unwrap_or(validation::script::BLOCK_SCRIPT_FAILURE);
                return self.reject_connecting(id, &entry, reason, &e, batch);
            }
            Err(e @ PipelineError::ScriptEngine { .. }) => return Err(self.stop_writes(e)),
            Err(e) => return Err(e),
        };
        self.append_block_files(id, parent, &filter, &valid)?;
        self.muhash_to(&mut batch, id, Some((id, &delta)))?;
        self.index.set_status(id, BlockStatus::Valid);
        self.set_active(&mut batch, id);
        self.put_record(&mut batch, id);
        self.put_block_rows(&mut batch, &block, &entry, &valid);
        let grouped = self.end_boundary(batch, &entry, valid, started)?;
        self.stats.blocks_connected += 1;
        tracing::info!(
            height = entry.height,
            block_hash = %entry.hash,
            txs = block.txdata.len(),
            ms = started.elapsed().as_millis() as u64,
            grouped,
            "connected block"
        );
        if !grouped {
            self.seal_final_epochs()?;
            self.publish();
        }
        Ok(true)
    }

    /// Appends valid block `id`'s filter and spent outputs to their flat
    /// files (synced at the boundary, before the index commit that points
    /// to them) and sets its metadata: their locations, its filter header
    /// (BIP-157, chained on `parent`'s), the UTXO count and total amount
    /// (sats) after it.
    ///
    /// # Errors
    /// [`PipelineError`] when a flat file or a read of genesis's filter
    /// fails.
    fn append_block_files(
        &mut self,
        id: BlockId,
        parent: BlockId,
        filter: &BlockFilter,
        valid: &ValidBlock,
    ) -> Result<(), PipelineError> {
        let stored = FilterHeader::from_byte_array(self.meta[parent.0 as usize].filter_header);
        let prev_header = if parent == BlockId(0) {
            self.current()
                .filter(BlockId(0))?
                .map_or(stored, |(_, h)| h)
        } else {
            stored
        };
        let header = filters::filter_header(filter, &prev_header);
        let filter_loc = self.filters.append(&filter.content)?;
        let spent_loc = self.spent.append(&encode_spent(&valid.spent))?;
        let (created, spent) = (&valid.created, &valid.spent);
        let pm = &self.meta[parent.0 as usize];
        let created_value: u64 = created.iter().map(|(_, c)| c.value.to_sat()).sum();
        let spent_value: u64 = spent.iter().map(|s| s.coin.value.to_sat()).sum();
        let txouts = (pm.txouts + created.len() as u64).saturating_sub(spent.len() as u64);
        let total = (pm.total_sats + created_value).saturating_sub(spent_value);
        let m = &mut self.meta[id.0 as usize];
        m.filter = Some(filter_loc);
        m.spent = Some(spent_loc);
        m.filter_header = header.to_byte_array();
        m.txouts = txouts;
        m.total_sats = total;
        Ok(())
    }

    /// Puts valid block `entry`'s index rows in `batch`: its transactions,
    /// the outpoints it spends, its address-index rows (when written), and
    /// the flat files' new lengths and the table's last block.
    fn put_block_rows(
        &self,
        batch: &mut WriteBatch,
        block: &Block,
        entry: &IndexEntry,
        valid: &ValidBlock,
    ) {
        let id = entry.id;
        for (pos, txid) in valid.txids.iter().enumerate() {
            batch.put_tx(txid, id, pos as u32);
        }
        for s in valid.spent.iter() {
            batch.put_spend(&s.outpoint, id);
        }
        if self.address_index.write {
            let at = (id, entry.height);
            address_index::put_block_rows(batch, block, &valid.txids, at, &valid.spent);
        }
        batch.put_meta(META_FLAT_FILTERS, &flat_pos_bytes(self.filters.position()));
        batch.put_meta(META_FLAT_SPENT, &flat_pos_bytes(self.spent.position()));
        batch.put_meta(META_SOZU_LAST, &id.0.to_be_bytes());
    }

    /// Ends valid block `entry`'s boundary: adds it to the open group
    /// (while catching up) or makes it durable now. Returns whether it was
    /// grouped.
    ///
    /// # Errors
    /// Storage failure: writes stop ([`PipelineError::Failed`]).
    fn end_boundary(
        &mut self,
        mut batch: WriteBatch,
        entry: &IndexEntry,
        valid: ValidBlock,
        started: Instant,
    ) -> Result<bool, PipelineError> {
        let id = entry.id;
        let tag = CommitTag {
            block: id,
            height: entry.height,
            block_hash: entry.hash.to_byte_array(),
        };
        let bytes = self.meta[id.0 as usize]
            .data
            .map_or(0, |l| u64::from(l.len));
        let grouped = self.joins_group(entry.header.time, bytes, started);
        if grouped {
            let add = GroupEntry {
                tag,
                bytes,
                started,
                txids: &valid.txids,
            };
            self.add_to_group(batch, valid.write, add)?;
        } else {
            self.put_sozu_base(&mut batch, id);
            self.durable_connect(batch, &valid.write, tag)?;
        }
        Ok(grouped)
    }

    /// The durable end of a connect (of the block alone, or of the group it
    /// closes): flat files synced together, then the index batch, on a
    /// helper thread, while this one applies `write` to the UTXO table in
    /// memory (`write_block` is not durable: nothing of it reaches the disk
    /// before the table's commit); then the table's commit of `tag`.
    ///
    /// # Errors
    /// Storage failure: writes stop ([`PipelineError::Failed`]), the table
    /// may hold writes the index lacks.
    pub(super) fn durable_connect(
        &mut self,
        batch: WriteBatch,
        write: &BlockWrite,
        tag: CommitTag,
    ) -> Result<(), PipelineError> {
        // The open group's last table write and rows first (the index
        // commit below names their blocks as connected).
        self.write_unwritten()?;
        if let Err(e) = self.rows.wait() {
            return Err(self.stop_writes(e.into()));
        }
        let (durable, written) = {
            let (blocks, filters, spent_files, store) = (
                &mut self.blocks,
                &mut self.filters,
                &mut self.spent,
                &self.store,
            );
            let table = &mut self.table;
            let index = self.index.core();
            let span = tracing::Span::current();
            std::thread::scope(|s| {
                let flat_then_index = s.spawn(move || {
                    span.in_scope(|| -> Result<(), PipelineError> {
                        sync_concurrently(&mut [blocks, filters, spent_files])?;
                        store.commit(batch)?;
                        Ok(())
                    })
                });
                let written = table.write_block(write, index, &mut |_| {});
                let durable = flat_then_index.join().unwrap_or_else(|_| {
                    Err(PipelineError::Inconsistent {
                        reason: "index commit thread panicked".into(),
                    })
                });
                (durable, written)
            })
        };
        if let Err(e) = durable.and_then(|()| written.map_err(PipelineError::from)) {
            // The table holds an uncommitted block the index may lack (or
            // the reverse): refuse further writes; a restart reconciles.
            return Err(self.stop_writes(e));
        }
        // UTXO table last (the index names this block as sozu_last, so a
        // crash before the table's commit is replayed at start-up).
        self.group = None;
        if let Err(e) = self.table.commit(tag) {
            return Err(self.stop_writes(e.into()));
        }
        Ok(())
    }
}

/// Makes `coins` (the coins of `keys` in the view of `write`'s parent, as
/// the table answers without `write`) what the table answers in the view of
/// `write`'s block once `write` is applied: `keys` it creates are added
/// (at its height), those it spends removed.
fn unwritten_coins(coins: &mut HashMap<OutPoint, Coin>, keys: &[OutPoint], write: &BlockWrite) {
    if !write.created.is_empty() {
        let created: HashMap<&OutPoint, &Coin> = write
            .created
            .iter()
            .map(|n| (&n.outpoint, &n.coin))
            .collect();
        for key in keys {
            if let Some(coin) = created.get(key) {
                let coin = Coin {
                    height: write.height,
                    ..(*coin).clone()
                };
                coins.insert(*key, coin);
            }
        }
    }
    for (outpoint, _) in &write.spent {
        coins.remove(outpoint);
    }
}
