//! Import of blk-framed block files (Bitcoin Core `blk*.dat` framing: 4 bytes
//! network magic, 4 bytes little-endian length, serialized block) through
//! the same pipeline as blocks from peers.
//!
//! A file is scanned whole before anything is imported, streamed record by
//! record through a bounded buffer (each block decoded to check it, then
//! read and decoded again one block before its submission, so that the
//! import holds one record's bytes and two decoded blocks, the one
//! submitted and the next, which the chain state validates ahead; never
//! the file, whatever its size): a truncated record, garbage between
//! records, the wrong network's magic or a block that does not decode is a
//! typed [`ImportError`] naming the file and offset, found as soon as the
//! scan reaches it, and leaves the database unchanged. Zero bytes after the
//! last record end the file if they run to its end within
//! [`MAX_ZERO_TAIL`] (Core pre-allocates its files); more (`/dev/zero`) are
//! garbage at the offset where they start.

use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bitcoin::{Block, BlockHash, Network};

use crate::chain::ChainParams;
use crate::pipeline::{Chainstate, PipelineError, SubmitOutcome};

/// Largest record accepted, bytes (a block is at most 4,000,000 weight
/// units, so at most 4,000,000 bytes serialized).
pub const MAX_RECORD_LEN: u32 = 4_000_000;

/// Most zero bytes accepted after a file's last record, bytes: Core's
/// `BLOCKFILE_CHUNK_SIZE` (16 MiB, `node/blockstorage.h`), the step in
/// which it pre-allocates a block file, so a file of Core's ends in fewer.
pub const MAX_ZERO_TAIL: u64 = 16 << 20;

/// Read buffer of the scan, bytes.
const SCAN_BUFFER: usize = 1 << 20;

/// Errors of an import.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A record runs past the end of the file.
    #[error("{path}: truncated record at offset {offset}: needs {needed} bytes, {available} left")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Offset of the record.
        offset: u64,
        /// Bytes the record needs.
        needed: u64,
        /// Bytes left in the file.
        available: u64,
    },
    /// The record is framed with another network's magic.
    #[error(
        "{path}: record at offset {offset} belongs to network {found}, this node runs {expected}"
    )]
    OtherNetwork {
        /// The file.
        path: PathBuf,
        /// Offset of the record.
        offset: u64,
        /// The network the magic names.
        found: Network,
        /// The node's network.
        expected: Network,
    },
    /// Bytes that are not a record where one should start.
    #[error(
        "{path}: garbage at offset {offset} (bytes {found:02x?} are not the {expected:02x?} magic)"
    )]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// Offset.
        offset: u64,
        /// What was found.
        found: [u8; 4],
        /// The network's magic.
        expected: [u8; 4],
    },
    /// A record larger than any block can be.
    #[error("{path}: record at offset {offset} claims {len} bytes (max {MAX_RECORD_LEN})")]
    Oversized {
        /// The file.
        path: PathBuf,
        /// Offset.
        offset: u64,
        /// Claimed length.
        len: u32,
    },
    /// The record does not decode as a block (or has trailing bytes).
    #[error("{path}: record at offset {offset} is not a valid block: {source}")]
    BadBlock {
        /// The file.
        path: PathBuf,
        /// Offset.
        offset: u64,
        /// The decoder's error.
        #[source]
        source: bitcoin::consensus::encode::Error,
    },
    /// The pipeline failed (storage).
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
}

/// One decoded record of a file.
#[derive(Debug)]
pub struct Record {
    /// Offset of the record's frame in the file.
    pub offset: u64,
    /// The block.
    pub block: Block,
}

/// Reads and decodes every record of `path`, checking the framing.
///
/// # Errors
/// [`ImportError`] for the first problem found; nothing is imported.
pub fn read_file(path: &Path, params: &ChainParams) -> Result<Vec<Record>, ImportError> {
    match scan_file(path, params) {
        (records, None) => Ok(records),
        (_, Some(e)) => Err(e),
    }
}

