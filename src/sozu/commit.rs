//! The block-boundary commit and the checkpoint cycle around it
//! (`docs/sozu-format.md`, "Journal" and "Checkpoint").
//!
//! A commit appends one record to the current generation's journal — each
//! shard's page edits since the last commit, the records-file bytes
//! appended, the new header — and fsyncs it: the only fsync of a commit.
//! Then each shard publishes its changed pages to readers at once.
//!
//! When the current generation's journal has grown past its bound and no
//! checkpoint is running, the commit first starts a new generation in the
//! other journal file and hands the pages the old one changed to the
//! checkpointer; when instead the disk pages committed and not yet in
//! their files pass their memory bound, it hands over only those, as of
//! the last commit, and the generation goes on (a checkpoint of the disk
//! layers: the pinned pages, rewritten by nearly every block, are not
//! written again). A later commit that finds the checkpoint finished lets
//! the disk pages it wrote leave memory.

use std::sync::Arc;

use super::checkpoint::{Images, Job, Plan};
use super::config::{JOURNAL_FLOOR, JOURNAL_SHARE};
use super::files::journal_file;
use super::journal::{self, Body, Extent, Record};
use super::records::segment_file;
use super::recovery::PendingCheckpoint;
use super::shard::Shard;
use super::stats::file_bytes;
use super::store::io_err;
use super::table::SozuTable;
use super::types::CommitTag;
use super::SozuError;

impl SozuTable {
    pub(super) fn commit_inner(&mut self, tag: CommitTag) -> Result<(), SozuError> {
        self.finish_checkpoint(false)?;
        if !self.checkpointer.is_idle() && self.plan.must_wait(self.unflushed(), self.held_twice())
        {
            // The pages held twice while the checkpoint writes count
            // against the budget: wait rather than pass it.
            self.counters.checkpoint_waits += 1;
            let start = std::time::Instant::now();
            self.finish_checkpoint(true)?;
            self.counters.checkpoint_wait_nanos += start.elapsed().as_nanos() as u64;
        }
        if self.checkpointer.is_idle() {
            if let Some(p) = self.pending.take() {
                self.start_pending(p)?;
            } else if self.journal_full()? {
                self.rotate()?;
            } else if self.unflushed() > self.plan.unflushed_bytes {
                if self.disk_only_allowed() {
                    self.checkpoint_disk_layers()?;
                } else {
                    self.rotate()?;
                }
            }
        }
        let mut header = self.committed.clone();
        header.commit_seq += 1;
        header.tag = Some(tag);
        header.generation = self.journal.generation;
        header.shard_state = self.shards.iter().map(|s| s.state).collect();
        let mut ops = Vec::with_capacity(self.shards.len());
        let mut extents = Vec::new();
        let mut records = Vec::with_capacity(self.shards.len());
        for s in &mut self.shards {
            ops.push((s.id, s.log.take()));
            let r = s.records.take();
            extents.extend(r.iter().map(|(location, data)| Extent {
                shard: s.id,
                location: *location,
                data: data.clone(),
            }));
            records.push(vec![r]);
        }
        let rec = Record {
            generation: header.generation,
            seq: header.commit_seq,
            body: Body::Ops(ops),
            extents,
            header: header.encode(),
        };
        journal::encode(&rec, &mut self.record_buf);
        self.append_record()?;
        self.committed = header;
        self.counters.commits += 1;
        let written = self.workers.run(&mut self.shards, records, |s, mut r| {
            let n = s.store.dirty_count() as u64;
            s.counters.pages_written += n;
            s.store.publish(r.pop().unwrap_or_default());
            *s.store.published.state.write() = s.state;
            Ok(n)
        })?;
        self.counters.last_block.1 = written.iter().sum();
        self.counters.held_twice_peak = self.counters.held_twice_peak.max(self.held_twice());
        Ok(())
    }

