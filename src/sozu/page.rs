//! Bucket pages (format 4): the byte layout of one Sozu bucket, read in
//! place and edited in place.
//!
//! A page lives in memory as its *used* bytes (header + entries, no
//! padding, no checksum): the writer edits those bytes directly — a spend
//! inserts a 40-byte consumption record into its entry, an insert appends
//! an entry, a spill or purge removes entries — and readers walk them
//! without decoding anything but the entries they want ([`EntryRef`]). On
//! disk a page is `page_size` bytes: the used bytes, zero padding, and a
//! CRC-32 over bytes 4..page_size ([`seal`], [`open_disk`]).
//!
//! Layout (all integers little-endian; `docs/sozu-format.md` is the
//! normative description):
//!
//! ```text
//! offset size field
//! 0      4    crc32 (IEEE) of bytes 4..page_size (on disk; 0 in memory)
//! 4      4    magic "SZBK"
//! 8      1    page version (4)
//! 9      1    reserved, 0
//! 10     2    entry count n
//! 12     4    reserved, 0
//! 16     4    max production height of any entry ever spilled below (the Sozu paper's Height(B))
//! 20     4    purge hint: no entry can become purgeable before the tip reaches this height
//! 24     8    children: bits 0..48 = 0 (nil) or child group number + 1;
//!             bits 48..64 = mask of the children written (bit c: child c)
//! 32     ...  n entries, then zero padding to page_size
//! ```
//!
//! One entry (53 bytes + script or 16-byte external reference + 8 bytes per
//! production + 40 bytes per consumption):
//!
//! ```text
//! 36  key: txid (32, internal order) + vout (4, big-endian)
//! 8   value (sats)
//! 4   coin height
//! 1   flags: bit 0 coinbase, bit 1 script stored out of line, bit 2 spend marker
//! 1   number of productions (1..=255; 0 for a spend marker)
//! 1   number of consumptions (0..=255)
//! 2   script length in bytes (0..=10,000)
//! ..  inline: the script bytes; out of line: location (8) + crc32 (4) + reserved (4)
//! 8×p productions sorted: block id (4) + height (4)
//! 40×c consumptions sorted: block id (4) + spending txid (32) + input index (4)
//! ```
//!
//! A *spend marker* (flags = 4, format 6) carries the consumptions of an
//! entry that lives deeper on its key's path: value, coin height, script
//! length and production count are 0, consumptions 1..=255
//! (`docs/sozu-format.md`, "Spend markers").

use bitcoin::hashes::Hash;
use bitcoin::{Amount, Txid};

use super::types::{key_outpoint, BlockId, Coin, Consumption, Entry, OutPointKey, Production};

/// Size of the page header in bytes.
pub const PAGE_HEADER_LEN: usize = 32;
/// Magic of a bucket page.
pub const PAGE_MAGIC: [u8; 4] = *b"SZBK";
/// Version of the page layout.
pub const PAGE_VERSION: u8 = 4;
/// Bits of the `children` field holding the group number + 1.
pub const CHILDREN_GROUP_BITS: u32 = 48;
/// Largest `growth_bits` g the page format holds: a bucket's child mask has
/// 16 bits, one per child, so 2^g ≤ 16.
pub const MAX_GROWTH_BITS: u8 = 4;
/// Flags bit of a spend marker: the consumptions of an entry deeper on
/// its key's path (no coin, no production).
pub const FLAG_MARKER: u8 = 4;
/// Fixed part of an encoded entry, in bytes.
pub const ENTRY_FIXED_LEN: usize = 53;
/// Size of an out-of-line script reference inside an entry, in bytes.
pub const EXTERNAL_REF_LEN: usize = 16;
/// Size of one production record, in bytes.
pub const PRODUCTION_LEN: usize = 8;
/// Size of one consumption record, in bytes.
pub const CONSUMPTION_LEN: usize = 40;
/// Largest script the table accepts, in bytes (consensus `MAX_SCRIPT_SIZE`).
pub const MAX_SCRIPT_LEN: usize = 10_000;
/// Purge hint of a page none of whose entries can ever become purgeable.
pub const NO_PURGE: u32 = u32::MAX;
/// Smallest page size, bytes.
pub const MIN_PAGE_SIZE: usize = 512;
/// Largest page size, bytes (entry offsets and counts fit 16 bits).
pub const MAX_PAGE_SIZE: usize = 32 * 1024;

/// Bytes an edited page's image is allocated with: `page_size` and a
/// quarter more, room for a block's inserts before its spills (5,120 bytes
/// for 4 KiB pages, one of mimalloc's size classes, so the allocator rounds
/// nothing up). The page store allocates edited pages with it, and the
/// memory plan (`config.rs`) counts pinned pages at this size.
pub(super) fn edit_capacity(page_size: usize) -> usize {
    page_size + page_size / 4
}

const OFF_COUNT: usize = 10;
const OFF_MAX_CHILD: usize = 16;
const OFF_PURGE: usize = 20;
const OFF_CHILDREN: usize = 24;

/// Where an out-of-line script lives: its record in the shard's records
/// files (`docs/sozu-format.md`, "Records files").
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ExternalScript {
    /// Segment number (bits 40..64) and byte offset in it (bits 0..40).
    pub location: u64,
    /// CRC-32 of the script bytes (checked on every read).
    pub crc: u32,
}

