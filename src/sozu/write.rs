//! Writing one block into a shard (the Sozu paper's `WriteSozu` and
//! `MergeEntries`), every page change an [`Op`] of the journal.
//!
//! 1. Keys that may be present (every spent key, and new outputs not
//!    `known_absent`) are located by one batched descent; new keys go to
//!    layer 0.
//! 2. Pages are then rewritten layer by layer from the top, each once per
//!    block: records merged into entries in place, new entries appended;
//!    entries tested for a hard delete when the page's purge hint is due
//!    ([`super::purge`]); and if the page exceeds its layer's capacity, a
//!    spill ([`super::spill`]) moves entries to children, which the next
//!    layer's pass visits.

use std::collections::BTreeMap;

use bitcoin::OutPoint;

use super::geo::{Addr, Descent, Geo};
use super::lookup::Query;
use super::ops::Op;
use super::page::{self, ScriptField, NO_PURGE};
use super::purge;
use super::records;
use super::shard::{op_err, vanished, Shard};
use super::spill::{self, SpillEntry, SpillInput};
use super::types::{
    is_dead_marker, is_purgeable, BlockId, BlockOracle, Coin, Consumption, Entry, OutPointKey,
    Production, PURGE_DEPTH,
};
use super::SozuError;

/// One key's changes in a block.
pub(super) struct KeyOp {
    pub(super) key: OutPointKey,
    pub(super) outpoint: OutPoint,
    pub(super) h: u64,
    /// A production: its coin, and whether the caller proved it absent.
    pub(super) create: Option<(Coin, bool)>,
    pub(super) consumed: Vec<Consumption>,
}

/// What every page rewrite of a block needs to know.
pub(super) struct BlockCtx<'a> {
    pub(super) geo: &'a Geo,
    pub(super) block: BlockId,
    pub(super) height: u32,
    pub(super) oracle: &'a dyn BlockOracle,
    /// The best tip's height.
    pub(super) tip: u32,
    /// [`super::SozuConfig::records_compact_min`].
    pub(super) compact_min: u64,
}

/// A merge into an existing entry.
struct Merge {
    key: OutPointKey,
    /// The coin to check, for a production.
    coin: Option<Coin>,
    produced: Option<Production>,
    consumed: Vec<Consumption>,
}

/// One page's work in a block.
#[derive(Default)]
struct PageWork {
    merges: Vec<Merge>,
    /// New entries, encoded.
    inserts: Vec<Vec<u8>>,
    /// Raise of the max-production-height below (a deep entry produced
    /// again: height-floored lookups must still reach it).
    raise: u32,
}

type Work = Vec<BTreeMap<u64, PageWork>>;

/// An insert (its index) that takes the place of a spend marker of its key
/// (the marker's slot, its consumptions).
type Absorbed = (usize, u16, Vec<Consumption>);

/// A page's walk for its work: the merges, the inserts to append (by
/// index), and those of them that absorb a marker.
#[derive(Default)]
struct PagePlan {
    merges: Vec<EntryEdit>,
    absent: Vec<usize>,
    absorbed: Vec<Absorbed>,
}

/// The records one entry of a page lacks, found by the page's walk.
struct EntryEdit {
    /// Byte offset of the entry in the page.
    at: usize,
    slot: u16,
    produced: Vec<Production>,
    consumed: Vec<Consumption>,
}

impl Shard {
    /// Applies one block's changes to this shard's keys, handing every
    /// entry it hard-deletes to `purged`.
    ///
    /// # Errors
    /// [`SozuError::MissingEntry`], [`SozuError::CoinMismatch`],
    /// [`SozuError::BucketFull`], storage failure. The shard is then in an
    /// unspecified state and the table must be reopened.
    pub(super) fn write_block(
        &mut self,
        ctx: &BlockCtx<'_>,
        ops: Vec<KeyOp>,
        purged: &mut dyn FnMut(Entry),
    ) -> Result<(), SozuError> {
        let work = self.gather(ctx, ops);
        self.located.clear();
        self.spill_read.clear();
        let mut work = work?;
        for layer in 0..=ctx.geo.max_layer {
            let this = std::mem::take(&mut work[layer as usize]);
            if this.is_empty() {
                if work.iter().all(BTreeMap::is_empty) {
                    break;
                }
                continue;
            }
            if layer < ctx.geo.max_layer && !ctx.geo.is_ram(layer + 1) {
                self.prefetch_spill_children(ctx, layer, &this);
            }
            for (page, w) in this {
                self.rewrite(ctx, (layer, page), w, &mut work, purged)?;
            }
        }
        self.compact_records(ctx.geo, ctx.compact_min)
    }

