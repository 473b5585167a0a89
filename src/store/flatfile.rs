//! Flat append-only files in Bitcoin Core's blk framing: for each record,
//! 4 bytes network magic, 4 bytes little-endian length, then the payload.
//! Used for raw blocks (`blocks/blkNNNNN.dat`), filters
//! (`filters/fltNNNNN.dat`) and spent outputs (`spent/spNNNNN.dat`).
//!
//! Appends are buffered by the OS; [`FlatFiles::sync`] makes them durable,
//! [`sync_concurrently`] several directories' at once.
//! The committed length of the current file is kept by the caller (in the
//! index database); at start-up, once the caller has checked that position
//! against its other stores, [`FlatFiles::cut_uncommitted`] cuts anything
//! past it, as btcd does, so a crash never leaves a half record that the
//! index points to.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

/// Read handles kept open per directory (most recently used first); reads
/// use positional I/O (`pread`), so one handle serves concurrent readers.
const READ_HANDLES: usize = 4;

/// Where one record's payload lives: file number, byte offset of the payload
/// (after the 8-byte frame header) and its length in bytes.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct FileLoc {
    /// File number (`NNNNN` in the file name).
    pub file: u32,
    /// Offset of the payload in the file, in bytes.
    pub offset: u64,
    /// Payload length in bytes.
    pub len: u32,
}

/// The end of the data a commit covers: current file number and its length.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct FlatPos {
    /// File number.
    pub file: u32,
    /// Length in bytes.
    pub len: u64,
}

/// Errors of the flat files.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FlatFileError {
    /// An I/O error on a file.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A record's frame does not match what the index says.
    #[error("corrupt record in {path} at offset {offset}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The payload's offset.
        offset: u64,
        /// What did not match.
        reason: &'static str,
    },
    /// A file is shorter than the data committed in it: it was truncated
    /// after the commit (a damaged disk, a bad copy), and records the index
    /// points to are gone.
    #[error("{path} is {len} bytes, but committed records reach byte {committed}: the file was truncated")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Its length now, bytes.
        len: u64,
        /// Where the committed data ends, bytes.
        committed: u64,
    },
    /// A payload too large for one record (over 4 GiB - 1).
    #[error("record of {len} bytes is too large")]
    TooLarge {
        /// Its length.
        len: usize,
    },
}

/// A directory of numbered append-only files with one name prefix: the
/// writer's side (appends, syncs, truncation at start-up). Readers use its
/// [`FlatReader`] ([`FlatFiles::reader`]).
#[derive(Debug)]
pub struct FlatFiles {
    max_file_size: u64,
    current: FlatPos,
    writer: Option<File>,
    /// Records appended since the last sync.
    dirty: bool,
    reader: Arc<FlatReader>,
}

/// The read side of a [`FlatFiles`] directory, shared (`Arc`) between the
/// writer and any number of readers: positional reads of records whose
/// location the caller got from committed data. The files are append-only
/// while the node runs, so a committed record never changes under a reader.
#[derive(Debug)]
pub struct FlatReader {
    dir: PathBuf,
    prefix: &'static str,
    magic: [u8; 4],
    /// Open read handles by file number, most recently used first (at most
    /// [`READ_HANDLES`]); cleared when files are truncated at start-up.
    /// Held only to look a handle up, never during a read.
    handles: Mutex<Vec<(u32, Arc<File>)>>,
}

impl FlatFiles {
    /// Opens (creating `dir`) at the committed position `pos`. Nothing past
    /// `pos` is cut here: `pos` comes from the index database, which may be
    /// damaged itself (an index that lost its commits opens with an earlier
    /// position, or none), and a cut to a wrong position would destroy
    /// committed blocks, the source a reindex rebuilds everything from. The
    /// caller cuts with [`FlatFiles::cut_uncommitted`] once its stores
    /// agree; until then readers read only committed records, and the
    /// first append cuts the current file to `pos` anyway.
    ///
    /// # Errors
    /// [`FlatFileError::Io`]; [`FlatFileError::Truncated`] when the file
    /// at `pos` is shorter than `pos.len` (it lost committed records).
    pub fn open(
        dir: &Path,
        prefix: &'static str,
        magic: [u8; 4],
        max_file_size: u64,
        pos: FlatPos,
    ) -> Result<Self, FlatFileError> {
        std::fs::create_dir_all(dir).map_err(|source| FlatFileError::Io {
            path: dir.into(),
            source,
        })?;
        let files = FlatFiles {
            max_file_size,
            current: pos,
            writer: None,
            dirty: false,
            reader: Arc::new(FlatReader {
                dir: dir.into(),
                prefix,
                magic,
                handles: Mutex::new(Vec::new()),
            }),
        };
        files.current_len()?;
        Ok(files)
    }

