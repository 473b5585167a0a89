//! The on-disk archive: one immutable file per sealed epoch plus the epoch
//! header list, written crash-safely (tmp file, fsync, rename, dir fsync).
//! File layouts in `docs/archive.md` ("On disk").
//!
//! The epochs' filters are read through a cache of a byte budget
//! ([`DEFAULT_FILTER_CACHE`], config `archive.filter_cache_mib`): open
//! checks each epoch's filter and keeps its checksum; a filter not in the
//! cache is read again from its file and checked against that checksum.
//! So the memory of the filters does not grow with the archive; a budget
//! below their total (about 2.6 bytes per spent output) costs reading the
//! filters of the evicted epochs again at each lookup.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bitcoin::merkle_tree::MerkleBlock;
use bitcoin::{BlockHash, OutPoint, Txid};

use super::filter::{filter_key, EpochFilter};
pub use super::format::{
    EPOCH_FILE_MAGIC, FORMAT_VERSION, INDEX_FILE, INDEX_FILE_MAGIC, MAX_EPOCH_LEAVES,
};
use super::header::{commitment, EpochHeader, HEADER_LEN};
use super::leaf::{Leaf, TreeEntry, MAX_ENTRY_LEN};
use super::merkle::{build_levels, leaf_hash, level_sizes, needed_nodes, NodeHash};
use super::proof::{verify, Anchor, EpochProof, Gap, ProofBatch, ProofItem, ProofNode, MAX_ITEMS};
use super::seal::{self, EpochBuilder, SEAL_MEMORY_BYTES};
use super::{ArchiveError, OutpointStatus};
use crate::primitives::outpoint_key;
use crate::store::byte_cache::{ByteCache, Weighed};
use crate::store::durable;
use crate::store::fault::{self, IoOp};

/// Default budget of the cache of epoch filters, bytes: 256 MiB
/// ([`crate::store::budgets::DEFAULT_ARCHIVE_FILTER_CACHE`], which the
/// store's budgets hold).
pub const DEFAULT_FILTER_CACHE: usize = crate::store::budgets::DEFAULT_ARCHIVE_FILTER_CACHE;
/// Bytes of an epoch file before its filter: magic, version, header,
/// filter length.
const FILTER_AT: u64 = 94;

/// The cache of epoch filters, by epoch number.
type FilterCache = ByteCache<u32, EpochFilter>;

impl Weighed for EpochFilter {
    fn heap_bytes(&self) -> usize {
        self.fingerprints() * 2
    }
}

/// The path of epoch `n`'s file in `dir`: `epoch-NNNNNNNN.dat`.
pub fn epoch_file_name(n: u32) -> String {
    format!("epoch-{n:08}.dat")
}

/// A sealed epoch file, opened.
#[derive(Debug)]
struct EpochFile {
    path: PathBuf,
    file: File,
    /// Bytes of the filter (from [`FILTER_AT`]).
    filter_len: u64,
    /// The CRC-32 of the bytes before the filter and of the filter, as
    /// checked at open.
    filter_sum: u32,
    leaf_count: u32,
    offsets_at: u64,
    leaves_at: u64,
    nodes_at: u64,
    level_starts: Vec<u64>,
}

/// The archive of sealed epochs in one directory.
///
/// One writer (the pipeline) calls [`Archive::seal`]; proofs are built with
/// `pread`, so `&self` methods may run from several threads. A clone is
/// cheap (the sealed epochs are shared, `Arc`) and keeps the epochs sealed
/// when it was made: a chain snapshot carries one, and the writer's later
/// seals do not change it.
#[derive(Debug, Clone)]
pub struct Archive {
    dir: Arc<Path>,
    epoch_length: u32,
    headers: Arc<Vec<EpochHeader>>,
    files: Arc<Vec<Arc<EpochFile>>>,
    /// The sealed epochs' filters read so far (shared by the clones).
    filters: Arc<FilterCache>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn corrupt(path: &Path, reason: &'static str) -> ArchiveError {
    ArchiveError::Corrupt {
        path: path.to_path_buf(),
        reason,
    }
}

fn sync_dir(dir: &Path) -> Result<(), ArchiveError> {
    durable::sync_dir(dir).map_err(io_err(dir))
}

/// Writes `write` into `path.tmp`, fsyncs, renames over `path`, fsyncs dir.
fn write_atomic(
    dir: &Path,
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<(), ArchiveError> {
    let tmp = path.with_extension("dat.tmp");
    let f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&tmp)
        .map_err(io_err(&tmp))?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    fault::check(IoOp::Write, &tmp)
        .and_then(|()| write(&mut w))
        .map_err(io_err(&tmp))?;
    let f = w.into_inner().map_err(|e| ArchiveError::Io {
        path: tmp.clone(),
        source: e.into_error(),
    })?;
    durable::sync_file(&tmp, &f).map_err(io_err(&tmp))?;
    drop(f);
    durable::rename(&tmp, path).map_err(io_err(path))?;
    sync_dir(dir)
}

fn read_at(f: &File, path: &Path, at: u64, len: usize) -> Result<Vec<u8>, ArchiveError> {
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, at).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            corrupt(path, "file shorter than its layout")
        } else {
            ArchiveError::Io {
                path: path.to_path_buf(),
                source: e,
            }
        }
    })?;
    Ok(buf)
}

fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

/// A txoutproof source: `(spend block hash, spending txid)` → the
/// `MerkleBlock` of that transaction in that block, if the caller has it.
pub type TxOutProofFn<'a> = &'a dyn Fn(&BlockHash, &Txid) -> Option<MerkleBlock>;

/// Result of a binary search: `Ok((index, entry))` if held, else
/// `Err(low)` (the gap `low < key < low + 1`).
type SearchResult = Result<(u32, TreeEntry), u32>;

impl Archive {
    /// Opens (creating if needed) the archive in `dir` with epochs of
    /// `epoch_length` blocks.
    ///
    /// Checks: the header list's magic, version, epoch length, checksum,
    /// and hash chain; for each sealed epoch, its file's magic, version,
    /// header (equal to the list's), filter checksum and bounds, file length
    /// against the layout, and the stored root. Leaves and inner nodes are
    /// not re-hashed here (see [`Archive::verify_epoch_file`]); proofs are
    /// self-checked before they are returned, so a damaged leaf or node is
    /// reported then. Leftover `*.tmp` files and epoch files beyond the list
    /// (a seal interrupted before the list was updated) are removed.
    ///
    /// # Errors
    /// [`ArchiveError::Io`] for I/O failures, [`ArchiveError::Corrupt`]
    /// naming the damaged file, [`ArchiveError::EpochLengthMismatch`].
    pub fn open(dir: &Path, epoch_length: u32) -> Result<Archive, ArchiveError> {
        Self::open_with_cache(dir, epoch_length, DEFAULT_FILTER_CACHE)
    }

