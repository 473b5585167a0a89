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
//! [`PURGE_DEPTH`] blocks are refused.
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

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bitcoin::bip158::FilterHeader;
use bitcoin::consensus::serialize;
use bitcoin::hashes::Hash;
use bitcoin::hex::DisplayHex;
use bitcoin::{Block, BlockHash, OutPoint};

use crate::chain::assumevalid::{AssumeValid, AssumeValidState};
use crate::chain::index::{BlockIndex, BlockStatus, IndexEntry};
use crate::chain::ChainParams;
use crate::filters;
use crate::muhash::MuHash3072;
use crate::primitives::{BlockId, Coin};
use crate::snapshot::{BlockMeta, ChainSnapshot, Snapshots};
use crate::sozu::{
    BlockWrite, CommitTag, Consumption, NewOutput, SozuError, UtxoReader, UtxoTable, ViewStatus,
    PURGE_DEPTH,
};
use crate::store::{
    sync_concurrently, BlockRecord, FlatFiles, FlatPos, Store, StoreError, WriteBatch,
    META_ADDRESS_INDEX, META_FLAT_BLOCKS, META_FLAT_FILTERS, META_FLAT_HEADERS, META_FLAT_SPENT,
    META_SOZU_BASE, META_SOZU_LAST, META_TIP,
};
use crate::validation::script::BlockScriptError;
use crate::validation::{self, BlockContext, BlockError, SpentOutput};

mod address_index;
mod group;
mod load;
mod scripts;
mod sealing;
pub mod spent;
use crate::store::headers::encode_headers;
use address_index::AddressIndexState;
pub use address_index::BuildProgress;
use group::{GroupEntry, PendingGroup};
pub use group::{GroupLimits, MAX_TIP_AGE_SECS};
use spent::encode_spent;

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
    /// A record read back from a flat file contradicts what was committed
    /// for it (a filter the filter-header chain does not bind, a block whose
    /// hash, merkle root or witness commitment is wrong): the file is
    /// damaged. Nothing is served from it.
    #[error("{path}: the stored {what} of block {block} is corrupt ({reason}); restore the datadir from a backup or resync")]
    CorruptRecord {
        /// The flat file.
        path: std::path::PathBuf,
        /// The block the record belongs to.
        block: BlockHash,
        /// Which record ("block", "filter").
        what: &'static str,
        /// What does not match.
        reason: &'static str,
    },
    /// A spent-output record of the `spent/` flat files does not decode.
    #[error("{path}: spent outputs of block {}: {source}; restore the datadir from a backup or resync", block.0)]
    CorruptSpent {
        /// The flat file.
        path: std::path::PathBuf,
        /// The block whose record is corrupt.
        block: BlockId,
        /// What is wrong with it.
        #[source]
        source: spent::SpentRecordError,
    },
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

/// What connecting a valid block writes.
struct ValidBlock {
    /// The UTXO table's write.
    write: BlockWrite,
    /// The outputs it spends, in block order.
    spent: Vec<SpentOutput>,
    /// The outputs it creates, in block order.
    created: Vec<(OutPoint, Coin)>,
}

/// Counters since start-up.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PipelineStats {
    /// Blocks connected to the UTXO table.
    pub blocks_connected: u64,
    /// Blocks rejected (invalid, orphan, mutated).
    pub blocks_rejected: u64,
    /// Reorganisations (active tip moved to a block that does not extend it).
    pub reorgs: u64,
    /// Reorgs refused for being deeper than 100 blocks.
    pub reorgs_refused: u64,
    /// Wall time spent in [`Chainstate::submit_block`] (checks, storage,
    /// connection, commits), microseconds: against the elapsed time of a
    /// sync it tells how much of it the pipeline took.
    pub submit_micros: u64,
    /// Wall time spent computing the UTXO set's MuHash deltas (blocks
    /// connected and disconnected), microseconds.
    pub muhash_micros: u64,
    /// Inputs whose scripts Core's interpreter verified (blocks rejected
    /// for a script included).
    pub inputs_verified: u64,
    /// Wall time of script verification, microseconds (it overlaps the
    /// filter and MuHash work of the same block).
    pub script_micros: u64,
    /// Blocks connected without script verification (assumevalid).
    pub blocks_assumed_valid: u64,
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
    /// Sealed epochs of spent outputs (`datadir/archive`).
    archive: crate::archive::Archive,
    /// Set when a block boundary failed half-way (storage error between
    /// the index commit and the table's): the in-memory state may be ahead
    /// of the disk, so every later write is refused until a restart, which
    /// reconciles the stores.
    failed: Option<Arc<PipelineError>>,
    /// Where snapshots are published.
    published: Snapshots,
    /// The epoch seal running in the background, if any (`sealing`).
    sealing: Option<sealing::SealJob>,
    /// MuHash state of the UTXO set at the active tip (`utxo_hash`).
    muhash: Arc<MuHash3072>,
    /// Bounds of a group of blocks made durable together while catching
    /// up (`group`); [`GroupLimits::PER_BLOCK`] unless set.
    group_limits: GroupLimits,
    /// The open group, if any: connected blocks not durable yet.
    group: Option<PendingGroup>,
    /// Index rows of the open group's blocks, not committed yet; every
    /// write starts its batch from it ([`Chainstate::take_batch`]).
    pending: WriteBatch,
    /// When block scripts may be skipped (assumevalid).
    assume_valid: AssumeValidState,
    /// The last reason logged for checking scripts (`None`: skipping),
    /// so the log says when it changes, as Core's does.
    last_script_check: Option<Option<&'static str>>,
    /// Threads that verify a block's scripts (the caller's included).
    script_threads: std::num::NonZeroUsize,
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

