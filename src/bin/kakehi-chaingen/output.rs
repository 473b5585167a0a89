//! Writing the chain: blocks in Bitcoin Core's blk file framing, and the
//! BIP-158 basic filter header chain of the best chain, on a thread of its
//! own so planning and signing go on while it works.
//!
//! Framing (Core's node/blockstorage.cpp): each record is the network magic
//! (regtest `fa bf b5 da`), the block's length as 4 bytes little-endian,
//! then the block with witness data. Files are `blk00000.dat`,
//! `blk00001.dat`, …, each at most 128 MiB (`MAX_BLOCKFILE_SIZE`); a record
//! never straddles two files.
//!
//! Filters come from rust-bitcoin's `bip158` module (P = 19, M = 784931,
//! key = the block hash's first 16 bytes), with the spent outputs' scripts
//! the generator's own ledger provides; the header chain starts from 32 zero
//! bytes before the genesis block.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

use bitcoin::bip158::{BlockFilter, FilterHeader};
use bitcoin::hashes::Hash;
use bitcoin::{Block, OutPoint, ScriptBuf};

/// Regtest's message start (chainparams.cpp `CRegTestParams`).
pub const REGTEST_MAGIC: [u8; 4] = [0xfa, 0xbf, 0xb5, 0xda];
/// Largest blk file, bytes (Core's `MAX_BLOCKFILE_SIZE`, 128 MiB).
pub const MAX_FILE_BYTES: u64 = 128 * 1024 * 1024;
/// The manifest records the filter header of every height that is a
/// multiple of this.
pub const FILTER_HEADER_EVERY: u32 = 1_000;
/// Blocks queued for the writer at most.
const QUEUE: usize = 32;

/// Errors of writing the chain.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    /// Creating or writing a file failed.
    #[error("writing {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// A best-chain block spends an output whose script the generator did
    /// not pass along (a generator bug).
    #[error("BIP-158 filter of block {height}: {source}")]
    Filter {
        /// The block's height.
        height: u32,
        /// rust-bitcoin's error.
        #[source]
        source: bitcoin::bip158::Error,
    },
    /// The writer thread is gone (it failed or panicked).
    #[error("the writer thread stopped early")]
    WriterGone,
}

/// A block for the files.
pub enum Item {
    /// A block of the final best chain, with the scripts of the outputs it
    /// spends (for its filter).
    Best {
        /// The block.
        block: Block,
        /// Its height.
        height: u32,
        /// Every spent outpoint's scriptPubKey.
        spent: Vec<(OutPoint, ScriptBuf)>,
    },
    /// A block that ends up on a stale branch.
    Stale(Block),
}

/// What the writer wrote.
#[derive(Debug, Default)]
pub struct Written {
    /// The blk files' names, in order.
    pub files: Vec<String>,
    /// Records in them.
    pub records: u64,
    /// Their total size, bytes.
    pub bytes: u64,
    /// (height, filter header) at every `FILTER_HEADER_EVERY`th height of
    /// the best chain, from 0.
    pub filter_headers: Vec<(u32, FilterHeader)>,
}

/// The writer thread and its queue.
pub struct Writer {
    queue: SyncSender<Item>,
    thread: JoinHandle<Result<Written, OutputError>>,
}

impl Writer {
    /// Starts a writer into `dir` (which must exist).
    pub fn start(dir: &Path) -> Writer {
        let (queue, rx) = sync_channel(QUEUE);
        let dir = dir.to_path_buf();
        let thread = std::thread::spawn(move || write_all(&dir, rx));
        Writer { queue, thread }
    }

    /// Queues `item`.
    ///
    /// # Errors
    /// [`OutputError::WriterGone`] if the writer has stopped;
    /// [`finish`](Self::finish) then gives its own error.
    pub fn send(&self, item: Item) -> Result<(), OutputError> {
        self.queue.send(item).map_err(|_| OutputError::WriterGone)
    }

    /// Waits for everything queued to be written and synced.
    ///
    /// # Errors
    /// The first write or filter error.
    pub fn finish(self) -> Result<Written, OutputError> {
        drop(self.queue);
        self.thread
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
    }
}

fn write_all(dir: &Path, rx: Receiver<Item>) -> Result<Written, OutputError> {
    let mut files = BlkFiles::new(dir);
    let genesis = bitcoin::constants::genesis_block(bitcoin::Network::Regtest);
    let mut header = filter_header(&genesis, 0, &[], &FilterHeader::all_zeros())?;
    let mut written = Written {
        filter_headers: vec![(0, header)],
        ..Written::default()
    };
    for item in rx {
        let block = match item {
            Item::Best {
                block,
                height,
                spent,
            } => {
                header = filter_header(&block, height, &spent, &header)?;
                if height.is_multiple_of(FILTER_HEADER_EVERY) {
                    written.filter_headers.push((height, header));
                }
                block
            }
            Item::Stale(block) => block,
        };
        files.append(&bitcoin::consensus::serialize(&block))?;
    }
    written.records = files.records;
    written.bytes = files.total;
    written.files = files.finish()?;
    Ok(written)
}

