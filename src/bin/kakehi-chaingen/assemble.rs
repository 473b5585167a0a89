//! Blocks as Bitcoin Core's miner makes them on regtest
//! (node/miner.cpp `BlockAssembler::CreateNewBlock`, Core 30): a coinbase
//! whose scriptSig starts with the BIP-34 height push, nLockTime = height - 1
//! with a non-final nSequence, the BIP-141 witness commitment as its last
//! output and the 32-byte zero reserved value as its witness; version
//! 0x20000000; regtest's fixed target (nBits 0x207fffff, no retargeting)
//! met by grinding the nonce.

use bitcoin::absolute::LockTime;
use bitcoin::block::{Header, Version as BlockVersion};
use bitcoin::hashes::Hash;
use bitcoin::transaction::Version;
use bitcoin::{
    Amount, Block, BlockHash, CompactTarget, OutPoint, ScriptBuf, Sequence, Transaction, TxIn,
    TxMerkleNode, TxOut, Witness,
};

/// Regtest's proof-of-work limit in compact form (chainparams.cpp,
/// `CRegTestParams`: `powLimit` 7fffff00…, genesis nBits 0x207fffff).
pub const REGTEST_BITS: u32 = 0x207f_ffff;
/// Blocks between subsidy halvings on regtest (`nSubsidyHalvingInterval`).
pub const HALVING_INTERVAL: u32 = 150;
/// BIP-141's commitment header: OP_RETURN, push 36, 0xaa21a9ed.
const COMMITMENT_PREFIX: [u8; 6] = [0x6a, 0x24, 0xaa, 0x21, 0xa9, 0xed];

/// The block subsidy at `height` on regtest, sats (validation.cpp
/// `GetBlockSubsidy`: 50 BTC halved every 150 blocks, 0 after 64 halvings).
pub fn subsidy(height: u32) -> u64 {
    let halvings = height / HALVING_INTERVAL;
    if halvings >= 64 {
        0
    } else {
        (50 * 100_000_000u64) >> halvings
    }
}

/// A coinbase at `height` paying `payouts` (scriptPubKey, sats); `tag` is
/// pushed after the height so rival blocks at one height differ.
pub fn coinbase(height: u32, payouts: &[(ScriptBuf, u64)], tag: &[u8]) -> Transaction {
    let mut script_sig = bitcoin::script::Builder::new().push_int(i64::from(height));
    if let Ok(tag) = <&bitcoin::script::PushBytes>::try_from(tag) {
        script_sig = script_sig.push_slice(tag);
    }
    Transaction {
        version: Version::TWO,
        lock_time: LockTime::from_consensus(height.saturating_sub(1)),
        input: vec![TxIn {
            previous_output: OutPoint::null(),
            script_sig: script_sig.into_script(),
            sequence: Sequence::ENABLE_LOCKTIME_NO_RBF,
            witness: Witness::from_slice(&[[0u8; 32]]),
        }],
        output: payouts
            .iter()
            .map(|(script, value)| TxOut {
                value: Amount::from_sat(*value),
                script_pubkey: script.clone(),
            })
            .collect(),
    }
}

/// The block of `coinbase` (without its commitment yet) and `txs` on
/// `prev`, stamped `time`: witness commitment added, merkle root set, nonce
/// ground until the header meets regtest's target.
pub fn finish(prev: BlockHash, time: u32, coinbase: Transaction, txs: Vec<Transaction>) -> Block {
    let mut txdata = Vec::with_capacity(txs.len() + 1);
    txdata.push(coinbase);
    txdata.extend(txs);
    let mut block = Block {
        header: Header {
            version: BlockVersion::from_consensus(0x2000_0000),
            prev_blockhash: prev,
            merkle_root: TxMerkleNode::all_zeros(),
            time,
            bits: CompactTarget::from_consensus(REGTEST_BITS),
            nonce: 0,
        },
        txdata,
    };
    add_witness_commitment(&mut block);
    block.header.merkle_root = block
        .compute_merkle_root()
        .expect("a block holds at least its coinbase");
    grind(&mut block.header);
    block
}

/// Appends the BIP-141 commitment output to the coinbase (witness root with
/// the coinbase's wtxid as zero, reserved value 32 zero bytes).
fn add_witness_commitment(block: &mut Block) {
    let root = block
        .witness_root()
        .expect("a block holds at least its coinbase");
    let commitment = Block::compute_witness_commitment(&root, &[0u8; 32]);
    let mut script = COMMITMENT_PREFIX.to_vec();
    script.extend_from_slice(commitment.as_byte_array());
    block.txdata[0].output.push(TxOut {
        value: Amount::ZERO,
        script_pubkey: ScriptBuf::from_bytes(script),
    });
}

/// Increments the nonce until the header's hash meets its target (about
/// two tries at regtest's target).
pub fn grind(header: &mut Header) {
    let target = header.target();
    while !target.is_met_by(header.block_hash()) {
        header.nonce = header.nonce.wrapping_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regtest_subsidy_halves_every_150_blocks() {
        assert_eq!(subsidy(1), 5_000_000_000);
        assert_eq!(subsidy(149), 5_000_000_000);
        assert_eq!(subsidy(150), 2_500_000_000);
        assert_eq!(subsidy(150 * 33), 0); // 5e9 >> 33
        assert_eq!(subsidy(150 * 64), 0);
    }

    #[test]
    fn blocks_carry_core_shaped_coinbases_and_valid_work() {
        let genesis = bitcoin::constants::genesis_block(bitcoin::Network::Regtest);
        let payout = ScriptBuf::new_op_return([1u8; 4]);
        for height in [1u32, 16, 17, 300] {
            let cb = coinbase(height, &[(payout.clone(), 7)], b"t");
            let block = finish(genesis.block_hash(), genesis.header.time + 1, cb, vec![]);
            let push = bitcoin::script::Builder::new().push_int(i64::from(height));
            let script_sig = block.txdata[0].input[0].script_sig.as_bytes();
            assert!(script_sig.starts_with(push.as_bytes()), "{height}");
            assert_eq!(
                script_sig.len(),
                push.as_bytes().len() + 2,
                "height, then the 1-byte tag"
            );
            assert!(block.check_witness_commitment());
            assert!(block.check_merkle_root());
            assert!(block.header.validate_pow(block.header.target()).is_ok());
        }
    }
}