    /// Announces the disk pages this layer's spills are likely to read: the
    /// written children of each page of the pass already over its capacity
    /// (with its inserts), most often because a spill from above filled
    /// it. A spill reads its child at once; announced together for the
    /// whole pass, those reads overlap instead of following one another.
    /// Only pages already in memory are looked at (nothing is read here);
    /// a child not chosen by the spill policy is fetched for nothing.
    fn prefetch_spill_children(
        &mut self,
        ctx: &BlockCtx<'_>,
        layer: u8,
        this: &BTreeMap<u64, PageWork>,
    ) {
        let capacity = ctx.geo.layer_cfg(layer).capacity;
        let fanout = 1u64 << ctx.geo.g;
        let mut children = Vec::new();
        for (&page, w) in this {
            let Some(p) = self.store.in_memory((layer, page)) else {
                continue;
            };
            let incoming: usize = w.inserts.iter().map(Vec::len).sum();
            let head = page::head(&p);
            if page::payload_len(&p) + incoming <= capacity || head.children == 0 {
                continue;
            }
            let first = (head.children - 1).saturating_mul(fanout);
            for c in (0..fanout).filter(|c| head.child_mask & (1 << c) != 0) {
                children.push((layer + 1, first.saturating_add(c)));
            }
        }
        if children.len() > 1 {
            self.store.prefetch(&children);
        }
    }

    /// Step 1: locates what may be present and sorts the work by page.
    fn gather(&mut self, ctx: &BlockCtx<'_>, ops: Vec<KeyOp>) -> Result<Work, SozuError> {
        let geo = ctx.geo;
        // Outputs that may be present can only be recent re-productions
        // (BIP30): the lookup stops where nothing that recent went below.
        let floor = ctx.tip.min(ctx.height).saturating_sub(PURGE_DEPTH);
        let mut at: Vec<Option<(Addr, Vec<u64>)>> = (0..ops.len()).map(|_| None).collect();
        // Spends the last lookups found need no new lookup.
        for (op, at) in ops.iter().zip(at.iter_mut()) {
            if op.create.is_none() {
                *at = self.located.get(&op.key).map(|a| (*a, Vec::new()));
            }
        }
        let idx: Vec<usize> = (0..ops.len())
            .filter(|&i| at[i].is_none() && !matches!(ops[i].create, Some((_, true))))
            .collect();
        let queries: Vec<Query> = idx
            .iter()
            .map(|&i| Query {
                key: ops[i].key,
                h: ops[i].h,
                min_height: if ops[i].create.is_some() { floor } else { 0 },
            })
            .collect();
        let mut found: Vec<Option<Addr>> = vec![None; queries.len()];
        let mut paths = vec![Vec::new(); queries.len()];
        self.locate(
            geo,
            &queries,
            &mut |qi, addr, _, e| {
                if !e.is_marker() {
                    found[qi] = Some(addr);
                }
                Ok(())
            },
            Some(&mut paths),
        )?;
        for ((i, f), p) in idx.into_iter().zip(found).zip(paths) {
            at[i] = f.map(|a| (a, p));
        }
        let mut work: Work = (0..=geo.max_layer).map(|_| BTreeMap::new()).collect();
        let production = Production {
            block: ctx.block,
            height: ctx.height,
        };
        for (op, at) in ops.into_iter().zip(at) {
            self.plan(ctx, &mut work, op, at, production)?;
        }
        Ok(work)
    }