/// Reads `path` up to its first problem: the records before it, decoded,
/// and the problem ([`ImportError::Io`] with no records when the file
/// cannot be read). Holds every decoded block of the file at once; an
/// import goes through [`scan_block_file`], which does not.
pub fn scan_file(path: &Path, params: &ChainParams) -> (Vec<Record>, Option<ImportError>) {
    let (file, problem) = scan_block_file(path, params);
    let mut out = Vec::with_capacity(file.len());
    for rec in file.records() {
        match rec {
            Ok(rec) => out.push(rec),
            Err(e) => return (out, Some(e)),
        }
    }
    (out, problem)
}

/// A block file checked up to its first problem: where each good record
/// is, not its bytes nor its decoded blocks (a decoded block takes about
/// 2.5 times its serialized size in memory). [`BlockFile::records`] reads
/// and decodes the records one at a time, again: the process holds one
/// record's bytes plus one block.
#[derive(Debug)]
pub struct BlockFile {
    path: PathBuf,
    /// The open file (`None` when it could not be opened).
    file: Option<File>,
    /// (offset, framed length) of each good record, in file order.
    frames: Vec<(u64, usize)>,
}

impl BlockFile {
    /// Number of good records.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// Whether the file holds no good record.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// The good records in file order, each read and decoded when reached.
    /// A record decoded when the file was scanned decodes again: the error
    /// cases ([`ImportError::Io`], [`ImportError::BadBlock`]: the file
    /// changed since) are kept for the type, not expected.
    pub fn records(&self) -> impl ExactSizeIterator<Item = Result<Record, ImportError>> + '_ {
        self.frames.iter().map(|&(pos, len)| {
            let mut frame = vec![0u8; len];
            let read = match &self.file {
                Some(f) => f.read_exact_at(&mut frame, pos),
                None => Err(std::io::ErrorKind::NotFound.into()),
            };
            read.map_err(|source| ImportError::Io {
                path: self.path.clone(),
                source,
            })?;
            decode_record(&self.path, &frame, pos)
        })
    }
}

/// Reads `path` and checks every record (framing, magic, the block
/// decodes: each decoded then dropped) up to the first problem, streaming
/// it through a 1 MiB buffer (`SCAN_BUFFER`) and one record: the file with the
/// good records before it, and the problem ([`ImportError::Io`] with no
/// records when the file cannot be read). `kakehi import` and `kakehi
/// reindex-chainstate` read their files with it (the latter's last file
/// may end in a torn append, cut at the next start).
pub fn scan_block_file(path: &Path, params: &ChainParams) -> (BlockFile, Option<ImportError>) {
    let mut file = BlockFile {
        path: path.into(),
        file: None,
        frames: Vec::new(),
    };
    let io = |source| ImportError::Io {
        path: path.into(),
        source,
    };
    let f = match File::open(path) {
        Ok(f) => f,
        Err(source) => return (file, Some(io(source))),
    };
    let mut reader = BufReader::with_capacity(SCAN_BUFFER, &f);
    let mut frame = Vec::new();
    let mut pos = 0u64;
    let problem = loop {
        match next_frame(path, params, &mut reader, &mut frame, pos) {
            Ok(None) => break None,
            Ok(Some(len)) => {
                if let Err(e) = decode_record(path, &frame, pos) {
                    break Some(e);
                }
                file.frames.push((pos, len));
                pos += len as u64;
            }
            Err(e) => break Some(e),
        }
    };
    drop(reader);
    file.file = Some(f);
    (file, problem)
}

/// Reads `buf.len()` bytes or up to the end of `r`: the number read.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Whether `r` holds only zero bytes to its end, at most `max` of them
/// (stops reading at the first other byte or past `max`).
fn zeros_to_end(r: &mut impl Read, max: u64) -> std::io::Result<bool> {
    let mut buf = [0u8; 64 << 10];
    let mut seen = 0u64;
    loop {
        let n = read_up_to(r, &mut buf)?;
        if n == 0 {
            return Ok(true);
        }
        seen += n as u64;
        if seen > max || buf[..n].iter().any(|b| *b != 0) {
            return Ok(false);
        }
    }
}

