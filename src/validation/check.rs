//! The checks of a block that need no UTXO ([`check_block`]: Core's
//! `CheckBlock` then `ContextualCheckBlock`) and of a transaction's
//! structure ([`check_transaction`]: Core's `CheckTransaction`).

use std::collections::HashSet;

use bitcoin::blockdata::script::Builder;
use bitcoin::hashes::Hash;
use bitcoin::{Block, Transaction, TxMerkleNode, Txid};

use super::sigops::{self, WITNESS_SCALE_FACTOR};
use super::{
    is_final_tx, merkle, BlockContext, BlockError, MAX_BLOCK_SIGOPS_COST, MAX_BLOCK_WEIGHT,
    MAX_MONEY, WITNESS_COMMITMENT_HEADER,
};

/// The block's size without witness data, in bytes.
fn stripped_size(block: &Block) -> usize {
    let count_size = bitcoin::VarInt::from(block.txdata.len()).size();
    bitcoin::block::Header::SIZE
        + count_size
        + block
            .txdata
            .iter()
            .map(Transaction::base_size)
            .sum::<usize>()
}

/// Core's `CheckTransaction` (`src/consensus/tx_check.cpp`): at least one
/// input and one output, size without witness within the block limit,
/// output values and their sum within 0..=MAX_MONEY, no outpoint spent
/// twice, a coinbase scriptSig of 2..=100 bytes, no null prevout outside
/// the coinbase.
///
/// # Errors
/// The first failed rule as a [`BlockError`] (`bad-txns-*`, `bad-cb-length`).
pub fn check_transaction(tx: &Transaction) -> Result<(), BlockError> {
    check_tx_structure(tx, tx.compute_txid())
}

/// [`check_transaction`] with the txid already computed.
fn check_tx_structure(tx: &Transaction, txid: Txid) -> Result<(), BlockError> {
    if tx.input.is_empty() {
        return Err(BlockError::NoInputs { txid });
    }
    if tx.output.is_empty() {
        return Err(BlockError::NoOutputs { txid });
    }
    let stripped_size = tx.base_size();
    if stripped_size as u64 * WITNESS_SCALE_FACTOR > MAX_BLOCK_WEIGHT {
        return Err(BlockError::TransactionOversize {
            txid,
            stripped_size,
        });
    }
    let mut total: u64 = 0;
    for (vout, output) in tx.output.iter().enumerate() {
        let vout = vout as u32;
        let value = output.value.to_sat();
        // Core's CAmount is signed: a value with the top bit set is negative.
        if (value as i64) < 0 {
            return Err(BlockError::NegativeOutput {
                txid,
                vout,
                value: value as i64,
            });
        }
        if value > MAX_MONEY {
            return Err(BlockError::OutputTooLarge { txid, vout, value });
        }
        total = match total.checked_add(value) {
            Some(t) if t <= MAX_MONEY => t,
            _ => return Err(BlockError::OutputTotalTooLarge { txid }),
        };
    }
    if tx.input.len() > 1 {
        let mut seen = HashSet::with_capacity(tx.input.len());
        for input in &tx.input {
            if !seen.insert(input.previous_output) {
                return Err(BlockError::DuplicateInput {
                    txid,
                    outpoint: input.previous_output,
                });
            }
        }
    }
    if tx.is_coinbase() {
        let length = tx.input[0].script_sig.len();
        if !(2..=100).contains(&length) {
            return Err(BlockError::CoinbaseLength { length });
        }
    } else {
        for (vin, input) in tx.input.iter().enumerate() {
            if input.previous_output.is_null() {
                return Err(BlockError::NullPrevout {
                    txid,
                    vin: vin as u32,
                });
            }
        }
    }
    Ok(())
}

/// Checks that need no UTXO, in Core's order (`CheckBlock`, then
/// `ContextualCheckBlock`):
///
/// 1. merkle root (`bad-txnmrklroot`) and its CVE-2012-2459 mutation
///    (`bad-txns-duplicate`);
/// 2. at least one transaction and ≤ 1,000,000 bytes without witness
///    (`bad-blk-length`);
/// 3. the first transaction and only it is a coinbase (`bad-cb-missing`,
///    `bad-cb-multiple`);
/// 4. every transaction's structure (`bad-txns-vin-empty`, `-vout-empty`,
///    `-oversize`, `-vout-negative`, `-vout-toolarge`,
///    `-txouttotal-toolarge`, `-inputs-duplicate`, `bad-cb-length`,
///    `bad-txns-prevout-null`);
/// 5. legacy sigops × 4 ≤ 80,000 (`bad-blk-sigops`);
/// 6. finality of every transaction against the height and, once CSV
///    (BIP113) is active, the parent's MTP, else the block time
///    (`bad-txns-nonfinal`);
/// 7. BIP34 height push at the start of the coinbase scriptSig when active
///    (`bad-cb-height`);
/// 8. the witness commitment when segwit is active and the coinbase has one
///    (`bad-witness-nonce-size`, `bad-witness-merkle-match`), else no
///    witness anywhere (`unexpected-witness`);
/// 9. weight ≤ 4,000,000 (`bad-blk-weight`).
///
/// The header's proof of work and timestamps are the chain index's.
///
/// # Errors
///
/// The first failed rule as a [`BlockError`].
pub fn check_block(block: &Block, ctx: &BlockContext) -> Result<(), BlockError> {
    let txids: Vec<Txid> = block.txdata.iter().map(Transaction::compute_txid).collect();
    check_merkle_root(block, &txids)?;
    let coinbase = check_size_and_coinbase(block, &txids)?;
    for (tx, txid) in block.txdata.iter().zip(&txids) {
        check_tx_structure(tx, *txid)?;
    }
    let legacy: u64 = block.txdata.iter().map(sigops::legacy_sigops).sum();
    if legacy * WITNESS_SCALE_FACTOR > MAX_BLOCK_SIGOPS_COST {
        return Err(BlockError::TooManySigops {
            cost: legacy * WITNESS_SCALE_FACTOR,
        });
    }
    check_finality(block, &txids, ctx)?;
    if ctx.height >= ctx.params.bip34_height {
        check_bip34_height(coinbase, ctx.height)?;
    }
    check_witness_commitment(block, coinbase, &txids, ctx)?;
    let weight = block.weight().to_wu();
    if weight > MAX_BLOCK_WEIGHT {
        return Err(BlockError::Weight { weight });
    }
    Ok(())
}

