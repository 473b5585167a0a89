//! [`SozuTable`]: the layered, journaled, on-disk Sozu table, and its
//! [`UtxoTable`] operations. The module docs of [`crate::sozu`] give the
//! design; `docs/sozu-format.md` the bytes.

use rustc_hash::FxHashMap;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use bitcoin::OutPoint;
use siphasher::sip::SipHasher24;

use super::checkpoint::Checkpointer;
use super::config::{MemoryPlan, SozuConfig};
use super::geo::{Geo, SignatureKey};
use super::header::{Header, MAX_LAYERS};
use super::lookup::Query;
use super::ops::OpLog;
use super::page::MAX_SCRIPT_LEN;
use super::reader::SozuReader;
use super::records::Records;
use super::recovery::{self, JournalPos, PendingCheckpoint, ShardRecovery};
use super::shard::{Counters, Shard};
use super::stats::{file_bytes, LayerFlow, LayerScan, SozuStats};
use super::storage::{FsStorage, Storage};
use super::store::{io_err, read_existing_page, PageStore, Published};
use super::summary::PageSummary;
use super::types::{
    outpoint_key, BlockOracle, BlockWrite, CommitTag, Consumption, Entry, OutPointKey, PURGE_DEPTH,
};
use super::walk::walk;
use super::workers::Workers;
use super::write::{BlockCtx, KeyOp};
use super::{SozuError, UtxoReader, UtxoTable};

/// Options that apply to each open (not stored in the table).
#[derive(Clone, Copy, Debug)]
pub(super) struct Options {
    pub(super) checkpoint_bytes: u64,
    pub(super) background: bool,
    pub(super) compact_min: u64,
}

/// Counters of the table as a whole.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct TableCounters {
    pub(super) commits: u64,
    pub(super) checkpoints: u64,
    /// Of them, of the disk layers only.
    pub(super) disk_only_checkpoints: u64,
    pub(super) journal_bytes: u64,
    /// Page images handed to checkpoints: (all, of the pinned layers).
    pub(super) checkpoint_pages: (u64, u64),
    /// CPU time of the threads that ran the finished checkpoints, in
    /// nanoseconds.
    pub(super) checkpoint_cpu_nanos: u64,
    /// Commits that waited for the running checkpoint (memory bound).
    pub(super) checkpoint_waits: u64,
    /// Time those commits waited, in nanoseconds.
    pub(super) checkpoint_wait_nanos: u64,
    /// Time in [`SozuTable::append_record`] (write and fsync), nanoseconds.
    pub(super) journal_sync_nanos: u64,
    /// (pages read, pages written) by the last block.
    pub(super) last_block: (u64, u64),
    /// The most [`SozuTable::held_twice`] reached after a commit.
    pub(super) held_twice_peak: u64,
}

/// The Sozu table (the Sozu paper): layered buckets of one page, lazily allocated
/// children, keyed-SipHash bucket index, a redo journal of page edits for
/// block-boundary durability, checkpoints in the background. Implements
/// [`UtxoTable`].
pub struct SozuTable {
    pub(super) storage: Box<dyn Storage>,
    pub(super) geo: Geo,
    pub(super) plan: MemoryPlan,
    pub(super) shards: Vec<Shard>,
    /// Header as of the last commit (its generation is the current one).
    pub(super) committed: Header,
    pub(super) journal: JournalPos,
    /// The current generation's journal bound, bytes, as last measured
    /// (`commit.rs`, `journal_full`; 0 until first measured).
    pub(super) journal_bound: u64,
    /// The generation the page files hold (the header file's).
    pub(super) base: u64,
    /// The header file's content.
    pub(super) file_header: Header,
    /// Whether the next checkpoint must start a new generation (not write
    /// the disk layers only): recovery applied the base's checkpoint file,
    /// or the header file's disk-layer checkpoint has another first disk
    /// layer than this open's pinned layers give.
    pub(super) full_next: bool,
    pub(super) checkpointer: Checkpointer,
    /// A checkpoint recovery found unfinished, started by the next commit.
    pub(super) pending: Option<PendingCheckpoint>,
    pub(super) options: Options,
    /// Set after a failed write, commit or checkpoint: reopen the table.
    pub(super) poisoned: bool,
    pub(super) counters: TableCounters,
    pub(super) reader: Arc<SozuReader>,
    /// The buffer every journal record is encoded into.
    pub(super) record_buf: Vec<u8>,
    /// The shard worker threads.
    pub(super) workers: Workers,
}

