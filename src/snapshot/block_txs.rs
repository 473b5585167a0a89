//! One transaction of a stored block, without decoding or hashing the
//! others: the serialized block's transactions are located by walking
//! their length fields (consensus encoding with BIP-144's witness
//! serialization), then only the one asked for is decoded.
//!
//! A whole-block read ([`super::ChainSnapshot::read_block`]) decodes every
//! transaction and hashes each twice (merkle root, witness commitment) to
//! check the block; a reader that wants one transaction out of thousands
//! (a txid lookup, a row of the address index) pays that for every row.
//! Here it pays one walk over the bytes and one transaction's decode; the
//! caller checks what it read against an index that commits to it (the
//! txid it asked for, or the txid index row of the position).

use bitcoin::consensus::Decodable;
use bitcoin::Transaction;

use super::ReadError;
use super::StoredBlock;

/// Where a transaction is: in its block's bytes, and in its block's
/// spent-output record ([`crate::store::spent`], one output per input of
/// the block's non-coinbase transactions, in block order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TxPlace {
    /// Offset in the serialized block, bytes.
    pub(super) offset: usize,
    /// Index in the record of the output its first input spends (for the
    /// coinbase, which spends none: 0).
    pub(super) first_spent: usize,
    /// Inputs (outputs of the record it spends: 0 for the coinbase).
    pub(super) spent: usize,
}

/// A stored block's bytes with each of its transactions' places.
pub(super) struct BlockTxs {
    stored: StoredBlock,
    places: Vec<TxPlace>,
}

impl BlockTxs {
    /// Locates every transaction of `stored`.
    ///
    /// # Errors
    /// [`ReadError::CorruptRecord`] when the bytes are not a header, a
    /// transaction count and that many transactions (a damaged file).
    pub(super) fn locate(stored: StoredBlock) -> Result<Self, ReadError> {
        match tx_places(&stored.raw) {
            Some(places) => Ok(BlockTxs { stored, places }),
            None => Err(stored.corrupt("does not decode")),
        }
    }

    /// The transaction at `position` (`None` past the last one), decoded
    /// from its own bytes only, and its place.
    ///
    /// # Errors
    /// [`ReadError::CorruptRecord`] when those bytes do not decode.
    pub(super) fn tx(&self, position: u32) -> Result<Option<(Transaction, TxPlace)>, ReadError> {
        let Some(&place) = self.places.get(position as usize) else {
            return Ok(None);
        };
        let mut r = &self.stored.raw[place.offset..];
        Transaction::consensus_decode(&mut r)
            .map(|tx| Some((tx, place)))
            .map_err(|_| self.stored.corrupt("does not decode"))
    }

    /// The error for a transaction of this block failing a check.
    pub(super) fn corrupt(&self, reason: &'static str) -> ReadError {
        self.stored.corrupt(reason)
    }
}

/// The place of each transaction of the serialized block `raw` (80-byte
/// header, CompactSize count, transactions); `None` when a length runs
/// past the end or bytes are left after the last transaction. Lengths are
/// taken as written (a non-minimal CompactSize is not refused here:
/// decoding the transaction found, or the check of its hash, refuses it).
pub(super) fn tx_places(raw: &[u8]) -> Option<Vec<TxPlace>> {
    let mut r = raw.get(80..)?;
    let count = compact_size(&mut r)?;
    // Each transaction is at least 10 bytes (version, two counts, lock
    // time): a corrupt count cannot ask for more places than that.
    let mut places = Vec::with_capacity(usize::try_from(count).ok()?.min(r.len() / 10));
    let mut first_spent = 0;
    for position in 0..count {
        let offset = raw.len() - r.len();
        let inputs = skip_tx(&mut r)?;
        let spent = if position == 0 { 0 } else { inputs };
        places.push(TxPlace {
            offset,
            first_spent,
            spent,
        });
        first_spent += spent;
    }
    r.is_empty().then_some(places)
}

/// Moves `r` past one serialized transaction (BIP-144: a zero input count
/// followed by flag 1 marks the witness serialization); its input count.
fn skip_tx(r: &mut &[u8]) -> Option<usize> {
    skip(r, 4)?;
    let mut inputs = usize::try_from(compact_size(r)?).ok()?;
    let witness = inputs == 0 && r.first() == Some(&1);
    if witness {
        skip(r, 1)?;
        inputs = usize::try_from(compact_size(r)?).ok()?;
    }
    for _ in 0..inputs {
        skip(r, 36)?;
        skip_bytes(r)?;
        skip(r, 4)?;
    }
    for _ in 0..compact_size(r)? {
        skip(r, 8)?;
        skip_bytes(r)?;
    }
    if witness {
        for _ in 0..inputs {
            for _ in 0..compact_size(r)? {
                skip_bytes(r)?;
            }
        }
    }
    skip(r, 4)?;
    Some(inputs)
}

