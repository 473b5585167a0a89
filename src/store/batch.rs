//! Changes made durable together: [`WriteBatch`] (sled trees and index
//! rows) and the rows taken out of it for the rows thread ([`RowBatch`]).

use bitcoin::{OutPoint, Txid};

use super::records::{txid_prefix, SpendRowKey, TxRowKey};
use super::{runs, BlockRecord, Codec, HistoryKey};
use crate::primitives::BlockId;

/// A set of changes made durable together ([`Store::commit`](super::Store::commit)); `#[must_use]`
/// so a batch is never silently dropped.
#[must_use]
#[derive(Default)]
pub struct WriteBatch {
    pub(super) meta: sled::Batch,
    pub(super) blocks: sled::Batch,
    pub(super) by_height: sled::Batch,
    pub(super) txs: Vec<[u8; runs::TX_KEY]>,
    pub(super) spends: Vec<[u8; runs::SPEND_KEY]>,
    pub(super) history: Vec<[u8; runs::HISTORY_KEY]>,
}

impl WriteBatch {
    /// Sets a metadata value.
    pub fn put_meta(&mut self, name: &str, value: &[u8]) {
        self.meta.insert(name.as_bytes(), value);
    }
    /// Removes a metadata value.
    pub fn remove_meta(&mut self, name: &str) {
        self.meta.remove(name.as_bytes());
    }
    /// Writes a block record.
    pub fn put_block(&mut self, id: BlockId, record: &BlockRecord) {
        self.blocks.insert(id.encode(), record.encode());
    }
    /// Sets the active chain's block at `height`.
    pub fn put_active(&mut self, height: u32, id: BlockId) {
        self.by_height.insert(height.encode(), id.encode());
    }
    /// Removes the active chain's block at `height` (after a reorg to a
    /// shorter chain).
    pub fn remove_active(&mut self, height: u32) {
        self.by_height.remove(height.encode());
    }
    /// Records that `txid` is at `position` in `block`.
    pub fn put_tx(&mut self, txid: &Txid, block: BlockId, position: u32) {
        let key = TxRowKey {
            prefix: txid_prefix(txid),
            block,
            position,
        };
        self.txs.push(key.to_bytes());
    }
    /// Records that `block` spends `outpoint` (the spender is in the
    /// block's spent-output record).
    pub fn put_spend(&mut self, outpoint: &OutPoint, block: BlockId) {
        let key = SpendRowKey {
            prefix: txid_prefix(&outpoint.txid),
            vout: outpoint.vout,
            block,
        };
        self.spends.push(key.to_bytes());
    }
    /// Writes one row of the address index (callers give each key once).
    pub fn put_history(&mut self, key: &HistoryKey) {
        self.history.push(key.to_bytes());
    }
    /// Rows of the address index this batch writes.
    pub fn history_rows(&self) -> usize {
        self.history.len()
    }
    /// Takes this batch's index rows (transactions, spends, address
    /// history) out of it, to be applied ahead of the batch's commit with
    /// [`Store::apply_rows`](super::Store::apply_rows); the metadata, block records and active chain
    /// stay.
    pub fn take_rows(&mut self) -> RowBatch {
        RowBatch {
            txs: std::mem::take(&mut self.txs),
            spends: std::mem::take(&mut self.spends),
            history: std::mem::take(&mut self.history),
        }
    }
}

/// The index rows of a [`WriteBatch`] (transaction, spend and address
/// history rows), taken out with [`WriteBatch::take_rows`]. Rows of blocks
/// that are not connected are ignored by every reader (format 3.0), so
/// they may reach the database before the commit of their block, in any
/// order with it.
#[must_use]
#[derive(Default)]
pub struct RowBatch {
    pub(super) txs: Vec<[u8; runs::TX_KEY]>,
    pub(super) spends: Vec<[u8; runs::SPEND_KEY]>,
    pub(super) history: Vec<[u8; runs::HISTORY_KEY]>,
}

impl RowBatch {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.txs.len() + self.spends.len() + self.history.len()
    }
    /// Whether it holds no row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
