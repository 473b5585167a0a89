//! Out-of-line scripts (the external records of Teranode's UTXO model): per shard, records
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
//! segment has been walked it is deleted at the next checkpoint. The
//! shard drives that compaction (`Shard::compact_records` in `shard.rs`)
//! with the reads and locations defined here.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::header::RecordsState;
use super::page::ExternalScript;
use super::storage::Storage;
use super::store::{corrupt, io_err, Published};
use super::SozuError;

/// Bytes of a record before its script.
pub(super) const RECORD_HEAD_LEN: usize = 40;
/// Bytes of a sealed segment a shard walks per block while compacting.
pub(super) const COMPACT_STEP_BYTES: u64 = 256 << 10;

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

    /// Appends a whole record `rec` (head and script) to the current
    /// segment, not committed yet; returns its location.
    pub(super) fn push(&mut self, state: &mut RecordsState, rec: Vec<u8>) -> u64 {
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
pub(super) fn record_bytes(
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