    /// Files one key's change under the page that will take it.
    fn plan(
        &mut self,
        ctx: &BlockCtx<'_>,
        work: &mut Work,
        op: KeyOp,
        at: Option<(Addr, Vec<u64>)>,
        production: Production,
    ) -> Result<(), SozuError> {
        if let (Some((addr, path)), None) = (&at, &op.create) {
            if let Some(t) = cold(ctx.geo, addr.0) {
                // The page of layer t on the key's path: from the lookup,
                // or (a spend found by the last `get`) down the pinned
                // layers' headers.
                let page = match path.get(t as usize) {
                    Some(&p) => p,
                    None => self.pinned_path(ctx.geo, op.h, (t, *addr))?,
                };
                self.counters.spend_markers += 1;
                return file_marker(work, &op, (t, page));
            }
        }
        match (at, op.create) {
            (Some(((layer, page), path)), create) => {
                if create.is_some() {
                    for (l, p) in path.iter().enumerate() {
                        let w = work[l].entry(*p).or_default();
                        w.raise = w.raise.max(ctx.height);
                    }
                }
                let produced = create.is_some().then_some(production);
                work[layer as usize]
                    .entry(page)
                    .or_default()
                    .merges
                    .push(Merge {
                        key: op.key,
                        coin: create.map(|(c, _)| c),
                        produced,
                        consumed: op.consumed,
                    });
            }
            (None, Some((coin, _))) => {
                let e = Entry {
                    outpoint: op.outpoint,
                    coin,
                    produced: vec![production],
                    consumed: op.consumed,
                };
                let bytes = self.encode_new(ctx.geo, &e)?;
                let page = ctx.geo.layer0_page(op.h);
                work[0].entry(page).or_default().inserts.push(bytes);
            }
            (None, None) => {
                return Err(SozuError::MissingEntry {
                    outpoint: op.outpoint,
                })
            }
        }
        Ok(())
    }

    /// A new entry's bytes; a long script goes to the records file.
    fn encode_new(&mut self, geo: &Geo, e: &Entry) -> Result<Vec<u8>, SozuError> {
        let script = &e.coin.script_pubkey;
        let field = if script.len() > geo.inline_script_max {
            let key = super::types::outpoint_key(&e.outpoint);
            let ext = self.records.append(&mut self.state.records, &key, script);
            ScriptField::External(ext, script.len() as u16)
        } else {
            ScriptField::Inline(script)
        };
        let mut out = Vec::with_capacity(page::ENTRY_FIXED_LEN + 16 + script.len().min(100) + 48);
        page::encode_entry(e, field, &mut out).map_err(|_| SozuError::ScriptTooLong {
            outpoint: e.outpoint,
            len: script.len(),
        })?;
        Ok(out)
    }

    /// The page of layer `t` (pinned) on the path of a key of hash `h`
    /// whose entry is at `at`, below `t`: read from the headers of the
    /// pinned pages above it, no file read.
    ///
    /// # Errors
    /// [`SozuError::Corrupt`] when the path ends above layer `t`.
    fn pinned_path(&mut self, geo: &Geo, h: u64, (t, at): (u8, Addr)) -> Result<u64, SozuError> {
        let mut page = geo.layer0_page(h);
        for layer in 0..t {
            let d = Descent::of(&page::head(&self.store.page((layer, page))?));
            page = geo
                .child_of(d, h, layer, 0)
                .ok_or_else(|| vanished(at.0, at.1))?;
        }
        Ok(page)
    }

    fn apply(&mut self, op: Op<'_>) -> Result<(), SozuError> {
        self.log.apply(&mut self.store, op).map_err(op_err)
    }