/// One entry as a page stores it: the entry, and for long scripts the
/// reference to its out-of-line record (then `entry.coin.script_pubkey` is
/// empty until resolved, and the `u16` gives its length).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Slot {
    /// The entry (script empty when stored out of line).
    pub entry: Entry,
    /// Out-of-line script reference and length in bytes.
    pub external: Option<(ExternalScript, u16)>,
}

/// A page header's fields.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct PageHead {
    /// Entries in the page.
    pub count: u16,
    /// Highest production height of any entry ever spilled below.
    pub max_child_height: u32,
    /// The tip height from which some entry may be purgeable
    /// ([`NO_PURGE`]: none ever).
    pub purge_hint: u32,
    /// 0 = no children; else child group number + 1 (< 2^48).
    pub children: u64,
    /// Bit c set: child c of the group has a page.
    pub child_mask: u16,
}

impl PageHead {
    /// The 8-byte children field: group + 1 in bits 0..48, mask above.
    pub fn children_field(&self) -> u64 {
        self.children | (u64::from(self.child_mask) << CHILDREN_GROUP_BITS)
    }
}

/// A whole page decoded (tests, the fuzz target, statistics).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Decoded {
    /// The header fields (`count` = `slots.len()`).
    pub head: PageHead,
    /// The entries, in page order.
    pub slots: Vec<Slot>,
}

/// Why a page, an entry or an edit is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PageError {
    /// The page is not `page_size` bytes long.
    #[error("page is {len} bytes, expected {expected}")]
    WrongSize {
        /// Actual length.
        len: usize,
        /// Expected length.
        expected: usize,
    },
    /// Stored and computed checksums differ.
    #[error("page checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum {
        /// Stored crc32.
        stored: u32,
        /// Computed crc32.
        computed: u32,
    },
    /// Not a bucket page of this version.
    #[error("bad page magic or version")]
    Magic,
    /// A field is out of range, the entries overrun the page, or an edit
    /// names an entry the page does not have.
    #[error("malformed page at byte {at}: {what}")]
    Malformed {
        /// Byte offset in the page (or in the entry being added).
        at: usize,
        /// What was wrong.
        what: &'static str,
    },
}

fn bad(at: usize, what: &'static str) -> PageError {
    PageError::Malformed { at, what }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Length in bytes of the entry starting at `at` of `buf`, checked against
/// `buf`'s end.
///
/// # Errors
/// [`PageError::Malformed`] when it overruns `buf`.
#[inline]
pub fn entry_len(buf: &[u8], at: usize) -> Result<usize, PageError> {
    next_len(buf, at).ok_or_else(|| bad(at, "entry overruns its buffer"))
}

/// [`entry_len`] without the error: the walk's inner step.
#[inline(always)]
fn next_len(buf: &[u8], at: usize) -> Option<usize> {
    let fixed = buf.get(at..at.checked_add(ENTRY_FIXED_LEN)?)?;
    let (np, nc) = (fixed[49] as usize, fixed[50] as usize);
    let script = if fixed[48] & 2 != 0 {
        EXTERNAL_REF_LEN
    } else {
        u16::from_le_bytes([fixed[51], fixed[52]]) as usize
    };
    let len = ENTRY_FIXED_LEN + script + PRODUCTION_LEN * np + CONSUMPTION_LEN * nc;
    (at + len <= buf.len()).then_some(len)
}

/// One entry, read in place (no allocation): its bytes are a whole entry
/// ([`entry_len`] checked).
#[derive(Clone, Copy, Debug)]
pub struct EntryRef<'a>(&'a [u8]);

