//! The block pipeline: the one writer. Blocks go in, are checked, connected
//! against the UTXO table under their branch's view, their BIP-158 filter is
//! built, and each block ends in one commit across all stores.
//!
//! Commit order at every block boundary (see `docs/architecture.md`):
//! 1. flat files (the block itself when this boundary stores it, filter,
//!    spent outputs) appended, then `fdatasync`ed concurrently;
//! 2. once they are durable: the index database (sled) batch with the tip
//!    marker, flushed;
//! 3. once it is durable: the UTXO table's commit.
//!
//! Steps 1 and 2 run on a helper thread while this one applies the block to
//! the UTXO table in memory (not durable before step 3). A block that
//! extends the active tip is stored and connected in one boundary; other
//! blocks are stored by a boundary of their own (block file, then index)
//! and connected later.
//!
//! A crash between 2 and 3 leaves the table one block behind the index; at
//! start-up [`Chainstate::open`] replays that block (the index names it in
//! `sozu_last`). A crash before 2 loses only data no index entry points to;
//! the flat files are truncated to their committed length. A storage error
//! half-way through a boundary stops the chain state
//! ([`PipelineError::Failed`]) until a restart reconciles the stores.
//!
//! Reorgs use no undo data: the table's entries carry their production and
//! consumption blocks, so switching the active chain is switching the view.
//! A branch with more work is connected block by block under its own view,
//! each block a boundary; a block that fails marks its branch invalid and
//! the node returns to the best valid tip. Reorgs deeper than
//! [`PURGE_DEPTH`](crate::sozu::PURGE_DEPTH) blocks are refused.
//!
//! Readers never touch the writer: at the end of every committed boundary
//! (and of `open`, of every submission and header batch) the writer
//! publishes a [`ChainSnapshot`] through [`Snapshots`] (`arc_swap`), an
//! immutable state that readers load without a lock and keep as long as
//! they like. It shares the writer's persistent index and metadata (O(1) to
//! publish) and reads the stores through shared handles, filtered through
//! its own index so that data committed after it stays invisible. Every
//! read method is defined once, on the snapshot; the writer uses the same
//! ones on a snapshot of its own current state.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bitcoin::{BlockHash, OutPoint};

use crate::chain::assumevalid::{AssumeValid, AssumeValidState};
use crate::chain::index::{BlockIndex, IndexEntry};
use crate::chain::ChainParams;
use crate::filters;
use crate::muhash::MuHash3072;
use crate::primitives::{BlockId, Coin};
pub use crate::snapshot::PipelineStats;
use crate::snapshot::{BlockMeta, ChainSnapshot, ReadError, Snapshots};
use crate::sozu::{
    BlockWrite, Consumption, NewOutput, SozuError, UtxoReader, UtxoTable, ViewStatus,
};
use crate::store::{BlockRecord, FlatFiles, Store, StoreError, WriteBatch};
use crate::validation::script::BlockScriptError;
use crate::validation::{BlockError, SpentOutput};

mod address_index;
mod ahead;
mod connect;
mod digests;
mod dump;
mod group;
mod headers;
mod load;
mod open;
mod rows;
mod scripts;
mod sealer;
mod sealing;
mod submit;
use address_index::AddressIndexState;
pub use address_index::BuildProgress;
use group::PendingGroup;
pub use group::{GroupLimits, MAX_TIP_AGE_SECS};

/// Maximum size of one flat file, bytes (Core's `MAX_BLOCKFILE_SIZE`).
const MAX_FLAT_FILE_SIZE: u64 = 128 * 1024 * 1024;

mod utxo_hash;

