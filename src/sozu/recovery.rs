//! Opening a table, in named phases (`docs/sozu-format.md`, "Open"):
//!
//! 1. [`read_or_create_header`]: the header file (a new table is created
//!    with a fresh random SipHash key); it names the base generation b;
//! 2. [`scan_journal`]: the records of generation b in its journal file,
//!    then those of b + 1 in the other (a checkpoint of b was running),
//!    sequence numbers consecutive; a torn tail ends a journal;
//! 3. [`Replay`]: the checkpoint file of b if it holds the images of the
//!    checkpoint the header names (one interrupted after its header
//!    switch), then every record's page edits applied to the images of the
//!    pages they name, as the writer applied them — up to the commit S of a
//!    checkpoint of the disk layers the header names, on the layers above
//!    its first disk layer only ([`replay_base`]);
//! 4. [`check_records`]: the records files are as long as the header says.
//!
//! Nothing is written; the first commit truncates a torn journal tail.

use std::collections::BTreeMap;
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use super::config::SozuConfig;
use super::files::{ckpt_file, decode_header, journal_file, write_header_file, HEADER_FILE};
use super::geo::Addr;
use super::header::{Header, ShardState, HEADER_LEN, MAX_LAYERS};
use super::journal::{self, Body, Parsed, Record, RECORD_MAGIC};
use super::ops::{self, Pages};
use super::page;
use super::records::{segment_file, split};
use super::storage::Storage;
use super::store::{corrupt, io_err, layer_file, read_existing_page};
use super::SozuError;

/// What replay rebuilt of one shard.
#[derive(Default)]
pub(super) struct ShardRecovery {
    /// Committed images of the pages the checkpoint file and journals hold.
    pub(super) pages: FxHashMap<Addr, Arc<Vec<u8>>>,
    /// Committed records-file bytes, by location.
    pub(super) records: BTreeMap<u64, Arc<Vec<u8>>>,
    /// Pages changed in the current generation.
    pub(super) generation: FxHashSet<Addr>,
}

/// A checkpoint of generation b that recovery found unfinished (records
/// of b + 1 exist): what it must write.
pub(super) struct PendingCheckpoint {
    /// Per shard, the pages of generation b with their images at its end.
    pub(super) pages: Vec<Vec<(Addr, Arc<Vec<u8>>)>>,
    /// Per shard, the records bytes committed by then.
    pub(super) records: Vec<Vec<(u64, Arc<Vec<u8>>)>>,
    /// The header as of the end of generation b (its generation set to b + 1).
    pub(super) header: Header,
}

/// Where the next commit goes.
#[derive(Clone, Copy, Debug)]
pub(super) struct JournalPos {
    /// The current generation (the base, or base + 1).
    pub(super) generation: u64,
    /// Offset after its last valid record: the bytes of the current
    /// generation's records (each generation's file starts at 0).
    pub(super) pos: u64,
    /// Whether bytes after `pos` must be cut first (a torn tail, or an
    /// older generation's records).
    pub(super) truncate: bool,
    /// Bytes in the other journal file: the previous generation's records
    /// until the checkpoint that ends it truncates them (or an older
    /// file's content a truncation did not reach).
    pub(super) other: u64,
}

/// An opened table's state.
pub(super) struct Recovered {
    /// The header as of the last commit (its generation is the current one).
    pub(super) header: Header,
    /// The header file's content.
    pub(super) file_header: Header,
    /// Whether the base's checkpoint file was applied (then it is the only
    /// copy of pages its checkpoint may have left torn: the next checkpoint
    /// must start a new generation, which does not rewrite that file).
    pub(super) ckpt_applied: bool,
    /// The base generation (the header file's).
    pub(super) base: u64,
    pub(super) journal: JournalPos,
    pub(super) shards: Vec<ShardRecovery>,
    pub(super) pending: Option<PendingCheckpoint>,
}