impl<'a> EntryRef<'a> {
    /// The entry at the start of `bytes`, which must hold it whole.
    ///
    /// # Errors
    /// [`PageError::Malformed`] when it overruns `bytes`.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, PageError> {
        let len = entry_len(bytes, 0)?;
        Ok(EntryRef(&bytes[..len]))
    }
    /// The entry's encoded bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.0
    }
    /// Encoded length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// Never true: an entry has at least its fixed part.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// The 36-byte key.
    pub fn key(&self) -> &'a [u8] {
        &self.0[..36]
    }
    /// The key as an array.
    pub fn key_array(&self) -> OutPointKey {
        let mut key = [0u8; 36];
        key.copy_from_slice(self.key());
        key
    }
    /// Value in sats.
    pub fn value(&self) -> u64 {
        u64_at(self.0, 36)
    }
    /// The coin's creation height.
    pub fn coin_height(&self) -> u32 {
        u32_at(self.0, 44)
    }
    /// The flags byte.
    pub fn flags(&self) -> u8 {
        self.0[48]
    }
    /// Whether it is a spend marker ([`FLAG_MARKER`]).
    pub fn is_marker(&self) -> bool {
        self.flags() & FLAG_MARKER != 0
    }
    /// Number of productions.
    pub fn np(&self) -> usize {
        self.0[49] as usize
    }
    /// Number of consumptions.
    pub fn nc(&self) -> usize {
        self.0[50] as usize
    }
    /// Script length in bytes (inline or out of line).
    pub fn script_len(&self) -> usize {
        u16_at(self.0, 51) as usize
    }
    fn lists_at(&self) -> usize {
        ENTRY_FIXED_LEN
            + if self.flags() & 2 != 0 {
                EXTERNAL_REF_LEN
            } else {
                self.script_len()
            }
    }
    /// The inline script (empty for an out-of-line one).
    pub fn inline_script(&self) -> &'a [u8] {
        if self.flags() & 2 != 0 {
            &[]
        } else {
            &self.0[ENTRY_FIXED_LEN..ENTRY_FIXED_LEN + self.script_len()]
        }
    }
    /// The out-of-line script's reference, if the script is out of line.
    pub fn external(&self) -> Option<ExternalScript> {
        (self.flags() & 2 != 0).then(|| ExternalScript {
            location: u64_at(self.0, ENTRY_FIXED_LEN),
            crc: u32_at(self.0, ENTRY_FIXED_LEN + 8),
        })
    }
    /// Production `i` (< [`EntryRef::np`]).
    pub fn production(&self, i: usize) -> Production {
        let at = self.lists_at() + PRODUCTION_LEN * i;
        Production {
            block: BlockId(u32_at(self.0, at)),
            height: u32_at(self.0, at + 4),
        }
    }
    /// The productions, in order.
    pub fn productions(&self) -> impl Iterator<Item = Production> + Clone + 'a {
        let e = *self;
        (0..e.np()).map(move |i| e.production(i))
    }
    fn consumption_at(&self) -> usize {
        self.lists_at() + PRODUCTION_LEN * self.np()
    }
    /// Consumption `i` (< [`EntryRef::nc`]).
    pub fn consumption(&self, i: usize) -> Consumption {
        let at = self.consumption_at() + CONSUMPTION_LEN * i;
        let mut txid = [0u8; 32];
        txid.copy_from_slice(&self.0[at + 4..at + 36]);
        Consumption {
            block: BlockId(u32_at(self.0, at)),
            txid: Txid::from_byte_array(txid),
            vin: u32_at(self.0, at + 36),
        }
    }
    /// The consumptions, in order.
    pub fn consumptions(&self) -> impl Iterator<Item = Consumption> + Clone + 'a {
        let e = *self;
        (0..e.nc()).map(move |i| e.consumption(i))
    }
    /// Highest production height (the spill order uses it).
    pub fn max_production_height(&self) -> u32 {
        self.productions()
            .map(|p| p.height)
            .max()
            .unwrap_or(self.coin_height())
    }
    /// The whole entry, decoded (script empty when out of line).
    pub fn to_slot(&self) -> Slot {
        let key = self.key_array();
        let external = self.external().map(|ext| (ext, self.script_len() as u16));
        Slot {
            entry: Entry {
                outpoint: key_outpoint(&key),
                coin: Coin {
                    value: Amount::from_sat(self.value()),
                    script_pubkey: self.inline_script().to_vec(),
                    height: self.coin_height(),
                    coinbase: self.flags() & 1 != 0,
                },
                produced: self.productions().collect(),
                consumed: self.consumptions().collect(),
            },
            external,
        }
    }
    /// Checks every field as a page read from disk must hold it.
    ///
    /// # Errors
    /// [`PageError::Malformed`] (offsets relative to the entry): unknown
    /// flags, no production, a script over 10,000 bytes, a reserved byte
    /// set, unsorted or duplicate lifecycle records.
    pub fn validate(&self) -> Result<(), PageError> {
        let flags = self.flags();
        if flags & !(3 | FLAG_MARKER) != 0 {
            return Err(bad(48, "unknown flag bits"));
        }
        if flags & FLAG_MARKER != 0 {
            if flags != FLAG_MARKER {
                return Err(bad(48, "spend marker with coin flags"));
            }
            if self.value() != 0 || self.coin_height() != 0 || self.script_len() != 0 {
                return Err(bad(36, "spend marker with a coin"));
            }
            if self.np() != 0 {
                return Err(bad(49, "spend marker with a production"));
            }
            if self.nc() == 0 {
                return Err(bad(50, "spend marker without consumption"));
            }
        } else if self.np() == 0 {
            return Err(bad(49, "entry without production"));
        }
        if self.script_len() > MAX_SCRIPT_LEN {
            return Err(bad(51, "script over 10,000 bytes"));
        }
        if flags & 2 != 0 && u32_at(self.0, ENTRY_FIXED_LEN + 12) != 0 {
            return Err(bad(ENTRY_FIXED_LEN + 12, "reserved not zero"));
        }
        let sorted_p = (1..self.np()).all(|i| self.production(i - 1) < self.production(i));
        let sorted_c = (1..self.nc()).all(|i| self.consumption(i - 1) < self.consumption(i));
        if !sorted_p || !sorted_c {
            return Err(bad(self.lists_at(), "lifecycle lists not sorted"));
        }
        Ok(())
    }
}

/// The header fields of a page in memory form (at least
/// [`PAGE_HEADER_LEN`] bytes; the caller checked).
pub fn head(page: &[u8]) -> PageHead {
    let field = u64_at(page, OFF_CHILDREN);
    PageHead {
        count: u16_at(page, OFF_COUNT),
        max_child_height: u32_at(page, OFF_MAX_CHILD),
        purge_hint: u32_at(page, OFF_PURGE),
        children: field & ((1u64 << CHILDREN_GROUP_BITS) - 1),
        child_mask: (field >> CHILDREN_GROUP_BITS) as u16,
    }
}