/// Errors that stop the pipeline (storage), as opposed to invalid blocks,
/// which are reported in [`SubmitOutcome`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// The index database or a flat file failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The UTXO table failed.
    #[error("UTXO table: {0}")]
    Sozu(#[from] SozuError),
    /// A flat file failed.
    #[error(transparent)]
    Flat(#[from] crate::store::FlatFileError),
    /// Stored data contradicts itself.
    #[error("inconsistent datadir: {reason}")]
    Inconsistent {
        /// What does not match.
        reason: String,
    },
    /// The stored block index is corrupt.
    #[error("block index: {0}")]
    Index(#[from] crate::chain::index::IndexLoadError),
    /// The archive of spent outputs (sealing or reading epochs) failed.
    #[error("archive: {0}")]
    Archive(#[from] crate::archive::ArchiveError),
    /// A block boundary failed half-way (a storage error between the index
    /// commit and the UTXO table's): the in-memory state may be ahead of the
    /// disk, so this and every later write is refused until the node
    /// restarts and reconciles the stores.
    #[error("a block boundary failed half-way, writes are stopped (restart the node): {source}")]
    Failed {
        /// The storage error that stopped the boundary.
        #[source]
        source: Arc<PipelineError>,
    },
    /// A read through a snapshot of the writer's own state failed (a
    /// flat file, a damaged record, the archive).
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The script engine could not check a block (a transaction Core cannot
    /// decode, spent outputs that do not line up): a bug, not the block's
    /// fault; nothing of the block is committed and writes stop.
    #[error("script verification of block {hash}: {source}")]
    ScriptEngine {
        /// The block.
        hash: BlockHash,
        /// What failed.
        #[source]
        source: BlockScriptError,
    },
    /// A filter could not be built.
    #[error("filter of block {hash}: {source}")]
    Filter {
        /// The block.
        hash: BlockHash,
        /// The cause.
        #[source]
        source: filters::FilterError,
    },
}

/// Errors of [`Chainstate::dump_utxos`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DumpError {
    /// Reading the UTXO table failed.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// Writing the output failed.
    #[error("writing the UTXO dump: {0}")]
    Write(#[from] std::io::Error),
    /// A temporary run file of the sort (in the datadir) could not be
    /// created, written or read back.
    #[error("temporary file of the UTXO dump {path}: {source}")]
    Temp {
        /// The file, or the datadir where its directory was to be made.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// The reject reason of a block already known invalid (Core's
/// `duplicate-invalid`, `BLOCK_CACHED_INVALID`).
pub const DUPLICATE_INVALID: &str = "duplicate-invalid";

/// What happened to a submitted block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitOutcome {
    /// The block was stored; the active tip is now `tip` (unchanged if the
    /// block is on a branch with less work).
    Accepted {
        /// Active tip after the submission.
        tip: BlockHash,
        /// Active tip height.
        height: u32,
    },
    /// Already stored.
    Duplicate,
    /// Refused; nothing changed but, where the block itself is invalid, its
    /// status in the index.
    Rejected {
        /// Core's reject string.
        reason: String,
        /// A readable description.
        detail: String,
    },
}

/// What [`Chainstate::accept_headers`] did with a batch of headers.
#[derive(Debug)]
pub struct HeadersAccepted {
    /// Headers stored by this call (already known ones are not counted).
    pub new: usize,
    /// The first header refused, if any: the batch stops there.
    pub refused: Option<RefusedHeader>,
}

/// A header [`Chainstate::accept_headers`] refused.
#[derive(Debug)]
pub struct RefusedHeader {
    /// Its position in the batch.
    pub index: usize,
    /// The rule it breaks.
    pub error: crate::chain::index::HeaderError,
}

/// The outcome of checking a block against the UTXO table.
enum Verdict {
    /// The block is valid: what connecting it writes.
    Valid(ValidBlock),
    /// The block breaks a rule.
    Invalid(BlockError),
}

/// What a block's UTXO checks found ([`Chainstate::check_utxos`]), before
/// its block id is known.
struct CheckedUtxos {
    /// The outputs it spends, in block order.
    spent: Arc<[SpentOutput]>,
    /// The outputs it creates, in block order.
    created: Vec<(OutPoint, Coin)>,
    /// Its transaction ids, in block order.
    txids: Vec<bitcoin::Txid>,
    /// Those seen before (stored or in the open group): their outputs may
    /// be in the table; every other transaction's are known absent.
    seen_before: HashSet<bitcoin::Txid>,
}

impl CheckedUtxos {
    /// The valid block `entry` these checks found: its table write.
    fn into_valid(self, entry: &IndexEntry) -> ValidBlock {
        let write = BlockWrite {
            block: entry.id,
            height: entry.height,
            created: self
                .created
                .iter()
                .map(|(op, coin)| NewOutput {
                    outpoint: *op,
                    coin: coin.clone(),
                    known_absent: !self.seen_before.contains(&op.txid),
                })
                .collect(),
            spent: self
                .spent
                .iter()
                .map(|s| {
                    let by = Consumption {
                        block: entry.id,
                        txid: s.txid,
                        vin: s.vin,
                    };
                    (s.outpoint, by)
                })
                .collect(),
        };
        ValidBlock {
            write,
            spent: self.spent,
            created: self.created,
            txids: self.txids,
        }
    }
}

/// What connecting a valid block writes.
struct ValidBlock {
    /// The UTXO table's write.
    write: BlockWrite,
    /// The outputs it spends, in block order (shared with the script
    /// threads).
    spent: Arc<[SpentOutput]>,
    /// The outputs it creates, in block order.
    created: Vec<(OutPoint, Coin)>,
    /// Its transaction ids, in block order.
    txids: Vec<bitcoin::Txid>,
}

/// The node's chain state: block index, stores, UTXO table. The one writer:
/// readers use the [`ChainSnapshot`]s it publishes ([`Chainstate::snapshots`]).
pub struct Chainstate {
    index: BlockIndex,
    meta: imbl::Vector<BlockMeta>,
    store: Store,
    blocks: FlatFiles,
    filters: FlatFiles,
    spent: FlatFiles,
    /// Headers accepted without their block (`store::headers`).
    headers: FlatFiles,
    /// The UTXO table: only this writer reaches it; readers go through its
    /// [`UtxoReader`] (in every snapshot).
    table: Box<dyn UtxoTable + Send>,
    /// The table's reader, taken once at open.
    utxo: Arc<dyn UtxoReader>,
    refused_tips: HashSet<BlockId>,
    stats: PipelineStats,
    datadir: Arc<Path>,
    /// Sealed epochs of spent outputs (`datadir/archive`) and the epoch
    /// seal running in the background, if any (`sealer.rs`).
    sealer: sealer::Sealer,
    /// Set when a block boundary failed half-way (storage error between
    /// the index commit and the table's): the in-memory state may be ahead
    /// of the disk, so every later write is refused until a restart, which
    /// reconciles the stores.
    failed: Option<Arc<PipelineError>>,
    /// Where snapshots are published.
    published: Snapshots,
    /// MuHash state of the UTXO set at the active tip (`utxo_hash`).
    muhash: Arc<MuHash3072>,
    /// Bounds of a group of blocks made durable together while catching
    /// up (`group`); [`GroupLimits::PER_BLOCK`] unless set.
    group_limits: GroupLimits,
    /// The open group, if any: connected blocks not durable yet.
    group: Option<PendingGroup>,
    /// The table write of the open group's last block when not applied
    /// yet (`group`: [`Chainstate::write_unwritten`]).
    unwritten: Option<BlockWrite>,
    /// Index metadata and records of the open group's blocks, not
    /// committed yet; every write starts its batch from it
    /// ([`Chainstate::take_batch`]).
    pending: WriteBatch,
    /// The open group's transaction, spend and address rows, applied on
    /// a thread of their own ahead of the group's commit (`rows`).
    rows: rows::RowWriter,
    /// When block scripts may be skipped (assumevalid).
    assume_valid: AssumeValidState,
    /// The last reason logged for checking scripts (`None`: skipping),
    /// so the log says when it changes, as Core's does.
    last_script_check: Option<Option<&'static str>>,
    /// Threads that verify a block's scripts (the caller's included).
    script_threads: std::num::NonZeroUsize,
    /// The script threads (`script_threads` - 1 of them), started at the
    /// first valid block connected (they verify scripts and build filters
    /// and MuHash deltas).
    script_pool: Option<crate::validation::script::ScriptPool>,
    /// The next block, validated ahead while the last connected block's
    /// scripts ran, for its submission (`ahead`).
    ahead: Option<ahead::Ahead>,
    /// The block last found invalid while connecting and the description of
    /// why (for the [`SubmitOutcome::Rejected`] of its submission).
    last_reject: Option<(BlockId, String)>,
    /// Whether connects write address-index rows and whether the index is
    /// complete (`pipeline/address_index.rs`).
    address_index: AddressIndexState,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Chainstate {
    /// The network parameters.
    pub fn params(&self) -> &ChainParams {
        self.index.params()
    }

    /// The writer's block index (its read core, [`ChainIndex`](crate::chain::index::ChainIndex), through
    /// `Deref`): the state being written, for the writer. Readers use
    /// [`Chainstate::snapshots`].
    pub fn index(&self) -> &BlockIndex {
        &self.index
    }

    /// The handle readers load published snapshots from (cheap to clone).
    pub fn snapshots(&self) -> Snapshots {
        self.published.clone()
    }

    /// The latest published snapshot (the state as of the last committed
    /// boundary).
    pub fn snapshot(&self) -> Arc<ChainSnapshot> {
        self.published.load()
    }

    /// The writer's own state as a snapshot, for its reads in the middle of
    /// an operation (O(1); dropped before the next change, it costs no copy).
    fn current(&self) -> ChainSnapshot {
        ChainSnapshot {
            index: self.index.core().clone(),
            meta: self.meta.clone(),
            store: self.store.clone(),
            blocks: self.blocks.reader(),
            filters: self.filters.reader(),
            spent: self.spent.reader(),
            archive: self.sealer.archive().clone(),
            utxo: self.utxo.clone(),
            stats: self.stats.clone(),
            table_counters: self.table.sozu_counters(),
            datadir: self.datadir.clone(),
            muhash: self.muhash.clone(),
            assume_valid: self.assume_valid.setting(),
            address_index: self.address_index.write && self.address_index.complete,
        }
    }

    /// Publishes the current state: the writer's progress (index and
    /// counters) always, the readers' snapshot only when everything is
    /// durable (no group open). Called at the end of `open`, of every block
    /// boundary (`connect`, `switch_tip`), of a block submission, of a
    /// header batch and of a group.
    fn publish(&self) {
        let progress = crate::snapshot::Progress {
            index: self.index.core().clone(),
            stats: self.stats.clone(),
        };
        let snapshot = self.group.is_none().then(|| self.current());
        self.published.publish(snapshot, progress);
    }

    /// Counters since start-up.
    pub fn stats(&self) -> &PipelineStats {
        &self.stats
    }

    /// The assumevalid setting blocks are connected under (the network's
    /// default, [`AssumeValid::default_for`], until set).
    pub fn assume_valid(&self) -> AssumeValid {
        self.assume_valid.setting()
    }

    /// Sets the assumevalid setting for the blocks connected from now on
    /// (`kakehi --assumevalid`), and publishes it to readers.
    pub fn set_assume_valid(&mut self, setting: AssumeValid) {
        self.assume_valid = AssumeValidState::new(setting);
        self.last_script_check = None;
        self.publish();
    }

    /// Sets how many threads verify a block's scripts, the writer's own
    /// included (default: the machine's available parallelism).
    pub fn set_script_threads(&mut self, threads: std::num::NonZeroUsize) {
        self.script_threads = threads;
        self.script_pool = None;
    }

    /// The datadir.
    pub fn datadir(&self) -> &Path {
        &self.datadir
    }

    /// The storage error that stopped every write (a block boundary that
    /// failed half-way: a full disk, an I/O error), if one did. Its message
    /// names the file or store. A node that sees it must stop and be
    /// restarted, which reconciles the stores (Core's `AbortNode` on a
    /// fatal write error, `validation.cpp`).
    pub fn write_failure(&self) -> Option<&Arc<PipelineError>> {
        self.failed.as_ref()
    }

    fn record(&self, id: BlockId) -> Option<BlockRecord> {
        let e = self.index.get(id)?;
        let none = BlockMeta::default();
        let m = self.meta.get(id.0 as usize).unwrap_or(&none);
        Some(BlockRecord {
            header: e.header,
            height: e.height,
            chainwork: e.chainwork.to_be_bytes(),
            status: e.status,
            prev: e.prev,
            data: m.data,
            filter: m.filter,
            spent: m.spent,
            filter_header: m.filter_header,
            txouts: m.txouts,
            total_sats: m.total_sats,
            tx_count: m.tx_count,
            reject_reason: m.reject_reason.clone(),
        })
    }

    fn put_record(&self, batch: &mut WriteBatch, id: BlockId) {
        if let Some(r) = self.record(id) {
            batch.put_block(id, &r);
        }
    }

    /// Extends the per-block metadata to hold `id`. It covers the ids up
    /// to the last block given any (data, a filter, a reject reason):
    /// header-only entries after it, most of an index during a headers
    /// sync, hold none (readers see no metadata, as for a default one).
    fn ensure_meta(&mut self, id: BlockId) {
        while self.meta.len() <= id.0 as usize {
            self.meta.push_back(BlockMeta::default());
        }
    }

    /// Calls `f` with every output unspent on the active chain, with its
    /// creation height on that chain.
    ///
    /// # Errors
    /// UTXO-table failure.
    pub fn for_each_utxo(
        &mut self,
        f: &mut dyn FnMut(&OutPoint, &Coin, u32),
    ) -> Result<(), PipelineError> {
        self.write_unwritten()?;
        let view = self.index.view(self.index.tip().id);
        self.table.for_each(&mut |e| {
            if let ViewStatus::Unspent = e.status_in(&view) {
                let h = e.creation_height_in(&view).unwrap_or(e.coin.height);
                f(&e.outpoint, &e.coin, h);
            }
        })?;
        Ok(())
    }
}