    /// Step 2 for one page: merges, inserts, header, purge, spill.
    fn rewrite(
        &mut self,
        ctx: &BlockCtx<'_>,
        addr: Addr,
        w: PageWork,
        work: &mut Work,
        purged: &mut dyn FnMut(Entry),
    ) -> Result<(), SozuError> {
        let only_spilled = w.merges.is_empty() && w.inserts.is_empty() && w.raise == 0;
        let flow = &mut self.counters.flow[addr.0 as usize];
        flow.rewrites += 1;
        flow.merge_pages += u64::from(!w.merges.is_empty());
        self.apply(Op::Page(addr))?;
        let added = self.merge_and_insert(addr, &w)?;
        self.update_head(ctx, addr, w.raise, added)?;
        let p = self.store.page(addr)?;
        let due = page::head(&p).purge_hint <= ctx.tip;
        drop(p);
        if due {
            self.purge(ctx, addr, purged)?;
        }
        let p = self.store.page(addr)?;
        let over = page::payload_len(&p) > ctx.geo.layer_cfg(addr.0).capacity;
        drop(p);
        if only_spilled && !due && !over && self.spill_read.contains(&addr) {
            self.counters.spill_reads_avoidable += 1;
        }
        if over && addr.0 < ctx.geo.max_layer {
            self.spill(ctx, addr, work)?;
        }
        if self.store.page(addr)?.len() > ctx.geo.page_size {
            return Err(SozuError::BucketFull {
                layer: addr.0,
                page: addr.1,
            });
        }
        Ok(())
    }

    /// The records to add to each merged entry (an inserted key already
    /// present counts as a merge of the new entry's records), found by one
    /// walk over the page, and the indexes of the inserts to append.
    fn plan_page(&mut self, addr: Addr, w: &PageWork) -> Result<PagePlan, SozuError> {
        let mut merges = Vec::new();
        let mut absorbed = Vec::new();
        if w.merges.is_empty() && w.inserts.is_empty() {
            // Only spilled into: nothing to find in the page.
            return Ok(PagePlan::default());
        }
        let p = self.store.page(addr)?;
        let mut present = vec![false; w.inserts.len()];
        let mut seen = vec![false; w.merges.len()];
        // Without inserts (whose absence needs the whole page) the walk
        // stops once every merge has found its entry.
        let mut unseen = w.merges.len();
        for (slot, (at, e)) in page::entries(&p).enumerate() {
            if unseen == 0 && w.inserts.is_empty() {
                break;
            }
            for (m, seen) in w.merges.iter().zip(seen.iter_mut()) {
                if !*seen && page::key_eq(&m.key, e.key()) {
                    *seen = true;
                    unseen -= 1;
                    if let Some(coin) = &m.coin {
                        self.check_coin(e, coin)?;
                    }
                    let (produced, consumed) =
                        new_records(e, m.produced.iter().copied(), m.consumed.iter().copied());
                    merges.push(EntryEdit {
                        at,
                        slot: slot as u16,
                        produced,
                        consumed,
                    });
                }
            }
            for (i, (bytes, present)) in w.inserts.iter().zip(present.iter_mut()).enumerate() {
                if !*present && page::key_eq(&bytes[..36], e.key()) {
                    *present = true;
                    let new = page::EntryRef::parse(bytes).map_err(|_| vanished(addr.0, addr.1))?;
                    if e.is_marker() && !new.is_marker() {
                        // An entry inserted where a marker of its key is (a
                        // marker whose entry was purged): it takes the
                        // marker's place and consumptions.
                        absorbed.push((i, slot as u16, e.consumptions().collect()));
                        continue;
                    }
                    let (produced, consumed) =
                        new_records(e, new.productions(), new.consumptions());
                    merges.push(EntryEdit {
                        at,
                        slot: slot as u16,
                        produced,
                        consumed,
                    });
                }
            }
        }
        if seen.iter().any(|s| !s) {
            return Err(vanished(addr.0, addr.1));
        }
        let absent = (0..w.inserts.len())
            .filter(|&i| !present[i] || absorbed.iter().any(|a: &Absorbed| a.0 == i))
            .collect();
        Ok(PagePlan {
            merges,
            absent,
            absorbed,
        })
    }