/// Bytes of encoded entries in a page (its used length minus the header).
pub fn payload_len(page: &[u8]) -> usize {
    page.len().saturating_sub(PAGE_HEADER_LEN)
}

/// The entries of a page in memory form, in page order, with their byte
/// offsets. Stops at the first entry that overruns the page (a page the
/// table built or [`validate`] checked never has one).
pub fn entries(page: &[u8]) -> impl Iterator<Item = (usize, EntryRef<'_>)> + '_ {
    let mut at = PAGE_HEADER_LEN;
    std::iter::from_fn(move || {
        let len = next_len(page, at)?;
        let e = (at, EntryRef(&page[at..at + len]));
        at += len;
        Some(e)
    })
}

/// Whether two 36-byte keys are equal (their first 8 bytes compared
/// first: keys are hashes, so most pairs differ there).
#[inline]
pub fn key_eq(a: &[u8], b: &[u8]) -> bool {
    match (a.get(..8), b.get(..8)) {
        (Some(x), Some(y)) => {
            let w = |s: &[u8]| u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]);
            w(x) == w(y) && a == b
        }
        _ => a == b,
    }
}

/// The slot number and entry of `key` in a page, if it holds it.
pub fn find<'a>(page: &'a [u8], key: &[u8]) -> Option<(u16, EntryRef<'a>)> {
    entries(page)
        .enumerate()
        .find(|(_, (_, e))| key_eq(e.key(), key))
        .map(|(i, (_, e))| (i as u16, e))
}

/// Byte offset and length of entry `slot`.
///
/// # Errors
/// [`PageError::Malformed`] when the page has no such entry.
pub fn slot_span(page: &[u8], slot: u16) -> Result<(usize, usize), PageError> {
    entries(page)
        .nth(slot as usize)
        .map(|(at, e)| (at, e.len()))
        .ok_or(bad(PAGE_HEADER_LEN, "no such entry slot"))
}

/// An empty page: header only, no children, purge hint [`NO_PURGE`].
pub fn new_page() -> Vec<u8> {
    let mut p = vec![0u8; PAGE_HEADER_LEN];
    p[4..8].copy_from_slice(&PAGE_MAGIC);
    p[8] = PAGE_VERSION;
    p[OFF_PURGE..OFF_PURGE + 4].copy_from_slice(&NO_PURGE.to_le_bytes());
    p
}

/// Sets a page's descent and purge fields (`children_field`: group + 1 in
/// bits 0..48, written-children mask above).
///
/// # Errors
/// [`PageError::Malformed`] for a mask without children.
pub fn set_head(
    page: &mut [u8],
    max_child_height: u32,
    purge_hint: u32,
    children_field: u64,
) -> Result<(), PageError> {
    if children_field & ((1u64 << CHILDREN_GROUP_BITS) - 1) == 0
        && children_field >> CHILDREN_GROUP_BITS != 0
    {
        return Err(bad(OFF_CHILDREN, "written-children mask without children"));
    }
    page[OFF_MAX_CHILD..OFF_MAX_CHILD + 4].copy_from_slice(&max_child_height.to_le_bytes());
    page[OFF_PURGE..OFF_PURGE + 4].copy_from_slice(&purge_hint.to_le_bytes());
    page[OFF_CHILDREN..OFF_CHILDREN + 8].copy_from_slice(&children_field.to_le_bytes());
    Ok(())
}

fn set_count(page: &mut [u8], n: usize) -> Result<(), PageError> {
    let n = u16::try_from(n).map_err(|_| bad(OFF_COUNT, "more than 65,535 entries"))?;
    page[OFF_COUNT..OFF_COUNT + 2].copy_from_slice(&n.to_le_bytes());
    Ok(())
}

/// Appends one encoded entry (`entry` must be exactly one whole entry).
///
/// # Errors
/// [`PageError::Malformed`] when `entry` is not one entry.
pub fn append(page: &mut Vec<u8>, entry: &[u8]) -> Result<(), PageError> {
    if entry_len(entry, 0)? != entry.len() {
        return Err(bad(0, "appended bytes are not one entry"));
    }
    let n = head(page).count as usize + 1;
    set_count(page, n)?;
    page.extend_from_slice(entry);
    Ok(())
}

