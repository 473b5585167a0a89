//! [`SozuTable`]: the layered, journaled, on-disk Sozu table.
//!
//! See the module docs of [`crate::sozu`] for the design and
//! `docs/sozu-format.md` for the bytes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use bitcoin::OutPoint;
use rustc_hash::FxHashMap;
use siphasher::sip::SipHasher24;

use super::header::{
    encode_record, parse_record, CommitRecord, Extent, Header, HeaderError, PageImage, Parsed,
    ShardState, HEADER_LEN, MAX_LAYERS, MAX_SHARDS, RECORD_HEADER_LEN,
};
use super::page::{
    decode_bucket, encode_bucket, find_in_page, Bucket, ExternalScript, PageError, PageFind, Slot,
    MAX_GROWTH_BITS, PAGE_HEADER_LEN,
};
use super::storage::{FsStorage, Storage};
use super::types::{
    outpoint_key, BlockOracle, BlockWrite, Coin, CommitTag, Consumption, Entry, OutPointKey,
    Production, PURGE_DEPTH,
};
use super::{SozuError, UtxoReader, UtxoTable};

const HEADER_FILE: &str = "sozu.header";
const HEADER_TMP: &str = "sozu.header.tmp";
const JOURNAL_FILE: &str = "sozu.journal";
/// The checkpoint (double-write) file of `generation`: two files used in
/// turn, so a generation's file is never rewritten before the next
/// generation's header is durable (a table recovered from a checkpoint
/// interrupted before its home writes ended still needs it until then).
fn ckpt_file(generation: u64) -> &'static str {
    if generation.is_multiple_of(2) {
        "sozu.ckpt.0"
    } else {
        "sozu.ckpt.1"
    }
}
/// Page images per record of the checkpoint file (bounds the memory a
/// checkpoint's double write needs to ~4 MiB at a time).
const CKPT_PAGES_PER_RECORD: usize = 1024;

fn layer_file(shard: u8, layer: u8) -> String {
    format!("s{shard}-layer-{layer:02}.pages")
}

fn records_file(shard: u8) -> String {
    format!("s{shard}-records.dat")
}

/// Capacity and keep-ratio of one layer (seed 000, "Tuning the flow between
/// layers").
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerConfig {
    /// Bytes of encoded entries a bucket of this layer holds before it
    /// overflows (at most `page_size - 24`; larger values are clamped).
    pub capacity: usize,
    /// α: fraction of `capacity` kept in an overflowing bucket after the
    /// spill, in [0, 1).
    pub alpha: f64,
}

/// Configuration of a [`SozuTable`]. `page_size`, `layer0_bits`,
/// `growth_bits` and `shards` are fixed when the table is created and read
/// back from its header afterwards (the values given at a later open are
/// ignored); the others apply to each open.
#[derive(Clone, Debug, PartialEq)]
pub struct SozuConfig {
    /// Bucket (page) size in bytes, a power of two ≥ 512; 4096 by default.
    pub page_size: usize,
    /// log2 of the number of layer-0 buckets (default 12: 4,096 buckets, 16 MiB).
    pub layer0_bits: u8,
    /// g: layer i+1 has 2^g times the buckets of layer i, in 1..=[`MAX_GROWTH_BITS`]
    /// (default 1: two children per bucket, so the deepest layer in use,
    /// which is never full, is at most about half of all pages;
    /// `BENCHMARKS.md`, Sozu round 5, measured 1 against 2 and 3).
    pub growth_bits: u8,
    /// Per-layer capacity and α, from layer 0 down; the last item applies to
    /// every deeper layer. Default: 3,000 / 3,600 / 4,000 bytes with α 0.5 /
    /// 0.75 / 0.9 — room in the top layers for a block's new outputs, full
    /// pages below (α 0.9 rather than 0.85: 1.46× → 1.42× the live payload
    /// on disk at 4M UTXOs, same CPU per block; `BENCHMARKS.md`, Sozu
    /// round 5).
    pub layers: Vec<LayerConfig>,
    /// How many top layers are held in RAM (loaded at open, written only
    /// through the journal); default 1.
    pub ram_layers: u8,
    /// Scripts longer than this many bytes are stored out of line in the
    /// records file (default 100; at most 1,000).
    pub inline_script_max: usize,
    /// The journal is checkpointed into the page files at the first commit
    /// after it grows past this many bytes (default 64 MiB).
    pub checkpoint_bytes: u64,
    /// Whether open reads and verifies every page (default true; costs one
    /// sequential read of the table).
    pub verify_on_open: bool,
    /// Number of shards by hash prefix (power of two, ≤ 8; 1 = off).
    pub shards: u8,
    /// Decoded pages of disk layers kept in a read cache (default 4,096).
    pub cache_pages: usize,
    /// Spill policy (`docs/sozu-format.md`, "Spill policy"): true (default)
    /// sends an overflowing bucket's spill to as few children as possible,
    /// chosen by the seed's order; false follows seed 000 literally (the
    /// first entries in the seed's order, whatever child they go to).
    pub spill_fewest_children: bool,
}

impl Default for SozuConfig {
    fn default() -> Self {
        Self {
            page_size: 4096,
            layer0_bits: 12,
            growth_bits: 1,
            layers: vec![
                LayerConfig {
                    capacity: 3000,
                    alpha: 0.5,
                },
                LayerConfig {
                    capacity: 3600,
                    alpha: 0.75,
                },
                LayerConfig {
                    capacity: 4000,
                    alpha: 0.9,
                },
            ],
            ram_layers: 1,
            inline_script_max: 100,
            checkpoint_bytes: 64 << 20,
            verify_on_open: true,
            shards: 1,
            cache_pages: 4096,
            spill_fewest_children: true,
        }
    }
}

/// Counters of one layer, from [`SozuTable::stats`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LayerStats {
    /// Allocated buckets (pages).
    pub buckets: u64,
    /// Entries stored.
    pub entries: u64,
    /// Bytes of encoded entries / (buckets × page payload capacity).
    pub fill: f64,
}

/// Statistics of a [`SozuTable`] (seed 000's quantities; issue 2 item 10).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SozuStats {
    /// Per layer, from layer 0 down (computed by a full scan).
    pub layers: Vec<LayerStats>,
    /// Bytes of the table's files on disk (pages, records, journal, header).
    pub bytes_on_disk: u64,
    /// Of which the journal (bounded by `checkpoint_bytes` + one commit).
    pub journal_file_bytes: u64,
    /// Serialized size of the live payloads: for each entry 36-byte key +
    /// 8 value + 4 height + 1 coinbase + script + 8 per production + 40 per
    /// consumption.
    pub payload_bytes: u64,
    /// Buckets read (decoded) by the last `get_batch` + `write_block`.
    pub last_block_buckets_read: u64,
    /// Buckets rewritten by the last `write_block`.
    pub last_block_buckets_written: u64,
    /// Buckets read (decoded or borrowed) by reads and writes since open.
    pub buckets_read: u64,
    /// Buckets rewritten since open (each becomes one page image in the
    /// next commit).
    pub buckets_written: u64,
    /// Page reads from the disk layers (not RAM, not the journal overlay)
    /// since open.
    pub disk_page_reads: u64,
    /// Lookups that went below the RAM layers since open, and the disk
    /// pages they read (mean page reads per lookup below RAM = ratio).
    pub deep_lookups: u64,
    /// Disk-layer pages those lookups read (from the cache or the files):
    /// pages a page summary ruled out for a key are not counted.
    pub deep_lookup_pages: u64,
    /// Entries spilled to a lower layer since open.
    pub spills: u64,
    /// Child groups allocated since open.
    pub children_allocated: u64,
    /// Entries purged since open.
    pub purges: u64,
    /// Commits and checkpoints since open.
    pub commits: u64,
    /// Checkpoints since open.
    pub checkpoints: u64,
    /// Bytes appended to the journal since open.
    pub journal_bytes: u64,
}

type Addr = (u8, u64);

/// What a shard's commit encodes: journal page items, record extents, and
/// the new whole image of every dirty page (for the overlay).
type EncodedDirty = (Vec<PageImage>, Vec<Extent>, Images);

/// Whole page images by address.
type Images = Vec<(Addr, Arc<Vec<u8>>)>;

/// A shard's committed state that its files do not hold yet: the page
/// images and out-of-line script extents of the commits since the last
/// checkpoint (the journal's overlay). Shared with every [`SozuReader`]:
/// the writer adds to it only after a commit's fsync and clears it only
/// after a checkpoint has written and synced it into the files, so a reader
/// that misses a page here finds the same committed image in its file.
#[derive(Debug, Default)]
struct Overlay {
    pages: RwLock<FxHashMap<Addr, Arc<Vec<u8>>>>,
    records: RwLock<BTreeMap<u64, Vec<u8>>>,
}

impl Overlay {
    // A poisoned lock only means a panic elsewhere while it was held; the
    // maps are updated by whole commits and checkpoints, and stay consistent.
    fn pages(&self) -> RwLockReadGuard<'_, FxHashMap<Addr, Arc<Vec<u8>>>> {
        self.pages.read().unwrap_or_else(PoisonError::into_inner)
    }
    fn pages_mut(&self) -> RwLockWriteGuard<'_, FxHashMap<Addr, Arc<Vec<u8>>>> {
        self.pages.write().unwrap_or_else(PoisonError::into_inner)
    }
    fn records(&self) -> RwLockReadGuard<'_, BTreeMap<u64, Vec<u8>>> {
        self.records.read().unwrap_or_else(PoisonError::into_inner)
    }
    fn records_mut(&self) -> RwLockWriteGuard<'_, BTreeMap<u64, Vec<u8>>> {
        self.records.write().unwrap_or_else(PoisonError::into_inner)
    }
    /// The committed image of `addr`, if the overlay holds one.
    fn page(&self, addr: &Addr) -> Option<Arc<Vec<u8>>> {
        self.pages().get(addr).cloned()
    }
}

/// One shard: an independent layered table over a hash-prefix range.
struct Shard {
    id: u8,
    state: ShardState,
    /// Every page of the RAM layers, decoded.
    ram: FxHashMap<Addr, Bucket>,
    /// RAM pages changed since the last commit.
    dirty_ram: BTreeSet<Addr>,
    /// Disk-layer pages changed since the last commit.
    dirty: FxHashMap<Addr, Bucket>,
    /// Committed page images and records-file extents not yet
    /// checkpointed into the files, shared with [`SozuReader`]s.
    overlay: Arc<Overlay>,
    /// Records-file extents written since the last commit.
    rec_pending: BTreeMap<u64, Vec<u8>>,
    /// Read cache of decoded disk pages (committed content only).
    cache: FxHashMap<Addr, Bucket>,
    /// In-RAM summary of every disk page read or written since open (its
    /// latest content, committed or not): lookups skip pages whose key
    /// signatures rule their keys out.
    summaries: FxHashMap<Addr, PageSummary>,
}

