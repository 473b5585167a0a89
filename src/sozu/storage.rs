//! The storage backend under the Sozu table: a directory of named files.
//!
//! [`FsStorage`] is the real one (positional reads and writes, `fdatasync`).
//! [`MemStorage`] is an in-memory file system for tests: it can fail every
//! operation after a countdown (redb's fuzzer trick) and simulate a power
//! loss, keeping only what was synced plus a random subset of the unsynced
//! writes, one of them possibly torn.
//!
//! What the table assumes of a backend (see `docs/sozu-format.md`):
//! `sync(name)` returns only when every earlier write to `name` (and its
//! length) is durable; `rename` is atomic and durable after `sync_dir`;
//! a write that was not synced may be lost, partially applied, or applied
//! out of order with other unsynced writes.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A directory of named files, as the Sozu table uses it.
pub trait Storage: Send {
    /// Whether the file exists.
    ///
    /// # Errors
    /// I/O failure.
    fn exists(&mut self, name: &str) -> io::Result<bool>;
    /// Length of the file in bytes (0 if missing).
    ///
    /// # Errors
    /// I/O failure.
    fn len(&mut self, name: &str) -> io::Result<u64>;
    /// Bytes the file occupies on the medium (holes of a sparse file, i.e.
    /// pages never written, cost nothing); by default its length.
    ///
    /// # Errors
    /// I/O failure.
    fn allocated(&mut self, name: &str) -> io::Result<u64> {
        self.len(name)
    }
    /// Reads exactly `buf.len()` bytes at `offset`.
    ///
    /// # Errors
    /// I/O failure, or `UnexpectedEof` past the end.
    fn read_at(&mut self, name: &str, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Hints that `len` bytes of `name` at `offset` are about to be read,
    /// so the medium can fetch them now, overlapped with other such reads
    /// (`posix_fadvise(POSIX_FADV_WILLNEED)`). Only a hint: nothing fails
    /// and nothing changes if it is ignored (the default), and a missing
    /// file is not created.
    fn prefetch(&mut self, _name: &str, _offset: u64, _len: u64) {}
    /// Reads exactly `buf.len()` bytes at `offset` only if the medium can
    /// give them without waiting for a device: `true` if it did (on Linux,
    /// `preadv2(RWF_NOWAIT)`: the bytes were in the OS page cache),
    /// `false` if they would need the device, the file is missing or short,
    /// or the storage cannot tell (the default: every read then counts as
    /// one that waited). Never an error: a caller that gets `false` reads
    /// with [`Storage::read_at`], which reports what is wrong.
    fn read_cached(&mut self, _name: &str, _offset: u64, _buf: &mut [u8]) -> bool {
        false
    }
    /// Writes `data` at `offset`, creating the file if needed.
    ///
    /// # Errors
    /// I/O failure.
    fn write_at(&mut self, name: &str, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Sets the file's length.
    ///
    /// # Errors
    /// I/O failure.
    fn set_len(&mut self, name: &str, len: u64) -> io::Result<()>;
    /// Makes every earlier write to the file durable (`fdatasync`).
    ///
    /// # Errors
    /// I/O failure: durability is then unknown.
    fn sync(&mut self, name: &str) -> io::Result<()>;
    /// Deletes the file (a missing file is not an error).
    ///
    /// # Errors
    /// I/O failure.
    fn remove(&mut self, name: &str) -> io::Result<()>;
    /// Atomically replaces `to` with `from`.
    ///
    /// # Errors
    /// I/O failure.
    fn rename(&mut self, from: &str, to: &str) -> io::Result<()>;
    /// Makes earlier renames and file creations durable (fsync of the directory).
    ///
    /// # Errors
    /// I/O failure.
    fn sync_dir(&mut self) -> io::Result<()>;
    /// A human-readable path for error messages.
    fn path_of(&self, name: &str) -> PathBuf;
    /// Another handle on the same directory (each shard's worker thread
    /// gets its own).
    ///
    /// # Errors
    /// I/O failure.
    fn try_clone(&self) -> io::Result<Box<dyn Storage>>;
}

/// Files in a real directory.
#[derive(Debug)]
pub struct FsStorage {
    dir: PathBuf,
    files: HashMap<String, File>,
    /// The file system refused `RWF_NOWAIT` once: [`Storage::read_cached`]
    /// is not tried again.
    no_nowait: bool,
}

impl FsStorage {
    /// Uses (and creates if needed) `dir`.
    ///
    /// # Errors
    /// The directory cannot be created.
    pub fn new(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            files: HashMap::new(),
            no_nowait: false,
        })
    }

    /// The open handle of `name`; reads never create a missing file.
    fn file_opt(&mut self, name: &str, create: bool) -> io::Result<&mut File> {
        if !self.files.contains_key(name) {
            let path = self.dir.join(name);
            // Out of descriptors is back-pressure, not a disk failure.
            let f = crate::fds::retry_exhausted(&path, || {
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(create)
                    .truncate(false)
                    .open(&path)
            })?;
            self.files.insert(name.to_string(), f);
        }
        self.files
            .get_mut(name)
            .ok_or_else(|| io::Error::other("file handle vanished"))
    }

