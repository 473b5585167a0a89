//! Rows of the address index (tree `history_by_script`): for every script
//! hash (SHA-256 of a scriptPubKey, Esplora's and Electrum's "scripthash"),
//! the outputs that fund it and the inputs that spend them, in chain order.
//!
//! Key (49 bytes, big-endian so byte order is chain order): script hash (32)
//! ‖ height u32 ‖ `BlockId` u32 ‖ position of the transaction in the block
//! u32 ‖ kind u8 (0 funding, 1 spending) ‖ vout or vin u32. Value: the
//! transaction's txid (32) ‖ value in sats u64 (40 bytes, funding), then
//! for a spending row the spent outpoint: txid (32) ‖ vout u32 (76 bytes).
//!
//! Rows are written in the index batch of the block that holds them (the
//! same durable boundary as the block's other rows) and never removed:
//! a row whose block is not the active chain's block at its height is
//! ignored by readers, so a reorg hides the rows of the blocks it leaves at
//! once and shows those of a branch it returns to.

use bitcoin::hashes::Hash;
use bitcoin::{OutPoint, Txid};

use super::{Codec, Store, StoreError};
use crate::primitives::BlockId;

/// Bytes of a history key.
pub const HISTORY_KEY_LEN: usize = 49;

/// Bytes of the key prefix naming one transaction of a script's history:
/// script hash, height, block, position (44).
pub const HISTORY_TX_PREFIX_LEN: usize = 44;

/// Whether a row funds the script (an output) or spends from it (an input).
#[derive(Clone, Copy, PartialEq, Eq, Debug, PartialOrd, Ord)]
pub enum RowKind {
    /// Output `index` of the transaction pays to the script.
    Funding,
    /// Input `index` of the transaction spends an output of the script.
    Spending,
}

/// Key of `history_by_script`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct HistoryKey {
    /// SHA-256 of the scriptPubKey (not reversed).
    pub script_hash: [u8; 32],
    /// Height of the block.
    pub height: u32,
    /// The block.
    pub block: BlockId,
    /// Position of the transaction in the block.
    pub position: u32,
    /// Funding or spending.
    pub kind: RowKind,
    /// Output index (funding) or input index (spending).
    pub index: u32,
}

impl HistoryKey {
    /// The 44-byte prefix naming the transaction (everything up to the
    /// position).
    pub fn tx_prefix(&self) -> Vec<u8> {
        tx_prefix(&self.script_hash, self.height, self.block, self.position)
    }
}

/// The key prefix of one transaction of a script's history (44 bytes).
pub fn tx_prefix(script_hash: &[u8; 32], height: u32, block: BlockId, position: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(HISTORY_KEY_LEN);
    v.extend_from_slice(script_hash);
    v.extend_from_slice(&height.to_be_bytes());
    v.extend_from_slice(&block.0.to_be_bytes());
    v.extend_from_slice(&position.to_be_bytes());
    v
}

impl Codec for HistoryKey {
    fn encode(&self) -> Vec<u8> {
        let mut v = self.tx_prefix();
        v.push(match self.kind {
            RowKind::Funding => 0,
            RowKind::Spending => 1,
        });
        v.extend_from_slice(&self.index.to_be_bytes());
        v
    }
    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != HISTORY_KEY_LEN {
            return None;
        }
        let u = |i: usize| b[i..i + 4].try_into().ok().map(u32::from_be_bytes);
        Some(HistoryKey {
            script_hash: b[..32].try_into().ok()?,
            height: u(32)?,
            block: BlockId(u(36)?),
            position: u(40)?,
            kind: match b[44] {
                0 => RowKind::Funding,
                1 => RowKind::Spending,
                _ => return None,
            },
            index: u(45)?,
        })
    }
}

/// Value of `history_by_script`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct HistoryValue {
    /// The transaction of the row.
    pub txid: Txid,
    /// Value of the output funded or spent, sats.
    pub value: u64,
    /// For a spending row, the outpoint it spends.
    pub spends: Option<OutPoint>,
}

