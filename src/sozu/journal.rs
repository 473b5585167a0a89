//! Journal and checkpoint records: their framing, byte by byte
//! (`docs/sozu-format.md`, "Journal"). A commit record carries each
//! shard's page edits (`sozu::ops`), the records-file bytes appended,
//! and the header as of the commit; a checkpoint record carries whole page
//! images instead of edits.

use std::sync::Arc;

use super::geo::Addr;
use super::header::HEADER_LEN;

/// Magic of a journal or checkpoint record.
pub const RECORD_MAGIC: [u8; 4] = *b"SZJ4";
/// Size of a record's fixed head in bytes.
pub const RECORD_HEADER_LEN: usize = 48;
/// Record kind: page edits (a commit).
const KIND_OPS: u8 = 0;
/// Record kind: whole page images (a checkpoint's double write).
const KIND_IMAGES: u8 = 1;

/// A page's whole image (memory form: header and entries, no padding).
#[derive(Clone, Debug)]
pub struct PageImage {
    /// Shard.
    pub shard: u8,
    /// Layer and page.
    pub addr: Addr,
    /// The page.
    pub image: Arc<Vec<u8>>,
}

/// Bytes appended to a records segment.
#[derive(Clone, Debug)]
pub struct Extent {
    /// Shard.
    pub shard: u8,
    /// Segment (bits 40..64) and offset (bits 0..40).
    pub location: u64,
    /// The bytes (whole records).
    pub data: Arc<Vec<u8>>,
}

/// What a record holds besides its extents and header.
#[derive(Clone, Debug)]
pub enum Body {
    /// Per shard, the encoded page edits of one commit.
    Ops(Vec<(u8, Vec<u8>)>),
    /// Whole page images (a checkpoint file's content).
    Images(Vec<PageImage>),
}

/// A decoded record.
#[derive(Clone, Debug)]
pub struct Record {
    /// Generation it belongs to.
    pub generation: u64,
    /// Sequence number (commits: the commit's; checkpoint records: the
    /// commit whose state their images hold, the same in every record of
    /// one checkpoint).
    pub seq: u64,
    /// Edits or images.
    pub body: Body,
    /// Records-file extents.
    pub extents: Vec<Extent>,
    /// The header as of this record.
    pub header: Vec<u8>,
}

/// Encodes a record into `b` (cleared first; the caller reuses one buffer).
pub fn encode(rec: &Record, b: &mut Vec<u8>) {
    b.clear();
    b.extend_from_slice(&RECORD_MAGIC);
    b.extend_from_slice(&[0u8; 4]);
    b.extend_from_slice(&rec.generation.to_le_bytes());
    b.extend_from_slice(&rec.seq.to_le_bytes());
    b.extend_from_slice(&[0u8; 8]); // body length, below
    let (kind, n) = match &rec.body {
        Body::Ops(s) => (KIND_OPS, s.len()),
        Body::Images(i) => (KIND_IMAGES, i.len()),
    };
    b.extend_from_slice(&[kind, 0, 0, 0]);
    b.extend_from_slice(&(n as u32).to_le_bytes());
    b.extend_from_slice(&(rec.extents.len() as u32).to_le_bytes());
    b.extend_from_slice(&[0u8; 4]);
    match &rec.body {
        Body::Ops(shards) => {
            for (shard, ops) in shards {
                b.extend_from_slice(&[*shard, 0, 0, 0]);
                b.extend_from_slice(&(ops.len() as u32).to_le_bytes());
                b.extend_from_slice(ops);
            }
        }
        Body::Images(images) => {
            for p in images {
                b.extend_from_slice(&[p.shard, p.addr.0, 0, 0]);
                b.extend_from_slice(&(p.image.len() as u32).to_le_bytes());
                b.extend_from_slice(&p.addr.1.to_le_bytes());
                b.extend_from_slice(&p.image);
            }
        }
    }
    for e in &rec.extents {
        b.push(e.shard);
        b.extend_from_slice(&[0u8; 7]);
        b.extend_from_slice(&e.location.to_le_bytes());
        b.extend_from_slice(&(e.data.len() as u32).to_le_bytes());
        b.extend_from_slice(&[0u8; 4]);
        b.extend_from_slice(&e.data);
    }
    b.extend_from_slice(&rec.header);
    let body_len = (b.len() - RECORD_HEADER_LEN) as u64;
    b[24..32].copy_from_slice(&body_len.to_le_bytes());
    let hcrc = crc32fast::hash(&b[8..RECORD_HEADER_LEN]);
    b[4..8].copy_from_slice(&hcrc.to_le_bytes());
    let crc = crc32fast::hash(b);
    b.extend_from_slice(&crc.to_le_bytes());
}