fn flat_pos_bytes(p: FlatPos) -> Vec<u8> {
    let mut v = p.file.to_be_bytes().to_vec();
    v.extend_from_slice(&p.len.to_be_bytes());
    v
}

/// Decodes a committed flat-file position stored under meta key `name`
/// (see [`META_FLAT_BLOCKS`]); a missing key is a fresh datadir (position 0).
///
/// # Errors
/// [`PipelineError::Inconsistent`] when the value is not 12 bytes: the
/// files must not be truncated to a position read from a corrupt row.
fn flat_pos_from(name: &str, bytes: Option<Vec<u8>>) -> Result<FlatPos, PipelineError> {
    let Some(b) = bytes else {
        return Ok(FlatPos::default());
    };
    let a: [u8; 12] = b
        .as_slice()
        .try_into()
        .map_err(|_| PipelineError::Inconsistent {
            reason: format!(
                "meta key {name} holds {} bytes; a flat-file position has 12",
                b.len()
            ),
        })?;
    let file = u32::from_be_bytes([a[0], a[1], a[2], a[3]]);
    let len = u64::from_be_bytes([a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11]]);
    Ok(FlatPos { file, len })
}

impl Chainstate {
    /// Opens the chain state in `datadir` with the UTXO table `table` and
    /// an index-database page cache of `index_cache_mib` MiB
    /// ([`crate::store::DEFAULT_INDEX_CACHE_MIB`]), reconciling the stores
    /// after a crash (flat files truncated to their committed length; a
    /// UTXO-table commit missing after the index's is replayed).
    ///
    /// # Errors
    /// [`PipelineError`] when a store fails or the datadir is inconsistent.
    pub fn open(
        params: ChainParams,
        datadir: &Path,
        table: Box<dyn UtxoTable + Send>,
        index_cache_mib: usize,
    ) -> Result<Self, PipelineError> {
        let store = Store::open(&datadir.join("index"), index_cache_mib)?;
        let magic = params.magic();
        let pos = |name: &str| -> Result<FlatPos, PipelineError> {
            flat_pos_from(name, store.meta(name)?)
        };
        let blocks = FlatFiles::open(
            &datadir.join("blocks"),
            "blk",
            magic,
            MAX_FLAT_FILE_SIZE,
            pos(META_FLAT_BLOCKS)?,
        )?;
        let filters = FlatFiles::open(
            &datadir.join("filters"),
            "flt",
            magic,
            MAX_FLAT_FILE_SIZE,
            pos(META_FLAT_FILTERS)?,
        )?;
        let spent = FlatFiles::open(
            &datadir.join("spent"),
            "sp",
            magic,
            MAX_FLAT_FILE_SIZE,
            pos(META_FLAT_SPENT)?,
        )?;

        let headers = FlatFiles::open(
            &datadir.join("headers"),
            "hdr",
            magic,
            MAX_FLAT_FILE_SIZE,
            pos(META_FLAT_HEADERS)?,
        )?;
        let (index, meta) =
            load::load_index(&params, &store, &headers.reader(), headers.position())?;
        let archive =
            crate::archive::Archive::open(&datadir.join("archive"), params.archive_epoch_length)?;
        let utxo = table.reader();
        let datadir: Arc<Path> = Arc::from(datadir);
        let first = ChainSnapshot {
            index: index.core().clone(),
            meta: meta.clone(),
            store: store.clone(),
            blocks: blocks.reader(),
            filters: filters.reader(),
            spent: spent.reader(),
            archive: archive.clone(),
            utxo: utxo.clone(),
            stats: PipelineStats::default(),
            table_counters: None,
            datadir: datadir.clone(),
            muhash: Arc::new(MuHash3072::new()),
            assume_valid: AssumeValid::default_for(&params),
            address_index: false,
        };
        let mut cs = Chainstate {
            archive,
            index,
            meta,
            store,
            blocks,
            filters,
            spent,
            headers,
            table,
            utxo,
            refused_tips: HashSet::new(),
            stats: PipelineStats::default(),
            datadir,
            failed: None,
            published: Snapshots::new(first),
            muhash: Arc::new(MuHash3072::new()),
            group_limits: GroupLimits::PER_BLOCK,
            sealing: None,
            group: None,
            pending: WriteBatch::default(),
            assume_valid: AssumeValidState::new(AssumeValid::default_for(&params)),
            last_script_check: None,
            script_threads: std::thread::available_parallelism()
                .unwrap_or(std::num::NonZeroUsize::MIN),
            last_reject: None,
            address_index: AddressIndexState {
                write: true,
                complete: false,
            },
        };
        if cs.store.meta(META_TIP)?.is_none() {
            // New datadir: persist genesis.
            let mut batch = WriteBatch::default();
            cs.put_record(&mut batch, BlockId(0));
            batch.put_active(0, BlockId(0));
            batch.put_meta(META_TIP, &0u32.to_be_bytes());
            // The address index starts complete (genesis has no rows: its
            // output is not spendable, Core never adds it to the UTXO set).
            batch.put_meta(META_ADDRESS_INDEX, &[1]);
            cs.store.commit(batch)?;
        }
        cs.load_address_index()?;
        cs.check_flat_lengths()?;
        cs.reconcile_table()?;
        cs.load_muhash()?;
        cs.seal_final_epochs()?;
        cs.publish();
        Ok(cs)
    }