/// The filter header of `block` after `prev`.
fn filter_header(
    block: &Block,
    height: u32,
    spent: &[(OutPoint, ScriptBuf)],
    prev: &FilterHeader,
) -> Result<FilterHeader, OutputError> {
    let scripts: HashMap<&OutPoint, &ScriptBuf> = spent.iter().map(|(o, s)| (o, s)).collect();
    let filter = BlockFilter::new_script_filter(block, |op| {
        scripts
            .get(op)
            .map(|s| (*s).clone())
            .ok_or(bitcoin::bip158::Error::UtxoMissing(*op))
    })
    .map_err(|source| OutputError::Filter { height, source })?;
    Ok(filter.filter_header(prev))
}

/// The blk files being written.
pub struct BlkFiles {
    dir: PathBuf,
    /// Largest file, bytes.
    limit: u64,
    current: Option<(PathBuf, BufWriter<File>, u64)>,
    names: Vec<String>,
    records: u64,
    total: u64,
}

impl BlkFiles {
    /// Files in `dir`, none opened yet.
    pub fn new(dir: &Path) -> BlkFiles {
        BlkFiles {
            dir: dir.to_path_buf(),
            limit: MAX_FILE_BYTES,
            current: None,
            names: Vec::new(),
            records: 0,
            total: 0,
        }
    }

    /// Appends one record holding `block` (serialized), starting a new file
    /// when this one would pass `MAX_FILE_BYTES`.
    ///
    /// # Errors
    /// [`OutputError::Io`] naming the file.
    pub fn append(&mut self, block: &[u8]) -> Result<(), OutputError> {
        let record = 8 + block.len() as u64;
        if self
            .current
            .as_ref()
            .is_some_and(|(_, _, size)| size + record > self.limit)
        {
            self.close()?;
        }
        let current = match self.current.take() {
            Some(open) => open,
            None => self.open_next()?,
        };
        let (path, out, size) = self.current.insert(current);
        out.write_all(&frame_header(block))
            .and_then(|()| out.write_all(block))
            .map_err(|source| OutputError::io(path, source))?;
        *size += record;
        self.records += 1;
        self.total += record;
        Ok(())
    }

    fn open_next(&mut self) -> Result<(PathBuf, BufWriter<File>, u64), OutputError> {
        let name = format!("blk{:05}.dat", self.names.len());
        let path = self.dir.join(&name);
        let file = File::create(&path).map_err(|source| OutputError::io(&path, source))?;
        self.names.push(name);
        Ok((path, BufWriter::with_capacity(1 << 20, file), 0))
    }

    fn close(&mut self) -> Result<(), OutputError> {
        if let Some((path, out, _)) = self.current.take() {
            let file = out
                .into_inner()
                .map_err(|e| OutputError::io(&path, e.into_error()))?;
            file.sync_all()
                .map_err(|source| OutputError::io(&path, source))?;
        }
        Ok(())
    }

    /// Flushes and syncs the last file; the files' names.
    ///
    /// # Errors
    /// [`OutputError::Io`] naming the file.
    pub fn finish(mut self) -> Result<Vec<String>, OutputError> {
        self.close()?;
        Ok(std::mem::take(&mut self.names))
    }
}

/// The 8 bytes before a serialized block in a blk file: magic, length.
pub fn frame_header(block: &[u8]) -> [u8; 8] {
    let mut h = [0u8; 8];
    h[..4].copy_from_slice(&REGTEST_MAGIC);
    // Blocks are at most 4 MB (the weight limit): the length fits.
    h[4..].copy_from_slice(&(block.len() as u32).to_le_bytes());
    h
}

/// Writes `block` alone in a blk-framed file at `path`.
///
/// # Errors
/// [`OutputError::Io`] naming the file.
pub fn write_single(path: &Path, block: &Block) -> Result<(), OutputError> {
    let bytes = bitcoin::consensus::serialize(block);
    let mut data = frame_header(&bytes).to_vec();
    data.extend_from_slice(&bytes);
    std::fs::write(path, data).map_err(|source| OutputError::io(path, source))
}

impl OutputError {
    /// [`OutputError::Io`] for `path`.
    pub fn io(path: &Path, source: std::io::Error) -> OutputError {
        OutputError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn genesis_filter_header_is_regtests() {
        // testnet-data/regtest-a/filters.json, height 0 (computed by bcoin).
        let genesis = bitcoin::constants::genesis_block(bitcoin::Network::Regtest);
        let h = filter_header(&genesis, 0, &[], &FilterHeader::all_zeros()).expect("filter");
        assert_eq!(
            h.to_string(),
            "485e301e4509d7f0d954bf5b529f3ecef68c5191fd0e635f775c1d0266dc5a2b"
        );
    }

    #[test]
    fn files_roll_over_before_the_limit_and_frame_each_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut files = BlkFiles::new(dir.path());
        assert_eq!(files.limit, MAX_FILE_BYTES);
        files.limit = 1_000;
        let block = vec![7u8; 300];
        for _ in 0..5 {
            files.append(&block).expect("append");
        }
        let names = files.finish().expect("finish");
        assert_eq!(names, ["blk00000.dat", "blk00001.dat"]);
        let first = std::fs::read(dir.path().join(&names[0])).expect("read");
        assert_eq!(first.len(), 3 * 308, "whole records only, under the limit");
        assert_eq!(&first[..4], &REGTEST_MAGIC);
        assert_eq!(&first[4..8], &300u32.to_le_bytes());
    }
}
