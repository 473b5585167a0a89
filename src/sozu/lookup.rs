//! The Sozu paper's `ReadSozu` for a whole batch of keys, over any view of a
//! shard's pages: the writer's (its current pages) or a concurrent
//! reader's (the committed ones).
//!
//! The descent goes layer by layer from layer 0; each distinct page is
//! visited once with every key that reaches it, so each bucket is read at
//! most once per batch. Below the pinned layers a page's summary is asked
//! first: when it rules out every key of the visit, the descent continues
//! from the summary's descent fields without reading the page.

use std::sync::Arc;

use super::geo::{Addr, Descent, Geo};
use super::page::{self, EntryRef, Slot};
use super::types::{Consumption, OutPointKey};
use super::SozuError;

/// One key to look up.
#[derive(Clone, Copy, Debug)]
pub(super) struct Query {
    pub(super) key: OutPointKey,
    /// Its hash ([`Geo::hash`]).
    pub(super) h: u64,
    /// The Sozu paper's height floor: the descent stops where nothing produced at
    /// or after it went below (0: no floor).
    pub(super) min_height: u32,
}

/// Pages a lookup can see.
pub(super) trait PageView {
    /// The signature check of `sigs` against page `addr` without reading
    /// it: `None` when the page must be read; else its descent fields, and
    /// `may[i]` whether it may hold `sigs[i]`.
    fn check(&mut self, addr: Addr, sigs: &[u16], may: &mut Vec<bool>) -> Option<Descent>;
    /// The page.
    ///
    /// # Errors
    /// Storage failure or corruption.
    fn read(&mut self, addr: Addr) -> Result<Arc<Vec<u8>>, SozuError>;
    /// Hints that the pages `addrs` (disk layers, ascending) are about to
    /// be read, so those not in memory are fetched from their files at
    /// once rather than one read after the other (default: nothing).
    fn prefetch(&mut self, _addrs: &[Addr]) {}
}

/// What a descent cost.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct LookupCounts {
    /// Pages read (any source).
    pub(super) pages_read: u64,
    /// Keys that went below the pinned layers.
    pub(super) deep_lookups: u64,
    /// For those, the disk-layer pages read on their behalf (a page read
    /// for a key its summary rules out is not counted).
    pub(super) deep_lookup_pages: u64,
}

/// Called with (query index, page, slot, entry) for each key found: first
/// for each spend marker on the key's path (its descent goes on below),
/// then for the entry, where the descent of that key ends.
pub(super) type Found<'f> = dyn FnMut(usize, Addr, u16, EntryRef<'_>) -> Result<(), SozuError> + 'f;

/// What a lookup found of one key: its entry, and the consumptions of the
/// spend markers above it (`docs/sozu-format.md`, "Spend markers").
#[derive(Clone, Debug, Default)]
pub(super) struct Hit {
    slot: Option<Slot>,
    marked: Vec<Consumption>,
}

impl Hit {
    /// Takes what [`Found`] was called with for this key.
    pub(super) fn add(&mut self, e: EntryRef<'_>) {
        if e.is_marker() {
            self.marked.extend(e.consumptions());
        } else {
            self.slot = Some(e.to_slot());
        }
    }
    /// The entry with its markers' consumptions merged in; `None` when no
    /// entry was found (a marker alone is no entry).
    pub(super) fn finish(self) -> Option<Slot> {
        let mut slot = self.slot?;
        slot.entry.merge_records(&[], &self.marked);
        Some(slot)
    }
}

struct Batch<'a, 'f> {
    geo: &'a Geo,
    queries: &'a [Query],
    sigs: Vec<u16>,
    deep: Vec<bool>,
    counts: LookupCounts,
    found: &'a mut Found<'f>,
    paths: Option<&'a mut [Vec<u64>]>,
    may: Vec<bool>,
    /// Per visit: which of its keys the page held (kept between visits).
    hit: Vec<bool>,
}