    fn file(&mut self, name: &str) -> io::Result<&mut File> {
        self.file_opt(name, true)
    }
}

impl Storage for FsStorage {
    fn exists(&mut self, name: &str) -> io::Result<bool> {
        Ok(self.files.contains_key(name) || self.dir.join(name).exists())
    }
    fn len(&mut self, name: &str) -> io::Result<u64> {
        if !self.exists(name)? {
            return Ok(0);
        }
        Ok(self.file_opt(name, false)?.metadata()?.len())
    }
    fn allocated(&mut self, name: &str) -> io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        if !self.exists(name)? {
            return Ok(0);
        }
        // st_blocks counts 512-byte units (POSIX).
        Ok(self.file_opt(name, false)?.metadata()?.blocks() * 512)
    }
    fn read_at(&mut self, name: &str, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.file_opt(name, false)?.read_exact_at(buf, offset)
    }
    fn prefetch(&mut self, name: &str, offset: u64, len: u64) {
        #[cfg(target_os = "linux")]
        if let Ok(f) = self.file_opt(name, false) {
            // A hint: its failure only loses the overlap.
            let _ = rustix::fs::fadvise(
                &*f,
                offset,
                std::num::NonZeroU64::new(len),
                rustix::fs::Advice::WillNeed,
            );
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (name, offset, len);
    }
    #[cfg(target_os = "linux")]
    fn read_cached(&mut self, name: &str, offset: u64, buf: &mut [u8]) -> bool {
        use rustix::io::{preadv2, Errno, ReadWriteFlags};
        if self.no_nowait {
            return false;
        }
        let Ok(f) = self.file_opt(name, false) else {
            return false;
        };
        let mut bufs = [std::io::IoSliceMut::new(buf)];
        let want = bufs[0].len();
        match preadv2(&*f, &mut bufs, offset, ReadWriteFlags::NOWAIT) {
            Ok(n) => n == want,
            Err(Errno::OPNOTSUPP | Errno::INVAL | Errno::NOSYS) => {
                self.no_nowait = true;
                false
            }
            Err(_) => false,
        }
    }
    fn write_at(&mut self, name: &str, offset: u64, data: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.file(name)?.write_all_at(data, offset)
    }
    fn set_len(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.file(name)?.set_len(len)
    }
    fn sync(&mut self, name: &str) -> io::Result<()> {
        self.file(name)?.sync_data()
    }
    fn remove(&mut self, name: &str) -> io::Result<()> {
        self.files.remove(name);
        match std::fs::remove_file(self.dir.join(name)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }
    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        self.files.remove(from);
        self.files.remove(to);
        std::fs::rename(self.dir.join(from), self.dir.join(to))
    }
    fn sync_dir(&mut self) -> io::Result<()> {
        crate::fds::retry_exhausted(&self.dir, || File::open(&self.dir))?.sync_all()
    }
    fn path_of(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
    fn try_clone(&self) -> io::Result<Box<dyn Storage>> {
        Ok(Box::new(FsStorage::new(&self.dir)?))
    }
}

#[derive(Debug, Clone)]
enum PendingOp {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default, Clone)]
struct MemFile {
    /// What a reader sees now.
    data: Vec<u8>,
    /// What survives a power loss for sure.
    durable: Vec<u8>,
    /// Writes since the last sync, in order.
    pending: Vec<PendingOp>,
}

#[derive(Debug, Default)]
struct MemFs {
    files: HashMap<String, MemFile>,
    /// Renames not yet made durable by `sync_dir`: (from, to, old `to`).
    pending_renames: Vec<(String, String, Option<MemFile>)>,
    /// Operations left before every operation fails (`None` = never).
    countdown: Option<u64>,
    ops: u64,
}

/// An in-memory directory for tests, shared between clones (so a test keeps
/// a handle while the table owns another).
#[derive(Debug, Clone, Default)]
pub struct MemStorage {
    fs: Arc<Mutex<MemFs>>,
}

fn apply(buf: &mut Vec<u8>, op: &PendingOp) {
    match op {
        PendingOp::Write { offset, data } => {
            let end = *offset as usize + data.len();
            if buf.len() < end {
                buf.resize(end, 0);
            }
            buf[*offset as usize..end].copy_from_slice(data);
        }
        PendingOp::SetLen(len) => buf.resize(*len as usize, 0),
    }
}

