//! [`SozuStats`]: the table's counters and a scan of its layers.

use super::files::{ckpt_file, journal_file, HEADER_FILE};
use super::geo::{Addr, Geo};
use super::header::ShardState;
use super::page::{self, PAGE_HEADER_LEN};
use super::records::segment_file;
use super::storage::Storage;
use super::store::{io_err, layer_file};
use super::SozuError;

/// Counters of one layer, from [`super::SozuTable::stats`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LayerStats {
    /// Allocated buckets (pages).
    pub buckets: u64,
    /// Entries stored.
    pub entries: u64,
    /// Bytes of encoded entries / (buckets × page payload capacity).
    pub fill: f64,
}

/// Counters of one layer's share of the write path since open, from
/// [`super::SozuTable::counters`]: where a block's page work and file
/// reads fall, layer by layer (`docs/benchmarks-history.md`, Sozu round 14).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LayerFlow {
    /// Pages of this layer rewritten by blocks (each page once per block
    /// that changed it).
    pub rewrites: u64,
    /// Of those, pages with merges: records added to entries the page
    /// already held (spends, re-productions).
    pub merge_pages: u64,
    /// Entries spilled into this layer's pages from the layer above.
    pub spilled_entries: u64,
    /// Spills into this layer's pages (one per parent spill and child
    /// page it went to).
    pub spill_targets: u64,
    /// Page reads from this layer's files (lookups, writes, the stats
    /// scan).
    pub file_reads: u64,
}

/// Statistics of a [`super::SozuTable`] (the Sozu paper's quantities).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SozuStats {
    /// Per layer, from layer 0 down (computed by a full scan).
    pub layers: Vec<LayerStats>,
    /// Per layer, from layer 0 down to the deepest layer any counter
    /// reached: the write path's counts since open.
    pub flow: Vec<LayerFlow>,
    /// Bytes of the table's files on disk (pages, records, journals,
    /// checkpoint files, header).
    pub bytes_on_disk: u64,
    /// Of which the journals.
    pub journal_file_bytes: u64,
    /// Serialized size of the live payloads: for each entry 36-byte key +
    /// 8 value + 4 height + 1 coinbase + script + 8 per production + 40 per
    /// consumption.
    pub payload_bytes: u64,
    /// Pages read by the last `get_batch` + `write_block`.
    pub last_block_buckets_read: u64,
    /// Pages changed by the last block (journaled by its commit).
    pub last_block_buckets_written: u64,
    /// Pages read by lookups and writes since open (memory or files).
    pub buckets_read: u64,
    /// Pages changed since open, counted once per commit that changed them.
    pub buckets_written: u64,
    /// Page reads from the page files since open.
    pub disk_page_reads: u64,
    /// Time spent in those reads (read, checksum, validation, copy),
    /// nanoseconds of the threads that made them.
    pub disk_read_nanos: u64,
    /// Disk pages announced to the storage since open
    /// (`posix_fadvise(WILLNEED)`), so that reads overlap: those a batch of
    /// lookups is about to read from a disk layer, and the written children
    /// of the pages a write pass will spill (pages in memory are not
    /// announced, nor any batch after one whose reads all came from the
    /// OS's memory, until a read waits for the device again).
    pub disk_page_prefetches: u64,
    /// Page reads from the files that a spill into an existing child made
    /// since open (the child's purge hint and its bytes to append to).
    pub spill_file_reads: u64,
    /// Of [`SozuStats::spill_file_reads`], those whose child needed nothing
    /// else in that block: no record or insert of its own, purge hint not
    /// due, within its capacity after the spill. A spill that appended to
    /// the child without reading it would have spared them.
    pub spill_reads_avoidable: u64,
    /// Lookups that went below the pinned layers since open.
    pub deep_lookups: u64,
    /// Disk-layer pages those lookups read (memory or files): pages a page
    /// summary ruled out for a key are not counted.
    pub deep_lookup_pages: u64,
    /// Entries spilled to a lower layer since open.
    pub spills: u64,
    /// Child groups allocated since open.
    pub children_allocated: u64,
    /// Entries purged since open.
    pub purges: u64,
    /// Pages whose entries were all tested for a purge since open (their
    /// purge hint was due).
    pub purge_checks: u64,
    /// Out-of-line script records moved by compaction since open.
    pub records_moved: u64,
    /// Spends of entries below the pinned layers filed as spend markers
    /// in the last pinned layer since open (`docs/sozu-format.md`, "Spend
    /// markers").
    pub spend_markers: u64,
    /// Entries inserted where a spend marker of their key was, since open:
    /// the output produced again (a transaction of an abandoned branch
    /// re-mined) after its entry below was purged; the entry takes the
    /// marker's place and consumptions.
    pub markers_absorbed: u64,
    /// Commits since open.
    pub commits: u64,
    /// Checkpoints completed since open.
    pub checkpoints: u64,
    /// Of [`SozuStats::checkpoints`], those of the disk layers only, within
    /// a generation (`docs/sozu-format.md`, "Checkpoints of the disk
    /// layers").
    pub disk_only_checkpoints: u64,
    /// Bytes appended to the journals since open.
    pub journal_bytes: u64,
    /// Bytes the journal files hold now, as the writer knows them: the
    /// current generation's records and, until the checkpoint that ends it
    /// truncates its file, the previous generation's (a torn tail not yet
    /// cut is not counted).
    pub journal_live_bytes: u64,
    /// The current generation's journal bound as last measured, bytes
    /// ([`super::SozuConfig::checkpoint_bytes`], or 1/[`super::JOURNAL_SHARE`]
    /// of the table's other files if less, at least [`super::JOURNAL_FLOOR`]).
    pub journal_bound_bytes: u64,
    /// Page images handed to checkpoints since open (each written twice:
    /// double write, then its page file), and how many of them were of
    /// the pinned layers.
    pub checkpoint_pages: u64,
    /// Of [`SozuStats::checkpoint_pages`], the pinned layers' pages.
    pub checkpoint_pinned_pages: u64,
    /// CPU time of the threads that ran the checkpoints finished since
    /// open, in nanoseconds (Linux only; 0 elsewhere).
    pub checkpoint_cpu_nanos: u64,
    /// Bytes of page images the table holds in memory now, by their
    /// allocations (pinned layers, pages not yet checkpointed, cache, the
    /// running checkpoint's copies of images replaced since it started),
    /// plus its page summaries.
    pub memory_bytes: u64,
    /// Of [`SozuStats::memory_bytes`], the page summaries (outside
    /// `ram_mib`: about 3 bytes per entry below the pinned layers, plus a
    /// slot per bucket of those layers).
    pub summary_bytes: u64,
    /// The most bytes of page images held twice since open, as found
    /// after each commit: images a commit replaced while the checkpoint in
    /// flight still held the old ones (pinned and disk pages alike; it lets
    /// each go once it has written it into its checkpoint file).
    pub held_twice_peak_bytes: u64,
    /// Commits since open that waited for the running checkpoint because
    /// the committed disk pages not yet in their files and the images held
    /// twice had reached their share of `ram_mib`.
    pub checkpoint_waits: u64,
    /// Nanoseconds those commits spent waiting, since open.
    pub checkpoint_wait_nanos: u64,
    /// Nanoseconds commits spent appending their journal record and
    /// syncing it (the commit's one fsync), since open.
    pub journal_sync_nanos: u64,
}

