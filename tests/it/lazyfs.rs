//! A FUSE file system that loses what was not fsynced, as LazyFS does
//! (Ramos et al., "LazyFS", 2023; not packaged for Debian): every file's
//! data lives in memory twice, as written and as its last `fsync` or
//! `fdatasync` left it, and [`LazyFs::synced_image`] writes out the second
//! — the disk after a power cut. Metadata (create, rename, unlink, mkdir)
//! is durable at once, as in LazyFS; only data is lazy.
//!
//! Everything that writes under the mount goes through it, sled's log and
//! the UTXO table's pages included: the one way here to cut power under
//! code that does not pass kakehi's storage seam. `sync_file_range` never
//! reaches a FUSE file system, so data "made stable" by it alone is lost,
//! as the man page warns it may be after a crash.
//!
//! It can also fail an fsync as a disk would ([`LazyFs::fail_fsyncs`]):
//! by the calling thread's name, so inside a dependency's own thread
//! (sled's flusher). A failed fsync loses the file's unsynced pages (the
//! kernel marks them clean: they never reach the disk) and, as Linux does
//! since 4.13 (`errseq_t`), reports the error once to every other open
//! file of it at its next fsync.
//!
//! Mounting needs `/dev/fuse` and the right to mount (root here); without
//! them [`LazyFs::mount`] says why and the caller fails (its tests are
//! `#[ignore]`d: they run where the machine allows, README.md's "Tests").

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    BsdFileFlags, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

/// Granularity of the dirty-data bookkeeping, bytes.
const PAGE: usize = 4096;
/// No kernel caching of entries or attributes: every size is asked again.
const TTL: Duration = Duration::ZERO;
const ROOT: u64 = 1;
/// `fallocate(2)`'s mode bit that leaves the size as it is.
const FALLOC_FL_KEEP_SIZE: i32 = 1;

#[derive(Default)]
struct Node {
    dir: bool,
    /// The data as written (files).
    data: Vec<u8>,
    /// The data as the last fsync left it (files).
    synced: Vec<u8>,
    /// Pages written since that fsync.
    dirty: BTreeSet<usize>,
    /// Entries (directories).
    children: BTreeMap<OsString, u64>,
    /// Failed fsyncs so far (Linux's per-file `errseq_t`).
    errors: u64,
}

impl Node {
    fn mark(&mut self, from: usize, to: usize) {
        self.dirty.extend(from / PAGE..=to / PAGE);
    }

    fn sync(&mut self) {
        self.synced.resize(self.data.len(), 0);
        for p in std::mem::take(&mut self.dirty) {
            let (a, b) = (p * PAGE, ((p + 1) * PAGE).min(self.data.len()));
            if a < b {
                self.synced[a..b].copy_from_slice(&self.data[a..b]);
            }
        }
    }
}

/// Fsyncs to fail: from threads named `thread`, of files named `file`,
/// the `skip`-th and later ones.
struct FsyncFault {
    thread: String,
    file: OsString,
    skip: usize,
    failed: usize,
}

#[derive(Default)]
struct State {
    nodes: BTreeMap<u64, Node>,
    next: u64,
    /// Open handles: the file and the errors it has been told of.
    handles: BTreeMap<u64, (u64, u64)>,
    next_handle: u64,
    fault: Option<FsyncFault>,
}

