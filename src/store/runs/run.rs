//! One run: an immutable file of sorted, distinct fixed-size keys, written
//! once ([`RunWriter`]), fsynced, then read by positional reads ([`Run`]).
//!
//! Layout (integers big-endian):
//!
//! | part | bytes |
//! | --- | --- |
//! | header | magic `KKHROWS1` (8) ‖ version u32 (1) ‖ key length u32 ‖ key count u64 ‖ keys per block u32 ‖ filter bytes u32 (32 in all) |
//! | keys | count × key length, ascending, distinct, in blocks of [`BLOCK_KEYS`] keys (the last one shorter) |
//! | block index | per block: its first key ‖ CRC-32 of the block's bytes (u32) |
//! | filter | [`Bloom`] over the keys' first 8 bytes |
//! | trailer | CRC-32 of the header, block index and filter (u32) |
//!
//! Opening reads the header, checks the file's size against it, and reads
//! the block index and filter (about 1/200 and 1/13 of the keys' bytes)
//! in chunks, checking the trailer's CRC: no key is read. It keeps only a
//! summary: the CRC-32 of every partition of the block index and of the
//! filter (about [`PART_BYTES`] each) and the first key of every index
//! partition, about 0.1 % of what it read. Lookups read the partitions
//! they need through the store's [`PartCache`] (a byte budget,
//! `index.filter_cache_mib`), checking each against its CRC when it is
//! read from the file. So a run's memory does not grow with its rows, and
//! the partitions in memory are bounded by the cache's budget, as
//! RocksDB's partitioned index and filter blocks in its block cache.
//! Each block of keys' CRC is checked when it is read, so a flipped byte
//! among the keys, or in a partition changed after open, shows as
//! [`RunError::Corrupt`] naming the file at its first read.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use super::bloom::{self, Bloom, BLOCK_BYTES};
use super::error::RunError;
use crate::store::byte_cache::ByteCache;
use crate::store::durable;
use crate::store::fault::{self, IoOp};

/// Magic of a run file.
const MAGIC: &[u8; 8] = b"KKHROWS1";
/// Version of the layout.
const VERSION: u32 = 1;
/// Bytes of the header.
const HEADER: usize = 32;
/// Keys per block: 4 KiB of 16-byte keys, 5 KiB of 20-byte keys.
pub const BLOCK_KEYS: usize = 256;

/// Bytes of a partition of a run's filter (64 filter blocks), and at most
/// that of its block index (whole entries): the unit read from the file
/// and cached.
pub const PART_BYTES: usize = 4096;

/// Which part of a run's tail a partition belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Part {
    /// The block index (first key ‖ CRC-32 per block of keys).
    Index,
    /// The filter.
    Filter,
}

/// Key of a cached partition: the run's number (unique in a store: one
/// counter for the three sets), the part, the partition's number.
pub type PartKey = (u64, Part, u32);

/// The cache of run partitions a row store shares among its runs.
pub type PartCache = ByteCache<PartKey, Vec<u8>>;

/// The first 8 bytes of a key, the filter's and every lookup's prefix.
pub fn prefix_u64(key: &[u8]) -> u64 {
    let mut p = [0u8; 8];
    p.copy_from_slice(&key[..8]);
    u64::from_be_bytes(p)
}

/// Writes one run file: keys given in ascending order, each once.
pub struct RunWriter<const N: usize> {
    path: PathBuf,
    out: BufWriter<File>,
    block: Vec<u8>,
    index: Vec<u8>,
    bloom: Bloom,
    last: Option<[u8; N]>,
    count: u64,
}

