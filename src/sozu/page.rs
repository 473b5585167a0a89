//! Bucket pages: the byte layout of one Sozu bucket (one device page).
//!
//! Layout (all integers little-endian; `docs/sozu-format.md` is the
//! normative description):
//!
//! ```text
//! offset size field
//! 0      4    crc32 (IEEE, crc32fast) of bytes 4..page_size
//! 4      4    magic "SZBK"
//! 8      1    page format version (1)
//! 9      1    reserved, 0
//! 10     2    entry count n
//! 12     4    max production height of any entry in the children (seed 000's Height(B))
//! 16     8    children: bits 0..48 = 0 (nil) or child group number + 1;
//!             bits 48..64 = mask of the children written at least once
//!             (bit c: child c; a child never written is empty and has no page)
//! 24     ...  n entries, then zero padding to page_size
//! ```
//!
//! One entry (53 bytes + script or 16-byte external reference + 8 bytes per
//! production + 40 bytes per consumption):
//!
//! ```text
//! 36  key: txid (32, internal order) + vout (4, big-endian)
//! 8   value (sats)
//! 4   coin height
//! 1   flags: bit 0 coinbase, bit 1 script stored out of line
//! 1   number of productions (1..=255)
//! 1   number of consumptions (0..=255)
//! 2   script length in bytes (0..=10,000)
//! ..  inline: the script bytes; out of line: record offset (8) + crc32 (4) + reserved (4)
//! 8×p productions: block id (4) + height (4)
//! 40×c consumptions: block id (4) + spending txid (32) + input index (4)
//! ```

use bitcoin::hashes::Hash;
use bitcoin::{Amount, Txid};

use super::types::{key_outpoint, outpoint_key, Coin, Consumption, Entry, OutPointKey, Production};

/// Size of the page header in bytes.
pub const PAGE_HEADER_LEN: usize = 24;
/// Magic of a bucket page.
pub const PAGE_MAGIC: [u8; 4] = *b"SZBK";
/// Version of the page layout.
pub const PAGE_VERSION: u8 = 2;
/// Bits of the `children` field holding the group number + 1.
pub const CHILDREN_GROUP_BITS: u32 = 48;
/// Largest `growth_bits` g the page format holds: a bucket's child mask has
/// 16 bits, one per child, so 2^g ≤ 16.
pub const MAX_GROWTH_BITS: u8 = 4;
/// Fixed part of an encoded entry, in bytes.
pub const ENTRY_FIXED_LEN: usize = 53;
/// Size of an out-of-line script reference inside an entry, in bytes.
pub const EXTERNAL_REF_LEN: usize = 16;
/// Largest script the table accepts, in bytes (consensus `MAX_SCRIPT_SIZE`).
pub const MAX_SCRIPT_LEN: usize = 10_000;

/// Where an out-of-line script lives in the records file.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ExternalScript {
    /// Byte offset of the record in the shard's records file.
    pub offset: u64,
    /// crc32 of the script bytes (checked on every read).
    pub crc: u32,
}

/// One entry as a bucket stores it: the entry, and for long scripts the
/// reference to its out-of-line record (then `entry.coin.script_pubkey` is
/// empty in memory until resolved, and `script_len` gives its length).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Slot {
    /// The entry (script empty when stored out of line).
    pub entry: Entry,
    /// Out-of-line script reference and length in bytes.
    pub external: Option<(ExternalScript, u16)>,
}

impl Slot {
    /// Encoded size of this slot in a page, in bytes.
    pub fn encoded_len(&self) -> usize {
        let script = match self.external {
            Some(_) => EXTERNAL_REF_LEN,
            None => self.entry.coin.script_pubkey.len(),
        };
        ENTRY_FIXED_LEN + script + 8 * self.entry.produced.len() + 40 * self.entry.consumed.len()
    }
}