    /// The length of the current file (`None` when it does not exist yet).
    ///
    /// # Errors
    /// [`FlatFileError::Io`]; [`FlatFileError::Truncated`] when it is
    /// shorter than the committed position (it lost committed records).
    fn current_len(&self) -> Result<Option<u64>, FlatFileError> {
        let path = self.path(self.current.file);
        let len = match std::fs::metadata(&path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(FlatFileError::Io { path, source }),
        };
        if len < self.current.len {
            return Err(FlatFileError::Truncated {
                path,
                len,
                committed: self.current.len,
            });
        }
        Ok(Some(len))
    }

    fn path(&self, file: u32) -> PathBuf {
        self.reader.path(file)
    }

    fn io(&self, file: u32) -> impl FnOnce(std::io::Error) -> FlatFileError + '_ {
        self.reader.io(file)
    }

    /// Bytes on disk past the committed position: the rest of the current
    /// file and every later file (records a crash left uncommitted, or
    /// committed ones an index that lost its commits no longer counts).
    ///
    /// # Errors
    /// [`FlatFileError::Io`].
    pub fn bytes_past_position(&self) -> Result<u64, FlatFileError> {
        let Some(current) = self.current_len()? else {
            return Ok(0);
        };
        let mut past = current - self.current.len;
        let mut n = self.current.file + 1;
        loop {
            let path = self.path(n);
            match std::fs::metadata(&path) {
                Ok(m) => past += m.len(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(past),
                Err(source) => return Err(FlatFileError::Io { path, source }),
            }
            n += 1;
        }
    }

    /// Cuts everything past the committed position (the rest of the current
    /// file, every later file), durably.
    ///
    /// # Errors
    /// [`FlatFileError::Io`]; [`FlatFileError::Truncated`] when the current
    /// file is shorter than the position.
    pub fn cut_uncommitted(&mut self) -> Result<(), FlatFileError> {
        let pos = self.current;
        self.writer = None;
        self.reader.handles.lock().clear();
        let mut n = pos.file + 1;
        while self.path(n).exists() {
            std::fs::remove_file(self.path(n)).map_err(self.io(n))?;
            n += 1;
        }
        if let Some(actual) = self.current_len()?.filter(|&len| len > pos.len) {
            let path = self.path(pos.file);
            tracing::warn!(file = %path.display(), committed = pos.len, actual, "truncating flat file past its committed length");
            let f = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(self.io(pos.file))?;
            f.set_len(pos.len).map_err(self.io(pos.file))?;
            f.sync_all().map_err(self.io(pos.file))?;
        }
        Ok(())
    }

    /// The position after the last appended record.
    pub fn position(&self) -> FlatPos {
        self.current
    }

    /// Appends one record; returns where its payload is. Not durable until
    /// [`FlatFiles::sync`].
    ///
    /// # Errors
    /// [`FlatFileError::Io`], [`FlatFileError::TooLarge`].
    pub fn append(&mut self, payload: &[u8]) -> Result<FileLoc, FlatFileError> {
        let len = u32::try_from(payload.len())
            .map_err(|_| FlatFileError::TooLarge { len: payload.len() })?;
        if self.current.len > 0 && self.current.len + 8 + u64::from(len) > self.max_file_size {
            self.sync()?;
            self.writer = None;
            self.current = FlatPos {
                file: self.current.file + 1,
                len: 0,
            };
        }
        if self.writer.is_none() {
            let file = self.current.file;
            let path = self.path(file);
            let f = crate::fds::retry_exhausted(&path, || {
                OpenOptions::new().create(true).append(true).open(&path)
            })
            .map_err(self.io(file))?;
            // Bytes past the position are a frame whose write failed.
            if f.metadata().map_err(self.io(file))?.len() > self.current.len {
                f.set_len(self.current.len).map_err(self.io(file))?;
            }
            self.writer = Some(f);
        }
        let file = self.current.file;
        let mut frame = Vec::with_capacity(8 + payload.len());
        frame.extend_from_slice(&self.reader.magic);
        frame.extend_from_slice(&len.to_le_bytes());
        frame.extend_from_slice(payload);
        let path = self.path(file);
        if let Some(w) = self.writer.as_mut() {
            // An injected fault writes half the frame first, as a disk
            // that fills up mid-write does (`store::fault`).
            let written = match super::fault::check(super::fault::IoOp::Write, &path) {
                Ok(()) => w.write_all(&frame),
                Err(e) => w.write_all(&frame[..frame.len() / 2]).and(Err(e)),
            };
            if let Err(source) = written {
                // A short write (a full disk) leaves part of the frame at
                // the end of the file, where the next append would follow
                // it at the wrong offset: cut it off. If even that fails,
                // reopen at the committed length before the next append.
                if w.set_len(self.current.len).is_err() {
                    self.writer = None;
                }
                return Err(FlatFileError::Io { path, source });
            }
        }
        let loc = FileLoc {
            file,
            offset: self.current.len + 8,
            len,
        };
        self.current.len += frame.len() as u64;
        self.dirty = true;
        Ok(loc)
    }

    /// Makes every appended record durable (`fdatasync` of the current
    /// file; a file left for the next one was synced when it was left). A
    /// no-op when nothing was appended since the last sync.
    ///
    /// # Errors
    /// [`FlatFileError::Io`].
    pub fn sync(&mut self) -> Result<(), FlatFileError> {
        if !self.dirty {
            return Ok(());
        }
        let file = self.current.file;
        let path = self.path(file);
        if let Some(w) = self.writer.as_mut() {
            super::fault::check(super::fault::IoOp::Sync, &path)
                .and_then(|()| w.sync_data())
                .map_err(|source| FlatFileError::Io { path, source })?;
        }
        self.dirty = false;
        Ok(())
    }

    /// Whether records were appended since the last [`FlatFiles::sync`].
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// The shared read handle of these files.
    pub fn reader(&self) -> Arc<FlatReader> {
        self.reader.clone()
    }

    /// Reads the payload at `loc` ([`FlatReader::read`]).
    ///
    /// # Errors
    /// As [`FlatReader::read`].
    pub fn read(&self, loc: FileLoc) -> Result<Vec<u8>, FlatFileError> {
        self.reader.read(loc)
    }
}

