//! Archived leaves: one spent output of a final block, and the tree entries
//! (boundaries + leaves) of a sealed epoch.
//!
//! Byte layouts are given in `docs/archive.md` ("Leaf"); all integers are
//! big-endian, hashes and txids in internal (wire) byte order.

use bitcoin::hashes::Hash;
use bitcoin::{BlockHash, OutPoint, ScriptBuf, Txid};
use serde::{Deserialize, Serialize};

use crate::primitives::{outpoint_key, OutPointKey};

/// Largest scriptPubKey a leaf may carry, in bytes (Core's
/// `MAX_SCRIPT_SIZE`; larger outputs are unspendable and never archived).
pub const MAX_SCRIPT_LEN: usize = 10_000;

/// Size of the fixed part of an encoded [`Leaf`], in bytes: outpoint 36,
/// value 8, creation height 4, spend block hash 32, spend height 4, spending
/// txid 32, input index 4, script length 2.
pub const LEAF_FIXED_LEN: usize = 36 + 8 + 4 + 32 + 4 + 32 + 4 + 2;

/// Largest encoded tree entry ([`TreeEntry::encode`]), in bytes.
pub const MAX_ENTRY_LEN: usize = 5 + LEAF_FIXED_LEN + MAX_SCRIPT_LEN;

/// The spend of an archived output: where and by what it was spent
/// (the spending data of Teranode's UTXO model, plus the block).
#[derive(Clone, PartialEq, Eq, Debug, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spend {
    /// Hash of the (final, best-chain) block holding the spending
    /// transaction (display hex in JSON).
    pub block_hash: BlockHash,
    /// Height of that block.
    pub height: u32,
    /// Txid of the spending transaction (display hex in JSON).
    pub txid: Txid,
    /// Index of the spending input in that transaction.
    pub vin: u32,
}

/// One archived leaf: a spent output of a final block (Stellar
/// CAP-57's archived entry, adapted to Bitcoin).
///
/// Encoded by [`Leaf::to_bytes`] in [`LEAF_FIXED_LEN`] + script bytes.
#[derive(Clone, PartialEq, Eq, Debug, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Leaf {
    /// The spent output (`"txid:vout"` in JSON, txid in display order).
    pub outpoint: OutPoint,
    /// Its value in satoshis.
    pub value: u64,
    /// Its scriptPubKey (hex in JSON), at most [`MAX_SCRIPT_LEN`] bytes.
    pub script_pubkey: ScriptBuf,
    /// Height of the block that created it.
    pub creation_height: u32,
    /// The spend.
    pub spend: Spend,
}

/// Why bytes do not decode as a leaf or tree entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeafDecodeError {
    /// Fewer bytes than the layout needs.
    #[error("leaf truncated: {len} bytes, need at least {need}")]
    Truncated {
        /// Bytes given.
        len: usize,
        /// Bytes needed.
        need: usize,
    },
    /// Bytes after the end of the leaf.
    #[error("leaf has {extra} trailing bytes")]
    TrailingBytes {
        /// Number of extra bytes.
        extra: usize,
    },
    /// Script longer than [`MAX_SCRIPT_LEN`].
    #[error("leaf script of {len} bytes exceeds {MAX_SCRIPT_LEN}")]
    ScriptTooLong {
        /// Declared script length.
        len: usize,
    },
    /// Unknown entry kind byte.
    #[error("unknown tree entry kind {kind}")]
    BadKind {
        /// The kind byte.
        kind: u8,
    },
}

impl Leaf {
    /// The leaf of `outpoint`, whose output is `coin` (a Sozu table entry's
    /// coin: value, script, creation height), spent by `spend`.
    pub fn from_coin(outpoint: OutPoint, coin: &crate::primitives::Coin, spend: Spend) -> Leaf {
        Leaf {
            outpoint,
            value: coin.value.to_sat(),
            script_pubkey: ScriptBuf::from_bytes(coin.script_pubkey.clone()),
            creation_height: coin.height,
            spend,
        }
    }

    /// The 36-byte sort key of the leaf: txid (internal order) then vout
    /// big-endian (the Sozu key, [`outpoint_key`]).
    pub fn key(&self) -> OutPointKey {
        outpoint_key(&self.outpoint)
    }

