//! Proof batches: their binary and JSON forms, and verification with no
//! database (seed 003, "Proof Structure", adapted to Bitcoin).
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
use bitcoin::{BlockHash, OutPoint, TxMerkleNode, Txid};
use serde::{Deserialize, Serialize};

use super::header::{hex32, EpochHeader, HEADER_LEN};
use super::leaf::{Leaf, LeafDecodeError, TreeEntry, MAX_ENTRY_LEN};
use super::merkle::{leaf_hash, multiproof_root, MultiproofError, NodeHash};
use crate::primitives::outpoint_key;

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

fn checksum(body: &[u8]) -> [u8; 4] {
    let h = sha256::Hash::hash(body).to_byte_array();
    [h[0], h[1], h[2], h[3]]
}

/// Why a proof is rejected. Every variant names what failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// Input shorter than its layout says.
    #[error("proof truncated at byte {at}: {what} needs {need} more bytes")]
    Truncated {
        /// Offset where reading stopped.
        at: usize,
        /// The field being read.
        what: &'static str,
        /// Bytes needed.
        need: usize,
    },
    /// Input longer than its layout.
    #[error("proof has {extra} trailing bytes")]
    TrailingBytes {
        /// Extra bytes.
        extra: usize,
    },
    /// Input larger than the size cap.
    #[error("proof of {len} bytes exceeds the cap of {max}")]
    TooLarge {
        /// Input size.
        len: usize,
        /// Cap.
        max: usize,
    },
    /// Wrong magic / JSON format name.
    #[error("not a kakehi archive proof (bad magic or format)")]
    BadMagic,
    /// Unknown version.
    #[error("unsupported proof version {version}")]
    UnsupportedVersion {
        /// The version.
        version: u8,
    },
    /// Checksum does not match the content.
    #[error("proof checksum mismatch (corrupted or edited)")]
    BadChecksum,
    /// A count above its cap.
    #[error("{what}: count {count} exceeds the cap of {max}")]
    CountTooLarge {
        /// What is counted.
        what: &'static str,
        /// Declared count.
        count: usize,
        /// Cap.
        max: usize,
    },
    /// A bad byte value in a fixed field.
    #[error("invalid {what}")]
    BadField {
        /// The field.
        what: &'static str,
    },
    /// A tree entry that does not decode.
    #[error("epoch {epoch}: bad tree entry: {source}")]
    BadEntry {
        /// Epoch.
        epoch: u32,
        /// Cause.
        #[source]
        source: LeafDecodeError,
    },
    /// JSON that does not parse into a proof.
    #[error("proof JSON rejected: {source}")]
    Json {
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
    /// A header with an impossible shape.
    #[error("epoch header {epoch}: {reason}")]
    BadHeader {
        /// Epoch.
        epoch: u32,
        /// Reason.
        reason: &'static str,
    },
    /// Headers not consecutive or not hash-chained.
    #[error("epoch header {epoch} does not follow the previous header ({reason})")]
    BrokenChain {
        /// Epoch of the offending header.
        epoch: u32,
        /// Reason.
        reason: &'static str,
    },
    /// The headers do not hash to the anchor commitment.
    #[error("headers hash to commitment {computed}, anchor is {expected}")]
    CommitmentMismatch {
        /// Anchor (hex).
        expected: String,
        /// Computed (hex).
        computed: String,
    },
    /// The anchor root is not the root of the proof's only header.
    #[error("anchor root {expected} is not the root of the proof's epoch header")]
    RootNotAnchored {
        /// Anchor (hex).
        expected: String,
    },
    /// Headers not in the canonical range.
    #[error("proof headers {reason}")]
    HeadersNotCanonical {
        /// Reason.
        reason: &'static str,
    },
    /// An epoch proof for an epoch without header, repeated, or unsorted.
    #[error("epoch proof for epoch {epoch} is unexpected ({reason})")]
    UnexpectedEpoch {
        /// Epoch.
        epoch: u32,
        /// Reason.
        reason: &'static str,
    },
    /// Entries misplaced in their epoch.
    #[error("epoch {epoch}: entry {index} {reason}")]
    BadEntryPlace {
        /// Epoch.
        epoch: u32,
        /// Entry index.
        index: u32,
        /// Reason.
        reason: &'static str,
    },
    /// Paths do not lead to a root.
    #[error("epoch {epoch}: merkle paths invalid: {detail:?}")]
    BadPaths {
        /// Epoch.
        epoch: u32,
        /// What went wrong.
        detail: MultiproofError,
    },
    /// Paths lead to another root than the header's.
    #[error("epoch {epoch}: computed root {computed} differs from the header's")]
    RootMismatch {
        /// Epoch.
        epoch: u32,
        /// Computed root (hex).
        computed: String,
    },
    /// Two items for one outpoint.
    #[error("outpoint {outpoint} appears twice")]
    DuplicateItem {
        /// The outpoint.
        outpoint: OutPoint,
    },
    /// An item names an entry the proof does not carry.
    #[error("outpoint {outpoint}: epoch {epoch} entry {index} not in the proof")]
    MissingEntry {
        /// The outpoint.
        outpoint: OutPoint,
        /// Epoch.
        epoch: u32,
        /// Entry index.
        index: u32,
    },
    /// An existence item whose leaf is for another outpoint (or a boundary).
    #[error("outpoint {outpoint}: leaf {index} of epoch {epoch} is not this outpoint")]
    OutpointMismatch {
        /// The outpoint.
        outpoint: OutPoint,
        /// Epoch.
        epoch: u32,
        /// Entry index.
        index: u32,
    },
    /// A gap that does not bracket the outpoint.
    #[error("outpoint {outpoint}: epoch {epoch} gap at {low} does not bracket it")]
    GapDoesNotBracket {
        /// The outpoint.
        outpoint: OutPoint,
        /// Epoch.
        epoch: u32,
        /// Lower index.
        low: u32,
    },
    /// Absence not shown in every anchored epoch.
    #[error("outpoint {outpoint}: absence gaps do not cover exactly the anchored epochs")]
    IncompleteAbsence {
        /// The outpoint.
        outpoint: OutPoint,
    },
    /// Entries or epoch proofs no item uses.
    #[error("epoch {epoch}: {count} entries not used by any item")]
    UnusedEntries {
        /// Epoch.
        epoch: u32,
        /// How many.
        count: usize,
    },
    /// A txoutproof that is malformed, or whose root is not its header's.
    #[error("outpoint {outpoint}: txoutproof invalid: {reason}")]
    BadTxOutProof {
        /// The outpoint.
        outpoint: OutPoint,
        /// Reason.
        reason: &'static str,
    },
    /// A txoutproof that does not include the spending transaction.
    #[error("outpoint {outpoint}: txoutproof does not include spending tx {txid}")]
    TxNotInProof {
        /// The outpoint.
        outpoint: OutPoint,
        /// The spending txid.
        txid: Txid,
    },
    /// A txoutproof for another block than the leaf's spend block.
    #[error("outpoint {outpoint}: txoutproof is for block {got}, the leaf says {expected}")]
    TxOutProofBlockMismatch {
        /// The outpoint.
        outpoint: OutPoint,
        /// Block hash in the leaf.
        expected: BlockHash,
        /// Block hash of the txoutproof header.
        got: BlockHash,
    },
}