/// A decoded bucket.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Bucket {
    /// Highest production height of any entry ever spilled below this bucket.
    pub max_child_height: u32,
    /// 0 = no children; else child group number + 1 (< 2^48).
    pub children: u64,
    /// Bit c set: child c of the group has been written at least once (a
    /// child whose bit is clear is empty and its page is never read).
    /// Zero when `children` is 0; needs `growth_bits` ≤ [`MAX_GROWTH_BITS`].
    pub child_mask: u16,
    /// The entries, in no particular order.
    pub slots: Vec<Slot>,
}

impl Bucket {
    /// Sum of the encoded sizes of the entries, in bytes (page header excluded).
    pub fn payload_len(&self) -> usize {
        self.slots.iter().map(Slot::encoded_len).sum()
    }

    /// Position of `key` among the slots.
    pub fn find(&self, outpoint: &bitcoin::OutPoint) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.entry.outpoint == *outpoint)
    }
}

/// Why a page failed to decode.
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
    /// Not a bucket page.
    #[error("bad page magic or version")]
    Magic,
    /// A field is out of range or the entries overrun the page.
    #[error("malformed page at byte {at}: {what}")]
    Malformed {
        /// Byte offset in the page.
        at: usize,
        /// What was wrong.
        what: &'static str,
    },
}

/// Why a bucket could not be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The entries need more bytes than a page holds.
    #[error("bucket needs {needed} bytes, page holds {available}")]
    TooLarge {
        /// Bytes needed (header included).
        needed: usize,
        /// Page size.
        available: usize,
    },
    /// An entry has more than 255 productions or consumptions, or a script
    /// over 10,000 bytes.
    #[error("entry lists or script exceed the format's bounds")]
    EntryBounds,
}

/// Encodes a bucket into a page of `page_size` bytes, checksum included.
///
/// # Errors
/// [`EncodeError`] when it does not fit.
pub fn encode_bucket(bucket: &Bucket, page_size: usize) -> Result<Vec<u8>, EncodeError> {
    let needed = PAGE_HEADER_LEN + bucket.payload_len();
    if needed > page_size || bucket.slots.len() > u16::MAX as usize {
        return Err(EncodeError::TooLarge {
            needed,
            available: page_size,
        });
    }
    if bucket.children >> CHILDREN_GROUP_BITS != 0
        || (bucket.children == 0 && bucket.child_mask != 0)
    {
        return Err(EncodeError::EntryBounds);
    }
    // Written in place into a zeroed page (the padding is already there):
    // `needed` was checked against the page size, so every slice below is
    // in bounds.
    let mut page = vec![0u8; page_size];
    let mut w = Writer {
        buf: &mut page,
        at: 4,
    };
    w.put(&PAGE_MAGIC);
    w.put(&[PAGE_VERSION, 0]);
    w.put(&(bucket.slots.len() as u16).to_le_bytes());
    w.put(&bucket.max_child_height.to_le_bytes());
    let children = bucket.children | (u64::from(bucket.child_mask) << CHILDREN_GROUP_BITS);
    w.put(&children.to_le_bytes());
    for slot in &bucket.slots {
        let e = &slot.entry;
        if e.produced.is_empty()
            || e.produced.len() > 255
            || e.consumed.len() > 255
            || e.coin.script_pubkey.len() > MAX_SCRIPT_LEN
        {
            return Err(EncodeError::EntryBounds);
        }
        w.put(&outpoint_key(&e.outpoint));
        w.put(&e.coin.value.to_sat().to_le_bytes());
        w.put(&e.coin.height.to_le_bytes());
        let flags = u8::from(e.coin.coinbase) | if slot.external.is_some() { 2 } else { 0 };
        w.put(&[flags, e.produced.len() as u8, e.consumed.len() as u8]);
        match slot.external {
            Some((ext, len)) => {
                if len as usize > MAX_SCRIPT_LEN {
                    return Err(EncodeError::EntryBounds);
                }
                w.put(&len.to_le_bytes());
                w.put(&ext.offset.to_le_bytes());
                w.put(&ext.crc.to_le_bytes());
                w.at += 4;
            }
            None => {
                w.put(&(e.coin.script_pubkey.len() as u16).to_le_bytes());
                w.put(&e.coin.script_pubkey);
            }
        }
        for p in &e.produced {
            w.put(&p.block.0.to_le_bytes());
            w.put(&p.height.to_le_bytes());
        }
        for c in &e.consumed {
            w.put(&c.block.0.to_le_bytes());
            w.put(c.txid.as_byte_array());
            w.put(&c.vin.to_le_bytes());
        }
    }
    let crc = crc32fast::hash(&page[4..]);
    page[..4].copy_from_slice(&crc.to_le_bytes());
    Ok(page)
}

