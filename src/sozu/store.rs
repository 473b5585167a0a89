//! One shard's pages as the writer holds them, and the part it publishes
//! to concurrent readers (`docs/sozu-format.md`, "Memory" and "Concurrent
//! readers").
//!
//! Where the writer finds a page, first to last: `dirty` (edited since the
//! last commit), `committed` (its committed image in memory: every page of
//! the pinned top layers, and disk pages committed since their last
//! checkpoint), the recency cache of clean disk pages, the page file. An
//! edit copies the committed image on write (`Arc::make_mut`), so the
//! committed image stays whole for readers and for a checkpoint in flight.

use std::collections::BTreeMap;
use std::hash::BuildHasherDefault;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::RwLock;
use rustc_hash::{FxHashMap, FxHashSet, FxHasher};

use super::geo::{Addr, Descent, SignatureKey};
use super::header::MAX_LAYERS;
use super::ops::Pages;
use super::page::{self, edit_capacity};
use super::storage::Storage;
use super::summary::{PageSummary, Summaries};
use super::SozuError;

/// The file of layer `layer` of shard `shard`.
pub(super) fn layer_file(shard: u8, layer: u8) -> String {
    format!("s{shard}-layer-{layer:02}.pages")
}

pub(super) fn io_err(st: &dyn Storage, name: &str, source: std::io::Error) -> SozuError {
    SozuError::Io {
        path: st.path_of(name),
        source,
    }
}

pub(super) fn corrupt(path: PathBuf, offset: u64, reason: impl Into<String>) -> SozuError {
    SozuError::Corrupt {
        path,
        offset,
        reason: reason.into(),
    }
}

/// What a shard shares with its readers: committed page images in memory,
/// committed records not yet in their files, summaries of committed
/// pages, and an epoch that every publication and eviction bumps (a reader
/// whose file read straddles one reads again).
#[derive(Debug, Default)]
pub(super) struct Published {
    pub(super) pages: RwLock<FxHashMap<Addr, Arc<Vec<u8>>>>,
    pub(super) records: RwLock<BTreeMap<u64, Arc<Vec<u8>>>>,
    pub(super) summaries: RwLock<Summaries>,
    /// The shard's allocation and records state as of the last commit.
    pub(super) state: RwLock<super::header::ShardState>,
    epoch: AtomicU64,
}

impl Published {
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }
    pub(super) fn bump(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }
    pub(super) fn page(&self, addr: &Addr) -> Option<Arc<Vec<u8>>> {
        self.pages.read().get(addr).cloned()
    }
}

/// Bytes of memory a page image holds: its allocation, not its used bytes
/// (a page edited in memory keeps [`edit_capacity`] bytes whatever it
/// holds). Every account of this store (`memory`, `unflushed`,
/// `held_twice`, the cache's weight) counts pages by it, so `ram_mib`
/// bounds the memory the pages take, not their payload; so does the
/// checkpoint thread's count of the images it lets go.
pub(super) fn image_bytes(page: &Vec<u8>) -> u64 {
    page.capacity() as u64
}

/// Weighs a cached page by the memory it holds ([`image_bytes`]) and its
/// entry.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct PageWeighter;

impl quick_cache::Weighter<Addr, Arc<Vec<u8>>> for PageWeighter {
    fn weight(&self, _: &Addr, page: &Arc<Vec<u8>>) -> u64 {
        image_bytes(page) + 64
    }
}

type PageCache = quick_cache::unsync::Cache<
    Addr,
    Arc<Vec<u8>>,
    PageWeighter,
    BuildHasherDefault<FxHasher>,
    quick_cache::unsync::DefaultLifecycle<Addr, Arc<Vec<u8>>>,
>;

/// Reads page `addr` of shard `shard` from its file and checks it:
/// `None` when the page was never written (past the end, or a hole).
/// With `waited`, asks the OS's memory first ([`Storage::read_cached`]) and
/// sets it when the bytes were not there (or the storage cannot tell);
/// without, reads at once.
///
/// # Errors
/// [`SozuError::Corrupt`] for a written page that fails its checks, I/O.
fn read_page_file(
    st: &mut dyn Storage,
    shard: u8,
    (layer, page_no): Addr,
    page_size: usize,
    waited: Option<&mut bool>,
) -> Result<Option<Vec<u8>>, SozuError> {
    let name = layer_file(shard, layer);
    let offset = page_no.saturating_mul(page_size as u64);
    READ_BUF.with_borrow_mut(|buf| {
        buf.resize(page_size, 0);
        let cached = waited.is_some() && st.read_cached(&name, offset, buf);
        if !cached {
            if let Some(w) = waited {
                *w = true;
            }
            match st.read_at(&name, offset, buf) {
                Ok(()) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::NotFound
                    ) =>
                {
                    return Ok(None)
                }
                Err(e) => return Err(io_err(st, &name, e)),
            }
        }
        if buf.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        page::open_disk(buf, page_size)
            .map(Some)
            .map_err(|e| corrupt(st.path_of(&name), offset, e.to_string()))
    })
}