impl<const N: usize> RunWriter<N> {
    /// Creates `path` (which must not exist) for at most `capacity` keys
    /// (sizes the filter).
    ///
    /// # Errors
    /// [`RunError::Io`] naming `path`.
    pub fn create(path: &Path, capacity: usize) -> Result<Self, RunError> {
        let io = RunError::io(path);
        fault::check(IoOp::Write, path).map_err(&io)?;
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(&io)?;
        let mut out = BufWriter::with_capacity(1 << 16, file);
        out.write_all(&[0u8; HEADER]).map_err(&io)?;
        Ok(RunWriter {
            path: path.to_path_buf(),
            out,
            block: Vec::with_capacity(BLOCK_KEYS * N),
            index: Vec::new(),
            bloom: Bloom::with_capacity(capacity),
            last: None,
            count: 0,
        })
    }

    /// Appends `key` (greater than the previous key; an equal key is
    /// skipped).
    ///
    /// # Errors
    /// [`RunError::Io`].
    pub fn push(&mut self, key: &[u8; N]) -> Result<(), RunError> {
        if let Some(last) = &self.last {
            if key <= last {
                return Ok(());
            }
        }
        if self.block.is_empty() {
            self.index.extend_from_slice(key);
        }
        self.block.extend_from_slice(key);
        self.bloom.insert(prefix_u64(key));
        self.last = Some(*key);
        self.count += 1;
        if self.block.len() == BLOCK_KEYS * N {
            self.end_block()?;
        }
        Ok(())
    }

    fn end_block(&mut self) -> Result<(), RunError> {
        self.index
            .extend_from_slice(&crc32fast::hash(&self.block).to_be_bytes());
        self.out
            .write_all(&self.block)
            .map_err(RunError::io(&self.path))?;
        self.block.clear();
        Ok(())
    }

    /// Writes the block index, filter, trailer and header, and fsyncs the
    /// file. Returns the run, open for reading through `cache`.
    ///
    /// # Errors
    /// [`RunError::Io`] naming the file (the caller deletes it).
    pub fn finish(mut self, number: u64, cache: &Arc<PartCache>) -> Result<Run<N>, RunError> {
        if !self.block.is_empty() {
            self.end_block()?;
        }
        let path = std::mem::take(&mut self.path);
        let io = RunError::io(&path);
        let header = header(N, self.count, self.bloom.as_bytes().len());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&header);
        crc.update(&self.index);
        crc.update(self.bloom.as_bytes());
        fault::check(IoOp::Write, &path).map_err(&io)?;
        self.out.write_all(&self.index).map_err(&io)?;
        self.out.write_all(self.bloom.as_bytes()).map_err(&io)?;
        self.out
            .write_all(&crc.finalize().to_be_bytes())
            .map_err(&io)?;
        let file = self.out.into_inner().map_err(|e| io(e.into_error()))?;
        file.write_all_at(&header, 0).map_err(&io)?;
        durable::sync_file(&path, &file).map_err(&io)?;
        drop(io);
        let mut summary = Summary::default();
        summary.add_index(&self.index);
        summary.add_filter(self.bloom.as_bytes());
        let keys_end = HEADER as u64 + self.count * N as u64;
        Ok(Run {
            path,
            number,
            file,
            count: self.count,
            blocks: self.index.len() / entry::<N>(),
            index_at: keys_end,
            filter_at: keys_end + self.index.len() as u64,
            filter_len: self.bloom.as_bytes().len(),
            summary,
            cache: cache.clone(),
        })
    }
}

fn header(key_len: usize, count: u64, bloom_len: usize) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_be_bytes());
    h[12..16].copy_from_slice(&(key_len as u32).to_be_bytes());
    h[16..24].copy_from_slice(&count.to_be_bytes());
    h[24..28].copy_from_slice(&(BLOCK_KEYS as u32).to_be_bytes());
    h[28..32].copy_from_slice(&(bloom_len as u32).to_be_bytes());
    h
}

/// What an open run keeps of its block index and filter: each
/// partition's CRC-32, and each index partition's first key.
#[derive(Debug, Default)]
struct Summary<const N: usize> {
    index_crcs: Vec<u32>,
    fences: Vec<[u8; N]>,
    filter_crcs: Vec<u32>,
}

