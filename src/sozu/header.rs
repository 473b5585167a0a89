//! The table header and the redo-journal records (byte layouts in
//! `docs/sozu-format.md`).

use super::page::MAX_GROWTH_BITS;
use super::types::{BlockId, CommitTag};

/// Magic at byte 4 of the header.
pub const HEADER_MAGIC: [u8; 8] = *b"SOZUTBL\0";
/// Major format version: a mismatch refuses to open. 3: journal page
/// deltas may rest on the page files' images, and checkpoints double-write
/// through `sozu.ckpt` (2: every page's first journal item in a generation
/// was a whole image; 1: no written-children mask).
pub const FORMAT_MAJOR: u16 = 3;
/// Minor format version.
pub const FORMAT_MINOR: u16 = 0;
/// Size of the header image in bytes.
pub const HEADER_LEN: usize = 4096;
/// Most layers a table can have.
pub const MAX_LAYERS: usize = 32;
/// Most shards a table can have.
pub const MAX_SHARDS: usize = 8;
/// Magic of a journal commit record.
pub const RECORD_MAGIC: [u8; 4] = *b"SZJR";
/// Size of a journal record's fixed header in bytes.
pub const RECORD_HEADER_LEN: usize = 48;

/// Per-shard allocation state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardState {
    /// Child groups allocated per layer (index 0 unused: layer 0 is fully
    /// allocated).
    pub groups: [u64; MAX_LAYERS],
    /// Length of the shard's records file in bytes (out-of-line scripts).
    pub records_len: u64,
}

