//! The manifest: which run files make up each row set, and the next file
//! number. Replaced atomically: written to `MANIFEST.tmp`, fsynced, the
//! directory fsynced (so the runs it names and the temporary file are
//! there), renamed over `MANIFEST`, the directory fsynced again.
//!
//! Layout (integers big-endian): magic `KKHRMAN2` (8) ‖ next file number
//! u64 ‖ row log generation u64 (its records not yet in runs: `log.rs`) ‖
//! for each of the [`SETS`] sets: run count u32 ‖ each run's number u64 ‖
//! CRC-32 of all before (u32). A manifest of the first layout (magic
//! `KKHRMAN1`, no generation: written before the row log existed) reads
//! as generation [`FIRST_GENERATION`], with no log file yet.

use std::path::Path;

use super::error::RunError;
use crate::store::durable;

/// Magic of the manifest.
const MAGIC: &[u8; 8] = b"KKHRMAN2";
/// Magic of the first layout (no log generation).
const MAGIC_V1: &[u8; 8] = b"KKHRMAN1";
/// The row log's generation in a new store or a first-layout manifest.
pub const FIRST_GENERATION: u64 = 1;
/// Number of row sets (transactions, spends, address history).
pub const SETS: usize = 3;
/// File name of the manifest.
pub const NAME: &str = "MANIFEST";
/// File name of the manifest being written.
pub const TMP_NAME: &str = "MANIFEST.tmp";

/// The manifest's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// Number of the next run file.
    pub next: u64,
    /// Generation of the row log's records not yet in runs.
    pub log_generation: u64,
    /// Each set's run numbers, oldest first.
    pub sets: [Vec<u64>; SETS],
}

impl Default for Manifest {
    fn default() -> Self {
        Manifest {
            next: 0,
            log_generation: FIRST_GENERATION,
            sets: Default::default(),
        }
    }
}

impl Manifest {
    /// The bytes of the manifest.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&self.next.to_be_bytes());
        v.extend_from_slice(&self.log_generation.to_be_bytes());
        for set in &self.sets {
            v.extend_from_slice(&(set.len() as u32).to_be_bytes());
            for n in set {
                v.extend_from_slice(&n.to_be_bytes());
            }
        }
        v.extend_from_slice(&crc32fast::hash(&v).to_be_bytes());
        v
    }

    /// Parses [`Manifest::encode`]; `None` when damaged.
    pub fn decode(b: &[u8]) -> Option<Manifest> {
        let (body, crc) = b.split_at(b.len().checked_sub(4)?);
        let v1 = body.starts_with(MAGIC_V1);
        if crc32fast::hash(body).to_be_bytes() != crc || !(v1 || body.starts_with(MAGIC)) {
            return None;
        }
        let mut r = &body[MAGIC.len()..];
        let mut take = |n: usize| -> Option<&[u8]> {
            let (a, rest) = (r.get(..n)?, r.get(n..)?);
            r = rest;
            Some(a)
        };
        let u64_of = |a: &[u8]| a.try_into().ok().map(u64::from_be_bytes);
        let next = u64_of(take(8)?)?;
        let log_generation = match v1 {
            true => FIRST_GENERATION,
            false => u64_of(take(8)?)?,
        };
        let mut sets: [Vec<u64>; SETS] = Default::default();
        for set in &mut sets {
            let count = u32::from_be_bytes(take(4)?.try_into().ok()?);
            for _ in 0..count {
                set.push(u64_of(take(8)?)?);
            }
        }
        take(0).filter(|_| r.is_empty())?;
        Some(Manifest {
            next,
            log_generation,
            sets,
        })
    }

    /// Reads the manifest of `dir`; `None` when there is none.
    ///
    /// # Errors
    /// [`RunError::Io`], or [`RunError::Corrupt`] naming the file.
    pub fn read(dir: &Path) -> Result<Option<Manifest>, RunError> {
        let path = dir.join(NAME);
        match std::fs::read(&path) {
            Ok(b) => Manifest::decode(&b)
                .map(Some)
                .ok_or_else(|| RunError::corrupt(&path, "manifest checksum or layout")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(RunError::io(&path)(e)),
        }
    }

    /// Replaces the manifest of `dir` with this one, durably (module doc).
    ///
    /// # Errors
    /// [`WriteError`]: [`RunError::Io`] naming the file or directory that
    /// failed, and whether the rename was done.
    pub fn write(&self, dir: &Path) -> Result<(), WriteError> {
        let tmp = dir.join(TMP_NAME);
        let io = RunError::io(&tmp);
        let before = |e: std::io::Error| WriteError::Before(io(e));
        durable::write_synced(&tmp, &self.encode()).map_err(before)?;
        sync_dir(dir).map_err(WriteError::Before)?;
        let path = dir.join(NAME);
        let before = |e| WriteError::Before(RunError::io(&path)(e));
        durable::rename(&tmp, &path).map_err(before)?;
        sync_dir(dir).map_err(WriteError::After)
    }
}

/// A failed [`Manifest::write`].
#[derive(Debug)]
pub enum WriteError {
    /// Before the rename: the old manifest stands; the files only the new
    /// one names may be deleted.
    Before(RunError),
    /// The directory sync after the rename: after a crash either manifest
    /// may stand, so every file either names must stay.
    After(RunError),
}

impl WriteError {
    /// The error, whichever step failed.
    pub fn into_inner(self) -> RunError {
        match self {
            WriteError::Before(e) | WriteError::After(e) => e,
        }
    }
}

/// Fsyncs the directory `dir` (its entries: new files, renames).
///
/// # Errors
/// [`RunError::Io`] naming `dir`.
pub fn sync_dir(dir: &Path) -> Result<(), RunError> {
    durable::sync_dir(dir).map_err(RunError::io(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let m = Manifest {
            next: 9,
            log_generation: 3,
            sets: [vec![1, 4], vec![], vec![8]],
        };
        let b = m.encode();
        assert_eq!(b.len(), 8 + 8 + 8 + (4 + 16) + 4 + (4 + 8) + 4);
        assert_eq!(Manifest::decode(&b), Some(m.clone()));
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x40;
            assert_eq!(Manifest::decode(&d), None, "byte {i}");
        }
        assert_eq!(Manifest::decode(&b[..b.len() - 1]), None);
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Manifest::read(dir.path()).unwrap(), None);
        m.write(dir.path()).map_err(WriteError::into_inner).unwrap();
        assert_eq!(Manifest::read(dir.path()).unwrap(), Some(m));
    }

    /// A manifest of the first layout (before the row log) reads with the
    /// first log generation.
    #[test]
    fn first_layout_reads() {
        let mut v = MAGIC_V1.to_vec();
        v.extend_from_slice(&5u64.to_be_bytes());
        v.extend_from_slice(&1u32.to_be_bytes());
        v.extend_from_slice(&2u64.to_be_bytes());
        v.extend_from_slice(&[0; 8]);
        v.extend_from_slice(&crc32fast::hash(&v).to_be_bytes());
        let m = Manifest::decode(&v).unwrap();
        assert_eq!(m.log_generation, FIRST_GENERATION);
        assert_eq!((m.next, m.sets), (5, [vec![2], vec![], vec![]]));
    }
}