    /// Applies a page's merges (from the last entry up, so the offsets of
    /// the entries not yet edited stay valid) and appends its new entries;
    /// whether a record was added.
    fn merge_and_insert(&mut self, addr: Addr, w: &PageWork) -> Result<bool, SozuError> {
        let PagePlan {
            mut merges,
            absent,
            absorbed,
        } = self.plan_page(addr, w)?;
        merges.sort_unstable_by_key(|m| std::cmp::Reverse(m.at));
        let mut added = !absent.is_empty();
        for m in merges {
            let (at, slot) = (m.at, m.slot);
            added |= !m.produced.is_empty() || !m.consumed.is_empty();
            for x in &m.produced {
                let record = page::encode_production(x);
                self.apply_at(Op::Produce { slot, record }, at)?;
            }
            for x in &m.consumed {
                let record = page::consumption_bytes(x);
                self.apply_at(Op::Consume { slot, record }, at)?;
            }
        }
        if !absorbed.is_empty() {
            self.counters.markers_absorbed += absorbed.len() as u64;
            let mut slots: Vec<u16> = absorbed.iter().map(|a| a.1).collect();
            slots.sort_unstable();
            self.apply(Op::Delete(slots.into()))?;
        }
        for i in absent {
            match absorbed.iter().find(|a| a.0 == i) {
                Some((_, _, consumed)) => {
                    let bytes = with_consumptions(&w.inserts[i], consumed)?;
                    self.apply(Op::Insert(&bytes))?;
                }
                None => self.apply(Op::Insert(&w.inserts[i]))?,
            }
        }
        Ok(added)
    }

    fn apply_at(&mut self, op: Op<'_>, at: usize) -> Result<(), SozuError> {
        self.log
            .apply_at(&mut self.store, op, Some(at))
            .map_err(op_err)
    }

    /// A production of an entry already in the table must carry its coin.
    fn check_coin(&mut self, e: page::EntryRef<'_>, coin: &Coin) -> Result<(), SozuError> {
        let same_script = match e.external() {
            None => e.inline_script() == coin.script_pubkey.as_slice(),
            Some(_) => self.resolve(e)?.coin.script_pubkey == coin.script_pubkey,
        };
        if e.value() != coin.value.to_sat() || !same_script {
            return Err(SozuError::CoinMismatch {
                outpoint: super::types::key_outpoint(&e.key_array()),
            });
        }
        Ok(())
    }

    /// Raises the page's max production height below and lowers its purge
    /// hint for records added at this block's height.
    fn update_head(
        &mut self,
        ctx: &BlockCtx<'_>,
        addr: Addr,
        raise: u32,
        added: bool,
    ) -> Result<(), SozuError> {
        let h = page::head(&self.store.page(addr)?);
        let max = h.max_child_height.max(raise);
        let hint = match (added, purge::record_hint(ctx.height, ctx.tip)) {
            (true, Some(x)) => h.purge_hint.min(x),
            _ => h.purge_hint,
        };
        if (max, hint) != (h.max_child_height, h.purge_hint) {
            self.apply(Op::Head {
                max_child_height: max,
                purge_hint: hint,
                children: h.children_field(),
            })?;
        }
        Ok(())
    }

    /// Tests every entry of the page for a hard delete; deletes the
    /// purgeable ones and sets the hint from the others.
    fn purge(
        &mut self,
        ctx: &BlockCtx<'_>,
        addr: Addr,
        purged: &mut dyn FnMut(Entry),
    ) -> Result<(), SozuError> {
        self.counters.purge_checks += 1;
        let p = self.store.page(addr)?;
        let mut slots = Vec::new();
        let mut hint = NO_PURGE;
        let mut dead = Vec::new();
        for (slot, (_, e)) in page::entries(&p).enumerate() {
            if e.is_marker() {
                if is_dead_marker(e.consumptions(), ctx.oracle, ctx.tip) {
                    slots.push(slot as u16);
                } else {
                    hint = hint.min(purge::entry_hint(e, ctx.oracle, ctx.tip));
                }
            } else if is_purgeable(e.productions(), e.consumptions(), ctx.oracle, ctx.tip) {
                slots.push(slot as u16);
                if let Some(ext) = e.external() {
                    records::mark_dead(&mut self.state.records, ext, e.script_len());
                }
                dead.push(self.resolve(e)?);
            } else {
                hint = hint.min(purge::entry_hint(e, ctx.oracle, ctx.tip));
            }
        }
        let h = page::head(&p);
        drop(p);
        if !slots.is_empty() {
            self.apply(Op::Delete(slots.into()))?;
        }
        self.counters.purges += dead.len() as u64;
        dead.into_iter().for_each(purged);
        self.apply(Op::Head {
            max_child_height: h.max_child_height,
            purge_hint: hint,
            children: h.children_field(),
        })
    }