/// Phases 1–4 (see the module docs).
///
/// # Errors
/// [`SozuError::Corrupt`] (file and offset), [`SozuError::UnsupportedVersion`],
/// [`SozuError::Config`] for a new table, [`SozuError::Io`].
pub(super) fn recover(st: &mut dyn Storage, config: &SozuConfig) -> Result<Recovered, SozuError> {
    let file_header = read_or_create_header(st, config)?;
    let base = file_header.generation;
    let ps = file_header.page_size as usize;
    let first = scan_journal(st, base, file_header.commit_seq + 1, ps)?;
    let last_seq = first
        .records
        .last()
        .map_or(file_header.commit_seq, |r| r.seq);
    let second = scan_journal(st, base + 1, last_seq + 1, ps)?;
    let journal = if second.records.is_empty() {
        first.position(base, second.len)
    } else {
        second.position(base + 1, first.len)
    };
    let mut replay = Replay::new(&file_header);
    let images = read_checkpoint_file(st, &file_header)?;
    let ckpt_applied = !images.is_empty();
    for rec in images {
        replay.record(st, &rec, (ckpt_file(base), 0), None)?;
    }
    let mut header = replay_base(st, &mut replay, &file_header, &first)?;
    let mut pending = None;
    if !second.records.is_empty() {
        pending = Some(replay.end_generation(Header {
            generation: base + 1,
            disk_checkpoint: None,
            ..header.clone()
        }));
        for (rec, at) in second.records.iter().zip(&second.offsets) {
            header = record_header(st, &file_header, rec, base + 1, *at)?;
            replay.record(st, rec, (journal_file(base + 1), *at), None)?;
        }
    }
    header.generation = journal.generation;
    header.disk_checkpoint = None;
    let shards = replay.finish(st)?;
    check_records(st, &header.shard_state, &shards)?;
    Ok(Recovered {
        header,
        file_header,
        ckpt_applied,
        base,
        journal,
        shards,
        pending,
    })
}

/// Phase 3 for the base generation b's journal: its records up to the
/// disk layers' checkpoint S the header file names replayed on the layers
/// above its L only, the others on every page; returns the header of the
/// last one (the header file's if none).
///
/// # Errors
/// [`SozuError::Corrupt`]: the journal ends before S, or a record does not
/// apply.
fn replay_base(
    st: &mut dyn Storage,
    replay: &mut Replay,
    file_header: &Header,
    first: &Scan,
) -> Result<Header, SozuError> {
    let base = file_header.generation;
    let last_seq = first
        .records
        .last()
        .map_or(file_header.commit_seq, |r| r.seq);
    if let Some((s, _)) = file_header.disk_checkpoint.filter(|(s, _)| *s > last_seq) {
        return Err(corrupt(
            st.path_of(journal_file(base)),
            first.valid_end,
            format!("journal ends at commit {last_seq}, before the disk layers' checkpoint of commit {s}"),
        ));
    }
    let mut header = file_header.clone();
    for (rec, at) in first.records.iter().zip(&first.offsets) {
        header = record_header(st, file_header, rec, base, *at)?;
        let disk_from = file_header
            .disk_checkpoint
            .filter(|(s, _)| rec.seq <= *s)
            .map(|(_, l)| l);
        replay.record(st, rec, (journal_file(base), *at), disk_from)?;
    }
    Ok(header)
}

/// Phase 1.
fn read_or_create_header(st: &mut dyn Storage, config: &SozuConfig) -> Result<Header, SozuError> {
    let has_header = st
        .exists(HEADER_FILE)
        .map_err(|e| io_err(st, HEADER_FILE, e))?;
    if !has_header {
        let mut other = false;
        for name in [journal_file(0), journal_file(1), &layer_file(0, 1)] {
            other |= st.len(name).map_err(|e| io_err(st, name, e))? > 0;
        }
        if other {
            return Err(corrupt(
                st.path_of(HEADER_FILE),
                0,
                "header file missing but table files exist",
            ));
        }
        create(st, config)?;
    }
    let hlen = st
        .len(HEADER_FILE)
        .map_err(|e| io_err(st, HEADER_FILE, e))?;
    if hlen != HEADER_LEN as u64 {
        return Err(corrupt(
            st.path_of(HEADER_FILE),
            hlen,
            format!("header is {hlen} bytes, expected {HEADER_LEN}"),
        ));
    }
    let mut b = vec![0u8; HEADER_LEN];
    st.read_at(HEADER_FILE, 0, &mut b)
        .map_err(|e| io_err(st, HEADER_FILE, e))?;
    let h = decode_header(st, HEADER_FILE, 0, &b)?;
    if !st
        .exists(journal_file(h.generation))
        .map_err(|e| io_err(st, HEADER_FILE, e))?
    {
        return Err(corrupt(
            st.path_of(journal_file(h.generation)),
            0,
            "journal file missing",
        ));
    }
    Ok(h)
}

