//! Checkpoints, off the commit path (`docs/sozu-format.md`,
//! "Checkpoint"): the pages a generation changed, as they were at its
//! end, move into the page files while the next generation's commits go
//! on in the other journal file.
//!
//! 1. *double write*: every image and records extent into the checkpoint
//!    file of the new base generation, synced;
//! 2. the header naming the new base, through the tmp-file rename;
//! 3. every image (read back from the checkpoint file: the thread lets
//!    each image go once step 1 has written it, so an image a commit has
//!    replaced meanwhile is not held twice for the rest of the checkpoint)
//!    and extent into its home file, synced;
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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use super::files::{ckpt_file, journal_file, write_header_file};
use super::geo::Addr;
use super::header::Header;
use super::journal::{self, Body, Extent, PageImage, Record};
use super::page;
use super::records::{segment_file, split};
use super::storage::Storage;
use super::store::{image_bytes, io_err, layer_file};
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
    /// checkpoint), in address order, each naming the committed image at
    /// its end (at S) that it writes. The images themselves are the
    /// thread's ([`Images`]): a weak reference keeps the name, not the
    /// bytes.
    pub(super) pages: Vec<Vec<(Addr, Weak<Vec<u8>>)>>,
    /// Per shard, the committed records bytes not known to be in their
    /// files, by location.
    pub(super) records: Vec<Vec<(u64, Arc<Vec<u8>>)>>,
    /// Files to delete once the home writes are synced.
    pub(super) delete: Vec<String>,
    pub(super) page_size: usize,
    /// Bytes of images the thread has let go that it alone still held:
    /// images commits replaced since the checkpoint started, which
    /// [`super::store::PageStore::held_twice`] counted.
    released: AtomicU64,
    /// CPU time of the thread that ran it, in nanoseconds (set when it
    /// ends).
    cpu_nanos: AtomicU64,
}

/// Per shard, the images a checkpoint writes, as [`Job::pages`] lists
/// them; the thread holds them until step 1 has written them.
pub(super) type Images = Vec<Vec<(Addr, Arc<Vec<u8>>)>>;

/// What a checkpoint is asked to write, by name ([`Job::new`] makes the
/// job and its thread's images of it).
pub(super) struct Plan {
    /// As [`Job::generation`].
    pub(super) generation: u64,
    /// As [`Job::header`].
    pub(super) header: Header,
    /// As [`Job::disk_only`].
    pub(super) disk_only: bool,
    /// Per shard, the pages to write with their images, in address order.
    pub(super) pages: Images,
    /// As [`Job::records`].
    pub(super) records: Vec<Vec<(u64, Arc<Vec<u8>>)>>,
    /// As [`Job::delete`].
    pub(super) delete: Vec<String>,
    /// Page size in bytes.
    pub(super) page_size: usize,
}

impl Job {
    /// The job of `plan` (its pages named by weak references), and the
    /// images for its thread.
    pub(super) fn new(plan: Plan) -> (Self, Images) {
        let names = plan
            .pages
            .iter()
            .map(|v| v.iter().map(|(a, p)| (*a, Arc::downgrade(p))).collect())
            .collect();
        let job = Job {
            generation: plan.generation,
            header: plan.header,
            disk_only: plan.disk_only,
            pages: names,
            records: plan.records,
            delete: plan.delete,
            page_size: plan.page_size,
            released: AtomicU64::new(0),
            cpu_nanos: AtomicU64::new(0),
        };
        (job, plan.pages)
    }

    /// Bytes of replaced images the thread has let go so far.
    pub(super) fn released(&self) -> u64 {
        self.released.load(Ordering::Relaxed)
    }

    /// CPU time of the thread that ran this (finished) checkpoint, in
    /// nanoseconds.
    pub(super) fn cpu_nanos(&self) -> u64 {
        self.cpu_nanos.load(Ordering::Relaxed)
    }
}

/// Steps 1–5 of one checkpoint.
///
/// # Errors
/// [`SozuError::Io`]: the checkpoint did not complete; the table must be
/// reopened (which finishes or redoes it).
pub(super) fn run(st: &mut dyn Storage, job: &Job, images: Images) -> Result<(), SozuError> {
    let start = thread_cpu_nanos();
    let r = steps(st, job, images);
    job.cpu_nanos
        .store(thread_cpu_nanos().saturating_sub(start), Ordering::Relaxed);
    r
}