/// Appends the entries `moved` (whole entries, concatenated, of distinct
/// keys: one bucket's, invariant 1) that one spill brings, with the result
/// of [`arrive`] on each in turn, in one walk of each: an arriving marker
/// is merged into the page's entry or marker of its key, found in that
/// walk; an arriving entry is searched for only among the page's markers
/// (an entry arriving onto its marker, the rare case, goes through
/// [`arrive`]); everything else is appended in `moved`'s order. Merges are
/// made from the page's end backwards, so the offsets of that walk stay
/// true, and before any append, so the bytes are those of [`arrive`] on
/// each entry in turn (replay of a `Spill` op journaled by an older build
/// gives the same page).
///
/// # Errors
/// [`PageError::Malformed`] for bytes of `moved` that are not whole
/// entries or a merge past 255 consumptions; as [`arrive`] for an entry
/// arriving onto its marker. The page may then hold some of the entries.
pub fn arrive_all(page: &mut Vec<u8>, moved: &[u8]) -> Result<(), PageError> {
    let mut arriving = Vec::new();
    let mut at = 0;
    while at < moved.len() {
        let len = entry_len(moved, at)?;
        arriving.push(EntryRef(&moved[at..at + len]));
        at += len;
    }
    let markers: Vec<usize> = (0..arriving.len())
        .filter(|&i| arriving[i].is_marker())
        .collect();
    // The page's markers, and where each arriving marker merges.
    let mut page_markers = Vec::new();
    let mut merges = Vec::new();
    for (slot, (at, e)) in entries(page).enumerate() {
        if e.is_marker() {
            page_markers.push(e.key_array());
        }
        if let Some(&i) = markers
            .iter()
            .find(|&&i| key_eq(arriving[i].key(), e.key()))
        {
            merges.push((slot as u16, at, i));
        }
    }
    let mut merged = vec![false; arriving.len()];
    for &(slot, at, i) in merges.iter().rev() {
        merged[i] = true;
        for c in arriving[i].consumptions() {
            insert_consumption(page, (slot, Some(at)), &consumption_bytes(&c))?;
        }
    }
    for (e, merged) in arriving.into_iter().zip(merged) {
        if merged {
            continue;
        }
        if !e.is_marker() && page_markers.iter().any(|k| key_eq(k, e.key())) {
            arrive(page, e.0)?;
        } else {
            append(page, e.0)?;
        }
    }
    Ok(())
}

/// Appends one entry arriving by a spill (`entry` exactly one whole
/// entry), merging spend markers: a marker whose key the page holds adds
/// its consumptions to that entry or marker; an entry arriving where its
/// marker is takes the marker's place and consumptions.
///
/// # Errors
/// [`PageError::Malformed`] when `entry` is not one entry, when the page
/// already holds the arriving entry's key as an entry, or when a merge
/// passes 255 consumptions.
pub fn arrive(page: &mut Vec<u8>, entry: &[u8]) -> Result<(), PageError> {
    let new = EntryRef::parse(entry)?;
    let Some((slot, (at, old))) = entries(page)
        .enumerate()
        .find(|(_, (_, e))| key_eq(e.key(), new.key()))
    else {
        return append(page, entry);
    };
    let (into, at, records) = match (new.is_marker(), old.is_marker()) {
        (true, _) => (
            slot as u16,
            Some(at),
            new.consumptions().collect::<Vec<_>>(),
        ),
        (false, true) => {
            let records: Vec<Consumption> = old.consumptions().collect();
            remove(page, &[slot as u16])?;
            append(page, entry)?;
            (head(page).count - 1, None, records)
        }
        (false, false) => return Err(bad(PAGE_HEADER_LEN, "duplicate key in bucket")),
    };
    for c in &records {
        insert_consumption(page, (into, at), &consumption_bytes(c))?;
    }
    Ok(())
}