/// A cursor writing into a buffer already known to be large enough.
struct Writer<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], PageError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.at..end];
                self.at = end;
                Ok(s)
            }
            None => Err(PageError::Malformed { at: self.at, what }),
        }
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, PageError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, PageError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, PageError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, PageError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_le_bytes(a))
    }
}

/// Decodes and verifies a bucket page of `page_size` bytes. Never panics,
/// whatever the bytes (fuzzed by `fuzz/fuzz_targets/bucket_page.rs`).
///
/// # Errors
/// [`PageError`] on a wrong size, checksum, magic, version, or any field out
/// of range (lists empty or over 255, script over 10,000 bytes, non-zero
/// padding or reserved bytes, duplicate keys).
pub fn decode_bucket(page: &[u8], page_size: usize) -> Result<Bucket, PageError> {
    check_page(page, page_size)?;
    decode_bucket_unchecked(page)
}

/// Checks a page's length and checksum.
fn check_page(page: &[u8], page_size: usize) -> Result<(), PageError> {
    if page.len() != page_size || page_size < PAGE_HEADER_LEN {
        return Err(PageError::WrongSize {
            len: page.len(),
            expected: page_size,
        });
    }
    let stored = u32::from_le_bytes([page[0], page[1], page[2], page[3]]);
    let computed = crc32fast::hash(&page[4..]);
    if stored != computed {
        return Err(PageError::Checksum { stored, computed });
    }
    Ok(())
}

/// Decodes a page without verifying its checksum (the fuzz target uses it to
/// reach the field parser with arbitrary bytes).
///
/// # Errors
/// As [`decode_bucket`], minus the checksum.
pub fn decode_bucket_unchecked(page: &[u8]) -> Result<Bucket, PageError> {
    let mut r = Reader { buf: page, at: 4 };
    let (n, mut bucket) = decode_head(&mut r)?;
    let mut slots: Vec<Slot> = Vec::with_capacity(n.min(page.len() / ENTRY_FIXED_LEN));
    for _ in 0..n {
        slots.push(decode_slot(&mut r)?);
    }
    let mut keys: Vec<&bitcoin::OutPoint> = slots.iter().map(|s| &s.entry.outpoint).collect();
    keys.sort_unstable();
    if keys.windows(2).any(|w| w[0] == w[1]) {
        return Err(PageError::Malformed {
            at: r.at,
            what: "duplicate key in bucket",
        });
    }
    if page[r.at..].iter().any(|&b| b != 0) {
        return Err(PageError::Malformed {
            at: r.at,
            what: "non-zero padding",
        });
    }
    bucket.slots = slots;
    Ok(bucket)
}

/// A bucket's descent fields and the entries of one lookup, from
/// [`find_in_page`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PageFind {
    /// The bucket's fields, `slots` empty.
    pub head: Bucket,
    /// For each key asked (in the order asked), its slot if the page holds it.
    pub found: Vec<Option<Slot>>,
}

