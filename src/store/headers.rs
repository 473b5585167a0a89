//! The records of the `headers/` flat files: headers accepted without their
//! block (a P2P headers sync), kept out of the index database. A headers
//! sync stores millions of them (4.8M on testnet3); as rows of
//! `block_by_id` each cost a ~240-byte record and a B-tree insert, as one
//! appended record per `headers` message they cost 84 bytes and one
//! sequential write. A block that gets its data later has its full record
//! in `block_by_id`, which wins over this one at open.
//!
//! One record per batch, all integers big-endian:
//!
//! | bytes | field |
//! | --- | --- |
//! | 4 | count n |
//! | 84 × n | per header: `BlockId` u32 ‖ the 80-byte header |
//! | 4 | CRC-32 (IEEE) of everything before |

use bitcoin::block::Header;
use bitcoin::consensus::{deserialize, serialize};

use crate::primitives::BlockId;

/// Bytes of one header in a record: id (4) ‖ header (80).
const ITEM: usize = 84;

/// Why a record of the `headers/` files does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeadersRecordError {
    /// The record is not 8 + 84 × count bytes.
    #[error("record of {len} bytes does not hold {count} headers")]
    Length {
        /// Its length.
        len: usize,
        /// The count it declares.
        count: u32,
    },
    /// The checksum does not match.
    #[error("checksum mismatch")]
    Checksum,
}

/// Encodes one record of `headers` (ids and headers, in acceptance order).
pub fn encode_headers(headers: &[(BlockId, Header)]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + ITEM * headers.len());
    v.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    for (id, h) in headers {
        v.extend_from_slice(&id.0.to_be_bytes());
        v.extend_from_slice(&serialize(h));
    }
    let sum = crc32fast::hash(&v);
    v.extend_from_slice(&sum.to_be_bytes());
    v
}

/// Decodes one record made by [`encode_headers`].
///
/// # Errors
/// [`HeadersRecordError`] when the length or checksum is wrong.
pub fn decode_headers(record: &[u8]) -> Result<Vec<(BlockId, Header)>, HeadersRecordError> {
    let len = record.len();
    let count = match record.get(..4) {
        Some(b) => u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
        None => return Err(HeadersRecordError::Length { len, count: 0 }),
    };
    if (len as u64) != 8 + ITEM as u64 * u64::from(count) {
        return Err(HeadersRecordError::Length { len, count });
    }
    let (body, sum) = record.split_at(len - 4);
    if crc32fast::hash(body).to_be_bytes() != sum {
        return Err(HeadersRecordError::Checksum);
    }
    body[4..]
        .chunks_exact(ITEM)
        .map(|c| {
            let id = BlockId(u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
            // 80 bytes always decode as a header (every field is fixed
            // width); the CRC already vouched for them.
            deserialize::<Header>(&c[4..])
                .map(|h| (id, h))
                .map_err(|_| HeadersRecordError::Checksum)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_bytes_and_round_trip() {
        let genesis =
            bitcoin::blockdata::constants::genesis_block(bitcoin::Network::Regtest).header;
        let rec = encode_headers(&[(BlockId(7), genesis), (BlockId(0x0102_0304), genesis)]);
        assert_eq!(rec.len(), 4 + 2 * 84 + 4);
        assert_eq!(&rec[..4], &[0, 0, 0, 2]);
        assert_eq!(&rec[4..8], &[0, 0, 0, 7]);
        assert_eq!(&rec[8..88], &serialize(&genesis)[..]);
        assert_eq!(&rec[88..92], &[1, 2, 3, 4]);
        assert_eq!(
            decode_headers(&rec).unwrap(),
            vec![(BlockId(7), genesis), (BlockId(0x0102_0304), genesis)]
        );
        assert_eq!(decode_headers(&encode_headers(&[])).unwrap(), vec![]);
    }

    #[test]
    fn damaged_records_are_refused() {
        let genesis =
            bitcoin::blockdata::constants::genesis_block(bitcoin::Network::Regtest).header;
        let rec = encode_headers(&[(BlockId(1), genesis)]);
        for cut in [0, 3, 4, rec.len() - 1] {
            assert!(decode_headers(&rec[..cut]).is_err(), "cut at {cut}");
        }
        let mut flipped = rec.clone();
        flipped[20] ^= 1;
        assert_eq!(decode_headers(&flipped), Err(HeadersRecordError::Checksum));
        let mut longer = rec.clone();
        longer.push(0);
        assert!(matches!(
            decode_headers(&longer),
            Err(HeadersRecordError::Length { .. })
        ));
    }
}
