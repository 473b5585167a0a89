//! What the index database stores: block records ([`BlockRecord`]) and the
//! keys of the transaction and spend rows ([`TxRowKey`], [`SpendRowKey`]),
//! with their exact byte layouts.

use bitcoin::block::Header;
use bitcoin::consensus::{deserialize, serialize};
use bitcoin::hashes::Hash;
use bitcoin::Txid;

use super::{runs, Codec, FileLoc};
use crate::chain::index::BlockStatus;
use crate::primitives::BlockId;

/// Leading bytes of a txid kept in the keys of `tx_by_txid_prefix` and
/// `spend_by_outpoint_prefix` (electrs's layout): 8 bytes tell 10⁷
/// transactions apart but for about one pair in 2⁴⁰; a row is a candidate,
/// checked against the block (or spent-output) files it points at, which
/// hold the full txids.
pub const TXID_PREFIX_LEN: usize = 8;

/// The first [`TXID_PREFIX_LEN`] bytes of `txid` (internal byte order).
pub fn txid_prefix(txid: &Txid) -> [u8; TXID_PREFIX_LEN] {
    let mut p = [0u8; TXID_PREFIX_LEN];
    p.copy_from_slice(&txid.as_byte_array()[..TXID_PREFIX_LEN]);
    p
}

/// Key of `tx_by_txid_prefix` (16 bytes, value empty): txid prefix (8) ‖
/// `BlockId` u32 BE ‖ position in the block u32 BE. A candidate location
/// of every transaction whose txid starts with the prefix.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TxRowKey {
    /// [`txid_prefix`] of the transaction.
    pub prefix: [u8; TXID_PREFIX_LEN],
    /// A block that contains it.
    pub block: BlockId,
    /// Its position in that block.
    pub position: u32,
}

impl TxRowKey {
    /// The 16-byte key.
    pub fn to_bytes(&self) -> [u8; runs::TX_KEY] {
        let mut k = [0u8; runs::TX_KEY];
        k[..TXID_PREFIX_LEN].copy_from_slice(&self.prefix);
        k[8..12].copy_from_slice(&self.block.0.to_be_bytes());
        k[12..].copy_from_slice(&self.position.to_be_bytes());
        k
    }
}

impl Codec for TxRowKey {
    fn encode(&self) -> Vec<u8> {
        self.to_bytes().to_vec()
    }
    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != TXID_PREFIX_LEN + 8 {
            return None;
        }
        let (prefix, rest) = b.split_at(TXID_PREFIX_LEN);
        Some(TxRowKey {
            prefix: prefix.try_into().ok()?,
            block: BlockId(u32::decode(&rest[..4])?),
            position: u32::decode(&rest[4..])?,
        })
    }
}

/// Key of `spend_by_outpoint_prefix` (16 bytes, value empty): the spent
/// outpoint's txid prefix (8) ‖ its vout u32 BE ‖ the spending block's
/// `BlockId` u32 BE. The spender (txid, input) is in that block's
/// spent-output record (`spent/` files), which is checked to name the
/// outpoint.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SpendRowKey {
    /// [`txid_prefix`] of the spent outpoint's txid.
    pub prefix: [u8; TXID_PREFIX_LEN],
    /// The spent outpoint's output index.
    pub vout: u32,
    /// A connected block that spends an outpoint with this prefix and vout.
    pub block: BlockId,
}

impl SpendRowKey {
    /// The 16-byte key.
    pub fn to_bytes(&self) -> [u8; runs::SPEND_KEY] {
        let mut k = [0u8; runs::SPEND_KEY];
        k[..12].copy_from_slice(&spend_prefix(&self.prefix, self.vout));
        k[12..].copy_from_slice(&self.block.0.to_be_bytes());
        k
    }
}

impl Codec for SpendRowKey {
    fn encode(&self) -> Vec<u8> {
        self.to_bytes().to_vec()
    }
    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != TXID_PREFIX_LEN + 8 {
            return None;
        }
        let (prefix, rest) = b.split_at(TXID_PREFIX_LEN);
        Some(SpendRowKey {
            prefix: prefix.try_into().ok()?,
            vout: u32::decode(&rest[..4])?,
            block: BlockId(u32::decode(&rest[4..])?),
        })
    }
}

/// The 12-byte key prefix of an outpoint in `spend_by_outpoint_prefix`.
pub(super) fn spend_prefix(prefix: &[u8; TXID_PREFIX_LEN], vout: u32) -> [u8; TXID_PREFIX_LEN + 4] {
    let mut v = [0u8; TXID_PREFIX_LEN + 4];
    v[..TXID_PREFIX_LEN].copy_from_slice(prefix);
    v[TXID_PREFIX_LEN..].copy_from_slice(&vout.to_be_bytes());
    v
}

/// The spender of an outpoint: the spending transaction and its input.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SpendRecord {
    /// The spending transaction.
    pub txid: Txid,
    /// Its input that spends the outpoint.
    pub vin: u32,
}