/// A txoutproof that checked: the spending transaction is committed by the
/// merkle root of this block header. Compare `block_hash` with the header
/// your own chain holds at the spend height.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize)]
pub struct TxInclusion {
    /// Hash of the header in the txoutproof (equals the leaf's spend block).
    pub block_hash: BlockHash,
    /// Its merkle root, which commits to the spending txid.
    pub merkle_root: TxMerkleNode,
}

/// What a verified proof establishes about one outpoint.
#[derive(Clone, PartialEq, Eq, Debug, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum VerifiedStatus {
    /// Archived as spent in `epoch`: the leaf (value, script, creation
    /// height, spend) is committed by the anchor.
    Spent {
        /// Epoch.
        epoch: u32,
        /// The archived leaf.
        leaf: Leaf,
        /// The checked txoutproof, when the proof carried one.
        inclusion: Option<TxInclusion>,
    },
    /// Absent from each listed epoch (all sealed epochs under a commitment
    /// anchor; the one epoch under a root anchor).
    Absent {
        /// The epochs.
        epochs: Vec<u32>,
    },
}

/// The result of a successful verification.
#[derive(Clone, PartialEq, Eq, Debug, Serialize)]
pub struct Verified {
    /// The anchor checked against.
    pub anchor: Anchor,
    /// The headers, now known to be committed by the anchor.
    pub headers: Vec<EpochHeader>,
    /// One result per item, in proof order.
    pub outpoints: Vec<(OutPoint, VerifiedStatus)>,
}