thread_local! {
    /// One page-size buffer per thread for [`read_page_file`] (the page's
    /// memory form is a copy of its used bytes, so the disk image need not
    /// be a fresh allocation per read).
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`read_page_file`] for a page that must exist.
pub(super) fn read_existing_page(
    st: &mut dyn Storage,
    shard: u8,
    addr: Addr,
    page_size: usize,
) -> Result<Vec<u8>, SozuError> {
    read_existing_page_noting(st, shard, addr, page_size, None)
}

/// [`read_existing_page`], asking the OS's memory first and setting
/// `waited` as [`read_page_file`] does (the reads of the writer and of a
/// concurrent reader's handle: each decides by its own whether to
/// announce).
pub(super) fn read_existing_page_noting(
    st: &mut dyn Storage,
    shard: u8,
    addr: Addr,
    page_size: usize,
    waited: Option<&mut bool>,
) -> Result<Vec<u8>, SozuError> {
    read_page_file(st, shard, addr, page_size, waited)?.ok_or_else(|| {
        corrupt(
            st.path_of(&layer_file(shard, addr.0)),
            addr.1.saturating_mul(page_size as u64),
            "page missing (file truncated, or a hole where a page was written)",
        )
    })
}

/// One shard's pages, as the writer holds them.
pub(super) struct PageStore {
    pub(super) shard: u8,
    pub(super) storage: Box<dyn Storage>,
    page_size: usize,
    ram_layers: u8,
    signature_key: SignatureKey,
    dirty: FxHashMap<Addr, Arc<Vec<u8>>>,
    committed: FxHashMap<Addr, Arc<Vec<u8>>>,
    cache: PageCache,
    pub(super) published: Arc<Published>,
    /// Pages committed in the current generation (the next checkpoint's).
    generation: FxHashSet<Addr>,
    /// Bytes of disk-layer pages held in `committed` (not checkpointed).
    unflushed: u64,
    /// Page reads from the files.
    pub(super) file_reads: u64,
    /// Of those, per layer.
    pub(super) file_reads_by_layer: [u64; MAX_LAYERS],
    /// Nanoseconds spent in them.
    pub(super) file_read_nanos: u64,
    /// Pages announced to the storage before a batch of reads
    /// ([`PageStore::prefetch`]).
    pub(super) prefetches: u64,
    /// A page read from the files since the last batch was announced
    /// waited for the device (or the storage cannot tell): the next batch
    /// is announced.
    waited: bool,
    /// Bytes of committed images a commit replaced while a checkpoint in
    /// flight still held them: held twice (the checkpoint's copy and the
    /// new one) until its thread lets them go, which the table learns from
    /// [`super::checkpoint::Job::released`]; reset when it finishes.
    held_twice: u64,
}

