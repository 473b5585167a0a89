//! File-system operations of the node's small files and directories (the
//! address book, the reindex's marker and swap, the archive's and the row
//! store's directory syncs), each passing the I/O fault seam
//! ([`super::fault`]) first, so a test can make any of them fail.
//!
//! Which operation the seam sees, and on which path: creating a file,
//! writing it, renaming onto a path, removing and creating directories are
//! [`IoOp::Write`]s (a rename on its destination); `fsync` of a file or a
//! directory is an [`IoOp::Sync`]. Every function returns the plain
//! `std::io::Error`; callers wrap it in their module's error, with the path.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

use super::fault::{self, IoOp};

/// Creates (or truncates) `path`, writes `bytes` into it and fsyncs it:
/// on success the file's content is durable (not yet its directory entry:
/// [`sync_dir`] its directory for that).
///
/// # Errors
/// The creation, write or fsync error (the file may then exist, partly
/// written).
pub fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    fault::check(IoOp::Write, path)?;
    let mut f = File::create(path)?;
    f.write_all(bytes)?;
    sync_file(path, &f)
}

/// Fsyncs `file`, open at `path` (data and metadata): what was written to
/// it is durable.
///
/// # Errors
/// The fsync error.
pub fn sync_file(path: &Path, file: &File) -> io::Result<()> {
    fault::check(IoOp::Sync, path)?;
    file.sync_all()
}

/// Renames `from` onto `to` (atomic on POSIX file systems: `to` is the old
/// or the new file, never a mix). The seam sees a write of `to`.
///
/// # Errors
/// The rename's error; nothing was moved.
pub fn rename(from: &Path, to: &Path) -> io::Result<()> {
    fault::check(IoOp::Write, to)?;
    std::fs::rename(from, to)
}

/// Fsyncs the directory `dir`: its entries (files created, renamed or
/// removed in it) become durable.
///
/// # Errors
/// The open or fsync error.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    fault::check(IoOp::Sync, dir)?;
    crate::fds::retry_exhausted(dir, || File::open(dir))?.sync_all()
}

/// Creates `dir` and its missing parents (nothing if it exists).
///
/// # Errors
/// The creation error.
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    fault::check(IoOp::Write, dir)?;
    std::fs::create_dir_all(dir)
}

/// Removes the file `path`.
///
/// # Errors
/// The removal error (`NotFound` included).
pub fn remove_file(path: &Path) -> io::Result<()> {
    fault::check(IoOp::Write, path)?;
    std::fs::remove_file(path)
}

/// Removes the directory `dir` and everything under it.
///
/// # Errors
/// The removal error (`NotFound` included); part of the tree may be gone.
pub fn remove_dir_all(dir: &Path) -> io::Result<()> {
    fault::check(IoOp::Write, dir)?;
    std::fs::remove_dir_all(dir)
}
