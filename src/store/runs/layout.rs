//! Where each part of a run file lies, and the summary a run keeps in
//! memory (and, since run layout 2, in its file): the offsets follow from
//! the key length, the key count and the capacity the writer was created
//! for, all in the header. The layout itself is documented in `run.rs`.

use super::bloom::{self, BLOCK_BYTES};

/// Keys per block: 4 KiB of 16-byte keys, 5 KiB of 20-byte keys.
pub const BLOCK_KEYS: usize = 256;

/// Bytes of a partition of a run's filter (64 filter blocks), and at most
/// that of its block index (whole entries): the unit read from the file
/// and cached.
pub const PART_BYTES: usize = 4096;

/// Magic of a run file.
pub const MAGIC: &[u8; 8] = b"KKHROWS1";
/// Version of the layout (1: filter and block index after the keys, no
/// summary on disk, filter blocks chosen by a hash of the prefix; no
/// longer read).
pub const VERSION: u32 = 2;
/// Bytes of the header.
pub const HEADER: usize = 36;

/// Bytes of one block index entry: a block's first key ‖ CRC-32.
pub const fn entry<const N: usize>() -> usize {
    N + 4
}

/// Bytes of an index partition: the whole entries that fit [`PART_BYTES`].
pub const fn index_part_len<const N: usize>() -> usize {
    PART_BYTES / entry::<N>() * entry::<N>()
}

/// The header: magic ‖ version u32 ‖ key length u32 ‖ key count u64 ‖
/// keys per block u32 ‖ capacity u64, big-endian.
pub fn header(key_len: usize, count: u64, capacity: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_be_bytes());
    h[12..16].copy_from_slice(&(key_len as u32).to_be_bytes());
    h[16..24].copy_from_slice(&count.to_be_bytes());
    h[24..28].copy_from_slice(&(BLOCK_KEYS as u32).to_be_bytes());
    h[28..36].copy_from_slice(&capacity.to_be_bytes());
    h
}

/// The sizes and offsets of a run of `count` keys written for at most
/// `capacity` (bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Bytes of the filter (sized by the capacity), at [`HEADER`].
    pub filter_len: u64,
    /// Offset of the block index: its region holds an entry for every
    /// block the capacity allows; the first [`Layout::blocks`] are used.
    pub index_at: u64,
    /// Offset of the keys.
    pub keys_at: u64,
    /// Blocks of keys.
    pub blocks: u64,
    /// Bytes of the block index in use.
    pub index_len: u64,
    /// Partitions of the block index in use.
    pub index_parts: u64,
    /// Partitions of the filter.
    pub filter_parts: u64,
    /// Offset of the summary.
    pub summary_at: u64,
    /// Bytes of the summary.
    pub summary_len: u64,
    /// Bytes of the file (the trailer's 4 included).
    pub len: u64,
}

impl Layout {
    /// The layout of `count` keys of `N` bytes in a run written for
    /// `capacity`; `None` when a size overflows `u64` (a damaged header)
    /// or `count` exceeds `capacity`.
    pub fn new<const N: usize>(count: u64, capacity: u64) -> Option<Layout> {
        if count > capacity {
            return None;
        }
        let e = entry::<N>() as u64;
        let filter_len = bloom::filter_bytes(capacity)?;
        let region = capacity.div_ceil(BLOCK_KEYS as u64).checked_mul(e)?;
        let index_at = (HEADER as u64).checked_add(filter_len)?;
        let keys_at = index_at.checked_add(region)?;
        let blocks = count.div_ceil(BLOCK_KEYS as u64);
        let index_len = blocks * e;
        let index_parts = index_len.div_ceil(index_part_len::<N>() as u64);
        let filter_parts = filter_len.div_ceil(PART_BYTES as u64);
        let summary_len = index_parts * (4 + N as u64) + filter_parts * 4;
        let summary_at = keys_at.checked_add(count.checked_mul(N as u64)?)?;
        let len = summary_at.checked_add(summary_len)?.checked_add(4)?;
        Some(Layout {
            filter_len,
            index_at,
            keys_at,
            blocks,
            index_len,
            index_parts,
            filter_parts,
            summary_at,
            summary_len,
            len,
        })
    }

    /// Blocks of the filter.
    pub fn filter_blocks(&self) -> usize {
        self.filter_len as usize / BLOCK_BYTES
    }
}

/// What an open run keeps of its block index and filter, stored in its
/// file after the keys: each partition's CRC-32, and each index
/// partition's first key.
#[derive(Debug, Default)]
pub struct Summary<const N: usize> {
    /// CRC-32 of each index partition.
    pub index_crcs: Vec<u32>,
    /// First key of each index partition.
    pub fences: Vec<[u8; N]>,
    /// CRC-32 of each filter partition.
    pub filter_crcs: Vec<u32>,
}

impl<const N: usize> Summary<N> {
    /// Adds one index partition (whole entries).
    pub fn add_index(&mut self, part: &[u8]) {
        self.index_crcs.push(crc32fast::hash(part));
        let mut fence = [0u8; N];
        fence.copy_from_slice(&part[..N]);
        self.fences.push(fence);
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        (self.index_crcs.len() + self.filter_crcs.len()) * 4 + self.fences.len() * N
    }

    /// Its on-disk form: index CRCs (u32 BE each) ‖ first keys ‖ filter
    /// CRCs (u32 BE each).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.bytes());
        for c in &self.index_crcs {
            out.extend_from_slice(&c.to_be_bytes());
        }
        for f in &self.fences {
            out.extend_from_slice(f);
        }
        for c in &self.filter_crcs {
            out.extend_from_slice(&c.to_be_bytes());
        }
        out
    }

    /// Reads back [`Summary::encode`]'s `bytes` of a run laid out as
    /// `layout`; `None` when the length does not match.
    pub fn decode(bytes: &[u8], layout: &Layout) -> Option<Self> {
        if bytes.len() as u64 != layout.summary_len {
            return None;
        }
        let parts = layout.index_parts as usize;
        let (crcs, rest) = bytes.split_at(parts * 4);
        let (fences, filter) = rest.split_at(parts * N);
        let words = |b: &[u8]| -> Vec<u32> {
            b.chunks_exact(4)
                .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
                .collect()
        };
        let fences = fences
            .chunks_exact(N)
            .map(|f| {
                let mut k = [0u8; N];
                k.copy_from_slice(f);
                k
            })
            .collect();
        Some(Summary {
            index_crcs: words(crcs),
            fences,
            filter_crcs: words(filter),
        })
    }
}