/// The key of the 16-bit key signatures of the page summaries: two words
/// drawn from the table's secret SipHash key, so nobody can choose
/// outpoints whose signatures collide.
///
/// The signatures were the txid's first two bytes xor the vout: unkeyed.
/// Outputs whose txids share those 16 bits (trivial to grind) defeated the
/// summaries, and a lookup read every page on its descent: 1.575 pages per
/// cold lookup instead of 1.000 at 1M entries (`benches/hash_flood.rs`,
/// BENCHMARKS.md "Hash flooding"). Summaries live in RAM only, so the key
/// changes no byte on disk.
#[derive(Clone, Copy, Debug)]
struct SignatureKey {
    k0: u64,
    /// Odd, for the multiply-shift step.
    k1: u64,
}

impl SignatureKey {
    fn new(hasher: &SipHasher24) -> Self {
        Self {
            k0: hasher.hash(b"kakehi sozu page signature k0"),
            k1: hasher.hash(b"kakehi sozu page signature k1") | 1,
        }
    }

    /// 16-bit key signature of an outpoint (as in Lokad's implementation of
    /// the Sozu table): keyed multiply-shift hashing of 8 bytes of the txid
    /// mixed with the vout. Forcing two signatures to collide needs the key,
    /// or two txids equal in those 8 bytes (2^32 work for one pair, 2^64 to
    /// hit a given txid); a collision costs one page read, never a wrong
    /// answer.
    fn signature(&self, outpoint: &OutPoint) -> u16 {
        use bitcoin::hashes::Hash as _;
        let t = outpoint.txid.as_byte_array();
        let word = u64::from_le_bytes([t[8], t[9], t[10], t[11], t[12], t[13], t[14], t[15]]);
        let vout = u64::from(outpoint.vout).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        ((word ^ vout ^ self.k0).wrapping_mul(self.k1) >> 48) as u16
    }
}

/// A page header's descent fields: where below it a key it does not hold
/// may be ([`Geo::child_of`]).
#[derive(Clone, Copy)]
struct Descent {
    max_child_height: u32,
    children: u64,
    child_mask: u16,
}

impl Descent {
    fn of(b: &Bucket) -> Self {
        Self {
            max_child_height: b.max_child_height,
            children: b.children,
            child_mask: b.child_mask,
        }
    }
}

/// What a lookup needs of a disk-layer page without reading it: its
/// descent fields and its entries' sorted key signatures (~2 bytes per
/// entry plus ~100 per page in RAM, hash-map slot included).
struct PageSummary {
    descent: Descent,
    signatures: Box<[u16]>,
}

impl PageSummary {
    fn of(b: &Bucket, key: &SignatureKey) -> Self {
        let mut signatures: Box<[u16]> = b
            .slots
            .iter()
            .map(|s| key.signature(&s.entry.outpoint))
            .collect();
        signatures.sort_unstable();
        Self {
            descent: Descent::of(b),
            signatures,
        }
    }
    /// Whether the page may hold a key of signature `sig`.
    fn may_hold(&self, sig: u16) -> bool {
        self.signatures.binary_search(&sig).is_ok()
    }
}

/// A shard with its own storage handle and counters, so shards can work
/// on separate threads.
struct Worker {
    shard: Shard,
    storage: Box<dyn Storage>,
    counters: Counters,
}

/// Geometry shared by all shards.
#[derive(Clone)]
struct Geo {
    page_size: usize,
    b0: u32,
    g: u32,
    shard_bits: u32,
    max_layer: u8,
    ram_layers: u8,
    layers: Vec<LayerConfig>,
    inline_script_max: usize,
    cache_pages: usize,
    spill_fewest_children: bool,
    hasher: SipHasher24,
    signature_key: SignatureKey,
}

impl Geo {
    fn hash(&self, key: &OutPointKey) -> u64 {
        self.hasher.hash(key)
    }
    fn shard_of(&self, h: u64) -> u8 {
        if self.shard_bits == 0 {
            0
        } else {
            (h >> (64 - self.shard_bits)) as u8
        }
    }
    fn layer0_pages(&self) -> u64 {
        1u64 << (self.b0 - self.shard_bits)
    }
    fn layer0_page(&self, h: u64) -> u64 {
        (h >> (64 - self.b0)) & (self.layer0_pages() - 1)
    }
    /// Index of the child (within its group) covering `h` at `layer` ≥ 1.
    fn child_index(&self, h: u64, layer: u8) -> u64 {
        let bits = self.b0 + u32::from(layer) * self.g;
        (h >> (64 - bits)) & ((1u64 << self.g) - 1)
    }
    /// Bit of the child covering `h` at `layer` ≥ 1 in its parent's
    /// written-children mask.
    fn child_bit(&self, h: u64, layer: u8) -> u16 {
        1u16 << self.child_index(h, layer)
    }
    /// Page of the child covering `h`; saturating, so a damaged `children`
    /// field reads past the file and is reported as corruption.
    fn child_page(&self, children: u64, h: u64, layer: u8) -> u64 {
        children
            .saturating_sub(1)
            .saturating_mul(1 << self.g)
            .saturating_add(self.child_index(h, layer))
    }
    /// The page one layer down where a key of hash `h` that a page (at
    /// `layer`, descent fields `d`) does not hold may be: the child
    /// covering `h`, if written and if entries produced at `min_height` or
    /// later ever went below (seed 000's `ReadSozu` early stop; 0: no floor).
    fn child_of(&self, d: Descent, h: u64, layer: u8, min_height: u32) -> Option<u64> {
        (layer < self.max_layer
            && d.children != 0
            && d.child_mask & self.child_bit(h, layer + 1) != 0
            && d.max_child_height >= min_height)
            .then(|| self.child_page(d.children, h, layer + 1))
    }
    fn layer_cfg(&self, layer: u8) -> LayerConfig {
        let c = self
            .layers
            .get(layer as usize)
            .or(self.layers.last())
            .copied();
        let c = c.unwrap_or(LayerConfig {
            capacity: self.page_size,
            alpha: 0.5,
        });
        LayerConfig {
            capacity: c.capacity.min(self.page_size - PAGE_HEADER_LEN),
            alpha: c.alpha,
        }
    }
}

/// A merge into an existing entry: key, coin to check (for a production),
/// records to add.
type Merge = (OutPointKey, Option<Coin>, Vec<Production>, Vec<Consumption>);

/// Per-bucket work of one `write_block`, gathered before the bucket is rewritten.
#[derive(Default)]
struct Work {
    inserts: Vec<Slot>,
    merges: Vec<Merge>,
    raise: u32,
}

/// What a key's lookup found.
struct Found {
    layer: u8,
    page: u64,
    /// Pages visited above `layer` (index = layer).
    path: Vec<u64>,
    /// The entry's slot, for callers that asked for it.
    slot: Option<Slot>,
}

/// Operation on one key in a block.
struct KeyOp {
    key: OutPointKey,
    outpoint: OutPoint,
    h: u64,
    create: Option<(Coin, bool)>,
    consumed: Vec<Consumption>,
}

#[derive(Default)]
struct Counters {
    buckets_read: u64,
    buckets_written: u64,
    disk_page_reads: u64,
    deep_lookups: u64,
    deep_lookup_pages: u64,
    spills: u64,
    children_allocated: u64,
    purges: u64,
}

/// The Sozu table (seed 000): layered buckets of one page, lazily allocated
/// children, keyed-SipHash bucket index, a redo journal for block-boundary
/// durability. Implements [`UtxoTable`].
pub struct SozuTable {
    storage: Box<dyn Storage>,
    geo: Geo,
    shards: Vec<Worker>,
    /// Header as of the last commit.
    committed: Header,
    journal_pos: u64,
    journal_truncate: bool,
    checkpoint_bytes: u64,
    /// Set after a failed commit or checkpoint: the table must be reopened.
    poisoned: bool,
    block_counters: (u64, u64),
    commits: u64,
    checkpoints: u64,
    journal_bytes: u64,
    /// The handle [`UtxoTable::reader`] hands out.
    reader: Arc<SozuReader>,
    /// The buffer every journal and checkpoint record is encoded into.
    record_buf: Vec<u8>,
}

impl std::fmt::Debug for SozuTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SozuTable")
            .field("committed", &self.committed.tag)
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

fn io_err(storage: &dyn Storage, name: &str, source: std::io::Error) -> SozuError {
    SozuError::Io {
        path: storage.path_of(name),
        source,
    }
}

fn corrupt(path: PathBuf, offset: u64, reason: impl Into<String>) -> SozuError {
    SozuError::Corrupt {
        path,
        offset,
        reason: reason.into(),
    }
}

impl SozuTable {
    /// Opens the table in `dir`, creating it (with a fresh random SipHash
    /// key) if the directory holds none. Replays the journal's committed
    /// records; a torn last record (a crash during a commit) is ignored and
    /// overwritten by the next commit. Nothing is written by opening an
    /// existing table.
    ///
    /// # Errors
    /// [`SozuError::Corrupt`] (file and byte offset) on any checksum, magic
    /// or structure failure, [`SozuError::UnsupportedVersion`],
    /// [`SozuError::Config`] for an invalid new configuration,
    /// [`SozuError::Io`].
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
        let st = storage.as_mut();
        let has_header = st
            .exists(HEADER_FILE)
            .map_err(|e| io_err(st, HEADER_FILE, e))?;
        if !has_header {
            let jlen = st
                .len(JOURNAL_FILE)
                .map_err(|e| io_err(st, JOURNAL_FILE, e))?;
            let deeper = st
                .exists(&layer_file(0, 1))
                .map_err(|e| io_err(st, HEADER_FILE, e))?;
            if jlen > 0 || deeper {
                return Err(corrupt(
                    st.path_of(HEADER_FILE),
                    0,
                    "header file missing but table files exist",
                ));
            }
            Self::create(st, &config)?;
        }
        let mut hbuf = vec![0u8; HEADER_LEN];
        let hlen = st
            .len(HEADER_FILE)
            .map_err(|e| io_err(st, HEADER_FILE, e))?;
        if hlen != HEADER_LEN as u64 {
            return Err(corrupt(
                st.path_of(HEADER_FILE),
                hlen,
                format!("header is {hlen} bytes, expected {HEADER_LEN}"),
            ));
        }
        st.read_at(HEADER_FILE, 0, &mut hbuf)
            .map_err(|e| io_err(st, HEADER_FILE, e))?;
        let mut header = decode_header(st, HEADER_FILE, 0, &hbuf)?;
        let file_header = header.clone();