impl FlatReader {
    /// The path of file number `file`.
    pub fn path(&self, file: u32) -> PathBuf {
        self.dir.join(format!("{}{:05}.dat", self.prefix, file))
    }

    /// Checks that every file is at least as long as the committed records
    /// in it: `ends` holds, per file number, the end of its last committed
    /// record (payload offset + length), bytes.
    ///
    /// # Errors
    /// [`FlatFileError::Truncated`] for the first file that is shorter (a
    /// missing file has length 0); [`FlatFileError::Io`].
    pub fn check_lengths(
        &self,
        ends: &std::collections::BTreeMap<u32, u64>,
    ) -> Result<(), FlatFileError> {
        for (&file, &committed) in ends {
            let path = self.path(file);
            let len = match std::fs::metadata(&path) {
                Ok(m) => m.len(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
                Err(source) => return Err(FlatFileError::Io { path, source }),
            };
            if len < committed {
                return Err(FlatFileError::Truncated {
                    path,
                    len,
                    committed,
                });
            }
        }
        Ok(())
    }

    fn io(&self, file: u32) -> impl FnOnce(std::io::Error) -> FlatFileError + '_ {
        move |source| FlatFileError::Io {
            path: self.path(file),
            source,
        }
    }

    /// A read handle of file `file` (opened once, then reused).
    fn handle(&self, file: u32) -> Result<Arc<File>, FlatFileError> {
        let mut readers = self.handles.lock();
        if let Some(i) = readers.iter().position(|(n, _)| *n == file) {
            let entry = readers.remove(i);
            let f = entry.1.clone();
            readers.insert(0, entry);
            return Ok(f);
        }
        // Opened without the lock: an open short of descriptors waits
        // (`fds::retry_exhausted`), and reads of open files go on meanwhile.
        drop(readers);
        let path = self.path(file);
        let f = crate::fds::retry_exhausted(&path, || File::open(&path)).map_err(self.io(file))?;
        let f = Arc::new(f);
        let mut readers = self.handles.lock();
        readers.retain(|(n, _)| *n != file);
        readers.insert(0, (file, f.clone()));
        readers.truncate(READ_HANDLES);
        Ok(f)
    }