    /// Moves the entries the spill policy picks into the children (seed
    /// 000's `GetSpill`, with the fewest-children policy).
    fn spill(&mut self, ctx: &BlockCtx<'_>, addr: Addr, work: &mut Work) -> Result<(), SozuError> {
        let geo = ctx.geo;
        let (layer, _) = addr;
        let p = self.store.page(addr)?;
        let head = page::head(&p);
        let cfg = geo.layer_cfg(layer);
        let all: Vec<page::EntryRef<'_>> = page::entries(&p).map(|(_, e)| e).collect();
        let entries: Vec<SpillEntry> = all
            .iter()
            .map(|e| {
                let key = e.key_array();
                SpillEntry {
                    marker: e.is_marker(),
                    consumed_on_best: e
                        .consumptions()
                        .any(|c| ctx.oracle.best_height(c.block).is_some()),
                    max_height: e.max_production_height(),
                    child: geo.child_index(geo.hash(&key), layer + 1) as usize,
                    key,
                    len: e.len(),
                }
            })
            .collect();
        let moved = spill::choose(&SpillInput {
            entries: &entries,
            target: (cfg.alpha * cfg.capacity as f64) as usize,
            fanout: 1 << geo.g,
            written: head.child_mask,
            fewest_children: geo.spill_fewest_children,
            consumed_first: geo.spill_consumed.first_into(geo.is_ram(layer + 1)),
        });
        // Per child: (slots, lowest purge hint, highest production height).
        let mut by_child: BTreeMap<usize, (Vec<u16>, u32, u32)> = BTreeMap::new();
        for &i in &moved {
            let c = by_child
                .entry(entries[i].child)
                .or_insert((Vec::new(), NO_PURGE, 0));
            c.0.push(i as u16);
            // A marker whose spend is settled on the best chain makes the
            // entry it meets purgeable: the child tests its entries now.
            let e = all[i];
            let hint = if e.is_marker()
                && is_purgeable(std::iter::empty(), e.consumptions(), ctx.oracle, ctx.tip)
            {
                ctx.tip
            } else {
                purge::entry_hint(e, ctx.oracle, ctx.tip)
            };
            c.1 = c.1.min(hint);
            c.2 = c.2.max(entries[i].max_height);
        }
        drop(all);
        drop(p);
        if by_child.is_empty() {
            return Ok(());
        }
        self.move_to_children(ctx, addr, head, by_child, work)
    }

