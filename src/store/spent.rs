//! The spent-output records of the `spent/` flat files: for every connected
//! block, the outputs its transactions spent (prevout, coin, spender), in
//! block order. The pipeline writes one per connected block
//! ([`encode_spent`]); snapshots read them back ([`SpentRecord`]) for
//! BIP-158 filters of stored blocks, the archive (spent outputs of final
//! blocks become leaves) and outspend lookups.
//!
//! One record per block, all integers little-endian, built from
//! rust-bitcoin's consensus encodings (`OutPoint` = txid ‖ vout u32):
//!
//! | field | bytes |
//! | --- | --- |
//! | count | 4 (u32) |
//! | per output: prevout | 36 (txid 32 ‖ vout u32) |
//! | value, sats | 8 (u64) |
//! | creation height | 4 (u32) |
//! | coinbase flag | 1 (0 or 1) |
//! | spending txid | 32 |
//! | input index (vin) | 4 (u32) |
//! | scriptPubKey length | 4 (u32, not a CompactSize) |
//! | scriptPubKey | length |
//!
//! | CRC-32 (IEEE) of all the bytes above | 4 (u32) |
//!
//! So a record is 8 + Σ (89 + script length) bytes. The checksum catches a
//! damaged file before its values feed the archive or an HTTP answer (the
//! flat-file frame only holds magic and length). The layout is part of the
//! datadir format ([`super::FORMAT_VERSION`] 2.0 added the checksum).

use std::ops::Range;

use bitcoin::consensus::{Decodable, Encodable};
use bitcoin::{OutPoint, Txid};

use crate::primitives::Coin;
use crate::validation::SpentOutput;

/// Fixed bytes of one output in a record, before its scriptPubKey.
const FIXED_BYTES_PER_OUTPUT: usize = 36 + 8 + 4 + 1 + 32 + 4 + 4;

/// A spent-output record that cannot be decoded (checksum mismatch,
/// truncated, trailing bytes, a count or script length past the record's
/// end): the `spent/` file is corrupt.
#[derive(Debug, thiserror::Error)]
#[error("malformed spent-output record: {source}")]
pub struct SpentRecordError {
    /// The decoding failure.
    #[from]
    source: bitcoin::consensus::encode::Error,
}

/// Encodes a block's spent outputs as one record (layout in the module doc).
pub fn encode_spent(spent: &[SpentOutput]) -> Vec<u8> {
    let scripts: usize = spent.iter().map(|s| s.coin.script_pubkey.len()).sum();
    let mut v = Vec::with_capacity(8 + spent.len() * FIXED_BYTES_PER_OUTPUT + scripts);
    encode_into(spent, &mut v).expect("writing to a Vec<u8> cannot fail");
    let crc = crc32fast::hash(&v);
    v.extend_from_slice(&crc.to_le_bytes());
    v
}

fn encode_into(spent: &[SpentOutput], w: &mut Vec<u8>) -> Result<(), std::io::Error> {
    (spent.len() as u32).consensus_encode(w)?;
    for s in spent {
        s.outpoint.consensus_encode(w)?;
        s.coin.value.consensus_encode(w)?;
        s.coin.height.consensus_encode(w)?;
        u8::from(s.coin.coinbase).consensus_encode(w)?;
        s.txid.consensus_encode(w)?;
        s.vin.consensus_encode(w)?;
        (s.coin.script_pubkey.len() as u32).consensus_encode(w)?;
        w.extend_from_slice(&s.coin.script_pubkey);
    }
    Ok(())
}

/// Decodes one record of [`encode_spent`]'s layout.
///
/// # Errors
/// As [`SpentRecord::parse`].
pub fn decode_spent(record: &[u8]) -> Result<Vec<SpentOutput>, SpentRecordError> {
    Ok(SpentRecord::parse(record.to_vec())?.outputs())
}

/// One output of a checked record, its scriptPubKey borrowed from it.
struct Entry<'a> {
    outpoint: OutPoint,
    value: u64,
    height: u32,
    coinbase: bool,
    txid: Txid,
    vin: u32,
    script_pubkey: &'a [u8],
}

impl Entry<'_> {
    fn to_spent_output(&self) -> SpentOutput {
        SpentOutput {
            outpoint: self.outpoint,
            coin: Coin {
                value: bitcoin::Amount::from_sat(self.value),
                script_pubkey: self.script_pubkey.to_vec(),
                height: self.height,
                coinbase: self.coinbase,
            },
            txid: self.txid,
            vin: self.vin,
        }
    }
}

/// Offset of the coinbase flag in an output of a record.
const COINBASE_FLAG_AT: usize = 36 + 8 + 4;
/// Offset of the scriptPubKey length in an output of a record.
const SCRIPT_LEN_AT: usize = FIXED_BYTES_PER_OUTPUT - 4;

