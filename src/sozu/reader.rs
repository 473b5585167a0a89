//! [`SozuReader`]: lookups of the committed state from any thread while
//! the writer works (`docs/sozu-format.md`, "Concurrent readers").

use std::sync::Arc;

use bitcoin::OutPoint;
use parking_lot::Mutex;

use super::files::HEADER_FILE;
use super::geo::{Addr, Descent, Geo};
use super::lookup::{self, PageView, Query};
use super::records;
use super::stats::{file_bytes, LayerScan, SozuStats};
use super::storage::Storage;
use super::store::{io_err, layer_file, read_existing_page_noting, Published};
use super::types::{outpoint_key, Entry};
use super::walk::walk;
use super::{SozuError, UtxoReader};

/// File reads a lookup retries when a publication races it.
const MAX_RETRIES: u32 = 8;

/// Concurrent reads of a [`super::SozuTable`]'s committed state, from any
/// thread while the writer works ([`super::UtxoTable::reader`]). Pages
/// come from what each shard published (the committed images in memory:
/// pinned layers and pages not yet checkpointed) or from the page files;
/// the committed page summaries spare the reads of pages that cannot hold
/// a key, as they do the writer's. No lock is held during a file read, so
/// the writer never waits for a reader longer than the copy of a pointer.
/// A lookup descends top-down, so an entry that a commit moves down
/// meanwhile is still found (see the format document for why).
pub struct SozuReader {
    geo: Geo,
    shards: Vec<Arc<Published>>,
    /// Idle storage handles, reused across calls (a call takes one).
    handles: Mutex<Vec<Handle>>,
    /// Cloned for a call when no idle handle is left.
    template: Mutex<Box<dyn Storage>>,
}

impl std::fmt::Debug for SozuReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SozuReader")
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

/// Idle handles a [`SozuReader`] keeps for reuse.
const IDLE_HANDLES: usize = 16;

/// A storage handle of a [`SozuReader`], with the state of its
/// announcements, kept as the writer's `PageStore` keeps it
/// (`docs/sozu-format.md`, "Batched reads").
struct Handle {
    st: Box<dyn Storage>,
    /// A page read through this handle since its last announced batch
    /// waited for the device (or the storage cannot tell): the next batch
    /// is announced. A new handle starts so.
    waited: bool,
}

impl Handle {
    /// Shard `shard`'s committed pages (`published`) as read through this
    /// handle.
    fn view<'a>(&'a mut self, shard: u8, page_size: usize, published: &'a Published) -> View<'a> {
        View {
            st: self.st.as_mut(),
            waited: &mut self.waited,
            shard,
            page_size,
            published,
        }
    }
}

/// One shard's committed pages as a reader sees them.
struct View<'a> {
    st: &'a mut dyn Storage,
    waited: &'a mut bool,
    shard: u8,
    page_size: usize,
    published: &'a Published,
}

impl PageView for View<'_> {
    fn check(&mut self, addr: Addr, sigs: &[u16], may: &mut Vec<bool>) -> Option<Descent> {
        if self.published.pages.read().contains_key(&addr) {
            return None;
        }
        self.published.summaries.read().check(addr, sigs, may)
    }
    /// A committed page: in memory, or from its file when no publication
    /// or eviction ran during the read (else read again).
    fn read(&mut self, addr: Addr) -> Result<Arc<Vec<u8>>, SozuError> {
        let mut tries = 0;
        loop {
            let before = self.published.epoch();
            if let Some(p) = self.published.page(&addr) {
                return Ok(p);
            }
            let r = read_existing_page_noting(
                self.st,
                self.shard,
                addr,
                self.page_size,
                Some(&mut *self.waited),
            );
            if before == self.published.epoch() || tries >= MAX_RETRIES {
                return r.map(Arc::new);
            }
            tries += 1;
        }
    }
    /// Announces the pages not in memory, unless every page this handle
    /// read since its last announced batch came from the OS's memory.
    fn prefetch(&mut self, addrs: &[Addr]) {
        if !std::mem::replace(self.waited, false) {
            return;
        }
        let ps = self.page_size as u64;
        let cold: Vec<Addr> = {
            let pages = self.published.pages.read();
            addrs
                .iter()
                .filter(|a| !pages.contains_key(a))
                .copied()
                .collect()
        };
        for addr in cold {
            let name = layer_file(self.shard, addr.0);
            self.st.prefetch(&name, addr.1.saturating_mul(ps), ps);
        }
    }
}