    fn move_to_children(
        &mut self,
        ctx: &BlockCtx<'_>,
        addr: Addr,
        head: page::PageHead,
        by_child: BTreeMap<usize, (Vec<u16>, u32, u32)>,
        work: &mut Work,
    ) -> Result<(), SozuError> {
        let (layer, _) = addr;
        let mut children = head.children;
        if children == 0 {
            let groups = &mut self.state.groups[layer as usize + 1];
            children = *groups + 1;
            *groups += 1;
            self.counters.children_allocated += 1;
        }
        let (mut mask, mut max_height) = (head.child_mask, head.max_child_height);
        let mut gone: Vec<u16> = Vec::new();
        for (c, (slots, hint, height)) in by_child {
            let child = (children - 1)
                .saturating_mul(1 << ctx.geo.g)
                .saturating_add(c as u64);
            let init = mask & (1 << c) == 0;
            mask |= 1 << c;
            let existing = if init {
                NO_PURGE
            } else {
                let reads = self.store.file_reads;
                let hint = page::head(&self.store.page((layer + 1, child))?).purge_hint;
                if self.store.file_reads > reads {
                    self.counters.spill_file_reads += 1;
                    self.spill_read.insert((layer + 1, child));
                }
                hint
            };
            // Slots shift down as earlier children's entries leave.
            let now: Vec<u16> = slots
                .iter()
                .map(|&s| s - gone.iter().filter(|&&g| g < s).count() as u16)
                .collect();
            self.apply(Op::Spill {
                child,
                init,
                child_hint: existing.min(hint),
                slots: now.into(),
            })?;
            self.counters.spills += slots.len() as u64;
            let flow = &mut self.counters.flow[layer as usize + 1];
            flow.spilled_in += slots.len() as u64;
            flow.spill_targets += 1;
            gone.extend(slots);
            max_height = max_height.max(height);
            work[layer as usize + 1].entry(child).or_default();
        }
        self.apply(Op::Head {
            max_child_height: max_height,
            purge_hint: head.purge_hint,
            children: children | (u64::from(mask) << page::CHILDREN_GROUP_BITS),
        })
    }
}

/// For a spend of an entry in `layer`, the layer that takes its spend
/// marker if the spend is cold: the last pinned layer, when `layer` is
/// below it (`docs/sozu-format.md`, "Spend markers"; no pinned layer, no
/// marker).
fn cold(geo: &Geo, layer: u8) -> Option<u8> {
    geo.ram_layers.checked_sub(1).filter(|&t| layer > t)
}

/// Files a cold spend as a spend marker in page `page` of layer `t` on its
/// key's path, instead of an edit of the disk page that holds the entry;
/// that page's walk merges it into a marker of the key already there.
fn file_marker(work: &mut Work, op: &KeyOp, (t, page): (u8, u64)) -> Result<(), SozuError> {
    if op.consumed.is_empty() {
        return Ok(());
    }
    let mut bytes = Vec::with_capacity(page::ENTRY_FIXED_LEN + 40 * op.consumed.len());
    page::encode_marker(&op.key, &op.consumed, &mut bytes).map_err(|_| too_many_records())?;
    work[t as usize]
        .entry(page)
        .or_default()
        .inserts
        .push(bytes);
    Ok(())
}

/// An entry or marker that would pass 255 consumptions: refused as any
/// page edit the page cannot take.
fn too_many_records() -> SozuError {
    op_err(super::ops::OpError::Decode {
        at: 0,
        what: "more than 255 consumptions",
    })
}

/// The encoded entry `bytes` (one whole entry, built by this writer) with
/// `consumed` added to its consumptions.
///
/// # Errors
/// More than 255 consumptions.
fn with_consumptions(bytes: &[u8], consumed: &[Consumption]) -> Result<Vec<u8>, SozuError> {
    let slot = page::EntryRef::parse(bytes)
        .map_err(|_| too_many_records())?
        .to_slot();
    let mut entry = slot.entry;
    entry.merge_records(&[], consumed);
    let field = match slot.external {
        Some((ext, len)) => ScriptField::External(ext, len),
        None => ScriptField::Inline(&entry.coin.script_pubkey),
    };
    let mut out = Vec::with_capacity(bytes.len() + 40 * consumed.len());
    page::encode_entry(&entry, field, &mut out).map_err(|_| too_many_records())?;
    Ok(out)
}

/// The records of `produced` and `consumed` that entry `e` lacks, in order
/// (duplicates dropped).
fn new_records(
    e: page::EntryRef<'_>,
    produced: impl Iterator<Item = Production>,
    consumed: impl Iterator<Item = Consumption>,
) -> (Vec<Production>, Vec<Consumption>) {
    let mut np: Vec<Production> = produced
        .filter(|x| !e.productions().any(|y| y == *x))
        .collect();
    np.sort_unstable();
    np.dedup();
    let mut nc: Vec<Consumption> = consumed
        .filter(|x| !e.consumptions().any(|y| y == *x))
        .collect();
    nc.sort_unstable();
    nc.dedup();
    (np, nc)
}
