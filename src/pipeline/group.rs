//! Group commit while the node catches up: one durable boundary per group
//! of connected blocks instead of one per block, as Bitcoin Core's
//! chainstate flush does during initial block download.
//!
//! A block that extends the active tip and is *catching up* (its header
//! time is more than [`MAX_TIP_AGE_SECS`] in the past, Core's
//! `DEFAULT_MAX_TIP_AGE`, or the index knows a header with more work) is
//! connected without waiting for the disk: its flat-file records are
//! appended but not synced, its block record and metadata stay in the
//! writer's pending batch, its transaction, spend and address rows are
//! applied to the index database on a thread of their own, not flushed
//! (`pipeline/rows.rs`: readers ignore rows of blocks not connected), and
//! its UTXO-table write is applied in memory but not committed: by the next
//! block's connect, while that block's scripts are verified (the next
//! block's lookups read the kept write from memory), or before any other
//! use of the table ([`Chainstate::write_unwritten`]).
//! The group ends, in the order of every block boundary (the rows thread
//! drained, flat files synced, then the index batch flushed with the rows,
//! then the table's commit), when the next
//! block would exceed [`GroupLimits`] (blocks, raw bytes, time since the
//! group's first block), when a block is not catching up, before any other
//! write (a side branch, a reorg, an invalid block, a header batch), and on
//! [`Chainstate::flush`] (end of an import, shutdown, the node's idle tick,
//! drop).
//!
//! Readers see only durable state: the full snapshot is published at the
//! end of each group. The P2P sync logic follows the writer's own progress
//! ([`crate::snapshot::Snapshots::progress`], published per block) so it
//! does not fetch again blocks that wait in a group.
//!
//! Crash recovery: the index batch of a group names the table's committed
//! tip before the group (meta key [`META_SOZU_BASE`]) and its last block
//! (`sozu_last`). A crash before the index flush loses the group (the flat
//! files are cut back to their committed lengths at open; import submits
//! the blocks again, a peer is asked again). A crash between the index
//! flush and the table's commit leaves the table at `sozu_base`: open
//! replays the group's blocks from the block files ([`Chainstate::open`]).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use bitcoin::hashes::Hash;
use bitcoin::Txid;

use crate::chain::index::ChainIndex;
use crate::primitives::BlockId;
use crate::sozu::{BlockOracle, BlockWrite, CommitTag};
use crate::store::{sync_concurrently, WriteBatch, META_SOZU_BASE};

use super::{Chainstate, PipelineError, Verdict};

/// A block whose header time is older than this (seconds) is catching up
/// (Bitcoin Core's `DEFAULT_MAX_TIP_AGE`, `src/validation.h`: 24 hours).
pub const MAX_TIP_AGE_SECS: u64 = 24 * 60 * 60;

/// Bounds of one group of blocks made durable together while catching up.
/// Each bound caps the work a crash can lose; the first reached ends the
/// group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupLimits {
    /// Most blocks in a group; 1 = every block is a durable boundary (no
    /// grouping).
    pub max_blocks: u32,
    /// Most raw block bytes in a group.
    pub max_bytes: u64,
    /// Longest time from the start of a group's first block to its end.
    pub max_age: Duration,
}

impl GroupLimits {
    /// Every block durable on its own (what a chain state does unless
    /// configured otherwise).
    pub const PER_BLOCK: GroupLimits = GroupLimits {
        max_blocks: 1,
        max_bytes: 0,
        max_age: Duration::ZERO,
    };

    /// The node's defaults: at most 1,000 blocks, 32 MiB of raw blocks and
    /// 1 s per group. Fixed: no config option sets them yet.
    pub const NODE_DEFAULT: GroupLimits = GroupLimits {
        max_blocks: 1_000,
        max_bytes: 32 * 1024 * 1024,
        max_age: Duration::from_secs(1),
    };
}

impl Default for GroupLimits {
    fn default() -> Self {
        GroupLimits::PER_BLOCK
    }
}

