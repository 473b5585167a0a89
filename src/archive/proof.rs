//! Proof batches: their binary and JSON forms, and verification with no
//! database (Stellar CAP-57, "Proof Structure", adapted to Bitcoin).
//!
//! A [`ProofBatch`] answers for up to [`MAX_ITEMS`] outpoints at once. Per
//! epoch it carries the tree entries it needs and the sibling nodes of their
//! paths, each node once ([`super::merkle::needed_nodes`]); per outpoint an
//! item says "spent, leaf i of epoch e" (existence) or "absent: in each
//! epoch, between leaves low and low + 1" (non-existence). Layouts in
//! `docs/archive.md`.

use std::collections::HashSet;

use bitcoin::hashes::{sha256, Hash};
use bitcoin::hex::{DisplayHex, FromHex};
use bitcoin::merkle_tree::MerkleBlock;
use bitcoin::{BlockHash, OutPoint, TxMerkleNode};
use serde::{Deserialize, Serialize};

use super::header::{hex32, EpochHeader, HEADER_LEN};
use super::leaf::{Leaf, TreeEntry, MAX_ENTRY_LEN};
use super::merkle::{leaf_hash, multiproof_root, NodeHash};
use crate::primitives::outpoint_key;

mod codec;
mod error;
mod verify;

use codec::checksum;
pub use error::VerifyError;
pub use verify::{verify, verify_bytes, verify_json, TxInclusion, Verified, VerifiedStatus};

/// Magic of the binary proof encoding.
pub const PROOF_MAGIC: [u8; 4] = *b"KKAP";
/// Version of the proof encodings (binary and JSON).
pub const PROOF_VERSION: u8 = 1;
/// `format` field of the JSON form.
pub const PROOF_FORMAT: &str = "kakehi-archive-proof";
/// Largest binary proof accepted, in bytes (32 MiB).
pub const MAX_PROOF_BYTES: usize = 32 << 20;
/// Largest JSON proof accepted by [`verify_json`], in bytes (96 MiB).
pub const MAX_PROOF_JSON_BYTES: usize = 96 << 20;
/// Most outpoints per batch (the HTTP `POST /proof/outpoints` cap).
pub const MAX_ITEMS: usize = 1_000;
/// Most epochs (headers, per-epoch proofs, gaps per item) in one proof.
pub const MAX_PROOF_EPOCHS: usize = 1 << 16;
/// Most tree entries per epoch proof (two per outpoint).
pub const MAX_ENTRIES_PER_EPOCH: usize = 2 * MAX_ITEMS;
/// Most sibling nodes per epoch proof (33 levels per entry at most).
pub const MAX_NODES_PER_EPOCH: usize = 33 * MAX_ENTRIES_PER_EPOCH;
/// Largest txoutproof (consensus-encoded `MerkleBlock`), in bytes.
pub const MAX_TXOUTPROOF_LEN: usize = 65_536;

/// What a proof is checked against.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Anchor {
    /// The Merkle root of one epoch (`kakehi proof verify --root HEX`): the
    /// proof must hold exactly that epoch's header and speak only of it
    /// (see `Archive::prove_in_epoch`).
    EpochRoot(#[serde(with = "hex32")] NodeHash),
    /// The archive commitment (`--commitment HEX`): the proof carries the
    /// chain of headers from the first epoch it needs up to the last sealed
    /// one; absence claims cover every sealed epoch.
    Commitment(#[serde(with = "hex32")] NodeHash),
}

impl Anchor {
    /// Parses 64 lowercase or uppercase hex characters (byte order, as
    /// `GET /archive/epoch/:n` prints roots) as an epoch-root anchor
    /// (`kakehi proof verify --root HEX`).
    ///
    /// # Errors
    /// [`VerifyError::BadField`] if not 32 bytes of hex.
    pub fn root_from_hex(hex: &str) -> Result<Anchor, VerifyError> {
        parse_hash32(hex).map(Anchor::EpochRoot)
    }

    /// Parses a commitment anchor (`--commitment HEX`, as
    /// `GET /archive/commitment` prints it).
    ///
    /// # Errors
    /// [`VerifyError::BadField`] if not 32 bytes of hex.
    pub fn commitment_from_hex(hex: &str) -> Result<Anchor, VerifyError> {
        parse_hash32(hex).map(Anchor::Commitment)
    }
}

fn parse_hash32(hex: &str) -> Result<NodeHash, VerifyError> {
    <[u8; 32]>::from_hex(hex.trim()).map_err(|_| VerifyError::BadField {
        what: "anchor hex (need 64 hex characters)",
    })
}

/// A sibling node of a batch proof.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProofNode {
    /// Tree level (0 = leaf hashes).
    pub level: u8,
    /// Index within the level.
    pub index: u32,
    /// The node hash (hex in JSON, byte order).
    #[serde(with = "hex32")]
    pub hash: NodeHash,
}

/// The part of a batch inside one epoch.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpochProof {
    /// Epoch number.
    pub epoch: u32,
    /// The proven tree entries, index strictly increasing.
    pub entries: Vec<TreeEntry>,
    /// Sibling nodes, ordered by (level, index), each exactly once.
    pub nodes: Vec<ProofNode>,
}

/// The gap between two adjacent leaves of an epoch that brackets an absent
/// outpoint.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gap {
    /// Epoch number.
    pub epoch: u32,
    /// Index of the lower leaf; the upper one is `low + 1`.
    pub low: u32,
}

