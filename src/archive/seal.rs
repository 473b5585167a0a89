//! Sealing an epoch with bounded memory: the leaves are fed one by one
//! ([`EpochBuilder::push`]), sorted in runs of at most
//! [`SEAL_MEMORY_BYTES`] (each run beyond the first spilled sorted to a
//! temporary file beside the epoch file), merged, and streamed into the
//! epoch file at offsets the layout fixes in advance; the Merkle levels are
//! then computed level by level from the file. The bytes are exactly those
//! of the in-memory construction (`docs/archive.md`, "On disk"): two honest
//! nodes build identical epochs whatever their memory.
//!
//! Memory: the run buffer (≤ [`SEAL_MEMORY_BYTES`]), 8 bytes per leaf for
//! the binary fuse filter (xorf builds it from all keys at once: 80 MB for
//! a mainnet-sized epoch of 10⁷ leaves), and 64 KiB per spilled run while
//! merging.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::filter::{filter_key, EpochFilter};
use super::format::{EPOCH_FILE_MAGIC, FORMAT_VERSION, MAX_EPOCH_LEAVES};
use super::header::EpochHeader;
use super::leaf::{Leaf, TreeEntry, LEAF_FIXED_LEN, MAX_SCRIPT_LEN};
use super::merkle::{leaf_hash, level_sizes, node_hash, NodeHash};
use super::ArchiveError;
use crate::primitives::OutPointKey;
use crate::store::fault::{self, IoOp};

/// Most bytes of leaves an epoch seal sorts in memory at once (32 MiB);
/// beyond it, sorted runs go to temporary files and are merged.
pub const SEAL_MEMORY_BYTES: usize = 32 * 1024 * 1024;

/// Buffer of each file reader and writer of a seal, bytes.
const IO_BUFFER: usize = 64 * 1024;

