//! Archival proofs (Stellar CAP-57, adapted to Bitcoin; `docs/references.md`;
//! formats in `docs/archive.md`).
//!
//! When a block is final (100 deep on the best chain), each output it spent
//! becomes a [`Leaf`]. Leaves are grouped by the spend height into epochs of
//! L blocks (`ChainParams::archive_epoch_length`: 2,016, 144 on regtest).
//! A complete epoch is sealed ([`Archive::seal`]): its leaves are sorted by
//! outpoint between a lower and an upper boundary leaf, written to an
//! immutable file, hashed into a balanced binary Merkle tree (SHA-256, RFC
//! 6962 domain separation), summarised by an [`EpochHeader`] chained to the
//! previous one, and indexed by a binary fuse filter. The hash of the last
//! header is the archive commitment.
//!
//! Proofs ([`Archive::prove`]) show that an outpoint was spent (existence of
//! its leaf, optionally with the spending transaction's txoutproof) or that
//! it is in no sealed epoch (two adjacent leaves bracketing it, per epoch).
//! [`verify`] / [`verify_json`] check them with no database.
//!
//! Module layout: [`leaf`] (leaf and tree-entry encodings), [`merkle`]
//! (tree and batch paths), [`header`] (epoch headers, commitment),
//! [`filter`] (fuse filters), [`proof`] (proof encodings, verification),
//! [`format`](mod@format) (file magics, version, limits), [`seal`] (writing an epoch
//! file), [`store`] (the on-disk archive). Errors: [`ArchiveError`] for the store,
//! [`VerifyError`] for proofs (their callers differ: the pipeline vs. a
//! client), [`leaf::LeafDecodeError`] for leaf bytes.

pub mod cli;
pub mod filter;
pub mod format;
pub mod header;
pub mod leaf;
pub mod merkle;
pub mod proof;
pub mod seal;
pub mod store;

use std::path::PathBuf;

use bitcoin::{BlockHash, OutPoint};
use serde::Serialize;

pub use filter::EpochFilter;
pub use header::{commitment, EpochHeader};
pub use leaf::{Leaf, Spend, TreeEntry};
pub use proof::{
    verify, verify_bytes, verify_json, Anchor, EpochProof, Gap, ProofBatch, ProofItem, ProofNode,
    TxInclusion, Verified, VerifiedStatus, VerifyError,
};
pub use seal::{EpochBuilder, SEAL_MEMORY_BYTES};
pub use store::{Archive, DEFAULT_FILTER_CACHE};

/// The status of an outpoint as kakehi reports it. The archive answers
/// `Archived` / `Unknown` ([`Archive::status`]); the node fills `Unspent` and
/// `SpentNotSealed` from the UTXO table first.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
#[non_exhaustive]
pub enum OutpointStatus {
    /// Live in the UTXO table on the best chain (a claim of the node; no
    /// archival proof shows it, only the absence from sealed epochs).
    Unspent,
    /// Spent on the best chain in a block not yet sealed into an epoch
    /// (not yet final, or final in the still-open epoch).
    SpentNotSealed {
        /// The spending block.
        block: BlockHash,
        /// Its height.
        height: u32,
    },
    /// Spent, and archived in sealed epoch `epoch` (provable).
    Archived {
        /// The epoch.
        epoch: u32,
    },
    /// Not known to this node.
    Unknown,
}

/// Errors of the on-disk archive.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArchiveError {
    /// An I/O error (retry or stop; nothing half-written is visible).
    #[error("archive I/O error on {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A damaged archive file. Recovery: move the archive directory away
    /// and let the node rebuild it from its blocks.
    #[error("archive file {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: &'static str,
    },
    /// The directory was built with another epoch length.
    #[error("archive {path} has epoch length {stored}, asked for {requested}")]
    EpochLengthMismatch {
        /// The header list file.
        path: PathBuf,
        /// Stored length (blocks).
        stored: u32,
        /// Requested length (blocks).
        requested: u32,
    },
    /// Seal called for an epoch after the next one.
    #[error("seal of epoch {got}, but the next epoch to seal is {expected}")]
    EpochOutOfOrder {
        /// `next_epoch()`.
        expected: u32,
        /// Requested.
        got: u32,
    },
    /// A sealed epoch re-sealed with different leaves.
    #[error("epoch {epoch} is sealed with other leaves")]
    SealMismatch {
        /// Epoch.
        epoch: u32,
    },
    /// A leaf whose spend height is outside the epoch.
    #[error("leaf {outpoint} spent at height {height} does not belong to epoch {epoch}")]
    LeafOutOfRange {
        /// Epoch.
        epoch: u32,
        /// Outpoint.
        outpoint: OutPoint,
        /// Spend height.
        height: u32,
    },
    /// Two leaves for one outpoint.
    #[error("outpoint {outpoint} appears twice in epoch {epoch}")]
    DuplicateLeaf {
        /// Epoch.
        epoch: u32,
        /// Outpoint.
        outpoint: OutPoint,
    },
    /// A script above the 10,000-byte limit.
    #[error("leaf {outpoint} has a {len}-byte script (max 10,000)")]
    ScriptTooLong {
        /// Outpoint.
        outpoint: OutPoint,
        /// Script length (bytes).
        len: usize,
    },
    /// Too many leaves for one epoch.
    #[error("epoch {epoch}: {count} leaves exceed {max}")]
    TooManyLeaves {
        /// Epoch.
        epoch: u32,
        /// Count.
        count: usize,
        /// Cap.
        max: usize,
    },
    /// The fuse filter could not be built.
    #[error("epoch {epoch}: filter construction failed: {reason}")]
    Filter {
        /// Epoch.
        epoch: u32,
        /// Reason from xorf.
        reason: &'static str,
    },
    /// Epoch not sealed.
    #[error("epoch {epoch} is not sealed")]
    NoSuchEpoch {
        /// Epoch.
        epoch: u32,
    },
    /// Proof request with no outpoints or too many.
    #[error("proof request for {count} outpoints (1..={max} allowed)")]
    BadRequest {
        /// Requested.
        count: usize,
        /// Cap.
        max: usize,
    },
    /// Proof request naming an outpoint twice.
    #[error("outpoint {outpoint} requested twice")]
    DuplicateOutpoint {
        /// Outpoint.
        outpoint: OutPoint,
    },
    /// A freshly built proof failed verification: a damaged epoch file (or a
    /// wrong txoutproof from the caller). Run `verify_epoch_file`.
    #[error("proof built from {dir} fails its own check: {source}")]
    SelfCheck {
        /// Archive directory.
        dir: PathBuf,
        /// The verification failure.
        #[source]
        source: Box<VerifyError>,
    },
}