    /// Checks that no flat file is shorter than the records the index
    /// points into it: a file truncated after its commit would otherwise
    /// open fine and fail (or serve nothing) only when a record past the cut
    /// is read.
    ///
    /// # Errors
    /// [`PipelineError::Flat`] with [`crate::store::FlatFileError::Truncated`]
    /// naming the file.
    fn check_flat_lengths(&self) -> Result<(), PipelineError> {
        use std::collections::BTreeMap;
        let mut ends: [BTreeMap<u32, u64>; 3] = Default::default();
        for m in self.meta.iter() {
            for (series, loc) in [m.data, m.filter, m.spent].into_iter().enumerate() {
                if let Some(loc) = loc {
                    let end = ends[series].entry(loc.file).or_default();
                    *end = (*end).max(loc.offset + u64::from(loc.len));
                }
            }
        }
        let [data, filters, spent] = ends;
        self.blocks.reader().check_lengths(&data)?;
        self.filters.reader().check_lengths(&filters)?;
        self.spent.reader().check_lengths(&spent)?;
        Ok(())
    }

    /// Replays the last boundary's writes to the UTXO table if the table's
    /// commit did not happen (crash between the index's commit and the
    /// table's): one block, or the group of blocks that boundary made
    /// durable.
    fn reconcile_table(&mut self) -> Result<(), PipelineError> {
        let Some(last) = self
            .store
            .meta(META_SOZU_LAST)?
            .and_then(|b| <u32 as crate::store::Codec>::decode(&b))
        else {
            // No block was ever connected per the index: the table must be
            // empty too (an index database that lost its rows would
            // otherwise open at genesis beside a full table).
            return match self.table.committed() {
                None => Ok(()),
                Some(tag) => Err(PipelineError::Inconsistent {
                    reason: format!(
                        "the UTXO table ({}/utxo) holds blocks up to height {}, but the index \
                         database ({}/index) has none connected: it lost its rows; restore the \
                         datadir from a backup or resync",
                        self.datadir.display(),
                        tag.height,
                        self.datadir.display()
                    ),
                }),
            };
        };
        let last = BlockId(last);
        let committed = self.table.committed().map(|t| t.block);
        if committed == Some(last) {
            return Ok(());
        }
        let Some(entry) = self.index.get(last).cloned() else {
            return Err(PipelineError::Inconsistent {
                reason: format!("sozu_last {} not in the index", last.0),
            });
        };
        // Only the last boundary's table commit may be missing (the index
        // commits first): the table must be exactly where that boundary's
        // writes began. A table further behind lost commits it had made
        // durable, and replaying on top of it would build a wrong UTXO set.
        let (base, first) = match self.store.meta(META_SOZU_BASE)? {
            Some(b) => group::decode_base(&b).ok_or_else(|| PipelineError::Inconsistent {
                reason: format!("meta key {META_SOZU_BASE} holds {} bytes, not 8", b.len()),
            })?,
            // A datadir from before groups: one block on its parent.
            None => (entry.prev.unwrap_or(BlockId(0)), last),
        };
        if committed.unwrap_or(BlockId(0)) != base {
            let table_height = committed
                .and_then(|c| self.index.get(c))
                .map_or_else(|| "empty".to_owned(), |e| format!("at height {}", e.height));
            return Err(PipelineError::Inconsistent {
                reason: format!(
                    "the UTXO table ({}/utxo) is {table_height}, but the index database has \
                     connected blocks up to height {}: the table lost commits; restore the \
                     datadir from a backup or resync",
                    self.datadir.display(),
                    entry.height
                ),
            });
        }
        tracing::warn!(height = entry.height, block_hash = %entry.hash, "UTXO table is behind the index: replaying its last boundary");
        self.replay_group(first, last)?;
        if self.table.committed().map(|t| t.block) != Some(last) {
            return Err(PipelineError::Inconsistent {
                reason: "UTXO table commit did not take".into(),
            });
        }
        Ok(())
    }