        // Replay the journal.
        let jlen = st
            .len(JOURNAL_FILE)
            .map_err(|e| io_err(st, JOURNAL_FILE, e))?;
        if !st
            .exists(JOURNAL_FILE)
            .map_err(|e| io_err(st, JOURNAL_FILE, e))?
        {
            return Err(corrupt(st.path_of(JOURNAL_FILE), 0, "journal file missing"));
        }
        let jlen_usize = usize::try_from(jlen)
            .map_err(|_| corrupt(st.path_of(JOURNAL_FILE), 0, "journal too large"))?;
        let mut journal = vec![0u8; jlen_usize];
        st.read_at(JOURNAL_FILE, 0, &mut journal)
            .map_err(|e| io_err(st, JOURNAL_FILE, e))?;
        let page_size = header.page_size as usize;
        let mut pos = 0usize;
        let mut valid_end = 0usize;
        let mut stale = false;
        let mut records = Vec::new();
        let mut expect_seq = header.commit_seq + 1;
        loop {
            match parse_record(&journal[pos..], page_size) {
                Parsed::Ok(rec, len) => {
                    if rec.generation < file_header.generation {
                        stale = true;
                    } else if rec.generation == file_header.generation && rec.seq == expect_seq {
                        expect_seq += 1;
                        let h = decode_header(
                            st,
                            JOURNAL_FILE,
                            (pos + len - 4 - HEADER_LEN) as u64,
                            &rec.header,
                        )?;
                        if h.page_size != header.page_size
                            || h.layer0_bits != header.layer0_bits
                            || h.growth_bits != header.growth_bits
                            || h.shards != header.shards
                            || h.key != header.key
                            || h.commit_seq != rec.seq
                        {
                            return Err(corrupt(
                                st.path_of(JOURNAL_FILE),
                                pos as u64,
                                "commit record header disagrees with the table header",
                            ));
                        }
                        header = h;
                        records.push(rec);
                        valid_end = pos + len;
                    } else {
                        return Err(corrupt(
                            st.path_of(JOURNAL_FILE),
                            pos as u64,
                            format!("commit record generation {} seq {} where generation {} seq {} was expected", rec.generation, rec.seq, file_header.generation, expect_seq),
                        ));
                    }
                    pos += len;
                }
                Parsed::Invalid => {
                    // A torn tail is expected after a crash; a valid
                    // current-generation record after it means corruption.
                    if pos < journal.len() {
                        for probe in (pos + 1)..journal.len().saturating_sub(RECORD_HEADER_LEN) {
                            if journal[probe..probe + 4] == super::header::RECORD_MAGIC {
                                if let Parsed::Ok(r, _) = parse_record(&journal[probe..], page_size)
                                {
                                    if r.generation == file_header.generation && r.seq >= expect_seq
                                    {
                                        return Err(corrupt(
                                            st.path_of(JOURNAL_FILE),
                                            pos as u64,
                                            "damaged commit record followed by later commits",
                                        ));
                                    }
                                }
                            }
                        }
                    }
                    break;
                }
            }
        }
        let journal_truncate = stale || valid_end as u64 != jlen;
        let journal_pos = if stale && records.is_empty() {
            0
        } else {
            valid_end as u64
        };
        let journal_pos = if stale && !records.is_empty() {
            // Stale records precede current ones only if a truncation was lost;
            // keep appending after the current ones.
            valid_end as u64
        } else {
            journal_pos
        };

