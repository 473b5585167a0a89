//! The row log: the write-ahead log of the index rows, the file `LOG` of
//! `index/rows/`. Each small commit appends the rows it makes durable (the
//! three sets' keys) as one record and syncs it once (`fdatasync`), in
//! place of a run file per set and a new manifest; the rows stay in the
//! sets' memory until a flush writes them to runs (`super::RowSets`).
//!
//! Record (integers big-endian): payload length u32 ‖ generation u64 ‖
//! CRC-32 of the length, generation and payload (u32) ‖ payload; payload:
//! for each of the [`SETS`] sets (transactions, spends, address history)
//! a key count u32 ‖ that many keys of the set's length ([`KEY_LENS`]).
//!
//! - **One file, overwritten in place.** The file is never truncated: it
//!   starts as [`GROW`] bytes of zeros (written, fsynced, the directory
//!   fsynced once, when the file is created), grows by zeros written ahead
//!   of the records when a record would pass its end, and each flush to
//!   runs starts the next generation at offset 0 over the old records. So
//!   an append changes no file size (once the file has grown) and needs
//!   no directory sync: one `fdatasync` per commit.
//! - **Generations.** The manifest names the generation whose records are
//!   not yet in runs; a flush writes runs and a manifest naming the next
//!   generation, then restarts the log. Replay reads records from offset 0
//!   while each is whole, has a good CRC and that generation, and stops at
//!   the first that is not: a torn append (a crash mid-append: never
//!   acknowledged), zeros, or an older generation's record (already in
//!   runs). Replaying records whose rows are also in runs only sets keys
//!   present already: replay is idempotent.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::error::RunError;
use super::manifest::{sync_dir, SETS};
use super::{HISTORY_KEY, SPEND_KEY, TX_KEY};
use crate::store::durable;
use crate::store::fault::{self, IoOp};

/// File name of the log.
pub const NAME: &str = "LOG";
/// Key length of each set, in record order.
pub const KEY_LENS: [usize; SETS] = [TX_KEY, SPEND_KEY, HISTORY_KEY];
/// Bytes of a record's header.
const HEADER: usize = 16;
/// Bytes of zeros a new log starts with, and the least it grows by: 1 MiB.
pub const GROW: u64 = 1 << 20;
/// Bytes of zeros written per call while growing.
const ZEROS: usize = 1 << 16;

/// The open log: where the next record goes.
#[derive(Debug)]
pub struct RowLog {
    path: PathBuf,
    file: File,
    /// Generation of the records written now.
    generation: u64,
    /// Offset of the next record (the end of the valid records).
    end: u64,
    /// The file's length (records, then zeros or old records).
    len: u64,
}

/// Where the durable records of the row log end: its generation and the
/// byte offset after its last record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogPosition {
    /// The generation (named by the manifest).
    pub generation: u64,
    /// Offset after the last record, bytes.
    pub end: u64,
}

impl LogPosition {
    /// 16 bytes: generation u64 BE ‖ end u64 BE.
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.generation.to_be_bytes());
        b[8..].copy_from_slice(&self.end.to_be_bytes());
        b
    }

    /// Parses [`LogPosition::encode`]; `None` when not 16 bytes.
    pub fn decode(b: &[u8]) -> Option<LogPosition> {
        let b: &[u8; 16] = b.try_into().ok()?;
        let (g, e) = b.split_at(8);
        Some(LogPosition {
            generation: u64::from_be_bytes(g.try_into().ok()?),
            end: u64::from_be_bytes(e.try_into().ok()?),
        })
    }
}

/// The keys of one record, per set: `count × KEY_LENS[i]` bytes each.
pub type Record<'a> = [&'a [u8]; SETS];

/// The bytes of a record of `generation` holding `sets`.
pub fn encode(generation: u64, sets: &Record<'_>) -> Vec<u8> {
    let payload: usize = sets.iter().map(|s| 4 + s.len()).sum();
    let mut v = Vec::with_capacity(HEADER + payload);
    v.extend_from_slice(&(payload as u32).to_be_bytes());
    v.extend_from_slice(&generation.to_be_bytes());
    v.extend_from_slice(&[0; 4]);
    for (set, len) in sets.iter().zip(KEY_LENS) {
        v.extend_from_slice(&((set.len() / len) as u32).to_be_bytes());
        v.extend_from_slice(set);
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&v[..12]);
    crc.update(&v[HEADER..]);
    v[12..HEADER].copy_from_slice(&crc.finalize().to_be_bytes());
    v
}