/// The claim about one requested outpoint.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(tag = "proof", rename_all = "snake_case", deny_unknown_fields)]
pub enum ProofItem {
    /// Existence: the outpoint is leaf `index` of `epoch`.
    Spent {
        /// The outpoint.
        outpoint: OutPoint,
        /// Epoch holding it.
        epoch: u32,
        /// Leaf index in that epoch's tree.
        index: u32,
        /// Optional proof that the spending transaction is in its block
        /// (consensus-encoded `MerkleBlock`, hex in JSON, as Core's
        /// `gettxoutproof`).
        #[serde(with = "txoutproof_hex", default)]
        txoutproof: Option<MerkleBlock>,
    },
    /// Non-existence: one gap per epoch.
    Absent {
        /// The outpoint.
        outpoint: OutPoint,
        /// One gap per covered epoch, ascending.
        gaps: Vec<Gap>,
    },
}

impl ProofItem {
    /// The outpoint the item speaks about.
    pub fn outpoint(&self) -> &OutPoint {
        match self {
            ProofItem::Spent { outpoint, .. } | ProofItem::Absent { outpoint, .. } => outpoint,
        }
    }
}

/// A batch of archival proofs (binary: [`ProofBatch::to_bytes`]; JSON: its
/// `Serialize` impl, a `{"format": "kakehi-archive-proof", ...}` object).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(into = "ProofJson", try_from = "ProofJson")]
pub struct ProofBatch {
    /// Epoch headers, consecutive and hash-chained, ascending.
    pub headers: Vec<EpochHeader>,
    /// Per-epoch parts, ascending epoch.
    pub epochs: Vec<EpochProof>,
    /// One item per requested outpoint, in request order.
    pub items: Vec<ProofItem>,
}

/// The JSON document (the batch plus format, version and checksum).
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProofJson {
    format: String,
    version: u8,
    headers: Vec<EpochHeader>,
    epochs: Vec<EpochProof>,
    items: Vec<ProofItem>,
    /// First 4 bytes of SHA-256 of the binary encoding's body, hex.
    checksum: String,
}

impl From<ProofBatch> for ProofJson {
    fn from(p: ProofBatch) -> ProofJson {
        let (body, _) = p.encode_body();
        ProofJson {
            format: PROOF_FORMAT.to_owned(),
            version: PROOF_VERSION,
            checksum: checksum(&body).to_lower_hex_string(),
            headers: p.headers,
            epochs: p.epochs,
            items: p.items,
        }
    }
}

impl TryFrom<ProofJson> for ProofBatch {
    type Error = VerifyError;
    fn try_from(j: ProofJson) -> Result<ProofBatch, VerifyError> {
        if j.format != PROOF_FORMAT {
            return Err(VerifyError::BadMagic);
        }
        if j.version != PROOF_VERSION {
            return Err(VerifyError::UnsupportedVersion { version: j.version });
        }
        let p = ProofBatch {
            headers: j.headers,
            epochs: j.epochs,
            items: j.items,
        };
        p.check_caps()?;
        let (body, _) = p.encode_body();
        let want = <[u8; 4]>::from_hex(&j.checksum).map_err(|_| VerifyError::BadChecksum)?;
        if checksum(&body) != want {
            return Err(VerifyError::BadChecksum);
        }
        Ok(p)
    }
}

impl ProofBatch {
    /// The JSON form (what the HTTP proof routes return and
    /// `kakehi proof verify` reads).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub(super) fn check_caps(&self) -> Result<(), VerifyError> {
        let cap = |what, count: usize, max: usize| {
            if count > max {
                Err(VerifyError::CountTooLarge { what, count, max })
            } else {
                Ok(())
            }
        };
        cap("headers", self.headers.len(), MAX_PROOF_EPOCHS)?;
        cap("epoch proofs", self.epochs.len(), MAX_PROOF_EPOCHS)?;
        cap("items", self.items.len(), MAX_ITEMS)?;
        for e in &self.epochs {
            cap("entries", e.entries.len(), MAX_ENTRIES_PER_EPOCH)?;
            cap("nodes", e.nodes.len(), MAX_NODES_PER_EPOCH)?;
        }
        for i in &self.items {
            match i {
                ProofItem::Absent { gaps, .. } => cap("gaps", gaps.len(), MAX_PROOF_EPOCHS)?,
                ProofItem::Spent {
                    txoutproof: Some(mb),
                    ..
                } => cap(
                    "txoutproof bytes",
                    bitcoin::consensus::serialize(mb).len(),
                    MAX_TXOUTPROOF_LEN,
                )?,
                ProofItem::Spent { .. } => {}
            }
        }
        Ok(())
    }
}

/// Serde helper: optional MerkleBlock as hex of its consensus encoding.
mod txoutproof_hex {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<MerkleBlock>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            None => s.serialize_none(),
            Some(mb) => s.serialize_some(&bitcoin::consensus::serialize(mb).to_lower_hex_string()),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<MerkleBlock>, D::Error> {
        let Some(s) = Option::<String>::deserialize(d)? else {
            return Ok(None);
        };
        if s.len() > 2 * MAX_TXOUTPROOF_LEN {
            return Err(serde::de::Error::custom("txoutproof too long"));
        }
        if s.bytes().any(|c| c.is_ascii_uppercase()) {
            return Err(serde::de::Error::custom("hex must be lowercase"));
        }
        let b = Vec::<u8>::from_hex(&s).map_err(serde::de::Error::custom)?;
        bitcoin::consensus::deserialize(&b)
            .map(Some)
            .map_err(serde::de::Error::custom)
    }
}