impl PageStore {
    /// A store over `committed` (the committed images recovery found, RAM
    /// layers loaded), whose pages of `generation` belong to the current
    /// generation.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        shard: u8,
        storage: Box<dyn Storage>,
        (page_size, ram_layers, signature_key): (usize, u8, SignatureKey),
        committed: FxHashMap<Addr, Arc<Vec<u8>>>,
        generation: FxHashSet<Addr>,
        published: Arc<Published>,
        cache_bytes: u64,
    ) -> Self {
        let est = (cache_bytes / page_size as u64).max(16) as usize;
        let unflushed = committed
            .iter()
            .filter(|(a, _)| a.0 >= ram_layers)
            .map(|(_, p)| image_bytes(p))
            .sum();
        *published.pages.write() = committed.clone();
        Self {
            shard,
            storage,
            page_size,
            ram_layers,
            signature_key,
            dirty: FxHashMap::default(),
            committed,
            cache: PageCache::with(
                est,
                cache_bytes.max(1),
                PageWeighter,
                BuildHasherDefault::default(),
                Default::default(),
            ),
            published,
            generation,
            unflushed,
            file_reads: 0,
            file_reads_by_layer: [0; MAX_LAYERS],
            file_read_nanos: 0,
            prefetches: 0,
            waited: true,
            held_twice: 0,
        }
    }

    /// Pages edited since the last commit.
    pub(super) fn dirty_count(&self) -> usize {
        self.dirty.len()
    }

    /// The current content of a page (uncommitted edits included).
    ///
    /// # Errors
    /// Storage failure; [`SozuError::Corrupt`] for a damaged or missing page.
    pub(super) fn page(&mut self, addr: Addr) -> Result<Arc<Vec<u8>>, SozuError> {
        if let Some(p) = self.dirty.get(&addr).or_else(|| self.committed.get(&addr)) {
            return Ok(p.clone());
        }
        if let Some(p) = self.cache.get(&addr) {
            return Ok(p.clone());
        }
        let p = Arc::new(self.read_file(addr)?);
        self.cache.insert(addr, p.clone());
        Ok(p)
    }

    /// The current content of a page if it is in memory (dirty, committed
    /// or cached); never reads a file.
    pub(super) fn in_memory(&self, addr: Addr) -> Option<Arc<Vec<u8>>> {
        self.dirty
            .get(&addr)
            .or_else(|| self.committed.get(&addr))
            .or_else(|| self.cache.peek(&addr))
            .cloned()
    }

    /// A committed page from its file; its summary is recorded if missing.
    fn read_file(&mut self, addr: Addr) -> Result<Vec<u8>, SozuError> {
        self.file_reads += 1;
        if let Some(n) = self.file_reads_by_layer.get_mut(addr.0 as usize) {
            *n += 1;
        }
        let start = std::time::Instant::now();
        let p = read_existing_page_noting(
            self.storage.as_mut(),
            self.shard,
            addr,
            self.page_size,
            Some(&mut self.waited),
        )?;
        if addr.0 >= self.ram_layers && !self.published.summaries.read().contains(addr) {
            let s = PageSummary::of(&p, &self.signature_key);
            self.published.summaries.write().set(addr, s);
        }
        self.file_read_nanos += start.elapsed().as_nanos() as u64;
        Ok(p)
    }

    /// Hints that the pages `addrs` are about to be read: those in no
    /// map or cache of this store are announced to the storage
    /// ([`Storage::prefetch`]), so their file reads overlap — unless every
    /// page read from the files since the last batch came from the OS's
    /// memory ([`Storage::read_cached`]): the page files are then cached,
    /// an announcement would only cost a system call per page, and none is
    /// made until a read waits for the device again (that read's batch
    /// goes unannounced; the next one is announced).
    pub(super) fn prefetch(&mut self, addrs: &[Addr]) {
        if !std::mem::replace(&mut self.waited, false) {
            return;
        }
        let ps = self.page_size as u64;
        for &addr in addrs {
            if !self.dirty.contains_key(&addr)
                && !self.committed.contains_key(&addr)
                && !self.cache.contains_key(&addr)
            {
                let name = layer_file(self.shard, addr.0);
                self.storage.prefetch(&name, addr.1.saturating_mul(ps), ps);
                self.prefetches += 1;
            }
        }
    }

    /// Signature check of a committed, unedited page (see
    /// [`Summaries::check`]); `None` for a dirty page or one without a
    /// summary.
    pub(super) fn check(&self, addr: Addr, sigs: &[u16], may: &mut Vec<bool>) -> Option<Descent> {
        if addr.0 < self.ram_layers || self.dirty.contains_key(&addr) {
            return None;
        }
        self.published.summaries.read().check(addr, sigs, may)
    }

    /// Makes this commit's edits the committed state and publishes them to
    /// readers (each shard's commit at once: records first, then every page
    /// under one lock, then the summaries).
    pub(super) fn publish(&mut self, records: Vec<(u64, Arc<Vec<u8>>)>) {
        let dirty: Vec<(Addr, Arc<Vec<u8>>)> = self.dirty.drain().collect();
        if !records.is_empty() {
            self.published.records.write().extend(records);
        }
        {
            let mut pages = self.published.pages.write();
            for (addr, p) in &dirty {
                pages.insert(*addr, p.clone());
            }
        }
        let summaries: Vec<(Addr, PageSummary)> = dirty
            .iter()
            .filter(|(a, _)| a.0 >= self.ram_layers)
            .map(|(a, p)| (*a, PageSummary::of(p, &self.signature_key)))
            .collect();
        {
            let mut s = self.published.summaries.write();
            for (addr, summary) in summaries {
                s.set(addr, summary);
            }
        }
        self.published.bump();
        for (addr, p) in dirty {
            if addr.0 >= self.ram_layers {
                self.unflushed += image_bytes(&p);
            }
            if let Some(old) = self.committed.insert(addr, p) {
                if addr.0 >= self.ram_layers {
                    self.unflushed -= image_bytes(&old);
                }
                // Still shared: a checkpoint in flight holds it (or a
                // reader, for the length of one lookup).
                if Arc::strong_count(&old) > 1 {
                    self.held_twice += image_bytes(&old);
                }
            }
            self.generation.insert(addr);
        }
    }

    /// Bytes of disk-layer pages committed and not checkpointed.
    pub(super) fn unflushed(&self) -> u64 {
        self.unflushed
    }

    /// Bytes of images a running checkpoint held when commits replaced
    /// them (some it may have let go since: `SozuTable::held_twice`).
    pub(super) fn held_twice(&self) -> u64 {
        self.held_twice
    }

    /// The pages committed in the current generation with their images,
    /// for a checkpoint; the next generation starts empty.
    pub(super) fn take_generation(&mut self) -> Vec<(Addr, Arc<Vec<u8>>)> {
        self.take_from(0)
    }

    /// The disk-layer pages committed since the last checkpoint with their
    /// images, for a checkpoint of the disk layers only; the pinned pages
    /// stay in the generation (the next checkpoint of a generation's end
    /// writes them).
    pub(super) fn take_disk_pages(&mut self) -> Vec<(Addr, Arc<Vec<u8>>)> {
        self.take_from(self.ram_layers)
    }

    /// The generation's pages of layers ≥ `layer`, taken out of it.
    fn take_from(&mut self, layer: u8) -> Vec<(Addr, Arc<Vec<u8>>)> {
        let mut out = Vec::new();
        self.generation.retain(|a| {
            if a.0 < layer {
                return true;
            }
            out.extend(self.committed.get(a).map(|p| (*a, p.clone())));
            false
        });
        out.sort_unstable_by_key(|(a, _)| *a);
        out
    }

    /// A checkpoint wrote and synced `images` into the page files: disk
    /// pages whose committed image is still the one it wrote leave memory
    /// for the cache (readers now find the same bytes in the file). The
    /// weak references keep the written images' allocations, so an image
    /// allocated since cannot share an address with one of them.
    pub(super) fn checkpointed(&mut self, images: &[(Addr, Weak<Vec<u8>>)]) {
        let gone: Vec<Addr> = images
            .iter()
            .filter(|(a, img)| {
                a.0 >= self.ram_layers
                    && self
                        .committed
                        .get(a)
                        .is_some_and(|c| std::ptr::eq(Arc::as_ptr(c), img.as_ptr()))
            })
            .map(|(a, _)| *a)
            .collect();
        {
            let mut pages = self.published.pages.write();
            for a in &gone {
                pages.remove(a);
            }
        }
        self.published.bump();
        self.held_twice = 0;
        for a in gone {
            if let Some(img) = self.committed.remove(&a) {
                self.unflushed -= image_bytes(&img);
                self.cache.insert(a, img);
            }
        }
    }

    /// Bytes of page images this store holds in memory (committed, dirty,
    /// cached, and the checkpoint's copies of images replaced since it
    /// started), by their allocations ([`image_bytes`]).
    pub(super) fn memory(&self) -> u64 {
        let sum =
            |m: &FxHashMap<Addr, Arc<Vec<u8>>>| m.values().map(|p| image_bytes(p)).sum::<u64>();
        sum(&self.committed) + sum(&self.dirty) + self.cache.weight() + self.held_twice
    }
}

