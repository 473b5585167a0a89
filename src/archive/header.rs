//! Epoch headers and the archive commitment (their hash chain).

use bitcoin::hashes::{sha256, Hash, HashEngine};
use serde::{Deserialize, Serialize};

use super::merkle::NodeHash;

/// Encoded size of an [`EpochHeader`] in bytes.
pub const HEADER_LEN: usize = 1 + 4 + 4 + 4 + 4 + 32 + 32;

/// Version byte of the header encoding.
pub const HEADER_VERSION: u8 = 1;

/// Domain prefix of a header hash (after RFC 6962's 0x00 leaf and 0x01
/// node prefixes, so a header can never be read as a tree node).
pub const HEADER_PREFIX: u8 = 0x02;

/// The header of a sealed epoch: what it covers and its Merkle root, chained
/// to the previous epoch's header.
///
/// Encoded in [`HEADER_LEN`] = 81 bytes: version u8 (1), epoch u32,
/// first_height u32, last_height u32, leaf_count u32 (all big-endian), root
/// 32, prev 32. `hash = SHA256(0x02 || encoding)`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpochHeader {
    /// Epoch number n (0-based).
    pub epoch: u32,
    /// First block height covered (n × L).
    pub first_height: u32,
    /// Last block height covered ((n + 1) × L − 1).
    pub last_height: u32,
    /// Number of tree leaves, the two boundary leaves included (so the
    /// epoch holds `leaf_count − 2` spent outputs).
    pub leaf_count: u32,
    /// Merkle root of the epoch's tree (hex in JSON).
    #[serde(with = "hex32")]
    pub root: NodeHash,
    /// Hash of the previous epoch's header; 32 zero bytes for epoch 0 (hex
    /// in JSON).
    #[serde(with = "hex32")]
    pub prev: NodeHash,
}

impl EpochHeader {
    /// The 81-byte encoding.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = HEADER_VERSION;
        b[1..5].copy_from_slice(&self.epoch.to_be_bytes());
        b[5..9].copy_from_slice(&self.first_height.to_be_bytes());
        b[9..13].copy_from_slice(&self.last_height.to_be_bytes());
        b[13..17].copy_from_slice(&self.leaf_count.to_be_bytes());
        b[17..49].copy_from_slice(&self.root);
        b[49..81].copy_from_slice(&self.prev);
        b
    }

    /// Decodes an 81-byte header; `None` if the length or version is wrong.
    pub fn decode(b: &[u8]) -> Option<EpochHeader> {
        if b.len() != HEADER_LEN || b[0] != HEADER_VERSION {
            return None;
        }
        let u = |at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let mut root = [0u8; 32];
        root.copy_from_slice(&b[17..49]);
        let mut prev = [0u8; 32];
        prev.copy_from_slice(&b[49..81]);
        Some(EpochHeader {
            epoch: u(1),
            first_height: u(5),
            last_height: u(9),
            leaf_count: u(13),
            root,
            prev,
        })
    }

    /// `SHA256(0x02 || encode())`.
    pub fn hash(&self) -> NodeHash {
        let mut e = sha256::Hash::engine();
        e.input(&[HEADER_PREFIX]);
        e.input(&self.encode());
        sha256::Hash::from_engine(e).to_byte_array()
    }

    /// Checks the header's own shape: at least the two boundary leaves,
    /// `first ≤ last`, and `first = epoch × (last − first + 1)` (fixed-length
    /// epochs starting at height 0). Returns the reason it fails.
    pub fn check_shape(&self) -> Result<(), &'static str> {
        if self.leaf_count < 2 {
            return Err("leaf count below 2 (boundary leaves missing)");
        }
        if self.last_height < self.first_height {
            return Err("last height below first height");
        }
        let len = u64::from(self.last_height - self.first_height) + 1;
        if u64::from(self.epoch) * len != u64::from(self.first_height) {
            return Err("first height is not epoch × epoch length");
        }
        if self.epoch == 0 && self.prev != [0u8; 32] {
            return Err("epoch 0 with a non-zero previous hash");
        }
        Ok(())
    }
}

/// The archive commitment over `headers` (all sealed epochs, from 0): the
/// hash of the last header, or 32 zero bytes when none is sealed. Because
/// each header carries its predecessor's hash, this one hash commits to
/// every epoch.
pub fn commitment(headers: &[EpochHeader]) -> NodeHash {
    headers.last().map(EpochHeader::hash).unwrap_or([0u8; 32])
}

/// Serde helper: 32 bytes as 64 lowercase hex characters, in byte order.
pub(crate) mod hex32 {
    use bitcoin::hex::{DisplayHex, FromHex};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_lower_hex_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let s = String::deserialize(d)?;
        if s.bytes().any(|c| c.is_ascii_uppercase()) {
            return Err(serde::de::Error::custom("hex must be lowercase"));
        }
        <[u8; 32]>::from_hex(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_bytes_and_shape() {
        let h = EpochHeader {
            epoch: 2,
            first_height: 288,
            last_height: 431,
            leaf_count: 7,
            root: [1; 32],
            prev: [2; 32],
        };
        let b = h.encode();
        assert_eq!(b[0], 1);
        assert_eq!(&b[1..5], &[0, 0, 0, 2]);
        assert_eq!(&b[5..9], &288u32.to_be_bytes());
        assert_eq!(EpochHeader::decode(&b), Some(h));
        assert!(h.check_shape().is_ok());
        assert!(EpochHeader {
            first_height: 289,
            ..h
        }
        .check_shape()
        .is_err());
        let j = serde_json::to_string(&h).unwrap();
        assert_eq!(serde_json::from_str::<EpochHeader>(&j).unwrap(), h);
        assert_eq!(commitment(&[]), [0; 32]);
        assert_eq!(commitment(&[h]), h.hash());
    }
}