    /// Calls `f` with every record's payload, in order, from the start of
    /// the first file to the committed position `end` (files before
    /// `end.file` are read whole: a file is synced before it is left).
    /// Reads one file into memory at a time.
    ///
    /// # Errors
    /// [`FlatFileError::Io`]; [`FlatFileError::Corrupt`] for a frame with
    /// the wrong magic or running past the committed end; `f`'s errors.
    pub fn scan<E: From<FlatFileError>>(
        &self,
        end: FlatPos,
        f: &mut dyn FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        for file in 0..=end.file {
            let path = self.path(file);
            let data = match std::fs::read(&path) {
                Ok(d) => d,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && end.len == 0 => continue,
                Err(source) => return Err(FlatFileError::Io { path, source }.into()),
            };
            let limit = if file == end.file {
                (end.len as usize).min(data.len())
            } else {
                data.len()
            };
            let mut at = 0usize;
            while at < limit {
                let corrupt = |reason| FlatFileError::Corrupt {
                    path: path.clone(),
                    offset: at as u64,
                    reason,
                };
                let head = data
                    .get(at..at + 8)
                    .ok_or_else(|| corrupt("truncated frame"))?;
                if head[..4] != self.magic {
                    return Err(corrupt("wrong magic").into());
                }
                let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
                let payload = data
                    .get(at + 8..at + 8 + len)
                    .filter(|_| at + 8 + len <= limit)
                    .ok_or_else(|| corrupt("record past the committed end"))?;
                f(payload)?;
                at += 8 + len;
            }
        }
        Ok(())
    }

    /// Reads the payload at `loc`, checking its frame. Takes `&self` and
    /// may run on several threads at once (positional reads on a shared
    /// handle: two `pread`s, no `open`, once the file's handle is cached).
    ///
    /// # Errors
    /// [`FlatFileError::Io`], [`FlatFileError::Corrupt`] when the frame's
    /// magic or length disagree with `loc`.
    pub fn read(&self, loc: FileLoc) -> Result<Vec<u8>, FlatFileError> {
        let path = self.path(loc.file);
        if loc.offset < 8 {
            return Err(FlatFileError::Corrupt {
                path,
                offset: loc.offset,
                reason: "offset inside the first frame header",
            });
        }
        let f = self.handle(loc.file)?;
        let io = |source| FlatFileError::Io {
            path: path.clone(),
            source,
        };
        let mut head = [0u8; 8];
        f.read_exact_at(&mut head, loc.offset - 8).map_err(io)?;
        if head[..4] != self.magic {
            return Err(FlatFileError::Corrupt {
                path,
                offset: loc.offset,
                reason: "wrong magic",
            });
        }
        if u32::from_le_bytes([head[4], head[5], head[6], head[7]]) != loc.len {
            return Err(FlatFileError::Corrupt {
                path,
                offset: loc.offset,
                reason: "length differs from the index",
            });
        }
        let mut buf = vec![0u8; loc.len as usize];
        f.read_exact_at(&mut buf, loc.offset).map_err(io)?;
        Ok(buf)
    }
}

