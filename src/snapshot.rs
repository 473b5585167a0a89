//! [`ChainSnapshot`]: the read side every server uses. One committed block
//! boundary of the chain state, published by the writer (the block
//! pipeline's `Chainstate`) through [`Snapshots`] and read without locks by
//! HTTP, P2P serving and the CLI, while the writer goes on. This module
//! never names the writer: its reads fail with their own [`ReadError`], and
//! the writer's counters it publishes are its own [`PipelineStats`].

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use bitcoin::bip158::FilterHeader;
use bitcoin::consensus::deserialize;
use bitcoin::hashes::Hash;
use bitcoin::{Block, BlockHash, OutPoint};

use crate::chain::index::{BlockStatus, ChainIndex};
use crate::chain::ChainParams;
use crate::filters;
use crate::primitives::BlockId;
use crate::sozu::{ChainView, UtxoReader, ViewStatus, PURGE_DEPTH};
use crate::store::{FileLoc, FlatReader, SpentRecord, Store};
use crate::validation::SpentOutput;

mod block_txs;
mod error;
mod history;
mod memory;
mod stats;

pub use error::ReadError;
pub use history::{HistoryTx, ScriptStats, ScriptSummary, ScriptUtxo};
pub use memory::MemoryUse;
pub use stats::PipelineStats;

/// Per-block data that is not part of the chain index proper.
#[derive(Clone, Debug, Default)]
pub(crate) struct BlockMeta {
    pub(crate) data: Option<FileLoc>,
    pub(crate) filter: Option<FileLoc>,
    pub(crate) spent: Option<FileLoc>,
    pub(crate) filter_header: [u8; 32],
    pub(crate) txouts: u64,
    pub(crate) total_sats: u64,
    pub(crate) tx_count: u32,
    pub(crate) reject_reason: String,
}

/// The UTXO set summary of the active chain (like Core's `gettxoutsetinfo`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UtxoStats {
    /// Number of unspent outputs.
    pub txouts: u64,
    /// Their total value, sats.
    pub total_amount_sats: u64,
    /// Active tip hash.
    pub bestblock: BlockHash,
    /// Active tip height.
    pub height: u32,
    /// MuHash3072 of the UTXO set at the tip, hex as Bitcoin Core's
    /// `gettxoutsetinfo muhash` prints it ([`crate::muhash`]).
    pub muhash: String,
}

/// An immutable state of the chain as of one committed block boundary:
/// the block index's read core, the per-block metadata, read handles on
/// the stores and the sealed archive epochs. The writer publishes one at
/// the end of every operation that changes the chain state (through the
/// [`Snapshots`] handle it hands out as `Chainstate::snapshots`); readers
/// load the latest and keep it as long as they like, without locks, while
/// the writer goes on.
///
/// Cheap to publish: the index and metadata are persistent structures
/// shared with the writer's (a clone is O(1)), the stores are shared
/// handles. Reads see only committed data: flat-file locations come from
/// this snapshot's metadata (durable before it was published); rows of the
/// index database (sled) and entries of the UTXO table, which may already
/// hold later blocks, are filtered through this snapshot's index (blocks it
/// does not know, or that are not on its active chain, are ignored).
#[derive(Clone)]
pub struct ChainSnapshot {
    pub(crate) index: ChainIndex,
    pub(crate) meta: imbl::Vector<BlockMeta>,
    pub(crate) store: Store,
    pub(crate) blocks: Arc<FlatReader>,
    pub(crate) filters: Arc<FlatReader>,
    pub(crate) spent: Arc<FlatReader>,
    pub(crate) archive: crate::archive::Archive,
    /// Concurrent reads of the UTXO table's committed state (which may be
    /// ahead of this snapshot: entries are read under its view).
    pub(crate) utxo: Arc<dyn UtxoReader>,
    /// The address index is complete and kept by the writer
    /// (`pipeline/address_index.rs`): the history reads may be used.
    pub(crate) address_index: bool,
    pub(crate) stats: PipelineStats,
    pub(crate) table_counters: Option<crate::sozu::SozuStats>,
    pub(crate) datadir: Arc<Path>,
    /// MuHash state of the UTXO set at this snapshot's tip.
    pub(crate) muhash: Arc<crate::muhash::MuHash3072>,
    /// The assumevalid setting the writer connects blocks under.
    pub(crate) assume_valid: crate::chain::assumevalid::AssumeValid,
}