/// Reads the framed record at `offset` (the reader's position in `path`)
/// into `frame`: its framed length, or `None` at the file's end (zero
/// bytes to the end, [`MAX_ZERO_TAIL`] at most, included).
fn next_frame(
    path: &Path,
    params: &ChainParams,
    r: &mut impl Read,
    frame: &mut Vec<u8>,
    offset: u64,
) -> Result<Option<usize>, ImportError> {
    let io = |source| ImportError::Io {
        path: path.into(),
        source,
    };
    let mut head = [0u8; 8];
    let got = read_up_to(r, &mut head).map_err(io)?;
    if got == 0 {
        return Ok(None);
    }
    if head[..got].iter().all(|b| *b == 0) {
        if zeros_to_end(r, MAX_ZERO_TAIL.saturating_sub(got as u64)).map_err(io)? {
            return Ok(None);
        }
        // Zeros that run on into data or past any pre-allocation.
        return Err(ImportError::BadMagic {
            path: path.into(),
            offset,
            found: [0; 4],
            expected: params.magic(),
        });
    }
    if got < 8 {
        return Err(ImportError::Truncated {
            path: path.into(),
            offset,
            needed: 8,
            available: got as u64,
        });
    }
    check_magic(path, params, [head[0], head[1], head[2], head[3]], offset)?;
    let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if len > MAX_RECORD_LEN {
        return Err(ImportError::Oversized {
            path: path.into(),
            offset,
            len,
        });
    }
    frame.clear();
    frame.extend_from_slice(&head);
    let got = r.take(u64::from(len)).read_to_end(frame).map_err(io)?;
    if got < len as usize {
        return Err(ImportError::Truncated {
            path: path.into(),
            offset,
            needed: 8 + u64::from(len),
            available: 8 + got as u64,
        });
    }
    Ok(Some(frame.len()))
}

/// Decodes the block of the framed record `frame` (magic and length
/// checked) at `offset` in `path`.
fn decode_record(path: &Path, frame: &[u8], offset: u64) -> Result<Record, ImportError> {
    let block: Block =
        bitcoin::consensus::deserialize(&frame[8..]).map_err(|source| ImportError::BadBlock {
            path: path.into(),
            offset,
            source,
        })?;
    Ok(Record { offset, block })
}

/// The record's magic must be the network's: another network's is
/// [`ImportError::OtherNetwork`], anything else [`ImportError::BadMagic`].
fn check_magic(
    path: &Path,
    params: &ChainParams,
    found: [u8; 4],
    offset: u64,
) -> Result<(), ImportError> {
    let magic = params.magic();
    if found == magic {
        return Ok(());
    }
    for net in [
        Network::Bitcoin,
        Network::Testnet,
        Network::Testnet4,
        Network::Signet,
        Network::Regtest,
    ] {
        if net.magic().to_bytes() == found {
            return Err(ImportError::OtherNetwork {
                path: path.into(),
                offset,
                found: net,
                expected: params.network,
            });
        }
    }
    Err(ImportError::BadMagic {
        path: path.into(),
        offset,
        found,
        expected: magic,
    })
}

/// What an import did.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct ImportSummary {
    /// Records read.
    pub blocks_read: u64,
    /// Blocks stored (connected or kept on a side branch).
    pub accepted: u64,
    /// Blocks already stored.
    pub duplicates: u64,
    /// Rejected blocks: (hash, Core reject string, detail).
    pub rejected: Vec<(BlockHash, String, String)>,
    /// Reorganisations during the import.
    pub reorgs: u64,
    /// Active tip after the import.
    pub tip_hash: Option<BlockHash>,
    /// Active tip height.
    pub tip_height: u32,
    /// Whether the import stopped early on a shutdown request.
    pub interrupted: bool,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// Imports `paths` in order into `chain`. Each file is scanned whole first