impl std::fmt::Debug for SozuTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SozuTable")
            .field("committed", &self.committed.tag)
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

impl SozuTable {
    /// Opens the table in `dir`, creating it (with a fresh random SipHash
    /// key) if the directory holds none. Replays the journals' committed
    /// records; a torn last record (a crash during a commit) is ignored and
    /// cut by the next commit. Nothing is written by opening an existing
    /// table.
    ///
    /// # Errors
    /// [`SozuError::Corrupt`] (file and byte offset) on any checksum, magic
    /// or structure failure, [`SozuError::UnsupportedVersion`] for a table
    /// of another format (rebuild it: `kakehi reindex-chainstate`),
    /// [`SozuError::Config`] for an invalid configuration, [`SozuError::Io`].
    pub fn open(dir: &Path, config: SozuConfig) -> Result<Self, SozuError> {
        let storage = FsStorage::new(dir).map_err(|source| SozuError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        Self::open_with_storage(Box::new(storage), config)
    }

    /// [`SozuTable::open`] over any [`Storage`] (tests use
    /// [`super::storage::MemStorage`]).
    ///
    /// # Errors
    /// As [`SozuTable::open`].
    pub fn open_with_storage(
        mut storage: Box<dyn Storage>,
        config: SozuConfig,
    ) -> Result<Self, SozuError> {
        config.check()?;
        let st = storage.as_mut();
        let rec = recovery::recover(st, &config)?;
        let h = &rec.header;
        let (b0, g) = (u32::from(h.layer0_bits), u32::from(h.growth_bits));
        let max_layer = ((64 - b0) / g).min(MAX_LAYERS as u32 - 1) as u8;
        let page_size = h.page_size as usize;
        let plan = MemoryPlan::new(&config, page_size, b0, g, max_layer);
        let hasher = SipHasher24::new_with_key(&h.key);
        let geo = Geo {
            page_size,
            b0,
            g,
            shard_bits: u32::from(h.shards).trailing_zeros(),
            max_layer,
            ram_layers: plan.ram_layers,
            layers: config.layers.clone(),
            disk_alpha: config.disk_alpha,
            inline_script_max: config.inline_script_max,
            spill_fewest_children: config.spill_fewest_children,
            spill_consumed: config.spill_consumed,
            signature_key: SignatureKey::new(&hasher),
            hasher,
        };
        let mut shards = Vec::new();
        for (id, r) in rec.shards.into_iter().enumerate() {
            shards.push(open_shard(
                st,
                &geo,
                &plan,
                (id as u8, h.shard_state[id]),
                r,
                config.verify_on_open,
            )?);
        }
        let full_next = rec.ckpt_applied
            || rec
                .file_header
                .disk_checkpoint
                .is_some_and(|(_, l)| l != geo.ram_layers);
        let workers = Workers::new(shards.len())?;
        let reader = Arc::new(SozuReader::new(
            geo.clone(),
            shards.iter().map(|s| s.store.published.clone()).collect(),
            st.try_clone()
                .map_err(|e| io_err(st, super::files::HEADER_FILE, e))?,
        ));
        Ok(Self {
            storage,
            geo,
            plan,
            shards,
            committed: rec.header,
            journal: rec.journal,
            journal_bound: 0,
            base: rec.base,
            full_next,
            file_header: rec.file_header,
            checkpointer: Checkpointer::default(),
            pending: rec.pending,
            options: Options {
                checkpoint_bytes: config.checkpoint_bytes,
                background: config.background_checkpoints,
                compact_min: config.records_compact_min,
            },
            poisoned: false,
            counters: TableCounters::default(),
            reader,
            record_buf: Vec::new(),
            workers,
        })
    }

    /// Counters and a full scan of the layers.
    ///
    /// # Errors
    /// Storage failure or corruption during the scan.
    pub fn stats(&mut self) -> Result<SozuStats, SozuError> {
        let geo = self.geo.clone();
        let mut scan = LayerScan::default();
        for s in &mut self.shards {
            walk(&geo, geo.max_layer, &mut |a| {
                let p = s.store.page(a)?;
                scan.add(a, &p);
                Ok(p)
            })?;
        }
        let states: Vec<_> = self.shards.iter().map(|s| s.state).collect();
        let files = file_bytes(self.storage.as_mut(), &geo, &states)?;
        Ok(scan.finish(&geo, files, self.counters()))
    }

    /// Bytes the journal files hold now, as the writer knows them
    /// ([`SozuStats::journal_live_bytes`]), without the rest of
    /// [`SozuTable::counters`]: cheap enough for every block.
    pub fn journal_live_bytes(&self) -> u64 {
        self.journal.pos + self.journal.other
    }

    /// The counters of [`SozuTable::stats`] without the scan: `layers` is
    /// empty and `bytes_on_disk`, `journal_file_bytes`, `payload_bytes` are 0.
    pub fn counters(&self) -> SozuStats {
        let mut c = Counters::default();
        let mut memory = 0u64;
        let mut summaries = 0u64;
        for s in &self.shards {
            c.add(&s.counters);
            memory += s.store.memory();
            summaries += s.store.published.summaries.read().bytes() as u64;
        }
        // The store counts a replaced image until the checkpoint ends; the
        // thread may have let it go already.
        let memory = memory.saturating_sub(self.checkpointer.released());
        let t = &self.counters;
        let mut flow: Vec<LayerFlow> = c
            .flow
            .iter()
            .enumerate()
            .map(|(l, f)| LayerFlow {
                rewrites: f.rewrites,
                merge_pages: f.merge_pages,
                spilled_entries: f.spilled_in,
                spill_targets: f.spill_targets,
                file_reads: self
                    .shards
                    .iter()
                    .map(|s| s.store.file_reads_by_layer[l])
                    .sum(),
            })
            .collect();
        while flow.last().is_some_and(|f| *f == LayerFlow::default()) {
            flow.pop();
        }
        SozuStats {
            flow,
            last_block_buckets_read: t.last_block.0,
            last_block_buckets_written: t.last_block.1,
            buckets_read: c.pages_read,
            buckets_written: c.pages_written,
            disk_page_reads: self.shards.iter().map(|s| s.store.file_reads).sum(),
            deep_lookups: c.deep_lookups,
            deep_lookup_pages: c.deep_lookup_pages,
            spills: c.spills,
            children_allocated: c.children_allocated,
            purges: c.purges,
            purge_checks: c.purge_checks,
            records_moved: c.records_moved,
            spend_markers: c.spend_markers,
            markers_absorbed: c.markers_absorbed,
            spill_file_reads: c.spill_file_reads,
            spill_reads_avoidable: c.spill_reads_avoidable,
            disk_read_nanos: self.shards.iter().map(|s| s.store.file_read_nanos).sum(),
            disk_page_prefetches: self.shards.iter().map(|s| s.store.prefetches).sum(),
            commits: t.commits,
            checkpoints: t.checkpoints,
            disk_only_checkpoints: t.disk_only_checkpoints,
            journal_bytes: t.journal_bytes,
            journal_live_bytes: self.journal_live_bytes(),
            journal_bound_bytes: self.journal_bound,
            checkpoint_pages: t.checkpoint_pages.0,
            checkpoint_pinned_pages: t.checkpoint_pages.1,
            checkpoint_cpu_nanos: t.checkpoint_cpu_nanos,
            memory_bytes: memory + summaries,
            summary_bytes: summaries,
            checkpoint_waits: t.checkpoint_waits,
            checkpoint_wait_nanos: t.checkpoint_wait_nanos,
            journal_sync_nanos: t.journal_sync_nanos,
            held_twice_peak_bytes: t.held_twice_peak,
            ..SozuStats::default()
        }
    }

    /// Reads every page and out-of-line script and checks its checksum and
    /// structure (what `verify_on_open` does at open, on demand); returns
    /// the number of entries.
    ///
    /// # Errors
    /// [`SozuError::Corrupt`] for the first bad page or record.
    pub fn verify(&mut self) -> Result<u64, SozuError> {
        let mut n = 0u64;
        self.for_each(&mut |_| n += 1)?;
        Ok(n)
    }

    /// Like [`UtxoTable::get_batch`], with the Sozu paper's height filter: for each
    /// key, `min_height` is a lower bound on any production height it can
    /// have, and the descent stops at a bucket whose children hold nothing
    /// produced at or above it (`ReadSozu(k, b, h)`).
    ///
    /// # Errors
    /// Storage failure or corruption.
    pub fn get_batch_since(
        &mut self,
        keys: &[(OutPoint, u32)],
    ) -> Result<Vec<Option<Entry>>, SozuError> {
        self.check_poison()?;
        let mut by_shard: Vec<Vec<(usize, Query)>> = vec![Vec::new(); self.shards.len()];
        for (i, (op, min_height)) in keys.iter().enumerate() {
            let key = outpoint_key(op);
            let h = self.geo.hash(&key);
            by_shard[self.geo.shard_of(h) as usize].push((
                i,
                Query {
                    key,
                    h,
                    min_height: *min_height,
                },
            ));
        }
        let read_before = self.pages_read();
        let geo = &self.geo;
        let results = self.workers.run(&mut self.shards, by_shard, |s, qs| {
            let queries: Vec<Query> = qs.iter().map(|(_, q)| *q).collect();
            let got = s.get(geo, &queries)?;
            Ok(qs.into_iter().map(|(i, _)| i).zip(got).collect::<Vec<_>>())
        })?;
        let mut out = vec![None; keys.len()];
        for (i, e) in results.into_iter().flatten() {
            out[i] = e;
        }
        self.counters.last_block = (self.pages_read() - read_before, 0);
        Ok(out)
    }

    pub(super) fn pages_read(&self) -> u64 {
        self.shards.iter().map(|s| s.counters.pages_read).sum()
    }

    pub(super) fn check_poison(&self) -> Result<(), SozuError> {
        if self.poisoned {
            Err(SozuError::Poisoned)
        } else {
            Ok(())
        }
    }

    /// The block's changes grouped by key (a key created twice must carry
    /// the same coin), then by shard.
    fn key_ops(&self, write: &BlockWrite) -> Result<Vec<Vec<KeyOp>>, SozuError> {
        let n = write.created.len() + write.spent.len();
        let mut keyed = KeyedOps {
            index: HashMap::with_capacity(n),
            ops: Vec::with_capacity(n),
            geo: &self.geo,
        };
        for new in &write.created {
            if new.coin.script_pubkey.len() > MAX_SCRIPT_LEN {
                return Err(SozuError::ScriptTooLong {
                    outpoint: new.outpoint,
                    len: new.coin.script_pubkey.len(),
                });
            }
            let op = keyed.op_for(&new.outpoint);
            match &mut op.create {
                Some((coin, absent)) => {
                    if coin.value != new.coin.value || coin.script_pubkey != new.coin.script_pubkey
                    {
                        return Err(SozuError::CoinMismatch {
                            outpoint: new.outpoint,
                        });
                    }
                    *absent &= new.known_absent;
                }
                None => op.create = Some((new.coin.clone(), new.known_absent)),
            }
        }
        for (outpoint, c) in &write.spent {
            keyed.op_for(outpoint).consumed.push(*c);
        }
        // Key order, as the writer has always seen them (a page's inserts
        // are appended in this order).
        let mut ops = keyed.ops;
        ops.sort_unstable_by_key(|a| a.key);
        let room = ops.len() / self.shards.len().max(1) + 64;
        let mut by_shard: Vec<Vec<KeyOp>> = (0..self.shards.len())
            .map(|_| Vec::with_capacity(room))
            .collect();
        for op in ops {
            by_shard[self.geo.shard_of(op.h) as usize].push(op);
        }
        Ok(by_shard)
    }
}

/// A block's changes, one [`KeyOp`] per outpoint, gathered in input order
/// (a hash index instead of an ordered map: the ops are sorted once at the
/// end). The index uses std's keyed hasher: outpoints come from blocks,
/// whose authors could grind txids against an unkeyed one.
struct KeyedOps<'g> {
    index: HashMap<OutPointKey, usize>,
    ops: Vec<KeyOp>,
    geo: &'g Geo,
}

