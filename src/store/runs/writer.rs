//! Writes one run file (layout in `run.rs`) from keys given in ascending
//! order, in memory bounded by a few fixed buffers whatever the run's
//! size: the keys go out through a 64 KiB buffer; the block index and the
//! filter, whose regions the capacity given at creation sizes, are written
//! in place one 4 KiB partition at a time as the keys pass them (the
//! filter's blocks are chosen in the keys' order, `bloom.rs`); only the
//! summary (a CRC-32 per partition and a first key per index partition,
//! about 0.0016 bytes per key, what the run keeps in memory once open)
//! grows with the run. The header goes last, then the file is fsynced.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::bloom::{self, BLOCK_BYTES};
use super::error::RunError;
use super::layout::{self, index_part_len, Layout, Summary, BLOCK_KEYS, HEADER, PART_BYTES};
use super::run::{prefix_u64, PartCache, Run};
use crate::store::durable;
use crate::store::fault::{self, IoOp};

/// Bytes of the keys' write buffer.
const OUT_BUFFER: usize = 1 << 16;

/// Writes one run file: keys given in ascending order, each once.
pub struct RunWriter<const N: usize> {
    path: PathBuf,
    out: BufWriter<File>,
    /// The layout for `capacity` keys (the offsets do not depend on the
    /// count).
    layout: Layout,
    capacity: u64,
    /// The block of keys being filled.
    block: Vec<u8>,
    /// The index partition being filled.
    index: Vec<u8>,
    /// The filter partition being filled, and its number.
    filter: Vec<u8>,
    filter_part: u64,
    summary: Summary<N>,
    last: Option<[u8; N]>,
    count: u64,
}

impl<const N: usize> RunWriter<N> {
    /// Creates `path` (which must not exist) for at most `capacity` keys
    /// (sizes the filter and the block index's region).
    ///
    /// # Errors
    /// [`RunError::Io`] naming `path` (also for a capacity whose file
    /// size overflows `u64`).
    pub fn create(path: &Path, capacity: usize) -> Result<Self, RunError> {
        let io = RunError::io(path);
        let capacity = capacity as u64;
        let layout = Layout::new::<N>(capacity, capacity)
            .ok_or_else(|| io(std::io::Error::other("run capacity overflows")))?;
        fault::check(IoOp::Write, path).map_err(&io)?;
        let mut file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(&io)?;
        file.seek(SeekFrom::Start(layout.keys_at)).map_err(&io)?;
        Ok(RunWriter {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(OUT_BUFFER, file),
            layout,
            capacity,
            block: Vec::with_capacity(BLOCK_KEYS * N),
            index: Vec::with_capacity(index_part_len::<N>()),
            filter: vec![0u8; PART_BYTES],
            filter_part: 0,
            summary: Summary::default(),
            last: None,
            count: 0,
        })
    }

    /// Appends `key` (greater than the previous key; an equal key is
    /// skipped).
    ///
    /// # Errors
    /// [`RunError::Io`], also for a key beyond the capacity.
    pub fn push(&mut self, key: &[u8; N]) -> Result<(), RunError> {
        if let Some(last) = &self.last {
            if key <= last {
                return Ok(());
            }
        }
        if self.count == self.capacity {
            let e = std::io::Error::other("more keys than the run's capacity");
            return Err(RunError::io(&self.path)(e));
        }
        if self.block.is_empty() {
            self.index.extend_from_slice(key);
        }
        self.block.extend_from_slice(key);
        self.add_to_filter(prefix_u64(key))?;
        self.last = Some(*key);
        self.count += 1;
        if self.block.len() == BLOCK_KEYS * N {
            self.end_block()?;
        }
        Ok(())
    }

    /// Bytes this writer holds: its buffers (fixed) and the summary of
    /// the partitions written so far (tests).
    #[cfg(test)]
    pub fn resident_bytes(&self) -> usize {
        self.out.capacity()
            + self.block.capacity()
            + self.index.capacity()
            + self.filter.capacity()
            + self.summary.bytes()
    }

    /// Sets `prefix`'s bits in the filter partition being filled, after
    /// writing out the partitions before its own (ascending keys never
    /// come back to them).
    fn add_to_filter(&mut self, prefix: u64) -> Result<(), RunError> {
        let at = bloom::block_of(prefix, self.layout.filter_blocks()) * BLOCK_BYTES;
        let part = (at / PART_BYTES) as u64;
        while self.filter_part < part {
            self.write_filter_part()?;
        }
        bloom::insert(&mut self.filter[at % PART_BYTES..][..BLOCK_BYTES], prefix);
        Ok(())
    }

    /// Writes the filter partition being filled in place, and starts the
    /// next.
    fn write_filter_part(&mut self) -> Result<(), RunError> {
        let start = self.filter_part * PART_BYTES as u64;
        let n = (self.layout.filter_len - start).min(PART_BYTES as u64) as usize;
        let bytes = &self.filter[..n];
        self.out
            .get_ref()
            .write_all_at(bytes, HEADER as u64 + start)
            .map_err(RunError::io(&self.path))?;
        self.summary.filter_crcs.push(crc32fast::hash(bytes));
        self.filter.fill(0);
        self.filter_part += 1;
        Ok(())
    }

    fn end_block(&mut self) -> Result<(), RunError> {
        self.index
            .extend_from_slice(&crc32fast::hash(&self.block).to_be_bytes());
        self.out
            .write_all(&self.block)
            .map_err(RunError::io(&self.path))?;
        self.block.clear();
        if self.index.len() == index_part_len::<N>() {
            self.write_index_part()?;
        }
        Ok(())
    }

    /// Writes the index partition being filled in place.
    fn write_index_part(&mut self) -> Result<(), RunError> {
        let i = self.summary.index_crcs.len() as u64;
        let at = self.layout.index_at + i * index_part_len::<N>() as u64;
        self.out
            .get_ref()
            .write_all_at(&self.index, at)
            .map_err(RunError::io(&self.path))?;
        self.summary.add_index(&self.index);
        self.index.clear();
        Ok(())
    }

    /// Writes the last partitions, the summary, the trailer and the
    /// header, and fsyncs the file. Returns the run, opened for reading
    /// through `cache` ([`Run::open`]).
    ///
    /// # Errors
    /// [`RunError::Io`] naming the file (the caller deletes it), or as
    /// [`Run::open`].
    pub fn finish(mut self, number: u64, cache: &Arc<PartCache>) -> Result<Run<N>, RunError> {
        if !self.block.is_empty() {
            self.end_block()?;
        }
        if !self.index.is_empty() {
            self.write_index_part()?;
        }
        while self.filter_part < self.layout.filter_parts {
            self.write_filter_part()?;
        }
        let path = std::mem::take(&mut self.path);
        let io = RunError::io(&path);
        let header = layout::header(N, self.count, self.capacity);
        let summary = self.summary.encode();
        let mut crc = crc32fast::Hasher::new();
        crc.update(&header);
        crc.update(&summary);
        fault::check(IoOp::Write, &path).map_err(&io)?;
        self.out.write_all(&summary).map_err(&io)?;
        self.out
            .write_all(&crc.finalize().to_be_bytes())
            .map_err(&io)?;
        let file = self.out.into_inner().map_err(|e| io(e.into_error()))?;
        file.write_all_at(&header, 0).map_err(&io)?;
        durable::sync_file(&path, &file).map_err(&io)?;
        drop(file);
        // Read back as any open reads it (its header and summary: about
        // 0.0016 bytes per key), which checks what was just written.
        Run::open(&path, number, cache)
    }
}