/// (see the module docs). Between blocks `stop` is checked: when set, the
/// import ends at the block boundary just reached.
///
/// # Errors
/// [`ImportError`]: a bad file (nothing of it imported) or a storage failure.
pub fn import_files(
    chain: &parking_lot::Mutex<Chainstate>,
    paths: &[PathBuf],
    stop: &AtomicBool,
    progress: bool,
) -> Result<ImportSummary, ImportError> {
    let mut run = ImportRun::new(chain);
    for path in paths {
        let file = match scan_block_file(path, run.params()) {
            (file, None) => file,
            (_, Some(e)) => return Err(e),
        };
        run.import(&file, stop, progress)?;
        if run.summary.interrupted {
            break;
        }
    }
    run.finish()
}

/// An import in progress: blocks submitted one by one to a chain state,
/// counted in an [`ImportSummary`].
pub struct ImportRun<'a> {
    chain: &'a parking_lot::Mutex<Chainstate>,
    snapshots: crate::snapshot::Snapshots,
    params: ChainParams,
    reorgs_before: u64,
    started: Instant,
    /// What the import did so far.
    pub summary: ImportSummary,
}

impl<'a> ImportRun<'a> {
    /// Starts an import into `chain`.
    pub fn new(chain: &'a parking_lot::Mutex<Chainstate>) -> Self {
        // Progress and the summary read published snapshots; the writer's
        // mutex is taken per block only.
        let snapshots = chain.lock().snapshots();
        let params = snapshots.load().params().clone();
        let reorgs_before = snapshots.load().stats().reorgs;
        Self {
            chain,
            snapshots,
            params,
            reorgs_before,
            started: Instant::now(),
            summary: ImportSummary::default(),
        }
    }

    /// The chain's parameters.
    pub fn params(&self) -> &ChainParams {
        &self.params
    }

    /// Submits the good blocks of one scanned file in order, decoding each
    /// one block ahead of its submission ([`BlockFile::records`]: at most
    /// two decoded at once), with a progress bar on
    /// standard error when `progress`; stops at the block boundary where
    /// `stop` is seen set (`summary.interrupted`).
    ///
    /// # Errors
    /// [`ImportError::Pipeline`]: a storage failure.
    pub fn import(
        &mut self,
        file: &BlockFile,
        stop: &AtomicBool,
        progress: bool,
    ) -> Result<(), ImportError> {
        tracing::info!(file = %file.path.display(), blocks = file.len(), "importing");
        let bar = progress_bar(progress, file.len() as u64);
        let mut last_log = Instant::now();
        let file_started = Instant::now();
        // One record decoded ahead: the chain state validates it while the
        // current block's scripts run (`Chainstate::submit_block_with_next`).
        let mut records = file
            .records()
            .map(|r| r.map(|rec| (rec.offset, Arc::new(rec.block))))
            .peekable();
        let mut i = 0;
        while let Some(rec) = records.next() {
            if stop.load(Ordering::SeqCst) {
                self.summary.interrupted = true;
                break;
            }
            let (offset, block) = rec?;
            let next = match records.peek() {
                Some(Ok((_, next))) => Some(Arc::clone(next)),
                _ => None,
            };
            self.submit(offset, block, next, &bar)?;
            i += 1;
            bar.inc(1);
            if last_log.elapsed().as_secs() >= 10 {
                let rate = i as f64 / file_started.elapsed().as_secs_f64().max(1e-9);
                let height = self.snapshots.load().index().tip_height();
                let remaining = bar.length().unwrap_or(0).saturating_sub(bar.position());
                tracing::info!(
                    height,
                    blocks_per_s = format!("{rate:.0}"),
                    remaining_blocks = remaining,
                    eta_s = (remaining as f64 / rate.max(1e-9)).round() as u64,
                    "import progress"
                );
                last_log = Instant::now();
            }
        }
        bar.finish_and_clear();
        Ok(())
    }