/// The open group: blocks connected since the last durable boundary.
#[derive(Debug)]
pub(super) struct PendingGroup {
    /// The table's committed tip when the group started.
    base: BlockId,
    /// The group's first block.
    first: BlockId,
    /// The table commit that ends the group (its last block).
    tag: CommitTag,
    /// Blocks in the group.
    blocks: u32,
    /// Their raw bytes.
    bytes: u64,
    /// When the group's first block started.
    started: Instant,
    /// Transactions of the group's blocks, whose index rows are still in
    /// the pending batch (the writer's "txid stored before" test).
    txids: HashSet<Txid>,
}

impl PendingGroup {
    /// Whether the group holds `txid`.
    pub(super) fn has_tx(&self, txid: &Txid) -> bool {
        self.txids.contains(txid)
    }
}

/// What one connected block adds to a group.
pub(super) struct GroupEntry<'a> {
    /// Its table commit tag.
    pub tag: CommitTag,
    /// Its raw size in bytes.
    pub bytes: u64,
    /// When its submission started.
    pub started: Instant,
    /// Its transactions.
    pub txids: &'a [Txid],
}

impl Chainstate {
    /// The table's committed tip as a block id (genesis for an empty table).
    pub(super) fn table_base(&self) -> BlockId {
        self.table
            .committed()
            .map(|t| t.block)
            .unwrap_or(BlockId(0))
    }

    /// Records in `batch` where the table's writes not yet committed begin
    /// ([`META_SOZU_BASE`]): the open group's base and first block, or, with
    /// no group open, the table's committed tip and `id` (the block this
    /// batch connects).
    pub(super) fn put_sozu_base(&self, batch: &mut WriteBatch, id: BlockId) {
        let (base, first) = match &self.group {
            Some(g) => (g.base, g.first),
            None => (self.table_base(), id),
        };
        batch.put_meta(META_SOZU_BASE, &encode_base(base, first));
    }

    /// Whether the block being connected (started at `started`, `bytes`
    /// long, at `height` with header time `time` and `chainwork`) joins
    /// the open group (or opens one) instead of ending in a durable
    /// boundary of its own.
    pub(super) fn joins_group(&self, time: u32, bytes: u64, started: Instant) -> bool {
        let limits = self.group_limits;
        if limits.max_blocks <= 1 {
            return false;
        }
        let catching_up = u64::from(time) + MAX_TIP_AGE_SECS < super::now_secs()
            || self.index.best_header_work() > self.index.tip().chainwork;
        if !catching_up {
            return false;
        }
        match &self.group {
            None => bytes <= limits.max_bytes && started.elapsed() < limits.max_age,
            Some(g) => {
                g.blocks + 1 < limits.max_blocks
                    && g.bytes + bytes <= limits.max_bytes
                    && g.started.elapsed() < limits.max_age
            }
        }
    }

    /// Adds a validated block to the open group (opening one): its table
    /// write is kept to be applied in memory before the table is next used
    /// ([`Chainstate::write_unwritten`]), `batch` (with its rows) becomes
    /// the pending batch. Nothing is durable, nothing is published.
    ///
    /// # Errors
    /// The table's write failed: writes stop ([`PipelineError::Failed`]).
    pub(super) fn add_to_group(
        &mut self,
        mut batch: WriteBatch,
        write: BlockWrite,
        entry: GroupEntry<'_>,
    ) -> Result<(), PipelineError> {
        self.put_sozu_base(&mut batch, entry.tag.block);
        if let Err(e) = self.rows.send(batch.take_rows()) {
            return Err(self.stop_writes(e.into()));
        }
        self.write_unwritten()?;
        self.unwritten = Some(write);
        self.pending = batch;
        let base = self.table_base();
        let g = self.group.get_or_insert_with(|| PendingGroup {
            base,
            first: entry.tag.block,
            tag: entry.tag,
            blocks: 0,
            bytes: 0,
            started: entry.started,
            txids: HashSet::new(),
        });
        g.tag = entry.tag;
        g.blocks += 1;
        g.bytes += entry.bytes;
        g.txids.extend(entry.txids.iter().copied());
        Ok(())
    }

    /// Applies the table write of the open group's last block, kept by
    /// [`Chainstate::add_to_group`], if not applied yet. The next block's
    /// connect applies it while that block's scripts are verified (its own
    /// lookups read it from memory: `connect::unwritten_coins`); every other
    /// use of the table applies it first.
    ///
    /// # Errors
    /// The table's write failed: writes stop ([`PipelineError::Failed`]).
    pub(super) fn write_unwritten(&mut self) -> Result<(), PipelineError> {
        let Some(write) = self.unwritten.take() else {
            return Ok(());
        };
        if let Err(e) = self
            .table
            .write_block(&write, self.index.core(), &mut |_| {})
        {
            return Err(self.stop_writes(e.into()));
        }
        Ok(())
    }