    /// Appends the encoding (see `docs/archive.md`, "Leaf") to `out`.
    ///
    /// The script length is written as u16; callers keep scripts within
    /// [`MAX_SCRIPT_LEN`] (seal rejects longer ones), a longer script is
    /// truncated in the length field and would not decode.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.key());
        out.extend_from_slice(&self.value.to_be_bytes());
        out.extend_from_slice(&self.creation_height.to_be_bytes());
        out.extend_from_slice(self.spend.block_hash.as_byte_array());
        out.extend_from_slice(&self.spend.height.to_be_bytes());
        out.extend_from_slice(self.spend.txid.as_byte_array());
        out.extend_from_slice(&self.spend.vin.to_be_bytes());
        let script = self.script_pubkey.as_bytes();
        out.extend_from_slice(&(script.len().min(u16::MAX as usize) as u16).to_be_bytes());
        out.extend_from_slice(script);
    }

    /// The encoding as a new vector ([`LEAF_FIXED_LEN`] + script bytes).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(LEAF_FIXED_LEN + self.script_pubkey.len());
        self.encode_into(&mut out);
        out
    }

    /// Decodes exactly one leaf from `bytes`.
    ///
    /// # Errors
    /// [`LeafDecodeError`] on short input, trailing bytes or an oversized
    /// script.
    pub fn from_bytes(bytes: &[u8]) -> Result<Leaf, LeafDecodeError> {
        let (leaf, used) = Leaf::decode_prefix(bytes)?;
        if used != bytes.len() {
            return Err(LeafDecodeError::TrailingBytes {
                extra: bytes.len() - used,
            });
        }
        Ok(leaf)
    }

    /// Decodes one leaf from the start of `bytes`, returning it and the
    /// number of bytes used.
    fn decode_prefix(bytes: &[u8]) -> Result<(Leaf, usize), LeafDecodeError> {
        if bytes.len() < LEAF_FIXED_LEN {
            return Err(LeafDecodeError::Truncated {
                len: bytes.len(),
                need: LEAF_FIXED_LEN,
            });
        }
        let h32 = |at: usize| {
            let mut a = [0u8; 32];
            a.copy_from_slice(&bytes[at..at + 32]);
            a
        };
        let u32_at = |at: usize| {
            u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let mut v = [0u8; 8];
        v.copy_from_slice(&bytes[36..44]);
        let script_len = u16::from_be_bytes([bytes[120], bytes[121]]) as usize;
        if script_len > MAX_SCRIPT_LEN {
            return Err(LeafDecodeError::ScriptTooLong { len: script_len });
        }
        let need = LEAF_FIXED_LEN + script_len;
        if bytes.len() < need {
            return Err(LeafDecodeError::Truncated {
                len: bytes.len(),
                need,
            });
        }
        let leaf = Leaf {
            outpoint: OutPoint {
                txid: Txid::from_byte_array(h32(0)),
                vout: u32_at(32),
            },
            value: u64::from_be_bytes(v),
            creation_height: u32_at(44),
            spend: Spend {
                block_hash: BlockHash::from_byte_array(h32(48)),
                height: u32_at(80),
                txid: Txid::from_byte_array(h32(84)),
                vin: u32_at(116),
            },
            script_pubkey: ScriptBuf::from_bytes(bytes[LEAF_FIXED_LEN..need].to_vec()),
        };
        Ok((leaf, need))
    }
}

/// One entry of a sealed epoch's sorted leaf list: the lower boundary (index
/// 0), a spent output, or the upper boundary (last index) (Stellar
/// CAP-57's `COLD_ARCHIVE_BOUNDARY_LEAF`).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum TreeEntry {
    /// The lower boundary: sorts before every outpoint.
    LowerBound {
        /// Its index in the tree (always 0).
        index: u32,
    },
    /// A spent output.
    Spent {
        /// Its index in the tree (1..=leaf count - 2).
        index: u32,
        /// The leaf.
        leaf: Leaf,
    },
    /// The upper boundary: sorts after every outpoint.
    UpperBound {
        /// Its index in the tree (always leaf count - 1).
        index: u32,
    },
}

/// Entry kind byte of the lower boundary.
pub const KIND_LOWER: u8 = 0;
/// Entry kind byte of a spent-output leaf.
pub const KIND_SPENT: u8 = 1;
/// Entry kind byte of the upper boundary.
pub const KIND_UPPER: u8 = 2;

impl TreeEntry {
    /// The entry's index in its epoch's tree.
    pub fn index(&self) -> u32 {
        match self {
            TreeEntry::LowerBound { index }
            | TreeEntry::Spent { index, .. }
            | TreeEntry::UpperBound { index } => *index,
        }
    }