/// Looks `keys` up in a bucket page of `page_size` bytes, decoding only the
/// entries asked for: the concurrent reader's path, ~60 entries per page of
/// which it wants one. The length, checksum, header and every matched entry
/// are checked as [`decode_bucket`] checks them; the other entries only for
/// their lengths (a page with a valid checksum was written by the table,
/// and open verified every page whole).
///
/// # Errors
/// [`PageError`] as [`decode_bucket`], for the parts checked.
pub fn find_in_page(
    page: &[u8],
    page_size: usize,
    keys: &[OutPointKey],
) -> Result<PageFind, PageError> {
    check_page(page, page_size)?;
    let mut r = Reader { buf: page, at: 4 };
    let (n, head) = decode_head(&mut r)?;
    let mut found = vec![None; keys.len()];
    for _ in 0..n {
        let (at, len) = (r.at, page_entry(page, r.at)?);
        // In bounds: `page_entry` checked the entry's whole length.
        let key = &page[at..at + 36];
        let mut slot = None;
        for (f, _) in found.iter_mut().zip(keys).filter(|(_, k)| k[..] == *key) {
            if slot.is_none() {
                slot = Some(decode_slot(&mut Reader { buf: page, at })?);
            }
            f.clone_from(&slot);
        }
        r.at = at + len;
    }
    Ok(PageFind { head, found })
}

/// The page header after the checksum: (entry count, the bucket's fields
/// with no slots).
fn decode_head(r: &mut Reader<'_>) -> Result<(usize, Bucket), PageError> {
    if r.take(4, "magic")? != PAGE_MAGIC || r.u8("version")? != PAGE_VERSION {
        return Err(PageError::Magic);
    }
    if r.u8("reserved")? != 0 {
        return Err(PageError::Malformed {
            at: 9,
            what: "reserved byte not zero",
        });
    }
    let n = r.u16("entry count")? as usize;
    let max_child_height = r.u32("max child height")?;
    let children_field = r.u64("children")?;
    let children = children_field & ((1u64 << CHILDREN_GROUP_BITS) - 1);
    let child_mask = (children_field >> CHILDREN_GROUP_BITS) as u16;
    if children == 0 && child_mask != 0 {
        return Err(PageError::Malformed {
            at: 16,
            what: "written-children mask without children",
        });
    }
    Ok((
        n,
        Bucket {
            max_child_height,
            children,
            child_mask,
            slots: Vec::new(),
        },
    ))
}

/// One entry at the reader's position.
fn decode_slot(r: &mut Reader<'_>) -> Result<Slot, PageError> {
    let mut key = [0u8; 36];
    key.copy_from_slice(r.take(36, "key")?);
    let value = r.u64("value")?;
    let height = r.u32("height")?;
    let flags = r.u8("flags")?;
    if flags & !3 != 0 {
        return Err(PageError::Malformed {
            at: r.at - 1,
            what: "unknown flag bits",
        });
    }
    let np = r.u8("production count")? as usize;
    let nc = r.u8("consumption count")? as usize;
    if np == 0 {
        return Err(PageError::Malformed {
            at: r.at - 2,
            what: "entry without production",
        });
    }
    let script_len = r.u16("script length")?;
    if script_len as usize > MAX_SCRIPT_LEN {
        return Err(PageError::Malformed {
            at: r.at - 2,
            what: "script over 10,000 bytes",
        });
    }
    let (script, external) = if flags & 2 != 0 {
        let offset = r.u64("record offset")?;
        let crc = r.u32("record crc")?;
        if r.u32("reserved")? != 0 {
            return Err(PageError::Malformed {
                at: r.at - 4,
                what: "reserved not zero",
            });
        }
        (
            Vec::new(),
            Some((ExternalScript { offset, crc }, script_len)),
        )
    } else {
        (r.take(script_len as usize, "script")?.to_vec(), None)
    };
    let mut produced = Vec::with_capacity(np);
    for _ in 0..np {
        let block = super::BlockId(r.u32("production block")?);
        let height = r.u32("production height")?;
        produced.push(Production { block, height });
    }
    let mut consumed = Vec::with_capacity(nc);
    for _ in 0..nc {
        let block = super::BlockId(r.u32("consumption block")?);
        let mut txid = [0u8; 32];
        txid.copy_from_slice(r.take(32, "spending txid")?);
        let vin = r.u32("input index")?;
        consumed.push(Consumption {
            block,
            txid: Txid::from_byte_array(txid),
            vin,
        });
    }
    if !produced.windows(2).all(|w| w[0] < w[1]) || !consumed.windows(2).all(|w| w[0] < w[1]) {
        return Err(PageError::Malformed {
            at: r.at,
            what: "lifecycle lists not sorted",
        });
    }
    let entry = Entry {
        outpoint: key_outpoint(&key),
        coin: Coin {
            value: Amount::from_sat(value),
            script_pubkey: script,
            height,
            coinbase: flags & 1 != 0,
        },
        produced,
        consumed,
    };
    Ok(Slot { entry, external })
}