        let shard_bits = u32::from(header.shards).trailing_zeros();
        let b0 = u32::from(header.layer0_bits);
        let g = u32::from(header.growth_bits);
        let max_layer = ((64 - b0) / g).min(MAX_LAYERS as u32 - 1) as u8;
        if config.inline_script_max > 1000 || config.layers.is_empty() {
            return Err(SozuError::Config {
                reason: "inline_script_max over 1000 or no layer config",
            });
        }
        if config
            .layers
            .iter()
            .any(|l| !(0.0..1.0).contains(&l.alpha) || l.capacity < 256)
        {
            return Err(SozuError::Config {
                reason: "layer alpha must be in [0,1), capacity ≥ 256 bytes",
            });
        }
        let geo = Geo {
            page_size,
            b0,
            g,
            shard_bits,
            max_layer,
            ram_layers: config.ram_layers,
            layers: config.layers.clone(),
            inline_script_max: config.inline_script_max,
            cache_pages: config.cache_pages,
            spill_fewest_children: config.spill_fewest_children,
            hasher: SipHasher24::new_with_key(&header.key),
            signature_key: SignatureKey::new(&SipHasher24::new_with_key(&header.key)),
        };
        let mut shards: Vec<Shard> = (0..header.shards)
            .map(|id| Shard {
                id,
                state: header.shard_state[id as usize],
                ram: FxHashMap::default(),
                dirty_ram: BTreeSet::new(),
                dirty: FxHashMap::default(),
                overlay: Arc::default(),
                rec_pending: BTreeMap::new(),
                cache: FxHashMap::default(),
                summaries: FxHashMap::default(),
            })
            .collect();
        // A checkpoint interrupted after its header switch: its double
        // write holds the images the page files may lack; then the
        // journal's records of this generation on top.
        let ckpt = read_checkpoint_file(st, &file_header, page_size)?;
        for rec in ckpt.into_iter().chain(records) {
            for p in rec.pages {
                let shard = shards.get_mut(p.shard as usize).ok_or_else(|| {
                    corrupt(
                        st.path_of(JOURNAL_FILE),
                        0,
                        "page image names a shard that does not exist",
                    )
                })?;
                let addr = (p.layer, p.page);
                let image = if p.delta {
                    let base = match shard.overlay.page(&addr) {
                        Some(img) => img,
                        None => Arc::new(home_image(st, p.shard, addr, page_size)?.ok_or_else(
                            || {
                                corrupt(
                                    st.path_of(JOURNAL_FILE),
                                    0,
                                    format!(
                                        "page delta of layer {} page {} without a base page",
                                        p.layer, p.page
                                    ),
                                )
                            },
                        )?),
                    };
                    Arc::new(
                        super::page::apply_page_delta(&base, &p.image, page_size).map_err(|e| {
                            corrupt(
                                st.path_of(JOURNAL_FILE),
                                0,
                                format!("page delta of layer {} page {}: {e}", p.layer, p.page),
                            )
                        })?,
                    )
                } else {
                    p.image
                };
                shard.overlay.pages_mut().insert(addr, image);
            }
            for e in rec.extents {
                let shard = shards.get_mut(e.shard as usize).ok_or_else(|| {
                    corrupt(
                        st.path_of(JOURNAL_FILE),
                        0,
                        "extent names a shard that does not exist",
                    )
                })?;
                shard.overlay.records_mut().insert(e.offset, e.data);
            }
        }
        // Load the RAM layers, verify the rest if asked (a page that is
        // missing or truncated is otherwise reported when first read).
        let deepest = if config.verify_on_open {
            geo.max_layer
        } else {
            geo.ram_layers.saturating_sub(1)
        };
        // The verified disk pages' summaries come for free.
        for shard in &mut shards {
            let mut ram = FxHashMap::default();
            let mut summaries = FxHashMap::default();
            let sh: &Shard = shard;
            walk_shard(
                &geo,
                deepest,
                &mut (&mut *st, &mut ram, &mut summaries),
                |(st, _, _), addr| read_committed(&mut **st, &geo, (sh.id, &sh.overlay), addr),
                |(_, ram, summaries), addr, b| {
                    if addr.0 < geo.ram_layers {
                        ram.insert(addr, b);
                    } else {
                        summaries.insert(addr, PageSummary::of(&b, &geo.signature_key));
                    }
                    Ok(())
                },
            )?;
            shard.ram = ram;
            shard.summaries = summaries;
            let records = shard.overlay.records();
            for (off, data) in records.iter() {
                if off + data.len() as u64 > shard.state.records_len {
                    return Err(corrupt(
                        st.path_of(JOURNAL_FILE),
                        0,
                        "records extent beyond records length",
                    ));
                }
            }
            let name = records_file(shard.id);
            let rlen = st.len(&name).map_err(|e| io_err(st, &name, e))?;
            let covered = records
                .iter()
                .map(|(o, d)| o + d.len() as u64)
                .max()
                .unwrap_or(0);
            drop(records);
            if rlen < shard.state.records_len && covered < shard.state.records_len {
                return Err(corrupt(
                    st.path_of(&name),
                    rlen,
                    format!(
                        "records file truncated (expected {} bytes)",
                        shard.state.records_len
                    ),
                ));
            }
        }
        let reader = Arc::new(SozuReader {
            geo: geo.clone(),
            overlays: shards.iter().map(|s| s.overlay.clone()).collect(),
            handles: Mutex::new(Vec::new()),
            template: Mutex::new(st.try_clone().map_err(|e| io_err(st, HEADER_FILE, e))?),
        });
        let mut workers = Vec::with_capacity(shards.len());
        for shard in shards {
            let handle = st.try_clone().map_err(|e| io_err(st, HEADER_FILE, e))?;
            workers.push(Worker {
                shard,
                storage: handle,
                counters: Counters::default(),
            });
        }
        Ok(Self {
            storage,
            geo,
            shards: workers,
            committed: header,
            journal_pos,
            journal_truncate,
            checkpoint_bytes: config.checkpoint_bytes,
            poisoned: false,
            block_counters: (0, 0),
            commits: 0,
            checkpoints: 0,
            journal_bytes: 0,
            reader,
            record_buf: Vec::new(),
        })
    }

    fn create(st: &mut dyn Storage, config: &SozuConfig) -> Result<(), SozuError> {
        let ps = config.page_size;
        if !ps.is_power_of_two() || !(512..=1 << 20).contains(&ps) {
            return Err(SozuError::Config {
                reason: "page_size must be a power of two in 512..=1 MiB",
            });
        }
        if !(1..=32).contains(&config.layer0_bits)
            || !(1..=MAX_GROWTH_BITS).contains(&config.growth_bits)
        {
            return Err(SozuError::Config {
                reason: "layer0_bits in 1..=32, growth_bits in 1..=4",
            });
        }
        let s = config.shards;
        if s == 0
            || s as usize > MAX_SHARDS
            || !s.is_power_of_two()
            || s.trailing_zeros() > u32::from(config.layer0_bits)
        {
            return Err(SozuError::Config {
                reason: "shards must be a power of two ≤ 8 and ≤ layer-0 buckets",
            });
        }
        let mut key = [0u8; 16];
        getrandom::getrandom(&mut key).map_err(|e| SozuError::Io {
            path: st.path_of(HEADER_FILE),
            source: std::io::Error::other(e),
        })?;
        let header = Header {
            page_size: ps as u32,
            layer0_bits: config.layer0_bits,
            growth_bits: config.growth_bits,
            shards: s,
            key,
            generation: 1,
            commit_seq: 0,
            tag: None,
            shard_state: vec![ShardState::default(); s as usize],
        };
        let empty = encode_bucket(&Bucket::default(), ps).map_err(|_| SozuError::Config {
            reason: "page too small",
        })?;
        let pages = 1u64 << (u32::from(config.layer0_bits) - s.trailing_zeros());
        for shard in 0..s {
            let name = layer_file(shard, 0);
            let mut buf = Vec::with_capacity(ps * 64);
            for p in 0..pages {
                buf.extend_from_slice(&empty);
                if buf.len() >= ps * 64 || p + 1 == pages {
                    let off = (p + 1) * ps as u64 - buf.len() as u64;
                    st.write_at(&name, off, &buf)
                        .map_err(|e| io_err(st, &name, e))?;
                    buf.clear();
                }
            }
            st.sync(&name).map_err(|e| io_err(st, &name, e))?;
            let rname = records_file(shard);
            st.set_len(&rname, 0).map_err(|e| io_err(st, &rname, e))?;
            st.sync(&rname).map_err(|e| io_err(st, &rname, e))?;
        }
        st.set_len(JOURNAL_FILE, 0)
            .map_err(|e| io_err(st, JOURNAL_FILE, e))?;
        st.sync(JOURNAL_FILE)
            .map_err(|e| io_err(st, JOURNAL_FILE, e))?;
        write_header_file(st, &header)
    }

    /// Counters and a full scan of the layers.
    ///
    /// # Errors
    /// Storage failure or corruption during the scan.
    pub fn stats(&mut self) -> Result<SozuStats, SozuError> {
        let geo = self.geo.clone();
        let mut scan = LayerScan::default();
        for w in &mut self.shards {
            walk_shard(
                &geo,
                geo.max_layer,
                w,
                |w, addr| w.get_bucket(&geo, addr, false),
                |_, addr, b| {
                    scan.add(addr, &b);
                    Ok(())
                },
            )?;
        }
        let files = file_bytes(self.storage.as_mut(), &geo, self.shards.len() as u8)?;
        Ok(scan.finish(&geo, files, self.counters()))
    }

    /// The counters of [`SozuTable::stats`] without the scan: `layers` is
    /// empty and `bytes_on_disk`, `journal_file_bytes`, `payload_bytes` are 0.
    pub fn counters(&self) -> SozuStats {
        let mut c = Counters::default();
        for w in &self.shards {
            let x = &w.counters;
            c.disk_page_reads += x.disk_page_reads;
            c.deep_lookups += x.deep_lookups;
            c.deep_lookup_pages += x.deep_lookup_pages;
            c.spills += x.spills;
            c.children_allocated += x.children_allocated;
            c.purges += x.purges;
        }
        SozuStats {
            layers: Vec::new(),
            bytes_on_disk: 0,
            journal_file_bytes: 0,
            payload_bytes: 0,
            last_block_buckets_read: self.block_counters.0,
            last_block_buckets_written: self.block_counters.1,
            buckets_read: self.buckets_read(),
            buckets_written: self.buckets_written(),
            disk_page_reads: c.disk_page_reads,
            deep_lookups: c.deep_lookups,
            deep_lookup_pages: c.deep_lookup_pages,
            spills: c.spills,
            children_allocated: c.children_allocated,
            purges: c.purges,
            commits: self.commits,
            checkpoints: self.checkpoints,
            journal_bytes: self.journal_bytes,
        }
    }

    /// Reads every page and out-of-line script and checks its checksum and
    /// structure (what `verify_on_open` does at open, on demand).
    ///
    /// # Errors
    /// [`SozuError::Corrupt`] for the first bad page or record.
    pub fn verify(&mut self) -> Result<u64, SozuError> {
        let mut n = 0u64;
        self.for_each(&mut |_| n += 1)?;
        Ok(n)
    }

    /// Checkpoints now (`docs/sozu-format.md`, "Checkpoint") rather than at
    /// the first commit after the journal grows past
    /// [`SozuConfig::checkpoint_bytes`]: the journal's page images move into
    /// the page files and the journal starts again empty. The committed
    /// state is the same before and after; a block written and not yet
    /// committed stays pending. Costs what a commit's checkpoint costs: the
    /// overlay written twice (up to `checkpoint_bytes` of images) and their
    /// fsyncs. For a backup of the page files, or to keep a checkpoint out
    /// of a measured window (`benches/sozu.rs`).
    ///
    /// # Errors
    /// Storage failure; the table is then poisoned and must be reopened.
    pub fn checkpoint_now(&mut self) -> Result<(), SozuError> {
        self.check_poison()?;
        let r = self.checkpoint();
        if r.is_err() {
            self.poisoned = true;
        }
        r
    }

    /// Like [`UtxoTable::get_batch`], with seed 000's height filter: for each
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
        let mut out: Vec<Option<Entry>> = vec![None; keys.len()];
        let mut by_shard: Vec<Vec<(usize, OutPointKey, u64, u32)>> =
            vec![Vec::new(); self.shards.len()];
        for (i, (op, min_h)) in keys.iter().enumerate() {
            let key = outpoint_key(op);
            let h = self.geo.hash(&key);
            by_shard[self.geo.shard_of(h) as usize].push((i, key, h, *min_h));
        }
        let read_before = self.buckets_read();
        let geo = &self.geo;
        let results = run_per_shard(&mut self.shards, by_shard, |w, qs| {
            let q: Vec<(OutPointKey, u64, u32)> =
                qs.iter().map(|(_, k, h, m)| (*k, *h, *m)).collect();
            let found = w.locate(geo, &q, true)?;
            let mut got = Vec::new();
            for ((i, _, _, _), f) in qs.into_iter().zip(found) {
                if let Some(f) = f {
                    if let Some(slot) = f.slot {
                        got.push((i, w.resolve(slot)?));
                    }
                }
            }
            Ok(got)
        })?;
        for (i, e) in results.into_iter().flatten() {
            out[i] = Some(e);
        }
        self.block_counters = (self.buckets_read() - read_before, 0);
        Ok(out)
    }

    fn buckets_read(&self) -> u64 {
        self.shards.iter().map(|w| w.counters.buckets_read).sum()
    }

    fn buckets_written(&self) -> u64 {
        self.shards.iter().map(|w| w.counters.buckets_written).sum()
    }

    fn check_poison(&self) -> Result<(), SozuError> {
        if self.poisoned {
            Err(SozuError::Poisoned)
        } else {
            Ok(())
        }
    }

    /// Moves the overlay into the page files and starts a new generation
    /// (`docs/sozu-format.md`, "Checkpoint"): a double write, so the page
    /// files are consistent at every generation start and journal deltas
    /// can apply to them.
    fn checkpoint(&mut self) -> Result<(), SozuError> {
        let ps = self.geo.page_size;
        let mut h = self.committed.clone();
        h.generation += 1;
        let header_image = h.encode();
        let ckpt = ckpt_file(h.generation);
        let st = self.storage.as_mut();
        // 1. Every overlay image and extent into the checkpoint file,
        //    synced: from the header switch on, open applies it.
        st.set_len(ckpt, 0).map_err(|e| io_err(st, ckpt, e))?;
        // (file position, records written)
        let mut at = (0u64, 0u64);
        let buf = &mut self.record_buf;
        let mut flush = |st: &mut dyn Storage,
                         at: &mut (u64, u64),
                         pages: Vec<PageImage>,
                         extents: Vec<Extent>|
         -> Result<(), SozuError> {
            at.1 += 1;
            let rec = CommitRecord {
                generation: h.generation,
                seq: at.1,
                pages,
                extents,
                header: header_image.clone(),
            };
            encode_record(&rec, buf);
            st.write_at(ckpt, at.0, buf)
                .map_err(|e| io_err(st, ckpt, e))?;
            at.0 += buf.len() as u64;
            Ok(())
        };
        // Each shard's overlay, taken once, pages in address order: what
        // both the double write and the home writes below write.
        let overlays: Vec<(u8, Images, Vec<Extent>)> = self
            .shards
            .iter()
            .map(|w| {
                let shard = &w.shard;
                let mut pages: Images = shard
                    .overlay
                    .pages()
                    .iter()
                    .map(|(a, img)| (*a, img.clone()))
                    .collect();
                pages.sort_unstable_by_key(|(a, _)| *a);
                let extents = shard
                    .overlay
                    .records()
                    .iter()
                    .map(|(off, data)| Extent {
                        shard: shard.id,
                        offset: *off,
                        data: data.clone(),
                    })
                    .collect();
                (shard.id, pages, extents)
            })
            .collect();
        for (id, pages, extents) in &overlays {
            for part in pages.chunks(CKPT_PAGES_PER_RECORD) {
                let images = part
                    .iter()
                    .map(|((layer, page), image)| PageImage {
                        shard: *id,
                        layer: *layer,
                        page: *page,
                        image: image.clone(),
                        delta: false,
                    })
                    .collect();
                flush(st, &mut at, images, Vec::new())?;
            }
            if !extents.is_empty() {
                flush(st, &mut at, Vec::new(), extents.clone())?;
            }
        }
        if at.1 == 0 {
            flush(st, &mut at, Vec::new(), Vec::new())?;
        }
        st.sync(ckpt).map_err(|e| io_err(st, ckpt, e))?;
        // 2. The new generation's header; the journal's records (of the old
        //    generation) are skipped from here on, so it can be emptied.
        write_header_file(st, &h)?;
        st.set_len(JOURNAL_FILE, 0)
            .map_err(|e| io_err(st, JOURNAL_FILE, e))?;
        self.committed = h;
        self.journal_pos = 0;
        self.journal_truncate = false;
        // 3. The images into their home files (runs of consecutive pages
        //    in one write of at most 1 MiB), synced.
        let psz = ps as u64;
        let mut touched: BTreeSet<String> = BTreeSet::new();
        for (id, pages, extents) in &overlays {
            let mut i = 0;
            while i < pages.len() {
                let ((layer, first), _) = &pages[i];
                let mut j = i + 1;
                while j < pages.len()
                    && pages[j].0 .0 == *layer
                    && pages[j].0 .1 == first + (j - i) as u64
                    && ((j - i + 1) as u64) * psz <= 1 << 20
                {
                    j += 1;
                }
                let mut buf = Vec::with_capacity((j - i) * ps);
                for (_, img) in &pages[i..j] {
                    buf.extend_from_slice(img);
                }
                let name = layer_file(*id, *layer);
                st.write_at(&name, first * psz, &buf)
                    .map_err(|e| io_err(st, &name, e))?;
                touched.insert(name);
                i = j;
            }
            let name = records_file(*id);
            for e in extents {
                st.write_at(&name, e.offset, &e.data)
                    .map_err(|err| io_err(st, &name, err))?;
                touched.insert(name.clone());
            }
        }
        for name in &touched {
            st.sync(name).map_err(|e| io_err(st, name, e))?;
        }
        // 4. The checkpoint file is spent (if this truncation is lost, open
        //    applies the same images again).
        st.set_len(ckpt, 0).map_err(|e| io_err(st, ckpt, e))?;
        // The files now hold every overlay image: readers that miss one
        // here read the same bytes from the file.
        for shard in self.shards.iter().map(|w| &w.shard) {
            shard.overlay.pages_mut().clear();
            shard.overlay.records_mut().clear();
        }
        self.checkpoints += 1;
        Ok(())
    }

    fn commit_inner(&mut self, tag: CommitTag) -> Result<(), SozuError> {
        if self.journal_pos >= self.checkpoint_bytes {
            self.checkpoint()?;
        }
        let ps = self.geo.page_size;
        let work: Vec<Vec<()>> = self.shards.iter().map(|_| vec![()]).collect();
        let encoded = run_per_shard(&mut self.shards, work, |w, _| {
            w.shard.encode_dirty(w.storage.as_mut(), ps)
        })?;
        let mut pages = Vec::new();
        let mut extents = Vec::new();
        let mut images = Vec::new();
        for (p, e, i) in encoded {
            pages.extend(p);
            extents.extend(e);
            images.push(i);
        }
        let mut header = self.committed.clone();
        header.commit_seq += 1;
        header.tag = Some(tag);
        header.shard_state = self.shards.iter().map(|s| s.shard.state).collect();
        let rec = CommitRecord {
            generation: header.generation,
            seq: header.commit_seq,
            pages,
            extents,
            header: header.encode(),
        };
        let bytes = &mut self.record_buf;
        encode_record(&rec, bytes);
        let st = self.storage.as_mut();
        if self.journal_truncate {
            st.set_len(JOURNAL_FILE, self.journal_pos)
                .map_err(|e| io_err(st, JOURNAL_FILE, e))?;
        }
        st.write_at(JOURNAL_FILE, self.journal_pos, bytes)
            .map_err(|e| io_err(st, JOURNAL_FILE, e))?;
        st.sync(JOURNAL_FILE)
            .map_err(|e| io_err(st, JOURNAL_FILE, e))?;
        // Durable: publish.
        self.journal_truncate = false;
        self.journal_pos += bytes.len() as u64;
        self.journal_bytes += bytes.len() as u64;
        self.committed = header;
        self.commits += 1;
        drop(rec);
        // Publish to readers, each shard's commit at once: its records
        // first (a new page may refer to them), then all its pages under
        // one lock. Published one by one, a reader could see a parent's
        // new image (an entry spilled) with its child's old one (the entry
        // not there yet) and miss the entry.
        for (w, imgs) in self.shards.iter_mut().zip(images) {
            let shard = &mut w.shard;
            let pending = std::mem::take(&mut shard.rec_pending);
            shard.overlay.records_mut().extend(pending);
            shard.overlay.pages_mut().extend(imgs);
            shard.dirty_ram.clear();
            for (addr, b) in shard.dirty.drain() {
                if shard.cache.len() < self.geo.cache_pages {
                    shard.cache.insert(addr, b);
                }
            }
        }
        Ok(())
    }
}

