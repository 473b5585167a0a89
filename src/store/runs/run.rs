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
//! the block index and filter (about 1/200 and 1/13 of the keys' bytes),
//! checking the trailer's CRC: no key is read. Each block's CRC is checked
//! when it is read, so a flipped byte among the keys shows as
//! [`RunError::Corrupt`] naming the file at the first read of its block.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::bloom::Bloom;
use super::error::RunError;
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
    /// file. Returns the run, open for reading.
    ///
    /// # Errors
    /// [`RunError::Io`] naming the file (the caller deletes it).
    pub fn finish(mut self, number: u64) -> Result<Run<N>, RunError> {
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
        Ok(Run {
            path,
            number,
            file,
            count: self.count,
            index: self.index,
            bloom: self.bloom,
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

/// An open run file: its block index and filter in memory, keys read by
/// positional reads.
#[derive(Debug)]
pub struct Run<const N: usize> {
    path: PathBuf,
    number: u64,
    file: File,
    count: u64,
    /// Per block: first key ‖ CRC-32.
    index: Vec<u8>,
    bloom: Bloom,
}

/// Bytes of one block index entry.
const fn entry<const N: usize>() -> usize {
    N + 4
}

impl<const N: usize> Run<N> {
    /// Opens the run file `path` (number `number` in the manifest),
    /// checking its header, size and trailer CRC.
    ///
    /// # Errors
    /// [`RunError::Io`], or [`RunError::Corrupt`] naming the file.
    pub fn open(path: &Path, number: u64) -> Result<Self, RunError> {
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
        let bloom_len = u32_at(28) as u64;
        let blocks = count.div_ceil(BLOCK_KEYS as u64);
        // Sizes are checked against the file's length before any is
        // allocated: a damaged header cannot ask for more than the file.
        let keys_end = count
            .checked_mul(N as u64)
            .and_then(|b| b.checked_add(HEADER as u64))
            .ok_or(bad("count overflows"))?;
        let tail = blocks
            .checked_mul(entry::<N>() as u64)
            .and_then(|b| b.checked_add(bloom_len + 4))
            .ok_or(bad("count overflows"))?;
        if keys_end.checked_add(tail) != Some(len) {
            return Err(bad("file size does not match its header"));
        }
        let mut rest = vec![0u8; tail as usize];
        file.read_exact_at(&mut rest, keys_end).map_err(&io)?;
        let (body, trailer) = rest.split_at(rest.len() - 4);
        let mut crc = crc32fast::Hasher::new();
        crc.update(&h);
        crc.update(body);
        if crc.finalize().to_be_bytes() != trailer {
            return Err(bad("trailer checksum mismatch"));
        }
        let (index, bloom) = body.split_at((blocks as usize) * entry::<N>());
        let bloom = Bloom::from_bytes(bloom.to_vec()).ok_or(bad("bad filter length"))?;
        Ok(Run {
            path: path.to_path_buf(),
            number,
            file,
            count,
            index: index.to_vec(),
            bloom,
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
            + self.index.len() as u64
            + self.bloom.as_bytes().len() as u64
            + 4
    }

    /// Bytes this run holds in memory while open: its block index (first
    /// key and CRC-32 of each block of keys) and its filter, about 1.33
    /// bytes per key (the keys themselves stay on disk).
    pub fn resident_bytes(&self) -> usize {
        self.index.len() + self.bloom.as_bytes().len()
    }

    /// Whether a key starting with the 8-byte `prefix` may be here.
    pub fn may_contain(&self, prefix: u64) -> bool {
        self.bloom.may_contain(prefix)
    }

    /// Number of blocks.
    pub fn blocks(&self) -> usize {
        self.index.len() / entry::<N>()
    }

    fn first_key(&self, block: usize) -> &[u8] {
        &self.index[block * entry::<N>()..][..N]
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
        let e = &self.index[block * entry::<N>() + N..][..4];
        if crc32fast::hash(&buf).to_be_bytes() != e {
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
    /// most `key` (0 when `key` is below every key).
    pub fn block_of(&self, key: &[u8]) -> usize {
        let (mut lo, mut hi) = (0, self.blocks());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.first_key(mid) <= key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.saturating_sub(1)
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
        for block in self.block_of(lo)..self.blocks() {
            if hi.is_some_and(|hi| self.first_key(block) >= &hi[..]) {
                break;
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
    pub fn new(run: &'a Run<N>, lo: [u8; N], hi: Option<[u8; N]>) -> Self {
        let next_block = match (&hi, run.blocks()) {
            (_, 0) => None,
            (None, n) => Some(n - 1),
            (Some(hi), _) => Some(run.block_of(hi)),
        };
        RevCursor {
            run,
            lo,
            hi,
            next_block,
            keys: Vec::new(),
        }
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
            self.next_block = (self.run.first_key(b) > &self.lo[..])
                .then(|| b.checked_sub(1))
                .flatten();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, keys: &[[u8; 16]]) -> Run<16> {
        let path = dir.join("t.run");
        let mut w = RunWriter::<16>::create(&path, keys.len()).unwrap();
        for k in keys {
            w.push(k).unwrap();
        }
        w.finish(1).unwrap()
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
        let reopened = Run::<16>::open(run.path(), 1).unwrap();
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
        assert!(keys.iter().all(|k| reopened.may_contain(prefix_u64(k))));
        assert!(Run::<20>::open(run.path(), 1).is_err());
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
        let run = Run::<16>::open(&path, 1).unwrap();
        let err = run.scan(&key(0), None, &mut |_| true).unwrap_err();
        assert!(matches!(err, RunError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains(&path.display().to_string()));
        // A flipped byte in the block index, and a cut file: at open.
        let mut bytes = good.clone();
        bytes[HEADER + 600 * 16 + 1] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let err = Run::<16>::open(&path, 1).unwrap_err();
        assert!(err.to_string().contains("trailer checksum"), "{err}");
        std::fs::write(&path, &good[..good.len() - 1]).unwrap();
        let err = Run::<16>::open(&path, 1).unwrap_err();
        assert!(err.to_string().contains("size"), "{err}");
        assert!(err.to_string().contains(&path.display().to_string()));
    }
}