impl State {
    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let n = self.nodes.get(&ino)?;
        let size = n.data.len() as u64;
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: SystemTime::UNIX_EPOCH,
            mtime: SystemTime::UNIX_EPOCH,
            ctime: SystemTime::UNIX_EPOCH,
            crtime: SystemTime::UNIX_EPOCH,
            kind: if n.dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            },
            perm: if n.dir { 0o755 } else { 0o644 },
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: PAGE as u32,
            flags: 0,
        })
    }

    fn child(&self, parent: u64, name: &OsStr) -> Option<u64> {
        self.nodes.get(&parent)?.children.get(name).copied()
    }

    fn add(&mut self, parent: u64, name: &OsStr, dir: bool) -> Result<u64, Errno> {
        let p = self.nodes.get(&parent).ok_or(Errno::ENOENT)?;
        if p.children.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        self.next += 1;
        let ino = self.next;
        self.nodes.insert(
            ino,
            Node {
                dir,
                ..Node::default()
            },
        );
        if let Some(p) = self.nodes.get_mut(&parent) {
            p.children.insert(name.to_owned(), ino);
        }
        Ok(ino)
    }

    fn open_handle(&mut self, ino: u64) -> FileHandle {
        self.next_handle += 1;
        let seen = self.nodes.get(&ino).map_or(0, |n| n.errors);
        self.handles.insert(self.next_handle, (ino, seen));
        FileHandle(self.next_handle)
    }

    /// Whether the fsync of `ino` by `thread` is one to fail.
    fn fails(&mut self, ino: u64, thread: &str) -> bool {
        let named = |s: &Self, f: &OsStr| s.nodes.values().any(|n| n.children.get(f) == Some(&ino));
        let Some(f) = &self.fault else {
            return false;
        };
        if f.thread != thread || !named(self, &f.file) {
            return false;
        }
        let f = self.fault.as_mut().expect("checked");
        f.failed += 1;
        f.failed > f.skip
    }

    fn file(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        match self.nodes.get_mut(&ino) {
            Some(n) if !n.dir => Ok(n),
            Some(_) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    /// Dirty pages of the files under `ino`.
    fn dirty_under(&self, ino: u64) -> usize {
        let n = &self.nodes[&ino];
        n.dirty.len()
            + n.children
                .values()
                .map(|c| self.dirty_under(*c))
                .sum::<usize>()
    }

    /// Writes the synced image of directory `ino` into `to`.
    fn image(&self, ino: u64, to: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(to)?;
        for (name, child) in &self.nodes[&ino].children {
            let n = &self.nodes[child];
            if n.dir {
                self.image(*child, &to.join(name))?;
            } else {
                std::fs::write(to.join(name), &n.synced)?;
            }
        }
        Ok(())
    }
}

/// The file system (cloned into the FUSE session; the test keeps a clone).
#[derive(Clone)]
pub struct LazyFs(Arc<Mutex<State>>);

/// A mounted [`LazyFs`]; unmounted when dropped.
pub struct Mounted {
    pub fs: LazyFs,
    _session: fuser::BackgroundSession,
}

impl LazyFs {
    /// Mounts an empty lazy file system on `at`, or says why it cannot.
    pub fn mount(at: &Path) -> Result<Mounted, String> {
        if !Path::new("/dev/fuse").exists() {
            return Err("no /dev/fuse".into());
        }
        let mut state = State {
            next: ROOT,
            ..State::default()
        };
        state.nodes.insert(
            ROOT,
            Node {
                dir: true,
                ..Node::default()
            },
        );
        let fs = LazyFs(Arc::new(Mutex::new(state)));
        let mut config = Config::default();
        config.mount_options = vec![MountOption::FSName("kakehi-lazyfs".into())];
        let session = fuser::spawn_mount(fs.clone(), at, &config)
            .map_err(|e| format!("mounting a FUSE file system on {}: {e}", at.display()))?;
        Ok(Mounted {
            fs,
            _session: session,
        })
    }

    /// Writes what a power cut would leave of `dir` (a directory of the
    /// mount, given relative to its root) into `to`: each file as its last
    /// fsync left it. Taken under the file system's lock, so at one instant.
    pub fn synced_image(&self, dir: &Path, to: &Path) -> std::io::Result<()> {
        let s = self.0.lock();
        let mut ino = ROOT;
        for part in dir.components() {
            ino = s
                .child(ino, part.as_os_str())
                .ok_or_else(|| std::io::Error::other(format!("{} not found", dir.display())))?;
        }
        s.image(ino, to)
    }

    /// From now on fails the fsyncs of files named `file` made by threads
    /// named `thread` (`/proc/.../comm`), after the first `skip` of them.
    pub fn fail_fsyncs(&self, thread: &str, file: &str, skip: usize) {
        self.0.lock().fault = Some(FsyncFault {
            thread: thread.to_owned(),
            file: file.into(),
            skip,
            failed: 0,
        });
    }

    /// Fsyncs failed so far by [`LazyFs::fail_fsyncs`].
    pub fn fsyncs_failed(&self) -> usize {
        let s = self.0.lock();
        s.fault
            .as_ref()
            .map_or(0, |f| f.failed.saturating_sub(f.skip))
    }

    /// Fsyncs failed so far by [`LazyFs::fail_fsyncs`]; stops failing them.
    pub fn stop_failing(&self) -> usize {
        let f = self.0.lock().fault.take();
        f.map_or(0, |f| f.failed.saturating_sub(f.skip))
    }

    /// Pages (4 KiB) written and not yet fsynced under `dir` (relative to
    /// the mount's root): what a power cut now would lose there.
    pub fn unsynced_pages(&self, dir: &Path) -> usize {
        let s = self.0.lock();
        let mut ino = ROOT;
        for part in dir.components() {
            match s.child(ino, part.as_os_str()) {
                Some(i) => ino = i,
                None => return 0,
            }
        }
        s.dirty_under(ino)
    }
}

impl Filesystem for LazyFs {
    fn lookup(&self, _: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let s = self.0.lock();
        match s.child(parent.0, name).and_then(|i| s.attr(i)) {
            Some(a) => reply.entry(&TTL, &a, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _: &Request, ino: INodeNo, _: Option<FileHandle>, reply: ReplyAttr) {
        match self.0.lock().attr(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _: &Request,
        ino: INodeNo,
        _: Option<u32>,
        _: Option<u32>,
        _: Option<u32>,
        size: Option<u64>,
        _: Option<TimeOrNow>,
        _: Option<TimeOrNow>,
        _: Option<SystemTime>,
        _: Option<FileHandle>,
        _: Option<SystemTime>,
        _: Option<SystemTime>,
        _: Option<SystemTime>,
        _: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut s = self.0.lock();
        if let Some(size) = size {
            match s.file(ino.0) {
                Ok(n) => {
                    let (old, new) = (n.data.len(), size as usize);
                    n.data.resize(new, 0);
                    n.mark(old.min(new), old.max(new));
                }
                Err(e) => return reply.error(e),
            }
        }
        match s.attr(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn mknod(
        &self,
        _: &Request,
        parent: INodeNo,
        name: &OsStr,
        _: u32,
        _: u32,
        _: u32,
        reply: ReplyEntry,
    ) {
        let mut s = self.0.lock();
        match s.add(parent.0, name, false) {
            Ok(ino) => reply.entry(&TTL, &s.attr(ino).expect("just added"), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, _: &Request, parent: INodeNo, name: &OsStr, _: u32, _: u32, reply: ReplyEntry) {
        let mut s = self.0.lock();
        match s.add(parent.0, name, true) {
            Ok(ino) => reply.entry(&TTL, &s.attr(ino).expect("just added"), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut s = self.0.lock();
        match s
            .nodes
            .get_mut(&parent.0)
            .and_then(|p| p.children.remove(name))
        {
            Some(_) => reply.ok(),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let nonempty = {
            let s = self.0.lock();
            s.child(parent.0, name)
                .is_some_and(|i| !s.nodes[&i].children.is_empty())
        };
        if nonempty {
            return reply.error(Errno::ENOTEMPTY);
        }
        self.unlink(req, parent, name, reply)
    }

    fn rename(
        &self,
        _: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut s = self.0.lock();
        let Some(ino) = s
            .nodes
            .get_mut(&parent.0)
            .and_then(|p| p.children.remove(name))
        else {
            return reply.error(Errno::ENOENT);
        };
        match s.nodes.get_mut(&newparent.0) {
            Some(p) => {
                p.children.insert(newname.to_owned(), ino);
                reply.ok()
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _: &Request, ino: INodeNo, _: OpenFlags, reply: ReplyOpen) {
        // No page cache in the kernel: every read and write reaches us.
        let fh = self.0.lock().open_handle(ino.0);
        reply.opened(fh, FopenFlags::FOPEN_DIRECT_IO);
    }

    fn release(
        &self,
        _: &Request,
        _: INodeNo,
        fh: FileHandle,
        _: OpenFlags,
        _: Option<LockOwner>,
        _: bool,
        reply: ReplyEmpty,
    ) {
        self.0.lock().handles.remove(&fh.0);
        reply.ok();
    }

    fn create(
        &self,
        _: &Request,
        parent: INodeNo,
        name: &OsStr,
        _: u32,
        _: u32,
        _: i32,
        reply: ReplyCreate,
    ) {
        let mut s = self.0.lock();
        let ino = match s.child(parent.0, name) {
            Some(i) => i,
            None => match s.add(parent.0, name, false) {
                Ok(i) => i,
                Err(e) => return reply.error(e),
            },
        };
        let attr = s.attr(ino).expect("present");
        let fh = s.open_handle(ino);
        reply.created(&TTL, &attr, Generation(0), fh, FopenFlags::FOPEN_DIRECT_IO);
    }

    fn read(
        &self,
        _: &Request,
        ino: INodeNo,
        _: FileHandle,
        offset: u64,
        size: u32,
        _: OpenFlags,
        _: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut s = self.0.lock();
        match s.file(ino.0) {
            Ok(n) => {
                let a = (offset as usize).min(n.data.len());
                let b = (a + size as usize).min(n.data.len());
                reply.data(&n.data[a..b])
            }
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _: &Request,
        ino: INodeNo,
        _: FileHandle,
        offset: u64,
        data: &[u8],
        _: WriteFlags,
        _: OpenFlags,
        _: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut s = self.0.lock();
        match s.file(ino.0) {
            Ok(n) => {
                let (a, b) = (offset as usize, offset as usize + data.len());
                if n.data.len() < b {
                    n.data.resize(b, 0);
                }
                n.data[a..b].copy_from_slice(data);
                if !data.is_empty() {
                    n.mark(a, b - 1);
                }
                reply.written(data.len() as u32)
            }
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _: &Request, _: INodeNo, _: FileHandle, _: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(&self, req: &Request, ino: INodeNo, fh: FileHandle, _: bool, reply: ReplyEmpty) {
        let thread = std::fs::read_to_string(format!("/proc/self/task/{}/comm", req.pid()))
            .unwrap_or_default();
        let mut s = self.0.lock();
        let fails = s.fails(ino.0, thread.trim_end());
        let seen = s.handles.get(&fh.0).map(|h| h.1);
        let n = match s.file(ino.0) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        if fails {
            // The pages are marked clean without reaching the disk.
            n.dirty.clear();
            n.errors += 1;
        } else if seen.is_some_and(|seen| seen < n.errors) {
            // An earlier failure, not yet reported to this open file.
        } else {
            n.sync();
            return reply.ok();
        }
        let errors = n.errors;
        if let Some(h) = s.handles.get_mut(&fh.0) {
            h.1 = errors;
        }
        reply.error(Errno::EIO)
    }

    fn fallocate(
        &self,
        _: &Request,
        ino: INodeNo,
        _: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mut s = self.0.lock();
        match s.file(ino.0) {
            Ok(n) => {
                let end = (offset + length) as usize;
                if mode & FALLOC_FL_KEEP_SIZE == 0 && n.data.len() < end {
                    let old = n.data.len();
                    n.data.resize(end, 0);
                    n.mark(old, end);
                }
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _: &Request,
        ino: INodeNo,
        _: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let s = self.0.lock();
        let Some(dir) = s.nodes.get(&ino.0).filter(|n| n.dir) else {
            return reply.error(Errno::ENOTDIR);
        };
        let entries = [
            (ino.0, FileType::Directory, OsString::from(".")),
            (ino.0, FileType::Directory, OsString::from("..")),
        ]
        .into_iter()
        .chain(dir.children.iter().map(|(name, i)| {
            let kind = if s.nodes[i].dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            (*i, kind, name.clone())
        }));
        for (k, (i, kind, name)) in entries.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(i), k as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok()
    }

    fn fsyncdir(&self, _: &Request, _: INodeNo, _: FileHandle, _: bool, reply: ReplyEmpty) {
        reply.ok();
    }

    fn statfs(&self, _: &Request, _: INodeNo, reply: ReplyStatfs) {
        // 64 GiB free, so no free-space check refuses to write.
        let blocks = 1 << 24;
        reply.statfs(
            blocks,
            blocks,
            blocks,
            1 << 20,
            1 << 20,
            PAGE as u32,
            255,
            PAGE as u32,
        );
    }
}
