//! The table header: geometry, hash key, allocation and the last commit
//! (byte layout in `docs/sozu-format.md`, "Header"). It is the file
//! `sozu.header` (the checkpointed base) and the tail of every journal
//! record (the state as of that commit).

use super::page::{MAX_GROWTH_BITS, MAX_PAGE_SIZE, MIN_PAGE_SIZE};
use super::types::{BlockId, CommitTag};

/// Magic at byte 4 of the header.
pub const HEADER_MAGIC: [u8; 8] = *b"SOZUTBL\0";
/// Major format version: a mismatch refuses to open. 6: spend markers
/// (an entry below the pinned layers is spent by a marker in the last
/// pinned page of its path, carried down by the spills); 5: checkpoints of the
/// disk layers only within a generation (the header names the last one's
/// commit and first disk layer; checkpoint records are tagged with the
/// commit they hold the state of); 4: pages edited in
/// place and journaled as edits (spills by reference), checkpoints in the
/// background over two journal files, records files in compacted
/// segments; 3: journal page deltas on the page files' images, checkpoints
/// double-written inside a commit; 2: every page's first journal item in a
/// generation was a whole image; 1: no written-children mask.
pub const FORMAT_MAJOR: u16 = 6;
/// Minor format version.
pub const FORMAT_MINOR: u16 = 0;
/// Size of the header image in bytes.
pub const HEADER_LEN: usize = 4096;
/// Most layers a table can have.
pub const MAX_LAYERS: usize = 32;
/// Most shards a table can have.
pub const MAX_SHARDS: usize = 8;
/// Bytes of one shard's state in the header.
const SHARD_STATE_LEN: usize = 320;
/// "None" in the header's segment fields.
const NO_SEGMENT: u32 = u32::MAX;

/// The out-of-line scripts of one shard (`docs/sozu-format.md`, "Records
/// files"): the segment appended to, and the one being compacted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RecordsState {
    /// Segment new records are appended to.
    pub current: u32,
    /// Its length in bytes.
    pub current_len: u64,
    /// Bytes of its records whose entries were purged.
    pub current_dead: u64,
    /// A sealed segment whose live records are being copied into the
    /// current one, with its length and the offset reached.
    pub compacting: Option<(u32, u64, u64)>,
    /// A compacted segment to delete at the next checkpoint.
    pub delete: Option<u32>,
}

/// Per-shard allocation state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardState {
    /// Child groups allocated per layer (index 0 unused: layer 0 is fully
    /// allocated).
    pub groups: [u64; MAX_LAYERS],
    /// Its records files.
    pub records: RecordsState,
}

impl Default for ShardState {
    fn default() -> Self {
        Self {
            groups: [0; MAX_LAYERS],
            records: RecordsState::default(),
        }
    }
}

/// The logical header: geometry, hash key, allocation, last commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Page (bucket) size in bytes.
    pub page_size: u32,
    /// log2 of the number of layer-0 buckets.
    pub layer0_bits: u8,
    /// g: each layer has 2^g times the buckets of the one above.
    pub growth_bits: u8,
    /// Number of shards (power of two).
    pub shards: u8,
    /// SipHash-2-4 key.
    pub key: [u8; 16],
    /// In `sozu.header`: the base generation (the page files hold the
    /// state at its start); in a journal record: the record's generation.
    pub generation: u64,
    /// Sequence number of the last commit.
    pub commit_seq: u64,
    /// Tag of the last commit.
    pub tag: Option<CommitTag>,
    /// Per-shard state (`shards` items).
    pub shard_state: Vec<ShardState>,
    /// In `sozu.header` only: the last checkpoint of the disk layers only
    /// in the base generation (`docs/sozu-format.md`, "Checkpoints of the
    /// disk layers"), as (S, L): the page files of layers ≥ L hold the
    /// state at commit S, those above L the state at the base's start.
    /// `None` in journal records and in a header that starts a generation.
    pub disk_checkpoint: Option<(u64, u8)>,
}

/// Why a header image is invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    /// Checksum mismatch.
    Checksum,
    /// Wrong magic.
    Magic,
    /// Unsupported major version.
    Version(u16, u16),
    /// A field out of range.
    Field(&'static str),
}