/// Inserts `record` into a sorted list of entry `slot` (at byte `at` of
/// the page when the caller knows it): `place` gives the list's offset in
/// the entry, its length and the offset of its count byte; `cmp` orders
/// two encoded records. Returns false (and changes nothing) when the
/// record is already there.
fn insert_record(
    page: &mut Vec<u8>,
    (slot, at): (u16, Option<usize>),
    record: &[u8],
    place: impl Fn(EntryRef<'_>) -> (usize, usize, usize),
    cmp: impl Fn(&[u8], &[u8]) -> std::cmp::Ordering,
) -> Result<bool, PageError> {
    let (at, e) = entry_at(page, (slot, at))?;
    let (list_at, n, count_at) = place(e);
    if n == 255 {
        return Err(bad(at + count_at, "more than 255 lifecycle records"));
    }
    let rlen = record.len();
    let list = at + list_at;
    let mut pos = n;
    for i in 0..n {
        match cmp(&page[list + i * rlen..list + (i + 1) * rlen], record) {
            std::cmp::Ordering::Less => {}
            std::cmp::Ordering::Equal => return Ok(false),
            std::cmp::Ordering::Greater => {
                pos = i;
                break;
            }
        }
    }
    let ins = list + pos * rlen;
    let old = page.len();
    page.resize(old + rlen, 0);
    page.copy_within(ins..old, ins + rlen);
    page[ins..ins + rlen].copy_from_slice(record);
    page[at + count_at] += 1;
    Ok(true)
}

fn production_bytes(p: &Production) -> [u8; PRODUCTION_LEN] {
    let mut b = [0u8; PRODUCTION_LEN];
    b[..4].copy_from_slice(&p.block.0.to_le_bytes());
    b[4..].copy_from_slice(&p.height.to_le_bytes());
    b
}

/// The 40 bytes of a consumption record.
pub fn consumption_bytes(c: &Consumption) -> [u8; CONSUMPTION_LEN] {
    let mut b = [0u8; CONSUMPTION_LEN];
    b[..4].copy_from_slice(&c.block.0.to_le_bytes());
    b[4..36].copy_from_slice(c.txid.as_byte_array());
    b[36..].copy_from_slice(&c.vin.to_le_bytes());
    b
}

/// The 8 bytes of a production record.
pub fn encode_production(p: &Production) -> [u8; PRODUCTION_LEN] {
    production_bytes(p)
}

fn cmp_production(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    (u32_at(a, 0), u32_at(a, 4)).cmp(&(u32_at(b, 0), u32_at(b, 4)))
}

fn cmp_consumption(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    (u32_at(a, 0), &a[4..36], u32_at(a, 36)).cmp(&(u32_at(b, 0), &b[4..36], u32_at(b, 36)))
}

/// Entry `slot` of a page and its byte offset (`at` when the caller knows
/// it).
///
/// # Errors
/// [`PageError::Malformed`]: no such slot, or an entry overrunning the page.
fn entry_at(
    page: &[u8],
    (slot, at): (u16, Option<usize>),
) -> Result<(usize, EntryRef<'_>), PageError> {
    let at = match at {
        Some(at) => at,
        None => slot_span(page, slot)?.0,
    };
    let len = entry_len(page, at)?;
    Ok((at, EntryRef(&page[at..at + len])))
}

/// Adds a production record (8 bytes) to entry `slot` (at byte `at` when
/// the caller knows it), in order; false if it was already there.
///
/// # Errors
/// [`PageError::Malformed`]: no such slot, a spend marker there (a marker
/// holds no production: format 6), or 255 productions already.
pub fn insert_production(
    page: &mut Vec<u8>,
    (slot, at): (u16, Option<usize>),
    record: &[u8; PRODUCTION_LEN],
) -> Result<bool, PageError> {
    let (at, e) = entry_at(page, (slot, at))?;
    if e.is_marker() {
        return Err(bad(at + 49, "production into a spend marker"));
    }
    insert_record(
        page,
        (slot, Some(at)),
        record,
        |e| (e.lists_at(), e.np(), 49),
        cmp_production,
    )
}

/// Adds a consumption record (40 bytes) to entry `slot` (at byte `at` when
/// the caller knows it), in order; false if it was already there.
///
/// # Errors
/// [`PageError::Malformed`]: no such slot, or 255 consumptions already.
pub fn insert_consumption(
    page: &mut Vec<u8>,
    slot: (u16, Option<usize>),
    record: &[u8; CONSUMPTION_LEN],
) -> Result<bool, PageError> {
    insert_record(
        page,
        slot,
        record,
        |e| (e.consumption_at(), e.nc(), 50),
        cmp_consumption,
    )
}

/// Removes entries `slots` (strictly ascending) and returns their bytes,
/// concatenated in page order.
///
/// # Errors
/// [`PageError::Malformed`] when the slots are not ascending or the page
/// lacks one.
pub fn remove(page: &mut Vec<u8>, slots: &[u16]) -> Result<Vec<u8>, PageError> {
    if slots.windows(2).any(|w| w[0] >= w[1]) {
        return Err(bad(PAGE_HEADER_LEN, "removed slots not ascending"));
    }
    let mut spans = Vec::with_capacity(slots.len());
    let mut want = slots.iter().peekable();
    for (i, (at, e)) in entries(page).enumerate() {
        match want.peek() {
            Some(&&s) if s as usize == i => {
                spans.push((at, e.len()));
                want.next();
            }
            Some(_) => {}
            None => break,
        }
    }
    if spans.len() != slots.len() {
        return Err(bad(PAGE_HEADER_LEN, "no such entry slot"));
    }
    let mut out = Vec::with_capacity(spans.iter().map(|s| s.1).sum());
    let mut write = spans.first().map_or(page.len(), |s| s.0);
    for (k, &(at, len)) in spans.iter().enumerate() {
        out.extend_from_slice(&page[at..at + len]);
        let keep_end = spans.get(k + 1).map_or(page.len(), |s| s.0);
        page.copy_within(at + len..keep_end, write);
        write += keep_end - (at + len);
    }
    page.truncate(write);
    let n = (head(page).count as usize)
        .checked_sub(slots.len())
        .ok_or(bad(OFF_COUNT, "entry count below the entries removed"))?;
    set_count(page, n)?;
    Ok(out)
}

/// Points entry `slot`'s out-of-line script at a new location (records
/// compaction moved it).
///
/// # Errors
/// [`PageError::Malformed`]: no such slot, or its script is inline.
pub fn set_location(page: &mut [u8], slot: u16, location: u64) -> Result<(), PageError> {
    let (at, _) = slot_span(page, slot)?;
    if page[at + 48] & 2 == 0 {
        return Err(bad(at, "location of an inline script"));
    }
    page[at + ENTRY_FIXED_LEN..at + ENTRY_FIXED_LEN + 8].copy_from_slice(&location.to_le_bytes());
    Ok(())
}

/// How an entry's script is stored.
#[derive(Clone, Copy, Debug)]
pub enum ScriptField<'a> {
    /// In the entry: these bytes.
    Inline(&'a [u8]),
    /// Out of line: the reference and the script's length.
    External(ExternalScript, u16),
}

/// Why an entry could not be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// More than 255 productions or consumptions, none produced, or a
    /// script over 10,000 bytes.
    #[error("entry lists or script exceed the format's bounds")]
    EntryBounds,
    /// The entries need more bytes than a page holds.
    #[error("page needs {needed} bytes, holds {available}")]
    TooLarge {
        /// Bytes needed (header included).
        needed: usize,
        /// Page size.
        available: usize,
    },
}