/// The record at the start of `b`, if it is whole, of `generation` and
/// its CRC matches: its sets and its length in bytes. A record whose CRC
/// matches but whose layout does not is `Err` (no torn append makes one).
fn decode(b: &[u8], generation: u64) -> Result<Option<(Record<'_>, usize)>, &'static str> {
    let word = |at: usize| b.get(at..at + 4).and_then(|w| w.try_into().ok());
    let (Some(len), Some(crc)) = (word(0).map(u32::from_be_bytes), word(12)) else {
        return Ok(None);
    };
    let Some(payload) = b.get(HEADER..HEADER + len as usize) else {
        return Ok(None);
    };
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&b[..12]);
    hasher.update(payload);
    let ours = b[4..12] == generation.to_be_bytes();
    if !ours || hasher.finalize() != u32::from_be_bytes(crc) {
        return Ok(None);
    }
    let mut rest = payload;
    let mut sets: Record<'_> = [&[]; SETS];
    for (set, key_len) in sets.iter_mut().zip(KEY_LENS) {
        let bad = "a record's key counts do not match its length";
        let count = rest.get(..4).ok_or(bad)?;
        let count = u32::from_be_bytes([count[0], count[1], count[2], count[3]]) as usize;
        let bytes = count.checked_mul(key_len).ok_or(bad)?;
        *set = rest.get(4..4 + bytes).ok_or(bad)?;
        rest = &rest[4 + bytes..];
    }
    if !rest.is_empty() {
        return Err("a record's key counts do not match its length");
    }
    Ok(Some((sets, HEADER + len as usize)))
}

/// Calls `f` with each record of `generation` at the start of `b`, in
/// order, up to the first that is not whole, not of `generation` or not
/// matching its CRC. Returns the end of the last record read.
///
/// # Errors
/// The reason, for a record whose CRC matches but whose layout does not.
pub fn replay(
    b: &[u8],
    generation: u64,
    f: &mut dyn FnMut(&Record<'_>),
) -> Result<u64, &'static str> {
    let mut at = 0;
    while let Some((sets, len)) = decode(&b[at..], generation)? {
        f(&sets);
        at += len;
    }
    Ok(at as u64)
}

impl RowLog {
    /// Opens the log of `dir` (creating it, [`GROW`] bytes of zeros, when
    /// there is none) and replays its records of `generation` into `f`;
    /// the next record goes after them.
    ///
    /// # Errors
    /// [`RunError::Io`] naming the file or directory;
    /// [`RunError::Corrupt`] for a record whose CRC matches but whose
    /// layout does not.
    pub fn open(
        dir: &Path,
        generation: u64,
        f: &mut dyn FnMut(&Record<'_>),
    ) -> Result<RowLog, RunError> {
        let path = dir.join(NAME);
        let io = RunError::io(&path);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Self::create(dir, &path)?;
                Vec::new()
            }
            Err(e) => return Err(io(e)),
        };
        let end = replay(&bytes, generation, f).map_err(|r| RunError::corrupt(&path, r))?;
        let file = File::options().read(true).write(true).open(&path);
        let file = file.map_err(&io)?;
        let len = file.metadata().map_err(&io)?.len();
        drop(io);
        Ok(RowLog {
            path,
            file,
            generation,
            end,
            len,
        })
    }

    /// Creates the log file at `path`: [`GROW`] bytes of zeros, fsynced,
    /// and its directory entry.
    fn create(dir: &Path, path: &Path) -> Result<(), RunError> {
        let tmp = dir.join(format!("{NAME}.tmp"));
        let zeros = vec![0u8; GROW as usize];
        durable::write_synced(&tmp, &zeros).map_err(RunError::io(&tmp))?;
        durable::rename(&tmp, path).map_err(RunError::io(path))?;
        sync_dir(dir)
    }

    /// Appends a record of `sets` and syncs it (`fdatasync`): once this
    /// returns, the rows survive a crash.
    ///
    /// # Errors
    /// [`RunError::Io`] naming the log: the record may be partly written
    /// (a later replay stops before it); the next record overwrites it.
    pub fn append(&mut self, sets: &Record<'_>) -> Result<(), RunError> {
        let record = encode(self.generation, sets);
        let end = self.end + record.len() as u64;
        if end > self.len {
            let grown = end.max(self.len + GROW);
            write_zeros(&self.file, &self.path, self.len, grown)?;
            self.len = grown;
        }
        let io = RunError::io(&self.path);
        fault::check(IoOp::Write, &self.path).map_err(&io)?;
        self.file.write_all_at(&record, self.end).map_err(&io)?;
        fault::check_sync_to(&self.path, end).map_err(&io)?;
        self.file.sync_data().map_err(&io)?;
        self.end = end;
        Ok(())
    }

    /// Starts `generation` at offset 0 (its records overwrite the old
    /// ones), once a manifest naming it is durable. No I/O.
    pub fn restart(&mut self, generation: u64) {
        self.generation = generation;
        self.end = 0;
    }

    /// Bytes of valid records (the next record's offset).
    #[cfg(test)]
    pub fn end(&self) -> u64 {
        self.end
    }

    /// The generation written now and the end of its valid records.
    pub fn position(&self) -> LogPosition {
        LogPosition {
            generation: self.generation,
            end: self.end,
        }
    }
}

/// Writes zeros to `file` (at `path`) from `from` to `to`, not synced.
fn write_zeros(file: &File, path: &Path, from: u64, to: u64) -> Result<(), RunError> {
    let io = RunError::io(path);
    let zeros = vec![0u8; ZEROS];
    fault::check(IoOp::Write, path).map_err(&io)?;
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZEROS as u64);
        file.write_all_at(&zeros[..n as usize], at).map_err(&io)?;
        at += n;
    }
    Ok(())
}