/// What the index database keeps per block.
///
/// Layout (all integers big-endian): header (80) ‖ height u32 ‖ chainwork
/// (32, BE) ‖ status u8 ‖ prev u32 (`u32::MAX` = none) ‖ data loc (file u32,
/// offset u64, len u32; len 0 = none) ‖ filter loc (16) ‖ spent loc (16) ‖
/// filter header (32, internal order) ‖ txouts u64 ‖ total sats u64 ‖
/// tx count u32 ‖ reject reason length u8 ‖ reject reason (ASCII).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockRecord {
    /// The 80-byte header.
    pub header: Header,
    /// Height.
    pub height: u32,
    /// Cumulative chainwork, big-endian.
    pub chainwork: [u8; 32],
    /// Validation status.
    pub status: BlockStatus,
    /// Parent id, `None` for genesis.
    pub prev: Option<BlockId>,
    /// Raw block in `blocks/`.
    pub data: Option<FileLoc>,
    /// BIP-158 basic filter in `filters/` (once connected).
    pub filter: Option<FileLoc>,
    /// Spent outputs (prevouts) in `spent/` (once connected).
    pub spent: Option<FileLoc>,
    /// BIP-158 filter header (once connected), internal byte order.
    pub filter_header: [u8; 32],
    /// UTXO count on this block's branch after it (once connected).
    pub txouts: u64,
    /// Sum of those UTXOs, sats.
    pub total_sats: u64,
    /// Number of transactions.
    pub tx_count: u32,
    /// Core-style reject reason when invalid (at most 255 bytes).
    pub reject_reason: String,
}

fn put_loc(v: &mut Vec<u8>, loc: Option<FileLoc>) {
    let l = loc.unwrap_or_default();
    v.extend_from_slice(&l.file.to_be_bytes());
    v.extend_from_slice(&l.offset.to_be_bytes());
    v.extend_from_slice(&(if loc.is_some() { l.len } else { 0 }).to_be_bytes());
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
    fn arr32(&mut self) -> Option<[u8; 32]> {
        self.take(32)?.try_into().ok()
    }
    fn loc(&mut self) -> Option<Option<FileLoc>> {
        let file = self.u32()?;
        let offset = self.u64()?;
        let len = self.u32()?;
        Some((len > 0).then_some(FileLoc { file, offset, len }))
    }
}

impl Codec for BlockRecord {
    fn encode(&self) -> Vec<u8> {
        let mut v = serialize(&self.header);
        v.extend_from_slice(&self.height.to_be_bytes());
        v.extend_from_slice(&self.chainwork);
        v.push(self.status.to_u8());
        v.extend_from_slice(&self.prev.map(|p| p.0).unwrap_or(u32::MAX).to_be_bytes());
        put_loc(&mut v, self.data);
        put_loc(&mut v, self.filter);
        put_loc(&mut v, self.spent);
        v.extend_from_slice(&self.filter_header);
        v.extend_from_slice(&self.txouts.to_be_bytes());
        v.extend_from_slice(&self.total_sats.to_be_bytes());
        v.extend_from_slice(&self.tx_count.to_be_bytes());
        let reason = self.reject_reason.as_bytes();
        let n = reason.len().min(255);
        v.push(n as u8);
        v.extend_from_slice(&reason[..n]);
        v
    }

    fn decode(b: &[u8]) -> Option<Self> {
        let mut r = Reader(b);
        let header: Header = deserialize(r.take(80)?).ok()?;
        let height = r.u32()?;
        let chainwork = r.arr32()?;
        let status = BlockStatus::from_u8(r.u8()?)?;
        let prev = match r.u32()? {
            u32::MAX => None,
            p => Some(BlockId(p)),
        };
        let data = r.loc()?;
        let filter = r.loc()?;
        let spent = r.loc()?;
        let filter_header = r.arr32()?;
        let txouts = r.u64()?;
        let total_sats = r.u64()?;
        let tx_count = r.u32()?;
        let n = r.u8()? as usize;
        let reject_reason = String::from_utf8(r.take(n)?.to_vec()).ok()?;
        if !r.0.is_empty() {
            return None;
        }
        Some(BlockRecord {
            header,
            height,
            chainwork,
            status,
            prev,
            data,
            filter,
            spent,
            filter_header,
            txouts,
            total_sats,
            tx_count,
            reject_reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_record_exact_bytes_round_trip() {
        let header = bitcoin::blockdata::constants::genesis_block(bitcoin::Network::Regtest).header;
        let rec = BlockRecord {
            header,
            height: 7,
            chainwork: [1u8; 32],
            status: BlockStatus::Valid,
            prev: Some(BlockId(6)),
            data: Some(FileLoc {
                file: 1,
                offset: 8,
                len: 300,
            }),
            filter: None,
            spent: Some(FileLoc {
                file: 0,
                offset: 16,
                len: 3,
            }),
            filter_header: [2u8; 32],
            txouts: 10,
            total_sats: 5_000_000_000,
            tx_count: 1,
            reject_reason: "bad-cb-amount".into(),
        };
        let bytes = rec.encode();
        assert_eq!(
            bytes.len(),
            80 + 4 + 32 + 1 + 4 + 16 * 3 + 32 + 8 + 8 + 4 + 1 + 13
        );
        assert_eq!(&bytes[80..84], &7u32.to_be_bytes());
        assert_eq!(BlockRecord::decode(&bytes), Some(rec));
        assert_eq!(BlockRecord::decode(&bytes[..bytes.len() - 1]), None);
    }
}