/// A new table: every layer-0 page written empty, both journals empty,
/// then the header (generation 1).
fn create(st: &mut dyn Storage, config: &SozuConfig) -> Result<(), SozuError> {
    config.check_geometry()?;
    let mut key = [0u8; 16];
    getrandom::getrandom(&mut key).map_err(|e| SozuError::Io {
        path: st.path_of(HEADER_FILE),
        source: std::io::Error::other(e),
    })?;
    let s = config.shards;
    let ps = config.page_size;
    let header = Header {
        page_size: ps as u32,
        layer0_bits: config.layer0_bits,
        growth_bits: config.growth_bits,
        shards: s,
        key,
        generation: 1,
        commit_seq: 0,
        tag: None,
        shard_state: vec![ShardState::default(); s as usize],
        disk_checkpoint: None,
    };
    let empty = page::seal(&page::new_page(), ps).map_err(|_| SozuError::Config {
        reason: "page too small",
    })?;
    let pages = 1u64 << (u32::from(config.layer0_bits) - s.trailing_zeros());
    for shard in 0..s {
        let name = layer_file(shard, 0);
        let per_write = 64u64;
        let mut p = 0;
        while p < pages {
            let n = per_write.min(pages - p);
            let buf = empty.repeat(n as usize);
            st.write_at(&name, p * ps as u64, &buf)
                .map_err(|e| io_err(st, &name, e))?;
            p += n;
        }
        st.sync(&name).map_err(|e| io_err(st, &name, e))?;
    }
    for name in [journal_file(0), journal_file(1)] {
        st.set_len(name, 0).map_err(|e| io_err(st, name, e))?;
        st.sync(name).map_err(|e| io_err(st, name, e))?;
    }
    write_header_file(st, &header.encode())
}

/// The valid records of one journal file.
struct Scan {
    records: Vec<Record>,
    /// Offset of each record.
    offsets: Vec<u64>,
    valid_end: u64,
    len: u64,
}

impl Scan {
    fn position(&self, generation: u64, other: u64) -> JournalPos {
        JournalPos {
            generation,
            pos: self.valid_end,
            truncate: self.valid_end != self.len,
            other,
        }
    }
}

/// Phase 2 for generation `g`: its records in order from sequence
/// `first_seq`, up to a torn tail or an older generation's records (a
/// truncation that did not reach the disk).
///
/// # Errors
/// [`SozuError::Corrupt`]: a record out of sequence, or a damaged record
/// followed by a later one of this generation.
fn scan_journal(
    st: &mut dyn Storage,
    g: u64,
    first_seq: u64,
    page_size: usize,
) -> Result<Scan, SozuError> {
    let name = journal_file(g);
    let len = st.len(name).map_err(|e| io_err(st, name, e))?;
    let n = usize::try_from(len).map_err(|_| corrupt(st.path_of(name), 0, "journal too large"))?;
    let mut b = vec![0u8; n];
    if n > 0 {
        st.read_at(name, 0, &mut b)
            .map_err(|e| io_err(st, name, e))?;
    }
    let mut scan = Scan {
        records: Vec::new(),
        offsets: Vec::new(),
        valid_end: 0,
        len,
    };
    let mut pos = 0usize;
    let mut expect = first_seq;
    while pos < n {
        match journal::parse(&b[pos..], page_size) {
            Parsed::Ok(rec, l) if rec.generation == g && rec.seq == expect => {
                expect += 1;
                scan.records.push(rec);
                scan.offsets.push(pos as u64);
                pos += l;
                scan.valid_end = pos as u64;
            }
            Parsed::Ok(rec, _) if rec.generation < g => break,
            Parsed::Ok(rec, _) => {
                return Err(corrupt(
                    st.path_of(name),
                    pos as u64,
                    format!(
                    "record of generation {} seq {} where generation {g} seq {expect} was expected",
                    rec.generation, rec.seq
                ),
                ))
            }
            Parsed::Invalid => break,
        }
    }
    if later_record(&b, pos, g, expect, page_size) {
        return Err(corrupt(
            st.path_of(name),
            pos as u64,
            "damaged commit record followed by later commits",
        ));
    }
    Ok(scan)
}

