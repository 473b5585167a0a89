//! One shard of the table as the writer holds it: its pages, the edits
//! since the last commit, its allocation state, its records and counters.
//! Shards are independent (a key's hash prefix names its shard), so each
//! works on its own thread. Each shard also compacts its out-of-line
//! script records, a bounded step per block (`records.rs` has the format).

use std::sync::Arc;

use super::geo::{Addr, Descent, Geo};
use super::header::{ShardState, MAX_LAYERS};
use super::lookup::{self, LookupCounts, PageView, Query};
use super::ops::{Op, OpError, OpLog};
use super::page::EntryRef;
use super::records::{
    self, location, record_bytes, segment_file, split, Records, COMPACT_STEP_BYTES, RECORD_HEAD_LEN,
};
use super::store::{corrupt, PageStore};
use super::types::{Entry, OutPointKey};
use super::SozuError;
use rustc_hash::FxHashMap;

/// Per-layer counts of one shard's write passes since open (the layer is
/// that of the page counted).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct FlowCounts {
    /// Pages rewritten by write passes.
    pub(super) rewrites: u64,
    /// Of those, pages with merges (records added to entries they hold:
    /// spends, re-productions).
    pub(super) merge_pages: u64,
    /// Entries spilled into pages of this layer.
    pub(super) spilled_in: u64,
    /// Spills into pages of this layer (one per parent spill and child).
    pub(super) spill_targets: u64,
}

/// Counters of one shard since open.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Counters {
    /// Per layer, from layer 0 down.
    pub(super) flow: [FlowCounts; MAX_LAYERS],
    pub(super) pages_read: u64,
    pub(super) pages_written: u64,
    pub(super) deep_lookups: u64,
    pub(super) deep_lookup_pages: u64,
    pub(super) spills: u64,
    pub(super) children_allocated: u64,
    pub(super) purges: u64,
    /// Pages whose entries were all tested for a purge (their purge hint
    /// was reached).
    pub(super) purge_checks: u64,
    pub(super) records_moved: u64,
    /// Cold spends filed as spend markers.
    pub(super) spend_markers: u64,
    /// Entries inserted where a spend marker of their key was (its entry
    /// purged below, the output produced again): the entry took the
    /// marker's place and consumptions.
    pub(super) markers_absorbed: u64,
    /// Page-file reads a spill into an existing child made (to learn its
    /// purge hint and append to it).
    pub(super) spill_file_reads: u64,
    /// Of those, children that needed nothing else in that block: no
    /// record or insert of their own, purge hint not due, still within
    /// their capacity after the spill (a spill that appended without
    /// reading the page would have spared that read).
    pub(super) spill_reads_avoidable: u64,
}

impl Counters {
    pub(super) fn add(&mut self, o: &Counters) {
        self.pages_read += o.pages_read;
        self.pages_written += o.pages_written;
        self.deep_lookups += o.deep_lookups;
        self.deep_lookup_pages += o.deep_lookup_pages;
        self.spills += o.spills;
        self.children_allocated += o.children_allocated;
        self.purges += o.purges;
        self.purge_checks += o.purge_checks;
        self.records_moved += o.records_moved;
        self.spend_markers += o.spend_markers;
        self.markers_absorbed += o.markers_absorbed;
        self.spill_file_reads += o.spill_file_reads;
        self.spill_reads_avoidable += o.spill_reads_avoidable;
        for (a, b) in self.flow.iter_mut().zip(&o.flow) {
            a.rewrites += b.rewrites;
            a.merge_pages += b.merge_pages;
            a.spilled_in += b.spilled_in;
            a.spill_targets += b.spill_targets;
        }
    }
    fn add_lookup(&mut self, c: LookupCounts) {
        self.pages_read += c.pages_read;
        self.deep_lookups += c.deep_lookups;
        self.deep_lookup_pages += c.deep_lookup_pages;
    }
}

/// An edit the writer made that its own page refused: a bug, not bad
/// input; the table must be reopened.
pub(super) fn op_err(e: OpError) -> SozuError {
    match e {
        OpError::Load(e) => *e,
        other => SozuError::Corrupt {
            path: "(writer's page edit)".into(),
            offset: 0,
            reason: other.to_string(),
        },
    }
}