/// The handle readers hold: loads the latest published [`ChainSnapshot`]
/// (lock-free, `arc_swap`), and the writer's [`Progress`]. Cheap to clone;
/// every clone sees the same chain state's publications.
#[derive(Clone)]
pub struct Snapshots {
    snapshot: Arc<ArcSwap<ChainSnapshot>>,
    progress: Arc<ArcSwap<Progress>>,
}

/// The writer's own progress: its block index and counters after every
/// block it connects, durable or not. While the node catches up, blocks
/// are made durable in groups (`pipeline::GroupLimits`) and the
/// [`ChainSnapshot`] readers get is published once per group; the P2P sync
/// logic follows this instead, so it does not fetch again the blocks that
/// wait in a group. Serve nothing from it: its blocks may not be durable.
#[derive(Clone, Debug)]
pub struct Progress {
    /// The writer's block index (O(1) clone of its persistent core).
    pub index: ChainIndex,
    /// The writer's counters.
    pub stats: PipelineStats,
}

impl Snapshots {
    /// A handle whose first publication is `first`.
    pub(crate) fn new(first: ChainSnapshot) -> Self {
        let progress = Progress {
            index: first.index.clone(),
            stats: first.stats.clone(),
        };
        Snapshots {
            snapshot: Arc::new(ArcSwap::from_pointee(first)),
            progress: Arc::new(ArcSwap::from_pointee(progress)),
        }
    }

    /// Publishes `progress`, and `snapshot` when there is one (a durable
    /// state).
    pub(crate) fn publish(&self, snapshot: Option<ChainSnapshot>, progress: Progress) {
        if let Some(s) = snapshot {
            self.snapshot.store(Arc::new(s));
        }
        self.progress.store(Arc::new(progress));
    }

    /// The latest published snapshot (a committed block boundary). Never
    /// waits for the writer.
    pub fn load(&self) -> Arc<ChainSnapshot> {
        self.snapshot.load_full()
    }

    /// The writer's latest [`Progress`] (at or ahead of [`Snapshots::load`]).
    pub fn progress(&self) -> Arc<Progress> {
        self.progress.load_full()
    }
}

impl std::fmt::Debug for Snapshots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.snapshot.load();
        f.debug_struct("Snapshots")
            .field("tip_height", &s.index.tip_height())
            .finish()
    }
}

/// A block's bytes as read from the `blocks/` files, with what names it in
/// errors.
struct StoredBlock {
    raw: Vec<u8>,
    path: std::path::PathBuf,
    hash: BlockHash,
}

impl StoredBlock {
    /// The error for these bytes failing a check (`reason`).
    fn corrupt(&self, reason: &'static str) -> ReadError {
        ReadError::CorruptRecord {
            path: self.path.clone(),
            block: self.hash,
            what: "block",
            reason,
        }
    }
}

/// Reads of one committed state of the chain (see [`ChainSnapshot`]).
impl ChainSnapshot {
    /// The network parameters.
    pub fn params(&self) -> &ChainParams {
        self.index.params()
    }

    /// The block index as of this snapshot.
    pub fn index(&self) -> &ChainIndex {
        &self.index
    }

    /// The writer's counters when this snapshot was published.
    pub fn stats(&self) -> &PipelineStats {
        &self.stats
    }

    /// The assumevalid setting the writer connects blocks under.
    pub fn assume_valid(&self) -> crate::chain::assumevalid::AssumeValid {
        self.assume_valid
    }

    /// The datadir.
    pub fn datadir(&self) -> &Path {
        &self.datadir
    }

    /// Reads and decodes the stored block `id`, checked against the index
    /// before it is used or served: its hash, merkle root and witness
    /// commitment (a flipped byte in a block file changes one of them).
    ///
    /// # Errors
    /// Flat-file failure; [`ReadError::CorruptRecord`] for a stored block
    /// that fails a check or no longer decodes.
    pub fn read_block(&self, id: BlockId) -> Result<Option<Block>, ReadError> {
        Ok(self.read_checked_block(id)?.map(|(_, block)| block))
    }

    /// The stored serialized block `id` (with witness), checked as
    /// [`ChainSnapshot::read_block`] checks it.
    ///
    /// # Errors
    /// As [`ChainSnapshot::read_block`].
    pub fn read_block_raw(&self, id: BlockId) -> Result<Option<Vec<u8>>, ReadError> {
        Ok(self.read_checked_block(id)?.map(|(raw, _)| raw))
    }