/// Looks every query up; `paths`, when given, receives for each query the
/// pages visited above the one that holds it (index = layer).
///
/// # Errors
/// Storage failure or corruption, or an error of `found`.
pub(super) fn descend(
    geo: &Geo,
    queries: &[Query],
    view: &mut dyn PageView,
    found: &mut Found<'_>,
    paths: Option<&mut [Vec<u64>]>,
) -> Result<LookupCounts, SozuError> {
    let mut d = Batch {
        geo,
        queries,
        sigs: queries
            .iter()
            .map(|q| geo.signature_key.signature(&q.key))
            .collect(),
        deep: vec![false; queries.len()],
        counts: LookupCounts::default(),
        found,
        paths,
        may: Vec::new(),
        hit: Vec::new(),
    };
    let mut pending: Vec<(u64, usize)> = queries
        .iter()
        .enumerate()
        .map(|(i, q)| (geo.layer0_page(q.h), i))
        .collect();
    for layer in 0..=geo.max_layer {
        if pending.is_empty() {
            break;
        }
        pending.sort_unstable();
        if !geo.is_ram(layer) {
            d.prefetch(view, layer, &pending);
        }
        let mut next = Vec::new();
        for group in pending.chunk_by(|a, b| a.0 == b.0) {
            d.visit(view, (layer, group[0].0), group, &mut next)?;
        }
        pending = next;
    }
    Ok(d.counts)
}

impl Batch<'_, '_> {
    /// Announces the pages of a disk layer that this layer's visits will
    /// read: those whose summary may hold one of their keys, or that have
    /// none. A page read costs a synchronous file read when it is not in
    /// memory; announced together, the reads overlap (`docs/benchmarks-history.md`,
    /// Sozu round 11: 4× less CPU and wall per read from the virtual disk).
    fn prefetch(&mut self, view: &mut dyn PageView, layer: u8, pending: &[(u64, usize)]) {
        let mut wanted = Vec::new();
        let mut may = std::mem::take(&mut self.may);
        for group in pending.chunk_by(|a, b| a.0 == b.0) {
            let sigs: Vec<u16> = group.iter().map(|&(_, qi)| self.sigs[qi]).collect();
            let addr = (layer, group[0].0);
            if view.check(addr, &sigs, &mut may).is_none() || may.iter().any(|&m| m) {
                wanted.push(addr);
            }
        }
        self.may = may;
        if wanted.len() > 1 {
            view.prefetch(&wanted);
        }
    }

    fn go_down(
        &mut self,
        d: Descent,
        (layer, page): Addr,
        qi: usize,
        next: &mut Vec<(u64, usize)>,
    ) {
        let q = &self.queries[qi];
        if let Some(child) = self.geo.child_of(d, q.h, layer, q.min_height) {
            if let Some(p) = self.paths.as_deref_mut() {
                p[qi].push(page);
            }
            next.push((child, qi));
        }
    }

    fn visit(
        &mut self,
        view: &mut dyn PageView,
        addr: Addr,
        group: &[(u64, usize)],
        next: &mut Vec<(u64, usize)>,
    ) -> Result<(), SozuError> {
        if !self.geo.is_ram(addr.0) {
            for &(_, qi) in group {
                if !std::mem::replace(&mut self.deep[qi], true) {
                    self.counts.deep_lookups += 1;
                }
            }
            let sigs: Vec<u16> = group.iter().map(|&(_, qi)| self.sigs[qi]).collect();
            let mut may = std::mem::take(&mut self.may);
            let checked = view.check(addr, &sigs, &mut may);
            let reads = match checked {
                Some(_) => may.iter().filter(|&&m| m).count(),
                None => group.len(),
            };
            self.may = may;
            self.counts.deep_lookup_pages += reads as u64;
            if let (Some(d), 0) = (checked, reads) {
                for &(_, qi) in group {
                    self.go_down(d, addr, qi, next);
                }
                return Ok(());
            }
        }
        let p = view.read(addr)?;
        self.counts.pages_read += 1;
        let mut hit = std::mem::take(&mut self.hit);
        hit.clear();
        hit.resize(group.len(), false);
        // The walk stops once every key of the visit is found.
        let mut left = group.len();
        for (slot, (_, e)) in page::entries(&p).enumerate() {
            if left == 0 {
                break;
            }
            for (k, &(_, qi)) in group.iter().enumerate() {
                if !hit[k] && page::key_eq(&self.queries[qi].key, e.key()) {
                    if !e.is_marker() {
                        hit[k] = true;
                        left -= 1;
                    }
                    (self.found)(qi, addr, slot as u16, e)?;
                }
            }
        }
        let d = Descent::of(&page::head(&p));
        for (k, &(_, qi)) in group.iter().enumerate() {
            if !hit[k] {
                self.go_down(d, addr, qi, next);
            }
        }
        self.hit = hit;
        Ok(())
    }
}
