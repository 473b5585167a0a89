//! Out-of-line scripts (seed 004's external records): per shard, records
//! appended to numbered segment files, and their compaction
//! (`docs/sozu-format.md`, "Records files").
//!
//! A record is the entry's key (36 bytes), the script length (2), two
//! zero bytes and the script. An entry refers to its record by location
//! (segment << 40 | offset) and keeps the script's CRC-32. When the
//! entries of more than half of a segment's bytes have been purged, the
//! segment is sealed and its live records are copied, a bounded number of
//! bytes per block, into the current segment: each record's key finds its
//! entry, which is repointed by a journaled edit; once the whole sealed
//! segment has been walked it is deleted at the next checkpoint.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::header::RecordsState;
use super::lookup::{self, Query};
use super::ops::Op;
use super::page::ExternalScript;
use super::shard::Shard;
use super::storage::Storage;
use super::store::{corrupt, io_err, Published};
use super::types::OutPointKey;
use super::SozuError;

/// Bytes of a record before its script.
pub(super) const RECORD_HEAD_LEN: usize = 40;
/// Bytes of a sealed segment a shard walks per block while compacting.
const COMPACT_STEP_BYTES: u64 = 256 << 10;

/// The file of segment `segment` of shard `shard`.
pub(super) fn segment_file(shard: u8, segment: u32) -> String {
    format!("s{shard}-records-{segment:06}.dat")
}

/// A record's location: segment in bits 40..64, offset in bits 0..40.
pub(super) fn location(segment: u32, offset: u64) -> u64 {
    (u64::from(segment) << 40) | offset
}

/// (segment, offset) of a location.
pub(super) fn split(location: u64) -> (u32, u64) {
    ((location >> 40) as u32, location & ((1 << 40) - 1))
}

/// The records a shard appended since its last commit.
#[derive(Debug, Default)]
pub(super) struct Records {
    pending: BTreeMap<u64, Arc<Vec<u8>>>,
}

impl Records {
    /// Appends the record of `script` (of entry `key`) to the current
    /// segment; returns its reference.
    pub(super) fn append(
        &mut self,
        state: &mut RecordsState,
        key: &[u8],
        script: &[u8],
    ) -> ExternalScript {
        let mut rec = Vec::with_capacity(RECORD_HEAD_LEN + script.len());
        rec.extend_from_slice(key);
        rec.extend_from_slice(&(script.len() as u16).to_le_bytes());
        rec.extend_from_slice(&[0, 0]);
        rec.extend_from_slice(script);
        self.push(state, rec);
        ExternalScript {
            location: location(
                state.current,
                state.current_len - (RECORD_HEAD_LEN + script.len()) as u64,
            ),
            crc: crc32fast::hash(script),
        }
    }

    fn push(&mut self, state: &mut RecordsState, rec: Vec<u8>) -> u64 {
        let loc = location(state.current, state.current_len);
        state.current_len += rec.len() as u64;
        self.pending.insert(loc, Arc::new(rec));
        loc
    }

    /// The records appended since the last commit (the commit takes them).
    pub(super) fn take(&mut self) -> Vec<(u64, Arc<Vec<u8>>)> {
        std::mem::take(&mut self.pending).into_iter().collect()
    }

    pub(super) fn pending(&self) -> &BTreeMap<u64, Arc<Vec<u8>>> {
        &self.pending
    }
}

/// A purged entry's record is dead weight in its segment.
pub(super) fn mark_dead(state: &mut RecordsState, ext: ExternalScript, len: usize) {
    if split(ext.location).0 == state.current {
        state.current_dead =
            (state.current_dead + (RECORD_HEAD_LEN + len) as u64).min(state.current_len);
    }
}

/// The whole record at `loc` whose script is `len` bytes: from `pending`
/// (the writer's uncommitted records), the committed ones in memory, or
/// its segment file.
fn record_bytes(
    st: &mut dyn Storage,
    shard: u8,
    published: &Published,
    pending: Option<&BTreeMap<u64, Arc<Vec<u8>>>>,
    loc: u64,
    len: usize,
) -> Result<Arc<Vec<u8>>, SozuError> {
    if let Some(r) = pending.and_then(|p| p.get(&loc)) {
        return Ok(r.clone());
    }
    if let Some(r) = published.records.read().get(&loc) {
        return Ok(r.clone());
    }
    let (segment, offset) = split(loc);
    let name = segment_file(shard, segment);
    let mut buf = vec![0u8; RECORD_HEAD_LEN + len];
    st.read_at(&name, offset, &mut buf)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::NotFound => corrupt(
                st.path_of(&name),
                offset,
                "records file truncated or missing",
            ),
            _ => io_err(st, &name, e),
        })?;
    Ok(Arc::new(buf))
}

/// Reads and checks the out-of-line script of entry `key` (its record's
/// key, length and the entry's CRC must match).
///
/// # Errors
/// [`SozuError::Corrupt`] naming the segment file and offset, I/O.
pub(super) fn read_script(
    st: &mut dyn Storage,
    (shard, published): (u8, &Published),
    pending: Option<&BTreeMap<u64, Arc<Vec<u8>>>>,
    key: &[u8],
    ext: ExternalScript,
    len: usize,
) -> Result<Vec<u8>, SozuError> {
    let rec = record_bytes(st, shard, published, pending, ext.location, len)?;
    let ok = rec.len() == RECORD_HEAD_LEN + len
        && rec[..36] == *key
        && rec[36..38] == (len as u16).to_le_bytes()
        && rec[38..40] == [0, 0]
        && crc32fast::hash(&rec[RECORD_HEAD_LEN..]) == ext.crc;
    if !ok {
        let (segment, offset) = split(ext.location);
        return Err(corrupt(
            st.path_of(&segment_file(shard, segment)),
            offset,
            "out-of-line script record does not match its entry",
        ));
    }
    Ok(rec[RECORD_HEAD_LEN..].to_vec())
}