    /// The network parameters.
    pub fn params(&self) -> &ChainParams {
        self.index.params()
    }

    /// The writer's block index (its read core, [`ChainIndex`], through
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
            archive: self.archive.clone(),
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
        let view = self.index.view(self.index.tip().id);
        self.table.for_each(&mut |e| {
            if let ViewStatus::Unspent = e.status_in(&view) {
                let h = e.creation_height_in(&view).unwrap_or(e.coin.height);
                f(&e.outpoint, &e.coin, h);
            }
        })?;
        Ok(())
    }

    /// Writes the UTXO set of the active chain in the text form of Core's
    /// `dumptxoutset` as `testnet-data/regtest-a/utxos.txt` has it: one line
    /// per output, `txid:vout value_sats scriptPubKey_hex height coinbase`,
    /// sorted by txid (display hex) then vout.
    ///
    /// # Errors
    /// UTXO-table failure or a write error.
    pub fn dump_utxos(&mut self, out: &mut dyn std::io::Write) -> Result<(), DumpError> {
        let mut rows = Vec::new();
        self.for_each_utxo(&mut |op, coin, height| {
            rows.push((
                op.txid.to_string(),
                op.vout,
                coin.value.to_sat(),
                coin.script_pubkey.clone(),
                height,
                coin.coinbase,
            ));
        })?;
        rows.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut buf = std::io::BufWriter::new(out);
        for (txid, vout, value, script, height, coinbase) in rows {
            let script = script.to_lower_hex_string();
            writeln!(
                buf,
                "{txid}:{vout} {value} {script} {height} {}",
                u8::from(coinbase)
            )?;
        }
        buf.flush()?;
        Ok(())
    }

    /// Submits one block: header checks, context-free checks, storage, and
    /// activation of the best chain (which may connect it, or a whole branch).
    ///
    /// # Errors
    /// Storage failure only; invalid blocks are [`SubmitOutcome::Rejected`].
    pub fn submit_block(&mut self, block: &Block) -> Result<SubmitOutcome, PipelineError> {
        let started = std::time::Instant::now();
        let outcome = self.submit_block_timed(block);
        let outcome = self.guard_writes(outcome);
        self.stats.submit_micros = self
            .stats
            .submit_micros
            .saturating_add(started.elapsed().as_micros() as u64);
        if outcome.is_ok() {
            self.publish();
        }
        outcome
    }

    fn submit_block_timed(&mut self, block: &Block) -> Result<SubmitOutcome, PipelineError> {
        self.check_not_failed()?;
        let hash = block.block_hash();
        if let Some(e) = self.index.by_hash(&hash) {
            if e.status.has_data() {
                return Ok(SubmitOutcome::Duplicate);
            }
            if e.status.is_invalid() {
                return Ok(self.reject(
                    DUPLICATE_INVALID,
                    format!("block {hash} is already known invalid"),
                ));
            }
        }
        let id = match self.index.accept_header(&block.header, now_secs()) {
            Ok(id) => id,
            Err(e) => return Ok(self.reject(e.reject_reason(), e.to_string())),
        };
        self.ensure_meta(id);
        let entry = self
            .index
            .get(id)
            .cloned()
            .ok_or_else(|| PipelineError::Inconsistent {
                reason: "accepted header vanished".into(),
            })?;
        let parent = entry.prev.unwrap_or(BlockId(0));
        let ctx_mtp = self.index.median_time_past(parent);
        let ctx = BlockContext {
            params: self.index.params(),
            height: entry.height,
            block_hash: hash,
            prev_median_time_past: ctx_mtp,
            median_time_past_at: &|h| {
                self.index
                    .ancestor(parent, h)
                    .map(|a| self.index.median_time_past(a.id))
            },
        };
        if let Err(e) = validation::check_block(block, &ctx) {
            let reason = e.reject_reason();
            let detail = e.to_string();
            if e.is_mutation() {
                // A mutated block (CVE-2012-2459 and friends) says nothing
                // about the header: another body may be valid. The header
                // stays headers-only, and is stored as such so ids on disk
                // stay dense.
                let mut batch = self.take_batch();
                self.put_record(&mut batch, id);
                self.commit_boundary(batch)?;
                return Ok(self.reject(reason, detail));
            }
            let changed = self.index.mark_invalid(id);
            self.meta[id.0 as usize].reject_reason = reason.to_string();
            let mut batch = self.take_batch();
            for changed in changed {
                self.put_record(&mut batch, changed);
            }
            self.commit_boundary(batch)?;
            tracing::warn!(height = entry.height, block_hash = %hash, reason, "block rejected: {detail}");
            return Ok(self.reject(reason, detail));
        }
        // Store the data (durable with the commit that first points to it).
        let raw = serialize(block);
        let loc = self.blocks.append(&raw)?;
        self.meta[id.0 as usize].data = Some(loc);
        self.meta[id.0 as usize].tx_count = block.txdata.len() as u32;
        self.index.set_status(id, BlockStatus::HaveData);
        let mut batch = self.take_batch();
        self.put_record(&mut batch, id);
        batch.put_meta(META_FLAT_BLOCKS, &flat_pos_bytes(self.blocks.position()));
        let tip = self.index.tip().id;
        if entry.prev == Some(tip)
            && self.index.best_candidate() == id
            && !self.refused_tips.contains(&id)
        {
            // The block extends the active tip and is the best candidate
            // (the common case: import, sync): storing and connecting it is
            // one block boundary, one commit (or one block of a group
            // while catching up).
            self.connect(id, Some(block), batch)?;
        } else {
            self.commit_boundary(batch)?;
        }
        self.activate_best_chain()?;
        let status = self.index.get(id).map(|e| e.status);
        if status.is_some_and(|s| s.is_invalid()) {
            let m = &self.meta[id.0 as usize];
            let detail = match self.last_reject.take() {
                Some((rejected, detail)) if rejected == id => detail,
                _ => format!("block {hash} is invalid: {}", m.reject_reason),
            };
            return Ok(SubmitOutcome::Rejected {
                reason: m.reject_reason.clone(),
                detail,
            });
        }
        let tip = self.index.tip();
        Ok(SubmitOutcome::Accepted {
            tip: tip.hash,
            height: tip.height,
        })
    }

    /// Stops every later write after `cause` broke a block boundary
    /// half-way; returns the [`PipelineError::Failed`] to report, which
    /// keeps `cause` as its source.
    fn stop_writes(&mut self, cause: PipelineError) -> PipelineError {
        let source = Arc::new(cause);
        self.failed = Some(source.clone());
        PipelineError::Failed { source }
    }

    fn check_not_failed(&self) -> Result<(), PipelineError> {
        match &self.failed {
            Some(source) => Err(PipelineError::Failed {
                source: source.clone(),
            }),
            None => Ok(()),
        }
    }

    fn reject(&mut self, reason: &str, detail: String) -> SubmitOutcome {
        self.stats.blocks_rejected += 1;
        SubmitOutcome::Rejected {
            reason: reason.to_string(),
            detail,
        }
    }

    /// Moves the active tip to the most-work valid chain whose data is
    /// stored, connecting blocks one by one.
    fn activate_best_chain(&mut self) -> Result<(), PipelineError> {
        loop {
            let candidate = self.index.best_candidate();
            let tip = self.index.tip().id;
            if candidate == tip || self.refused_tips.contains(&candidate) {
                return Ok(());
            }
            let Some(fork) = self.index.fork_point(tip, candidate) else {
                return Ok(());
            };
            let fork_height = self.index.get(fork).map(|e| e.height).unwrap_or(0);
            let depth = self.index.tip_height() - fork_height;
            if depth > PURGE_DEPTH {
                let c = self.index.get(candidate).map(|e| (e.hash, e.height));
                tracing::error!(depth, candidate = ?c, "reorg deeper than {PURGE_DEPTH} blocks refused");
                self.refused_tips.insert(candidate);
                self.stats.reorgs_refused += 1;
                return Ok(());
            }
            if fork != tip {
                self.stats.reorgs += 1;
                tracing::info!(depth, fork_height, "reorganisation");
                // A group is one branch: make it durable before leaving it.
                self.flush()?;
            }
            for id in self.index.path_from(fork, candidate) {
                let status = self.index.get(id).map(|e| e.status);
                let ok = match status {
                    Some(BlockStatus::Valid) => {
                        self.switch_tip(id)?;
                        true
                    }
                    Some(BlockStatus::HaveData) => {
                        let batch = self.take_batch();
                        self.connect(id, None, batch)?
                    }
                    _ => false,
                };
                if !ok {
                    break;
                }
            }
        }
    }

    /// Makes the already-validated block `id` the active tip (a view switch:
    /// no UTXO-table work) and commits.
    fn switch_tip(&mut self, id: BlockId) -> Result<(), PipelineError> {
        let mut batch = self.take_batch();
        self.muhash_to(&mut batch, id, None)?;
        self.set_active(&mut batch, id);
        self.commit_boundary(batch)?;
        self.seal_final_epochs()?;
        self.publish();
        Ok(())
    }

    /// Sets `id` as active tip in memory and records the height rows and the
    /// tip marker in `batch`.
    fn set_active(&mut self, batch: &mut WriteBatch, id: BlockId) {
        let old_height = self.index.tip_height();
        let fork_height = self.index.set_active_tip(id);
        let new_height = self.index.tip_height();
        for h in fork_height + 1..=new_height {
            if let Some(e) = self.index.active_at(h) {
                batch.put_active(h, e.id);
            }
        }
        for h in new_height + 1..=old_height {
            batch.remove_active(h);
        }
        batch.put_meta(META_TIP, &id.0.to_be_bytes());
    }

    /// Validates block `entry` against the table under the view of its
    /// parent's branch.
    ///
    /// # Errors
    /// [`PipelineError`] when the table or the index database fails; an
    /// invalid block is a [`Verdict::Invalid`], not an error.
    fn validate(
        &mut self,
        block: &Block,
        entry: &IndexEntry,
        parent: BlockId,
    ) -> Result<Verdict, PipelineError> {
        let txids: HashSet<bitcoin::Txid> = block.txdata.iter().map(|t| t.compute_txid()).collect();
        let mut keys: Vec<OutPoint> = Vec::new();
        for tx in block.txdata.iter().skip(1) {
            for input in &tx.input {
                if !txids.contains(&input.previous_output.txid) {
                    keys.push(input.previous_output);
                }
            }
        }
        // BIP30 candidates and proof of absence: a txid never stored before
        // cannot have outputs in the table (BIP34 makes txids unique; only a
        // transaction seen in another block may already be there). A txid
        // prefix shared with another transaction only adds keys the table
        // answers exactly.
        let mut seen_before = HashSet::new();
        for tx in &block.txdata {
            let txid = tx.compute_txid();
            let in_group = self.group.as_ref().is_some_and(|g| g.has_tx(&txid));
            if in_group || self.store.tx_maybe_known(&txid)? {
                seen_before.insert(txid);
                for vout in 0..tx.output.len() as u32 {
                    keys.push(OutPoint { txid, vout });
                }
            }
        }
        let entries = self.table.get_batch(&keys)?;
        let view = self.index.view(parent);
        let mut coins = HashMap::with_capacity(keys.len());
        for e in entries.into_iter().flatten() {
            if let ViewStatus::Unspent = e.status_in(&view) {
                let height = e.creation_height_in(&view).unwrap_or(e.coin.height);
                coins.insert(
                    e.outpoint,
                    Coin {
                        height,
                        ..e.coin.clone()
                    },
                );
            }
        }
        let ctx = BlockContext {
            params: self.index.params(),
            height: entry.height,
            block_hash: entry.hash,
            prev_median_time_past: self.index.median_time_past(parent),
            median_time_past_at: &|h| {
                self.index
                    .ancestor(parent, h)
                    .map(|a| self.index.median_time_past(a.id))
            },
        };
        // `check_block` already passed when the block was stored
        // (`submit_block`), against the same parent: only the UTXO checks
        // remain.
        let effects = match validation::connect_block(block, &ctx, &coins) {
            Ok(fx) => fx,
            Err(e) => return Ok(Verdict::Invalid(e)),
        };
        let write = BlockWrite {
            block: entry.id,
            height: entry.height,
            created: effects
                .created
                .iter()
                .map(|(op, coin)| NewOutput {
                    outpoint: *op,
                    coin: coin.clone(),
                    known_absent: !seen_before.contains(&op.txid),
                })
                .collect(),
            spent: effects
                .spent
                .iter()
                .map(|s| {
                    (
                        s.outpoint,
                        Consumption {
                            block: entry.id,
                            txid: s.txid,
                            vin: s.vin,
                        },
                    )
                })
                .collect(),
        };
        Ok(Verdict::Valid(ValidBlock {
            write,
            spent: effects.spent,
            created: effects.created,
        }))
    }

    /// Connects the stored block `id` (whose parent is the active tip).
    /// Returns false if the block is invalid (it is then marked so).
    ///
    /// `block` is the block when the caller has it decoded (else it is read
    /// back from the block files); `batch` holds index rows to commit with
    /// this block boundary (the block's storage record when it is stored
    /// and connected in one commit: its bytes, appended to the block files,
    /// are synced with the filter and spent-output files before the index
    /// commit that points to them).
    fn connect(
        &mut self,
        id: BlockId,
        block: Option<&Block>,
        mut batch: WriteBatch,
    ) -> Result<bool, PipelineError> {
        let entry = self
            .index
            .get(id)
            .cloned()
            .ok_or_else(|| PipelineError::Inconsistent {
                reason: format!("block id {} not in index", id.0),
            })?;
        let parent = entry.prev.unwrap_or(BlockId(0));
        let read;
        let block = match block {
            Some(b) => b,
            None => {
                read =
                    self.current()
                        .read_block(id)?
                        .ok_or_else(|| PipelineError::Inconsistent {
                            reason: format!("block {} has no data", entry.hash),
                        })?;
                &read
            }
        };
        let started = std::time::Instant::now();
        let ValidBlock {
            write,
            spent,
            created,
        } = match self.validate(block, &entry, parent)? {
            Verdict::Valid(v) => v,
            Verdict::Invalid(e) => {
                return self.reject_connecting(id, &entry, e.reject_reason(), &e, batch)
            }
        };
        // Economic checks passed: now the scripts, while the filter and the
        // MuHash delta are built. Nothing is written before their verdict.
        let (filter, delta) = match self.scripts_filter_delta(block, &entry, &spent) {
            Ok(scripts::ScriptsOutcome::Passed { filter, delta }) => (filter, *delta),
            Ok(scripts::ScriptsOutcome::Failed(e)) => {
                let reason = e
                    .reject_reason()
                    .unwrap_or(validation::script::BLOCK_SCRIPT_FAILURE);
                return self.reject_connecting(id, &entry, reason, &e, batch);
            }
            Err(e @ PipelineError::ScriptEngine { .. }) => return Err(self.stop_writes(e)),
            Err(e) => return Err(e),
        };
        let prev_header = FilterHeader::from_byte_array(self.meta[parent.0 as usize].filter_header);
        let prev_header = if parent == BlockId(0) {
            self.current()
                .filter(BlockId(0))?
                .map(|(_, h)| h)
                .unwrap_or(prev_header)
        } else {
            prev_header
        };
        let header = filters::filter_header(&filter, &prev_header);

        // Flat files first: the block's own bytes (when stored by this
        // commit), filter and spent outputs.
        let filter_loc = self.filters.append(&filter.content)?;
        let spent_loc = self.spent.append(&encode_spent(&spent))?;

        // Index batch.
        let pm = &self.meta[parent.0 as usize];
        let created_value: u64 = created.iter().map(|(_, c)| c.value.to_sat()).sum();
        let spent_value: u64 = spent.iter().map(|s| s.coin.value.to_sat()).sum();
        let txouts = (pm.txouts + created.len() as u64).saturating_sub(spent.len() as u64);
        let total = (pm.total_sats + created_value).saturating_sub(spent_value);
        {
            let m = &mut self.meta[id.0 as usize];
            m.filter = Some(filter_loc);
            m.spent = Some(spent_loc);
            m.filter_header = header.to_byte_array();
            m.txouts = txouts;
            m.total_sats = total;
        }
        self.muhash_to(&mut batch, id, Some((id, &delta)))?;
        self.index.set_status(id, BlockStatus::Valid);
        self.set_active(&mut batch, id);
        self.put_record(&mut batch, id);
        let txids: Vec<bitcoin::Txid> = block.txdata.iter().map(|t| t.compute_txid()).collect();
        for (pos, txid) in txids.iter().enumerate() {
            batch.put_tx(txid, id, pos as u32);
        }
        for s in &spent {
            batch.put_spend(&s.outpoint, id);
        }
        if self.address_index.write {
            address_index::put_block_rows(&mut batch, block, &txids, (id, entry.height), &spent);
        }
        batch.put_meta(META_FLAT_FILTERS, &flat_pos_bytes(self.filters.position()));
        batch.put_meta(META_FLAT_SPENT, &flat_pos_bytes(self.spent.position()));
        batch.put_meta(META_SOZU_LAST, &id.0.to_be_bytes());
        let tag = CommitTag {
            block: id,
            height: entry.height,
            block_hash: entry.hash.to_byte_array(),
        };
        let bytes = self.meta[id.0 as usize]
            .data
            .map_or(0, |l| u64::from(l.len));
        let grouped = self.joins_group(entry.header.time, bytes, started);
        if grouped {
            let add = GroupEntry {
                tag,
                bytes,
                started,
                txids: &txids,
            };
            self.add_to_group(batch, &write, add)?;
        } else {
            self.put_sozu_base(&mut batch, id);
            self.durable_connect(batch, &write, tag)?;
        }
        self.stats.blocks_connected += 1;
        tracing::info!(
            height = entry.height,
            block_hash = %entry.hash,
            txs = block.txdata.len(),
            ms = started.elapsed().as_millis() as u64,
            grouped,
            "connected block"
        );
        if !grouped {
            self.seal_final_epochs()?;
            self.publish();
        }
        Ok(true)
    }

    /// The durable end of a connect (of the block alone, or of the group it
    /// closes): flat files synced together, then the index batch, on a
    /// helper thread, while this one applies `write` to the UTXO table in
    /// memory (`write_block` is not durable: nothing of it reaches the disk
    /// before the table's commit); then the table's commit of `tag`.
    ///
    /// # Errors
    /// Storage failure: writes stop ([`PipelineError::Failed`]), the table
    /// may hold writes the index lacks.
    fn durable_connect(
        &mut self,
        batch: WriteBatch,
        write: &BlockWrite,
        tag: CommitTag,
    ) -> Result<(), PipelineError> {
        let (durable, written) = {
            let (blocks, filters, spent_files, store) = (
                &mut self.blocks,
                &mut self.filters,
                &mut self.spent,
                &self.store,
            );
            let table = &mut self.table;
            let index = self.index.core();
            let span = tracing::Span::current();
            std::thread::scope(|s| {
                let flat_then_index = s.spawn(move || {
                    span.in_scope(|| -> Result<(), PipelineError> {
                        sync_concurrently(&mut [blocks, filters, spent_files])?;
                        store.commit(batch)?;
                        Ok(())
                    })
                });
                let written = table.write_block(write, index, &mut |_| {});
                let durable = flat_then_index.join().unwrap_or_else(|_| {
                    Err(PipelineError::Inconsistent {
                        reason: "index commit thread panicked".into(),
                    })
                });
                (durable, written)
            })
        };
        if let Err(e) = durable.and_then(|()| written.map_err(PipelineError::from)) {
            // The table holds an uncommitted block the index may lack (or
            // the reverse): refuse further writes; a restart reconciles.
            return Err(self.stop_writes(e));
        }
        // UTXO table last (the index names this block as sozu_last, so a
        // crash before the table's commit is replayed at start-up).
        self.group = None;
        if let Err(e) = self.table.commit(tag) {
            return Err(self.stop_writes(e.into()));
        }
        Ok(())
    }
}

