//! Stale branches: for a reorganisation of depth `d` after the block at
//! height `F`, the generator first builds the best chain's blocks `F+1 ..=
//! F+d+1`, then a rival branch of `d` blocks on `F` from them. The files
//! hold the rival branch first and the best branch after it, so an importer
//! connects the rival blocks (they arrive first and, at equal work, the
//! first seen wins), then switches to the best branch when its block `F+d+1`
//! gives it more work, as in testnet-data/regtest-a.
//!
//! A rival block at height `F+i` holds, from the best chain's block at
//! `F+i`, only transactions whose inputs all exist at `F`: 45% of them
//! byte-identical, 30% replaced by a double spend of the same inputs to
//! another key (so the best chain's version conflicts with it), the rest
//! left out; and some spends of those double spends' outputs, which exist
//! only on the rival branch.

use bitcoin::{Amount, Block, BlockHash, Transaction, TxOut};
use rand::Rng;

use crate::assemble;
use crate::coins::Coin;
use crate::keys::{KeyPool, Kind, POOL_SIZE};
use crate::sign::{sign, Draft};

/// A best-chain block with what the generator knows of it.
pub struct MainBlock {
    /// The block.
    pub block: Block,
    /// Its height.
    pub height: u32,
    /// Per non-coinbase transaction, in block order: the outputs it spends.
    pub spent: Vec<Vec<Coin>>,
    /// Per non-coinbase transaction: its fee, sats.
    pub fees: Vec<u64>,
}

/// Above this weight a best-chain block's rival gets only identical
/// transactions, so it cannot pass the weight limit.
const ROOMY: u64 = 3_500_000;

/// The rival branch on `fork` (height `fork_height`) against `best`, the
/// best chain's blocks after the fork (one more than the rival gets).
pub fn rival_branch(
    rng: &mut impl Rng,
    keys: &KeyPool,
    fork: BlockHash,
    fork_height: u32,
    best: &[MainBlock],
) -> Vec<Block> {
    let depth = best.len().saturating_sub(1);
    let mut prev = fork;
    let mut rival_only: Vec<Coin> = Vec::new();
    let mut out = Vec::with_capacity(depth);
    for main in &best[..depth] {
        let roomy = main.block.weight().to_wu() < ROOMY;
        let mut txs: Vec<(Transaction, u64)> = Vec::new();
        let mut next_rival_only = Vec::new();
        if roomy {
            for coin in rival_only.drain(..) {
                if rng.gen_bool(0.5) {
                    let (t, fee, _) = pay_one(
                        rng,
                        keys,
                        &[coin],
                        1_000,
                        2,
                        main.height - 1,
                        &[0xffff_fffd],
                    );
                    txs.push((t, fee));
                }
            }
        }
        for (j, tx) in main.block.txdata.iter().skip(1).enumerate() {
            if !main.spent[j].iter().all(|c| c.height <= fork_height) {
                continue;
            }
            match rng.gen_range(0..100) {
                0..45 => txs.push((tx.clone(), main.fees[j])),
                45..75 if roomy => {
                    let seqs: Vec<u32> = tx.input.iter().map(|i| i.sequence.0).collect();
                    let (t, fee, key) = pay_one(
                        rng,
                        keys,
                        &main.spent[j],
                        main.fees[j] + 500,
                        tx.version.0,
                        tx.lock_time.to_consensus_u32(),
                        &seqs,
                    );
                    next_rival_only.push(first_output(&t, main.height, key));
                    txs.push((t, fee));
                }
                _ => {}
            }
        }
        rival_only = next_rival_only;
        let block = rival_block(rng, keys, prev, main, txs);
        prev = block.block_hash();
        out.push(block);
    }
    out
}

/// The rival of `main`: same height, a second later, its own coinbase.
fn rival_block(
    rng: &mut impl Rng,
    keys: &KeyPool,
    prev: BlockHash,
    main: &MainBlock,
    txs: Vec<(Transaction, u64)>,
) -> Block {
    let fees: u64 = txs.iter().map(|(_, f)| f).sum();
    let payout = keys.script_pubkey(Kind::P2wpkh, rng.gen_range(0..POOL_SIZE), 0);
    let cb = assemble::coinbase(
        main.height,
        &[(payout, assemble::subsidy(main.height) + fees)],
        b"kakehi-chaingen/rival",
    );
    let txs = txs.into_iter().map(|(t, _)| t).collect();
    assemble::finish(prev, main.block.header.time + 1, cb, txs)
}

/// A transaction spending `coins` into one P2WPKH output to a random key,
/// paying `fee` (less if the coins hold less), with the given nVersion,
/// nLockTime and nSequences (one per coin, or the first for all); with its
/// fee and the key.
fn pay_one(
    rng: &mut impl Rng,
    keys: &KeyPool,
    coins: &[Coin],
    fee: u64,
    version: i32,
    lock_time: u32,
    seqs: &[u32],
) -> (Transaction, u64, u32) {
    let key = rng.gen_range(0..POOL_SIZE);
    let value_in: u64 = coins.iter().map(|c| c.value).sum();
    let fee = fee.min(value_in / 2);
    let draft = Draft {
        version,
        lock_time,
        inputs: coins
            .iter()
            .enumerate()
            .map(|(i, c)| {
                (
                    *c,
                    seqs.get(i).or(seqs.first()).copied().unwrap_or(0xffff_fffd),
                )
            })
            .collect(),
        outputs: vec![TxOut {
            value: Amount::from_sat(value_in - fee),
            script_pubkey: keys.script_pubkey(Kind::P2wpkh, key, 0),
        }],
    };
    (sign(&draft, keys), fee, key)
}

/// The output of `tx` (made by [`pay_one`] to `key`) as a coin created at
/// `height`.
fn first_output(tx: &Transaction, height: u32, key: u32) -> Coin {
    Coin {
        outpoint: bitcoin::OutPoint::new(tx.compute_txid(), 0),
        value: tx.output[0].value.to_sat(),
        height,
        key,
        lock: 0,
        kind: Kind::P2wpkh,
        coinbase: false,
    }
}
