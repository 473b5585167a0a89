//! BIP-158 basic compact block filters and the BIP-157 filter-header chain.
//!
//! A basic filter is a Golomb-coded set (P = 19, M = 784,931, SipHash key =
//! the first 16 bytes of the block hash) of:
//! - every output script of the block except `OP_RETURN` scripts, and
//! - the script of every output the block spends (coinbase excluded),
//!
//! with empty scripts left out and duplicates counted once. Serialized, it
//! is a CompactSize element count followed by the coded set. The filter
//! header chains filters: `double-SHA256(filter_hash || previous_header)`,
//! where `filter_hash = double-SHA256(filter bytes)` and the genesis block's
//! previous header is 32 zero bytes.
//!
//! [`FilterHeader`]'s `Display` is the reversed (RPC) byte order, as Core's
//! REST interface and bcoin show headers.
//!
//! The coding is rust-bitcoin's [`bitcoin::bip158`]; this module supplies
//! the spent scripts and checks they match the block's inputs.
//!
//! Source: BIP-158, BIP-157 (filter headers; both in `docs/references.md`), Bitcoin Core
//! `src/blockfilter.cpp` (`BasicFilterElements`).

use std::collections::HashMap;

use bitcoin::bip158::{self, BlockFilter, FilterHash, FilterHeader};
use bitcoin::hashes::Hash;
use bitcoin::{Block, OutPoint, ScriptBuf};

/// Why a filter could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FilterError {
    /// The number of spent scripts given differs from the number of
    /// non-coinbase inputs of the block.
    #[error("block has {expected} non-coinbase inputs but {got} spent scripts were given")]
    SpentScriptCount {
        /// Non-coinbase inputs in the block.
        expected: usize,
        /// Spent scripts supplied.
        got: usize,
    },
    /// No script was found for an outpoint the block spends.
    #[error("no script for spent output {outpoint}")]
    MissingSpentScript {
        /// The outpoint.
        outpoint: OutPoint,
    },
    /// rust-bitcoin's filter writer failed (it writes to memory, so only a
    /// bug or allocation failure can cause this).
    #[error("BIP-158 filter encoding failed")]
    Encoding {
        /// The underlying error.
        #[source]
        source: bip158::Error,
    },
}

impl From<bip158::Error> for FilterError {
    fn from(source: bip158::Error) -> Self {
        match source {
            bip158::Error::UtxoMissing(outpoint) => FilterError::MissingSpentScript { outpoint },
            source => FilterError::Encoding { source },
        }
    }
}

/// Number of inputs of `block` outside the coinbase (the first transaction).
fn spending_inputs(block: &Block) -> usize {
    block.txdata.iter().skip(1).map(|tx| tx.input.len()).sum()
}

/// The BIP-158 basic filter of `block`, given the scripts of the outputs its
/// non-coinbase inputs spend: one per input, e.g.
/// `effects.spent.iter().map(|s| s.coin.script_pubkey.as_slice())` from
/// [`crate::validation::BlockEffects::spent`]. The filter is a set, so the
/// order does not matter; the count is checked.
///
/// Empty scripts may be passed; they are left out of the filter, as BIP-158
/// requires.
///
/// # Errors
///
/// [`FilterError::SpentScriptCount`] if the number of scripts differs from
/// the number of non-coinbase inputs.
pub fn basic_filter<'s, I>(block: &Block, spent_scripts: I) -> Result<BlockFilter, FilterError>
where
    I: IntoIterator<Item = &'s [u8]>,
{
    let expected = spending_inputs(block);
    let scripts: Vec<&[u8]> = spent_scripts.into_iter().collect();
    if scripts.len() != expected {
        return Err(FilterError::SpentScriptCount {
            expected,
            got: scripts.len(),
        });
    }
    let mut content = Vec::new();
    let mut writer = bip158::BlockFilterWriter::new(&mut content, block);
    writer.add_output_scripts();
    for script in scripts {
        // The writer skips empty elements (BIP-158: "nor ... empty scripts").
        writer.add_element(script);
    }
    writer.finish().map_err(|e| FilterError::Encoding {
        source: bip158::Error::Io(e),
    })?;
    Ok(BlockFilter { content })
}

