//! Checkpoints, off the commit path (`docs/sozu-format.md`,
//! "Checkpoint"): the pages a generation changed, as they were at its
//! end, move into the page files while the next generation's commits go
//! on in the other journal file.
//!
//! 1. *double write*: every image and records extent into the checkpoint
//!    file of the new base generation, synced;
//! 2. the header naming the new base, through the tmp-file rename;
//! 3. every image and extent into its home file, synced;
//! 4. the checkpoint file truncated and synced (the next checkpoint of
//!    the disk layers, in the same generation, rewrites this file while the
//!    header still names this one), compacted records segments deleted;
//! 5. a checkpoint that starts a generation truncates the journal of the
//!    generation it ended, and syncs it: the page files hold that
//!    generation's end now, so no open reads those records again.
//!
//! A checkpoint of the disk layers only (`docs/sozu-format.md`,
//! "Checkpoints of the disk layers") runs the same steps within the base
//! generation: its header names the base and the commit S its images hold.

use std::sync::Arc;
use std::thread::JoinHandle;

use super::files::{ckpt_file, journal_file, write_header_file};
use super::geo::Addr;
use super::header::Header;
use super::journal::{self, Body, Extent, PageImage, Record};
use super::page;
use super::records::{segment_file, split};
use super::storage::Storage;
use super::store::{io_err, layer_file};
use super::SozuError;

/// Page images per record of the checkpoint file (bounds the memory one
/// record takes to ~4 MiB).
const PAGES_PER_RECORD: usize = 1024;
/// Largest single write of consecutive pages into a page file.
const MAX_RUN_BYTES: usize = 1 << 20;

/// What one checkpoint writes.
pub(super) struct Job {
    /// The generation it makes the base (a checkpoint of the disk layers:
    /// the base, unchanged).
    pub(super) generation: u64,
    /// The header file it writes: the state at the end of the previous
    /// generation, with `generation` as its generation; for a checkpoint of
    /// the disk layers, the base's header naming S and the first disk layer.
    pub(super) header: Header,
    /// Whether it writes the disk layers only, within the base generation.
    pub(super) disk_only: bool,
    /// Per shard, the pages the previous generation changed (a checkpoint
    /// of the disk layers: the disk pages changed since the last
    /// checkpoint), with their committed images at its end (at S), in
    /// address order.
    pub(super) pages: Vec<Vec<(Addr, Arc<Vec<u8>>)>>,
    /// Per shard, the committed records bytes not known to be in their
    /// files, by location.
    pub(super) records: Vec<Vec<(u64, Arc<Vec<u8>>)>>,
    /// Files to delete once the home writes are synced.
    pub(super) delete: Vec<String>,
    pub(super) page_size: usize,
}

/// Steps 1–5 of one checkpoint.
///
/// # Errors
/// [`SozuError::Io`]: the checkpoint did not complete; the table must be
/// reopened (which finishes or redoes it).
pub(super) fn run(st: &mut dyn Storage, job: &Job) -> Result<(), SozuError> {
    let ckpt = ckpt_file(job.generation);
    let header = job.header.encode();
    double_write(st, job, &header, ckpt)?;
    write_header_file(st, &header)?;
    write_home(st, job)?;
    st.set_len(ckpt, 0).map_err(|e| io_err(st, ckpt, e))?;
    st.sync(ckpt).map_err(|e| io_err(st, ckpt, e))?;
    for name in &job.delete {
        st.remove(name).map_err(|e| io_err(st, name, e))?;
    }
    if !job.disk_only {
        // Step 5. The commits go on in the other file; this one is written
        // again only when the generation after them starts, which waits
        // for this checkpoint.
        // (g + 1 has the parity of the ended g − 1.)
        let ended = journal_file(job.generation + 1);
        st.set_len(ended, 0).map_err(|e| io_err(st, ended, e))?;
        st.sync(ended).map_err(|e| io_err(st, ended, e))?;
    }
    Ok(())
}

/// Step 1.
fn double_write(
    st: &mut dyn Storage,
    job: &Job,
    header: &[u8],
    ckpt: &str,
) -> Result<(), SozuError> {
    st.set_len(ckpt, 0).map_err(|e| io_err(st, ckpt, e))?;
    let images: Vec<PageImage> = job
        .pages
        .iter()
        .enumerate()
        .flat_map(|(s, v)| {
            v.iter().map(move |(addr, image)| PageImage {
                shard: s as u8,
                addr: *addr,
                image: image.clone(),
            })
        })
        .collect();
    let extents: Vec<Extent> = job
        .records
        .iter()
        .enumerate()
        .flat_map(|(s, v)| {
            v.iter().map(move |(location, data)| Extent {
                shard: s as u8,
                location: *location,
                data: data.clone(),
            })
        })
        .collect();
    let mut chunks: Vec<&[PageImage]> = images.chunks(PAGES_PER_RECORD).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    let last = chunks.len() - 1;
    let (mut at, mut buf) = (0u64, Vec::new());
    for (i, part) in chunks.into_iter().enumerate() {
        let rec = Record {
            generation: job.generation,
            seq: job.header.checkpoint_seq(),
            body: Body::Images(part.to_vec()),
            extents: if i == last {
                extents.clone()
            } else {
                Vec::new()
            },
            header: header.to_vec(),
        };
        journal::encode(&rec, &mut buf);
        st.write_at(ckpt, at, &buf)
            .map_err(|e| io_err(st, ckpt, e))?;
        at += buf.len() as u64;
    }
    st.sync(ckpt).map_err(|e| io_err(st, ckpt, e))
}