/// Per-layer counts of a walk over the pages.
#[derive(Default)]
pub(super) struct LayerScan {
    layers: Vec<LayerStats>,
    bytes_by_layer: Vec<u64>,
    payload: u64,
}

impl LayerScan {
    pub(super) fn add(&mut self, (layer, _): Addr, p: &[u8]) {
        while self.layers.len() <= layer as usize {
            self.layers.push(LayerStats::default());
            self.bytes_by_layer.push(0);
        }
        let ls = &mut self.layers[layer as usize];
        ls.buckets += 1;
        self.bytes_by_layer[layer as usize] += page::payload_len(p) as u64;
        for (_, e) in page::entries(p) {
            ls.entries += 1;
            self.payload += (36 + 8 + 4 + 1 + e.script_len() + 8 * e.np() + 40 * e.nc()) as u64;
        }
    }

    /// The statistics: these layer counts, `files` = (bytes on disk,
    /// journal bytes), over `counters`.
    pub(super) fn finish(mut self, geo: &Geo, files: (u64, u64), counters: SozuStats) -> SozuStats {
        let cap = (geo.page_size - PAGE_HEADER_LEN) as f64;
        for (ls, bytes) in self.layers.iter_mut().zip(&self.bytes_by_layer) {
            if ls.buckets > 0 {
                ls.fill = *bytes as f64 / (ls.buckets as f64 * cap);
            }
        }
        SozuStats {
            layers: self.layers,
            bytes_on_disk: files.0,
            journal_file_bytes: files.1,
            payload_bytes: self.payload,
            ..counters
        }
    }
}

/// (Bytes the table's files occupy on disk, bytes of its journals), for
/// shards in the given states.
///
/// # Errors
/// I/O.
pub(super) fn file_bytes(
    st: &mut dyn Storage,
    geo: &Geo,
    states: &[ShardState],
) -> Result<(u64, u64), SozuError> {
    let mut names = vec![
        HEADER_FILE.to_string(),
        ckpt_file(0).to_string(),
        ckpt_file(1).to_string(),
    ];
    for (s, state) in states.iter().enumerate() {
        let s = s as u8;
        names.push(segment_file(s, state.records.current));
        if let Some((seg, _, _)) = state.records.compacting {
            names.push(segment_file(s, seg));
        }
        if let Some(seg) = state.records.delete {
            names.push(segment_file(s, seg));
        }
        for l in 0..=geo.max_layer {
            names.push(layer_file(s, l));
        }
    }
    let mut journal = 0;
    for name in [journal_file(0), journal_file(1)] {
        journal += st.allocated(name).map_err(|e| io_err(st, name, e))?;
    }
    let mut total = journal;
    for n in names {
        total += st.allocated(&n).map_err(|e| io_err(st, &n, e))?;
    }
    Ok((total, journal))
}