impl Verified {
    /// The result for `outpoint`, or `None` if the proof does not speak of
    /// it (a proof for one outpoint says nothing about another).
    pub fn status(&self, outpoint: &OutPoint) -> Option<&VerifiedStatus> {
        self.outpoints
            .iter()
            .find(|(o, _)| o == outpoint)
            .map(|(_, s)| s)
    }
}

/// The names a length-prefixed field's errors use.
#[derive(Clone, Copy)]
struct Bounded {
    /// The field.
    name: &'static str,
    /// Its length prefix.
    length: &'static str,
    /// Its byte count, when over the cap.
    bytes: &'static str,
}

impl Bounded {
    const ENTRY: Bounded = Bounded {
        name: "entry",
        length: "entry length",
        bytes: "entry bytes",
    };
    const TXOUTPROOF: Bounded = Bounded {
        name: "txoutproof",
        length: "txoutproof length",
        bytes: "txoutproof bytes",
    };
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], VerifyError> {
        let rest = self.b.len() - self.pos;
        if rest < n {
            return Err(VerifyError::Truncated {
                at: self.pos,
                what,
                need: n - rest,
            });
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, VerifyError> {
        Ok(self.take(1, what)?[0])
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, VerifyError> {
        let s = self.take(4, what)?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn h32(&mut self, what: &'static str) -> Result<[u8; 32], VerifyError> {
        let mut a = [0u8; 32];
        a.copy_from_slice(self.take(32, what)?);
        Ok(a)
    }
    /// A count, capped, and checked against the bytes left (each element
    /// needs at least `min_each` bytes) before anything is allocated.
    fn count(
        &mut self,
        what: &'static str,
        max: usize,
        min_each: usize,
    ) -> Result<usize, VerifyError> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(VerifyError::CountTooLarge {
                what,
                count: n,
                max,
            });
        }
        let rest = self.b.len() - self.pos;
        if n.saturating_mul(min_each) > rest {
            return Err(VerifyError::Truncated {
                at: self.pos,
                what,
                need: n * min_each - rest,
            });
        }
        Ok(n)
    }

    /// A byte string of at most `max` bytes behind a 4-byte length, with
    /// the error names of `what`.
    fn bounded(&mut self, what: Bounded, max: usize) -> Result<&'a [u8], VerifyError> {
        let len = self.u32(what.length)? as usize;
        if len > max {
            return Err(VerifyError::CountTooLarge {
                what: what.bytes,
                count: len,
                max,
            });
        }
        self.take(len, what.name)
    }

    /// One epoch proof: its epoch, entries (each behind its length), and
    /// nodes (level, index, hash).
    fn epoch_proof(&mut self) -> Result<EpochProof, VerifyError> {
        let epoch = self.u32("epoch")?;
        let nent = self.count("entries", MAX_ENTRIES_PER_EPOCH, 9)?;
        let mut entries = Vec::with_capacity(nent);
        for _ in 0..nent {
            let eb = self.bounded(Bounded::ENTRY, MAX_ENTRY_LEN)?;
            entries.push(
                TreeEntry::decode(eb).map_err(|source| VerifyError::BadEntry { epoch, source })?,
            );
        }
        let nn = self.count("nodes", MAX_NODES_PER_EPOCH, 37)?;
        let mut nodes = Vec::with_capacity(nn);
        for _ in 0..nn {
            let level = self.u8("node level")?;
            let index = self.u32("node index")?;
            let hash = self.h32("node hash")?;
            nodes.push(ProofNode { level, index, hash });
        }
        Ok(EpochProof {
            epoch,
            entries,
            nodes,
        })
    }

    /// One item: tag 0, an existence item (epoch, index, an optional
    /// txoutproof), or tag 1, a non-existence item (its gaps).
    fn item(&mut self) -> Result<ProofItem, VerifyError> {
        let tag = self.u8("item tag")?;
        let mut k = [0u8; 36];
        k.copy_from_slice(self.take(36, "outpoint")?);
        let outpoint = crate::primitives::key_outpoint(&k);
        match tag {
            0 => {
                let epoch = self.u32("item epoch")?;
                let index = self.u32("item index")?;
                let txoutproof = match self.u8("txoutproof flag")? {
                    0 => None,
                    1 => {
                        let mb = self.bounded(Bounded::TXOUTPROOF, MAX_TXOUTPROOF_LEN)?;
                        let mb =
                            bitcoin::consensus::deserialize::<MerkleBlock>(mb).map_err(|_| {
                                VerifyError::BadTxOutProof {
                                    outpoint,
                                    reason: "does not decode as a MerkleBlock",
                                }
                            })?;
                        Some(mb)
                    }
                    _ => {
                        return Err(VerifyError::BadField {
                            what: "txoutproof flag",
                        })
                    }
                };
                Ok(ProofItem::Spent {
                    outpoint,
                    epoch,
                    index,
                    txoutproof,
                })
            }
            1 => {
                let ng = self.count("gaps", MAX_PROOF_EPOCHS, 8)?;
                let mut gaps = Vec::with_capacity(ng);
                for _ in 0..ng {
                    let epoch = self.u32("gap epoch")?;
                    let low = self.u32("gap low")?;
                    gaps.push(Gap { epoch, low });
                }
                Ok(ProofItem::Absent { outpoint, gaps })
            }
            _ => Err(VerifyError::BadField { what: "item tag" }),
        }
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_count(out: &mut Vec<u8>, n: usize) {
    put_u32(out, u32::try_from(n).unwrap_or(u32::MAX));
}

impl ProofBatch {
    /// Body (magic through items) and whether it fits the caps.
    fn encode_body(&self) -> (Vec<u8>, bool) {
        let mut out = Vec::with_capacity(1024);
        out.extend_from_slice(&PROOF_MAGIC);
        out.push(PROOF_VERSION);
        put_count(&mut out, self.headers.len());
        for h in &self.headers {
            out.extend_from_slice(&h.encode());
        }
        put_count(&mut out, self.epochs.len());
        for e in &self.epochs {
            put_u32(&mut out, e.epoch);
            put_count(&mut out, e.entries.len());
            for entry in &e.entries {
                let b = entry.encode();
                put_count(&mut out, b.len());
                out.extend_from_slice(&b);
            }
            put_count(&mut out, e.nodes.len());
            for n in &e.nodes {
                out.push(n.level);
                put_u32(&mut out, n.index);
                out.extend_from_slice(&n.hash);
            }
        }
        put_count(&mut out, self.items.len());
        for item in &self.items {
            match item {
                ProofItem::Spent {
                    outpoint,
                    epoch,
                    index,
                    txoutproof,
                } => {
                    out.push(0);
                    out.extend_from_slice(&outpoint_key(outpoint));
                    put_u32(&mut out, *epoch);
                    put_u32(&mut out, *index);
                    match txoutproof {
                        None => out.push(0),
                        Some(mb) => {
                            out.push(1);
                            let b = bitcoin::consensus::serialize(mb);
                            put_count(&mut out, b.len());
                            out.extend_from_slice(&b);
                        }
                    }
                }
                ProofItem::Absent { outpoint, gaps } => {
                    out.push(1);
                    out.extend_from_slice(&outpoint_key(outpoint));
                    put_count(&mut out, gaps.len());
                    for g in gaps {
                        put_u32(&mut out, g.epoch);
                        put_u32(&mut out, g.low);
                    }
                }
            }
        }
        let fits = out.len() + 4 <= MAX_PROOF_BYTES;
        (out, fits)
    }

    /// The binary encoding: magic `KKAP`, version, headers, epoch proofs,
    /// items, then a 4-byte checksum (first 4 bytes of SHA-256 of all
    /// preceding bytes). Layout in `docs/archive.md`.
    pub fn to_bytes(&self) -> Vec<u8> {
        let (mut body, _) = self.encode_body();
        let c = checksum(&body);
        body.extend_from_slice(&c);
        body
    }

    /// The JSON form (what the HTTP proof routes return and
    /// `kakehi proof verify` reads).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    fn check_caps(&self) -> Result<(), VerifyError> {
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

    /// Decodes the binary encoding, bounded: every count is capped and
    /// checked against the bytes present before allocation.
    ///
    /// # Errors
    /// [`VerifyError`] naming the malformed field.
    pub fn from_bytes(b: &[u8]) -> Result<ProofBatch, VerifyError> {
        if b.len() > MAX_PROOF_BYTES {
            return Err(VerifyError::TooLarge {
                len: b.len(),
                max: MAX_PROOF_BYTES,
            });
        }
        if b.len() < 9 {
            return Err(VerifyError::Truncated {
                at: 0,
                what: "magic",
                need: 9 - b.len(),
            });
        }
        let (body, sum) = b.split_at(b.len() - 4);
        let mut r = Reader { b: body, pos: 0 };
        if r.take(4, "magic")? != PROOF_MAGIC {
            return Err(VerifyError::BadMagic);
        }
        let version = r.u8("version")?;
        if version != PROOF_VERSION {
            return Err(VerifyError::UnsupportedVersion { version });
        }
        if checksum(body) != sum {
            return Err(VerifyError::BadChecksum);
        }
        let nh = r.count("headers", MAX_PROOF_EPOCHS, HEADER_LEN)?;
        let mut headers = Vec::with_capacity(nh);
        for _ in 0..nh {
            let hb = r.take(HEADER_LEN, "header")?;
            headers.push(EpochHeader::decode(hb).ok_or(VerifyError::BadField {
                what: "header version",
            })?);
        }
        let ne = r.count("epoch proofs", MAX_PROOF_EPOCHS, 12)?;
        let mut epochs = Vec::with_capacity(ne);
        for _ in 0..ne {
            epochs.push(r.epoch_proof()?);
        }
        let ni = r.count("items", MAX_ITEMS, 41)?;
        let mut items = Vec::with_capacity(ni);
        for _ in 0..ni {
            items.push(r.item()?);
        }
        if r.pos != body.len() {
            return Err(VerifyError::TrailingBytes {
                extra: body.len() - r.pos,
            });
        }
        Ok(ProofBatch {
            headers,
            epochs,
            items,
        })
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

fn check_txoutproof(
    outpoint: OutPoint,
    leaf: &Leaf,
    mb: &MerkleBlock,
) -> Result<TxInclusion, VerifyError> {
    let mut matches = Vec::new();
    let mut indexes = Vec::new();
    let root = mb
        .txn
        .extract_matches(&mut matches, &mut indexes)
        .map_err(|_| VerifyError::BadTxOutProof {
            outpoint,
            reason: "partial merkle tree malformed",
        })?;
    if root != mb.header.merkle_root {
        return Err(VerifyError::BadTxOutProof {
            outpoint,
            reason: "partial merkle tree root differs from the header's",
        });
    }
    if !matches.contains(&leaf.spend.txid) {
        return Err(VerifyError::TxNotInProof {
            outpoint,
            txid: leaf.spend.txid,
        });
    }
    let got = mb.header.block_hash();
    if got != leaf.spend.block_hash {
        return Err(VerifyError::TxOutProofBlockMismatch {
            outpoint,
            expected: leaf.spend.block_hash,
            got,
        });
    }
    Ok(TxInclusion {
        block_hash: got,
        merkle_root: root,
    })
}

/// Verifies a proof batch against an anchor, with no database.
///
/// Checks, in order: caps; header shapes and their hash chain; the anchor
/// (commitment = hash of the last header, or the root of the single
/// header); per epoch, entry placement and order and that the paths lead to
/// the header's root with every supplied node used exactly once; per item,
/// that the named leaf is the outpoint (existence, plus the optional
/// txoutproof) or that each gap's two adjacent leaves bracket it in every
/// anchored epoch (non-existence); and that every entry is used.
///
/// # Errors
/// The first [`VerifyError`] found.
pub fn verify(proof: &ProofBatch, anchor: Anchor) -> Result<Verified, VerifyError> {
    proof.check_caps()?;
    let hs = &proof.headers;
    check_header_chain(hs)?;
    check_anchor(proof, anchor)?;
    for (i, ep) in proof.epochs.iter().enumerate() {
        if i > 0 && proof.epochs[i - 1].epoch >= ep.epoch {
            return Err(VerifyError::UnexpectedEpoch {
                epoch: ep.epoch,
                reason: "not in ascending order",
            });
        }
        let h = header_of(hs, ep.epoch).ok_or(VerifyError::UnexpectedEpoch {
            epoch: ep.epoch,
            reason: "no header for it",
        })?;
        verify_epoch(ep, h)?;
    }
    let mut entries = EntryUse {
        epochs: &proof.epochs,
        used: proof
            .epochs
            .iter()
            .map(|ep| vec![false; ep.entries.len()])
            .collect(),
    };
    let mut seen = HashSet::with_capacity(proof.items.len());
    let mut out = Vec::with_capacity(proof.items.len());
    for item in &proof.items {
        let outpoint = *item.outpoint();
        if !seen.insert(outpoint) {
            return Err(VerifyError::DuplicateItem { outpoint });
        }
        let status = match item {
            ProofItem::Spent {
                epoch,
                index,
                txoutproof,
                ..
            } => verify_spent(&mut entries, outpoint, *epoch, *index, txoutproof.as_ref())?,
            ProofItem::Absent { gaps, .. } => verify_absent(&mut entries, outpoint, gaps, hs)?,
        };
        out.push((outpoint, status));
    }
    entries.check_all_used()?;
    Ok(Verified {
        anchor,
        headers: hs.clone(),
        outpoints: out,
    })
}

/// The header of `epoch` among consecutive headers `hs`.
fn header_of(hs: &[EpochHeader], epoch: u32) -> Option<&EpochHeader> {
    let first = hs.first()?.epoch;
    hs.get(epoch.checked_sub(first)? as usize)
}

/// Each header is well formed, and each follows the one before it:
/// consecutive epoch numbers, contiguous height ranges, `prev` linking.
fn check_header_chain(hs: &[EpochHeader]) -> Result<(), VerifyError> {
    for h in hs {
        h.check_shape().map_err(|reason| VerifyError::BadHeader {
            epoch: h.epoch,
            reason,
        })?;
    }
    for w in hs.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        let broken = |reason| VerifyError::BrokenChain {
            epoch: b.epoch,
            reason,
        };
        if a.epoch.checked_add(1) != Some(b.epoch) {
            return Err(broken("epoch numbers not consecutive"));
        }
        if a.last_height.checked_add(1) != Some(b.first_height) {
            return Err(broken("height ranges not contiguous"));
        }
        if b.prev != a.hash() {
            return Err(broken("prev is not the previous header's hash"));
        }
    }
    Ok(())
}

/// The headers are the ones `anchor` names: a commitment over them all,
/// starting at the canonical epoch (0 if any item is claimed absent, else
/// the lowest epoch an existence item uses), or the one epoch of a root.
fn check_anchor(proof: &ProofBatch, anchor: Anchor) -> Result<(), VerifyError> {
    let hs = &proof.headers;
    match anchor {
        Anchor::Commitment(c) => {
            let computed = super::header::commitment(hs);
            if computed != c {
                return Err(VerifyError::CommitmentMismatch {
                    expected: c.to_lower_hex_string(),
                    computed: computed.to_lower_hex_string(),
                });
            }
            let Some(first) = hs.first() else {
                return Ok(());
            };
            let any_absent = proof
                .items
                .iter()
                .any(|i| matches!(i, ProofItem::Absent { .. }));
            let want = if any_absent {
                Some(0)
            } else {
                proof
                    .items
                    .iter()
                    .filter_map(|i| match i {
                        ProofItem::Spent { epoch, .. } => Some(*epoch),
                        ProofItem::Absent { .. } => None,
                    })
                    .min()
            };
            if want != Some(first.epoch) {
                return Err(VerifyError::HeadersNotCanonical {
                    reason: "do not start at the first epoch the items need",
                });
            }
            Ok(())
        }
        Anchor::EpochRoot(r) => {
            if hs.len() != 1 || hs[0].root != r {
                return Err(VerifyError::RootNotAnchored {
                    expected: r.to_lower_hex_string(),
                });
            }
            Ok(())
        }
    }
}

/// Epoch proof `ep` is sound against its header `h`: every entry at a
/// place it may hold (boundaries at the ends, spent leaves between them),
/// in ascending index and outpoint order, and the entries with the nodes
/// give the header's root.
fn verify_epoch(ep: &EpochProof, h: &EpochHeader) -> Result<(), VerifyError> {
    let n = h.leaf_count;
    let mut leaves = Vec::with_capacity(ep.entries.len());
    for (k, e) in ep.entries.iter().enumerate() {
        let idx = e.index();
        let place = |reason| VerifyError::BadEntryPlace {
            epoch: ep.epoch,
            index: idx,
            reason,
        };
        match e {
            TreeEntry::LowerBound { .. } if idx != 0 => {
                return Err(place("lower boundary not at index 0"))
            }
            TreeEntry::UpperBound { .. } if idx.checked_add(1) != Some(n) => {
                return Err(place("upper boundary not at the last index"))
            }
            TreeEntry::Spent { .. } if idx == 0 || idx.checked_add(1) >= Some(n) => {
                return Err(place("spent leaf at a boundary index"))
            }
            _ => {}
        }
        if k > 0 {
            let prev = &ep.entries[k - 1];
            if prev.index() >= idx {
                return Err(place("entries not in ascending index order"));
            }
            if let TreeEntry::Spent { leaf, .. } = e {
                if prev.cmp_key(&leaf.key()) != std::cmp::Ordering::Less {
                    return Err(place("entries not in outpoint order"));
                }
            }
        }
        leaves.push((idx, leaf_hash(&e.encode())));
    }
    let nodes: Vec<(u8, u32, NodeHash)> = ep
        .nodes
        .iter()
        .map(|n| (n.level, n.index, n.hash))
        .collect();
    let root = multiproof_root(n, &leaves, &nodes).map_err(|detail| VerifyError::BadPaths {
        epoch: ep.epoch,
        detail,
    })?;
    if root != h.root {
        return Err(VerifyError::RootMismatch {
            epoch: ep.epoch,
            computed: root.to_lower_hex_string(),
        });
    }
    Ok(())
}

/// The epoch proofs' entries, with which of them an item used (a proof
/// may carry no entry it does not need).
struct EntryUse<'p> {
    epochs: &'p [EpochProof],
    /// Per epoch proof, per entry: used by an item.
    used: Vec<Vec<bool>>,
}

impl<'p> EntryUse<'p> {
    /// The entry at `index` of epoch `epoch`, marked used; `None` when the
    /// proof does not carry it.
    fn find(&mut self, epoch: u32, index: u32) -> Option<&'p TreeEntry> {
        let e = self.epochs.binary_search_by_key(&epoch, |p| p.epoch).ok()?;
        let k = self.epochs[e]
            .entries
            .binary_search_by_key(&index, |x| x.index())
            .ok()?;
        self.used[e][k] = true;
        Some(&self.epochs[e].entries[k])
    }

    /// The entry at `index` of `epoch`, needed by `outpoint`'s item.
    fn need(
        &mut self,
        outpoint: OutPoint,
        epoch: u32,
        index: u32,
    ) -> Result<&'p TreeEntry, VerifyError> {
        self.find(epoch, index).ok_or(VerifyError::MissingEntry {
            outpoint,
            epoch,
            index,
        })
    }

    /// Every entry was used by some item.
    fn check_all_used(&self) -> Result<(), VerifyError> {
        for (e, u) in self.epochs.iter().zip(&self.used) {
            let count = u.iter().filter(|x| !**x).count();
            if count > 0 {
                return Err(VerifyError::UnusedEntries {
                    epoch: e.epoch,
                    count,
                });
            }
        }
        Ok(())
    }
}