    /// The stored bytes of block `id` (`None` without stored data), and
    /// the error naming its file and hash for a given reason.
    ///
    /// # Errors
    /// Flat-file failure.
    fn read_stored_block(&self, id: BlockId) -> Result<Option<StoredBlock>, ReadError> {
        let (Some(loc), Some(entry)) = (
            self.meta.get(id.0 as usize).and_then(|m| m.data),
            self.index.get(id),
        ) else {
            return Ok(None);
        };
        Ok(Some(StoredBlock {
            raw: self.blocks.read(loc)?,
            path: self.blocks.path(loc.file),
            hash: entry.hash,
        }))
    }

    fn read_checked_block(&self, id: BlockId) -> Result<Option<(Vec<u8>, Block)>, ReadError> {
        let Some(stored) = self.read_stored_block(id)? else {
            return Ok(None);
        };
        let corrupt = |reason| stored.corrupt(reason);
        let raw = &stored.raw;
        let block: Block = deserialize(raw).map_err(|_| corrupt("does not decode"))?;
        if block.block_hash() != stored.hash {
            return Err(corrupt("its header hashes to another block"));
        }
        if !block.check_merkle_root() {
            return Err(corrupt("merkle root mismatch"));
        }
        if !block.check_witness_commitment() {
            return Err(corrupt("witness commitment mismatch"));
        }
        Ok(Some((stored.raw, block)))
    }

    /// The BIP-158 basic filter and filter header of a connected block
    /// (active or stale); `None` if the block has no filter yet. The filter
    /// read back is checked against the committed filter header chain.
    ///
    /// # Errors
    /// Flat-file failure; [`ReadError::CorruptRecord`] when the filter
    /// read is not the one the chain committed.
    pub fn filter(&self, id: BlockId) -> Result<Option<(Vec<u8>, FilterHeader)>, ReadError> {
        if id == BlockId(0) {
            let genesis = self.index.params().genesis_block();
            let filter =
                filters::basic_filter(&genesis, std::iter::empty::<&[u8]>()).map_err(|source| {
                    ReadError::Filter {
                        hash: genesis.block_hash(),
                        source,
                    }
                })?;
            let header = filters::filter_header(&filter, &filters::genesis_previous_header());
            return Ok(Some((filter.content, header)));
        }
        let (Some(m), Some(entry)) = (self.meta.get(id.0 as usize), self.index.get(id)) else {
            return Ok(None);
        };
        let Some(loc) = m.filter else {
            return Ok(None);
        };
        let content = self.filters.read(loc)?;
        let header = FilterHeader::from_byte_array(m.filter_header);
        // The filter header chain commits to every filter's hash: one
        // SHA-256d binds what was read to what was committed.
        let previous = match entry.prev {
            Some(BlockId(0)) => self.filter(BlockId(0))?.map(|(_, h)| h),
            Some(p) => self
                .meta
                .get(p.0 as usize)
                .map(|pm| FilterHeader::from_byte_array(pm.filter_header)),
            None => None,
        };
        let filter = bitcoin::bip158::BlockFilter::new(&content);
        if previous.map(|prev| filters::filter_header(&filter, &prev)) != Some(header) {
            return Err(ReadError::CorruptRecord {
                path: self.filters.path(loc.file),
                block: entry.hash,
                what: "filter",
                reason: "the filter header chain does not bind it",
            });
        }
        Ok(Some((content, header)))
    }

    /// The spent outputs (prevouts) of a connected block, in block order.
    ///
    /// # Errors
    /// Flat-file failure or corrupt data.
    pub fn spent_outputs(&self, id: BlockId) -> Result<Option<Vec<SpentOutput>>, ReadError> {
        Ok(self.spent_record(id)?.map(|r| r.outputs()))
    }

    /// The spent-output record of a connected block, checked (checksum and
    /// layout) but not decoded: for readers that need the outputs of one
    /// of its transactions ([`SpentRecord::range`]).
    ///
    /// # Errors
    /// Flat-file failure; [`ReadError::CorruptSpent`] for a record that
    /// fails its checks.
    pub fn spent_record(&self, id: BlockId) -> Result<Option<SpentRecord>, ReadError> {
        let Some(loc) = self.meta.get(id.0 as usize).and_then(|m| m.spent) else {
            return Ok(None);
        };
        let raw = self.spent.read(loc)?;
        SpentRecord::parse(raw)
            .map(Some)
            .map_err(|source| ReadError::CorruptSpent {
                path: self.spent.path(loc.file),
                block: id,
                source,
            })
    }