impl Shard {
    /// Encodes the pages and records changed since the last commit.
    /// Journal items are deltas against the page's committed image (its
    /// overlay image, else its page file's, which a checkpoint leaves
    /// consistent) when smaller, whole images otherwise (a page never
    /// written before); the third list holds every new whole image, for
    /// the overlay.
    fn encode_dirty(&self, st: &mut dyn Storage, ps: usize) -> Result<EncodedDirty, SozuError> {
        let shard = self;
        let mut pages = Vec::new();
        let mut extents = Vec::new();
        let mut images = Vec::new();
        // One buffer for the home images read as delta bases.
        let mut home = vec![0u8; ps];
        let mut dirty: Vec<(&Addr, &Bucket)> = shard.dirty.iter().collect();
        dirty.sort_by_key(|(a, _)| **a);
        // RAM-layer pages first, then disk pages in address order.
        let ram = shard.dirty_ram.iter().map(|addr| {
            shard
                .ram
                .get(addr)
                .map(|b| (addr, b))
                .ok_or(SozuError::Poisoned)
        });
        for item in ram.chain(dirty.into_iter().map(Ok)) {
            let (addr, b) = item?;
            let image = Arc::new(encode_bucket(b, ps).map_err(|_| SozuError::BucketFull {
                layer: addr.0,
                page: addr.1,
            })?);
            let overlay_image = shard.overlay.page(addr);
            let base: Option<&[u8]> = match &overlay_image {
                Some(img) => Some(img),
                None => read_home_image(st, shard.id, *addr, &mut home)?.then_some(&home[..]),
            };
            let delta = match base {
                Some(old) => {
                    let d = super::page::page_delta(old, &image).map_err(|e| {
                        corrupt(
                            PathBuf::from(JOURNAL_FILE),
                            0,
                            format!("overlay image of layer {} page {}: {e}", addr.0, addr.1),
                        )
                    })?;
                    (d.len() < super::header::trimmed_len(&image)).then_some(d)
                }
                None => None,
            };
            pages.push(PageImage {
                shard: shard.id,
                layer: addr.0,
                page: addr.1,
                delta: delta.is_some(),
                image: delta.map_or_else(|| image.clone(), Arc::new),
            });
            images.push((*addr, image));
        }
        for (off, data) in &shard.rec_pending {
            extents.push(Extent {
                shard: shard.id,
                offset: *off,
                data: data.clone(),
            });
        }
        Ok((pages, extents, images))
    }
}

