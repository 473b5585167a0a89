//! One run: an immutable file of sorted, distinct fixed-size keys, written
//! once (`writer.rs`), fsynced, then read by positional reads ([`Run`]).
//!
//! Layout 2 (integers big-endian; sizes and offsets in `layout.rs`):
//!
//! | part | bytes |
//! | --- | --- |
//! | header | magic `KKHROWS1` (8) ‖ version u32 (2) ‖ key length u32 ‖ key count u64 ‖ keys per block u32 ‖ capacity u64 (36 in all) |
//! | filter | blocked Bloom filter over the keys' first 8 bytes (`bloom.rs`), sized for the capacity (10 bits a key) |
//! | block index | per block: its first key ‖ CRC-32 of the block's bytes (u32); its region has room for the capacity's blocks, the count's are used |
//! | keys | count × key length, ascending, distinct, in blocks of [`BLOCK_KEYS`] keys (the last one shorter) |
//! | summary | CRC-32 of each index partition (u32 each) ‖ first key of each index partition ‖ CRC-32 of each filter partition (u32 each) |
//! | trailer | CRC-32 of the header and the summary (u32) |
//!
//! The capacity (the most keys the writer was told to expect; the count
//! is at most it, less when a merge met equal keys) places the filter and
//! the block index before the keys, so the writer writes their partitions
//! in place as the keys stream past, in fixed memory.
//!
//! Opening reads the header, checks the file's size against it, and reads
//! the summary and the trailer (about 0.0016 bytes per key), checking the
//! trailer's CRC: no key, filter or index byte is read. It keeps the
//! summary: the CRC-32 of every partition of the block index and of the
//! filter ([`PART_BYTES`] each) and the first key of every index
//! partition. Lookups read the partitions they need through the store's
//! [`PartCache`] (a byte budget, `index.filter_cache_mib`), checking each
//! against its CRC when it is read from the file. So a run's memory does
//! not grow with its rows beyond the summary, and the partitions in memory
//! are bounded by the cache's budget, as RocksDB's partitioned index and
//! filter blocks in its block cache. Each block of keys' CRC is checked
//! when it is read, so a flipped byte among the keys, the block index or
//! the filter shows as [`RunError::Corrupt`] naming the file at its first
//! read, one in the header or summary, or a cut file, at open.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::bloom::{self, BLOCK_BYTES};
use super::error::RunError;
use super::layout::{
    entry, index_part_len, Layout, Summary, BLOCK_KEYS, HEADER, MAGIC, PART_BYTES, VERSION,
};
use crate::store::byte_cache::ByteCache;

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

/// An open run file: a summary of its block index and filter in memory
/// (their partitions read through the store's cache), keys read by
/// positional reads.
#[derive(Debug)]
pub struct Run<const N: usize> {
    path: PathBuf,
    number: u64,
    file: File,
    count: u64,
    layout: Layout,
    summary: Summary<N>,
    cache: Arc<PartCache>,
}