fn opt_segment(v: u32) -> Option<u32> {
    (v != NO_SEGMENT).then_some(v)
}

fn encode_shard(b: &mut [u8], st: &ShardState) {
    for (l, g) in st.groups.iter().enumerate() {
        b[l * 8..l * 8 + 8].copy_from_slice(&g.to_le_bytes());
    }
    let r = &st.records;
    let (old, old_len, cursor) = r.compacting.unwrap_or((NO_SEGMENT, 0, 0));
    b[256..260].copy_from_slice(&r.current.to_le_bytes());
    b[260..264].copy_from_slice(&old.to_le_bytes());
    b[264..268].copy_from_slice(&r.delete.unwrap_or(NO_SEGMENT).to_le_bytes());
    b[272..280].copy_from_slice(&r.current_len.to_le_bytes());
    b[280..288].copy_from_slice(&r.current_dead.to_le_bytes());
    b[288..296].copy_from_slice(&old_len.to_le_bytes());
    b[296..304].copy_from_slice(&cursor.to_le_bytes());
}

fn decode_shard(b: &[u8]) -> Result<ShardState, HeaderError> {
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let u64_at = |i: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[i..i + 8]);
        u64::from_le_bytes(a)
    };
    let mut st = ShardState::default();
    for l in 0..MAX_LAYERS {
        st.groups[l] = u64_at(l * 8);
        if st.groups[l] > 1 << 40 {
            return Err(HeaderError::Field("group count"));
        }
    }
    let r = &mut st.records;
    r.current = u32_at(256);
    r.current_len = u64_at(272);
    r.current_dead = u64_at(280);
    r.compacting = opt_segment(u32_at(260)).map(|s| (s, u64_at(288), u64_at(296)));
    r.delete = opt_segment(u32_at(264));
    let bad_segment = |s: u32| s >= 1 << 24;
    if bad_segment(r.current)
        || r.compacting
            .is_some_and(|(s, len, at)| bad_segment(s) || at > len || s >= r.current)
        || r.delete.is_some_and(bad_segment)
        || r.current_dead > r.current_len
        || r.current_len >= 1 << 40
        || u32_at(268) != 0
        || b[304..SHARD_STATE_LEN].iter().any(|&x| x != 0)
    {
        return Err(HeaderError::Field("records state"));
    }
    Ok(st)
}