impl Codec for HistoryValue {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(76);
        v.extend_from_slice(self.txid.as_byte_array());
        v.extend_from_slice(&self.value.to_be_bytes());
        if let Some(o) = self.spends {
            v.extend_from_slice(o.txid.as_byte_array());
            v.extend_from_slice(&o.vout.to_be_bytes());
        }
        v
    }
    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != 40 && b.len() != 76 {
            return None;
        }
        let spends = if b.len() == 76 {
            Some(OutPoint {
                txid: Txid::from_byte_array(b[40..72].try_into().ok()?),
                vout: u32::from_be_bytes(b[72..76].try_into().ok()?),
            })
        } else {
            None
        };
        Some(HistoryValue {
            txid: Txid::from_byte_array(b[..32].try_into().ok()?),
            value: u64::from_be_bytes(b[32..40].try_into().ok()?),
            spends,
        })
    }
}

impl Store {
    /// Calls `f` with the rows of `script_hash`, newest first (descending
    /// key order), starting below the key prefix `below` (exclusive; `None`:
    /// from the newest row) until `f` returns false. Rows of every stored
    /// block are given: the caller filters them by its active chain.
    ///
    /// # Errors
    /// [`StoreError::Read`] (sled failure, damaged files), or
    /// [`StoreError::Corrupt`] for a row that does not decode.
    pub fn history_rev(
        &self,
        script_hash: &[u8; 32],
        below: Option<&[u8]>,
        f: &mut dyn FnMut(HistoryKey, HistoryValue) -> bool,
    ) -> Result<(), StoreError> {
        let typed = &self.trees.history_by_script;
        let tree = &typed.tree;
        let rows: Box<dyn DoubleEndedIterator<Item = sled::Result<(sled::IVec, sled::IVec)>>> =
            match below {
                None => Box::new(tree.scan_prefix(script_hash)),
                Some(end) => Box::new(tree.range(script_hash.to_vec()..end.to_vec())),
            };
        for item in rows.rev() {
            let (k, v) = item.map_err(|e| typed.read_err(e))?;
            let (key, value) = typed.decode_entry(&k, &v)?;
            if !f(key, value) {
                break;
            }
        }
        Ok(())
    }

    /// Whether the address index has a row starting with `prefix` (e.g.
    /// [`tx_prefix`]: the transaction touches the script in that block).
    ///
    /// # Errors
    /// sled failure.
    pub fn history_has_prefix(&self, prefix: &[u8]) -> Result<bool, StoreError> {
        self.trees.history_by_script.has_prefix(prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_round_trip_and_sort_in_chain_order() {
        let key = |height, position, kind, index| HistoryKey {
            script_hash: [7; 32],
            height,
            block: BlockId(height + 3),
            position,
            kind,
            index,
        };
        let keys = [
            key(1, 0, RowKind::Funding, 5),
            key(1, 2, RowKind::Funding, 0),
            key(1, 2, RowKind::Spending, 0),
            key(256, 0, RowKind::Funding, 0),
        ];
        for pair in keys.windows(2) {
            assert!(pair[0].encode() < pair[1].encode(), "{pair:?}");
        }
        for k in keys {
            assert_eq!(HistoryKey::decode(&k.encode()), Some(k));
            assert_eq!(k.encode().len(), HISTORY_KEY_LEN);
            assert!(k.encode().starts_with(&k.tx_prefix()));
        }
        let txid = Txid::from_byte_array([9; 32]);
        let funding = HistoryValue {
            txid,
            value: 5_000,
            spends: None,
        };
        let spending = HistoryValue {
            txid,
            value: 1,
            spends: Some(OutPoint { txid, vout: 3 }),
        };
        for v in [funding, spending] {
            assert_eq!(HistoryValue::decode(&v.encode()), Some(v));
        }
        assert_eq!(HistoryValue::decode(&[0; 41]), None);
        let mut bad = keys[0].encode();
        bad[44] = 2;
        assert_eq!(HistoryKey::decode(&bad), None);
    }
}