    /// Appends the encoded record to the journal and makes it durable.
    fn append_record(&mut self) -> Result<(), SozuError> {
        let start = std::time::Instant::now();
        let st = self.storage.as_mut();
        let name = journal_file(self.journal.generation);
        if self.journal.truncate {
            st.set_len(name, self.journal.pos)
                .map_err(|e| io_err(st, name, e))?;
        }
        st.write_at(name, self.journal.pos, &self.record_buf)
            .map_err(|e| io_err(st, name, e))?;
        st.sync(name).map_err(|e| io_err(st, name, e))?;
        let n = self.record_buf.len() as u64;
        self.journal.truncate = false;
        self.journal.pos += n;
        self.counters.journal_bytes += n;
        self.counters.journal_sync_nanos += start.elapsed().as_nanos() as u64;
        Ok(())
    }

    /// Whether the current generation's journal has reached its bound
    /// ([`super::SozuConfig::checkpoint_bytes`], or 1/[`JOURNAL_SHARE`] of
    /// the table's other files if less, at least [`JOURNAL_FLOOR`]). The
    /// files are measured only when the journal reaches the last bound
    /// measured: the table may have grown since.
    fn journal_full(&mut self) -> Result<bool, SozuError> {
        if self.journal.pos < self.journal_bound {
            return Ok(false);
        }
        let cap = self.options.checkpoint_bytes;
        self.journal_bound = if cap <= JOURNAL_FLOOR {
            cap
        } else {
            let states: Vec<_> = self.shards.iter().map(|s| s.state).collect();
            let (all, journals) = file_bytes(self.storage.as_mut(), &self.geo, &states)?;
            (all.saturating_sub(journals) / JOURNAL_SHARE).clamp(JOURNAL_FLOOR, cap)
        };
        Ok(self.journal.pos >= self.journal_bound)
    }

    fn unflushed(&self) -> u64 {
        self.shards.iter().map(|s| s.store.unflushed()).sum()
    }

    /// Bytes of images the running checkpoint holds that commits have
    /// replaced: counted when replaced, less those it has let go since.
    pub(super) fn held_twice(&self) -> u64 {
        let counted: u64 = self.shards.iter().map(|s| s.store.held_twice()).sum();
        counted.saturating_sub(self.checkpointer.released())
    }

    /// Starts a new generation and checkpoints the one that ends.
    fn rotate(&mut self) -> Result<(), SozuError> {
        if self.base != self.journal.generation {
            return Err(SozuError::Poisoned);
        }
        let generation = self.journal.generation + 1;
        let mut header = self.committed.clone();
        header.generation = generation;
        header.disk_checkpoint = None;
        let mut delete = Vec::new();
        let mut pages = Vec::new();
        let mut records = Vec::new();
        for s in &mut self.shards {
            pages.push(s.store.take_generation());
            records.push(unwritten_records(s));
            if let Some(seg) = s.state.records.delete.take() {
                delete.push(segment_file(s.id, seg));
            }
        }
        self.journal.generation = generation;
        self.journal.other = self.journal.pos;
        self.journal.pos = 0;
        self.journal.truncate = true;
        self.start(Job::new(Plan {
            generation,
            header,
            disk_only: false,
            pages,
            records,
            delete,
            page_size: self.geo.page_size,
        }))
    }

    /// Whether the next checkpoint may write the disk layers only: no
    /// checkpoint file recovery applied may be rewritten, the pinned layers
    /// are those of the header's last one, and a commit since it gives it a
    /// sequence number of its own.
    fn disk_only_allowed(&self) -> bool {
        !self.full_next
            && self.base == self.journal.generation
            && self.committed.commit_seq > self.file_header.checkpoint_seq()
    }

    /// Checkpoints the disk pages committed since the last checkpoint, as
    /// of the last commit S, within the base generation
    /// (`docs/sozu-format.md`, "Checkpoints of the disk layers").
    fn checkpoint_disk_layers(&mut self) -> Result<(), SozuError> {
        let mut header = self.file_header.clone();
        header.disk_checkpoint = Some((self.committed.commit_seq, self.geo.ram_layers));
        let mut pages = Vec::new();
        let mut records = Vec::new();
        for s in &mut self.shards {
            pages.push(s.store.take_disk_pages());
            records.push(unwritten_records(s));
        }
        self.start(Job::new(Plan {
            generation: self.base,
            header,
            disk_only: true,
            pages,
            records,
            delete: Vec::new(),
            page_size: self.geo.page_size,
        }))
    }