/// Whether a valid record of generation `g` with sequence ≥ `expect`
/// starts anywhere after `pos` (then the journal was damaged, not torn).
fn later_record(b: &[u8], pos: usize, g: u64, expect: u64, page_size: usize) -> bool {
    (pos + 1..b.len().saturating_sub(journal::RECORD_HEADER_LEN)).any(|probe| {
        b[probe..probe + 4] == RECORD_MAGIC
            && journal::record_generation(&b[probe..]) == Some(g)
            && matches!(journal::parse(&b[probe..], page_size),
                Parsed::Ok(r, _) if r.seq >= expect)
    })
}

/// A record's header, checked against the table's.
fn record_header(
    st: &dyn Storage,
    file_header: &Header,
    rec: &Record,
    g: u64,
    at: u64,
) -> Result<Header, SozuError> {
    let name = journal_file(g);
    let h = decode_header(st, name, at, &rec.header)?;
    if !file_header.same_table(&h) || h.commit_seq != rec.seq {
        return Err(corrupt(
            st.path_of(name),
            at,
            "commit record header disagrees with the table header",
        ));
    }
    Ok(h)
}

/// The records of the checkpoint file of the base generation, if it holds
/// those of the checkpoint the header file names — generation b and, as
/// sequence number, the disk layers' checkpoint's commit S if the header
/// names one, else the header's last commit (a checkpoint whose header
/// switch happened: its images must be applied); else none (an older,
/// spent one, or one torn before its header switch, even within the same
/// generation: the page files are consistent without it).
///
/// # Errors
/// [`SozuError::Corrupt`] when a record of that checkpoint is damaged or
/// followed by anything but another (it was synced before the switch).
fn read_checkpoint_file(st: &mut dyn Storage, h: &Header) -> Result<Vec<Record>, SozuError> {
    let want = (h.generation, h.checkpoint_seq());
    let file = ckpt_file(h.generation);
    let len = st.len(file).map_err(|e| io_err(st, file, e))?;
    let len = usize::try_from(len)
        .map_err(|_| corrupt(st.path_of(file), 0, "checkpoint file too large"))?;
    if len == 0 {
        return Ok(Vec::new());
    }
    let mut buf = vec![0u8; len];
    st.read_at(file, 0, &mut buf)
        .map_err(|e| io_err(st, file, e))?;
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos < buf.len() {
        match journal::parse(&buf[pos..], h.page_size as usize) {
            Parsed::Ok(rec, n)
                if (rec.generation, rec.seq) == want && matches!(rec.body, Body::Images(_)) =>
            {
                out.push(rec);
                pos += n;
            }
            _ if pos == 0 && journal::record_tag(&buf) != Some(want) => return Ok(Vec::new()),
            _ => {
                return Err(corrupt(
                    st.path_of(file),
                    pos as u64,
                    "damaged checkpoint record",
                ))
            }
        }
    }
    Ok(out)
}

/// Phase 3: committed images rebuilt from the checkpoint file and journals.
struct Replay {
    page_size: usize,
    shards: Vec<ShardRecovery>,
}

/// One shard's images during replay, loading base images from its files.
struct ReplayPages<'a> {
    st: &'a mut dyn Storage,
    shard: u8,
    page_size: usize,
    rec: &'a mut ShardRecovery,
}

impl Pages for ReplayPages<'_> {
    fn edit(&mut self, addr: Addr) -> Result<&mut Vec<u8>, SozuError> {
        if !self.rec.pages.contains_key(&addr) {
            let p = read_existing_page(self.st, self.shard, addr, self.page_size)?;
            self.rec.pages.insert(addr, Arc::new(p));
        }
        self.rec.generation.insert(addr);
        let p = self.rec.pages.get_mut(&addr).ok_or(SozuError::Poisoned)?;
        Ok(Arc::make_mut(p))
    }
    fn create(&mut self, addr: Addr) -> Result<&mut Vec<u8>, SozuError> {
        self.rec.pages.insert(addr, Arc::new(page::new_page()));
        self.edit(addr)
    }
}

impl Replay {
    fn new(h: &Header) -> Self {
        Self {
            page_size: h.page_size as usize,
            shards: (0..h.shards).map(|_| ShardRecovery::default()).collect(),
        }
    }