impl Worker {
    /// Batched descent: each bucket read at most once. With `want_slot`
    /// each found entry's slot is cloned into its [`Found`].
    fn locate(
        &mut self,
        geo: &Geo,
        q: &[(OutPointKey, u64, u32)],
        want_slot: bool,
    ) -> Result<Vec<Option<Found>>, SozuError> {
        let mut out: Vec<Option<Found>> = (0..q.len()).map(|_| None).collect();
        let mut paths: Vec<Vec<u64>> = vec![Vec::new(); q.len()];
        let mut went_deep = vec![false; q.len()];
        let pending = q
            .iter()
            .enumerate()
            .map(|(i, (_, h, _))| (0, geo.layer0_page(*h), i))
            .collect();
        let outpoints: Vec<OutPoint> = q
            .iter()
            .map(|(key, _, _)| super::types::key_outpoint(key))
            .collect();
        descend(geo.max_layer, pending, |layer, (_, page), group, next| {
            let addr = (layer, page);
            if layer >= geo.ram_layers {
                for &(_, _, qi) in group {
                    if !went_deep[qi] {
                        went_deep[qi] = true;
                        self.counters.deep_lookups += 1;
                    }
                }
                // The page is read only for the lookups its summary (if
                // any) does not rule out; if that is none, the descent
                // goes on from the summary alone.
                let summary = self.shard.summaries.get(&addr);
                let reads = group
                    .iter()
                    .filter(|&&(_, _, qi)| {
                        summary
                            .is_none_or(|s| s.may_hold(geo.signature_key.signature(&outpoints[qi])))
                    })
                    .count();
                self.counters.deep_lookup_pages += reads as u64;
                if let (Some(s), 0) = (summary, reads) {
                    for &(_, _, qi) in group {
                        let (_, h, min_h) = q[qi];
                        if let Some(child) = geo.child_of(s.descent, h, layer, min_h) {
                            paths[qi].push(page);
                            next.push((0, child, qi));
                        }
                    }
                    return Ok(());
                }
            }
            let bucket = self.bucket_ref(geo, addr, true)?;
            for &(_, _, qi) in group {
                let (_, h, min_h) = q[qi];
                let outpoint = outpoints[qi];
                if let Some(pos) = bucket.find(&outpoint) {
                    out[qi] = Some(Found {
                        layer,
                        page,
                        path: std::mem::take(&mut paths[qi]),
                        slot: want_slot.then(|| bucket.slots[pos].clone()),
                    });
                } else if let Some(child) = geo.child_of(Descent::of(bucket), h, layer, min_h) {
                    paths[qi].push(page);
                    next.push((0, child, qi));
                }
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// The current (uncommitted included) content of a bucket.
    fn get_bucket(&mut self, geo: &Geo, addr: Addr, count: bool) -> Result<Bucket, SozuError> {
        Ok(self.bucket_ref(geo, addr, count)?.clone())
    }

    /// The current content of a bucket, borrowed (loaded into the cache if
    /// it comes from a file or the journal overlay).
    fn bucket_ref(&mut self, geo: &Geo, addr: Addr, count: bool) -> Result<&Bucket, SozuError> {
        if count {
            self.counters.buckets_read += 1;
        }
        let shard = &mut self.shard;
        if addr.0 < geo.ram_layers {
            let path = self.storage.path_of(&layer_file(shard.id, addr.0));
            return shard.ram.get(&addr).ok_or_else(|| {
                corrupt(
                    path,
                    addr.1.saturating_mul(geo.page_size as u64),
                    "RAM page not loaded",
                )
            });
        }
        if shard.dirty.contains_key(&addr) {
            return shard.dirty.get(&addr).ok_or(SozuError::Poisoned);
        }
        if !shard.cache.contains_key(&addr) {
            if !shard.overlay.pages().contains_key(&addr) {
                self.counters.disk_page_reads += 1;
            }
            let b = read_committed(self.storage.as_mut(), geo, (shard.id, &shard.overlay), addr)?;
            // Not dirty, so the committed content is the latest.
            shard
                .summaries
                .insert(addr, PageSummary::of(&b, &geo.signature_key));
            if shard.cache.len() >= geo.cache_pages.max(1) {
                // Evict an arbitrary eighth (hash order), keeping the rest warm.
                let n = (shard.cache.len() / 8).max(1);
                let victims: Vec<Addr> = shard.cache.keys().take(n).copied().collect();
                for v in victims {
                    shard.cache.remove(&v);
                }
            }
            shard.cache.insert(addr, b);
        }
        shard.cache.get(&addr).ok_or(SozuError::Poisoned)
    }

    /// Removes a bucket from memory for rewriting (put back by `put_bucket`).
    fn take_bucket(&mut self, geo: &Geo, addr: Addr) -> Result<Bucket, SozuError> {
        self.counters.buckets_read += 1;
        let shard = &mut self.shard;
        if addr.0 < geo.ram_layers {
            if let Some(b) = shard.ram.remove(&addr) {
                return Ok(b);
            }
        } else if let Some(b) = shard.dirty.remove(&addr) {
            return Ok(b);
        } else if let Some(b) = shard.cache.remove(&addr) {
            return Ok(b);
        }
        self.counters.buckets_read -= 1;
        self.get_bucket(geo, addr, true)
    }

    fn put_bucket(&mut self, geo: &Geo, addr: Addr, b: Bucket) {
        self.counters.buckets_written += 1;
        let shard = &mut self.shard;
        if addr.0 < geo.ram_layers {
            shard.ram.insert(addr, b);
            shard.dirty_ram.insert(addr);
        } else {
            shard.cache.remove(&addr);
            shard
                .summaries
                .insert(addr, PageSummary::of(&b, &geo.signature_key));
            shard.dirty.insert(addr, b);
        }
    }

    /// Fills in an out-of-line script.
    fn resolve(&mut self, mut slot: Slot) -> Result<Entry, SozuError> {
        if let Some((ext, len)) = slot.external {
            slot.entry.coin.script_pubkey = self.read_record(ext, len)?;
        }
        Ok(slot.entry)
    }

    fn read_record(&mut self, ext: ExternalScript, len: u16) -> Result<Vec<u8>, SozuError> {
        let shard = &self.shard;
        read_script(
            self.storage.as_mut(),
            (shard.id, &shard.overlay),
            Some(&shard.rec_pending),
            ext,
            len,
        )
    }

    fn append_record(&mut self, script: &[u8]) -> ExternalScript {
        let shard = &mut self.shard;
        let offset = shard.state.records_len;
        shard.state.records_len += script.len() as u64;
        shard.rec_pending.insert(offset, script.to_vec());
        ExternalScript {
            offset,
            crc: crc32fast::hash(script),
        }
    }

    fn new_slot(
        &mut self,
        geo: &Geo,
        outpoint: OutPoint,
        coin: Coin,
        produced: Vec<Production>,
        consumed: Vec<Consumption>,
    ) -> Slot {
        let mut entry = Entry {
            outpoint,
            coin,
            produced,
            consumed,
        };
        entry.produced.sort();
        entry.produced.dedup();
        entry.consumed.sort();
        entry.consumed.dedup();
        if entry.coin.script_pubkey.len() > geo.inline_script_max {
            let script = std::mem::take(&mut entry.coin.script_pubkey);
            let ext = self.append_record(&script);
            Slot {
                entry,
                external: Some((ext, script.len() as u16)),
            }
        } else {
            Slot {
                entry,
                external: None,
            }
        }
    }

    fn write_shard(
        &mut self,
        geo: &Geo,
        ops: Vec<KeyOp>,
        write: &BlockWrite,
        oracle: &dyn BlockOracle,
        purged: &mut dyn FnMut(Entry),
    ) -> Result<(), SozuError> {
        let tip = oracle.tip_height();
        let min_h = tip.min(write.height).saturating_sub(PURGE_DEPTH);
        // 1. Batched lookups of every key that may be present.
        let lookup_idx: Vec<usize> = ops
            .iter()
            .enumerate()
            .filter(|(_, op)| !matches!(op.create, Some((_, true))))
            .map(|(i, _)| i)
            .collect();
        let q: Vec<(OutPointKey, u64, u32)> = lookup_idx
            .iter()
            .map(|&i| {
                let op = &ops[i];
                (op.key, op.h, if op.create.is_some() { min_h } else { 0 })
            })
            .collect();
        let found = self.locate(geo, &q, false)?;
        let mut found_by_op: Vec<Option<Found>> = (0..ops.len()).map(|_| None).collect();
        for (i, f) in lookup_idx.into_iter().zip(found) {
            found_by_op[i] = f;
        }
        // 2. Gather the work per bucket.
        let mut work: Vec<BTreeMap<u64, Work>> =
            (0..=geo.max_layer).map(|_| BTreeMap::new()).collect();
        let production = Production {
            block: write.block,
            height: write.height,
        };
        for (i, op) in ops.into_iter().enumerate() {
            let prods = if op.create.is_some() {
                vec![production]
            } else {
                Vec::new()
            };
            match found_by_op[i].take() {
                Some(f) => {
                    if op.create.is_some() {
                        for (layer, page) in f.path.iter().enumerate() {
                            let w = work[layer].entry(*page).or_default();
                            w.raise = w.raise.max(write.height);
                        }
                    }
                    let coin = op.create.map(|(c, _)| c);
                    work[f.layer as usize]
                        .entry(f.page)
                        .or_default()
                        .merges
                        .push((op.key, coin, prods, op.consumed));
                }
                None => match op.create {
                    Some((coin, _)) => {
                        let slot = self.new_slot(geo, op.outpoint, coin, prods, op.consumed);
                        work[0]
                            .entry(geo.layer0_page(op.h))
                            .or_default()
                            .inserts
                            .push(slot);
                    }
                    None => {
                        return Err(SozuError::MissingEntry {
                            outpoint: op.outpoint,
                        })
                    }
                },
            }
        }
        // 3. Rewrite buckets layer by layer, spilling downward.
        for layer in 0..=geo.max_layer {
            let this = std::mem::take(&mut work[layer as usize]);
            if this.is_empty() {
                if work.iter().skip(layer as usize).all(BTreeMap::is_empty) {
                    break;
                }
                continue;
            }
            for (page, w) in this {
                let mut b = self.take_bucket(geo, (layer, page))?;
                for (key, coin, prods, cons) in w.merges {
                    let pos = b.find(&super::types::key_outpoint(&key)).ok_or_else(|| {
                        corrupt(
                            self.storage.path_of(&layer_file(self.shard.id, layer)),
                            page.saturating_mul(geo.page_size as u64),
                            "entry vanished between lookup and merge",
                        )
                    })?;
                    if let Some(coin) = coin {
                        let slot = b.slots[pos].clone();
                        let existing = self.resolve(slot)?;
                        if existing.coin.value != coin.value
                            || existing.coin.script_pubkey != coin.script_pubkey
                        {
                            return Err(SozuError::CoinMismatch {
                                outpoint: existing.outpoint,
                            });
                        }
                    }
                    b.slots[pos].entry.merge_records(&prods, &cons);
                }
                for slot in w.inserts {
                    // Defensive: a key already here is merged (unicity).
                    match b
                        .slots
                        .iter()
                        .position(|s| s.entry.outpoint == slot.entry.outpoint)
                    {
                        Some(pos) => {
                            let e = &slot.entry;
                            b.slots[pos].entry.merge_records(&e.produced, &e.consumed);
                        }
                        None => b.slots.push(slot),
                    }
                }
                b.max_child_height = b.max_child_height.max(w.raise);
                // Purge loop (MergeEntries): only purged slots move (most
                // buckets purge nothing).
                let final_slots: Vec<Slot> = b
                    .slots
                    .extract_if(.., |s| s.entry.is_purgeable_at(oracle, tip))
                    .collect();
                for slot in final_slots {
                    self.counters.purges += 1;
                    purged(self.resolve(slot)?);
                }
                // Spill (GetSpill): the seed's order picks what should flow
                // (consumed on the best chain first, then oldest max
                // production height, then key); the spill then goes to as
                // few children as possible — written children first, and
                // among them the one holding most of that prefix — so one
                // spill rewrites two pages, not 2^g + 1, and creates a page
                // only when no written child can take it
                // (docs/sozu-format.md, "Spill policy").
                let cfg = geo.layer_cfg(layer);
                if b.payload_len() > cfg.capacity && layer < geo.max_layer {
                    let target = (cfg.alpha * cfg.capacity as f64) as usize;
                    // Sort keys with slot indices; the slots move once.
                    let mut order: Vec<(u8, u32, OutPointKey, u64, usize, usize)> = b
                        .slots
                        .iter()
                        .enumerate()
                        .map(|(i, s)| {
                            let best = if s.entry.is_consumed_on_best(oracle) {
                                0
                            } else {
                                1
                            };
                            let key = outpoint_key(&s.entry.outpoint);
                            let h = geo.hash(&key);
                            (
                                best,
                                s.entry.max_production_height(),
                                key,
                                h,
                                s.encoded_len(),
                                i,
                            )
                        })
                        .collect();
                    order.sort_unstable_by_key(|o| (o.0, o.1, o.2));
                    let total: usize = order.iter().map(|o| o.4).sum();
                    let fanout = 1usize << geo.g;
                    let mut prefix = vec![0usize; fanout];
                    let mut bytes = vec![0usize; fanout];
                    let mut size = total;
                    for o in &order {
                        let c = geo.child_index(o.3, layer + 1) as usize;
                        bytes[c] += o.4;
                        if size > target {
                            size -= o.4;
                            prefix[c] += o.4;
                        }
                    }
                    // Children already written first: a spill into one of
                    // them costs no new page, and the deepest layer's fill
                    // is most of the bytes on disk.
                    let mut by_pref: Vec<usize> = (0..fanout).collect();
                    let written = |c: usize| b.child_mask & (1 << c) != 0;
                    by_pref.sort_unstable_by_key(|&c| {
                        (
                            !written(c),
                            std::cmp::Reverse(prefix[c]),
                            std::cmp::Reverse(bytes[c]),
                            c,
                        )
                    });
                    let mut chosen = if geo.spill_fewest_children {
                        0u16
                    } else {
                        u16::MAX
                    };
                    let mut size = total;
                    for c in by_pref {
                        if size <= target {
                            break;
                        }
                        chosen |= 1 << c;
                        size = size.saturating_sub(bytes[c]);
                    }
                    let mut size = total;
                    let mut spill_h: Vec<Option<u64>> = vec![None; b.slots.len()];
                    for o in &order {
                        if size > target && chosen & geo.child_bit(o.3, layer + 1) != 0 {
                            size -= o.4;
                            spill_h[o.5] = Some(o.3);
                        }
                    }
                    // Only the spilled slots move, in bucket order.
                    let mut at = 0;
                    let flowing: Vec<Slot> = b
                        .slots
                        .extract_if(.., |_| {
                            at += 1;
                            spill_h[at - 1].is_some()
                        })
                        .collect();
                    let spilled = spill_h.into_iter().flatten().zip(flowing);
                    if b.children == 0 {
                        let state = &mut self.shard.state;
                        let group = state.groups[layer as usize + 1];
                        state.groups[layer as usize + 1] += 1;
                        b.children = group + 1;
                        self.counters.children_allocated += 1;
                    }
                    for (h, s) in spilled {
                        self.counters.spills += 1;
                        b.max_child_height =
                            b.max_child_height.max(s.entry.max_production_height());
                        let bit = geo.child_bit(h, layer + 1);
                        let child = geo.child_page(b.children, h, layer + 1);
                        if b.child_mask & bit == 0 {
                            // First write of this child: it has no page yet.
                            b.child_mask |= bit;
                            self.put_bucket(geo, (layer + 1, child), Bucket::default());
                            self.counters.buckets_written -= 1;
                        }
                        work[layer as usize + 1]
                            .entry(child)
                            .or_default()
                            .inserts
                            .push(s);
                    }
                }
                if PAGE_HEADER_LEN + b.payload_len() > geo.page_size {
                    return Err(SozuError::BucketFull { layer, page });
                }
                self.put_bucket(geo, (layer, page), b);
            }
        }
        Ok(())
    }
}

/// A key's place in a batched descent: (shard, page of the current layer,
/// index of the key in the caller's batch).
type Pending = (u8, u64, usize);

/// Seed 000's `ReadSozu` for a whole batch: layer by layer from layer 0,
/// each distinct page visited once with every key that reaches it (so each
/// bucket is read at most once per batch). `visit(layer, (shard, page),
/// keys, next)` reads the page, settles the keys it can and pushes those
/// that must go one layer down, with their child page, onto `next`.
fn descend(
    max_layer: u8,
    mut pending: Vec<Pending>,
    mut visit: impl FnMut(u8, (u8, u64), &[Pending], &mut Vec<Pending>) -> Result<(), SozuError>,
) -> Result<(), SozuError> {
    for layer in 0..=max_layer {
        if pending.is_empty() {
            break;
        }
        pending.sort_unstable();
        let mut next = Vec::new();
        for group in pending.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
            visit(layer, (group[0].0, group[0].1), group, &mut next)?;
        }
        pending = next;
    }
    Ok(())
}

/// Runs `f` on each shard that has work, one scoped thread per shard when
/// more than one has work (seed 000, "Sharding the Sozu table").
fn run_per_shard<T: Send, R: Send>(
    workers: &mut [Worker],
    work: Vec<Vec<T>>,
    f: impl Fn(&mut Worker, Vec<T>) -> Result<R, SozuError> + Sync,
) -> Result<Vec<R>, SozuError> {
    let busy = work.iter().filter(|w| !w.is_empty()).count();
    if busy <= 1 {
        let mut out = Vec::new();
        for (w, items) in workers.iter_mut().zip(work) {
            if !items.is_empty() {
                out.push(f(w, items)?);
            }
        }
        return Ok(out);
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = workers
            .iter_mut()
            .zip(work)
            .filter(|(_, items)| !items.is_empty())
            .map(|(w, items)| {
                let f = &f;
                scope.spawn(move || f(w, items))
            })
            .collect();
        let mut out = Vec::new();
        for h in handles {
            match h.join() {
                Ok(r) => out.push(r?),
                Err(_) => return Err(SozuError::Poisoned),
            }
        }
        Ok(out)
    })
}

fn decode_header(st: &dyn Storage, name: &str, offset: u64, b: &[u8]) -> Result<Header, SozuError> {
    Header::decode(b).map_err(|e| match e {
        HeaderError::Version(major, minor) => SozuError::UnsupportedVersion {
            path: st.path_of(name),
            major,
            minor,
        },
        HeaderError::Checksum => corrupt(st.path_of(name), offset, "header checksum mismatch"),
        HeaderError::Magic => corrupt(
            st.path_of(name),
            offset + 4,
            "bad header magic (not a Sozu table)",
        ),
        HeaderError::Field(f) => corrupt(
            st.path_of(name),
            offset,
            format!("header field out of range: {f}"),
        ),
    })
}

fn write_header_file(st: &mut dyn Storage, h: &Header) -> Result<(), SozuError> {
    let bytes = h.encode();
    st.set_len(HEADER_TMP, 0)
        .map_err(|e| io_err(st, HEADER_TMP, e))?;
    st.write_at(HEADER_TMP, 0, &bytes)
        .map_err(|e| io_err(st, HEADER_TMP, e))?;
    st.sync(HEADER_TMP).map_err(|e| io_err(st, HEADER_TMP, e))?;
    st.rename(HEADER_TMP, HEADER_FILE)
        .map_err(|e| io_err(st, HEADER_FILE, e))?;
    st.sync_dir().map_err(|e| io_err(st, HEADER_FILE, e))
}

/// Visits the pages of one shard that exist, layer by layer from layer 0
/// down to `deepest`, in page order within a layer, following each bucket's
/// written-children mask (a child never written has no page). `read` loads
/// a page, `visit` receives it.
fn walk_shard<S>(
    geo: &Geo,
    deepest: u8,
    s: &mut S,
    read: impl Fn(&mut S, Addr) -> Result<Bucket, SozuError>,
    mut visit: impl FnMut(&mut S, Addr, Bucket) -> Result<(), SozuError>,
) -> Result<(), SozuError> {
    let mut pages: Vec<u64> = (0..geo.layer0_pages()).collect();
    for layer in 0..=deepest.min(geo.max_layer) {
        if pages.is_empty() {
            break;
        }
        pages.sort_unstable();
        let mut next = Vec::new();
        for page in pages {
            let b = read(s, (layer, page))?;
            if b.children != 0 && layer < geo.max_layer {
                let base = (b.children - 1).saturating_mul(1 << geo.g);
                for c in 0..(1u64 << geo.g) {
                    if b.child_mask & (1 << c) != 0 {
                        next.push(base.saturating_add(c));
                    }
                }
            }
            visit(s, (layer, page), b)?;
        }
        pages = next;
    }
    Ok(())
}

/// Reads and checks an out-of-line script: from `pending` (extents written
/// since the last commit, the writer's own), the shard's committed overlay,
/// or its records file.
fn read_script(
    st: &mut dyn Storage,
    (shard, overlay): (u8, &Overlay),
    pending: Option<&BTreeMap<u64, Vec<u8>>>,
    ext: ExternalScript,
    len: u16,
) -> Result<Vec<u8>, SozuError> {
    let name = records_file(shard);
    let len = len as usize;
    let from_map = |m: &BTreeMap<u64, Vec<u8>>| -> Option<Vec<u8>> {
        let (off, d) = m.range(..=ext.offset).next_back()?;
        let start = (ext.offset - off) as usize;
        d.get(start..start + len).map(<[u8]>::to_vec)
    };
    let data = match pending
        .and_then(from_map)
        .or_else(|| from_map(&overlay.records()))
    {
        Some(d) => d,
        None => {
            let mut buf = vec![0u8; len];
            st.read_at(&name, ext.offset, &mut buf)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => {
                        corrupt(st.path_of(&name), ext.offset, "records file truncated")
                    }
                    _ => io_err(st, &name, e),
                })?;
            buf
        }
    };
    if crc32fast::hash(&data) != ext.crc {
        return Err(corrupt(
            st.path_of(&name),
            ext.offset,
            "out-of-line script checksum mismatch",
        ));
    }
    Ok(data)
}