impl Default for ShardState {
    fn default() -> Self {
        Self {
            groups: [0; MAX_LAYERS],
            records_len: 0,
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
    /// Checkpoint generation: journal records of another generation are not replayed.
    pub generation: u64,
    /// Sequence number of the last commit.
    pub commit_seq: u64,
    /// Tag of the last commit.
    pub tag: Option<CommitTag>,
    /// Per-shard allocation (`shards` items).
    pub shard_state: Vec<ShardState>,
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
        for (s, st) in self.shard_state.iter().enumerate() {
            let base = 128 + s * (MAX_LAYERS * 8 + 8);
            for (l, g) in st.groups.iter().enumerate() {
                b[base + l * 8..base + l * 8 + 8].copy_from_slice(&g.to_le_bytes());
            }
            let r = base + MAX_LAYERS * 8;
            b[r..r + 8].copy_from_slice(&st.records_len.to_le_bytes());
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
        if !(512..=1 << 20).contains(&page_size) || !page_size.is_power_of_two() {
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
        let mut shard_state = Vec::new();
        for s in 0..shards as usize {
            let base = 128 + s * (MAX_LAYERS * 8 + 8);
            let mut st = ShardState::default();
            for l in 0..MAX_LAYERS {
                st.groups[l] = u64_at(base + l * 8);
                if st.groups[l] > 1 << 40 {
                    return Err(HeaderError::Field("group count"));
                }
            }
            st.records_len = u64_at(base + MAX_LAYERS * 8);
            shard_state.push(st);
        }
        Ok(Header {
            page_size,
            layer0_bits,
            growth_bits,
            shards,
            key,
            generation: u64_at(40),
            commit_seq: u64_at(48),
            tag,
            shard_state,
        })
    }
}

/// One page image in a journal record.
#[derive(Clone, Debug)]
pub struct PageImage {
    /// Shard.
    pub shard: u8,
    /// Layer.
    pub layer: u8,
    /// Page number in the layer file.
    pub page: u64,
    /// The encoded page (padded to the page size), or with `delta` the
    /// page delta ([`super::page::page_delta`]).
    pub image: std::sync::Arc<Vec<u8>>,
    /// `image` is a delta against the page's previous image in this
    /// checkpoint generation, not a whole page.
    pub delta: bool,
}

/// One records-file extent in a journal record.
#[derive(Clone, Debug)]
pub struct Extent {
    /// Shard.
    pub shard: u8,
    /// Byte offset in the shard's records file.
    pub offset: u64,
    /// The bytes.
    pub data: Vec<u8>,
}

/// A decoded commit record.
#[derive(Clone, Debug)]
pub struct CommitRecord {
    /// Checkpoint generation it belongs to.
    pub generation: u64,
    /// Commit sequence number.
    pub seq: u64,
    /// Page images.
    pub pages: Vec<PageImage>,
    /// Records-file extents.
    pub extents: Vec<Extent>,
    /// The header after this commit.
    pub header: Vec<u8>,
}

/// Length of a page image without its trailing zero bytes (the journal
/// stores only that prefix; replay pads it back with zeros).
pub fn trimmed_len(image: &[u8]) -> usize {
    image.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1)
}

/// Encodes a commit record into `b` (cleared first): the caller keeps one
/// buffer across commits, so a record of a few MB does not fault in fresh
/// memory every block.
pub fn encode_record(rec: &CommitRecord, b: &mut Vec<u8>) {
    let used: Vec<usize> = rec
        .pages
        .iter()
        .map(|p| {
            if p.delta {
                p.image.len()
            } else {
                trimmed_len(&p.image)
            }
        })
        .collect();
    let body_len: usize = used.iter().map(|u| 16 + u).sum::<usize>()
        + rec.extents.iter().map(|e| 24 + e.data.len()).sum::<usize>()
        + HEADER_LEN;
    b.clear();
    b.reserve(RECORD_HEADER_LEN + body_len + 4);
    b.extend_from_slice(&RECORD_MAGIC);
    b.extend_from_slice(&[0u8; 4]);
    b.extend_from_slice(&rec.generation.to_le_bytes());
    b.extend_from_slice(&rec.seq.to_le_bytes());
    b.extend_from_slice(&(body_len as u64).to_le_bytes());
    b.extend_from_slice(&(rec.pages.len() as u32).to_le_bytes());
    b.extend_from_slice(&(rec.extents.len() as u32).to_le_bytes());
    b.extend_from_slice(&[0u8; 8]);
    let hcrc = crc32fast::hash(&b[8..RECORD_HEADER_LEN]);
    b[4..8].copy_from_slice(&hcrc.to_le_bytes());
    for (p, u) in rec.pages.iter().zip(used) {
        b.push(p.shard);
        b.push(p.layer);
        b.push(u8::from(p.delta));
        b.push(0);
        b.extend_from_slice(&(u as u32).to_le_bytes());
        b.extend_from_slice(&p.page.to_le_bytes());
        b.extend_from_slice(&p.image[..u]);
    }
    for e in &rec.extents {
        b.push(e.shard);
        b.extend_from_slice(&[0u8; 7]);
        b.extend_from_slice(&e.offset.to_le_bytes());
        b.extend_from_slice(&(e.data.len() as u32).to_le_bytes());
        b.extend_from_slice(&[0u8; 4]);
        b.extend_from_slice(&e.data);
    }
    b.extend_from_slice(&rec.header);
    let crc = crc32fast::hash(b);
    b.extend_from_slice(&crc.to_le_bytes());
}

/// Result of trying to parse a record at some offset of the journal.
#[derive(Debug)]
pub enum Parsed {
    /// A complete, checksummed record and its total length in bytes.
    Ok(CommitRecord, usize),
    /// Not a valid record here (torn tail, garbage, or end of file).
    Invalid,
}

/// The generation in the fixed head of a record at the start of `b`, if
/// that head (48 bytes) is intact, whatever its body.
pub fn record_generation(b: &[u8]) -> Option<u64> {
    let head = b.get(..RECORD_HEADER_LEN)?;
    let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    (head[..4] == RECORD_MAGIC && crc == crc32fast::hash(&head[8..])).then(|| {
        let mut g = [0u8; 8];
        g.copy_from_slice(&head[8..16]);
        u64::from_le_bytes(g)
    })
}

/// Parses one record starting at the beginning of `b`.
pub fn parse_record(b: &[u8], page_size: usize) -> Parsed {
    if b.len() < RECORD_HEADER_LEN || b[..4] != RECORD_MAGIC {
        return Parsed::Invalid;
    }
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let u64_at = |i: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[i..i + 8]);
        u64::from_le_bytes(a)
    };
    if u32_at(4) != crc32fast::hash(&b[8..RECORD_HEADER_LEN]) {
        return Parsed::Invalid;
    }
    let body_len = u64_at(24);
    let total = match usize::try_from(body_len)
        .ok()
        .and_then(|l| l.checked_add(RECORD_HEADER_LEN + 4))
    {
        Some(t) if t <= b.len() => t,
        _ => return Parsed::Invalid,
    };
    if u32_at(total - 4) != crc32fast::hash(&b[..total - 4]) {
        return Parsed::Invalid;
    }
    let (n_pages, n_ext) = (u32_at(32) as usize, u32_at(36) as usize);
    let mut at = RECORD_HEADER_LEN;
    let end = total - 4;
    let mut pages = Vec::new();
    for _ in 0..n_pages {
        if at + 16 > end {
            return Parsed::Invalid;
        }
        let used = u32_at(at + 4) as usize;
        let kind = b[at + 2];
        if used > page_size || at + 16 + used > end || kind > 1 || b[at + 3] != 0 {
            return Parsed::Invalid;
        }
        let mut image = b[at + 16..at + 16 + used].to_vec();
        if kind == 0 {
            image.resize(page_size, 0);
        }
        pages.push(PageImage {
            shard: b[at],
            layer: b[at + 1],
            page: u64_at(at + 8),
            image: std::sync::Arc::new(image),
            delta: kind == 1,
        });
        at += 16 + used;
    }
    let mut extents = Vec::new();
    for _ in 0..n_ext {
        if at + 24 > end {
            return Parsed::Invalid;
        }
        let len = u32_at(at + 16) as usize;
        if at + 24 + len > end {
            return Parsed::Invalid;
        }
        extents.push(Extent {
            shard: b[at],
            offset: u64_at(at + 8),
            data: b[at + 24..at + 24 + len].to_vec(),
        });
        at += 24 + len;
    }
    if at + HEADER_LEN != end {
        return Parsed::Invalid;
    }
    let header = b[at..end].to_vec();
    Parsed::Ok(
        CommitRecord {
            generation: u64_at(8),
            seq: u64_at(16),
            pages,
            extents,
            header,
        },
        total,
    )
}