impl SozuReader {
    pub(super) fn new(geo: Geo, shards: Vec<Arc<Published>>, template: Box<dyn Storage>) -> Self {
        Self {
            geo,
            shards,
            handles: Mutex::new(Vec::new()),
            template: Mutex::new(template),
        }
    }

    fn with_handle<R>(
        &self,
        f: impl FnOnce(&mut Handle) -> Result<R, SozuError>,
    ) -> Result<R, SozuError> {
        let popped = self.handles.lock().pop();
        let mut h = match popped {
            Some(h) => h,
            None => {
                let t = self.template.lock();
                let st = t
                    .try_clone()
                    .map_err(|e| io_err(t.as_ref(), HEADER_FILE, e))?;
                Handle { st, waited: true }
            }
        };
        let r = f(&mut h);
        let mut idle = self.handles.lock();
        if idle.len() < IDLE_HANDLES {
            idle.push(h);
        }
        r
    }

    /// The entries of `keys` in shard `s` (`(index in the caller's batch,
    /// query)` pairs) into `out`.
    fn lookup_shard(
        &self,
        h: &mut Handle,
        s: u8,
        qs: &[(usize, Query)],
        out: &mut [Option<Entry>],
    ) -> Result<(), SozuError> {
        let published = &self.shards[s as usize];
        let queries: Vec<Query> = qs.iter().map(|(_, q)| *q).collect();
        let mut hits = vec![lookup::Hit::default(); queries.len()];
        let mut view = h.view(s, self.geo.page_size, published);
        lookup::descend(
            &self.geo,
            &queries,
            &mut view,
            &mut |qi, _, _, e| {
                hits[qi].add(e);
                Ok(())
            },
            None,
        )?;
        for ((i, q), hit) in qs.iter().zip(hits) {
            let Some(mut slot) = hit.finish() else {
                continue;
            };
            if let Some((ext, len)) = slot.external {
                slot.entry.coin.script_pubkey = records::read_script(
                    h.st.as_mut(),
                    (s, published),
                    None,
                    &q.key,
                    ext,
                    len as usize,
                )?;
            }
            out[*i] = Some(slot.entry);
        }
        Ok(())
    }

    fn lookup(&self, h: &mut Handle, keys: &[OutPoint]) -> Result<Vec<Option<Entry>>, SozuError> {
        let mut by_shard: Vec<Vec<(usize, Query)>> = vec![Vec::new(); self.shards.len()];
        for (i, k) in keys.iter().enumerate() {
            let key = outpoint_key(k);
            let h = self.geo.hash(&key);
            by_shard[self.geo.shard_of(h) as usize].push((
                i,
                Query {
                    key,
                    h,
                    min_height: 0,
                },
            ));
        }
        let mut out = vec![None; keys.len()];
        for (s, qs) in by_shard.iter().enumerate() {
            if !qs.is_empty() {
                self.lookup_shard(h, s as u8, qs, &mut out)?;
            }
        }
        Ok(out)
    }
}

impl UtxoReader for SozuReader {
    fn get_batch(&self, keys: &[OutPoint]) -> Result<Vec<Option<Entry>>, SozuError> {
        self.with_handle(|h| self.lookup(h, keys))
    }

    /// Layers, payload and bytes on disk from a walk over the committed
    /// pages (commits landing during the walk may be half counted); the
    /// counters are the writer's ([`super::UtxoTable::sozu_counters`]) and
    /// are 0 here.
    fn scan_stats(&self) -> Result<Option<SozuStats>, SozuError> {
        self.with_handle(|h| {
            let geo = &self.geo;
            let mut scan = LayerScan::default();
            for (s, published) in self.shards.iter().enumerate() {
                let mut view = h.view(s as u8, geo.page_size, published);
                walk(geo, geo.max_layer, &mut |a| {
                    let p = view.read(a)?;
                    scan.add(a, &p);
                    Ok(p)
                })?;
            }
            let states: Vec<_> = self.shards.iter().map(|p| *p.state.read()).collect();
            let files = file_bytes(h.st.as_mut(), geo, &states)?;
            Ok(Some(scan.finish(geo, files, SozuStats::default())))
        })
    }
}
