//! The boundary between the P2P layer and the node: [`NodeBackend`].
//!
//! The node (chain index, pipeline, filter store) implements this trait
//! synchronously. The P2P layer calls it from tokio tasks:
//!
//! - **cheap** methods (in-memory, no disk, no long locks) are called directly
//!   on the async executor: [`NodeBackend::params`], [`NodeBackend::tip`],
//!   [`NodeBackend::best_header_tip`], [`NodeBackend::block_height`],
//!   [`NodeBackend::locator`], [`NodeBackend::blocks_to_fetch`],
//!   [`NodeBackend::filter_index_synced`], [`NodeBackend::archive_ready`];
//! - **blocking** methods (may read disk or validate) are always called
//!   through [`tokio::task::spawn_blocking`]:
//!   [`NodeBackend::headers_after`], [`NodeBackend::block_bytes`],
//!   [`NodeBackend::accept_headers`], [`NodeBackend::submit_block`],
//!   [`NodeBackend::submit_block_with_next`], [`NodeBackend::cfilters`],
//!   [`NodeBackend::cfheaders`], [`NodeBackend::cfcheckpt`],
//!   [`NodeBackend::archive_epochs`], [`NodeBackend::archive_proof`].
//!
//! [`NodeBackend::archive_ready`] is cheap; the three archive methods have
//! defaults (no archive) so other backends need not implement them, nor
//! [`NodeBackend::submit_block_with_next`] (which defaults to
//! [`NodeBackend::submit_block`]).
//!
//! Transaction relay: [`NodeBackend::mempool_min_feerate`] (`None`: no
//! mempool, the default), [`NodeBackend::mempool_tx`] and
//! [`NodeBackend::mempool_txids`] are cheap (a lock-free snapshot);
//! [`NodeBackend::submit_tx`] is blocking (UTXO reads, scripts).

use std::sync::Arc;

use bitcoin::bip158::{FilterHash, FilterHeader};
use bitcoin::block::Header;
use bitcoin::{Block, BlockHash, Transaction, Txid, Wtxid};

use tracing::warn;

use super::archive::ArchEpochs;
use crate::archive::ProofBatch;
use crate::chain::ChainParams;