    /// [`Archive::open`] with a cache of epoch filters of `filter_cache`
    /// bytes (answers do not depend on it).
    ///
    /// # Errors
    /// As [`Archive::open`].
    pub fn open_with_cache(
        dir: &Path,
        epoch_length: u32,
        filter_cache: usize,
    ) -> Result<Archive, ArchiveError> {
        if epoch_length == 0 {
            return Err(ArchiveError::EpochLengthMismatch {
                path: dir.to_path_buf(),
                stored: 0,
                requested: 0,
            });
        }
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let index = dir.join(INDEX_FILE);
        let headers = match fs::read(&index) {
            Ok(b) => Self::parse_index(&index, &b, epoch_length)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                return Err(ArchiveError::Io {
                    path: index,
                    source: e,
                })
            }
        };
        // Remove leftovers of interrupted seals.
        for ent in fs::read_dir(dir).map_err(io_err(dir))? {
            let ent = ent.map_err(io_err(dir))?;
            let name = ent.file_name();
            let Some(name) = name.to_str() else { continue };
            let stale_epoch = name
                .strip_prefix("epoch-")
                .and_then(|s| s.strip_suffix(".dat"))
                .and_then(|s| s.parse::<u32>().ok())
                .is_some_and(|n| n as usize >= headers.len());
            if name.ends_with(".tmp") || stale_epoch {
                let p = ent.path();
                fs::remove_file(&p).map_err(io_err(&p))?;
            }
        }
        let filters = Arc::new(FilterCache::new(filter_cache, 1 << 20));
        let mut files = Vec::with_capacity(headers.len());
        for h in &headers {
            let path = dir.join(epoch_file_name(h.epoch));
            files.push(Self::open_epoch_file(&path, h, &filters)?);
        }
        Ok(Archive {
            dir: Arc::from(dir),
            epoch_length,
            headers: Arc::new(headers),
            files: Arc::new(files.into_iter().map(Arc::new).collect()),
            filters,
        })
    }

    fn parse_index(
        path: &Path,
        b: &[u8],
        epoch_length: u32,
    ) -> Result<Vec<EpochHeader>, ArchiveError> {
        if b.len() < 21 || b[..8] != INDEX_FILE_MAGIC {
            return Err(corrupt(path, "bad magic or truncated header list"));
        }
        if b[8] != FORMAT_VERSION {
            return Err(corrupt(path, "unsupported header list version"));
        }
        let (body, sum) = b.split_at(b.len() - 4);
        if crc32fast::hash(body) != be_u32(sum) {
            return Err(corrupt(path, "header list checksum mismatch"));
        }
        let stored = be_u32(&b[9..13]);
        if stored != epoch_length {
            return Err(ArchiveError::EpochLengthMismatch {
                path: path.to_path_buf(),
                stored,
                requested: epoch_length,
            });
        }
        let count = be_u32(&b[13..17]) as usize;
        if body.len() != 17 + count.saturating_mul(HEADER_LEN) {
            return Err(corrupt(path, "header list length does not match its count"));
        }
        let mut headers: Vec<EpochHeader> = Vec::with_capacity(count);
        for (i, chunk) in body[17..].chunks_exact(HEADER_LEN).enumerate() {
            let h =
                EpochHeader::decode(chunk).ok_or_else(|| corrupt(path, "bad header version"))?;
            let (first, last) = epoch_range_of(i as u32, epoch_length);
            let prev = headers.last().map(EpochHeader::hash).unwrap_or([0; 32]);
            if h.epoch as usize != i
                || h.first_height != first
                || h.last_height != last
                || h.prev != prev
            {
                return Err(corrupt(
                    path,
                    "header list not a chain of consecutive epochs",
                ));
            }
            if h.check_shape().is_err() {
                return Err(corrupt(path, "header with an impossible shape"));
            }
            headers.push(h);
        }
        Ok(headers)
    }

    /// Opens epoch `want.epoch`'s file, checking its filter (kept in
    /// `filters` if it fits) and its layout.
    fn open_epoch_file(
        path: &Path,
        want: &EpochHeader,
        filters: &FilterCache,
    ) -> Result<EpochFile, ArchiveError> {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(corrupt(path, "sealed epoch file missing"))
            }
            Err(e) => {
                return Err(ArchiveError::Io {
                    path: path.to_path_buf(),
                    source: e,
                })
            }
        };
        let len = file.metadata().map_err(io_err(path))?.len();
        let pre = read_at(&file, path, 0, 94)?;
        if pre[..8] != EPOCH_FILE_MAGIC {
            return Err(corrupt(path, "bad magic"));
        }
        if pre[8] != FORMAT_VERSION {
            return Err(corrupt(path, "unsupported epoch file version"));
        }
        let header = EpochHeader::decode(&pre[9..90]).ok_or_else(|| corrupt(path, "bad header"))?;
        if header != *want {
            return Err(corrupt(
                path,
                "epoch file header differs from the header list",
            ));
        }
        let flen = be_u32(&pre[90..94]) as u64;
        if FILTER_AT + flen + 4 > len {
            return Err(corrupt(path, "filter length beyond the end of the file"));
        }
        let fb = read_at(&file, path, FILTER_AT, flen as usize + 4)?;
        let (fbytes, fsum) = fb.split_at(flen as usize);
        let filter_sum = be_u32(fsum);
        let filter = check_filter(path, &pre, fbytes, filter_sum)?;
        filters.get_or_load(&want.epoch, || Ok::<_, ArchiveError>(filter))?;
        let n = header.leaf_count;
        let offsets_at = 94 + flen + 4;
        let leaves_at = offsets_at + 8 * (u64::from(n) + 1);
        if leaves_at > len {
            return Err(corrupt(path, "offset table beyond the end of the file"));
        }
        let leaves_len = be_u64(&read_at(&file, path, offsets_at + 8 * u64::from(n), 8)?);
        let sizes = level_sizes(n);
        let total_nodes: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
        let nodes_at = leaves_at
            .checked_add(leaves_len)
            .ok_or_else(|| corrupt(path, "bad offsets"))?;
        if nodes_at.checked_add(32 * total_nodes + 4) != Some(len) {
            return Err(corrupt(path, "file length does not match its layout"));
        }
        let mut level_starts = Vec::with_capacity(sizes.len());
        let mut acc = 0u64;
        for s in &sizes {
            level_starts.push(acc);
            acc += u64::from(*s);
        }
        let root = read_at(&file, path, nodes_at + 32 * (total_nodes - 1), 32)?;
        if root[..] != header.root[..] {
            return Err(corrupt(path, "stored root differs from the header's"));
        }
        Ok(EpochFile {
            path: path.to_path_buf(),
            file,
            filter_len: flen,
            filter_sum,
            leaf_count: n,
            offsets_at,
            leaves_at,
            nodes_at,
            level_starts,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Epoch length L in blocks.
    pub fn epoch_length(&self) -> u32 {
        self.epoch_length
    }

    /// Number of sealed epochs (= the number the next seal must use).
    pub fn next_epoch(&self) -> u32 {
        self.headers.len() as u32
    }

    /// Heights `(first, last)` covered by epoch `n`: `[n·L, (n+1)·L − 1]`
    /// (saturating at `u32::MAX`).
    pub fn epoch_range(&self, n: u32) -> (u32, u32) {
        epoch_range_of(n, self.epoch_length)
    }

    /// The next epoch to seal if it is complete once blocks up to
    /// `final_height` are final (`epoch_range(next_epoch()).1 ≤
    /// final_height`), else `None`. The pipeline calls this after each
    /// final block and after a restart, sealing until it returns `None`.
    pub fn next_sealable(&self, final_height: u32) -> Option<u32> {
        let n = self.next_epoch();
        (self.epoch_range(n).1 <= final_height).then_some(n)
    }

    /// The epoch holding block height `height` (`height / L`).
    pub fn epoch_of_height(&self, height: u32) -> u32 {
        height / self.epoch_length
    }

    /// Headers of all sealed epochs, epoch 0 first.
    pub fn epochs(&self) -> &[EpochHeader] {
        &self.headers
    }

    /// The archive commitment over all sealed epochs (hash of the last
    /// header; 32 zero bytes when none is sealed).
    pub fn commitment(&self) -> [u8; 32] {
        commitment(&self.headers)
    }

    /// The filter of sealed epoch `n` (for serving and statistics), from
    /// the cache or its file; `None` when `n` is not sealed.
    ///
    /// # Errors
    /// [`ArchiveError::Io`]; [`ArchiveError::Corrupt`] naming the file
    /// when the filter read again differs from the one checked at open.
    pub fn filter(&self, n: u32) -> Result<Option<Arc<EpochFilter>>, ArchiveError> {
        self.files
            .get(n as usize)
            .map(|ef| self.epoch_filter(n, ef))
            .transpose()
    }

    /// Epoch `n`'s filter (`ef` its file), from the cache or read again.
    fn epoch_filter(&self, n: u32, ef: &EpochFile) -> Result<Arc<EpochFilter>, ArchiveError> {
        self.filters.get_or_load(&n, || {
            let b = read_at(&ef.file, &ef.path, 0, (FILTER_AT + ef.filter_len) as usize)?;
            let (pre, fbytes) = b.split_at(FILTER_AT as usize);
            check_filter(&ef.path, pre, fbytes, ef.filter_sum)
        })
    }

    /// Bytes of epoch filters held in memory: those in the cache, at most
    /// its budget (the filters take about 2.6 bytes per spent output of
    /// the archive: 18 bits per key and the filter's slack).
    pub fn filter_bytes(&self) -> usize {
        self.filters.bytes()
    }

    /// Path of sealed epoch `n`'s file.
    pub fn epoch_path(&self, n: u32) -> PathBuf {
        self.dir.join(epoch_file_name(n))
    }

    /// A builder for epoch `n`'s leaves, to be sealed by
    /// [`Archive::seal_built`]: it sorts with at most
    /// [`SEAL_MEMORY_BYTES`] in memory (`archive/seal.rs`).
    pub fn epoch_builder(&self, n: u32) -> EpochBuilder {
        EpochBuilder::new(&self.dir, n, self.epoch_range(n), SEAL_MEMORY_BYTES)
    }

    /// Seals epoch `n` from its leaves (the spent outputs of the final
    /// blocks of heights `epoch_range(n)`, any order): sorts them by
    /// outpoint between the two boundary leaves, builds the tree and the
    /// filter, writes the epoch file (tmp, fsync, rename, dir fsync), then
    /// the header list the same way. Deterministic: the same leaves give
    /// byte-identical files on every node. [`Archive::seal_built`] with
    /// every leaf pushed.
    ///
    /// Idempotent: sealing an already sealed epoch with the same leaves
    /// returns its header and writes nothing, so the pipeline can simply
    /// re-drive sealing after a restart.
    ///
    /// # Errors
    /// [`ArchiveError::EpochOutOfOrder`] if `n > next_epoch()`;
    /// [`ArchiveError::SealMismatch`] if `n` is sealed with other leaves;
    /// [`ArchiveError::LeafOutOfRange`], [`ArchiveError::DuplicateLeaf`],
    /// [`ArchiveError::ScriptTooLong`], [`ArchiveError::TooManyLeaves`] for
    /// bad input; [`ArchiveError::Io`] when writing fails (nothing is
    /// visible then; reopen and seal again).
    pub fn seal(&mut self, n: u32, leaves: Vec<Leaf>) -> Result<EpochHeader, ArchiveError> {
        self.check_order(n)?;
        if leaves.len() > MAX_EPOCH_LEAVES {
            return Err(ArchiveError::TooManyLeaves {
                epoch: n,
                count: leaves.len(),
                max: MAX_EPOCH_LEAVES,
            });
        }
        let mut b = self.epoch_builder(n);
        for leaf in leaves {
            b.push(leaf)?;
        }
        self.seal_built(b)
    }

    fn check_order(&self, n: u32) -> Result<(), ArchiveError> {
        let next = self.next_epoch();
        if n > next {
            return Err(ArchiveError::EpochOutOfOrder {
                expected: next,
                got: n,
            });
        }
        Ok(())
    }

    /// Seals the epoch whose leaves `b` collected (see [`Archive::seal`]).
    ///
    /// # Errors
    /// As [`Archive::seal`].
    pub fn seal_built(&mut self, b: EpochBuilder) -> Result<EpochHeader, ArchiveError> {
        let n = b.epoch;
        self.check_order(n)?;
        let next = self.next_epoch();
        let prev = match n.checked_sub(1) {
            Some(p) => self
                .headers
                .get(p as usize)
                .map(EpochHeader::hash)
                .unwrap_or([0; 32]),
            None => [0; 32],
        };
        let path = self.epoch_path(n);
        let tmp = path.with_extension("dat.tmp");
        let header = match seal::write_epoch(b, prev, &tmp) {
            Ok(h) => h,
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
        };
        if n < next {
            let _ = fs::remove_file(&tmp);
            return if header == self.headers[n as usize] {
                Ok(header)
            } else {
                Err(ArchiveError::SealMismatch { epoch: n })
            };
        }
        File::open(&tmp)
            .and_then(|f| durable::sync_file(&tmp, &f))
            .map_err(io_err(&tmp))?;
        durable::rename(&tmp, &path).map_err(io_err(&path))?;
        sync_dir(&self.dir)?;
        let mut all = Vec::clone(&self.headers);
        all.push(header);
        self.write_index(&all)?;
        let file = Self::open_epoch_file(&path, &header, &self.filters)?;
        self.headers = Arc::new(all);
        let mut files = Vec::clone(&self.files);
        files.push(Arc::new(file));
        self.files = Arc::new(files);
        Ok(header)
    }

    fn write_index(&self, headers: &[EpochHeader]) -> Result<(), ArchiveError> {
        let mut b = Vec::with_capacity(21 + HEADER_LEN * headers.len());
        b.extend_from_slice(&INDEX_FILE_MAGIC);
        b.push(FORMAT_VERSION);
        b.extend_from_slice(&self.epoch_length.to_be_bytes());
        b.extend_from_slice(&(headers.len() as u32).to_be_bytes());
        for h in headers {
            b.extend_from_slice(&h.encode());
        }
        let sum = crc32fast::hash(&b);
        b.extend_from_slice(&sum.to_be_bytes());
        write_atomic(&self.dir, &self.dir.join(INDEX_FILE), |w| w.write_all(&b))
    }

    /// Re-reads sealed epoch `n`'s file entirely: body checksum, every entry
    /// decodes, sits at its index, is in range and in order, and the stored
    /// tree and root equal the ones recomputed from the entries.
    ///
    /// # Errors
    /// [`ArchiveError::Corrupt`] naming the file, [`ArchiveError::Io`],
    /// [`ArchiveError::NoSuchEpoch`].
    pub fn verify_epoch_file(&self, n: u32) -> Result<(), ArchiveError> {
        let ef = self
            .files
            .get(n as usize)
            .ok_or(ArchiveError::NoSuchEpoch { epoch: n })?;
        let h = &self.headers[n as usize];
        let p = &ef.path;
        let all = fs::read(p).map_err(io_err(p))?;
        let body = all
            .get(ef.offsets_at as usize..all.len() - 4)
            .ok_or_else(|| corrupt(p, "truncated"))?;
        if crc32fast::hash(body) != be_u32(&all[all.len() - 4..]) {
            return Err(corrupt(p, "body checksum mismatch"));
        }
        let mut hashes = Vec::with_capacity(ef.leaf_count as usize);
        let mut prev: Option<TreeEntry> = None;
        for i in 0..ef.leaf_count {
            let e = self.entry_at(ef, i)?;
            if let TreeEntry::Spent { leaf, .. } = &e {
                if leaf.spend.height < h.first_height || leaf.spend.height > h.last_height {
                    return Err(corrupt(p, "leaf spent outside the epoch's heights"));
                }
                if prev
                    .as_ref()
                    .is_some_and(|q| q.cmp_key(&leaf.key()) != std::cmp::Ordering::Less)
                {
                    return Err(corrupt(p, "leaves not in outpoint order"));
                }
            }
            let ok = match &e {
                TreeEntry::LowerBound { .. } => i == 0,
                TreeEntry::UpperBound { .. } => i + 1 == ef.leaf_count,
                TreeEntry::Spent { .. } => i != 0 && i + 1 != ef.leaf_count,
            };
            if !ok {
                return Err(corrupt(p, "boundary leaf misplaced"));
            }
            hashes.push(leaf_hash(&e.encode()));
            prev = Some(e);
        }
        let levels = build_levels(hashes);
        let mut at = ef.nodes_at as usize;
        for level in &levels {
            for node in level {
                if all.get(at..at + 32) != Some(&node[..]) {
                    return Err(corrupt(
                        p,
                        "stored tree node differs from the recomputed one",
                    ));
                }
                at += 32;
            }
        }
        if levels[levels.len() - 1][0] != h.root {
            return Err(corrupt(p, "recomputed root differs from the header's"));
        }
        Ok(())
    }

    fn entry_at(&self, ef: &EpochFile, i: u32) -> Result<TreeEntry, ArchiveError> {
        let o = read_at(&ef.file, &ef.path, ef.offsets_at + 8 * u64::from(i), 16)?;
        let (a, b) = (be_u64(&o[..8]), be_u64(&o[8..]));
        if b < a || b - a > MAX_ENTRY_LEN as u64 {
            return Err(corrupt(&ef.path, "bad leaf offsets"));
        }
        let bytes = read_at(&ef.file, &ef.path, ef.leaves_at + a, (b - a) as usize)?;
        let e = TreeEntry::decode(&bytes).map_err(|_| corrupt(&ef.path, "leaf does not decode"))?;
        if e.index() != i {
            return Err(corrupt(&ef.path, "leaf index differs from its position"));
        }
        Ok(e)
    }

    fn node_at(&self, ef: &EpochFile, level: u8, index: u32) -> Result<NodeHash, ArchiveError> {
        let start = ef
            .level_starts
            .get(level as usize)
            .ok_or_else(|| corrupt(&ef.path, "level out of range"))?;
        let b = read_at(
            &ef.file,
            &ef.path,
            ef.nodes_at + 32 * (start + u64::from(index)),
            32,
        )?;
        let mut h = [0u8; 32];
        h.copy_from_slice(&b);
        Ok(h)
    }

    /// Binary search of epoch `ef` for `key`: `Ok((index, entry))` if held,
    /// else `Err(low)` with leaves `low < key < low + 1`.
    fn search(&self, ef: &EpochFile, key: &[u8; 36]) -> Result<SearchResult, ArchiveError> {
        let (mut lo, mut hi) = (0u32, ef.leaf_count - 1);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            let e = self.entry_at(ef, mid)?;
            match e.cmp_key(key) {
                std::cmp::Ordering::Less => lo = mid,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(Ok((mid, e))),
            }
        }
        Ok(Err(lo))
    }

    /// Sealed epochs whose filter may hold `outpoint` (no false negatives;
    /// false positives at the filter's rate).
    ///
    /// # Errors
    /// As [`Archive::filter`], for a filter read again from its file.
    pub fn candidate_epochs(&self, outpoint: &OutPoint) -> Result<Vec<u32>, ArchiveError> {
        let k = filter_key(&outpoint_key(outpoint));
        let mut out = Vec::new();
        for (i, ef) in self.files.iter().enumerate() {
            if self.epoch_filter(i as u32, ef)?.may_contain(k) {
                out.push(i as u32);
            }
        }
        Ok(out)
    }

    /// The sealed leaf of `outpoint` and its epoch, if archived.
    ///
    /// # Errors
    /// [`ArchiveError::Io`] / [`ArchiveError::Corrupt`] reading epoch files.
    pub fn lookup(&self, outpoint: &OutPoint) -> Result<Option<(u32, Leaf)>, ArchiveError> {
        let key = outpoint_key(outpoint);
        for e in self.candidate_epochs(outpoint)? {
            if let Ok((_, TreeEntry::Spent { leaf, .. })) =
                self.search(&self.files[e as usize], &key)?
            {
                return Ok(Some((e, leaf)));
            }
        }
        Ok(None)
    }

    /// The archive's half of an outpoint's status: [`OutpointStatus::Archived`]
    /// or [`OutpointStatus::Unknown`] (the caller fills `Unspent` and
    /// `SpentNotSealed` from the UTXO table first).
    ///
    /// # Errors
    /// As [`Archive::lookup`].
    pub fn status(&self, outpoint: &OutPoint) -> Result<OutpointStatus, ArchiveError> {
        Ok(match self.lookup(outpoint)? {
            Some((epoch, _)) => OutpointStatus::Archived { epoch },
            None => OutpointStatus::Unknown,
        })
    }

    /// Proves each outpoint against the archive commitment: existence in
    /// the epoch holding it, or non-existence in every sealed epoch. Shared
    /// nodes are sent once. Verify with [`Anchor::Commitment`].
    ///
    /// # Errors
    /// [`ArchiveError::BadRequest`] for an empty, oversized (>
    /// [`MAX_ITEMS`]) or duplicated request; I/O and corruption errors; a
    /// proof that fails its own verification is never returned
    /// ([`ArchiveError::SelfCheck`]).
    pub fn prove(&self, outpoints: &[OutPoint]) -> Result<ProofBatch, ArchiveError> {
        self.prove_impl(outpoints, None, None)
    }

    /// As [`Archive::prove`], attaching to each existence proof the
    /// txoutproof `txoutproof(spend block hash, spending txid)` returns (the
    /// caller reads the block from its store).
    ///
    /// # Errors
    /// As [`Archive::prove`]; a txoutproof that does not check makes the
    /// self-check fail.
    pub fn prove_with(
        &self,
        outpoints: &[OutPoint],
        txoutproof: TxOutProofFn<'_>,
    ) -> Result<ProofBatch, ArchiveError> {
        self.prove_impl(outpoints, None, Some(txoutproof))
    }

    /// Proves each outpoint in sealed epoch `epoch` only (existence there,
    /// or non-existence there). Verify with [`Anchor::EpochRoot`] of that
    /// epoch's root.
    ///
    /// # Errors
    /// As [`Archive::prove`], and [`ArchiveError::NoSuchEpoch`].
    pub fn prove_in_epoch(
        &self,
        outpoints: &[OutPoint],
        epoch: u32,
        txoutproof: Option<TxOutProofFn<'_>>,
    ) -> Result<ProofBatch, ArchiveError> {
        if epoch >= self.next_epoch() {
            return Err(ArchiveError::NoSuchEpoch { epoch });
        }
        self.prove_impl(outpoints, Some(epoch), txoutproof)
    }

    fn prove_impl(
        &self,
        outpoints: &[OutPoint],
        only: Option<u32>,
        txoutproof: Option<TxOutProofFn<'_>>,
    ) -> Result<ProofBatch, ArchiveError> {
        check_request(outpoints)?;
        let scope: Vec<u32> = match only {
            Some(e) => vec![e],
            None => (0..self.next_epoch()).collect(),
        };
        let mut leaves = EpochLeaves::new();
        let mut items = Vec::with_capacity(outpoints.len());
        let mut any_absent = false;
        let mut min_spent = u32::MAX;
        for op in outpoints {
            let key = outpoint_key(op);
            let item = match self.find_spent(op, &key, only)? {
                Some((epoch, index, entry)) => {
                    let txoutproof = match (&entry, txoutproof) {
                        (TreeEntry::Spent { leaf, .. }, Some(f)) => {
                            f(&leaf.spend.block_hash, &leaf.spend.txid)
                        }
                        _ => None,
                    };
                    leaves.entry(epoch).or_default().insert(index, entry);
                    min_spent = min_spent.min(epoch);
                    ProofItem::Spent {
                        outpoint: *op,
                        epoch,
                        index,
                        txoutproof,
                    }
                }
                None => {
                    any_absent = true;
                    let gaps = self.gaps(&key, &scope, &mut leaves)?;
                    ProofItem::Absent {
                        outpoint: *op,
                        gaps,
                    }
                }
            };
            items.push(item);
        }
        let headers: Vec<EpochHeader> = match only {
            Some(e) => vec![self.headers[e as usize]],
            None => {
                let from = if any_absent { 0 } else { min_spent };
                self.headers
                    .get(from as usize..)
                    .map(<[EpochHeader]>::to_vec)
                    .unwrap_or_default()
            }
        };
        let batch = ProofBatch {
            headers,
            epochs: self.epoch_proofs(leaves)?,
            items,
        };
        let anchor = match only {
            Some(e) => Anchor::EpochRoot(self.headers[e as usize].root),
            None => Anchor::Commitment(self.commitment()),
        };
        verify(&batch, anchor).map_err(|source| ArchiveError::SelfCheck {
            dir: self.dir.to_path_buf(),
            source: Box::new(source),
        })?;
        Ok(batch)
    }

    /// The epoch, leaf index and entry of spent outpoint `op` (whose key is
    /// `key`), searched in the epochs its filters may hold (only epoch
    /// `only` when given); `None` when no epoch holds it.
    ///
    /// # Errors
    /// [`ArchiveError`] when an epoch file cannot be read.
    fn find_spent(
        &self,
        op: &OutPoint,
        key: &[u8; 36],
        only: Option<u32>,
    ) -> Result<Option<(u32, u32, TreeEntry)>, ArchiveError> {
        for e in self.candidate_epochs(op)? {
            if only.is_some_and(|o| o != e) {
                continue;
            }
            if let Ok((idx, entry)) = self.search(&self.files[e as usize], key)? {
                return Ok(Some((e, idx, entry)));
            }
        }
        Ok(None)
    }

    /// The gap where absent `key` would sit in each epoch of `scope`: the
    /// two neighbouring leaves, added to `leaves` for the proof.
    ///
    /// # Errors
    /// [`ArchiveError`] when an epoch file cannot be read, or is corrupt
    /// (its filter missed a key it holds).
    fn gaps(
        &self,
        key: &[u8; 36],
        scope: &[u32],
        leaves: &mut EpochLeaves,
    ) -> Result<Vec<Gap>, ArchiveError> {
        let mut gaps = Vec::with_capacity(scope.len());
        for &e in scope {
            let ef = &self.files[e as usize];
            let low = match self.search(ef, key)? {
                Err(low) => low,
                // The filter missed a held key: impossible unless the file
                // or filter is damaged.
                Ok(_) => {
                    return Err(corrupt(
                        &ef.path,
                        "filter does not hold a key the epoch holds",
                    ))
                }
            };
            let m = leaves.entry(e).or_default();
            for i in [low, low + 1] {
                if let std::collections::btree_map::Entry::Vacant(v) = m.entry(i) {
                    v.insert(self.entry_at(ef, i)?);
                }
            }
            gaps.push(Gap { epoch: e, low });
        }
        Ok(gaps)
    }

    /// Each epoch's proven leaves with the tree nodes that link them to
    /// the epoch's root.
    ///
    /// # Errors
    /// [`ArchiveError`] when an epoch file cannot be read or a leaf index
    /// is out of its range.
    fn epoch_proofs(&self, leaves: EpochLeaves) -> Result<Vec<EpochProof>, ArchiveError> {
        let mut epochs = Vec::with_capacity(leaves.len());
        for (e, entries) in leaves {
            let ef = &self.files[e as usize];
            let idx: Vec<u32> = entries.keys().copied().collect();
            let need = needed_nodes(ef.leaf_count, &idx)
                .map_err(|_| corrupt(&ef.path, "leaf index out of range"))?;
            let mut nodes = Vec::with_capacity(need.len());
            for (level, index) in need {
                nodes.push(ProofNode {
                    level,
                    index,
                    hash: self.node_at(ef, level, index)?,
                });
            }
            epochs.push(EpochProof {
                epoch: e,
                entries: entries.into_values().collect(),
                nodes,
            });
        }
        Ok(epochs)
    }
}