impl KeyedOps<'_> {
    /// The op of `outpoint`, made empty on its first mention.
    fn op_for(&mut self, outpoint: &OutPoint) -> &mut KeyOp {
        let key = outpoint_key(outpoint);
        let i = *self.index.entry(key).or_insert_with(|| {
            self.ops.push(KeyOp {
                key,
                outpoint: *outpoint,
                h: self.geo.hash(&key),
                create: None,
                consumed: Vec::new(),
            });
            self.ops.len() - 1
        });
        &mut self.ops[i]
    }
}

/// Builds one shard from what recovery found: pinned layers loaded, every
/// page verified and summarized if `verify`.
fn open_shard(
    st: &mut dyn Storage,
    geo: &Geo,
    plan: &MemoryPlan,
    (id, state): (u8, super::header::ShardState),
    mut r: ShardRecovery,
    verify: bool,
) -> Result<Shard, SozuError> {
    let published = Arc::new(Published::default());
    *published.state.write() = state;
    let deepest = if verify {
        Some(geo.max_layer)
    } else {
        geo.ram_layers.checked_sub(1)
    };
    if let Some(deepest) = deepest {
        let mut summaries = Vec::new();
        let pages = &mut r.pages;
        walk(geo, deepest, &mut |a| {
            let p = match pages.get(&a) {
                Some(p) => p.clone(),
                None => Arc::new(read_existing_page(st, id, a, geo.page_size)?),
            };
            if geo.is_ram(a.0) {
                pages.insert(a, p.clone());
            } else {
                summaries.push((a, PageSummary::of(&p, &geo.signature_key)));
            }
            Ok(p)
        })?;
        let mut s = published.summaries.write();
        for (a, summary) in summaries {
            s.set(a, summary);
        }
    }
    *published.records.write() = std::mem::take(&mut r.records);
    let storage = st
        .try_clone()
        .map_err(|e| io_err(st, super::files::HEADER_FILE, e))?;
    let cache = plan.cache_bytes / plan_shards(geo);
    let store = PageStore::new(
        id,
        storage,
        (geo.page_size, geo.ram_layers, geo.signature_key),
        r.pages,
        std::mem::take(&mut r.generation),
        published,
        cache,
    );
    Ok(Shard {
        id,
        store,
        log: OpLog::default(),
        state,
        records: Records::default(),
        counters: Counters::default(),
        located: Default::default(),
        spill_read: Default::default(),
    })
}