/// A boxed error from the node, carried as the `source` of the variants below.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What the P2P layer needs from the node. See the module docs for which
/// methods must be cheap and which may block.
pub trait NodeBackend: Send + Sync + 'static {
    /// The network's parameters (magic, genesis, DNS seeds, default port).
    /// Cheap.
    fn params(&self) -> &ChainParams;

    /// The best fully validated tip: (height, hash). Cheap.
    fn tip(&self) -> (u32, BlockHash);

    /// The most-work header known, validated or not: (height, hash). Cheap.
    fn best_header_tip(&self) -> (u32, BlockHash);

    /// Height of any header the node has accepted (any branch, stale ones
    /// included), or `None` when unknown. Cheap.
    fn block_height(&self, hash: &BlockHash) -> Option<u32>;

    /// A block locator (Core's `GetLocator`: tip, then back 1, 2, 4, …,
    /// genesis last) of the most-work header chain, at most 101 hashes. Cheap.
    fn locator(&self) -> Vec<BlockHash>;

    /// Headers of the active (validated) chain after the first locator hash
    /// found on it (genesis if none is), up to and including `stop` (or up to
    /// `max` headers when `stop` is all zeros or not on that path), in chain
    /// order. Core's `getheaders` semantics. Blocking.
    fn headers_after(&self, locator: &[BlockHash], stop: BlockHash, max: usize) -> Vec<Header>;

    /// The header of `hash` when it may be served alone (a `getheaders`
    /// with an empty locator): a block of the active chain, or a validated
    /// block of another branch (Core's `BlockRequestAllowed`, without its
    /// one-month window for stale blocks). `None` otherwise. Cheap.
    fn header(&self, hash: &BlockHash) -> Option<Header>;

    /// The serialized block (with witness data) of any stored block, stale
    /// branches included; `None` when the node does not have it. Blocking.
    fn block_bytes(&self, hash: &BlockHash) -> Option<Vec<u8>>;

    /// Checks (PoW, difficulty, timestamps, continuity) and stores headers
    /// received from a peer, in message order. Headers already known are
    /// accepted without effect. Blocking.
    ///
    /// # Errors
    /// See [`HeadersError`]: whether the peer is penalised depends on the
    /// variant.
    fn accept_headers(&self, headers: &[Header]) -> Result<HeadersOutcome, HeadersError>;

    /// The next blocks to download: blocks missing (neither connected nor
    /// buffered) on the most-work header chain above the validated tip, in
    /// chain order, at most `max` (the P2P layer asks for the 1,024-block
    /// window). Cheap.
    fn blocks_to_fetch(&self, max: usize) -> Vec<BlockHash>;

    /// Hands a block to the pipeline. Blocks may arrive out of order: the
    /// node buffers them until their parent connects. The block's header has
    /// been accepted by [`NodeBackend::accept_headers`] beforehand. Blocking.
    ///
    /// # Errors
    /// See [`SubmitError`].
    fn submit_block(&self, block: Block) -> Result<SubmitOutcome, SubmitError>;

    /// [`NodeBackend::submit_block`] with the block the caller will hand in
    /// next, when it already holds it (a `block` message already received
    /// behind this one, whose parent is `block`): the node may validate
    /// `next` ahead while `block`'s scripts run; `next` is then submitted
    /// as usual, with the same `Arc`. The outcome is `block`'s, as without
    /// `next`. The default ignores `next`.
    ///
    /// # Errors
    /// See [`SubmitError`].
    fn submit_block_with_next(
        &self,
        block: Arc<Block>,
        next: Option<Arc<Block>>,
    ) -> Result<SubmitOutcome, SubmitError> {
        let _ = next;
        self.submit_block(Arc::unwrap_or_clone(block))
    }

    /// Whether the BIP-158 basic filter index has caught up with the tip;
    /// NODE_COMPACT_FILTERS is advertised only then. Cheap.
    fn filter_index_synced(&self) -> bool;

    /// Basic filters of the blocks from `start_height` to `stop` on `stop`'s
    /// own branch (stale branches included), as (block hash, serialized
    /// filter) in height order. The P2P layer has checked that `stop` is
    /// known and that the range is within BIP157's limit. Blocking.
    ///
    /// # Errors
    /// See [`FilterQueryError`].
    fn cfilters(
        &self,
        start_height: u32,
        stop: BlockHash,
    ) -> Result<Vec<(BlockHash, Vec<u8>)>, FilterQueryError>;

    /// The filter header at `start_height - 1` (all zeros when
    /// `start_height` is 0) and the filter hashes from `start_height` to
    /// `stop` on `stop`'s branch, in height order. Blocking.
    ///
    /// # Errors
    /// See [`FilterQueryError`].
    fn cfheaders(
        &self,
        start_height: u32,
        stop: BlockHash,
    ) -> Result<(FilterHeader, Vec<FilterHash>), FilterQueryError>;

    /// The filter headers at heights 1,000, 2,000, … up to `stop`'s height
    /// on `stop`'s branch (BIP157 `getcfcheckpt`). Blocking.
    ///
    /// # Errors
    /// See [`FilterQueryError`].
    fn cfcheckpt(&self, stop: BlockHash) -> Result<Vec<FilterHeader>, FilterQueryError>;

    /// Whether the archive of spent outputs is ready to serve
    /// (`NODE_ARCHIVE_PROOFS` is advertised only then; see
    /// [`super::archive`]). Cheap. Default: no archive.
    fn archive_ready(&self) -> bool {
        false
    }

    /// Up to `count` sealed epoch headers from `start`, with the sealed
    /// count and the commitment (`archepochs`). Blocking.
    ///
    /// # Errors
    /// [`ArchiveQueryError`]; the default has no archive.
    fn archive_epochs(&self, start: u32, count: u16) -> Result<ArchEpochs, ArchiveQueryError> {
        let _ = (start, count);
        Err(ArchiveQueryError::NoArchive)
    }

    /// A proof about `outpoints` (1..=1,000, distinct): against the
    /// commitment, or in sealed epoch `epoch` only; with txoutproofs on
    /// existence proofs when `txoutproofs`. Blocking.
    ///
    /// # Errors
    /// [`ArchiveQueryError`]; the default has no archive.
    fn archive_proof(
        &self,
        outpoints: &[bitcoin::OutPoint],
        epoch: Option<u32>,
        txoutproofs: bool,
    ) -> Result<ProofBatch, ArchiveQueryError> {
        let _ = (outpoints, epoch, txoutproofs);
        Err(ArchiveQueryError::NoArchive)
    }

    /// The mempool's minimum feerate (Core's `mempoolminfee`), sats per
    /// 1,000 vbytes, or `None` when the node keeps no mempool (then the
    /// P2P layer asks peers not to relay transactions: `version` relay =
    /// false, no `feefilter`, announced transactions not fetched). Cheap.
    /// Default: no mempool.
    fn mempool_min_feerate(&self) -> Option<u64> {
        None
    }

    /// The mempool transaction `id` names (by txid or by wtxid), with its
    /// feerate and entry sequence. Cheap. Default: none.
    fn mempool_tx(&self, id: GenTxid) -> Option<MempoolTx> {
        let _ = id;
        None
    }

    /// The mempool's transactions with entry sequence at least `from`, in
    /// entry order (parents before children), at most `max`, and the
    /// sequence the next entry will get. Cheap (a snapshot walk of `max`
    /// entries). Default: none.
    fn mempool_txids(&self, from: u64, max: usize) -> (Vec<(Txid, Wtxid)>, u64) {
        let _ = (from, max);
        (Vec::new(), 0)
    }

    /// Submits a transaction received from a peer to the mempool (Core's
    /// `ProcessTransaction` without a fee ceiling). Blocking. Default: no
    /// mempool, refused with [`TxSubmitError::Unavailable`].
    ///
    /// # Errors
    /// [`TxSubmitError`].
    fn submit_tx(&self, tx: Arc<Transaction>) -> Result<(), TxSubmitError> {
        let _ = tx;
        Err(TxSubmitError::Unavailable {
            source: "no mempool".into(),
        })
    }
}