/// The leaves a proof batch carries: epoch → leaf index → entry.
type EpochLeaves = BTreeMap<u32, BTreeMap<u32, TreeEntry>>;

/// Checks a proof request: 1..=[`MAX_ITEMS`] outpoints, none twice.
///
/// # Errors
/// [`ArchiveError::BadRequest`], [`ArchiveError::DuplicateOutpoint`].
fn check_request(outpoints: &[OutPoint]) -> Result<(), ArchiveError> {
    if outpoints.is_empty() || outpoints.len() > MAX_ITEMS {
        return Err(ArchiveError::BadRequest {
            count: outpoints.len(),
            max: MAX_ITEMS,
        });
    }
    let mut seen = std::collections::HashSet::with_capacity(outpoints.len());
    if let Some(o) = outpoints.iter().find(|o| !seen.insert(**o)) {
        return Err(ArchiveError::DuplicateOutpoint { outpoint: *o });
    }
    Ok(())
}

/// The filter stored as `fbytes` after the epoch file's first bytes `pre`,
/// checked against `sum` (the CRC-32 of both, as stored in the file and
/// checked at open).
///
/// # Errors
/// [`ArchiveError::Corrupt`] naming `path`.
fn check_filter(
    path: &Path,
    pre: &[u8],
    fbytes: &[u8],
    sum: u32,
) -> Result<EpochFilter, ArchiveError> {
    let mut crc = crc32fast::Hasher::new();
    crc.update(pre);
    crc.update(fbytes);
    if crc.finalize() != sum {
        return Err(corrupt(path, "header/filter checksum mismatch"));
    }
    EpochFilter::from_bytes(fbytes).map_err(|r| corrupt(path, r))
}