    /// Stops writes when `result` (of a write: a block, a header batch) is
    /// an error. The failed write may have left the in-memory state ahead
    /// of the disk: a header in the index with no stored record (a later
    /// record would leave a gap in the stored ids), or, with a group open,
    /// the group's pending index rows dropped (committing its table writes
    /// later would put the table ahead of the index). As after a crash, a
    /// restart resumes from the last durable boundary.
    pub(super) fn guard_writes<T>(
        &mut self,
        result: Result<T, PipelineError>,
    ) -> Result<T, PipelineError> {
        match result {
            Err(e) if self.failed.is_none() => Err(self.stop_writes(e)),
            other => other,
        }
    }

    /// The pending batch (rows of the open group's blocks), to which the
    /// next write adds its own: every index commit goes through
    /// [`Chainstate::commit_boundary`] with it, so the group ends there.
    pub(super) fn take_batch(&mut self) -> WriteBatch {
        std::mem::take(&mut self.pending)
    }

    /// One durable boundary for `batch` (which holds the open group's rows,
    /// taken with [`Chainstate::take_batch`]): every flat file synced, then
    /// the index batch flushed, then the table's commit of the open group.
    /// Does not publish.
    ///
    /// # Errors
    /// Storage failure: writes stop ([`PipelineError::Failed`]); with a
    /// group open, the table then holds uncommitted blocks the index may
    /// lack, and a restart resumes from the last durable boundary.
    pub(super) fn commit_boundary(&mut self, batch: WriteBatch) -> Result<(), PipelineError> {
        self.write_unwritten()?;
        let group = self.group.take();
        // The open group's rows first (the index commit names their blocks).
        let rows = self.rows.wait().map_err(PipelineError::from);
        let durable = rows
            .and_then(|()| {
                sync_concurrently(&mut [
                    &mut self.blocks,
                    &mut self.filters,
                    &mut self.spent,
                    &mut self.headers,
                ])
                .map_err(PipelineError::from)
            })
            .and_then(|()| self.store.commit(batch).map_err(PipelineError::from));
        let result = match group {
            None => durable,
            Some(group) => durable.and_then(|()| self.table.commit(group.tag).map_err(Into::into)),
        };
        // Any failure stops writes, not only one that leaves the table
        // ahead of the index: the in-memory chain is already past what is
        // durable, and after a failed fsync a retry may report success for
        // pages the kernel dropped (Linux clears the error once reported).
        self.guard_writes(result)
    }

    /// Makes the open group durable and publishes it (a no-op when every
    /// connected block is durable already). Called at the end of an import,
    /// on shutdown, by the node's idle tick and on drop.
    ///
    /// # Errors
    /// Storage failure (writes stop), archive sealing failure.
    pub fn flush(&mut self) -> Result<(), PipelineError> {
        if self.group.is_none() {
            return Ok(());
        }
        self.check_not_failed()?;
        let batch = self.take_batch();
        self.commit_boundary(batch)?;
        self.seal_final_epochs()?;
        self.publish();
        Ok(())
    }