/// Per-layer counts of a walk over the pages ([`SozuStats::layers`],
/// [`SozuStats::payload_bytes`]).
#[derive(Default)]
struct LayerScan {
    layers: Vec<LayerStats>,
    bytes_by_layer: Vec<u64>,
    payload: u64,
}

impl LayerScan {
    fn add(&mut self, (layer, _): Addr, b: &Bucket) {
        while self.layers.len() <= layer as usize {
            self.layers.push(LayerStats::default());
            self.bytes_by_layer.push(0);
        }
        let ls = &mut self.layers[layer as usize];
        ls.buckets += 1;
        ls.entries += b.slots.len() as u64;
        self.bytes_by_layer[layer as usize] += b.payload_len() as u64;
        for s in &b.slots {
            let script = s
                .external
                .map_or(s.entry.coin.script_pubkey.len(), |(_, l)| l as usize);
            self.payload += (36
                + 8
                + 4
                + 1
                + script
                + 8 * s.entry.produced.len()
                + 40 * s.entry.consumed.len()) as u64;
        }
    }

    /// The statistics: these layer counts, `files` = (bytes on disk,
    /// journal file bytes), and the counters of `counters`.
    fn finish(mut self, geo: &Geo, files: (u64, u64), counters: SozuStats) -> SozuStats {
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

/// (Bytes the table's files occupy on disk, length of the journal file).
fn file_bytes(st: &mut dyn Storage, geo: &Geo, shards: u8) -> Result<(u64, u64), SozuError> {
    let mut names = vec![
        HEADER_FILE.to_string(),
        JOURNAL_FILE.to_string(),
        ckpt_file(0).to_string(),
        ckpt_file(1).to_string(),
    ];
    for s in 0..shards {
        names.push(records_file(s));
        for l in 0..=geo.max_layer {
            names.push(layer_file(s, l));
        }
    }
    let journal = st
        .len(JOURNAL_FILE)
        .map_err(|e| io_err(st, JOURNAL_FILE, e))?;
    let mut total = 0u64;
    for n in names {
        total += st.allocated(&n).map_err(|e| io_err(st, &n, e))?;
    }
    Ok((total, journal))
}

/// The records of the checkpoint file if they belong to the header's
/// generation `h` (a checkpoint whose header switch happened: its images
/// must be applied), else none (an older, spent one, or one torn before
/// its header switch: the page files are consistent without it).
///
/// # Errors
/// [`SozuError::Corrupt`] when a record of generation `h` is damaged or
/// followed by anything but another (it was synced before the switch).
fn read_checkpoint_file(
    st: &mut dyn Storage,
    h: &Header,
    page_size: usize,
) -> Result<Vec<CommitRecord>, SozuError> {
    let file = ckpt_file(h.generation);
    let len = st.len(file).map_err(|e| io_err(st, file, e))?;
    let len = usize::try_from(len)
        .map_err(|_| corrupt(st.path_of(file), 0, "checkpoint file too large"))?;
    if len == 0 {
        return Ok(Vec::new());
    }
    let mut buf = vec![0u8; len];
    st.read_at(file, 0, &mut buf)
        .map_err(|e| io_err(st, file, e))?;
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos < buf.len() {
        match parse_record(&buf[pos..], page_size) {
            Parsed::Ok(rec, n) if rec.generation == h.generation => {
                if rec.pages.iter().any(|p| p.delta) {
                    return Err(corrupt(
                        st.path_of(file),
                        pos as u64,
                        "checkpoint record holds a page delta",
                    ));
                }
                out.push(rec);
                pos += n;
            }
            // Not this generation's checkpoint at all (older and spent, or
            // torn before its header switch): ignore the file; unless its
            // first record's checksummed head says it is this generation's.
            _ if pos == 0 && super::header::record_generation(&buf) != Some(h.generation) => {
                return Ok(Vec::new())
            }
            _ => {
                return Err(corrupt(
                    st.path_of(file),
                    pos as u64,
                    "damaged checkpoint record",
                ))
            }
        }
    }
    Ok(out)
}

/// The committed image of a page in its home file, checksum verified;
/// `None` if the page was never written there (past the end, or a hole).
///
/// # Errors
/// [`SozuError::Corrupt`] for a written page whose checksum fails, I/O.
fn home_image(
    st: &mut dyn Storage,
    shard: u8,
    addr: Addr,
    page_size: usize,
) -> Result<Option<Vec<u8>>, SozuError> {
    let mut buf = vec![0u8; page_size];
    Ok(read_home_image(st, shard, addr, &mut buf)?.then_some(buf))
}

/// [`home_image`] into `buf` (one page long, reused by the caller): true
/// if the page was written, with its image in `buf`.
fn read_home_image(
    st: &mut dyn Storage,
    shard: u8,
    addr: Addr,
    buf: &mut [u8],
) -> Result<bool, SozuError> {
    let name = layer_file(shard, addr.0);
    let offset = addr.1.saturating_mul(buf.len() as u64);
    match st.read_at(&name, offset, buf) {
        Ok(()) => {}
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::NotFound
            ) =>
        {
            return Ok(false)
        }
        Err(e) => return Err(io_err(st, &name, e)),
    }
    if buf.iter().all(|&b| b == 0) {
        return Ok(false);
    }
    let stored = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if stored != crc32fast::hash(&buf[4..]) {
        return Err(corrupt(st.path_of(&name), offset, "page checksum mismatch"));
    }
    Ok(true)
}

/// Reads a committed page (journal overlay first, then the page file) and
/// verifies it.
fn read_committed(
    st: &mut dyn Storage,
    geo: &Geo,
    shard: (u8, &Overlay),
    addr: Addr,
) -> Result<Bucket, SozuError> {
    parse_committed(st, geo, shard, addr, |page| {
        decode_bucket(page, geo.page_size)
    })
}

/// `parse` applied to a page's committed image: its overlay image, else its
/// page file's; a parse error is corruption of where the image came from.
fn parse_committed<T>(
    st: &mut dyn Storage,
    geo: &Geo,
    (shard, overlay): (u8, &Overlay),
    addr: Addr,
    parse: impl FnOnce(&[u8]) -> Result<T, PageError>,
) -> Result<T, SozuError> {
    let name = layer_file(shard, addr.0);
    let offset = addr.1.saturating_mul(geo.page_size as u64);
    if let Some(img) = overlay.page(&addr) {
        return parse(&img).map_err(|e| {
            corrupt(
                st.path_of(JOURNAL_FILE),
                0,
                format!("journal image of {name} page {}: {e}", addr.1),
            )
        });
    }
    let mut buf = vec![0u8; geo.page_size];
    st.read_at(&name, offset, &mut buf)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::NotFound => {
                corrupt(st.path_of(&name), offset, "file truncated: page missing")
            }
            _ => io_err(st, &name, e),
        })?;
    parse(&buf).map_err(|e| corrupt(st.path_of(&name), offset, e.to_string()))
}