    /// Applies one record (at byte `at` of file `name`).
    /// With `disk_from` = `Some(L)`, only its edits of the layers above L
    /// ([`ops::replay`]).
    fn record(
        &mut self,
        st: &mut dyn Storage,
        rec: &Record,
        (name, at): (&str, u64),
        disk_from: Option<u8>,
    ) -> Result<(), SozuError> {
        let path = st.path_of(name);
        let bad = |reason: String| corrupt(path.clone(), at, reason);
        match &rec.body {
            Body::Ops(shards) => {
                for (shard, bytes) in shards {
                    let r = self
                        .shards
                        .get_mut(*shard as usize)
                        .ok_or_else(|| bad("edits of a shard that does not exist".into()))?;
                    let mut pages = ReplayPages {
                        st: &mut *st,
                        shard: *shard,
                        page_size: self.page_size,
                        rec: r,
                    };
                    ops::replay(&mut pages, bytes, disk_from).map_err(|e| match e {
                        ops::OpError::Load(e) => *e,
                        e => corrupt(path.clone(), at, format!("shard {shard}: {e}")),
                    })?;
                }
            }
            Body::Images(images) => {
                for p in images {
                    let r = self
                        .shards
                        .get_mut(p.shard as usize)
                        .ok_or_else(|| bad("image of a shard that does not exist".into()))?;
                    if p.addr.0 as usize >= MAX_LAYERS {
                        return Err(bad("image of a layer that cannot exist".into()));
                    }
                    r.pages.insert(p.addr, p.image.clone());
                    r.generation.insert(p.addr);
                }
            }
        }
        for e in &rec.extents {
            let r = self
                .shards
                .get_mut(e.shard as usize)
                .ok_or_else(|| bad("extent of a shard that does not exist".into()))?;
            r.records.insert(e.location, e.data.clone());
        }
        Ok(())
    }

    /// The end of generation b: what its checkpoint must write; the pages
    /// changed from here on belong to b + 1.
    fn end_generation(&mut self, header: Header) -> PendingCheckpoint {
        let mut pages = Vec::new();
        let mut records = Vec::new();
        for r in &mut self.shards {
            let mut v: Vec<(Addr, Arc<Vec<u8>>)> = r
                .generation
                .drain()
                .filter_map(|a| r.pages.get(&a).map(|p| (a, p.clone())))
                .collect();
            v.sort_unstable_by_key(|(a, _)| *a);
            pages.push(v);
            records.push(r.records.iter().map(|(l, d)| (*l, d.clone())).collect());
        }
        PendingCheckpoint {
            pages,
            records,
            header,
        }
    }

    /// Every replayed page checked whole (it must fit a page).
    fn finish(self, st: &dyn Storage) -> Result<Vec<ShardRecovery>, SozuError> {
        for (s, r) in self.shards.iter().enumerate() {
            for (addr, p) in &r.pages {
                let bad = page::validate(p).err().map(|e| e.to_string()).or_else(|| {
                    (p.len() > self.page_size).then(|| "page over its size".to_string())
                });
                if let Some(reason) = bad {
                    return Err(corrupt(
                        st.path_of(&layer_file(s as u8, addr.0)),
                        addr.1.saturating_mul(self.page_size as u64),
                        format!("page as the journal leaves it: {reason}"),
                    ));
                }
            }
        }
        Ok(self.shards)
    }
}

/// Phase 4: each records segment the state names is as long as it says,
/// or its missing tail is among the committed bytes replay found.
///
/// # Errors
/// [`SozuError::Corrupt`] naming the truncated segment.
fn check_records(
    st: &mut dyn Storage,
    states: &[ShardState],
    shards: &[ShardRecovery],
) -> Result<(), SozuError> {
    for (s, (state, rec)) in states.iter().zip(shards).enumerate() {
        let r = &state.records;
        let mut want = vec![(r.current, r.current_len)];
        want.extend(r.compacting.map(|(seg, len, _)| (seg, len)));
        for (seg, len) in want {
            let name = segment_file(s as u8, seg);
            let file_len = st.len(&name).map_err(|e| io_err(st, &name, e))?;
            let covered = rec
                .records
                .iter()
                .filter(|(l, _)| split(**l).0 == seg)
                .map(|(l, d)| split(*l).1 + d.len() as u64)
                .max()
                .unwrap_or(0);
            if file_len < len && covered < len {
                return Err(corrupt(
                    st.path_of(&name),
                    file_len,
                    format!("records file truncated (expected {len} bytes)"),
                ));
            }
        }
    }
    Ok(())
}