/// One shard.
pub(super) struct Shard {
    pub(super) id: u8,
    pub(super) store: PageStore,
    pub(super) log: OpLog,
    pub(super) state: ShardState,
    pub(super) records: Records,
    pub(super) counters: Counters,
    /// Pages where [`Shard::get`] found keys since the last write: the
    /// next write's spends are there (nothing moves entries but a write),
    /// so it need not look them up again.
    pub(super) located: FxHashMap<OutPointKey, Addr>,
    /// Children a spill of the current block read from their files
    /// (for [`Counters::spill_reads_avoidable`]).
    pub(super) spill_read: rustc_hash::FxHashSet<Addr>,
}

/// Most keys [`Shard::located`] remembers.
const MAX_LOCATED: usize = 1 << 20;

impl PageView for PageStore {
    fn check(&mut self, addr: Addr, sigs: &[u16], may: &mut Vec<bool>) -> Option<Descent> {
        PageStore::check(self, addr, sigs, may)
    }
    fn read(&mut self, addr: Addr) -> Result<Arc<Vec<u8>>, SozuError> {
        self.page(addr)
    }
    fn prefetch(&mut self, addrs: &[Addr]) {
        PageStore::prefetch(self, addrs);
    }
}

impl Shard {
    /// The entry `e` with its out-of-line script read.
    ///
    /// # Errors
    /// Storage failure or a damaged record.
    pub(super) fn resolve(&mut self, e: EntryRef<'_>) -> Result<Entry, SozuError> {
        let mut slot = e.to_slot();
        if let Some((ext, len)) = slot.external {
            slot.entry.coin.script_pubkey = records::read_script(
                self.store.storage.as_mut(),
                (self.id, &self.store.published),
                Some(self.records.pending()),
                e.key(),
                ext,
                len as usize,
            )?;
        }
        Ok(slot.entry)
    }

    /// Batched lookup of `queries` in the current state (uncommitted edits
    /// included); `found(query index, page, slot, entry)` for each hit.
    ///
    /// # Errors
    /// Storage failure or corruption, or an error of `found`.
    pub(super) fn locate(
        &mut self,
        geo: &Geo,
        queries: &[Query],
        found: &mut lookup::Found<'_>,
        paths: Option<&mut [Vec<u64>]>,
    ) -> Result<(), SozuError> {
        let c = lookup::descend(geo, queries, &mut self.store, found, paths)?;
        self.counters.add_lookup(c);
        Ok(())
    }

    /// The entries of `queries` (`None` where absent), scripts resolved.
    ///
    /// # Errors
    /// Storage failure or corruption.
    pub(super) fn get(
        &mut self,
        geo: &Geo,
        queries: &[Query],
    ) -> Result<Vec<Option<Entry>>, SozuError> {
        let mut hits = vec![lookup::Hit::default(); queries.len()];
        let mut at = Vec::new();
        self.locate(
            geo,
            queries,
            &mut |qi, addr, _, e| {
                hits[qi].add(e);
                if !e.is_marker() {
                    at.push((qi, addr));
                }
                Ok(())
            },
            None,
        )?;
        if self.located.len() + at.len() > MAX_LOCATED {
            self.located.clear();
        }
        self.located
            .extend(at.into_iter().map(|(qi, addr)| (queries[qi].key, addr)));
        hits.into_iter()
            .zip(queries)
            .map(|(h, q)| match h.finish() {
                Some(mut s) => {
                    if let Some((ext, len)) = s.external {
                        s.entry.coin.script_pubkey = records::read_script(
                            self.store.storage.as_mut(),
                            (self.id, &self.store.published),
                            Some(self.records.pending()),
                            &q.key,
                            ext,
                            len as usize,
                        )?;
                    }
                    Ok(Some(s.entry))
                }
                None => Ok(None),
            })
            .collect()
    }
}

/// Reports an entry that a lookup found and a later edit cannot.
pub(super) fn vanished(layer: u8, page: u64) -> SozuError {
    corrupt(
        format!("(layer {layer} page {page})").into(),
        0,
        "entry vanished between lookup and edit",
    )
}