    /// Flushes the open group if it is older than its time limit (the
    /// node's idle tick: a group whose next block does not come is made
    /// durable anyway). Returns whether it flushed.
    ///
    /// # Errors
    /// As [`Chainstate::flush`].
    pub fn flush_if_due(&mut self) -> Result<bool, PipelineError> {
        match &self.group {
            Some(g) if g.started.elapsed() >= self.group_limits.max_age => {
                self.flush()?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Sets the bounds of a group (see the module docs); takes effect with
    /// the next block. [`GroupLimits::PER_BLOCK`] makes every block durable.
    pub fn set_group_limits(&mut self, limits: GroupLimits) {
        self.group_limits = limits;
    }

    /// Replays the blocks of the last group whose index batch was flushed
    /// but whose table commit was not (a crash between the two): the
    /// group's blocks run from `first` to `last` (`sozu_last`) on one
    /// branch. Each block is read back from the block files, validated
    /// under its branch's view and written; then one commit.
    ///
    /// # Errors
    /// [`PipelineError::Inconsistent`] when `first` is not an ancestor of
    /// `last`, a block has no stored data or fails validation; storage
    /// failures.
    pub(super) fn replay_group(
        &mut self,
        first: BlockId,
        last: BlockId,
    ) -> Result<(), PipelineError> {
        let before_first = self.index.get(first).and_then(|e| e.prev);
        let path = match before_first {
            Some(p) => self.index.path_from(p, last),
            None => Vec::new(),
        };
        if path.first() != Some(&first) {
            return Err(PipelineError::Inconsistent {
                reason: format!(
                    "the group's first block {} is not an ancestor of sozu_last {}",
                    first.0, last.0
                ),
            });
        }
        tracing::warn!(
            blocks = path.len(),
            "UTXO table is one group behind the index: replaying it"
        );
        let mut tag = None;
        for id in path {
            let entry = self
                .index
                .get(id)
                .cloned()
                .ok_or_else(|| PipelineError::Inconsistent {
                    reason: format!("block id {} not in the index", id.0),
                })?;
            let block =
                self.current()
                    .read_block(id)?
                    .ok_or_else(|| PipelineError::Inconsistent {
                        reason: format!("block {} has no stored data", entry.hash),
                    })?;
            let parent = entry.prev.unwrap_or(BlockId(0));
            let write = match self.validate(&block, &entry, parent)? {
                Verdict::Valid(v) => v.write,
                Verdict::Invalid(e) => {
                    return Err(PipelineError::Inconsistent {
                        reason: format!("replayed block {} fails validation: {e}", entry.hash),
                    })
                }
            };
            // The table sees the chain as it was when the block was first
            // written (its tip at this block), so the replay purges exactly
            // what the first write did.
            let oracle = OracleAt {
                index: self.index.core(),
                height: entry.height,
            };
            self.table.write_block(&write, &oracle, &mut |_| {})?;
            tag = Some(CommitTag {
                block: id,
                height: entry.height,
                block_hash: entry.hash.to_byte_array(),
            });
        }
        if let Some(tag) = tag {
            self.table.commit(tag)?;
        }
        Ok(())
    }
}

/// The block index as the UTXO table saw it when a block at `height` was
/// connected: the active chain up to that height (a group's blocks extend
/// one branch, so its lower part is the active chain of that time).
struct OracleAt<'a> {
    index: &'a ChainIndex,
    height: u32,
}

impl BlockOracle for OracleAt<'_> {
    fn best_height(&self, block: BlockId) -> Option<u32> {
        self.index.best_height(block).filter(|h| *h <= self.height)
    }

    fn height(&self, block: BlockId) -> Option<u32> {
        BlockOracle::height(self.index, block)
    }

    fn tip_height(&self) -> u32 {
        self.height
    }
}

/// [`META_SOZU_BASE`]'s value: the table's committed tip before the
/// uncommitted writes (u32 BE, genesis for an empty table) ‖ the first
/// block written after it (u32 BE).
fn encode_base(base: BlockId, first: BlockId) -> [u8; 8] {
    let mut v = [0u8; 8];
    v[..4].copy_from_slice(&base.0.to_be_bytes());
    v[4..].copy_from_slice(&first.0.to_be_bytes());
    v
}

/// Inverse of [`encode_base`]; `None` unless 8 bytes.
pub(super) fn decode_base(bytes: &[u8]) -> Option<(BlockId, BlockId)> {
    let a: [u8; 8] = bytes.try_into().ok()?;
    Some((
        BlockId(u32::from_be_bytes([a[0], a[1], a[2], a[3]])),
        BlockId(u32::from_be_bytes([a[4], a[5], a[6], a[7]])),
    ))
}

impl Drop for Chainstate {
    /// Makes an open group durable: a chain state dropped at the end of an
    /// import, a test or a shutdown loses no block it connected. Waits for
    /// a running epoch seal.
    fn drop(&mut self) {
        if self.group.is_some() && self.failed.is_none() {
            if let Err(e) = self.flush() {
                tracing::error!(error = %e, "making the last group of blocks durable");
            }
        }
        self.join_seal();
    }
}