fn plan_shards(geo: &Geo) -> u64 {
    1u64 << geo.shard_bits
}

impl UtxoTable for SozuTable {
    fn reader(&self) -> Arc<dyn UtxoReader> {
        self.reader.clone()
    }

    fn sozu_stats(&mut self) -> Result<Option<SozuStats>, SozuError> {
        self.stats().map(Some)
    }

    fn sozu_counters(&self) -> Option<SozuStats> {
        Some(self.counters())
    }

    fn get_batch(&mut self, keys: &[OutPoint]) -> Result<Vec<Option<Entry>>, SozuError> {
        let q: Vec<(OutPoint, u32)> = keys.iter().map(|k| (*k, 0)).collect();
        self.get_batch_since(&q)
    }

    fn write_block(
        &mut self,
        write: &BlockWrite,
        oracle: &dyn BlockOracle,
        purged: &mut dyn FnMut(Entry),
    ) -> Result<(), SozuError> {
        self.check_poison()?;
        let tip = oracle.tip_height();
        if write.height.saturating_add(PURGE_DEPTH) < tip {
            return Err(SozuError::ReorgTooDeep {
                height: write.height,
                tip,
            });
        }
        let by_shard = self.key_ops(write)?;
        let read_before = self.pages_read();
        let ctx = BlockCtx {
            geo: &self.geo,
            block: write.block,
            height: write.height,
            oracle,
            tip,
            compact_min: self.options.compact_min,
        };
        let results = self.workers.run(&mut self.shards, by_shard, |s, ops| {
            let mut out = Vec::new();
            s.write_block(&ctx, ops, &mut |e| out.push(e))?;
            Ok(out)
        });
        match results {
            Ok(lists) => lists.into_iter().flatten().for_each(purged),
            Err(e) => {
                self.poisoned = true;
                return Err(e);
            }
        }
        self.counters.last_block.0 = self.pages_read() - read_before;
        Ok(())
    }