/// Step 3: runs of consecutive pages written together, then the records.
fn write_home(st: &mut dyn Storage, job: &Job) -> Result<(), SozuError> {
    let ps = job.page_size;
    let mut touched: Vec<String> = Vec::new();
    for (s, pages) in job.pages.iter().enumerate() {
        let mut i = 0;
        while i < pages.len() {
            let ((layer, first), _) = pages[i];
            let mut j = i + 1;
            while j < pages.len()
                && pages[j].0 == (layer, first + (j - i) as u64)
                && (j - i + 1) * ps <= MAX_RUN_BYTES
            {
                j += 1;
            }
            let mut buf = Vec::with_capacity((j - i) * ps);
            for (addr, img) in &pages[i..j] {
                page::seal_into(img, ps, &mut buf).map_err(|_| SozuError::BucketFull {
                    layer: addr.0,
                    page: addr.1,
                })?;
            }
            let name = layer_file(s as u8, layer);
            st.write_at(&name, first * ps as u64, &buf)
                .map_err(|e| io_err(st, &name, e))?;
            touched.push(name);
            i = j;
        }
        for (location, data) in &job.records[s] {
            let (segment, offset) = split(*location);
            let name = segment_file(s as u8, segment);
            st.write_at(&name, offset, data)
                .map_err(|e| io_err(st, &name, e))?;
            touched.push(name);
        }
    }
    touched.sort_unstable();
    touched.dedup();
    for name in &touched {
        st.sync(name).map_err(|e| io_err(st, name, e))?;
    }
    Ok(())
}

/// A checkpoint in progress (at most one at a time).
struct Running {
    job: Arc<Job>,
    handle: Option<JoinHandle<Result<(), SozuError>>>,
    /// The result of a checkpoint run inline.
    done: Option<Result<(), SozuError>>,
}

/// Runs checkpoints on a background thread (or inline), one at a time.
#[derive(Default)]
pub(super) struct Checkpointer {
    running: Option<Running>,
}

impl Checkpointer {
    /// Starts `job` with storage handle `st`: on a thread of its own when
    /// `background`, else now.
    pub(super) fn start(&mut self, mut st: Box<dyn Storage>, job: Job, background: bool) {
        let job = Arc::new(job);
        let running = if background {
            let j = job.clone();
            let handle = std::thread::Builder::new()
                .name("sozu-checkpoint".into())
                .spawn(move || run(st.as_mut(), &j));
            match handle {
                Ok(h) => Running {
                    job,
                    handle: Some(h),
                    done: None,
                },
                Err(e) => Running {
                    job,
                    handle: None,
                    done: Some(Err(SozuError::Io {
                        path: "sozu-checkpoint thread".into(),
                        source: e,
                    })),
                },
            }
        } else {
            let done = run(st.as_mut(), &job);
            Running {
                job,
                handle: None,
                done: Some(done),
            }
        };
        self.running = Some(running);
    }

    /// Whether no checkpoint is in progress.
    pub(super) fn is_idle(&self) -> bool {
        self.running.is_none()
    }

    /// The finished checkpoint, if the one in progress has finished.
    pub(super) fn poll(&mut self) -> Option<(Arc<Job>, Result<(), SozuError>)> {
        let finished = self
            .running
            .as_ref()
            .is_some_and(|r| r.handle.as_ref().is_none_or(JoinHandle::is_finished));
        if finished {
            self.wait()
        } else {
            None
        }
    }

    /// Waits for the checkpoint in progress, if any.
    pub(super) fn wait(&mut self) -> Option<(Arc<Job>, Result<(), SozuError>)> {
        let mut r = self.running.take()?;
        let result = match (r.done.take(), r.handle.take()) {
            (Some(d), _) => d,
            (None, Some(h)) => h.join().unwrap_or(Err(SozuError::Poisoned)),
            (None, None) => Err(SozuError::Poisoned),
        };
        Some((r.job, result))
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        // A dropped table leaves no thread writing its files.
        let _ = self.wait();
    }
}