/// The BIP-158 basic filter of `block`, looking up each spent output's
/// script in `spent_scripts` by outpoint (rust-bitcoin's
/// [`BlockFilter::new_script_filter`]).
///
/// # Errors
///
/// [`FilterError::MissingSpentScript`] for the first spent outpoint not in
/// the map.
pub fn basic_filter_from_map(
    block: &Block,
    spent_scripts: &HashMap<OutPoint, ScriptBuf>,
) -> Result<BlockFilter, FilterError> {
    let filter = BlockFilter::new_script_filter(block, |outpoint| {
        spent_scripts
            .get(outpoint)
            .map(|s| s.as_script())
            .ok_or(bip158::Error::UtxoMissing(*outpoint))
    })?;
    Ok(filter)
}

/// The filter's hash, `double-SHA256(filter bytes)` (BIP-157): what a
/// `cfheaders` message lists and what the header commits to.
pub fn filter_hash(filter: &BlockFilter) -> FilterHash {
    FilterHash::hash(&filter.content)
}

/// The header of `filter` given the previous block's filter header (BIP-157):
/// `double-SHA256(double-SHA256(filter) || previous)`, 32 bytes.
pub fn filter_header(filter: &BlockFilter, previous: &FilterHeader) -> FilterHeader {
    filter.filter_header(previous)
}

/// The "previous filter header" of the genesis block: 32 zero bytes.
pub fn genesis_previous_header() -> FilterHeader {
    FilterHeader::all_zeros()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::absolute::LockTime;
    use bitcoin::block::{Header, Version};
    use bitcoin::hashes::Hash;
    use bitcoin::transaction::Version as TxVersion;
    use bitcoin::{
        Amount, CompactTarget, Sequence, Transaction, TxIn, TxMerkleNode, TxOut, Witness,
    };
    use proptest::prelude::*;

    fn tx(prevout: OutPoint, scripts: &[Vec<u8>]) -> Transaction {
        Transaction {
            version: TxVersion::TWO,
            lock_time: LockTime::ZERO,
            input: vec![TxIn {
                previous_output: prevout,
                script_sig: ScriptBuf::new(),
                sequence: Sequence::MAX,
                witness: Witness::new(),
            }],
            output: scripts
                .iter()
                .map(|s| TxOut {
                    value: Amount::from_sat(1),
                    script_pubkey: ScriptBuf::from_bytes(s.clone()),
                })
                .collect(),
        }
    }

    /// Scripts: empty, OP_RETURN-led (0x6a) or anything (0..40 bytes).
    fn script() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(Vec::new()),
            proptest::collection::vec(any::<u8>(), 0..20).prop_map(|mut v| {
                v.insert(0, 0x6a);
                v
            }),
            proptest::collection::vec(any::<u8>(), 1..40),
        ]
    }

    proptest! {
        /// The property of the `filters` fuzz target (`fuzz/`), in CI: every
        /// element BIP-158 puts in a block's basic filter matches it (a
        /// false negative would hide a payment from a light client), empty
        /// and OP_RETURN output scripts are left out, and a spent-script
        /// count that does not fit the block is refused.
        #[test]
        fn every_element_of_the_block_matches_its_filter(
            outputs in proptest::collection::vec(proptest::collection::vec(script(), 1..4), 1..6),
            spent in proptest::collection::vec(script(), 1..6),
            nonce in any::<u32>(),
        ) {
            let txdata: Vec<Transaction> = outputs
                .iter()
                .enumerate()
                .map(|(i, outs)| {
                    let prevout = if i == 0 {
                        OutPoint::null()
                    } else {
                        OutPoint { txid: bitcoin::Txid::from_byte_array([i as u8; 32]), vout: 0 }
                    };
                    tx(prevout, outs)
                })
                .collect();
            let block = Block {
                header: Header {
                    version: Version::TWO,
                    prev_blockhash: bitcoin::BlockHash::all_zeros(),
                    merkle_root: TxMerkleNode::all_zeros(),
                    time: 0,
                    bits: CompactTarget::from_consensus(0x207f_ffff),
                    nonce,
                },
                txdata,
            };
            let inputs = outputs.len() - 1;
            let scripts: Vec<&[u8]> = (0..inputs).map(|i| spent[i % spent.len()].as_slice()).collect();
            let filter = basic_filter(&block, scripts.iter().copied()).unwrap();
            let hash = block.block_hash();
            let outs = outputs.iter().flatten().map(|s| s.as_slice());
            for element in outs.clone().chain(scripts.iter().copied()) {
                let included = !element.is_empty() && (element[0] != 0x6a || scripts.contains(&element));
                if included {
                    prop_assert!(filter.match_any(&hash, &mut std::iter::once(element)).unwrap());
                }
            }
            prop_assert!(basic_filter(&block, scripts.iter().copied().chain([&b"x"[..]])).is_err());
        }
    }
}