/// A transaction hash that is either a txid or a wtxid (Core's `GenTxid`):
/// what an `inv` or `getdata` names, depending on the peer's BIP-339
/// `wtxidrelay`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GenTxid {
    /// By txid (`MSG_TX`, `MSG_WITNESS_TX`; parents of orphans).
    Txid(Txid),
    /// By wtxid (`MSG_WTX`).
    Wtxid(Wtxid),
}

impl GenTxid {
    /// The 32 hash bytes, whichever kind.
    pub fn bytes(&self) -> [u8; 32] {
        use bitcoin::hashes::Hash;
        match self {
            GenTxid::Txid(t) => t.to_byte_array(),
            GenTxid::Wtxid(w) => w.to_byte_array(),
        }
    }
}

/// A mempool transaction as the relay needs it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct MempoolTx {
    /// The transaction.
    pub tx: Arc<Transaction>,
    /// Its own feerate (fee over vsize), sats per 1,000 vbytes: compared
    /// with a peer's BIP-133 `feefilter`.
    pub feerate: u64,
    /// Its entry sequence (the mempool's counter when it entered): it is
    /// served by `getdata` only to a peer that was sent an `inv` after it
    /// entered (Core's `m_last_inv_sequence`).
    pub sequence: u64,
}

impl MempoolTx {
    /// Builds one.
    pub fn new(tx: Arc<Transaction>, feerate: u64, sequence: u64) -> Self {
        MempoolTx {
            tx,
            feerate,
            sequence,
        }
    }
}