/// (key, the entry's encoded bytes) of one entry of an encoded page.
type EntryBytes<'a> = (&'a [u8], &'a [u8]);

/// The entries of an encoded page: (key, the entry's bytes), in page order.
/// Only lengths are parsed; the page was produced by [`encode_bucket`] or
/// checked by [`decode_bucket`].
fn page_entries(page: &[u8]) -> Result<Vec<EntryBytes<'_>>, PageError> {
    if page.len() < PAGE_HEADER_LEN {
        return Err(PageError::Malformed {
            at: 0,
            what: "page shorter than its header",
        });
    }
    let n = u16::from_le_bytes([page[10], page[11]]) as usize;
    let mut at = PAGE_HEADER_LEN;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let e = page_entry(page, at)?;
        out.push((&page[at..at + 36], &page[at..at + e]));
        at += e;
    }
    Ok(out)
}

/// Length in bytes of the entry at `at` of `buf`.
fn page_entry(buf: &[u8], at: usize) -> Result<usize, PageError> {
    let bad = PageError::Malformed {
        at,
        what: "entry overruns its buffer",
    };
    let fixed = buf.get(at..at + ENTRY_FIXED_LEN).ok_or(bad.clone())?;
    let flags = fixed[48];
    let (np, nc) = (fixed[49] as usize, fixed[50] as usize);
    let script = if flags & 2 != 0 {
        EXTERNAL_REF_LEN
    } else {
        u16::from_le_bytes([fixed[51], fixed[52]]) as usize
    };
    let len = ENTRY_FIXED_LEN + script + 8 * np + 40 * nc;
    if at + len > buf.len() {
        return Err(bad);
    }
    Ok(len)
}

/// The journal delta turning page image `old` into `new` (both whole
/// encoded pages of the same bucket): max child height (4) ‖ children
/// field (8) ‖ deleted keys d (2) ‖ upserted entries u (2) ‖ d × 36-byte keys
/// ‖ u entries in the page's entry encoding. Entries equal in both are left
/// out, so a block that adds one consumption record to a page journals one
/// entry, not the page.
///
/// # Errors
/// [`PageError::Malformed`] if either image does not parse.
pub fn page_delta(old: &[u8], new: &[u8]) -> Result<Vec<u8>, PageError> {
    // A rewrite keeps the entries' relative order (purges and spills
    // remove, inserts append, merges change in place), so one walk over
    // both pages pairs them up. An entry found out of order is journaled as
    // a deletion plus an upsert, which replay applies just as well.
    let before = page_entries(old)?;
    let after = page_entries(new)?;
    let mut deleted: Vec<&[u8]> = Vec::new();
    let mut upserted: Vec<&[u8]> = Vec::new();
    let mut next = after.iter().peekable();
    for (key, bytes) in &before {
        match next.peek() {
            Some((k, e)) if k == key => {
                if e != bytes {
                    upserted.push(e);
                }
                next.next();
            }
            _ => deleted.push(key),
        }
    }
    upserted.extend(next.map(|(_, e)| *e));
    let mut d = Vec::with_capacity(
        16 + 36 * deleted.len() + upserted.iter().map(|e| e.len()).sum::<usize>(),
    );
    d.extend_from_slice(&new[12..24]);
    d.extend_from_slice(&(deleted.len() as u16).to_le_bytes());
    d.extend_from_slice(&(upserted.len() as u16).to_le_bytes());
    for k in deleted {
        d.extend_from_slice(k);
    }
    for e in upserted {
        d.extend_from_slice(e);
    }
    Ok(d)
}