impl Pages for PageStore {
    fn edit(&mut self, addr: Addr) -> Result<&mut Vec<u8>, SozuError> {
        if !self.dirty.contains_key(&addr) {
            let p = match self.committed.get(&addr) {
                Some(p) => p.clone(),
                None => match self.cache.remove(&addr) {
                    Some((_, p)) => p,
                    None => Arc::new(self.read_file(addr)?),
                },
            };
            self.dirty.insert(addr, p);
        }
        let want = edit_capacity(self.page_size);
        let p = self.dirty.get_mut(&addr).ok_or(SozuError::Poisoned)?;
        match Arc::get_mut(p) {
            // A page read from its file or taken from the cache holds its
            // used bytes exactly: room for the block's edits now, in one
            // allocation (the first insert would double it).
            Some(v) => {
                if v.capacity() < want {
                    v.reserve_exact(want - v.len());
                }
            }
            // Copy on write, with the same room.
            None => {
                let mut copy = Vec::with_capacity(want.max(p.len()));
                copy.extend_from_slice(p);
                *p = Arc::new(copy);
            }
        }
        Arc::get_mut(p).ok_or(SozuError::Poisoned)
    }
    fn create(&mut self, addr: Addr) -> Result<&mut Vec<u8>, SozuError> {
        self.cache.remove(&addr);
        self.dirty.insert(addr, Arc::new(page::new_page()));
        self.edit(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sozu::storage::MemStorage;

    fn store() -> PageStore {
        let key = SignatureKey::new(&siphasher::sip::SipHasher24::new_with_key(&[1; 16]));
        PageStore::new(
            0,
            Box::new(MemStorage::new()),
            (4096, 1, key),
            FxHashMap::default(),
            FxHashSet::default(),
            Arc::new(Published::default()),
            1 << 20,
        )
    }

    fn entry(i: u8) -> Vec<u8> {
        let mut e = vec![i; 36];
        e.extend_from_slice(&[0; 12]);
        e.extend_from_slice(&[0, 1, 0, 0, 0]);
        e.extend_from_slice(&[1, 0, 0, 0, 2, 0, 0, 0]);
        e
    }

    /// A page read from its file holds its used bytes; edited, it holds
    /// the edit allocation in one step (not twice its length after the
    /// first insert), and the accounts count allocations: `memory` the
    /// page's 5 KiB, `unflushed` the same once it is committed.
    #[test]
    fn an_edited_page_holds_its_edit_allocation_and_is_counted_so() {
        let mut s = store();
        let mut img = page::new_page();
        for i in 0..40 {
            page::append(&mut img, &entry(i)).unwrap();
        }
        let sealed = page::seal(&img, 4096).unwrap();
        s.storage.write_at(&layer_file(0, 1), 0, &sealed).unwrap();
        let read = s.page((1, 0)).unwrap();
        assert_eq!(read.len(), img.len());
        assert!(s.memory() < edit_capacity(4096) as u64, "{}", s.memory());
        drop(read);
        let before = s.memory();
        let p = s.edit((1, 0)).unwrap();
        page::append(p, &entry(41)).unwrap();
        assert_eq!(p.capacity(), edit_capacity(4096));
        s.publish(Vec::new());
        assert_eq!(s.memory(), edit_capacity(4096) as u64);
        assert!(s.memory() > before);
        assert_eq!(s.unflushed(), edit_capacity(4096) as u64);
    }

    /// An image a running checkpoint holds and a commit then replaces is
    /// counted (pinned or not) until the checkpoint finishes; an image no
    /// checkpoint holds is not.
    #[test]
    fn images_replaced_under_a_running_checkpoint_are_held_twice() {
        let mut s = store();
        for addr in [(0, 0), (1, 0), (1, 1)] {
            page::append(s.create(addr).unwrap(), &entry(addr.1 as u8)).unwrap();
        }
        s.publish(Vec::new());
        let job = s.take_generation();
        assert_eq!(job.len(), 3);
        assert_eq!(s.held_twice(), 0);
        for addr in [(0, 0), (1, 0)] {
            page::append(s.edit(addr).unwrap(), &entry(9)).unwrap();
        }
        s.publish(Vec::new());
        // Counted by allocation: an edited page holds 5 KiB (4 KiB pages),
        // whatever its used bytes.
        let one = job[0].1.capacity() as u64;
        assert_eq!(one, edit_capacity(4096) as u64);
        assert!(job[0].1.len() < 200);
        assert_eq!(s.held_twice(), 2 * one);
        // Edited again: the checkpoint's copy is counted once.
        page::append(s.edit((1, 0)).unwrap(), &entry(10)).unwrap();
        s.publish(Vec::new());
        assert_eq!(s.held_twice(), 2 * one);
        let names: Vec<_> = job.iter().map(|(a, p)| (*a, Arc::downgrade(p))).collect();
        s.checkpointed(&names);
        drop(job);
        assert_eq!(s.held_twice(), 0);
        // No checkpoint holds the images now.
        page::append(s.edit((1, 1)).unwrap(), &entry(11)).unwrap();
        s.publish(Vec::new());
        assert_eq!(s.held_twice(), 0);
    }
}