impl<const N: usize> Run<N> {
    /// Opens the run file `path` (number `number` in the manifest),
    /// checking its header, size and trailer CRC (over the header and the
    /// summary): it reads the header and the summary only (about 0.0016
    /// bytes per key), never the filter, block index or keys, whose
    /// partitions and blocks are checked against their CRCs when read.
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
        let u64_at = |i: usize| u64::from_be_bytes(h[i..i + 8].try_into().unwrap_or_default());
        if &h[..8] != MAGIC || u32_at(8) != VERSION {
            return Err(bad("bad magic or version"));
        }
        if u32_at(12) as usize != N || u32_at(24) as usize != BLOCK_KEYS {
            return Err(bad("key length or block size not this tree's"));
        }
        let count = u64_at(16);
        // Sizes are checked against the file's length before any is
        // allocated: a damaged header cannot ask for more than the file.
        let layout =
            Layout::new::<N>(count, u64_at(28)).ok_or(bad("count or capacity out of range"))?;
        if layout.len != len {
            return Err(bad("file size does not match its header"));
        }
        let mut tail = vec![0u8; layout.summary_len as usize + 4];
        file.read_exact_at(&mut tail, layout.summary_at)
            .map_err(&io)?;
        let (summary, trailer) = tail.split_at(layout.summary_len as usize);
        let mut crc = crc32fast::Hasher::new();
        crc.update(&h);
        crc.update(summary);
        if crc.finalize().to_be_bytes()[..] != *trailer {
            return Err(bad("trailer checksum mismatch"));
        }
        let summary = Summary::decode(summary, &layout).ok_or(bad("bad summary"))?;
        Ok(Run {
            path: path.to_path_buf(),
            number,
            file,
            count,
            layout,
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
        self.layout.len
    }

    /// Bytes this run holds in memory while open, outside the cache: the
    /// CRC-32 of each partition of its block index and filter and the
    /// first key of each index partition, about 1/1000 of those parts
    /// (0.0016 bytes per key; the keys, the block index and the filter
    /// stay on disk, their partitions in the cache while used).
    pub fn resident_bytes(&self) -> usize {
        self.summary.bytes()
    }

    /// Bytes of its block index and filter on disk (what the cache may
    /// hold of it).
    pub fn tail_bytes(&self) -> usize {
        (self.layout.index_len + self.layout.filter_len) as usize
    }

    /// Partition `i` of `part`, from the cache or else read from the file
    /// and checked against its CRC.
    ///
    /// # Errors
    /// [`RunError::Io`]; [`RunError::Corrupt`] naming the file when the
    /// partition does not match its CRC in the run's summary, or the file
    /// got shorter.
    fn part(&self, part: Part, i: usize) -> Result<Arc<Vec<u8>>, RunError> {
        let (at, len, part_len, crcs) = match part {
            Part::Index => (
                self.layout.index_at,
                self.layout.index_len as usize,
                index_part_len::<N>(),
                &self.summary.index_crcs,
            ),
            Part::Filter => (
                HEADER as u64,
                self.layout.filter_len as usize,
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
                return Err(bad("filter or block index does not match its checksum"));
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
        let block = bloom::block_of(prefix, self.layout.filter_blocks());
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
        self.layout.blocks as usize
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
            .read_exact_at(&mut buf, self.layout.keys_at + start * N as u64)
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
        if self.layout.blocks == 0 {
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
    use super::super::writer::RunWriter;
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

    /// Key `i`: ascending in `i`, three keys per 8-byte prefix, the
    /// prefixes spread over the lower half of `u64` (up to `i` = 2²⁰).
    fn key(i: u32) -> [u8; 16] {
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&(u64::from(i / 3) << 44).to_be_bytes());
        k[12..].copy_from_slice(&i.to_be_bytes());
        k
    }

    /// Writing a run of 2,000,000 keys holds the same few buffers at its
    /// end as at its start (the filter alone would be 2.5 MB, the block
    /// index 156 KB), and the run's filter, written partition by partition,
    /// still gives about 1 % false positives for absent prefixes.
    #[test]
    fn writing_a_large_run_holds_fixed_buffers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.run");
        let n = 2_000_000u64;
        let key = |i: u64| -> [u8; 16] {
            let mut k = [0u8; 16];
            // Ascending, spread over all of u64 as hash prefixes are.
            k[..8].copy_from_slice(&(i * (u64::MAX / n) + (i * 0x9E37) % 997).to_be_bytes());
            k
        };
        let mut w = RunWriter::<16>::create(&path, n as usize).unwrap();
        let mut most = 0;
        for i in 0..n {
            w.push(&key(i)).unwrap();
            most = most.max(w.resident_bytes());
        }
        assert!(most < 96 << 10, "the writer held {most} bytes");
        let run = w.finish(1, &cache(1 << 20)).unwrap();
        let run = Run::<16>::open(run.path(), 1, &cache(64 << 20)).unwrap();
        assert!(run.tail_bytes() > 20 * most, "{}", run.tail_bytes());
        assert!((0..n)
            .step_by(101)
            .all(|i| run.may_contain(prefix_u64(&key(i))).unwrap()));
        let absent = (0..100_000u64)
            .filter(|&i| {
                let p = prefix_u64(&key(i * 19 + 7)) + u64::MAX / n / 2;
                run.may_contain(p).unwrap()
            })
            .count();
        assert!(absent < 2_000, "{absent} false positives in 100,000");
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
        let layout = Run::<16>::open(&path, 1, &cache(0)).unwrap().layout;
        // Whether a flipped byte at `at` fails a scan, and a probe of
        // every key's prefix, with a typed error naming the file.
        let damaged = |at: u64| -> (bool, bool) {
            let mut bytes = good.clone();
            bytes[at as usize] ^= 1;
            std::fs::write(&path, &bytes).unwrap();
            let run = Run::<16>::open(&path, 1, &cache(0)).unwrap();
            let named = |e: RunError| {
                assert!(matches!(e, RunError::Corrupt { .. }), "{at}: {e}");
                assert!(e.to_string().contains(&path.display().to_string()));
            };
            let scan = run.scan(&key(0), None, &mut |_| true).map_err(named);
            let probe = (0..600).try_for_each(|i| run.may_contain(prefix_u64(&key(i))).map(drop));
            (scan.is_err(), probe.map_err(named).is_err())
        };
        // A flipped byte among the keys or in the block index: found at
        // the read of its block or partition; in the filter, at the first
        // probe of its partition.
        assert_eq!(damaged(layout.keys_at + 300 * 16), (true, false));
        assert_eq!(damaged(layout.index_at + 1), (true, false));
        assert_eq!(damaged(HEADER as u64), (false, true));
        // A flipped byte in the summary or the header, and a cut file: at
        // open.
        for (at, reason) in [
            (layout.summary_at, "trailer checksum"),
            (23, "size"),
            (28, "out of range"),
            (9, "version"),
        ] {
            let mut bytes = good.clone();
            bytes[at as usize] ^= 0x40;
            std::fs::write(&path, &bytes).unwrap();
            let err = Run::<16>::open(&path, 1, &cache(0)).unwrap_err();
            assert!(err.to_string().contains(reason), "{at}: {err}");
        }
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
        for b in &mut bytes[HEADER..HEADER + run.layout.filter_len as usize] {
            *b ^= 0x55;
        }
        std::fs::write(&path, &bytes).unwrap();
        let err = run.may_contain(prefix_u64(&keys[5])).unwrap_err();
        assert!(matches!(err, RunError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains(&path.display().to_string()));
        // Cut inside the block index: the index read fails clearly.
        std::fs::write(&path, &good[..run.layout.index_at as usize]).unwrap();
        let err = run.block_of(&keys[1000]).unwrap_err();
        assert!(matches!(err, RunError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("shorter"), "{err}");
    }
}