    /// Compares the entry with an outpoint key: boundaries are −∞ and +∞.
    pub fn cmp_key(&self, key: &OutPointKey) -> std::cmp::Ordering {
        match self {
            TreeEntry::LowerBound { .. } => std::cmp::Ordering::Less,
            TreeEntry::UpperBound { .. } => std::cmp::Ordering::Greater,
            TreeEntry::Spent { leaf, .. } => leaf.key().as_slice().cmp(key.as_slice()),
        }
    }

    /// The entry's leaf data, hashed as an RFC 6962 leaf: index (u32 BE),
    /// kind byte, then for a spent output the [`Leaf`] encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(5 + LEAF_FIXED_LEN + 32);
        out.extend_from_slice(&self.index().to_be_bytes());
        match self {
            TreeEntry::LowerBound { .. } => out.push(KIND_LOWER),
            TreeEntry::UpperBound { .. } => out.push(KIND_UPPER),
            TreeEntry::Spent { leaf, .. } => {
                out.push(KIND_SPENT);
                leaf.encode_into(&mut out);
            }
        }
        out
    }

    /// Decodes exactly one entry.
    ///
    /// # Errors
    /// [`LeafDecodeError`] on malformed input.
    pub fn decode(bytes: &[u8]) -> Result<TreeEntry, LeafDecodeError> {
        if bytes.len() < 5 {
            return Err(LeafDecodeError::Truncated {
                len: bytes.len(),
                need: 5,
            });
        }
        let index = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let entry = match bytes[4] {
            KIND_LOWER => TreeEntry::LowerBound { index },
            KIND_UPPER => TreeEntry::UpperBound { index },
            KIND_SPENT => {
                let leaf = Leaf::from_bytes(&bytes[5..])?;
                return Ok(TreeEntry::Spent { index, leaf });
            }
            kind => return Err(LeafDecodeError::BadKind { kind }),
        };
        if bytes.len() != 5 {
            return Err(LeafDecodeError::TrailingBytes {
                extra: bytes.len() - 5,
            });
        }
        Ok(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Leaf {
        Leaf {
            outpoint: OutPoint {
                txid: Txid::from_byte_array([7; 32]),
                vout: 0x0102_0304,
            },
            value: 5_000_000_000,
            script_pubkey: ScriptBuf::from_bytes(vec![0x51]),
            creation_height: 101,
            spend: Spend {
                block_hash: BlockHash::from_byte_array([9; 32]),
                height: 205,
                txid: Txid::from_byte_array([8; 32]),
                vin: 3,
            },
        }
    }

    #[test]
    fn leaf_exact_bytes() {
        let b = sample().to_bytes();
        assert_eq!(b.len(), LEAF_FIXED_LEN + 1);
        assert_eq!(&b[..32], &[7u8; 32]);
        assert_eq!(&b[32..36], &[1, 2, 3, 4]);
        assert_eq!(&b[36..44], &5_000_000_000u64.to_be_bytes());
        assert_eq!(&b[44..48], &[0, 0, 0, 101]);
        assert_eq!(&b[48..80], &[9u8; 32]);
        assert_eq!(&b[80..84], &[0, 0, 0, 205]);
        assert_eq!(&b[84..116], &[8u8; 32]);
        assert_eq!(&b[116..120], &[0, 0, 0, 3]);
        assert_eq!(&b[120..123], &[0, 1, 0x51]);
        assert_eq!(Leaf::from_bytes(&b), Ok(sample()));
        assert!(Leaf::from_bytes(&b[..b.len() - 1]).is_err());
        let mut long = b.clone();
        long.push(0);
        assert!(Leaf::from_bytes(&long).is_err());
    }

    #[test]
    fn entry_round_trip() {
        for e in [
            TreeEntry::LowerBound { index: 0 },
            TreeEntry::Spent {
                index: 1,
                leaf: sample(),
            },
            TreeEntry::UpperBound { index: 2 },
        ] {
            assert_eq!(TreeEntry::decode(&e.encode()), Ok(e.clone()));
        }
        assert_eq!(
            TreeEntry::LowerBound { index: 0 }.encode(),
            vec![0, 0, 0, 0, 0]
        );
        assert!(TreeEntry::decode(&[0, 0, 0, 0, 3]).is_err());
    }
}