/// A CompactSize integer.
fn compact_size(r: &mut &[u8]) -> Option<u64> {
    let (&first, rest) = r.split_first()?;
    *r = rest;
    let width = match first {
        0xfd => 2,
        0xfe => 4,
        0xff => 8,
        n => return Some(u64::from(n)),
    };
    let (bytes, rest) = r.split_at_checked(width)?;
    *r = rest;
    let mut le = [0u8; 8];
    le[..width].copy_from_slice(bytes);
    Some(u64::from_le_bytes(le))
}

/// A CompactSize length and that many bytes.
fn skip_bytes(r: &mut &[u8]) -> Option<()> {
    let n = compact_size(r)?;
    skip(r, usize::try_from(n).ok()?)
}

fn skip(r: &mut &[u8], n: usize) -> Option<()> {
    *r = r.get(n..)?;
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::consensus::serialize;
    use bitcoin::hashes::Hash;
    use bitcoin::{absolute, transaction, Amount, OutPoint, ScriptBuf, Sequence, TxIn, TxOut};
    use bitcoin::{Txid, Witness};
    use proptest::prelude::*;

    /// A transaction with `inputs` inputs (script and witness sizes from
    /// `sizes`) and `outputs` outputs; with no witness at all it has the
    /// legacy serialization.
    fn tx(inputs: &[(usize, Vec<usize>)], outputs: &[usize]) -> Transaction {
        Transaction {
            version: transaction::Version::TWO,
            lock_time: absolute::LockTime::ZERO,
            input: (0u32..)
                .zip(inputs)
                .map(|(i, (script, witness))| TxIn {
                    previous_output: OutPoint::new(Txid::from_byte_array([i as u8; 32]), i),
                    script_sig: ScriptBuf::from_bytes(vec![0x51; *script]),
                    sequence: Sequence::MAX,
                    witness: Witness::from_slice(
                        &witness.iter().map(|&n| vec![7u8; n]).collect::<Vec<_>>(),
                    ),
                })
                .collect(),
            output: outputs
                .iter()
                .map(|&n| TxOut {
                    value: Amount::from_sat(n as u64),
                    script_pubkey: ScriptBuf::from_bytes(vec![0x6a; n]),
                })
                .collect(),
        }
    }

    /// A serialized block (a zeroed header) holding `txs`.
    fn block_bytes(txs: &[Transaction]) -> Vec<u8> {
        let mut raw = vec![0u8; 80];
        raw.extend_from_slice(&serialize(&bitcoin::VarInt(txs.len() as u64)));
        for t in txs {
            raw.extend_from_slice(&serialize(t));
        }
        raw
    }

    /// Sizes that cross every CompactSize width's boundary below 0x10000.
    fn size() -> impl Strategy<Value = usize> {
        prop_oneof![0usize..4, 250usize..256, 0xfff0usize..0x10004]
    }

    fn shape() -> impl Strategy<Value = (Vec<(usize, Vec<usize>)>, Vec<usize>)> {
        (
            proptest::collection::vec((size(), proptest::collection::vec(0usize..80, 0..3)), 0..4),
            proptest::collection::vec(size(), 0..4),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Every offset found is where rust-bitcoin's encoding put the
        /// transaction, legacy and witness serializations alike, the
        /// transaction decoded there is the one written, and its outputs
        /// in the spent-output record follow the earlier transactions'
        /// inputs (the first, the coinbase, has none there).
        #[test]
        fn offsets_are_where_each_transaction_starts(shapes in proptest::collection::vec(shape(), 0..5)) {
            // A transaction without inputs serializes as the witness marker:
            // give each at least one, as every valid transaction has.
            let txs: Vec<Transaction> = shapes
                .iter()
                .map(|(i, o)| if i.is_empty() { tx(&[(1, vec![])], o) } else { tx(i, o) })
                .collect();
            let raw = block_bytes(&txs);
            let places = tx_places(&raw).expect("a well-formed block");
            let mut at = 80 + serialize(&bitcoin::VarInt(txs.len() as u64)).len();
            let mut first_spent = 0;
            prop_assert_eq!(places.len(), txs.len());
            for (position, (t, place)) in txs.iter().zip(&places).enumerate() {
                let spent = if position == 0 { 0 } else { t.input.len() };
                prop_assert_eq!(*place, TxPlace { offset: at, first_spent, spent });
                let mut r = &raw[place.offset..];
                prop_assert_eq!(&Transaction::consensus_decode(&mut r).unwrap(), t);
                at += serialize(t).len();
                first_spent += spent;
            }
            // Cut anywhere, or with a byte more, the walk refuses it.
            for cut in [raw.len() - 1, raw.len() / 2, 80] {
                prop_assert!(tx_places(&raw[..cut]).is_none());
            }
            let mut longer = raw.clone();
            longer.push(0);
            prop_assert!(tx_places(&longer).is_none());
        }

        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = tx_places(&bytes);
        }
    }

    /// A count of 2^64 - 1 transactions in a short block is refused without
    /// reserving memory for it.
    #[test]
    fn a_huge_count_is_refused() {
        let mut raw = vec![0u8; 80];
        raw.extend_from_slice(&[0xff; 9]);
        assert_eq!(tx_places(&raw), None);
    }
}