    /// Starts the checkpoint recovery found unfinished.
    fn start_pending(&mut self, p: PendingCheckpoint) -> Result<(), SozuError> {
        self.start(Job::new(Plan {
            generation: p.header.generation,
            header: p.header,
            disk_only: false,
            pages: p.pages,
            records: p.records,
            delete: Vec::new(),
            page_size: self.geo.page_size,
        }))
    }

    fn start(&mut self, job: (Job, Images)) -> Result<(), SozuError> {
        for (addr, _) in job.0.pages.iter().flatten() {
            self.counters.checkpoint_pages.0 += 1;
            self.counters.checkpoint_pages.1 += u64::from(self.geo.is_ram(addr.0));
        }
        let st = self
            .storage
            .try_clone()
            .map_err(|e| io_err(self.storage.as_ref(), super::files::HEADER_FILE, e))?;
        self.checkpointer.start(st, job, self.options.background);
        Ok(())
    }

    /// Applies a finished checkpoint (waiting for it if `wait`): its base
    /// is the page files', and the pages it wrote leave memory.
    ///
    /// # Errors
    /// The checkpoint's error.
    pub(super) fn finish_checkpoint(&mut self, wait: bool) -> Result<(), SozuError> {
        let done = if wait {
            self.checkpointer.wait()
        } else {
            self.checkpointer.poll()
        };
        let Some((job, result)) = done else {
            return Ok(());
        };
        result?;
        if job.disk_only {
            self.counters.disk_only_checkpoints += 1;
        } else {
            self.base = job.generation;
            self.full_next = false;
            // Its last step truncated the previous generation's journal.
            self.journal.other = 0;
        }
        self.file_header = job.header.clone();
        for (s, (pages, records)) in self
            .shards
            .iter_mut()
            .zip(job.pages.iter().zip(&job.records))
        {
            s.store.checkpointed(pages);
            let mut r = s.store.published.records.write();
            for (l, d) in records {
                if r.get(l).is_some_and(|x| Arc::ptr_eq(x, d)) {
                    r.remove(l);
                }
            }
        }
        self.counters.checkpoints += 1;
        self.counters.checkpoint_cpu_nanos += job.cpu_nanos();
        Ok(())
    }

    /// Checkpoints now (`docs/sozu-format.md`, "Checkpoint") rather than
    /// when the journal grows past [`super::SozuConfig::checkpoint_bytes`],
    /// and waits for it: every committed page moves into the page files.
    /// The committed state is the same before and after; a block written
    /// and not yet committed stays pending. For a backup of the page files,
    /// or to keep a checkpoint out of a measured window (`benches/sozu.rs`).
    ///
    /// # Errors
    /// Storage failure; the table is then poisoned and must be reopened.
    pub fn checkpoint_now(&mut self) -> Result<(), SozuError> {
        self.check_poison()?;
        let r = self.checkpoint_now_inner();
        if r.is_err() {
            self.poisoned = true;
        }
        r
    }

    fn checkpoint_now_inner(&mut self) -> Result<(), SozuError> {
        self.finish_checkpoint(true)?;
        if let Some(p) = self.pending.take() {
            self.start_pending(p)?;
            self.finish_checkpoint(true)?;
        }
        self.rotate()?;
        self.finish_checkpoint(true)
    }
}

/// A shard's committed records bytes not known to be in their files.
fn unwritten_records(s: &Shard) -> Vec<(u64, Arc<Vec<u8>>)> {
    s.store
        .published
        .records
        .read()
        .iter()
        .map(|(l, d)| (*l, d.clone()))
        .collect()
}