/// Why a transaction from a peer did not enter the mempool. None of these
/// punishes the peer: Bitcoin Core 30.0 no longer discourages a peer for
/// a consensus-invalid transaction (`net_processing.cpp`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TxSubmitError {
    /// An input is neither in the UTXO set nor in the mempool
    /// (`TX_MISSING_INPUTS`): an orphan, perhaps valid once its parents
    /// arrive.
    #[error("orphan: missing inputs")]
    MissingInputs,
    /// Refused with Core's reason. `remember`: the wtxid goes into the
    /// recent rejects (not for a stripped witness); `by_txid`: the txid as
    /// well (`TX_INPUTS_NOT_STANDARD`: no witness makes it standard).
    #[error("rejected: {reason}")]
    Rejected {
        /// Core's reject reason and debug text.
        reason: String,
        /// Whether the wtxid is remembered as rejected.
        remember: bool,
        /// Whether the txid is remembered as rejected too.
        by_txid: bool,
    },
    /// Already in the mempool.
    #[error("already in the mempool")]
    Duplicate,
    /// No mempool, or the chain state could not be read: nothing is known
    /// about the transaction.
    #[error("mempool unavailable: {source}")]
    Unavailable {
        /// The cause.
        #[source]
        source: BoxError,
    },
}

/// Result of [`NodeBackend::accept_headers`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeadersOutcome {
    /// Headers that were new to the node.
    pub new: usize,
    /// Height of the last header of the message (0 for an empty message).
    pub last_height: u32,
    /// The most-work header after the call: (height, hash).
    pub best_header: (u32, BlockHash),
}

impl HeadersOutcome {
    /// Builds an outcome.
    pub fn new(new: usize, last_height: u32, best_header: (u32, BlockHash)) -> Self {
        HeadersOutcome {
            new,
            last_height,
            best_header,
        }
    }
}

/// Why headers were refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeadersError {
    /// The first header's parent is unknown (a peer announcing a tip we
    /// cannot link yet). Not penalised; answered with a `getheaders` (up to
    /// 10 times in a row, as Core's `MAX_NUM_UNCONNECTING_HEADERS_MSGS`).
    #[error("header {hash} does not connect: parent {prev} unknown")]
    Unconnected {
        /// The first header's hash.
        hash: BlockHash,
        /// Its unknown parent.
        prev: BlockHash,
    },
    /// Header `index` of the message does not build on header `index - 1`.
    /// Penalised.
    #[error("header {index} of the message does not link to the previous one")]
    NotContinuous {
        /// Position in the message.
        index: usize,
    },
    /// A header's time is more than 2 hours after the node's clock (Core's
    /// `time-too-new`, `BLOCK_TIME_FUTURE`): refused and not remembered, so
    /// it may be accepted later; not penalised (Core does not either).
    #[error("header {hash} is more than 2 hours in the future")]
    TimeTooNew {
        /// The header's hash.
        hash: BlockHash,
    },
    /// A header breaks a consensus rule (PoW, difficulty, timestamp,
    /// checkpoint, known-invalid ancestor). Penalised.
    #[error("invalid header {hash}: {source}")]
    Invalid {
        /// The header's hash.
        hash: BlockHash,
        /// The rule broken.
        #[source]
        source: BoxError,
    },
    /// The chain is valid so far but has less work than the node stores
    /// (the minimum chainwork, or 144 blocks' work below the tip: Core's
    /// `GetAntiDoSWorkThreshold`), so nothing was stored (headers presync).
    /// Not penalised. The P2P layer keeps asking the same peer with
    /// locator `[last]` while it sends full (2,000) messages; the node keeps
    /// a bounded state per chain, not the headers.
    #[error("headers up to {last} are below the work threshold")]
    BelowMinimumWork {
        /// The last header of the message.
        last: BlockHash,
    },
    /// The chain followed in presync has just passed the work threshold:
    /// nothing of it is stored yet. Not penalised; the P2P layer asks the
    /// peer for the chain again from `from` (locator `[from]`), and the
    /// re-sent headers are stored as they are confirmed against the
    /// presync (a different chain is [`HeadersError::Invalid`]).
    #[error("the chain after {from} passed the work threshold: to be fetched again")]
    PresyncPassed {
        /// The stored header the chain builds on.
        from: BlockHash,
    },
    /// The node failed to store them. Not the peer's fault.
    #[error("storage error accepting headers: {source}")]
    Storage {
        /// The storage error.
        #[source]
        source: BoxError,
    },
}