impl Header {
    /// Encodes the header into [`HEADER_LEN`] bytes, crc32 in bytes 0..4.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN];
        b[4..12].copy_from_slice(&HEADER_MAGIC);
        b[12..14].copy_from_slice(&FORMAT_MAJOR.to_le_bytes());
        b[14..16].copy_from_slice(&FORMAT_MINOR.to_le_bytes());
        b[16..20].copy_from_slice(&self.page_size.to_le_bytes());
        b[20] = self.layer0_bits;
        b[21] = self.growth_bits;
        b[22] = self.shards;
        b[24..40].copy_from_slice(&self.key);
        b[40..48].copy_from_slice(&self.generation.to_le_bytes());
        b[48..56].copy_from_slice(&self.commit_seq.to_le_bytes());
        if let Some(t) = self.tag {
            b[56] = 1;
            b[60..64].copy_from_slice(&t.block.0.to_le_bytes());
            b[64..68].copy_from_slice(&t.height.to_le_bytes());
            b[68..100].copy_from_slice(&t.block_hash);
        }
        if let Some((seq, layer)) = self.disk_checkpoint {
            b[100..108].copy_from_slice(&seq.to_le_bytes());
            b[108] = layer;
        }
        for (s, st) in self.shard_state.iter().enumerate() {
            let base = 128 + s * SHARD_STATE_LEN;
            encode_shard(&mut b[base..base + SHARD_STATE_LEN], st);
        }
        let crc = crc32fast::hash(&b[4..]);
        b[..4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and verifies a header image.
    ///
    /// # Errors
    /// [`HeaderError`] on a bad checksum, magic, version or field.
    pub fn decode(b: &[u8]) -> Result<Self, HeaderError> {
        if b.len() != HEADER_LEN {
            return Err(HeaderError::Field("header length"));
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        if b[4..12] != HEADER_MAGIC {
            return Err(HeaderError::Magic);
        }
        let (major, minor) = (u16_at(12), u16_at(14));
        if major != FORMAT_MAJOR {
            return Err(HeaderError::Version(major, minor));
        }
        if u32_at(0) != crc32fast::hash(&b[4..]) {
            return Err(HeaderError::Checksum);
        }
        let page_size = u32_at(16);
        let (layer0_bits, growth_bits, shards) = (b[20], b[21], b[22]);
        let ps = page_size as usize;
        if !(MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&ps) || !ps.is_power_of_two() {
            return Err(HeaderError::Field("page size"));
        }
        if !(1..=32).contains(&layer0_bits) || !(1..=MAX_GROWTH_BITS).contains(&growth_bits) {
            return Err(HeaderError::Field("layer geometry"));
        }
        if shards == 0
            || shards as usize > MAX_SHARDS
            || !shards.is_power_of_two()
            || shards.trailing_zeros() > u32::from(layer0_bits)
        {
            return Err(HeaderError::Field("shards"));
        }
        let mut key = [0u8; 16];
        key.copy_from_slice(&b[24..40]);
        let tag = match b[56] {
            0 => None,
            1 => {
                let mut block_hash = [0u8; 32];
                block_hash.copy_from_slice(&b[68..100]);
                Some(CommitTag {
                    block: BlockId(u32_at(60)),
                    height: u32_at(64),
                    block_hash,
                })
            }
            _ => return Err(HeaderError::Field("tag flag")),
        };
        let commit_seq = u64_at(48);
        let disk_checkpoint = match (u64_at(100), b[108]) {
            (0, 0) => None,
            (seq, layer) if seq > commit_seq && (layer as usize) < MAX_LAYERS => Some((seq, layer)),
            _ => return Err(HeaderError::Field("disk-layer checkpoint")),
        };
        let shard_state = (0..shards as usize)
            .map(|s| {
                let base = 128 + s * SHARD_STATE_LEN;
                decode_shard(&b[base..base + SHARD_STATE_LEN])
            })
            .collect::<Result<_, _>>()?;
        Ok(Header {
            page_size,
            layer0_bits,
            growth_bits,
            shards,
            key,
            generation: u64_at(40),
            commit_seq,
            tag,
            shard_state,
            disk_checkpoint,
        })
    }

    /// The sequence number of the checkpoint records this header file
    /// names (`docs/sozu-format.md`, "Journal"): the commit whose state
    /// they hold, S of the disk layers' checkpoint if there is one, else
    /// the last commit before the base generation.
    pub fn checkpoint_seq(&self) -> u64 {
        self.disk_checkpoint.map_or(self.commit_seq, |(s, _)| s)
    }

    /// Whether `other` has this header's geometry and key (a journal
    /// record's header must).
    pub fn same_table(&self, other: &Header) -> bool {
        self.page_size == other.page_size
            && self.layer0_bits == other.layer0_bits
            && self.growth_bits == other.growth_bits
            && self.shards == other.shards
            && self.key == other.key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_exact_bytes() {
        let mut st = ShardState::default();
        st.groups[3] = 7;
        st.records = RecordsState {
            current: 2,
            current_len: 500,
            current_dead: 20,
            compacting: Some((1, 900, 300)),
            delete: Some(0),
        };
        let h = Header {
            page_size: 4096,
            layer0_bits: 10,
            growth_bits: 1,
            shards: 2,
            key: [5; 16],
            generation: 3,
            commit_seq: 44,
            tag: Some(CommitTag {
                block: BlockId(9),
                height: 8,
                block_hash: [7; 32],
            }),
            shard_state: vec![ShardState::default(), st],
            disk_checkpoint: Some((50, 3)),
        };
        let b = h.encode();
        assert_eq!(&b[4..12], b"SOZUTBL\0");
        assert_eq!(&b[12..14], &[6, 0]);
        assert_eq!(&b[100..109], &[50, 0, 0, 0, 0, 0, 0, 0, 3]);
        let s1 = 128 + 320;
        assert_eq!(&b[s1 + 24..s1 + 32], &7u64.to_le_bytes());
        assert_eq!(
            &b[s1 + 256..s1 + 268],
            &[2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(&b[128 + 260..128 + 268], &[0xff; 8]);
        assert_eq!(Header::decode(&b).unwrap(), h);
    }
}