/// `[n·L, (n+1)·L − 1]`, saturating.
pub fn epoch_range_of(n: u32, epoch_length: u32) -> (u32, u32) {
    let first = n.saturating_mul(epoch_length);
    let last = (n.saturating_add(1))
        .saturating_mul(epoch_length)
        .saturating_sub(1);
    (first, last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::leaf::Spend;
    use crate::archive::VerifiedStatus;
    use crate::store::byte_cache::ENTRY_OVERHEAD;
    use bitcoin::hashes::Hash;
    use bitcoin::ScriptBuf;

    fn leaf(tag: u8, vout: u32, height: u32) -> Leaf {
        Leaf {
            outpoint: OutPoint {
                txid: Txid::from_byte_array([tag; 32]),
                vout,
            },
            value: u64::from(tag) * 1000,
            script_pubkey: ScriptBuf::from_bytes(vec![0x51; usize::from(tag % 5)]),
            creation_height: height.saturating_sub(1),
            spend: Spend {
                block_hash: BlockHash::from_byte_array([height as u8; 32]),
                height,
                txid: Txid::from_byte_array([tag ^ 0xff; 32]),
                vin: vout,
            },
        }
    }

    /// The filters held in memory: about 2.25 bytes per spent output (18
    /// bits per key, plus the cache entry's overhead), the same after a
    /// reopen, nothing for an empty epoch.
    #[test]
    fn filter_bytes_count_each_sealed_epochs_filter() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Archive::open(dir.path(), 10).unwrap();
        assert_eq!(a.filter_bytes(), 0);
        a.seal(0, vec![]).unwrap();
        assert_eq!(a.filter_bytes(), ENTRY_OVERHEAD);
        let leaves: Vec<Leaf> = (0..20_000u32).map(|v| leaf(1, v, 15)).collect();
        a.seal(1, leaves).unwrap();
        let bytes = a.filter_bytes();
        assert!((40_000..=50_000).contains(&bytes), "{bytes}");
        let fp = a.filter(1).unwrap().unwrap().fingerprints() * 2;
        assert_eq!(bytes, fp + 2 * ENTRY_OVERHEAD);
        assert_eq!(Archive::open(dir.path(), 10).unwrap().filter_bytes(), bytes);
    }

    /// Small and degenerate epochs (0, 1, 2, 3 leaves): every leaf has an
    /// existence proof, keys between and around them absence proofs.
    #[test]
    fn tiny_epochs_prove_and_verify() {
        let dir = std::env::temp_dir().join(format!("kakehi-archive-unit-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mut a = Archive::open(&dir, 10).unwrap();
        assert_eq!(a.next_sealable(8), None);
        assert_eq!(a.next_sealable(9), Some(0));
        let sets: Vec<Vec<Leaf>> = vec![
            vec![],
            vec![leaf(5, 0, 12)],
            vec![leaf(9, 1, 25), leaf(3, 0, 20)],
            vec![leaf(7, 2, 30), leaf(7, 1, 31), leaf(200, 0, 39)],
        ];
        for (n, s) in sets.iter().enumerate() {
            let h = a.seal(n as u32, s.clone()).unwrap();
            assert_eq!(h.leaf_count as usize, s.len() + 2);
            a.verify_epoch_file(n as u32).unwrap();
        }
        let c = Anchor::Commitment(a.commitment());
        for s in &sets {
            for l in s {
                let p = a.prove(&[l.outpoint]).unwrap();
                let v = verify(&p, c).unwrap();
                assert!(
                    matches!(v.status(&l.outpoint), Some(VerifiedStatus::Spent { leaf, .. }) if leaf == l)
                );
            }
        }
        let absent: Vec<OutPoint> = [(0u8, 0u32), (5, 1), (7, 0), (7, 3), (8, 0), (255, 9)]
            .iter()
            .map(|&(t, v)| OutPoint {
                txid: Txid::from_byte_array([t; 32]),
                vout: v,
            })
            .collect();
        let p = a.prove(&absent).unwrap();
        let v = verify(&ProofBatch::from_bytes(&p.to_bytes()).unwrap(), c).unwrap();
        for o in &absent {
            assert!(
                matches!(v.status(o), Some(VerifiedStatus::Absent { epochs }) if epochs == &vec![0, 1, 2, 3])
            );
        }
        // Empty archive: commitment zero, absence in no epoch.
        let d2 = dir.join("empty");
        let e = Archive::open(&d2, 10).unwrap();
        assert_eq!(e.commitment(), [0; 32]);
        let p = e.prove(&absent[..1]).unwrap();
        assert!(verify(&p, Anchor::Commitment([0; 32])).is_ok());
        assert!(matches!(e.prove(&[]), Err(ArchiveError::BadRequest { .. })));
        assert!(matches!(
            a.prove(&[absent[0], absent[0]]),
            Err(ArchiveError::DuplicateOutpoint { .. })
        ));
        assert!(matches!(
            a.seal(4, vec![leaf(1, 0, 40), leaf(1, 0, 41)]),
            Err(ArchiveError::DuplicateLeaf { .. })
        ));
        let _ = fs::remove_dir_all(&dir);
    }
}