    /// The UTXO set summary of the active chain.
    pub fn utxo_stats(&self) -> UtxoStats {
        let tip = self.index.tip();
        let m = self
            .meta
            .get(tip.id.0 as usize)
            .cloned()
            .unwrap_or_default();
        UtxoStats {
            txouts: m.txouts,
            total_amount_sats: m.total_sats,
            bestblock: tip.hash,
            height: tip.height,
            muhash: self.muhash.core_hex(),
        }
    }

    /// The UTXO table's view of the active chain, for readers.
    pub fn active_view(&self) -> impl ChainView + '_ {
        self.index.view(self.index.tip().id)
    }

    /// The leaves of archive epoch `n`: every output spent by the active
    /// chain's blocks at heights `[n·L, (n+1)·L − 1]`, in block order (the
    /// archive sorts them), each with its spend (block hash, height,
    /// spending txid, input index). All heights must be on the active chain.
    /// [`ChainSnapshot::for_each_archive_leaf`], collected.
    ///
    /// # Errors
    /// As [`ChainSnapshot::for_each_archive_leaf`].
    pub fn archive_leaves(&self, n: u32) -> Result<Vec<crate::archive::Leaf>, ReadError> {
        let mut leaves = Vec::new();
        self.for_each_archive_leaf(n, &mut |leaf| {
            leaves.push(leaf);
            Ok(())
        })?;
        Ok(leaves)
    }

    /// Calls `f` with each leaf of archive epoch `n` (see
    /// [`ChainSnapshot::archive_leaves`]), one block's spent outputs in
    /// memory at a time.
    ///
    /// # Errors
    /// [`ReadError::Inconsistent`] when a height of the range has no
    /// active block or a connected block has no spent-output record;
    /// flat-file errors; `f`'s errors.
    pub fn for_each_archive_leaf(
        &self,
        n: u32,
        f: &mut dyn FnMut(crate::archive::Leaf) -> Result<(), ReadError>,
    ) -> Result<(), ReadError> {
        let (first, last) = self.archive.epoch_range(n);
        for height in first..=last {
            let e = self
                .index
                .active_at(height)
                .ok_or_else(|| ReadError::Inconsistent {
                    reason: format!("archive epoch {n}: no active block at height {height}"),
                })?;
            let spent = match self.spent_outputs(e.id)? {
                Some(s) => s,
                // Genesis is never connected and spends nothing.
                None if height == 0 => Vec::new(),
                None => {
                    return Err(ReadError::Inconsistent {
                        reason: format!(
                            "archive epoch {n}: active block {} has no spent outputs",
                            e.hash
                        ),
                    })
                }
            };
            for s in spent {
                let spend = crate::archive::Spend {
                    block_hash: e.hash,
                    height,
                    txid: s.txid,
                    vin: s.vin,
                };
                f(crate::archive::Leaf::from_coin(s.outpoint, &s.coin, spend))?;
            }
        }
        Ok(())
    }

    /// The archive of sealed epochs (headers, commitment, filters, proofs
    /// without txoutproofs).
    pub fn archive(&self) -> &crate::archive::Archive {
        &self.archive
    }

    /// The status of `outpoint` on the active chain (`docs/archive.md` §7):
    /// `Unspent` (live in the UTXO table: a claim of the node),
    /// `SpentNotSealed { block, height }` (spent by an active block above
    /// the last sealed epoch), `Archived { epoch }` (provable), `Unknown`
    /// (never created on the active chain, unspendable, or spent in a
    /// stale block only).
    ///
    /// Cost: one table read and the archive's filter lookups; for an
    /// outpoint whose transaction is on the active chain but that is in
    /// neither (spent by a final block of the open epoch, so purged from the
    /// table), a scan of the spent outputs of the final blocks above the
    /// last sealed epoch (at most L blocks).
    ///
    /// # Errors
    /// UTXO-table, index, flat-file or archive failures.
    pub fn outpoint_status(
        &self,
        outpoint: &OutPoint,
    ) -> Result<crate::archive::OutpointStatus, ReadError> {
        use crate::archive::OutpointStatus;
        let sealed_through = self.archive.epochs().last().map(|h| h.last_height);
        let entry = self
            .utxo
            .get_batch(std::slice::from_ref(outpoint))?
            .into_iter()
            .next()
            .flatten();
        if let Some(e) = entry {
            let view = self.active_view();
            match e.status_in(&view) {
                ViewStatus::Unspent => return Ok(OutpointStatus::Unspent),
                ViewStatus::Spent(c) => {
                    if let Some(b) = self.index.get(c.block) {
                        if !matches!(sealed_through, Some(s) if b.height <= s) {
                            return Ok(OutpointStatus::SpentNotSealed {
                                block: b.hash,
                                height: b.height,
                            });
                        }
                    }
                }
                ViewStatus::Absent => {}
            }
        }
        let archived = self.archive.status(outpoint)?;
        if archived != OutpointStatus::Unknown {
            return Ok(archived);
        }
        Ok(match self.find_purged_unsealed_spend(outpoint)? {
            Some((block, height)) => OutpointStatus::SpentNotSealed { block, height },
            None => OutpointStatus::Unknown,
        })
    }

    /// The active block spending `outpoint` among the final blocks above the
    /// last sealed epoch (whose spent entries the table may have purged).
    fn find_purged_unsealed_spend(
        &self,
        outpoint: &OutPoint,
    ) -> Result<Option<(BlockHash, u32)>, ReadError> {
        let Some(purged_through) = self.index.tip_height().checked_sub(PURGE_DEPTH) else {
            return Ok(None);
        };
        let created = self
            .tx_blocks(&outpoint.txid)?
            .into_iter()
            .filter(|(id, _)| self.index.is_active(*id))
            .filter_map(|(id, _)| self.index.get(id).map(|e| e.height))
            .min();
        let Some(created) = created else {
            return Ok(None);
        };
        let from = self
            .archive
            .epoch_range(self.archive.next_epoch())
            .0
            .max(created);
        for height in from..=purged_through {
            let Some(e) = self.index.active_at(height) else {
                break;
            };
            if let Some(spent) = self.spent_outputs(e.id)? {
                if spent.iter().any(|s| s.outpoint == *outpoint) {
                    return Ok(Some((e.hash, height)));
                }
            }
        }
        Ok(None)
    }

    /// A commitment-anchored proof for `outpoints` (1..=1,000, distinct):
    /// existence in the sealed epoch holding each archived one, with the
    /// spending transaction's txoutproof built from the stored block
    /// (`MerkleBlock::from_header_txids_with_predicate`, as Core's
    /// `gettxoutproof`), or absence from every sealed epoch.
    ///
    /// # Errors
    /// [`ReadError::Archive`] with `BadRequest` / `DuplicateOutpoint`
    /// for a bad list, `SelfCheck` when the proof fails its own check
    /// (damaged epoch file), I/O errors.
    pub fn prove_outpoints(
        &self,
        outpoints: &[OutPoint],
    ) -> Result<crate::archive::ProofBatch, ReadError> {
        use bitcoin::merkle_tree::MerkleBlock;
        type Txids = Option<(bitcoin::block::Header, Vec<bitcoin::Txid>)>;
        // Txids per spend block, read once per block (bounded: at most
        // 64 blocks' txid lists held at a time).
        let cache: std::cell::RefCell<HashMap<BlockHash, Txids>> = Default::default();
        let txoutproof = |hash: &BlockHash, txid: &bitcoin::Txid| -> Option<MerkleBlock> {
            let mut cache = cache.borrow_mut();
            if !cache.contains_key(hash) {
                if cache.len() >= 64 {
                    cache.clear();
                }
                let read = self
                    .index
                    .id_of(hash)
                    .and_then(|id| self.read_block(id).ok().flatten())
                    .map(|b| {
                        let ids = b.txdata.iter().map(|t| t.compute_txid()).collect();
                        (b.header, ids)
                    });
                cache.insert(*hash, read);
            }
            let (header, ids) = cache.get(hash)?.as_ref()?;
            ids.contains(txid)
                .then(|| MerkleBlock::from_header_txids_with_predicate(header, ids, |t| t == txid))
        };
        Ok(self.archive.prove_with(outpoints, &txoutproof)?)
    }

    /// Every block connected as of this snapshot (active or stale) that
    /// contains `txid`, with the transaction's position in it. The txid
    /// index (`tx_by_txid_prefix`) gives candidates by txid prefix; each is
    /// checked against the stored block. Rows of blocks this snapshot does
    /// not know as connected (written by the writer after it) are left out.
    ///
    /// # Errors
    /// sled failure or corruption; flat-file failure or a stored block
    /// that no longer decodes ([`ReadError::CorruptRecord`]).
    pub fn tx_blocks(&self, txid: &bitcoin::Txid) -> Result<Vec<(BlockId, u32)>, ReadError> {
        let mut rows = Vec::new();
        for (id, pos) in self.store.tx_candidates(txid)? {
            let connected = self
                .index
                .get(id)
                .is_some_and(|e| e.status == BlockStatus::Valid);
            if connected && self.txid_at(id, pos)? == Some(*txid) {
                rows.push((id, pos));
            }
        }
        Ok(rows)
    }

    /// The txid of the transaction at `position` in the stored block `id`
    /// (`None` past its last transaction or without stored data), decoding
    /// only that transaction ([`block_txs`]).
    ///
    /// # Errors
    /// Flat-file failure; [`ReadError::CorruptRecord`] when the stored
    /// block's transactions cannot be located or that one does not decode.
    fn txid_at(&self, id: BlockId, position: u32) -> Result<Option<bitcoin::Txid>, ReadError> {
        let Some(txs) = self.block_txs(id)? else {
            return Ok(None);
        };
        Ok(txs.tx(position)?.map(|(tx, _)| tx.compute_txid()))
    }

    /// The stored block `id` with its transactions located, not decoded
    /// (`None` without stored data).
    ///
    /// # Errors
    /// As [`ChainSnapshot::txid_at`].
    fn block_txs(&self, id: BlockId) -> Result<Option<block_txs::BlockTxs>, ReadError> {
        self.read_stored_block(id)?
            .map(block_txs::BlockTxs::locate)
            .transpose()
    }

    /// The spender of `outpoint` on this snapshot's active chain, if a block
    /// of it spends it: the spend index (`spend_by_outpoint_prefix`) gives
    /// candidate blocks by txid prefix and vout (rows of later blocks are
    /// ignored); the spender is read from the active candidate's
    /// spent-output record, which must name `outpoint`.
    ///
    /// # Errors
    /// sled failure or corruption; a spent-output record that does not
    /// decode ([`ReadError::CorruptSpent`]).
    pub fn active_spender(
        &self,
        outpoint: &OutPoint,
    ) -> Result<Option<(BlockId, crate::store::SpendRecord)>, ReadError> {
        for block in self.store.spend_candidates(outpoint)? {
            if !self.index.is_active(block) {
                continue;
            }
            let spent = self.spent_outputs(block)?.unwrap_or_default();
            if let Some(s) = spent.iter().find(|s| s.outpoint == *outpoint) {
                let record = crate::store::SpendRecord {
                    txid: s.txid,
                    vin: s.vin,
                };
                return Ok(Some((block, record)));
            }
        }
        Ok(None)
    }

    /// The table entries of `outpoints`, in the same order (`None` when the
    /// table holds none: never created, an unspendable output, or purged
    /// after being consumed at least [`crate::sozu::PURGE_DEPTH`] blocks
    /// deep). Interpret each entry with
    /// `Entry::status_in(&self.index().view(tip))` ([`ChainSnapshot::active_view`]):
    /// the table may already hold later blocks' changes, which that view
    /// ignores.
    ///
    /// # Errors
    /// UTXO-table failure.
    pub fn lookup_outpoints(
        &self,
        outpoints: &[OutPoint],
    ) -> Result<Vec<Option<crate::sozu::Entry>>, ReadError> {
        Ok(self.utxo.get_batch(outpoints)?)
    }

    /// Statistics of the UTXO table ([`crate::sozu::SozuStats`]: entries and
    /// fill per layer, bytes on disk, spills, purges), `None` when the table
    /// keeps none. Scans every page of the table: callers cache the result.
    ///
    /// # Errors
    /// UTXO-table storage failure or corruption.
    pub fn table_stats(&self) -> Result<Option<crate::sozu::SozuStats>, ReadError> {
        Ok(self.utxo.scan_stats()?)
    }

    /// The UTXO table's counters without a scan (spills, purges, commits,
    /// journal bytes, …; see [`crate::sozu::UtxoTable::sozu_counters`]):
    /// as the writer left them when it published this snapshot.
    pub fn table_counters(&self) -> Option<crate::sozu::SozuStats> {
        self.table_counters.clone()
    }
}