/// This thread's CPU time in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`; 0
/// where the table does not measure it, off Linux).
fn thread_cpu_nanos() -> u64 {
    #[cfg(target_os = "linux")]
    {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        (t.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec as u64)
    }
    #[cfg(not(target_os = "linux"))]
    0
}

/// [`run`]'s steps.
fn steps(st: &mut dyn Storage, job: &Job, images: Images) -> Result<(), SozuError> {
    let ckpt = ckpt_file(job.generation);
    let header = job.header.encode();
    let written = double_write(st, job, images, &header, ckpt)?;
    write_header_file(st, &header)?;
    write_home(st, job, ckpt, &written)?;
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

/// Step 1; the (offset, length) of each record written. Each record's
/// images are let go as soon as it is written (step 3 reads them back).
fn double_write(
    st: &mut dyn Storage,
    job: &Job,
    images: Images,
    header: &[u8],
    ckpt: &str,
) -> Result<Vec<(u64, usize)>, SozuError> {
    st.set_len(ckpt, 0).map_err(|e| io_err(st, ckpt, e))?;
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
    let total: usize = images.iter().map(Vec::len).sum();
    let records = total.div_ceil(PAGES_PER_RECORD).max(1);
    let mut images = images.into_iter().enumerate().flat_map(|(s, v)| {
        v.into_iter().map(move |(addr, image)| PageImage {
            shard: s as u8,
            addr,
            image,
        })
    });
    let (mut at, mut buf) = (0u64, Vec::new());
    let mut written = Vec::with_capacity(records);
    for i in 0..records {
        let rec = Record {
            generation: job.generation,
            seq: job.header.checkpoint_seq(),
            body: Body::Images(images.by_ref().take(PAGES_PER_RECORD).collect()),
            extents: if i + 1 == records {
                extents.clone()
            } else {
                Vec::new()
            },
            header: header.to_vec(),
        };
        journal::encode(&rec, &mut buf);
        st.write_at(ckpt, at, &buf)
            .map_err(|e| io_err(st, ckpt, e))?;
        written.push((at, buf.len()));
        at += buf.len() as u64;
        release(job, rec.body);
    }
    st.sync(ckpt).map_err(|e| io_err(st, ckpt, e))?;
    Ok(written)
}

/// Lets a written record's images go, counting those no one else held.
fn release(job: &Job, body: Body) {
    let Body::Images(images) = body else {
        return;
    };
    let freed: u64 = images
        .into_iter()
        .filter_map(|p| Arc::into_inner(p.image))
        .map(|v| image_bytes(&v))
        .sum();
    job.released.fetch_add(freed, Ordering::Relaxed);
}

/// Step 3: the images read back from the checkpoint file, a record at a
/// time, in runs of consecutive pages; then the records.
fn write_home(
    st: &mut dyn Storage,
    job: &Job,
    ckpt: &str,
    written: &[(u64, usize)],
) -> Result<(), SozuError> {
    let mut touched: Vec<String> = Vec::new();
    let mut buf = Vec::new();
    for &(at, len) in written {
        buf.resize(len, 0);
        st.read_at(ckpt, at, &mut buf)
            .map_err(|e| io_err(st, ckpt, e))?;
        let Some(images) = journal::images(&buf, job.page_size) else {
            return Err(super::store::corrupt(
                st.path_of(ckpt),
                at,
                "checkpoint record read back differs from the one written",
            ));
        };
        write_runs(st, &images, job.page_size, &mut touched)?;
    }
    for (s, records) in job.records.iter().enumerate() {
        for (location, data) in records {
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

/// Writes `images` (shard, address, bytes; in shard and address order) to
/// their page files, consecutive pages of one file in one write of up to
/// [`MAX_RUN_BYTES`].
fn write_runs(
    st: &mut dyn Storage,
    images: &[(u8, Addr, &[u8])],
    ps: usize,
    touched: &mut Vec<String>,
) -> Result<(), SozuError> {
    let mut i = 0;
    while i < images.len() {
        let (shard, (layer, first), _) = images[i];
        let mut j = i + 1;
        while j < images.len()
            && (images[j].0, images[j].1) == (shard, (layer, first + (j - i) as u64))
            && (j - i + 1) * ps <= MAX_RUN_BYTES
        {
            j += 1;
        }
        let mut buf = Vec::with_capacity((j - i) * ps);
        for &(_, addr, image) in &images[i..j] {
            page::seal_into(image, ps, &mut buf).map_err(|_| SozuError::BucketFull {
                layer: addr.0,
                page: addr.1,
            })?;
        }
        let name = layer_file(shard, layer);
        st.write_at(&name, first * ps as u64, &buf)
            .map_err(|e| io_err(st, &name, e))?;
        touched.push(name);
        i = j;
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
    pub(super) fn start(
        &mut self,
        mut st: Box<dyn Storage>,
        (job, images): (Job, Images),
        background: bool,
    ) {
        let job = Arc::new(job);
        let running = if background {
            let j = job.clone();
            let handle = std::thread::Builder::new()
                .name("sozu-checkpoint".into())
                .spawn(move || run(st.as_mut(), &j, images));
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
            let done = run(st.as_mut(), &job, images);
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

    /// [`Job::released`] of the checkpoint in progress (0: none).
    pub(super) fn released(&self) -> u64 {
        self.running.as_ref().map_or(0, |r| r.job.released())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sozu::header::ShardState;
    use crate::sozu::storage::MemStorage;
    use crate::sozu::store::read_existing_page;

    fn header() -> Header {
        Header {
            page_size: 4096,
            layer0_bits: 2,
            growth_bits: 1,
            shards: 1,
            key: [1; 16],
            generation: 1,
            commit_seq: 5,
            tag: None,
            shard_state: vec![ShardState::default()],
            disk_checkpoint: None,
        }
    }

    /// An image only the checkpoint still holds (a commit replaced it) is
    /// let go by step 1 and counted as released; one the store still
    /// holds is not counted. More images than one record holds, so step 3
    /// reads several records back; every image reaches its page file.
    #[test]
    fn step_1_lets_images_go_and_step_3_writes_them_from_the_file() {
        let n = PAGES_PER_RECORD as u64 + 3;
        let images: Vec<(Addr, Arc<Vec<u8>>)> = (0..n)
            .map(|p| {
                let mut img = page::new_page();
                img.reserve_exact(100 + p as usize);
                (((p % 3) as u8, p), Arc::new(img))
            })
            .collect();
        let mut images = images;
        images.sort_unstable_by_key(|(a, _)| *a);
        // The store keeps every other image; the others were replaced.
        let kept: Vec<Arc<Vec<u8>>> = images.iter().step_by(2).map(|(_, p)| p.clone()).collect();
        let replaced: u64 = images
            .iter()
            .skip(1)
            .step_by(2)
            .map(|(_, p)| p.capacity() as u64)
            .sum();
        let expect: Vec<(Addr, Vec<u8>)> = images.iter().map(|(a, p)| (*a, p.to_vec())).collect();
        let (job, images) = Job::new(Plan {
            generation: 2,
            header: header(),
            disk_only: false,
            pages: vec![images],
            records: vec![Vec::new()],
            delete: Vec::new(),
            page_size: 4096,
        });
        let mut st = MemStorage::new();
        run(&mut st, &job, images).unwrap();
        assert_eq!(job.released(), replaced);
        // The names still tell the kept images apart; the others are gone.
        for (i, (_, w)) in job.pages[0].iter().enumerate() {
            assert_eq!(w.upgrade().is_some(), i % 2 == 0);
        }
        assert!(std::ptr::eq(
            Arc::as_ptr(&kept[0]),
            job.pages[0][0].1.as_ptr()
        ));
        for (addr, bytes) in expect {
            assert_eq!(read_existing_page(&mut st, 0, addr, 4096).unwrap(), bytes);
        }
        assert_eq!(st.read_file(ckpt_file(2)).unwrap_or_default().len(), 0);
    }
}
