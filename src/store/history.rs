//! Rows of the address index (tree `history_by_script_prefix`): for every
//! script hash (SHA-256 of a scriptPubKey, Esplora's and Electrum's
//! "scripthash"), the transactions that fund it or spend from it, in chain
//! order.
//!
//! Key (20 bytes, big-endian so byte order is chain order; value empty):
//! the script hash's first 8 bytes ‖ height u32 ‖ `BlockId` u32 ‖ position
//! of the transaction in the block u32. One row per (script, transaction):
//! a transaction with two outputs to one script, or spending two of its
//! outputs, has one row. Nothing else is stored (electrs's layout): the
//! txid, the outputs funded, their values and the outpoints spent are read
//! back from the stored block and the block's spent-output record, and a
//! reader checks the full script hash of every output and spent output of
//! the transaction, so a row of another script sharing the 8-byte prefix
//! (or a row left by a block that was never recorded under its id) yields
//! nothing.
//!
//! Rows are written with the rows of the block that holds them and never
//! removed: a row whose block is not the active chain's block at its
//! height is ignored by readers, so a reorg hides the rows of the blocks it
//! leaves at once and shows those of a branch it returns to.

use super::{Codec, Store, StoreError};
use crate::primitives::BlockId;

/// Leading bytes of a script hash kept in the keys: 8 bytes tell 10⁸
/// scripts apart but for about one pair in 2³⁷; a row is a candidate the
/// reader checks against the full script hash.
pub const SCRIPT_PREFIX_LEN: usize = 8;

/// Bytes of a history key: script prefix, height, block, position (20).
pub const HISTORY_KEY_LEN: usize = SCRIPT_PREFIX_LEN + 12;

/// The first [`SCRIPT_PREFIX_LEN`] bytes of `script_hash`.
pub fn script_prefix(script_hash: &[u8; 32]) -> [u8; SCRIPT_PREFIX_LEN] {
    let mut p = [0u8; SCRIPT_PREFIX_LEN];
    p.copy_from_slice(&script_hash[..SCRIPT_PREFIX_LEN]);
    p
}

/// Key of `history_by_script_prefix`: a transaction that may fund or spend
/// from every script whose hash starts with `prefix`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, PartialOrd, Ord, Hash)]
pub struct HistoryKey {
    /// [`script_prefix`] of the script hash.
    pub prefix: [u8; SCRIPT_PREFIX_LEN],
    /// Height of the block.
    pub height: u32,
    /// The block.
    pub block: BlockId,
    /// Position of the transaction in the block.
    pub position: u32,
}

impl HistoryKey {
    /// The 20-byte key.
    pub fn to_bytes(&self) -> [u8; HISTORY_KEY_LEN] {
        let mut k = [0u8; HISTORY_KEY_LEN];
        k[..SCRIPT_PREFIX_LEN].copy_from_slice(&self.prefix);
        k[8..12].copy_from_slice(&self.height.to_be_bytes());
        k[12..16].copy_from_slice(&self.block.0.to_be_bytes());
        k[16..].copy_from_slice(&self.position.to_be_bytes());
        k
    }

    /// The key of `bytes` (every 20 bytes are one).
    pub fn from_bytes(b: &[u8; HISTORY_KEY_LEN]) -> HistoryKey {
        let u = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut prefix = [0u8; SCRIPT_PREFIX_LEN];
        prefix.copy_from_slice(&b[..SCRIPT_PREFIX_LEN]);
        HistoryKey {
            prefix,
            height: u(8),
            block: BlockId(u(12)),
            position: u(16),
        }
    }
}

impl Codec for HistoryKey {
    fn encode(&self) -> Vec<u8> {
        self.to_bytes().to_vec()
    }
    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != HISTORY_KEY_LEN {
            return None;
        }
        let u = |i: usize| b[i..i + 4].try_into().ok().map(u32::from_be_bytes);
        Some(HistoryKey {
            prefix: b[..SCRIPT_PREFIX_LEN].try_into().ok()?,
            height: u(SCRIPT_PREFIX_LEN)?,
            block: BlockId(u(SCRIPT_PREFIX_LEN + 4)?),
            position: u(SCRIPT_PREFIX_LEN + 8)?,
        })
    }
}

impl Store {
    /// Calls `f` with the rows of the scripts whose hash starts as
    /// `script_hash`'s, newest first (descending key order), starting below
    /// `below` (exclusive; `None`: from the newest row) until `f` returns
    /// false. Rows of every stored block are given: the caller filters them
    /// by its active chain and checks them against the block files.
    ///
    /// # Errors
    /// [`StoreError::Rows`]: a run failed to read or is damaged.
    pub fn history_rev(
        &self,
        script_hash: &[u8; 32],
        below: Option<&HistoryKey>,
        f: &mut dyn FnMut(HistoryKey) -> bool,
    ) -> Result<(), StoreError> {
        let prefix = script_prefix(script_hash);
        let below = below.map(HistoryKey::to_bytes);
        self.rows
            .history()
            .scan_prefix_rev(&prefix, below.as_ref(), &mut |k| {
                f(HistoryKey::from_bytes(k))
            })?;
        Ok(())
    }

    /// Whether the address index has the row `key`.
    ///
    /// # Errors
    /// [`StoreError::Rows`]: a run failed to read or is damaged.
    pub fn history_has(&self, key: &HistoryKey) -> Result<bool, StoreError> {
        Ok(self.rows.history().has_prefix(&key.to_bytes())?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_exact_bytes_and_sort_in_chain_order() {
        let key = |height, position| HistoryKey {
            prefix: [7; 8],
            height,
            block: BlockId(height + 3),
            position,
        };
        let keys = [key(1, 0), key(1, 2), key(256, 0), key(256, 1)];
        for pair in keys.windows(2) {
            assert!(pair[0].encode() < pair[1].encode(), "{pair:?}");
        }
        for k in keys {
            assert_eq!(HistoryKey::decode(&k.encode()), Some(k));
        }
        let k = HistoryKey {
            prefix: [1, 2, 3, 4, 5, 6, 7, 8],
            height: 0x0a0b_0c0d,
            block: BlockId(5),
            position: 0x0100,
        };
        assert_eq!(
            k.encode(),
            [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 0, 0, 0, 5, 0, 0, 1, 0]
        );
        assert_eq!(HistoryKey::decode(&k.encode()[..19]), None);
        let mut hash = [9u8; 32];
        hash[..8].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(script_prefix(&hash), k.prefix);
    }
}