/// Bytes a leaf is counted for in the run buffer: its encoding plus the
/// struct and allocation overhead.
fn leaf_cost(leaf: &Leaf) -> usize {
    LEAF_FIXED_LEN + leaf.script_pubkey.len() + 96
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The leaves of one epoch being collected for its seal
/// ([`super::Archive::epoch_builder`], then
/// [`super::Archive::seal_built`]).
#[derive(Debug)]
pub struct EpochBuilder {
    pub(super) epoch: u32,
    first: u32,
    last: u32,
    dir: PathBuf,
    budget: usize,
    run: Vec<Leaf>,
    run_bytes: usize,
    runs: Vec<PathBuf>,
    keys: Vec<u64>,
    /// Bytes of the spent-output tree entries (without the boundaries).
    entry_bytes: u64,
}

impl EpochBuilder {
    pub(super) fn new(dir: &Path, epoch: u32, range: (u32, u32), budget: usize) -> Self {
        EpochBuilder {
            epoch,
            first: range.0,
            last: range.1,
            dir: dir.to_path_buf(),
            budget: budget.max(1),
            run: Vec::new(),
            run_bytes: 0,
            runs: Vec::new(),
            keys: Vec::new(),
            entry_bytes: 0,
        }
    }

    /// Adds one leaf (any order).
    ///
    /// # Errors
    /// [`ArchiveError::LeafOutOfRange`], [`ArchiveError::ScriptTooLong`],
    /// [`ArchiveError::TooManyLeaves`]; [`ArchiveError::Io`] writing a run.
    pub fn push(&mut self, leaf: Leaf) -> Result<(), ArchiveError> {
        if leaf.spend.height < self.first || leaf.spend.height > self.last {
            return Err(ArchiveError::LeafOutOfRange {
                epoch: self.epoch,
                outpoint: leaf.outpoint,
                height: leaf.spend.height,
            });
        }
        if leaf.script_pubkey.len() > MAX_SCRIPT_LEN {
            return Err(ArchiveError::ScriptTooLong {
                outpoint: leaf.outpoint,
                len: leaf.script_pubkey.len(),
            });
        }
        if self.keys.len() >= MAX_EPOCH_LEAVES {
            return Err(ArchiveError::TooManyLeaves {
                epoch: self.epoch,
                count: self.keys.len() + 1,
                max: MAX_EPOCH_LEAVES,
            });
        }
        self.keys.push(filter_key(&leaf.key()));
        self.entry_bytes += (5 + LEAF_FIXED_LEN + leaf.script_pubkey.len()) as u64;
        self.run_bytes += leaf_cost(&leaf);
        self.run.push(leaf);
        if self.run_bytes >= self.budget {
            self.spill()?;
        }
        Ok(())
    }

    /// Sorts the run buffer and writes it to a temporary file
    /// (`epoch-N.run-K.tmp`; `Archive::open` removes leftovers).
    fn spill(&mut self) -> Result<(), ArchiveError> {
        self.run.sort_unstable_by_key(Leaf::key);
        let path = self.dir.join(format!(
            "epoch-{:08}.run-{}.tmp",
            self.epoch,
            self.runs.len()
        ));
        let f = File::create(&path).map_err(io_err(&path))?;
        let mut w = BufWriter::with_capacity(IO_BUFFER, f);
        for leaf in self.run.drain(..) {
            let b = leaf.to_bytes();
            w.write_all(&(b.len() as u32).to_be_bytes())
                .and_then(|()| w.write_all(&b))
                .map_err(io_err(&path))?;
        }
        fault::check(IoOp::Write, &path)
            .and_then(|()| w.flush())
            .map_err(io_err(&path))?;
        self.runs.push(path);
        self.run_bytes = 0;
        Ok(())
    }

    /// Number of spent-output leaves pushed.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no leaf was pushed.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

impl Drop for EpochBuilder {
    fn drop(&mut self) {
        for p in &self.runs {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// One sorted source of leaves for the merge.
enum Source {
    Memory(std::vec::IntoIter<Leaf>),
    File { path: PathBuf, r: BufReader<File> },
}

impl Source {
    fn next(&mut self) -> Result<Option<Leaf>, ArchiveError> {
        match self {
            Source::Memory(it) => Ok(it.next()),
            Source::File { path, r } => {
                let mut len = [0u8; 4];
                match r.read_exact(&mut len) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
                    Err(e) => return Err(io_err(path)(e)),
                }
                let mut b = vec![0u8; u32::from_be_bytes(len) as usize];
                r.read_exact(&mut b).map_err(io_err(path))?;
                Leaf::from_bytes(&b)
                    .map(Some)
                    .map_err(|_| ArchiveError::Corrupt {
                        path: path.clone(),
                        reason: "a sort run written by this seal does not decode",
                    })
            }
        }
    }
}

/// The k-way merge of sorted sources, by outpoint key.
struct Merge {
    sources: Vec<Source>,
    heads: Vec<Option<Leaf>>,
    heap: BinaryHeap<Reverse<(OutPointKey, usize)>>,
}

impl Merge {
    fn new(mut sources: Vec<Source>) -> Result<Self, ArchiveError> {
        let mut heads = Vec::with_capacity(sources.len());
        let mut heap = BinaryHeap::new();
        for (i, s) in sources.iter_mut().enumerate() {
            let head = s.next()?;
            if let Some(l) = &head {
                heap.push(Reverse((l.key(), i)));
            }
            heads.push(head);
        }
        Ok(Merge {
            sources,
            heads,
            heap,
        })
    }

    fn next(&mut self) -> Result<Option<Leaf>, ArchiveError> {
        let Some(Reverse((_, i))) = self.heap.pop() else {
            return Ok(None);
        };
        let out = self.heads[i].take();
        self.heads[i] = self.sources[i].next()?;
        if let Some(l) = &self.heads[i] {
            self.heap.push(Reverse((l.key(), i)));
        }
        Ok(out)
    }
}

/// A sequential writer at a fixed position of a file (`pwrite`), with a
/// CRC-32 of what it wrote.
struct PosWriter<'a> {
    file: &'a File,
    path: &'a Path,
    pos: u64,
    buf: Vec<u8>,
    crc: crc32fast::Hasher,
}

impl<'a> PosWriter<'a> {
    fn new(file: &'a File, path: &'a Path, pos: u64) -> Self {
        PosWriter {
            file,
            path,
            pos,
            buf: Vec::with_capacity(IO_BUFFER),
            crc: crc32fast::Hasher::new(),
        }
    }

    fn put(&mut self, b: &[u8]) -> Result<(), ArchiveError> {
        self.crc.update(b);
        self.buf.extend_from_slice(b);
        if self.buf.len() >= IO_BUFFER {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), ArchiveError> {
        fault::check(IoOp::Write, self.path)
            .and_then(|()| self.file.write_all_at(&self.buf, self.pos))
            .map_err(io_err(self.path))?;
        self.pos += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }
}

/// Where each part of an epoch file starts, from its counts alone.
struct Layout {
    offsets_at: u64,
    leaves_at: u64,
    nodes_at: u64,
    sizes: Vec<u32>,
}

impl Layout {
    fn new(filter_len: usize, entries: u32, entry_bytes: u64) -> Self {
        let offsets_at = 94 + filter_len as u64 + 4;
        let leaves_at = offsets_at + 8 * (u64::from(entries) + 1);
        Layout {
            offsets_at,
            leaves_at,
            nodes_at: leaves_at + entry_bytes,
            sizes: level_sizes(entries),
        }
    }
}

/// Writes epoch `b`'s file to `tmp` (not synced): the sorted entries with
/// their offsets and leaf hashes, then the tree level by level, then the
/// body checksum. `prev` is the previous epoch header's hash. Returns the
/// epoch's header.
///
/// # Errors
/// [`ArchiveError::DuplicateLeaf`], [`ArchiveError::Filter`],
/// [`ArchiveError::Io`].
pub(super) fn write_epoch(
    mut b: EpochBuilder,
    prev: [u8; 32],
    tmp: &Path,
) -> Result<EpochHeader, ArchiveError> {
    let count = u32::try_from(b.keys.len() + 2).map_err(|_| ArchiveError::TooManyLeaves {
        epoch: b.epoch,
        count: b.keys.len(),
        max: MAX_EPOCH_LEAVES,
    })?;
    let epoch = b.epoch;
    let filter = EpochFilter::build(std::mem::take(&mut b.keys))
        .map_err(|reason| ArchiveError::Filter { epoch, reason })?;
    let fbytes = filter.to_bytes();
    let layout = Layout::new(fbytes.len(), count, b.entry_bytes + 10);
    let file = OpenOptions::new()
        .create(true)
        .read(true)
        .write(true)
        .truncate(true)
        .open(tmp)
        .map_err(io_err(tmp))?;
    let (mut body, root) = write_entries(&mut b, &file, tmp, &layout)?;
    let (nodes_crc, root) = write_levels(&file, tmp, &layout, root)?;
    body.combine(&nodes_crc);
    let header = EpochHeader {
        epoch,
        first_height: b.first,
        last_height: b.last,
        leaf_count: count,
        root,
        prev,
    };
    let mut pre = Vec::with_capacity(94 + fbytes.len() + 4);
    pre.extend_from_slice(&EPOCH_FILE_MAGIC);
    pre.push(FORMAT_VERSION);
    pre.extend_from_slice(&header.encode());
    pre.extend_from_slice(&(fbytes.len() as u32).to_be_bytes());
    pre.extend_from_slice(&fbytes);
    let sum = crc32fast::hash(&pre);
    pre.extend_from_slice(&sum.to_be_bytes());
    fault::check(IoOp::Write, tmp)
        .and_then(|()| file.write_all_at(&pre, 0))
        .map_err(io_err(tmp))?;
    let total_nodes: u64 = layout.sizes.iter().map(|&s| u64::from(s)).sum();
    file.write_all_at(
        &body.finalize().to_be_bytes(),
        layout.nodes_at + 32 * total_nodes,
    )
    .map_err(io_err(tmp))?;
    Ok(header)
}

/// Merges the sorted leaves into the entries, offsets and level-0 regions
/// of the file; returns the CRC-32 of the offsets and entries (in file
/// order) and the root if the tree is a single leaf.
fn write_entries(
    b: &mut EpochBuilder,
    file: &File,
    path: &Path,
    layout: &Layout,
) -> Result<(crc32fast::Hasher, NodeHash), ArchiveError> {
    let mut sources = Vec::with_capacity(b.runs.len() + 1);
    for p in &b.runs {
        let f = File::open(p).map_err(io_err(p))?;
        sources.push(Source::File {
            path: p.clone(),
            r: BufReader::with_capacity(IO_BUFFER, f),
        });
    }
    b.run.sort_unstable_by_key(Leaf::key);
    sources.push(Source::Memory(std::mem::take(&mut b.run).into_iter()));
    let mut merge = Merge::new(sources)?;
    let mut offsets = PosWriter::new(file, path, layout.offsets_at);
    let mut entries = PosWriter::new(file, path, layout.leaves_at);
    let mut level0 = PosWriter::new(file, path, layout.nodes_at);
    let mut off = 0u64;
    offsets.put(&off.to_be_bytes())?;
    let mut last_hash = [0u8; 32];
    let mut put = |e: &[u8]| -> Result<(), ArchiveError> {
        off += e.len() as u64;
        offsets.put(&off.to_be_bytes())?;
        entries.put(e)?;
        last_hash = leaf_hash(e);
        level0.put(&last_hash)
    };
    put(&TreeEntry::LowerBound { index: 0 }.encode())?;
    let mut index = 1u32;
    let mut prev_key: Option<OutPointKey> = None;
    while let Some(leaf) = merge.next()? {
        let key = leaf.key();
        if prev_key == Some(key) {
            return Err(ArchiveError::DuplicateLeaf {
                epoch: b.epoch,
                outpoint: leaf.outpoint,
            });
        }
        prev_key = Some(key);
        put(&TreeEntry::Spent { index, leaf }.encode())?;
        index += 1;
    }
    put(&TreeEntry::UpperBound { index }.encode())?;
    offsets.flush()?;
    entries.flush()?;
    level0.flush()?;
    let mut crc = offsets.crc;
    crc.combine(&entries.crc);
    Ok((crc, last_hash))
}

/// Computes levels 1.. of the tree from level 0 (already in the file at
/// `nodes_at`), each from the one below read back in chunks, written
/// right after it. Returns the CRC-32 of the whole nodes region and the
/// root.
fn write_levels(
    file: &File,
    path: &Path,
    layout: &Layout,
    single: NodeHash,
) -> Result<(crc32fast::Hasher, NodeHash), ArchiveError> {
    let mut crc = crc32fast::Hasher::new();
    let mut at = layout.nodes_at;
    // Level 0 is in the file: checksum it.
    let level0_len = u64::from(layout.sizes[0]) * 32;
    read_chunks(file, path, at, level0_len, |chunk| crc.update(chunk))?;
    let mut root = single;
    let mut below_at = at;
    at += level0_len;
    for w in layout.sizes.windows(2) {
        let (below, len) = (w[0], w[1]);
        let mut out = PosWriter::new(file, path, at);
        let mut pending: Option<NodeHash> = None;
        let mut failed = None;
        read_chunks(file, path, below_at, u64::from(below) * 32, |chunk| {
            for node in chunk.chunks_exact(32) {
                let mut h = [0u8; 32];
                h.copy_from_slice(node);
                match pending.take() {
                    None => pending = Some(h),
                    Some(left) => {
                        root = node_hash(&left, &h);
                        if let Err(e) = out.put(&root) {
                            failed.get_or_insert(e);
                        }
                    }
                }
            }
        })?;
        if let Some(odd) = pending {
            // An odd node is promoted unchanged (`merkle::build_levels`).
            root = odd;
            out.put(&odd)?;
        }
        if let Some(e) = failed {
            return Err(e);
        }
        out.flush()?;
        crc.combine(&out.crc);
        below_at = at;
        at += u64::from(len) * 32;
    }
    Ok((crc, root))
}

/// Calls `f` with consecutive chunks of `len` bytes of `file` from `at`.
fn read_chunks(
    file: &File,
    path: &Path,
    mut at: u64,
    len: u64,
    mut f: impl FnMut(&[u8]),
) -> Result<(), ArchiveError> {
    let end = at + len;
    let mut buf = vec![0u8; IO_BUFFER];
    while at < end {
        let n = (end - at).min(IO_BUFFER as u64) as usize;
        file.read_exact_at(&mut buf[..n], at)
            .map_err(io_err(path))?;
        f(&buf[..n]);
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::merkle::build_levels;
    use crate::archive::Spend;
    use bitcoin::hashes::Hash;
    use bitcoin::{BlockHash, OutPoint, ScriptBuf, Txid};

    /// The epoch file as the in-memory construction writes it (every leaf
    /// sorted in RAM, every level in RAM, then written in file order): the
    /// reference the streamed seal must reproduce byte for byte.
    fn reference_bytes(mut leaves: Vec<Leaf>, epoch: u32, range: (u32, u32)) -> Vec<u8> {
        leaves.sort_unstable_by_key(Leaf::key);
        let count = leaves.len() as u32 + 2;
        let filter =
            EpochFilter::build(leaves.iter().map(|l| filter_key(&l.key())).collect()).unwrap();
        let mut encoded = vec![TreeEntry::LowerBound { index: 0 }.encode()];
        for (i, leaf) in leaves.into_iter().enumerate() {
            let index = i as u32 + 1;
            encoded.push(TreeEntry::Spent { index, leaf }.encode());
        }
        encoded.push(TreeEntry::UpperBound { index: count - 1 }.encode());
        let levels = build_levels(encoded.iter().map(|e| leaf_hash(e)).collect());
        let header = EpochHeader {
            epoch,
            first_height: range.0,
            last_height: range.1,
            leaf_count: count,
            root: levels[levels.len() - 1][0],
            prev: [7; 32],
        };
        let fbytes = filter.to_bytes();
        let mut out = EPOCH_FILE_MAGIC.to_vec();
        out.push(FORMAT_VERSION);
        out.extend_from_slice(&header.encode());
        out.extend_from_slice(&(fbytes.len() as u32).to_be_bytes());
        out.extend_from_slice(&fbytes);
        out.extend_from_slice(&crc32fast::hash(&out).to_be_bytes());
        let body_at = out.len();
        let mut off = 0u64;
        out.extend_from_slice(&off.to_be_bytes());
        for e in &encoded {
            off += e.len() as u64;
            out.extend_from_slice(&off.to_be_bytes());
        }
        for e in &encoded {
            out.extend_from_slice(e);
        }
        for level in &levels {
            for node in level {
                out.extend_from_slice(node);
            }
        }
        let sum = crc32fast::hash(&out[body_at..]);
        out.extend_from_slice(&sum.to_be_bytes());
        out
    }

    fn leaves(n: u32, range: (u32, u32)) -> Vec<Leaf> {
        (0..n)
            .map(|i| {
                let h = bitcoin::hashes::sha256d::Hash::hash(&i.to_le_bytes()).to_byte_array();
                Leaf {
                    outpoint: OutPoint {
                        txid: Txid::from_byte_array(h),
                        vout: i % 3,
                    },
                    value: u64::from(i) * 1000,
                    script_pubkey: ScriptBuf::from_bytes(vec![0x51; (i % 40) as usize]),
                    creation_height: i,
                    spend: Spend {
                        block_hash: BlockHash::from_byte_array([i as u8; 32]),
                        height: range.0 + i % (range.1 - range.0 + 1),
                        txid: Txid::from_byte_array([3; 32]),
                        vin: i,
                    },
                }
            })
            .collect()
    }

    /// The streamed seal writes the in-memory construction's bytes, with
    /// one run or with hundreds spilled to disk and merged, for odd and
    /// even leaf counts (odd nodes promoted at several levels).
    #[test]
    fn streamed_epoch_equals_the_in_memory_construction() {
        let dir = tempfile::tempdir().unwrap();
        let range = (144, 287);
        for n in [0u32, 1, 2, 5, 1000, 1023] {
            let want = reference_bytes(leaves(n, range), 1, range);
            for budget in [SEAL_MEMORY_BYTES, 1, 4096] {
                let mut b = EpochBuilder::new(dir.path(), 1, range, budget);
                let mut input = leaves(n, range);
                input.reverse();
                for l in input {
                    b.push(l).unwrap();
                }
                let tmp = dir.path().join("epoch.tmp");
                write_epoch(b, [7; 32], &tmp).unwrap();
                let got = std::fs::read(&tmp).unwrap();
                assert!(got == want, "{n} leaves, budget {budget}: bytes differ");
            }
            // No sort run is left behind.
            let left: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().contains(".run-"))
                .collect();
            assert!(left.is_empty(), "{left:?}");
        }
    }

    #[test]
    fn duplicate_across_runs_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let range = (0, 9);
        let mut b = EpochBuilder::new(dir.path(), 0, range, 1);
        let l = leaves(3, range);
        for x in l.iter().chain(l.iter().take(1)) {
            b.push(x.clone()).unwrap();
        }
        let err = write_epoch(b, [0; 32], &dir.path().join("e.tmp")).unwrap_err();
        assert!(matches!(err, ArchiveError::DuplicateLeaf { .. }), "{err}");
    }
}