/// Appends the encoding of an entry (its productions and consumptions
/// sorted and deduplicated) to `out`.
///
/// # Errors
/// [`EncodeError::EntryBounds`].
pub fn encode_entry(
    e: &Entry,
    script: ScriptField<'_>,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    let mut produced = e.produced.clone();
    produced.sort();
    produced.dedup();
    let mut consumed = e.consumed.clone();
    consumed.sort();
    consumed.dedup();
    let script_len = match script {
        ScriptField::Inline(s) => s.len(),
        ScriptField::External(_, len) => len as usize,
    };
    if produced.is_empty()
        || produced.len() > 255
        || consumed.len() > 255
        || script_len > MAX_SCRIPT_LEN
    {
        return Err(EncodeError::EntryBounds);
    }
    out.extend_from_slice(&super::types::outpoint_key(&e.outpoint));
    out.extend_from_slice(&e.coin.value.to_sat().to_le_bytes());
    out.extend_from_slice(&e.coin.height.to_le_bytes());
    let external = matches!(script, ScriptField::External(..));
    out.push(u8::from(e.coin.coinbase) | if external { 2 } else { 0 });
    out.push(produced.len() as u8);
    out.push(consumed.len() as u8);
    out.extend_from_slice(&(script_len as u16).to_le_bytes());
    match script {
        ScriptField::Inline(s) => out.extend_from_slice(s),
        ScriptField::External(ext, _) => {
            out.extend_from_slice(&ext.location.to_le_bytes());
            out.extend_from_slice(&ext.crc.to_le_bytes());
            out.extend_from_slice(&[0u8; 4]);
        }
    }
    for p in &produced {
        out.extend_from_slice(&production_bytes(p));
    }
    for c in &consumed {
        out.extend_from_slice(&consumption_bytes(c));
    }
    Ok(())
}

/// Checks a page in memory form (header + entries, no padding) whole: the
/// magic and version, reserved bytes, the children field, every entry
/// ([`EntryRef::validate`]), the count, and that keys are unique. Returns
/// its header.
///
/// # Errors
/// [`PageError`].
pub fn validate(page: &[u8]) -> Result<PageHead, PageError> {
    let h = validate_head(page)?;
    // Each key with its first 8 bytes as a number: the sort compares
    // those, and whole keys only on a tie (a page read from a file is
    // checked here, so this runs for every such read).
    let mut keys = Vec::with_capacity(h.count as usize);
    let mut at = PAGE_HEADER_LEN;
    while at < page.len() {
        let len = entry_len(page, at)?;
        let e = EntryRef(&page[at..at + len]);
        e.validate().map_err(|err| match err {
            PageError::Malformed { at: x, what } => bad(at + x, what),
            other => other,
        })?;
        keys.push((u64_at(e.key(), 0), e.key()));
        at += len;
    }
    if keys.len() != h.count as usize {
        return Err(bad(OFF_COUNT, "entry count disagrees with the entries"));
    }
    keys.sort_unstable();
    if keys.windows(2).any(|w| w[0] == w[1]) {
        return Err(bad(PAGE_HEADER_LEN, "duplicate key in bucket"));
    }
    Ok(h)
}

/// Checks a page's header (magic, version, reserved bytes, children
/// field) and returns its fields.
fn validate_head(page: &[u8]) -> Result<PageHead, PageError> {
    if page.len() < PAGE_HEADER_LEN {
        return Err(bad(0, "page shorter than its header"));
    }
    if page[4..8] != PAGE_MAGIC || page[8] != PAGE_VERSION {
        return Err(PageError::Magic);
    }
    if page[9] != 0 || page[12..16] != [0; 4] {
        return Err(bad(9, "reserved byte not zero"));
    }
    let h = head(page);
    if h.children == 0 && h.child_mask != 0 {
        return Err(bad(OFF_CHILDREN, "written-children mask without children"));
    }
    Ok(h)
}

/// The length of the used part of a disk page (header + its `count`
/// entries), walking only the entry lengths.
fn used_len(page: &[u8]) -> Result<usize, PageError> {
    if page.len() < PAGE_HEADER_LEN {
        return Err(bad(0, "page shorter than its header"));
    }
    let mut at = PAGE_HEADER_LEN;
    for _ in 0..u16_at(page, OFF_COUNT) {
        at += entry_len(page, at)?;
    }
    Ok(at)
}

/// Appends a spend marker for `key` holding `consumed` (sorted and
/// deduplicated here) to `out`.
///
/// # Errors
/// [`EncodeError::EntryBounds`] for no consumption or more than 255.
pub fn encode_marker(
    key: &OutPointKey,
    consumed: &[Consumption],
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    let mut consumed = consumed.to_vec();
    consumed.sort();
    consumed.dedup();
    if consumed.is_empty() || consumed.len() > 255 {
        return Err(EncodeError::EntryBounds);
    }
    out.extend_from_slice(key);
    out.extend_from_slice(&[0u8; 12]);
    out.extend_from_slice(&[FLAG_MARKER, 0, consumed.len() as u8, 0, 0]);
    for c in &consumed {
        out.extend_from_slice(&consumption_bytes(c));
    }
    Ok(())
}

