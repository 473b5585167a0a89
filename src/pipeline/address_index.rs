//! The address index's writer side: the rows of `history_by_script_prefix`
//! (`store::history`) for each connected block, written in the block's own
//! index batch (so durable at the block boundary, or at the end of the
//! group holding the block, with the tip marker), and its build from the
//! block files for a datadir that lacks it.
//!
//! Rows: one row per transaction and script it funds (OP_RETURN outputs
//! excepted: nothing can spend them, and Esplora's electrs does not index
//! them either) or spends from (inputs that are not a coinbase's), keyed by
//! the prefix of the script hash of the scriptPubKey
//! (`primitives::script_hash`); everything else is read back from the block
//! and spent-output files.
//!
//! State (meta key `address_index`, [`META_ADDRESS_INDEX`]): complete, being
//! built up to a height, or absent. Readers use the index only when it is
//! complete and this node writes it ([`ChainSnapshot::address_index`]).
//! Turning it off removes the marker at once, so turning it on again later
//! builds it anew (rows already there are rewritten identically).

use std::collections::HashMap;
use std::time::Instant;

use bitcoin::{Block, Txid};

use super::{Chainstate, PipelineError};
use crate::primitives::{script_hash, BlockId};
use crate::store::history::script_prefix;
use crate::store::{HistoryKey, WriteBatch, META_ADDRESS_INDEX};
use crate::validation::SpentOutput;

/// Blocks per index batch while building the index from the block files
/// (each batch is one durable commit with the build's progress marker).
const BUILD_BATCH_BLOCKS: u32 = 500;

/// Rows per index batch while building, at most (20-byte keys, about 60
/// bytes each in memory before the commit: 12 MiB).
const BUILD_BATCH_ROWS: usize = 200_000;

/// Marker value of a complete index.
const COMPLETE: [u8; 1] = [1];

/// What the writer does with the address index.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AddressIndexState {
    /// Rows are written for every connected block.
    pub(crate) write: bool,
    /// The marker says complete (every active block has its rows).
    pub(crate) complete: bool,
}

/// Progress of [`Chainstate::set_address_index`]'s build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildProgress {
    /// Height of the last block whose rows are committed.
    pub height: u32,
    /// Height of the active tip (the end of the build).
    pub tip_height: u32,
    /// Rows written so far by this build.
    pub rows: u64,
}

/// Adds to `batch` the address-index rows of `block`, connected as `id` at
/// `height`; `txids` are its transactions' ids in order, `spent` the
/// outputs it spends (`validation::connect_block`'s, in any order). One row
/// per (script-hash prefix, transaction): the keys are sorted and
/// deduplicated before they are written.
pub(crate) fn put_block_rows(
    batch: &mut WriteBatch,
    block: &Block,
    txids: &[Txid],
    (id, height): (BlockId, u32),
    spent: &[SpentOutput],
) {
    let key = |script: &[u8], position: usize| HistoryKey {
        prefix: script_prefix(&script_hash(script)),
        height,
        block: id,
        position: position as u32,
    };
    let mut keys: Vec<HistoryKey> = Vec::new();
    for (pos, tx) in block.txdata.iter().enumerate() {
        let scripts = tx.output.iter().map(|o| &o.script_pubkey);
        keys.extend(
            scripts
                .filter(|s| !s.is_op_return())
                .map(|s| key(s.as_bytes(), pos)),
        );
    }
    let positions: HashMap<&Txid, usize> = txids.iter().enumerate().map(|(p, t)| (t, p)).collect();
    for s in spent {
        if let Some(&pos) = positions.get(&s.txid) {
            keys.push(key(&s.coin.script_pubkey, pos));
        }
    }
    keys.sort_unstable();
    keys.dedup();
    for k in &keys {
        batch.put_history(k);
    }
}

/// Decodes the build marker `[0] ‖ next height ‖ block below`.
fn decode_building(v: &[u8]) -> Option<(u32, BlockId)> {
    if v.len() != 9 || v[0] != 0 {
        return None;
    }
    let next = u32::from_be_bytes(v[1..5].try_into().ok()?);
    let below = u32::from_be_bytes(v[5..9].try_into().ok()?);
    Some((next, BlockId(below)))
}

fn encode_building(next: u32, below: BlockId) -> Vec<u8> {
    let mut v = vec![0u8];
    v.extend_from_slice(&next.to_be_bytes());
    v.extend_from_slice(&below.0.to_be_bytes());
    v
}