impl<const N: usize> Summary<N> {
    /// Adds index partitions (`bytes` starts at a partition's start).
    fn add_index(&mut self, bytes: &[u8]) {
        for p in bytes.chunks(index_part_len::<N>()) {
            self.index_crcs.push(crc32fast::hash(p));
            let mut fence = [0u8; N];
            // Every partition holds whole entries of N + 4 bytes.
            fence.copy_from_slice(&p[..N]);
            self.fences.push(fence);
        }
    }

    /// Adds filter partitions (`bytes` starts at a partition's start).
    fn add_filter(&mut self, bytes: &[u8]) {
        for p in bytes.chunks(PART_BYTES) {
            self.filter_crcs.push(crc32fast::hash(p));
        }
    }

    fn bytes(&self) -> usize {
        (self.index_crcs.len() + self.filter_crcs.len()) * 4 + self.fences.len() * N
    }
}

/// An open run file: a summary of its block index and filter in memory
/// (their partitions read through the store's cache), keys read by
/// positional reads.
#[derive(Debug)]
pub struct Run<const N: usize> {
    path: PathBuf,
    number: u64,
    file: File,
    count: u64,
    blocks: usize,
    /// Offset of the block index in the file.
    index_at: u64,
    /// Offset and bytes of the filter in the file.
    filter_at: u64,
    filter_len: usize,
    summary: Summary<N>,
    cache: Arc<PartCache>,
}

/// Bytes of one block index entry.
const fn entry<const N: usize>() -> usize {
    N + 4
}

/// Bytes of an index partition: the whole entries that fit [`PART_BYTES`].
const fn index_part_len<const N: usize>() -> usize {
    PART_BYTES / entry::<N>() * entry::<N>()
}

/// Reads `len` bytes of `file` from `at` in chunks of `chunk` bytes (a
/// multiple of the partition size), giving each to the CRC and to `each`.
fn read_chunks(
    file: &File,
    path: &Path,
    (at, len): (u64, u64),
    chunk: usize,
    crc: &mut crc32fast::Hasher,
    each: &mut dyn FnMut(&[u8]),
) -> Result<(), RunError> {
    let mut buf = vec![0u8; chunk.min(len as usize)];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(chunk as u64) as usize;
        file.read_exact_at(&mut buf[..n], at + done)
            .map_err(RunError::io(path))?;
        crc.update(&buf[..n]);
        each(&buf[..n]);
        done += n as u64;
    }
    Ok(())
}

impl<const N: usize> Run<N> {
    /// Opens the run file `path` (number `number` in the manifest),
    /// checking its header, size and trailer CRC; its partitions are read
    /// later through `cache`.
    ///
    /// # Errors
    /// [`RunError::Io`], or [`RunError::Corrupt`] naming the file.
    pub fn open(path: &Path, number: u64, cache: &Arc<PartCache>) -> Result<Self, RunError> {
        let io = RunError::io(path);
        let bad = |reason| RunError::corrupt(path, reason);
        let file = File::open(path).map_err(&io)?;
        let len = file.metadata().map_err(&io)?.len();
        let mut h = [0u8; HEADER];
        if len < HEADER as u64 {
            return Err(bad("shorter than its header"));
        }
        file.read_exact_at(&mut h, 0).map_err(&io)?;
        let u32_at = |i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        if &h[..8] != MAGIC || u32_at(8) != VERSION {
            return Err(bad("bad magic or version"));
        }
        if u32_at(12) as usize != N || u32_at(24) as usize != BLOCK_KEYS {
            return Err(bad("key length or block size not this tree's"));
        }
        let count = u64::from_be_bytes(h[16..24].try_into().unwrap_or_default());
        let filter_len = u32_at(28) as u64;
        let blocks = count.div_ceil(BLOCK_KEYS as u64);
        // Sizes are checked against the file's length before any is
        // allocated: a damaged header cannot ask for more than the file.
        let keys_end = count
            .checked_mul(N as u64)
            .and_then(|b| b.checked_add(HEADER as u64))
            .ok_or(bad("count overflows"))?;
        let index_len = blocks
            .checked_mul(entry::<N>() as u64)
            .ok_or(bad("count overflows"))?;
        let tail = index_len
            .checked_add(filter_len + 4)
            .ok_or(bad("count overflows"))?;
        if keys_end.checked_add(tail) != Some(len) {
            return Err(bad("file size does not match its header"));
        }
        if filter_len == 0 || !(filter_len as usize).is_multiple_of(BLOCK_BYTES) {
            return Err(bad("bad filter length"));
        }
        let mut crc = crc32fast::Hasher::new();
        crc.update(&h);
        let mut summary = Summary::default();
        let index = (keys_end, index_len);
        read_chunks(
            &file,
            path,
            index,
            index_part_len::<N>() * 64,
            &mut crc,
            &mut |b| summary.add_index(b),
        )?;
        let filter = (keys_end + index_len, filter_len);
        read_chunks(&file, path, filter, PART_BYTES * 64, &mut crc, &mut |b| {
            summary.add_filter(b)
        })?;
        let mut trailer = [0u8; 4];
        file.read_exact_at(&mut trailer, len - 4).map_err(&io)?;
        if crc.finalize().to_be_bytes() != trailer {
            return Err(bad("trailer checksum mismatch"));
        }
        Ok(Run {
            path: path.to_path_buf(),
            number,
            file,
            count,
            blocks: blocks as usize,
            index_at: keys_end,
            filter_at: keys_end + index_len,
            filter_len: filter_len as usize,
            summary,
            cache: cache.clone(),
        })
    }