/// The on-disk image of a page: its used bytes, zero padding to
/// `page_size`, and the CRC-32 of bytes 4..page_size in bytes 0..4.
///
/// # Errors
/// [`EncodeError::TooLarge`] when the page needs more than `page_size`.
pub fn seal(page: &[u8], page_size: usize) -> Result<Vec<u8>, EncodeError> {
    let mut disk = Vec::with_capacity(page_size);
    seal_into(page, page_size, &mut disk)?;
    Ok(disk)
}

/// [`seal`], appending the image to `out` (a checkpoint seals thousands of
/// pages into one buffer per run of pages, without one allocation each).
///
/// # Errors
/// [`EncodeError::TooLarge`] when the page needs more than `page_size`;
/// `out` is then unchanged.
pub fn seal_into(page: &[u8], page_size: usize, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    if page.len() > page_size {
        return Err(EncodeError::TooLarge {
            needed: page.len(),
            available: page_size,
        });
    }
    let start = out.len();
    out.extend_from_slice(page);
    out.resize(start + page_size, 0);
    let disk = &mut out[start..];
    disk[..4].fill(0);
    let crc = crc32fast::hash(&disk[4..]);
    disk[..4].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Checks a page's length and checksum.
fn check_sum(page: &[u8], page_size: usize) -> Result<(), PageError> {
    if page.len() != page_size || page_size < PAGE_HEADER_LEN {
        return Err(PageError::WrongSize {
            len: page.len(),
            expected: page_size,
        });
    }
    let stored = u32_at(page, 0);
    let computed = crc32fast::hash(&page[4..]);
    if stored != computed {
        return Err(PageError::Checksum { stored, computed });
    }
    Ok(())
}

/// A page read from disk, checked whole (length, checksum, [`validate`],
/// zero padding), in memory form.
///
/// # Errors
/// [`PageError`].
pub fn open_disk(page: &[u8], page_size: usize) -> Result<Vec<u8>, PageError> {
    check_sum(page, page_size)?;
    open_unchecked(page)
}

/// [`open_disk`] without the checksum (the fuzz target reaches the field
/// checks with arbitrary bytes through it).
///
/// # Errors
/// [`PageError`], the checksum excepted.
pub fn open_unchecked(page: &[u8]) -> Result<Vec<u8>, PageError> {
    let used = used_len(page)?;
    let mut mem = page[..used].to_vec();
    mem[..4].fill(0);
    validate(&mem)?;
    if page[used..].iter().any(|&b| b != 0) {
        return Err(bad(used, "non-zero padding"));
    }
    Ok(mem)
}

/// Every entry of a page in memory form, decoded.
pub fn decode(page: &[u8]) -> Decoded {
    Decoded {
        head: head(page),
        slots: entries(page).map(|(_, e)| e.to_slot()).collect(),
    }
}

/// [`open_disk`] then [`decode`].
///
/// # Errors
/// [`PageError`].
pub fn decode_disk(page: &[u8], page_size: usize) -> Result<Decoded, PageError> {
    Ok(decode(&open_disk(page, page_size)?))
}

/// A page in memory form holding `d`'s header fields and entries (the
/// inverse of [`decode`]).
///
/// # Errors
/// [`EncodeError`] for an entry out of bounds or a malformed header.
pub fn encode(d: &Decoded) -> Result<Vec<u8>, EncodeError> {
    let mut page = new_page();
    set_head(
        &mut page,
        d.head.max_child_height,
        d.head.purge_hint,
        d.head.children_field(),
    )
    .map_err(|_| EncodeError::EntryBounds)?;
    if d.head.children >> CHILDREN_GROUP_BITS != 0 {
        return Err(EncodeError::EntryBounds);
    }
    for s in &d.slots {
        let script = match s.external {
            Some((ext, len)) => ScriptField::External(ext, len),
            None => ScriptField::Inline(&s.entry.coin.script_pubkey),
        };
        let start = page.len();
        encode_entry(&s.entry, script, &mut page)?;
        let count = head(&page).count as usize + 1;
        if set_count(&mut page, count).is_err() {
            page.truncate(start);
            return Err(EncodeError::EntryBounds);
        }
    }
    Ok(page)
}

/// A page's descent fields and the entries of one lookup, from
/// [`find_in_disk_page`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PageFind {
    /// The header fields.
    pub head: PageHead,
    /// For each key asked (in the order asked), its slot if the page holds it.
    pub found: Vec<Option<Slot>>,
}

/// Looks `keys` up in a disk page of `page_size` bytes, decoding only the
/// entries asked for (a reader wants one of ~40): the length, checksum,
/// header and every matched entry are checked as [`open_disk`] checks
/// them; the other entries only for their lengths.
///
/// # Errors
/// [`PageError`] for the parts checked.
pub fn find_in_disk_page(
    page: &[u8],
    page_size: usize,
    keys: &[OutPointKey],
) -> Result<PageFind, PageError> {
    check_sum(page, page_size)?;
    let head = validate_head(page)?;
    let used = used_len(page)?;
    let mut found = vec![None; keys.len()];
    for (at, e) in entries(&page[..used]) {
        for (f, _) in found
            .iter_mut()
            .zip(keys)
            .filter(|(_, k)| k[..] == *e.key())
        {
            e.validate().map_err(|err| match err {
                PageError::Malformed { at: x, what } => bad(at + x, what),
                other => other,
            })?;
            *f = Some(e.to_slot());
        }
    }
    Ok(PageFind { head, found })
}

#[cfg(test)]
mod tests;