/// Concurrent reads of a [`SozuTable`]'s committed state, from any thread
/// while the writer works ([`UtxoTable::reader`]). Every page comes from
/// its shard's committed overlay (the commits since the last checkpoint)
/// or from its file — never from the writer's uncommitted buckets — and no
/// lock is held while a file is read: the writer never waits for a reader
/// longer than the copy of one pointer. A lookup descends top-down, so an
/// entry that a commit moves to a deeper layer meanwhile is still found
/// (the page above is read first; if it no longer holds the entry, the
/// child read after it already does). Cost: each page visited is read
/// (one `pread` unless in the overlay) and searched once per batch, only
/// the entries asked for decoded ([`page::find_in_page`](super::page::find_in_page)).
pub struct SozuReader {
    geo: Geo,
    overlays: Vec<Arc<Overlay>>,
    /// Idle storage handles, reused across calls (a call takes one).
    handles: Mutex<Vec<Box<dyn Storage>>>,
    /// Cloned for a call when no idle handle is left.
    template: Mutex<Box<dyn Storage>>,
}

impl std::fmt::Debug for SozuReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SozuReader")
            .field("shards", &self.overlays.len())
            .finish_non_exhaustive()
    }
}

/// Idle handles a [`SozuReader`] keeps for reuse.
const READER_IDLE_HANDLES: usize = 16;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SozuReader {
    fn with_handle<R>(
        &self,
        f: impl FnOnce(&mut dyn Storage) -> Result<R, SozuError>,
    ) -> Result<R, SozuError> {
        let popped = lock(&self.handles).pop();
        let mut st = match popped {
            Some(h) => h,
            None => {
                let t = lock(&self.template);
                t.try_clone()
                    .map_err(|e| io_err(t.as_ref(), HEADER_FILE, e))?
            }
        };
        let r = f(st.as_mut());
        let mut idle = lock(&self.handles);
        if idle.len() < READER_IDLE_HANDLES {
            idle.push(st);
        }
        r
    }

    /// A committed page. A file read can race a checkpoint rewriting that
    /// very page (a torn read fails its checksum); it is retried, and by
    /// then the overlay or the file holds the whole image.
    fn page<T>(
        &self,
        st: &mut dyn Storage,
        shard: u8,
        addr: Addr,
        parse: impl Fn(&[u8]) -> Result<T, PageError>,
    ) -> Result<T, SozuError> {
        let overlay = self
            .overlays
            .get(shard as usize)
            .ok_or(SozuError::Poisoned)?;
        let mut tries = 0;
        loop {
            match parse_committed(st, &self.geo, (shard, overlay), addr, &parse) {
                Err(SozuError::Corrupt { .. }) if tries < 2 => tries += 1,
                r => return r,
            }
        }
    }

    fn lookup(
        &self,
        st: &mut dyn Storage,
        keys: &[OutPoint],
    ) -> Result<Vec<Option<Entry>>, SozuError> {
        let geo = &self.geo;
        let mut out: Vec<Option<Entry>> = vec![None; keys.len()];
        let hashes: Vec<u64> = keys.iter().map(|k| geo.hash(&outpoint_key(k))).collect();
        let pending = hashes
            .iter()
            .enumerate()
            .map(|(i, h)| (geo.shard_of(*h), geo.layer0_page(*h), i))
            .collect();
        descend(
            geo.max_layer,
            pending,
            |layer, (shard, page), group, next| {
                let asked: Vec<OutPointKey> = group
                    .iter()
                    .map(|&(_, _, qi)| outpoint_key(&keys[qi]))
                    .collect();
                let PageFind { head, found } = self.page(st, shard, (layer, page), |p| {
                    find_in_page(p, geo.page_size, &asked)
                })?;
                for (&(_, _, qi), slot) in group.iter().zip(found) {
                    if let Some(slot) = slot {
                        let mut entry = slot.entry;
                        if let Some((ext, len)) = slot.external {
                            let overlay = &self.overlays[shard as usize];
                            entry.coin.script_pubkey =
                                read_script(st, (shard, overlay), None, ext, len)?;
                        }
                        out[qi] = Some(entry);
                    } else if let Some(child) =
                        geo.child_of(Descent::of(&head), hashes[qi], layer, 0)
                    {
                        next.push((shard, child, qi));
                    }
                }
                Ok(())
            },
        )?;
        Ok(out)
    }
}

impl UtxoReader for SozuReader {
    fn get_batch(&self, keys: &[OutPoint]) -> Result<Vec<Option<Entry>>, SozuError> {
        self.with_handle(|st| self.lookup(st, keys))
    }

    /// Layers, payload and bytes on disk from a walk over the committed
    /// pages (commits landing during the walk may be half counted); the
    /// counters are the writer's ([`UtxoTable::sozu_counters`]) and are 0 here.
    fn scan_stats(&self) -> Result<Option<SozuStats>, SozuError> {
        self.with_handle(|mut st| {
            let geo = &self.geo;
            let mut scan = LayerScan::default();
            for shard in 0..self.overlays.len() as u8 {
                walk_shard(
                    geo,
                    geo.max_layer,
                    &mut st,
                    |st, addr| {
                        self.page(&mut **st, shard, addr, |p| decode_bucket(p, geo.page_size))
                    },
                    |_, addr, b| {
                        scan.add(addr, &b);
                        Ok(())
                    },
                )?;
            }
            let files = file_bytes(st, geo, self.overlays.len() as u8)?;
            Ok(Some(scan.finish(geo, files, SozuStats::default())))
        })
    }
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
        let (r0, w0) = (self.buckets_read(), self.buckets_written());
        // Group the block's changes by key.
        let mut ops: BTreeMap<OutPointKey, KeyOp> = BTreeMap::new();
        for new in &write.created {
            if new.coin.script_pubkey.len() > super::page::MAX_SCRIPT_LEN {
                return Err(SozuError::ScriptTooLong {
                    outpoint: new.outpoint,
                    len: new.coin.script_pubkey.len(),
                });
            }
            let key = outpoint_key(&new.outpoint);
            let h = self.geo.hash(&key);
            let op = ops.entry(key).or_insert_with(|| KeyOp {
                key,
                outpoint: new.outpoint,
                h,
                create: None,
                consumed: Vec::new(),
            });
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
            let key = outpoint_key(outpoint);
            let h = self.geo.hash(&key);
            ops.entry(key)
                .or_insert_with(|| KeyOp {
                    key,
                    outpoint: *outpoint,
                    h,
                    create: None,
                    consumed: Vec::new(),
                })
                .consumed
                .push(*c);
        }
        let mut by_shard: Vec<Vec<KeyOp>> = (0..self.shards.len()).map(|_| Vec::new()).collect();
        for (_, op) in ops {
            by_shard[self.geo.shard_of(op.h) as usize].push(op);
        }
        let geo = &self.geo;
        let results = run_per_shard(&mut self.shards, by_shard, |w, ops| {
            let mut out = Vec::new();
            w.write_shard(geo, ops, write, oracle, &mut |e| out.push(e))?;
            Ok(out)
        });
        match results {
            Ok(lists) => lists.into_iter().flatten().for_each(purged),
            Err(e) => {
                self.poisoned = true;
                return Err(e);
            }
        }
        self.block_counters = (self.buckets_read() - r0, self.buckets_written() - w0);
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
        for w in &mut self.shards {
            walk_shard(
                &geo,
                geo.max_layer,
                w,
                |w, addr| w.get_bucket(&geo, addr, false),
                |w, _, b| {
                    for slot in b.slots {
                        let e = w.resolve(slot)?;
                        f(&e);
                    }
                    Ok(())
                },
            )?;
        }
        Ok(())
    }
}