/// An existence item: the leaf at (`epoch`, `index`) is `outpoint`'s, and
/// its txoutproof, when given, proves the spending transaction in its
/// block.
fn verify_spent(
    entries: &mut EntryUse,
    outpoint: OutPoint,
    epoch: u32,
    index: u32,
    txoutproof: Option<&MerkleBlock>,
) -> Result<VerifiedStatus, VerifyError> {
    let leaf = match entries.need(outpoint, epoch, index)? {
        TreeEntry::Spent { leaf, .. } if leaf.outpoint == outpoint => leaf,
        _ => {
            return Err(VerifyError::OutpointMismatch {
                outpoint,
                epoch,
                index,
            })
        }
    };
    let inclusion = match txoutproof {
        Some(mb) => Some(check_txoutproof(outpoint, leaf, mb)?),
        None => None,
    };
    Ok(VerifiedStatus::Spent {
        epoch,
        leaf: leaf.clone(),
        inclusion,
    })
}

/// A non-existence item: one gap per header, in the headers' epochs, and
/// each gap's two adjacent leaves bracket `outpoint`'s key.
fn verify_absent(
    entries: &mut EntryUse,
    outpoint: OutPoint,
    gaps: &[Gap],
    hs: &[EpochHeader],
) -> Result<VerifiedStatus, VerifyError> {
    if gaps.len() != hs.len() || gaps.iter().zip(hs).any(|(g, h)| g.epoch != h.epoch) {
        return Err(VerifyError::IncompleteAbsence { outpoint });
    }
    let key = outpoint_key(&outpoint);
    for g in gaps {
        let bad = || VerifyError::GapDoesNotBracket {
            outpoint,
            epoch: g.epoch,
            low: g.low,
        };
        let high_index = g.low.checked_add(1).ok_or_else(bad)?;
        let lo = entries.need(outpoint, g.epoch, g.low)?.cmp_key(&key);
        let hi = entries.need(outpoint, g.epoch, high_index)?.cmp_key(&key);
        if lo != std::cmp::Ordering::Less || hi != std::cmp::Ordering::Greater {
            return Err(bad());
        }
    }
    Ok(VerifiedStatus::Absent {
        epochs: gaps.iter().map(|g| g.epoch).collect(),
    })
}

/// Decodes the binary form and verifies it.
///
/// # Errors
/// A decoding or verification [`VerifyError`].
pub fn verify_bytes(bytes: &[u8], anchor: Anchor) -> Result<Verified, VerifyError> {
    verify(&ProofBatch::from_bytes(bytes)?, anchor)
}

/// Parses the JSON form (exactly as the HTTP proof routes return it) and
/// verifies it: `kakehi proof verify --root HEX | --commitment HEX FILE`.
///
/// # Errors
/// [`VerifyError::Json`] for malformed JSON or fields, [`VerifyError::BadChecksum`]
/// for edited content, else a verification error.
pub fn verify_json(json: &str, anchor: Anchor) -> Result<Verified, VerifyError> {
    if json.len() > MAX_PROOF_JSON_BYTES {
        return Err(VerifyError::TooLarge {
            len: json.len(),
            max: MAX_PROOF_JSON_BYTES,
        });
    }
    let doc: ProofJson =
        serde_json::from_str(json).map_err(|source| VerifyError::Json { source })?;
    let proof = ProofBatch::try_from(doc)?;
    verify(&proof, anchor)
}