    /// Submits one block (read at `offset`; `next` is the file's next
    /// one, when it decodes) and counts its outcome.
    fn submit(
        &mut self,
        offset: u64,
        block: Arc<Block>,
        next: Option<Arc<Block>>,
        bar: &indicatif::ProgressBar,
    ) -> Result<(), ImportError> {
        self.summary.blocks_read += 1;
        let hash = block.block_hash();
        let outcome = { self.chain.lock().submit_block_with_next(block, next)? };
        match outcome {
            SubmitOutcome::Accepted { height, .. } => {
                self.summary.accepted += 1;
                bar.set_message(format!("height {height}"));
            }
            SubmitOutcome::Duplicate => self.summary.duplicates += 1,
            SubmitOutcome::Rejected { reason, detail } => {
                tracing::warn!(block_hash = %hash, offset, %reason, "rejected: {detail}");
                self.summary.rejected.push((hash, reason, detail));
            }
        }
        Ok(())
    }

    /// Makes the last group of blocks durable and seals the epochs it
    /// completed (both published before the summary reads them), and
    /// returns the summary.
    ///
    /// # Errors
    /// [`ImportError::Pipeline`]: a storage failure.
    pub fn finish(mut self) -> Result<ImportSummary, ImportError> {
        self.chain.lock().finish_seals()?;
        let cs = self.snapshots.load();
        let tip = cs.index().tip();
        self.summary.tip_hash = Some(tip.hash);
        self.summary.tip_height = tip.height;
        self.summary.reorgs = cs.stats().reorgs - self.reorgs_before;
        self.summary.seconds = self.started.elapsed().as_secs_f64();
        Ok(self.summary)
    }
}

/// A bar of `len` blocks on standard error, or a hidden one.
fn progress_bar(progress: bool, len: u64) -> indicatif::ProgressBar {
    if !progress {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} blocks {per_sec} eta {eta} {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regtest_a() -> Vec<u8> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/testnet-data/regtest-a/blocks.dat"
        );
        std::fs::read(path).expect("regtest-a blocks")
    }

    /// Framed length of the record at `pos` of `data`.
    fn frame_len(data: &[u8], pos: usize) -> usize {
        8 + u32::from_le_bytes([data[pos + 4], data[pos + 5], data[pos + 6], data[pos + 7]])
            as usize
    }

    /// A file whose fourth record does not decode: the scan keeps the three
    /// before it and names the fourth; the records decode one by one to
    /// the blocks of those three frames, at their offsets.
    #[test]
    fn block_file_keeps_good_records_and_decodes_them_when_reached() {
        let good = regtest_a();
        let mut ends = vec![0usize];
        for _ in 0..4 {
            let at = *ends.last().unwrap();
            ends.push(at + frame_len(&good, at));
        }
        let mut bytes = good[..ends[4]].to_vec();
        bytes[ends[3] + 8 + 80] = 0xfd; // a huge transaction count
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bad4.dat");
        std::fs::write(&path, &bytes).expect("write");
        let params = ChainParams::new(Network::Regtest);

        let (file, problem) = scan_block_file(&path, &params);
        assert!(
            matches!(problem, Some(ImportError::BadBlock { offset, .. }) if offset == ends[3] as u64),
            "{problem:?}"
        );
        assert_eq!(file.len(), 3);
        let records: Vec<Record> = file.records().map(|r| r.expect("decodes")).collect();
        for (i, rec) in records.iter().enumerate() {
            assert_eq!(rec.offset, ends[i] as u64);
            let want: Block = bitcoin::consensus::deserialize(&good[ends[i] + 8..ends[i + 1]])
                .expect("regtest-a block");
            assert_eq!(rec.block, want);
        }
        let (decoded, again) = scan_file(&path, &params);
        assert_eq!(decoded.len(), 3);
        assert!(matches!(again, Some(ImportError::BadBlock { .. })));
    }
}