/// Result of trying to parse a record at some offset of a file.
#[derive(Debug)]
pub enum Parsed {
    /// A complete, checksummed record and its total length in bytes.
    Ok(Record, usize),
    /// Not a valid record here (torn tail, garbage, or end of file).
    Invalid,
}

/// The generation in the fixed head of a record at the start of `b`, if
/// that head (48 bytes) is intact, whatever its body.
pub fn record_generation(b: &[u8]) -> Option<u64> {
    record_tag(b).map(|(g, _)| g)
}

/// The generation and sequence number in the fixed head of a record at the
/// start of `b`, if that head (48 bytes) is intact, whatever its body. A
/// checkpoint record's sequence number is the commit whose state its
/// images hold (`docs/sozu-format.md`, "Journal").
pub fn record_tag(b: &[u8]) -> Option<(u64, u64)> {
    let head = b.get(..RECORD_HEADER_LEN)?;
    let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let u64_at = |i: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&head[i..i + 8]);
        u64::from_le_bytes(a)
    };
    (head[..4] == RECORD_MAGIC && crc == crc32fast::hash(&head[8..]))
        .then(|| (u64_at(8), u64_at(16)))
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
    end: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.end)?;
        let s = &self.b[self.at..end];
        self.at = end;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|s| {
            let mut a = [0u8; 8];
            a.copy_from_slice(s);
            u64::from_le_bytes(a)
        })
    }
}

fn parse_body(c: &mut Cursor<'_>, kind: u8, n: usize, page_size: usize) -> Option<Body> {
    match kind {
        KIND_OPS => {
            let mut shards = Vec::with_capacity(n.min(64));
            for _ in 0..n {
                let head = c.take(4)?;
                if head[1..] != [0, 0, 0] {
                    return None;
                }
                let len = c.u32()? as usize;
                shards.push((head[0], c.take(len)?.to_vec()));
            }
            Some(Body::Ops(shards))
        }
        KIND_IMAGES => {
            let mut images = Vec::with_capacity(n.min(4096));
            for _ in 0..n {
                let (shard, addr, image) = image_at(c, page_size)?;
                images.push(PageImage {
                    shard,
                    addr,
                    image: Arc::new(image.to_vec()),
                });
            }
            Some(Body::Images(images))
        }
        _ => None,
    }
}

/// One page image of a checkpoint record's body: shard, address, bytes.
fn image_at<'a>(c: &mut Cursor<'a>, page_size: usize) -> Option<(u8, Addr, &'a [u8])> {
    let head = c.take(4)?;
    let len = c.u32()? as usize;
    let page = c.u64()?;
    if head[2..] != [0, 0] || len > page_size {
        return None;
    }
    Some((head[0], (head[1], page), c.take(len)?))
}

/// A record's fixed head, checked with the whole record's checksum.
struct Frame {
    generation: u64,
    seq: u64,
    kind: u8,
    /// Shards (kind 0) or page images (kind 1).
    n: usize,
    /// Records extents.
    m: usize,
    /// Where the checksum starts (the end of the header image).
    end: usize,
}

fn frame(b: &[u8]) -> Option<Frame> {
    let generation = record_generation(b)?;
    let mut c = Cursor {
        b,
        at: 16,
        end: RECORD_HEADER_LEN,
    };
    let seq = c.u64()?;
    let body_len = usize::try_from(c.u64()?).ok()?;
    let head = c.take(4)?;
    let (kind, n, m) = (head[0], c.u32()? as usize, c.u32()? as usize);
    if head[1..] != [0, 0, 0] || c.u32()? != 0 {
        return None;
    }
    let total = body_len.checked_add(RECORD_HEADER_LEN + 4)?;
    let end = total.checked_sub(4).filter(|_| total <= b.len())?;
    let crc = u32::from_le_bytes([b[end], b[end + 1], b[end + 2], b[end + 3]]);
    (crc == crc32fast::hash(&b[..end])).then_some(Frame {
        generation,
        seq,
        kind,
        n,
        m,
        end,
    })
}

/// The page images of the checkpoint record at the start of `b`, borrowed
/// from it (no copy), in record order: `None` unless `b` starts with a
/// whole, checksummed record of kind 1 ([`parse`] checks the rest of it).
pub fn images(b: &[u8], page_size: usize) -> Option<Vec<(u8, Addr, &[u8])>> {
    let f = frame(b).filter(|f| f.kind == KIND_IMAGES)?;
    let mut c = Cursor {
        b,
        at: RECORD_HEADER_LEN,
        end: f.end,
    };
    (0..f.n).map(|_| image_at(&mut c, page_size)).collect()
}