impl Shard {
    /// One block's share of records compaction: starts one when the
    /// current segment is large enough and more than half dead, or copies
    /// the live records of the next [`COMPACT_STEP_BYTES`] of the sealed
    /// segment into the current one.
    ///
    /// # Errors
    /// Storage failure or corruption.
    pub(super) fn compact_records(
        &mut self,
        geo: &super::geo::Geo,
        min_len: u64,
    ) -> Result<(), SozuError> {
        let r = &mut self.state.records;
        let Some((segment, len, cursor)) = r.compacting else {
            if r.delete.is_none()
                && r.current_len >= min_len.max(1)
                && r.current_dead * 2 > r.current_len
            {
                r.compacting = Some((r.current, r.current_len, 0));
                r.current += 1;
                r.current_len = 0;
                r.current_dead = 0;
            }
            return Ok(());
        };
        let (walked, end) = self.sealed_records(segment, cursor, len)?;
        self.move_live(geo, &walked)?;
        let r = &mut self.state.records;
        if end >= len {
            r.compacting = None;
            r.delete = Some(segment);
        } else {
            r.compacting = Some((segment, len, end));
        }
        Ok(())
    }

    /// The records of sealed `segment` from `cursor` on, at most about
    /// [`COMPACT_STEP_BYTES`] of them: (location, key, record bytes), and
    /// the offset after the last.
    #[allow(clippy::type_complexity)]
    fn sealed_records(
        &mut self,
        segment: u32,
        mut at: u64,
        len: u64,
    ) -> Result<(Vec<(u64, OutPointKey, Arc<Vec<u8>>)>, u64), SozuError> {
        let start = at;
        let mut out = Vec::new();
        while at < len && at - start < COMPACT_STEP_BYTES {
            let loc = location(segment, at);
            let head = self.record_head(loc)?;
            let script_len = u16::from_le_bytes([head[36], head[37]]) as usize;
            let rec = self.read_record(loc, script_len)?;
            let mut key = [0u8; 36];
            key.copy_from_slice(&rec[..36]);
            at += rec.len() as u64;
            out.push((loc, key, rec));
        }
        Ok((out, at))
    }

    /// The record at `loc` with a script of `script_len` bytes (0: its
    /// head only), from the records not yet committed, the published ones
    /// or its segment.
    fn read_record(&mut self, loc: u64, script_len: usize) -> Result<Arc<Vec<u8>>, SozuError> {
        record_bytes(
            self.store.storage.as_mut(),
            self.id,
            &self.store.published,
            Some(self.records.pending()),
            loc,
            script_len,
        )
    }

    /// The first 40 bytes of the record at `loc`.
    fn record_head(&mut self, loc: u64) -> Result<Vec<u8>, SozuError> {
        let rec = self.read_record(loc, 0)?;
        if rec.len() < RECORD_HEAD_LEN {
            let (segment, offset) = split(loc);
            return Err(corrupt(
                self.store.storage.path_of(&segment_file(self.id, segment)),
                offset,
                "record head truncated",
            ));
        }
        Ok(rec[..RECORD_HEAD_LEN].to_vec())
    }

    /// Copies the records whose entries still point at them into the
    /// current segment and repoints those entries.
    fn move_live(
        &mut self,
        geo: &super::geo::Geo,
        walked: &[(u64, OutPointKey, Arc<Vec<u8>>)],
    ) -> Result<(), SozuError> {
        let queries: Vec<Query> = walked
            .iter()
            .map(|(_, key, _)| Query {
                key: *key,
                h: geo.hash(key),
                min_height: 0,
            })
            .collect();
        let mut live = Vec::new();
        lookup::descend(
            geo,
            &queries,
            &mut self.store,
            &mut |qi, addr, slot, e| {
                if e.external().is_some_and(|x| x.location == walked[qi].0) {
                    live.push((addr, slot, qi));
                }
                Ok(())
            },
            None,
        )?;
        live.sort_unstable();
        for (addr, slot, qi) in live {
            let loc = self
                .records
                .push(&mut self.state.records, walked[qi].2.to_vec());
            self.log
                .apply(&mut self.store, Op::Page(addr))
                .map_err(op_err)?;
            self.log
                .apply(
                    &mut self.store,
                    Op::Locate {
                        slot,
                        location: loc,
                    },
                )
                .map_err(op_err)?;
            self.counters.records_moved += 1;
        }
        Ok(())
    }
}