/// Applies a [`page_delta`] to the page image `base`, giving the new whole
/// page (checksum included).
///
/// # Errors
/// [`PageError::Malformed`] when the delta does not parse, deletes a key
/// the base lacks, or the result does not fit the page.
pub fn apply_page_delta(base: &[u8], delta: &[u8], page_size: usize) -> Result<Vec<u8>, PageError> {
    let bad = |at: usize, what: &'static str| PageError::Malformed { at, what };
    if delta.len() < 16 {
        return Err(bad(0, "delta shorter than its header"));
    }
    let n_del = u16::from_le_bytes([delta[12], delta[13]]) as usize;
    let n_up = u16::from_le_bytes([delta[14], delta[15]]) as usize;
    let mut entries: Vec<EntryBytes<'_>> = page_entries(base)?;
    let mut at = 16;
    for _ in 0..n_del {
        let k = delta
            .get(at..at + 36)
            .ok_or(bad(at, "delta key overruns"))?;
        let pos = entries
            .iter()
            .position(|(x, _)| *x == k)
            .ok_or(bad(at, "delta deletes a key the page lacks"))?;
        entries.remove(pos);
        at += 36;
    }
    for _ in 0..n_up {
        let len = page_entry(delta, at)?;
        let e = &delta[at..at + len];
        let k = &e[..36];
        match entries.iter().position(|(x, _)| *x == k) {
            Some(pos) => entries[pos] = (k, e),
            None => entries.push((k, e)),
        }
        at += len;
    }
    if at != delta.len() {
        return Err(bad(at, "trailing bytes after the delta"));
    }
    let used = PAGE_HEADER_LEN + entries.iter().map(|(_, e)| e.len()).sum::<usize>();
    if used > page_size || entries.len() > u16::MAX as usize {
        return Err(bad(0, "delta result does not fit the page"));
    }
    let mut page = Vec::with_capacity(page_size);
    page.extend_from_slice(&[0u8; 4]);
    page.extend_from_slice(&PAGE_MAGIC);
    page.push(PAGE_VERSION);
    page.push(0);
    page.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    page.extend_from_slice(&delta[..12]);
    for (_, e) in entries {
        page.extend_from_slice(e);
    }
    page.resize(page_size, 0);
    let crc = crc32fast::hash(&page[4..]);
    page[..4].copy_from_slice(&crc.to_le_bytes());
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sozu::BlockId;
    use bitcoin::OutPoint;

    fn slot(i: u8, script_len: usize) -> Slot {
        Slot {
            entry: Entry {
                outpoint: OutPoint {
                    txid: Txid::from_byte_array([i; 32]),
                    vout: i as u32,
                },
                coin: Coin {
                    value: bitcoin::Amount::from_sat(5000),
                    script_pubkey: vec![0x51; script_len],
                    height: 7,
                    coinbase: i.is_multiple_of(2),
                },
                produced: vec![Production {
                    block: BlockId(3),
                    height: 7,
                }],
                consumed: vec![Consumption {
                    block: BlockId(9),
                    txid: Txid::from_byte_array([0xee; 32]),
                    vin: 1,
                }],
            },
            external: None,
        }
    }

    #[test]
    fn round_trip_and_exact_header_bytes() {
        let b = Bucket {
            max_child_height: 0x01020304,
            children: 5,
            child_mask: 0b1010,
            slots: vec![slot(1, 22), slot(2, 0)],
        };
        let page = encode_bucket(&b, 4096).unwrap();
        assert_eq!(&page[4..8], b"SZBK");
        assert_eq!(page[8], 2);
        assert_eq!(&page[10..12], &[2, 0]);
        assert_eq!(&page[12..16], &[4, 3, 2, 1]);
        assert_eq!(&page[16..24], &[5, 0, 0, 0, 0, 0, 0b1010, 0]);
        // entry: key txid bytes then vout big-endian
        assert_eq!(&page[24..56], &[1u8; 32]);
        assert_eq!(&page[56..60], &[0, 0, 0, 1]);
        assert_eq!(b.slots[0].encoded_len(), 53 + 22 + 8 + 40);
        assert_eq!(decode_bucket(&page, 4096).unwrap(), b);
    }

    #[test]
    fn flipped_bit_is_a_checksum_error() {
        let b = Bucket {
            max_child_height: 0,
            children: 0,
            child_mask: 0,
            slots: vec![slot(1, 30)],
        };
        let mut page = encode_bucket(&b, 4096).unwrap();
        page[100] ^= 0x10;
        assert!(matches!(
            decode_bucket(&page, 4096),
            Err(PageError::Checksum { .. })
        ));
    }

    #[test]
    fn delta_turns_the_old_page_into_the_new() {
        let old = Bucket {
            max_child_height: 3,
            children: 2,
            child_mask: 1,
            slots: (0..10).map(|i| slot(i, 22 + i as usize)).collect(),
        };
        let mut new = old.clone();
        new.slots.remove(3); // spilled
        new.slots[0].entry.consumed.clear(); // changed
        new.slots.push(slot(40, 25)); // inserted
        new.max_child_height = 9;
        new.child_mask = 3;
        let (a, b) = (
            encode_bucket(&old, 4096).unwrap(),
            encode_bucket(&new, 4096).unwrap(),
        );
        let d = page_delta(&a, &b).unwrap();
        // one deletion, two upserts: far smaller than the page
        assert_eq!(&d[12..16], &[1, 0, 2, 0]);
        assert!(d.len() < 400, "{}", d.len());
        let got = apply_page_delta(&a, &d, 4096).unwrap();
        let mut got = decode_bucket(&got, 4096).unwrap();
        got.slots.sort_by_key(|s| outpoint_key(&s.entry.outpoint));
        new.slots.sort_by_key(|s| outpoint_key(&s.entry.outpoint));
        assert_eq!(got, new);
        // a deletion of a key the base lacks is refused
        assert!(apply_page_delta(&b, &page_delta(&a, &b).unwrap()[..], 4096).is_err());
    }

    #[test]
    fn too_large_is_refused() {
        let b = Bucket {
            slots: (0..60).map(|i| slot(i, 30)).collect(),
            ..Default::default()
        };
        assert!(matches!(
            encode_bucket(&b, 4096),
            Err(EncodeError::TooLarge { .. })
        ));
    }

    proptest::proptest! {
        /// Whatever the rewrite (entries removed, changed, appended, even
        /// reordered), applying the delta to the old page gives the new
        /// page's entries and header fields.
        #[test]
        fn delta_reproduces_any_rewrite(
            n in 0u8..30,
            ops in proptest::collection::vec((0u8..4, 0usize..40, 0u8..200), 0..20),
        ) {
            let old = Bucket { max_child_height: 1, children: 2, child_mask: 1, slots: (0..n).map(|i| slot(i, 22 + i as usize % 9)).collect() };
            let mut new = old.clone();
            for (op, at, x) in ops {
                let len = new.slots.len();
                match op {
                    0 if len > 0 => { new.slots.remove(at % len); }
                    1 if len > 0 => new.slots[at % len].entry.consumed.clear(),
                    2 if len > 1 => new.slots.swap(at % len, (at / 2) % len),
                    _ => {
                        let s = slot(x, 22 + x as usize % 11);
                        // Appends stop where the page is full.
                        let fits = PAGE_HEADER_LEN + new.payload_len() + s.encoded_len() <= 4096;
                        if fits && !new.slots.iter().any(|o| o.entry.outpoint == s.entry.outpoint) {
                            new.slots.push(s);
                        }
                    }
                }
            }
            new.max_child_height = 7;
            let (a, b) = (encode_bucket(&old, 4096).unwrap(), encode_bucket(&new, 4096).unwrap());
            let got = apply_page_delta(&a, &page_delta(&a, &b).unwrap(), 4096).unwrap();
            let mut got = decode_bucket(&got, 4096).unwrap();
            got.slots.sort_by_key(|s| outpoint_key(&s.entry.outpoint));
            new.slots.sort_by_key(|s| outpoint_key(&s.entry.outpoint));
            proptest::prop_assert_eq!(got, new);
        }

        /// The fuzz target's property, run on mutated valid pages in CI.
        #[test]
        fn mutated_pages_never_panic_and_round_trip(
            flips in proptest::collection::vec((0usize..4096, proptest::prelude::any::<u8>()), 1..8),
            n in 0u8..20,
        ) {
            let b = Bucket { max_child_height: 3, children: 2, child_mask: 1, slots: (0..n).map(|i| slot(i, 22 + i as usize)).collect() };
            let mut page = encode_bucket(&b, 4096).unwrap();
            for (at, x) in flips {
                page[at] ^= x;
            }
            if let Ok(d) = decode_bucket_unchecked(&page) {
                let again = encode_bucket(&d, 4096).unwrap();
                proptest::prop_assert_eq!(&again[4..], &page[4..]);
            }
            let _ = decode_bucket(&page, 4096);
            // The reader's keyed lookup, past the checksum: never panics,
            // and agrees with the whole decode wherever that succeeds.
            let crc = crc32fast::hash(&page[4..]);
            page[..4].copy_from_slice(&crc.to_le_bytes());
            let keys: Vec<OutPointKey> = (0..n).map(|i| outpoint_key(&slot(i, 0).entry.outpoint)).collect();
            let found = find_in_page(&page, 4096, &keys);
            if let Ok(d) = decode_bucket(&page, 4096) {
                proptest::prop_assert_eq!(found.unwrap(), expected_find(&d, &keys));
            }
        }

        /// `find_in_page` returns what a whole decode finds, key by key, in
        /// the order asked, for keys present, absent and asked twice.
        #[test]
        fn find_in_page_agrees_with_decode(
            n in 0u8..30,
            asked in proptest::collection::vec(0u8..40, 0..12),
        ) {
            let b = Bucket { max_child_height: 4, children: 3, child_mask: 2, slots: (0..n).map(|i| slot(i, 22 + i as usize % 9)).collect() };
            let page = encode_bucket(&b, 4096).unwrap();
            let keys: Vec<OutPointKey> = asked.iter().map(|&i| outpoint_key(&slot(i, 0).entry.outpoint)).collect();
            let got = find_in_page(&page, 4096, &keys).unwrap();
            proptest::prop_assert_eq!(got.found.iter().filter(|f| f.is_some()).count(), asked.iter().filter(|&&i| i < n).count());
            proptest::prop_assert_eq!(got, expected_find(&b, &keys));
        }
    }

    fn expected_find(b: &Bucket, keys: &[OutPointKey]) -> PageFind {
        PageFind {
            head: Bucket {
                slots: Vec::new(),
                ..b.clone()
            },
            found: keys
                .iter()
                .map(|k| b.find(&key_outpoint(k)).map(|i| b.slots[i].clone()))
                .collect(),
        }
    }

    #[test]
    fn find_in_page_checks_the_checksum() {
        let b = Bucket {
            slots: vec![slot(1, 30)],
            ..Default::default()
        };
        let mut page = encode_bucket(&b, 4096).unwrap();
        page[100] ^= 0x10;
        let key = outpoint_key(&b.slots[0].entry.outpoint);
        assert!(matches!(
            find_in_page(&page, 4096, &[key]),
            Err(PageError::Checksum { .. })
        ));
    }
}