/// Parses one record starting at the beginning of `b` (images longer than
/// `page_size` are invalid).
pub fn parse(b: &[u8], page_size: usize) -> Parsed {
    parse_inner(b, page_size).map_or(Parsed::Invalid, |(r, n)| Parsed::Ok(r, n))
}

fn parse_inner(b: &[u8], page_size: usize) -> Option<(Record, usize)> {
    let Frame {
        generation,
        seq,
        kind,
        n,
        m,
        end,
    } = frame(b)?;
    let mut c = Cursor {
        b,
        at: RECORD_HEADER_LEN,
        end,
    };
    let body = parse_body(&mut c, kind, n, page_size)?;
    let mut extents = Vec::with_capacity(m.min(4096));
    for _ in 0..m {
        let head = c.take(8)?;
        let location = c.u64()?;
        let len = c.u32()? as usize;
        if head[1..] != [0; 7] || c.u32()? != 0 {
            return None;
        }
        extents.push(Extent {
            shard: head[0],
            location,
            data: Arc::new(c.take(len)?.to_vec()),
        });
    }
    let header = c.take(HEADER_LEN)?.to_vec();
    (c.at == end).then_some(())?;
    Some((
        Record {
            generation,
            seq,
            body,
            extents,
            header,
        },
        end + 4,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            generation: 7,
            seq: 3,
            body: Body::Ops(vec![(0, vec![1, 0, 5, 0, 0, 0, 0, 0, 0, 0]), (1, vec![])]),
            extents: vec![Extent {
                shard: 1,
                location: (2 << 40) | 17,
                data: Arc::new(vec![9; 50]),
            }],
            header: vec![0xab; HEADER_LEN],
        }
    }

    #[test]
    fn round_trip_exact_head_and_torn_tails() {
        let mut b = Vec::new();
        encode(&sample(), &mut b);
        assert_eq!(&b[..4], b"SZJ4");
        assert_eq!(&b[8..16], &7u64.to_le_bytes());
        assert_eq!(b.len(), 48 + (8 + 10) + 8 + (24 + 50) + HEADER_LEN + 4);
        assert_eq!(record_generation(&b), Some(7));
        match parse(&b, 4096) {
            Parsed::Ok(r, n) => {
                assert_eq!(n, b.len());
                assert_eq!((r.generation, r.seq, r.extents.len()), (7, 3, 1));
                assert!(matches!(r.body, Body::Ops(ref s) if s.len() == 2 && s[0].1.len() == 10));
            }
            Parsed::Invalid => panic!("valid record refused"),
        }
        for cut in [0, 10, 48, 100, b.len() - 1] {
            assert!(matches!(parse(&b[..cut], 4096), Parsed::Invalid));
        }
        let mut flipped = b.clone();
        flipped[60] ^= 1;
        assert!(matches!(parse(&flipped, 4096), Parsed::Invalid));
        // An image longer than a page is refused.
        let big = Record {
            body: Body::Images(vec![PageImage {
                shard: 0,
                addr: (1, 2),
                image: Arc::new(vec![1; 600]),
            }]),
            ..sample()
        };
        encode(&big, &mut b);
        assert!(matches!(parse(&b, 4096), Parsed::Ok(..)));
        assert!(matches!(parse(&b, 512), Parsed::Invalid));
    }

    /// [`images`] borrows exactly what [`parse`] copies, and refuses what
    /// it refuses, and records of edits.
    #[test]
    fn images_borrowed_equal_images_parsed() {
        let rec = Record {
            body: Body::Images(vec![
                PageImage {
                    shard: 1,
                    addr: (3, 70),
                    image: Arc::new(vec![4; 300]),
                },
                PageImage {
                    shard: 0,
                    addr: (0, 2),
                    image: Arc::new(vec![5; 10]),
                },
            ]),
            ..sample()
        };
        let mut b = Vec::new();
        encode(&rec, &mut b);
        b.extend_from_slice(&[0xee; 9]); // whatever follows the record
        let got = images(&b, 4096).expect("valid record");
        assert_eq!(
            got,
            vec![(1, (3, 70), &[4u8; 300][..]), (0, (0, 2), &[5u8; 10][..])]
        );
        assert!(images(&b, 100).is_none());
        assert!(images(&b[..b.len() - 10], 4096).is_none());
        let mut flipped = b.clone();
        flipped[70] ^= 1;
        assert!(images(&flipped, 4096).is_none());
        encode(&sample(), &mut b);
        assert!(images(&b, 4096).is_none());
    }
}