/// The length of the output at the front of `r`, checked as [`read_entry`]
/// checks it but without decoding its fields: [`SpentRecord::parse`]
/// walks every output of a record with it.
fn entry_len(r: &[u8]) -> Result<usize, bitcoin::consensus::encode::Error> {
    use bitcoin::consensus::encode::Error;
    let fixed = r
        .first_chunk::<FIXED_BYTES_PER_OUTPUT>()
        .ok_or(Error::ParseFailed("spent-output record truncated"))?;
    if fixed[COINBASE_FLAG_AT] > 1 {
        return Err(Error::ParseFailed("coinbase flag is not 0 or 1"));
    }
    let mut len = [0u8; 4];
    len.copy_from_slice(&fixed[SCRIPT_LEN_AT..]);
    let len = FIXED_BYTES_PER_OUTPUT + u32::from_le_bytes(len) as usize;
    if len > r.len() {
        return Err(Error::ParseFailed("scriptPubKey length exceeds the record"));
    }
    Ok(len)
}

/// Reads the output at the front of `r` and moves past it; the script
/// length is checked against the bytes left before it is borrowed.
fn read_entry<'a>(r: &mut &'a [u8]) -> Result<Entry<'a>, bitcoin::consensus::encode::Error> {
    use bitcoin::consensus::encode::Error;
    let outpoint = OutPoint::consensus_decode(r)?;
    let value = u64::consensus_decode(r)?;
    let height = u32::consensus_decode(r)?;
    let coinbase = match u8::consensus_decode(r)? {
        0 => false,
        1 => true,
        _ => return Err(Error::ParseFailed("coinbase flag is not 0 or 1")),
    };
    let txid = Txid::consensus_decode(r)?;
    let vin = u32::consensus_decode(r)?;
    let len = u32::consensus_decode(r)? as usize;
    let Some((script_pubkey, rest)) = r.split_at_checked(len) else {
        return Err(Error::ParseFailed("scriptPubKey length exceeds the record"));
    };
    *r = rest;
    Ok(Entry {
        outpoint,
        value,
        height,
        coinbase,
        txid,
        vin,
        script_pubkey,
    })
}

/// A spent-output record read back from a `spent/` file, its checksum and
/// layout checked once by [`SpentRecord::parse`], which notes where each
/// output starts; its outputs are then read in place, so a reader that
/// needs one transaction's inputs decodes only those
/// ([`SpentRecord::range`]) instead of the block's (about 100 bytes and one
/// allocation per output).
#[derive(Clone, Debug)]
pub struct SpentRecord {
    /// The record's bytes, checksum included.
    bytes: Vec<u8>,
    /// Offset of each output in `bytes`, in record order.
    starts: Vec<u32>,
}

impl SpentRecord {
    /// Checks `record` (layout in the module doc) without decoding it.
    ///
    /// # Errors
    /// [`SpentRecordError`] when the bytes are not exactly one record
    /// (checksum mismatch, truncated, trailing bytes, a count or script
    /// length past the record's end, a record over 4 GiB). Lengths are
    /// checked against the bytes left before anything is read, so a
    /// corrupt length cannot ask for gigabytes.
    pub fn parse(record: Vec<u8>) -> Result<Self, SpentRecordError> {
        use bitcoin::consensus::encode::Error;
        let Some((bytes, crc)) = record.split_last_chunk::<4>() else {
            return Err(Error::ParseFailed("spent-output record shorter than its checksum").into());
        };
        if crc32fast::hash(bytes) != u32::from_le_bytes(*crc) {
            return Err(Error::ParseFailed("spent-output record checksum mismatch").into());
        }
        let too_long = || Error::ParseFailed("spent-output record over 4 GiB");
        let mut r = bytes;
        let count = u32::consensus_decode(&mut r)? as usize;
        if count > r.len() / FIXED_BYTES_PER_OUTPUT {
            return Err(Error::ParseFailed("spent-output count exceeds the record").into());
        }
        let mut starts = Vec::with_capacity(count);
        for _ in 0..count {
            starts.push(u32::try_from(bytes.len() - r.len()).map_err(|_| too_long())?);
            r = &r[entry_len(r)?..];
        }
        if !r.is_empty() {
            return Err(Error::ParseFailed("trailing bytes after the spent-output record").into());
        }
        Ok(SpentRecord {
            bytes: record,
            starts,
        })
    }

    /// The outputs starting at `starts` (checked by [`SpentRecord::parse`],
    /// so each one reads).
    fn entries<'a>(&'a self, starts: &'a [u32]) -> impl Iterator<Item = Entry<'a>> {
        starts
            .iter()
            .filter_map(|&start| read_entry(&mut &self.bytes[start as usize..]).ok())
    }