impl MemStorage {
    /// An empty directory.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> io::Result<std::sync::MutexGuard<'_, MemFs>> {
        self.fs
            .lock()
            .map_err(|_| io::Error::other("mem storage lock poisoned"))
    }

    /// Every operation after the next `n` fails (`None`: never).
    pub fn fail_after(&self, n: Option<u64>) {
        if let Ok(mut fs) = self.lock() {
            fs.countdown = n;
        }
    }

    /// Number of operations performed so far.
    pub fn ops(&self) -> u64 {
        self.lock().map(|fs| fs.ops).unwrap_or(0)
    }

    /// Simulates a power loss: each file keeps its synced content plus a
    /// random subset (by `seed`) of its unsynced writes, in order, the last
    /// kept one possibly torn; unsynced renames may or may not have happened.
    /// Clears the countdown.
    pub fn crash(&self, seed: u64) {
        let Ok(mut fs) = self.lock() else { return };
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let renames = std::mem::take(&mut fs.pending_renames);
        // Undo renames that did not become durable, newest first.
        for (from, to, old_to) in renames.into_iter().rev() {
            if rnd() % 2 == 0 {
                if let Some(f) = fs.files.remove(&to) {
                    fs.files.insert(from, f);
                }
                if let Some(old) = old_to {
                    fs.files.insert(to, old);
                }
            }
        }
        for file in fs.files.values_mut() {
            let mut data = file.durable.clone();
            let n = file.pending.len();
            for (i, op) in file.pending.iter().enumerate() {
                if rnd() % 2 == 0 {
                    continue;
                }
                match op {
                    PendingOp::Write {
                        offset,
                        data: bytes,
                    } if i + 1 == n && rnd() % 3 == 0 => {
                        let cut = (rnd() as usize) % (bytes.len() + 1);
                        apply(
                            &mut data,
                            &PendingOp::Write {
                                offset: *offset,
                                data: bytes[..cut].to_vec(),
                            },
                        );
                    }
                    op => apply(&mut data, op),
                }
            }
            file.data = data.clone();
            file.durable = data;
            file.pending.clear();
        }
        fs.countdown = None;
    }

    /// Raw bytes of a file (tests that corrupt files use it).
    pub fn read_file(&self, name: &str) -> Option<Vec<u8>> {
        self.lock().ok()?.files.get(name).map(|f| f.data.clone())
    }

    /// Replaces a file's content, durably (tests that corrupt files use it).
    pub fn write_file(&self, name: &str, data: Vec<u8>) {
        if let Ok(mut fs) = self.lock() {
            let f = fs.files.entry(name.to_string()).or_default();
            f.data = data.clone();
            f.durable = data;
            f.pending.clear();
        }
    }

    /// A fingerprint of every file's content (to check that open wrote nothing).
    pub fn snapshot(&self) -> Vec<(String, Vec<u8>)> {
        let Ok(fs) = self.lock() else {
            return Vec::new();
        };
        let mut v: Vec<_> = fs
            .files
            .iter()
            .map(|(k, f)| (k.clone(), f.data.clone()))
            .collect();
        v.sort();
        v
    }

    fn op(&self) -> io::Result<std::sync::MutexGuard<'_, MemFs>> {
        let mut fs = self.lock()?;
        fs.ops += 1;
        if let Some(n) = fs.countdown {
            if n == 0 {
                return Err(io::Error::other("injected I/O failure"));
            }
            fs.countdown = Some(n - 1);
        }
        Ok(fs)
    }
}

impl Storage for MemStorage {
    fn exists(&mut self, name: &str) -> io::Result<bool> {
        Ok(self.op()?.files.contains_key(name))
    }
    fn len(&mut self, name: &str) -> io::Result<u64> {
        Ok(self
            .op()?
            .files
            .get(name)
            .map_or(0, |f| f.data.len() as u64))
    }
    fn read_at(&mut self, name: &str, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let fs = self.op()?;
        let f = fs
            .files
            .get(name)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        let start = offset as usize;
        let end = start
            .checked_add(buf.len())
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        if end > f.data.len() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.copy_from_slice(&f.data[start..end]);
        Ok(())
    }
    fn write_at(&mut self, name: &str, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut fs = self.op()?;
        let f = fs.files.entry(name.to_string()).or_default();
        let op = PendingOp::Write {
            offset,
            data: data.to_vec(),
        };
        apply(&mut f.data, &op);
        f.pending.push(op);
        Ok(())
    }
    fn set_len(&mut self, name: &str, len: u64) -> io::Result<()> {
        let mut fs = self.op()?;
        let f = fs.files.entry(name.to_string()).or_default();
        let op = PendingOp::SetLen(len);
        apply(&mut f.data, &op);
        f.pending.push(op);
        Ok(())
    }
    fn sync(&mut self, name: &str) -> io::Result<()> {
        let mut fs = self.op()?;
        if let Some(f) = fs.files.get_mut(name) {
            f.durable = f.data.clone();
            f.pending.clear();
        }
        Ok(())
    }
    fn remove(&mut self, name: &str) -> io::Result<()> {
        // Deleted at once and for good: the table only deletes files it no
        // longer needs, so a deletion a power loss undid would only leave
        // garbage behind.
        self.op()?.files.remove(name);
        Ok(())
    }
    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        let mut fs = self.op()?;
        let f = fs
            .files
            .remove(from)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        let old = fs.files.insert(to.to_string(), f);
        fs.pending_renames
            .push((from.to_string(), to.to_string(), old));
        Ok(())
    }
    fn sync_dir(&mut self) -> io::Result<()> {
        self.op()?.pending_renames.clear();
        Ok(())
    }
    fn path_of(&self, name: &str) -> PathBuf {
        PathBuf::from("mem:").join(name)
    }
    fn try_clone(&self) -> io::Result<Box<dyn Storage>> {
        Ok(Box::new(self.clone()))
    }
}