/// Rule 1 of [`check_block`]: the header's merkle root is the root of
/// `txids`, and the tree is not mutated (CVE-2012-2459).
fn check_merkle_root(block: &Block, txids: &[Txid]) -> Result<(), BlockError> {
    let leaves: Vec<[u8; 32]> = txids.iter().map(|t| t.to_byte_array()).collect();
    let (root, mutated) = merkle::merkle_root_mutated(&leaves);
    let computed = TxMerkleNode::from_byte_array(root);
    if computed != block.header.merkle_root {
        return Err(BlockError::BadMerkleRoot {
            header: block.header.merkle_root,
            computed,
        });
    }
    if mutated {
        return Err(BlockError::MutatedMerkleTree);
    }
    Ok(())
}

/// Rules 2 and 3 of [`check_block`]: the transaction count and stripped
/// size within the weight limit, and a coinbase first and only first.
/// Returns the coinbase.
fn check_size_and_coinbase<'b>(
    block: &'b Block,
    txids: &[Txid],
) -> Result<&'b Transaction, BlockError> {
    let stripped = stripped_size(block);
    let bad_length = || BlockError::BadLength {
        tx_count: block.txdata.len(),
        stripped_size: stripped,
    };
    let Some(coinbase) = block.txdata.first() else {
        return Err(bad_length());
    };
    if block.txdata.len() as u64 * WITNESS_SCALE_FACTOR > MAX_BLOCK_WEIGHT
        || stripped as u64 * WITNESS_SCALE_FACTOR > MAX_BLOCK_WEIGHT
    {
        return Err(bad_length());
    }
    if !coinbase.is_coinbase() {
        return Err(BlockError::CoinbaseMissing);
    }
    for (index, tx) in block.txdata.iter().enumerate().skip(1) {
        if tx.is_coinbase() {
            return Err(BlockError::MultipleCoinbases {
                index,
                txid: txids[index],
            });
        }
    }
    Ok(coinbase)
}

/// Rule 6 of [`check_block`]: every transaction is final (BIP113: against
/// the parent's MTP once CSV is active, else the block's time).
fn check_finality(block: &Block, txids: &[Txid], ctx: &BlockContext) -> Result<(), BlockError> {
    let cutoff = if ctx.height >= ctx.params.csv_height {
        ctx.prev_median_time_past
    } else {
        block.header.time
    };
    for (tx, txid) in block.txdata.iter().zip(txids) {
        if !is_final_tx(tx, ctx.height, cutoff) {
            return Err(BlockError::NonFinal {
                txid: *txid,
                lock_time: tx.lock_time.to_consensus_u32(),
            });
        }
    }
    Ok(())
}

/// Rule 7 of [`check_block`] (BIP34): the coinbase scriptSig starts with
/// `CScript() << height`.
fn check_bip34_height(coinbase: &Transaction, height: u32) -> Result<(), BlockError> {
    let expected = Builder::new().push_int(i64::from(height)).into_script();
    if coinbase.input[0]
        .script_sig
        .as_bytes()
        .starts_with(expected.as_bytes())
    {
        Ok(())
    } else {
        Err(BlockError::CoinbaseHeight { height })
    }
}

/// Rule 8 of [`check_block`] (BIP141): once segwit is active, the last
/// coinbase output carrying a witness commitment commits to the block's
/// witness root with a 32-byte reserved value; without one, no
/// transaction has witness data.
fn check_witness_commitment(
    block: &Block,
    coinbase: &Transaction,
    txids: &[Txid],
    ctx: &BlockContext,
) -> Result<(), BlockError> {
    let commitment = if ctx.height >= ctx.params.segwit_height {
        coinbase.output.iter().rev().find(|o| {
            let spk = o.script_pubkey.as_bytes();
            spk.len() >= 38 && spk[..6] == WITNESS_COMMITMENT_HEADER
        })
    } else {
        None
    };
    let Some(output) = commitment else {
        for (tx, txid) in block.txdata.iter().zip(txids) {
            if tx.input.iter().any(|i| !i.witness.is_empty()) {
                return Err(BlockError::UnexpectedWitness { txid: *txid });
            }
        }
        return Ok(());
    };
    let witness = &coinbase.input[0].witness;
    let reserved = match witness.nth(0) {
        Some(item) if witness.len() == 1 && item.len() == 32 => item,
        _ => {
            return Err(BlockError::WitnessNonceSize {
                items: witness.len(),
            })
        }
    };
    let matches = block.witness_root().is_some_and(|root| {
        Block::compute_witness_commitment(&root, reserved).to_byte_array()[..]
            == output.script_pubkey.as_bytes()[6..38]
    });
    if matches {
        Ok(())
    } else {
        Err(BlockError::WitnessMerkleMatch)
    }
}