/// [`FlatFiles::sync`] of every one of `files` with unsynced records, the
/// `fdatasync`s running at the same time (one scoped thread per file beyond
/// the first), so the file system can commit them together rather than one
/// after the other. Returns when all are durable.
///
/// # Errors
/// The first [`FlatFileError::Io`] among them (the others may or may not
/// be durable then; the caller commits nothing that points to them).
pub fn sync_concurrently(files: &mut [&mut FlatFiles]) -> Result<(), FlatFileError> {
    let mut dirty: Vec<&mut FlatFiles> = files
        .iter_mut()
        .filter(|f| f.is_dirty())
        .map(|f| &mut **f)
        .collect();
    let Some(first) = dirty.pop() else {
        return Ok(());
    };
    if dirty.is_empty() {
        return first.sync();
    }
    std::thread::scope(|s| {
        let others: Vec<_> = dirty
            .into_iter()
            .map(|f| {
                let path = f.reader.dir.clone();
                (path, s.spawn(move || f.sync()))
            })
            .collect();
        let mut result = first.sync();
        for (path, handle) in others {
            let r = handle.join().unwrap_or_else(|_| {
                Err(FlatFileError::Io {
                    path,
                    source: std::io::Error::other("fdatasync thread panicked"),
                })
            });
            if result.is_ok() {
                result = r;
            }
        }
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_read_truncate_roll_over() {
        let dir = tempfile::tempdir().unwrap();
        let magic = [0xfa, 0xbf, 0xb5, 0xda];
        let mut f = FlatFiles::open(dir.path(), "blk", magic, 64, FlatPos::default()).unwrap();
        let a = f.append(b"hello").unwrap();
        assert_eq!(
            a,
            FileLoc {
                file: 0,
                offset: 8,
                len: 5
            }
        );
        let committed = f.position();
        let b = f.append(&[7u8; 40]).unwrap();
        let c = f.append(&[9u8; 40]).unwrap(); // rolls over to file 1
        assert_eq!(c.file, 1);
        assert_eq!(f.read(a).unwrap(), b"hello");
        assert_eq!(f.read(b).unwrap(), vec![7u8; 40]);
        assert!(matches!(
            f.read(FileLoc { len: 4, ..a }),
            Err(FlatFileError::Corrupt { .. })
        ));
        f.sync().unwrap();
        // Opening cuts nothing (the position may come from a damaged
        // index); `cut_uncommitted` does.
        let mut f = FlatFiles::open(dir.path(), "blk", magic, 64, committed).unwrap();
        assert_eq!(f.position(), committed);
        assert_eq!(f.bytes_past_position().unwrap(), 48 + 48);
        assert!(dir.path().join("blk00001.dat").exists());
        assert_eq!(f.read(a).unwrap(), b"hello");
        f.cut_uncommitted().unwrap();
        assert_eq!(f.bytes_past_position().unwrap(), 0);
        assert!(!dir.path().join("blk00001.dat").exists());
        assert_eq!(
            std::fs::metadata(dir.path().join("blk00000.dat"))
                .unwrap()
                .len(),
            13
        );
    }

    #[test]
    fn concurrent_sync_clears_only_dirty_files() {
        let dir = tempfile::tempdir().unwrap();
        let magic = [0xfa, 0xbf, 0xb5, 0xda];
        let open = |name: &str| {
            FlatFiles::open(
                &dir.path().join(name),
                "x",
                magic,
                1 << 20,
                FlatPos::default(),
            )
            .unwrap()
        };
        let (mut a, mut b, mut c) = (open("a"), open("b"), open("c"));
        assert!(!a.is_dirty());
        let la = a.append(b"block").unwrap();
        let lb = b.append(b"filter").unwrap();
        assert!(a.is_dirty() && b.is_dirty() && !c.is_dirty());
        sync_concurrently(&mut [&mut a, &mut b, &mut c]).unwrap();
        assert!(!a.is_dirty() && !b.is_dirty() && !c.is_dirty());
        c.append(b"spent").unwrap();
        sync_concurrently(&mut [&mut a, &mut b, &mut c]).unwrap();
        assert!(!c.is_dirty());
        // Reopened at the synced positions, the records are there.
        let (pa, pb) = (a.position(), b.position());
        drop((a, b));
        let a = FlatFiles::open(&dir.path().join("a"), "x", magic, 1 << 20, pa).unwrap();
        let b = FlatFiles::open(&dir.path().join("b"), "x", magic, 1 << 20, pb).unwrap();
        assert_eq!(a.read(la).unwrap(), b"block");
        assert_eq!(b.read(lb).unwrap(), b"filter");
    }
}