    /// Every output of the record, in block order.
    pub fn outputs(&self) -> Vec<SpentOutput> {
        self.entries(&self.starts)
            .map(|e| e.to_spent_output())
            .collect()
    }

    /// The outputs at `indexes` of the record (block order: a transaction's
    /// inputs are the `inputs` outputs after those of the block's earlier
    /// non-coinbase transactions); `None` past its end or for a reversed
    /// range.
    pub fn range(&self, indexes: Range<usize>) -> Option<Vec<SpentOutput>> {
        let starts = self.starts.get(indexes)?;
        Some(self.entries(starts).map(|e| e.to_spent_output()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::hashes::Hash;
    use proptest::prelude::*;

    fn output(seed: u8, script_len: usize) -> SpentOutput {
        SpentOutput {
            outpoint: OutPoint {
                txid: Txid::from_byte_array([seed; 32]),
                vout: u32::from(seed) * 3,
            },
            coin: Coin {
                value: bitcoin::Amount::from_sat(5_000_000_000 + u64::from(seed)),
                script_pubkey: vec![seed; script_len],
                height: 1_000 + u32::from(seed),
                coinbase: seed.is_multiple_of(2),
            },
            txid: Txid::from_byte_array([seed ^ 0xff; 32]),
            vin: u32::from(seed),
        }
    }

    /// The bytes of one record, field by field, as the module doc lays out.
    #[test]
    fn exact_bytes() {
        let s = output(1, 2);
        let mut want = 1u32.to_le_bytes().to_vec();
        want.extend_from_slice(&[1; 32]);
        want.extend_from_slice(&3u32.to_le_bytes());
        want.extend_from_slice(&5_000_000_001u64.to_le_bytes());
        want.extend_from_slice(&1_001u32.to_le_bytes());
        want.push(0);
        want.extend_from_slice(&[0xfe; 32]);
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(&[1, 1]);
        let crc = crc32fast::hash(&want);
        want.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(encode_spent(std::slice::from_ref(&s)), want);
        assert_eq!(want.len(), 8 + FIXED_BYTES_PER_OUTPUT + 2);
        assert_eq!(decode_spent(&want).unwrap(), vec![s]);
        let empty = encode_spent(&[]);
        assert_eq!(empty[..4], [0, 0, 0, 0]);
        assert_eq!(empty[4..], crc32fast::hash(&[0, 0, 0, 0]).to_le_bytes());
    }

    /// `body` (a record without its checksum) with a right checksum.
    fn sealed(mut body: Vec<u8>) -> Vec<u8> {
        let crc = crc32fast::hash(&body);
        body.extend_from_slice(&crc.to_le_bytes());
        body
    }

    #[test]
    fn refuses_malformed_records() {
        let good = encode_spent(&[output(2, 25), output(3, 0)]);
        let body = good[..good.len() - 4].to_vec();
        for cut in 0..good.len() {
            assert!(decode_spent(&good[..cut]).is_err(), "truncated at {cut}");
            // Cut with a checksum made right: the layout check still refuses.
            assert!(decode_spent(&sealed(body[..cut.min(body.len() - 1)].to_vec())).is_err());
        }
        for i in 0..good.len() {
            let mut flipped = good.clone();
            flipped[i] ^= 0x10;
            assert!(decode_spent(&flipped).is_err(), "byte {i} flipped");
        }
        let mut trailing = body.clone();
        trailing.push(0);
        assert!(decode_spent(&sealed(trailing)).is_err());
        let mut huge_count = body.clone();
        huge_count[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_spent(&sealed(huge_count)).is_err());
        let mut bad_flag = body;
        bad_flag[4 + 48] = 2;
        assert!(decode_spent(&sealed(bad_flag)).is_err());
    }

    /// `range` reads the outputs asked for, and only those, in order.
    #[test]
    fn a_range_of_outputs() {
        let all: Vec<SpentOutput> = (1..=4).map(|s| output(s, s as usize * 7)).collect();
        let record = SpentRecord::parse(encode_spent(&all)).unwrap();
        assert_eq!(record.range(1..3), Some(all[1..3].to_vec()));
        assert_eq!(record.range(4..4), Some(vec![]));
        assert_eq!(record.range(3..5), None);
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = record.range(3..2);
        assert_eq!(reversed, None);
        assert_eq!(record.outputs(), all);
    }

    proptest! {
        #[test]
        fn round_trip(shape in proptest::collection::vec((any::<u8>(), 0usize..200), 0..20)) {
            let spent: Vec<SpentOutput> = shape.iter().map(|&(s, l)| output(s, l)).collect();
            prop_assert_eq!(decode_spent(&encode_spent(&spent)).unwrap(), spent);
        }

        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = decode_spent(&bytes);
        }
    }
}
