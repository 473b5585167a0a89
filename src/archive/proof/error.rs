//! Why a proof is rejected.

use bitcoin::{BlockHash, OutPoint, Txid};

use super::super::leaf::LeafDecodeError;
use super::super::merkle::MultiproofError;

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