/// Header storage for the P2P layer (`src/node/p2p_backend.rs`): headers
/// accepted without block data.
impl Chainstate {
    /// Checks `headers` (PoW, difficulty, timestamps, version, linkage; see
    /// [`BlockIndex::accept_header`]) one by one and stores the new ones with
    /// status [`BlockStatus::HeadersOnly`] (like Core's
    /// `ProcessNewBlockHeaders`): one record appended to the `headers/`
    /// files (`store::headers`), then one index-database batch with its
    /// committed length. Headers already known are skipped.
    ///
    /// Returns the number of new headers and the first refused header, if
    /// any; the headers before it stay stored.
    ///
    /// # Errors
    /// [`PipelineError`] when the index database fails.
    pub fn accept_headers(
        &mut self,
        headers: &[bitcoin::block::Header],
    ) -> Result<HeadersAccepted, PipelineError> {
        self.check_not_failed()?;
        let now = now_secs();
        let mut new_ids = Vec::new();
        let mut refused = None;
        for (i, header) in headers.iter().enumerate() {
            let before = self.index.len();
            match self.index.accept_header(header, now) {
                Ok(id) => {
                    if self.index.len() > before {
                        new_ids.push(id);
                    }
                }
                Err(error) => {
                    refused = Some(RefusedHeader { index: i, error });
                    break;
                }
            }
        }
        if !new_ids.is_empty() {
            // One record in the headers files, not a row per header.
            let items: Vec<(BlockId, bitcoin::block::Header)> = new_ids
                .iter()
                .filter_map(|id| self.index.get(*id).map(|e| (*id, e.header)))
                .collect();
            let stored = self.store_headers(&items);
            self.guard_writes(stored)?;
            self.seal_final_epochs()?;
            self.publish();
        }
        Ok(HeadersAccepted {
            new: new_ids.len(),
            refused,
        })
    }

    /// Appends `items` to the headers files and commits their length in
    /// one boundary (which ends any open group).
    fn store_headers(
        &mut self,
        items: &[(BlockId, bitcoin::block::Header)],
    ) -> Result<(), PipelineError> {
        self.headers.append(&encode_headers(items))?;
        let mut batch = self.take_batch();
        batch.put_meta(META_FLAT_HEADERS, &flat_pos_bytes(self.headers.position()));
        self.commit_boundary(batch)
    }

    /// Connects stored blocks that extend the best chain but are not
    /// connected yet (after a crash between storing a block's data and
    /// connecting it, nothing else would connect the last such block until
    /// another block arrives). A no-op when the tip is the best candidate.
    ///
    /// # Errors
    /// [`PipelineError`] when a store fails.
    pub fn activate_stored_blocks(&mut self) -> Result<(), PipelineError> {
        self.check_not_failed()?;
        let r = self.activate_best_chain();
        self.guard_writes(r)
    }
}
