//! The spent-output records of the `spent/` flat files: for every connected
//! block, the outputs its transactions spent (prevout, coin, spender), in
//! block order. Read back for BIP-158 filters of stored blocks, the archive
//! (spent outputs of final blocks become leaves) and outspend lookups.
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
//! datadir format (`store::FORMAT_VERSION` 2.0 added the checksum).

use std::io::Cursor;

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
/// [`SpentRecordError`] when the bytes are not exactly one record. The
/// count and script lengths are checked against the bytes left before
/// anything is allocated, so a corrupt length cannot ask for gigabytes.
pub fn decode_spent(record: &[u8]) -> Result<Vec<SpentOutput>, SpentRecordError> {
    use bitcoin::consensus::encode::Error;
    let Some((bytes, crc)) = record.split_last_chunk::<4>() else {
        return Err(Error::ParseFailed("spent-output record shorter than its checksum").into());
    };
    if crc32fast::hash(bytes) != u32::from_le_bytes(*crc) {
        return Err(Error::ParseFailed("spent-output record checksum mismatch").into());
    }
    let mut r = Cursor::new(bytes);
    let left = |r: &Cursor<&[u8]>| bytes.len() - r.position() as usize;
    let n = u32::consensus_decode(&mut r)? as usize;
    if n > left(&r) / FIXED_BYTES_PER_OUTPUT {
        return Err(Error::ParseFailed("spent-output count exceeds the record").into());
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let outpoint = OutPoint::consensus_decode(&mut r)?;
        let value = u64::consensus_decode(&mut r)?;
        let height = u32::consensus_decode(&mut r)?;
        let coinbase = match u8::consensus_decode(&mut r)? {
            0 => false,
            1 => true,
            _ => return Err(Error::ParseFailed("coinbase flag is not 0 or 1").into()),
        };
        let txid = Txid::consensus_decode(&mut r)?;
        let vin = u32::consensus_decode(&mut r)?;
        let len = u32::consensus_decode(&mut r)? as usize;
        if len > left(&r) {
            return Err(Error::ParseFailed("scriptPubKey length exceeds the record").into());
        }
        let start = r.position() as usize;
        let script_pubkey = bytes[start..start + len].to_vec();
        r.set_position((start + len) as u64);
        out.push(SpentOutput {
            outpoint,
            coin: Coin {
                value: bitcoin::Amount::from_sat(value),
                script_pubkey,
                height,
                coinbase,
            },
            txid,
            vin,
        });
    }
    if left(&r) != 0 {
        return Err(Error::ParseFailed("trailing bytes after the spent-output record").into());
    }
    Ok(out)
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