/// Result of [`NodeBackend::submit_block`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SubmitOutcome {
    /// The best valid tip changed (by extension or reorg) to (height, hash).
    NewTip {
        /// New tip height.
        height: u32,
        /// New tip hash.
        hash: BlockHash,
    },
    /// Stored (buffered out of order, or on a branch with less work); the tip
    /// did not change.
    Accepted,
    /// The node already had the block.
    Duplicate,
}

/// Why a block was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// The block breaks a consensus rule. The sender is penalised.
    #[error("invalid block {hash}: {source}")]
    Invalid {
        /// The block's hash.
        hash: BlockHash,
        /// The rule broken.
        #[source]
        source: BoxError,
    },
    /// The block was already known invalid (Core's `BLOCK_CACHED_INVALID`,
    /// "duplicate-invalid"). Core discourages an outbound peer for it and
    /// keeps an inbound one (`MaybePunishNodeForBlock`): the peer may just
    /// relay what it was sent.
    #[error("block {hash} is already known invalid")]
    KnownInvalid {
        /// The block's hash.
        hash: BlockHash,
    },
    /// The block's header is not in the index (not accepted first).
    #[error("block {hash} has no accepted header")]
    UnknownHeader {
        /// The block's hash.
        hash: BlockHash,
    },
    /// The node failed to store or connect it. Not the peer's fault.
    #[error("storage error submitting block: {source}")]
    Storage {
        /// The storage error.
        #[source]
        source: BoxError,
    },
}

/// Why a filter query could not be answered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FilterQueryError {
    /// The stop hash is unknown (a race at the tip): the request is ignored,
    /// not punished.
    #[error("unknown stop hash {stop}")]
    UnknownStop {
        /// The stop hash.
        stop: BlockHash,
    },
    /// A filter in the range is not computed yet; only complete data is
    /// served, so the request is ignored.
    #[error("filter for block {hash} not indexed yet")]
    NotIndexed {
        /// The first block without a filter.
        hash: BlockHash,
    },
    /// `start_height` is above the stop block's height.
    #[error("start height {start_height} above stop height {stop_height}")]
    StartAboveStop {
        /// Requested start height.
        start_height: u32,
        /// Height of the stop block.
        stop_height: u32,
    },
    /// The node failed to read its filter store. Not the peer's fault.
    #[error("storage error reading filters: {source}")]
    Storage {
        /// The storage error.
        #[source]
        source: BoxError,
    },
}

/// Why the node could not answer an archive query (the answer is then an
/// `archproof` with status [`ArchProofStatus::Unavailable`](super::archive::ArchProofStatus::Unavailable)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArchiveQueryError {
    /// This backend has no archive.
    #[error("no archive")]
    NoArchive,
    /// No epoch is sealed yet: nothing can be proven.
    #[error("no archive epoch is sealed yet")]
    NothingSealed,
    /// The single epoch asked for is not sealed.
    #[error("epoch {epoch} is not sealed ({sealed} sealed)")]
    NotSealed {
        /// The epoch asked for.
        epoch: u32,
        /// Epochs sealed.
        sealed: u32,
    },
    /// The node failed to read its archive or blocks. Not the peer's fault.
    #[error("archive storage error: {source}")]
    Storage {
        /// The cause.
        #[source]
        source: BoxError,
    },
}

/// Runs a blocking backend call off the executor (tokio's blocking pool),
/// inside the caller's tracing span. `None` if the call panicked (logged).
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let span = tracing::Span::current();
    match tokio::task::spawn_blocking(move || span.in_scope(f)).await {
        Ok(v) => Some(v),
        Err(e) => {
            warn!(error = %e, "backend call failed");
            None
        }
    }
}