    /// Its number in the manifest.
    pub fn number(&self) -> u64 {
        self.number
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of keys.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Bytes of the file.
    pub fn bytes(&self) -> u64 {
        HEADER as u64
            + self.count * N as u64
            + (self.blocks * entry::<N>()) as u64
            + self.filter_len as u64
            + 4
    }

    /// Bytes this run holds in memory while open, outside the cache: the
    /// CRC-32 of each partition of its block index and filter and the
    /// first key of each index partition, about 1/1000 of those parts
    /// (0.0014 bytes per key; the keys, the block index and the filter
    /// stay on disk, their partitions in the cache while used).
    pub fn resident_bytes(&self) -> usize {
        self.summary.bytes()
    }

    /// Bytes of its block index and filter on disk (what the cache may
    /// hold of it).
    pub fn tail_bytes(&self) -> usize {
        self.blocks * entry::<N>() + self.filter_len
    }

    /// Partition `i` of `part`, from the cache or else read from the file
    /// and checked against its CRC.
    ///
    /// # Errors
    /// [`RunError::Io`]; [`RunError::Corrupt`] naming the file when the
    /// partition does not match its CRC taken at open, or the file got
    /// shorter.
    fn part(&self, part: Part, i: usize) -> Result<Arc<Vec<u8>>, RunError> {
        let (at, len, part_len, crcs) = match part {
            Part::Index => (
                self.index_at,
                self.blocks * entry::<N>(),
                index_part_len::<N>(),
                &self.summary.index_crcs,
            ),
            Part::Filter => (
                self.filter_at,
                self.filter_len,
                PART_BYTES,
                &self.summary.filter_crcs,
            ),
        };
        let bad = |reason| RunError::corrupt(&self.path, reason);
        let crc = *crcs.get(i).ok_or(bad("partition out of range"))?;
        let start = i * part_len;
        let n = part_len.min(len - start);
        self.cache.get_or_load(&(self.number, part, i as u32), || {
            let mut buf = vec![0u8; n];
            self.file
                .read_exact_at(&mut buf, at + start as u64)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => bad("file shorter than at open"),
                    _ => RunError::io(&self.path)(e),
                })?;
            if crc32fast::hash(&buf) != crc {
                return Err(bad(
                    "filter or block index differs from its checksum at open",
                ));
            }
            Ok(buf)
        })
    }

    /// Whether a key starting with the 8-byte `prefix` may be here: one
    /// filter block, from its cached partition.
    ///
    /// # Errors
    /// As [`Run::part`].
    pub fn may_contain(&self, prefix: u64) -> Result<bool, RunError> {
        let block = bloom::block_of(prefix, self.filter_len / BLOCK_BYTES);
        let at = block * BLOCK_BYTES;
        let part = self.part(Part::Filter, at / PART_BYTES)?;
        let bytes = part
            .get(at % PART_BYTES..)
            .and_then(|b| b.get(..BLOCK_BYTES))
            .ok_or(RunError::corrupt(&self.path, "filter block out of range"))?;
        Ok(bloom::block_may_contain(bytes, prefix))
    }

    /// Number of blocks.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Block `block`'s index entry: its first key and CRC-32.
    ///
    /// # Errors
    /// As [`Run::part`].
    fn index_entry(&self, block: usize) -> Result<([u8; N], [u8; 4]), RunError> {
        let per_part = index_part_len::<N>() / entry::<N>();
        let part = self.part(Part::Index, block / per_part)?;
        let at = (block % per_part) * entry::<N>();
        let e = part.get(at..at + entry::<N>()).ok_or(RunError::corrupt(
            &self.path,
            "block index entry out of range",
        ))?;
        let (mut key, mut crc) = ([0u8; N], [0u8; 4]);
        key.copy_from_slice(&e[..N]);
        crc.copy_from_slice(&e[N..]);
        Ok((key, crc))
    }

    fn first_key(&self, block: usize) -> Result<[u8; N], RunError> {
        self.index_entry(block).map(|(k, _)| k)
    }

    /// The keys of block `block`, checked against its CRC.
    ///
    /// # Errors
    /// [`RunError::Io`], [`RunError::Corrupt`] naming the file.
    pub fn read_block(&self, block: usize) -> Result<Vec<[u8; N]>, RunError> {
        let start = (block * BLOCK_KEYS) as u64;
        let keys = (self.count - start).min(BLOCK_KEYS as u64) as usize;
        let mut buf = vec![0u8; keys * N];
        self.file
            .read_exact_at(&mut buf, HEADER as u64 + start * N as u64)
            .map_err(RunError::io(&self.path))?;
        let (_, crc) = self.index_entry(block)?;
        if crc32fast::hash(&buf).to_be_bytes() != crc {
            return Err(RunError::corrupt(&self.path, "block checksum mismatch"));
        }
        let mut out = Vec::with_capacity(keys);
        for k in buf.chunks_exact(N) {
            let mut a = [0u8; N];
            a.copy_from_slice(k);
            out.push(a);
        }
        if out.windows(2).any(|w| w[0] >= w[1]) {
            return Err(RunError::corrupt(&self.path, "keys out of order"));
        }
        Ok(out)
    }

    /// The block that would hold `key`: the last whose first key is at
    /// most `key` (0 when `key` is below every key). Reads one index
    /// partition: the last whose first key is at most `key`.
    ///
    /// # Errors
    /// As [`Run::part`].
    pub fn block_of(&self, key: &[u8]) -> Result<usize, RunError> {
        if self.blocks == 0 {
            return Ok(0);
        }
        let fences = &self.summary.fences;
        let p = fences.partition_point(|f| &f[..] <= key).saturating_sub(1);
        let part = self.part(Part::Index, p)?;
        let e = entry::<N>();
        let (mut lo, mut hi) = (0, part.len() / e);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if &part[mid * e..mid * e + N] <= key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let per_part = index_part_len::<N>() / e;
        Ok((p * per_part + lo).saturating_sub(1))
    }

    /// Calls `f` with every key in `lo..hi` (`hi` `None`: unbounded),
    /// ascending, until it returns false.
    ///
    /// # Errors
    /// As [`Run::read_block`].
    pub fn scan(
        &self,
        lo: &[u8; N],
        hi: Option<&[u8; N]>,
        f: &mut dyn FnMut(&[u8; N]) -> bool,
    ) -> Result<(), RunError> {
        for block in self.block_of(lo)?..self.blocks() {
            if let Some(hi) = hi {
                if &self.first_key(block)? >= hi {
                    break;
                }
            }
            for k in self.read_block(block)? {
                if &k < lo {
                    continue;
                }
                if hi.is_some_and(|hi| &k >= hi) || !f(&k) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// The keys of a run in `lo..hi`, descending, one block read at a time.
pub struct RevCursor<'a, const N: usize> {
    run: &'a Run<N>,
    lo: [u8; N],
    hi: Option<[u8; N]>,
    /// The next block to read, if any.
    next_block: Option<usize>,
    /// Keys of the block read last still to give, ascending.
    keys: Vec<[u8; N]>,
}

impl<'a, const N: usize> RevCursor<'a, N> {
    /// A cursor over `run`'s keys in `lo..hi` (`hi` `None`: unbounded).
    ///
    /// # Errors
    /// As [`Run::block_of`].
    pub fn new(run: &'a Run<N>, lo: [u8; N], hi: Option<[u8; N]>) -> Result<Self, RunError> {
        let next_block = match (&hi, run.blocks()) {
            (_, 0) => None,
            (None, n) => Some(n - 1),
            (Some(hi), _) => Some(run.block_of(hi)?),
        };
        Ok(RevCursor {
            run,
            lo,
            hi,
            next_block,
            keys: Vec::new(),
        })
    }

    /// The next key, descending; `None` past `lo`.
    ///
    /// # Errors
    /// As [`Run::read_block`].
    pub fn next_key(&mut self) -> Result<Option<[u8; N]>, RunError> {
        loop {
            if let Some(k) = self.keys.pop() {
                if k < self.lo {
                    self.keys.clear();
                    self.next_block = None;
                    return Ok(None);
                }
                return Ok(Some(k));
            }
            let Some(b) = self.next_block else {
                return Ok(None);
            };
            let mut keys = self.run.read_block(b)?;
            if let Some(hi) = &self.hi {
                keys.retain(|k| k < hi);
            }
            self.keys = keys;
            self.next_block = (self.run.first_key(b)? > self.lo)
                .then(|| b.checked_sub(1))
                .flatten();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(budget: usize) -> Arc<PartCache> {
        Arc::new(PartCache::new(budget, PART_BYTES))
    }

    fn write(dir: &Path, keys: &[[u8; 16]]) -> Run<16> {
        let path = dir.join("t.run");
        let mut w = RunWriter::<16>::create(&path, keys.len()).unwrap();
        for k in keys {
            w.push(k).unwrap();
        }
        w.finish(1, &cache(1 << 20)).unwrap()
    }

    fn key(i: u32) -> [u8; 16] {
        let mut k = [0u8; 16];
        k[..4].copy_from_slice(&(i / 3).to_be_bytes());
        k[12..].copy_from_slice(&i.to_be_bytes());
        k
    }

    #[test]
    fn write_open_scan_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<[u8; 16]> = (0..1000).map(key).collect();
        let run = write(dir.path(), &keys);
        let reopened = Run::<16>::open(run.path(), 1, &cache(0)).unwrap();
        assert_eq!(reopened.count(), 1000);
        assert_eq!(reopened.blocks(), 4);
        assert_eq!(
            std::fs::metadata(run.path()).unwrap().len(),
            reopened.bytes()
        );
        let mut got = Vec::new();
        reopened
            .scan(&key(300), Some(&key(700)), &mut |k| {
                got.push(*k);
                true
            })
            .unwrap();
        assert_eq!(got, keys[300..700]);
        assert!(keys
            .iter()
            .all(|k| reopened.may_contain(prefix_u64(k)).unwrap()));
        assert!(Run::<20>::open(run.path(), 1, &cache(0)).is_err());
    }

    #[test]
    fn damage_is_a_typed_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<[u8; 16]> = (0..600).map(key).collect();
        let path = write(dir.path(), &keys).path().to_path_buf();
        let good = std::fs::read(&path).unwrap();
        // A flipped byte among the keys: found at the read of its block.
        let mut bytes = good.clone();
        bytes[HEADER + 300 * 16] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let run = Run::<16>::open(&path, 1, &cache(0)).unwrap();
        let err = run.scan(&key(0), None, &mut |_| true).unwrap_err();
        assert!(matches!(err, RunError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains(&path.display().to_string()));
        // A flipped byte in the block index, and a cut file: at open.
        let mut bytes = good.clone();
        bytes[HEADER + 600 * 16 + 1] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let err = Run::<16>::open(&path, 1, &cache(0)).unwrap_err();
        assert!(err.to_string().contains("trailer checksum"), "{err}");
        std::fs::write(&path, &good[..good.len() - 1]).unwrap();
        let err = Run::<16>::open(&path, 1, &cache(0)).unwrap_err();
        assert!(err.to_string().contains("size"), "{err}");
        assert!(err.to_string().contains(&path.display().to_string()));
    }

    /// A run of 200,000 keys (many index and filter partitions) read
    /// through caches of 0 bytes, 8 KiB and 64 MiB gives the same answers
    /// as its keys: every key found by prefix and by block, the same
    /// ranges; a partition changed or cut after open is a typed error
    /// naming the file at its next read from disk, never a panic or a
    /// wrong answer.
    #[test]
    fn partitions_read_through_any_budget_give_the_same_answers() {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<[u8; 16]> = (0..200_000).map(|i| key(i * 7)).collect();
        let path = write(dir.path(), &keys).path().to_path_buf();
        for budget in [0, 8 << 10, 64 << 20] {
            let c = cache(budget);
            let run = Run::<16>::open(&path, 1, &c).unwrap();
            assert!(run.tail_bytes() > 20 * PART_BYTES);
            assert!(
                run.resident_bytes() * 500 < run.tail_bytes(),
                "{}",
                run.resident_bytes()
            );
            for (i, k) in keys.iter().enumerate().step_by(97) {
                assert!(run.may_contain(prefix_u64(k)).unwrap(), "{budget} {i}");
                assert_eq!(run.block_of(k).unwrap(), i / BLOCK_KEYS, "{budget} {i}");
            }
            // Every block's first key, index partitions' first keys among
            // them, is found in its own block.
            for b in 0..run.blocks() {
                assert_eq!(run.block_of(&keys[b * BLOCK_KEYS]).unwrap(), b, "{budget}");
            }
            let mut got = Vec::new();
            let (lo, hi) = (key(70_001), key(700_000));
            run.scan(&lo, Some(&hi), &mut |k| {
                got.push(*k);
                true
            })
            .unwrap();
            let want: Vec<_> = keys
                .iter()
                .filter(|k| **k >= lo && **k < hi)
                .copied()
                .collect();
            assert_eq!(got, want, "{budget}");
            let mut rev = RevCursor::new(&run, lo, Some(hi)).unwrap();
            let mut back = Vec::new();
            while let Some(k) = rev.next_key().unwrap() {
                back.push(k);
            }
            back.reverse();
            assert_eq!(back, want, "{budget}");
            assert!(c.bytes() <= budget, "{} > {budget}", c.bytes());
        }
        // A flipped byte in the filter after open: found at its next read.
        let c = cache(0);
        let run = Run::<16>::open(&path, 1, &c).unwrap();
        let good = std::fs::read(&path).unwrap();
        let mut bytes = good.clone();
        let filter_at = run.filter_at as usize;
        for b in &mut bytes[filter_at..filter_at + run.filter_len] {
            *b ^= 0x55;
        }
        std::fs::write(&path, &bytes).unwrap();
        let err = run.may_contain(prefix_u64(&keys[5])).unwrap_err();
        assert!(matches!(err, RunError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains(&path.display().to_string()));
        // Cut before the block index: the index read fails clearly.
        std::fs::write(&path, &good[..run.index_at as usize]).unwrap();
        let err = run.block_of(&keys[1000]).unwrap_err();
        assert!(matches!(err, RunError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("shorter"), "{err}");
    }
}
