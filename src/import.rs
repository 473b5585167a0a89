//! Import of blk-framed block files (Bitcoin Core `blk*.dat` framing: 4 bytes
//! network magic, 4 bytes little-endian length, serialized block) through
//! the same pipeline as blocks from peers.
//!
//! A file is scanned whole before anything is imported: a truncated record,
//! garbage between records, the wrong network's magic or a block that does
//! not decode is a typed [`ImportError`] naming the file and offset, and
//! leaves the database unchanged. Zero bytes after the last record (Core
//! pre-allocates its files) end the file.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use bitcoin::{Block, BlockHash, Network};

use crate::chain::ChainParams;
use crate::pipeline::{Chainstate, PipelineError, SubmitOutcome};

/// Largest record accepted, bytes (a block is at most 4,000,000 weight
/// units, so at most 4,000,000 bytes serialized).
pub const MAX_RECORD_LEN: u32 = 4_000_000;

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
    let data = std::fs::read(path).map_err(|source| ImportError::Io {
        path: path.into(),
        source,
    })?;
    let magic = params.magic();
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos < data.len() {
        let rest = &data[pos..];
        if rest.iter().all(|b| *b == 0) {
            break;
        }
        let offset = pos as u64;
        if rest.len() < 8 {
            return Err(ImportError::Truncated {
                path: path.into(),
                offset,
                needed: 8,
                available: rest.len() as u64,
            });
        }
        let found = [rest[0], rest[1], rest[2], rest[3]];
        if found != magic {
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
            return Err(ImportError::BadMagic {
                path: path.into(),
                offset,
                found,
                expected: magic,
            });
        }
        let len = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        if len > MAX_RECORD_LEN {
            return Err(ImportError::Oversized {
                path: path.into(),
                offset,
                len,
            });
        }
        let end = 8 + len as usize;
        if rest.len() < end {
            return Err(ImportError::Truncated {
                path: path.into(),
                offset,
                needed: end as u64,
                available: rest.len() as u64,
            });
        }
        let block: Block = bitcoin::consensus::deserialize(&rest[8..end]).map_err(|source| {
            ImportError::BadBlock {
                path: path.into(),
                offset,
                source,
            }
        })?;
        out.push(Record { offset, block });
        pos += end;
    }
    Ok(out)
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
    let started = Instant::now();
    // Progress and the summary read published snapshots; the writer's
    // mutex is taken per block only.
    let snapshots = chain.lock().snapshots();
    let params = snapshots.load().params().clone();
    let reorgs_before = snapshots.load().stats().reorgs;
    let mut summary = ImportSummary::default();
    for path in paths {
        let records = read_file(path, &params)?;
        tracing::info!(file = %path.display(), blocks = records.len(), "importing");
        let bar = if progress {
            let bar = indicatif::ProgressBar::new(records.len() as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} blocks {per_sec} eta {eta} {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        } else {
            indicatif::ProgressBar::hidden()
        };
        let mut last_log = Instant::now();
        let file_started = Instant::now();
        for (i, rec) in records.into_iter().enumerate() {
            if stop.load(Ordering::SeqCst) {
                summary.interrupted = true;
                break;
            }
            summary.blocks_read += 1;
            let hash = rec.block.block_hash();
            let outcome = { chain.lock().submit_block(&rec.block)? };
            match outcome {
                SubmitOutcome::Accepted { height, .. } => {
                    summary.accepted += 1;
                    bar.set_message(format!("height {height}"));
                }
                SubmitOutcome::Duplicate => summary.duplicates += 1,
                SubmitOutcome::Rejected { reason, detail } => {
                    tracing::warn!(block_hash = %hash, offset = rec.offset, %reason, "rejected: {detail}");
                    summary.rejected.push((hash, reason, detail));
                }
            }
            bar.inc(1);
            if last_log.elapsed().as_secs() >= 10 {
                let rate = (i + 1) as f64 / file_started.elapsed().as_secs_f64().max(1e-9);
                let height = snapshots.load().index().tip_height();
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
        if summary.interrupted {
            break;
        }
    }
    // The last group of blocks (connected while catching up) made durable,
    // the epochs it completed sealed, and both published before the
    // summary reads them.
    chain.lock().finish_seals()?;
    let cs = snapshots.load();
    let tip = cs.index().tip();
    summary.tip_hash = Some(tip.hash);
    summary.tip_height = tip.height;
    summary.reorgs = cs.stats().reorgs - reorgs_before;
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}