    fn commit(&mut self, tag: CommitTag) -> Result<(), SozuError> {
        self.check_poison()?;
        let r = self.commit_inner(tag);
        if r.is_err() {
            self.poisoned = true;
        }
        r
    }

    fn committed(&self) -> Option<CommitTag> {
        self.committed.tag
    }

    fn for_each(&mut self, f: &mut dyn FnMut(&Entry)) -> Result<(), SozuError> {
        self.check_poison()?;
        let geo = self.geo.clone();
        for s in &mut self.shards {
            // The walk goes layer by layer from the top, so a key's spend
            // markers come before its entry (`docs/sozu-format.md`, "Spend
            // markers"); a marker whose entry is gone is nothing.
            let mut marked: FxHashMap<OutPointKey, Vec<Consumption>> = FxHashMap::default();
            walk(&geo, geo.max_layer, &mut |a| {
                let p = s.store.page(a)?;
                for (_, e) in super::page::entries(&p) {
                    if e.is_marker() {
                        marked
                            .entry(e.key_array())
                            .or_default()
                            .extend(e.consumptions());
                        continue;
                    }
                    let mut entry = s.resolve(e)?;
                    if let Some(c) = marked.remove(&e.key_array()) {
                        entry.merge_records(&[], &c);
                    }
                    f(&entry);
                }
                Ok(p)
            })?;
        }
        Ok(())
    }
}