impl Shard {
    /// One block's share of records compaction: starts one when the
    /// current segment is large enough and more than half dead, or copies
    /// the live records of the next [`COMPACT_STEP_BYTES`] of the sealed
    /// segment into the current one.
    ///
    /// # Errors
    /// Storage failure or corruption.
    pub(super) fn compact_records(
        &mut self,
        geo: &super::geo::Geo,
        min_len: u64,
    ) -> Result<(), SozuError> {
        let r = &mut self.state.records;
        let Some((segment, len, cursor)) = r.compacting else {
            if r.delete.is_none()
                && r.current_len >= min_len.max(1)
                && r.current_dead * 2 > r.current_len
            {
                r.compacting = Some((r.current, r.current_len, 0));
                r.current += 1;
                r.current_len = 0;
                r.current_dead = 0;
            }
            return Ok(());
        };
        let (walked, end) = self.sealed_records(segment, cursor, len)?;
        self.move_live(geo, &walked)?;
        let r = &mut self.state.records;
        if end >= len {
            r.compacting = None;
            r.delete = Some(segment);
        } else {
            r.compacting = Some((segment, len, end));
        }
        Ok(())
    }

    /// The records of sealed `segment` from `cursor` on, at most about
    /// [`COMPACT_STEP_BYTES`] of them: (location, key, record bytes), and
    /// the offset after the last.
    #[allow(clippy::type_complexity)]
    fn sealed_records(
        &mut self,
        segment: u32,
        mut at: u64,
        len: u64,
    ) -> Result<(Vec<(u64, OutPointKey, Arc<Vec<u8>>)>, u64), SozuError> {
        let start = at;
        let mut out = Vec::new();
        while at < len && at - start < COMPACT_STEP_BYTES {
            let loc = location(segment, at);
            let head = self.record_head(loc)?;
            let script_len = u16::from_le_bytes([head[36], head[37]]) as usize;
            let rec = self.read_record(loc, script_len)?;
            let mut key = [0u8; 36];
            key.copy_from_slice(&rec[..36]);
            at += rec.len() as u64;
            out.push((loc, key, rec));
        }
        Ok((out, at))
    }

    /// The record at `loc` with a script of `script_len` bytes (0: its
    /// head only), from the records not yet committed, the published ones
    /// or its segment.
    fn read_record(&mut self, loc: u64, script_len: usize) -> Result<Arc<Vec<u8>>, SozuError> {
        record_bytes(
            self.store.storage.as_mut(),
            self.id,
            &self.store.published,
            Some(self.records.pending()),
            loc,
            script_len,
        )
    }

    /// The first 40 bytes of the record at `loc`.
    fn record_head(&mut self, loc: u64) -> Result<Vec<u8>, SozuError> {
        let rec = self.read_record(loc, 0)?;
        if rec.len() < RECORD_HEAD_LEN {
            let (segment, offset) = split(loc);
            return Err(corrupt(
                self.store.storage.path_of(&segment_file(self.id, segment)),
                offset,
                "record head truncated",
            ));
        }
        Ok(rec[..RECORD_HEAD_LEN].to_vec())
    }

    /// Copies the records whose entries still point at them into the
    /// current segment and repoints those entries.
    fn move_live(
        &mut self,
        geo: &super::geo::Geo,
        walked: &[(u64, OutPointKey, Arc<Vec<u8>>)],
    ) -> Result<(), SozuError> {
        let queries: Vec<Query> = walked
            .iter()
            .map(|(_, key, _)| Query {
                key: *key,
                h: geo.hash(key),
                min_height: 0,
            })
            .collect();
        let mut live = Vec::new();
        lookup::descend(
            geo,
            &queries,
            &mut self.store,
            &mut |qi, addr, slot, e| {
                if e.external().is_some_and(|x| x.location == walked[qi].0) {
                    live.push((addr, slot, qi));
                }
                Ok(())
            },
            None,
        )?;
        live.sort_unstable();
        for (addr, slot, qi) in live {
            let loc = self
                .records
                .push(&mut self.state.records, walked[qi].2.to_vec());
            self.log
                .apply(&mut self.store, Op::Page(addr))
                .map_err(super::shard::op_err)?;
            self.log
                .apply(
                    &mut self.store,
                    Op::Locate {
                        slot,
                        location: loc,
                    },
                )
                .map_err(super::shard::op_err)?;
            self.counters.records_moved += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_and_dead_bytes() {
        assert_eq!(split(location(3, 17)), (3, 17));
        let mut st = RecordsState::default();
        let mut r = Records::default();
        let ext = r.append(&mut st, &[1; 36], &[0x51; 200]);
        assert_eq!(ext.location, 0);
        let ext2 = r.append(&mut st, &[2; 36], &[0x52; 10]);
        assert_eq!(split(ext2.location), (0, 240));
        assert_eq!(st.current_len, 290);
        mark_dead(&mut st, ext, 200);
        assert_eq!(st.current_dead, 240);
        assert_eq!(r.take().len(), 2);
    }
}