impl Chainstate {
    /// Reads the index's state at open: the marker says whether it is
    /// complete; rows are written from now on (the default is on).
    pub(super) fn load_address_index(&mut self) -> Result<(), PipelineError> {
        let marker = self.store.meta(META_ADDRESS_INDEX)?;
        self.address_index = AddressIndexState {
            write: true,
            complete: marker.as_deref() == Some(&COMPLETE[..]),
        };
        Ok(())
    }

    /// Turns the address index on or off (`kakehi --no-address-index`).
    ///
    /// Off: no rows are written any more and the marker is removed (one
    /// commit), so the HTTP address routes answer 503 and a later start
    /// with the index on builds it anew. On: when the marker is not
    /// "complete", builds the rows of every active block from the block
    /// and spent-output files, in batches of `BUILD_BATCH_BLOCKS` (500) blocks
    /// each committed with its progress (a build interrupted by a crash
    /// resumes there, or from genesis if a reorg replaced the block below
    /// it), calling `progress` after each batch; then marks it complete and
    /// publishes a snapshot that serves it. Call it with no group open
    /// (right after [`Chainstate::open`]); it flushes one if there is.
    ///
    /// # Errors
    /// Storage failures (the marker then says how far the build got).
    pub fn set_address_index(
        &mut self,
        on: bool,
        progress: &mut dyn FnMut(BuildProgress),
    ) -> Result<(), PipelineError> {
        self.flush()?;
        if !on {
            self.address_index = AddressIndexState {
                write: false,
                complete: false,
            };
            if self.store.meta(META_ADDRESS_INDEX)?.is_some() {
                let mut batch = WriteBatch::default();
                batch.remove_meta(META_ADDRESS_INDEX);
                self.store.commit(batch)?;
            }
            self.publish();
            return Ok(());
        }
        self.address_index.write = true;
        if !self.address_index.complete {
            self.build_address_index(progress)?;
            self.address_index.complete = true;
            self.publish();
        }
        Ok(())
    }

    /// Writes the rows of every active block from the resume point up to
    /// the tip, then the "complete" marker.
    fn build_address_index(
        &mut self,
        progress: &mut dyn FnMut(BuildProgress),
    ) -> Result<(), PipelineError> {
        let snapshot = self.current();
        let index = snapshot.index();
        let tip_height = index.tip_height();
        let marker = self.store.meta(META_ADDRESS_INDEX)?;
        let resume = marker.as_deref().and_then(decode_building);
        let mut height = match resume {
            Some((next, below))
                if next
                    .checked_sub(1)
                    .and_then(|h| index.active_at(h))
                    .map(|e| e.id)
                    == Some(below) =>
            {
                next
            }
            _ => 1,
        };
        let started = Instant::now();
        tracing::info!(
            from = height,
            tip_height,
            "building the address index from the block files"
        );
        let mut rows = 0u64;
        while height <= tip_height {
            let mut batch = WriteBatch::default();
            let end = tip_height.min(height.saturating_add(BUILD_BATCH_BLOCKS - 1));
            let mut last = height;
            for h in height..=end {
                let Some(e) = index.active_at(h) else { break };
                let block = snapshot.read_block(e.id)?.ok_or_else(|| no_data(h))?;
                let spent = snapshot.spent_outputs(e.id)?.ok_or_else(|| no_data(h))?;
                let txids: Vec<Txid> = block.txdata.iter().map(|t| t.compute_txid()).collect();
                put_block_rows(&mut batch, &block, &txids, (e.id, h), &spent);
                last = h;
                if batch.history_rows() >= BUILD_BATCH_ROWS {
                    break;
                }
            }
            rows += batch.history_rows() as u64;
            let below = index.active_at(last).map_or(BlockId(0), |e| e.id);
            batch.put_meta(META_ADDRESS_INDEX, &encode_building(last + 1, below));
            self.store.commit(batch)?;
            progress(BuildProgress {
                height: last,
                tip_height,
                rows,
            });
            height = last + 1;
        }
        let mut batch = WriteBatch::default();
        batch.put_meta(META_ADDRESS_INDEX, &COMPLETE);
        self.store.commit(batch)?;
        tracing::info!(
            rows,
            secs = started.elapsed().as_secs_f64(),
            "address index built"
        );
        Ok(())
    }
}

fn no_data(height: u32) -> PipelineError {
    PipelineError::Inconsistent {
        reason: format!("active block at height {height} has no block data or spent outputs"),
    }
}
