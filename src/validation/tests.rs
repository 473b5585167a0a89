//! Unit tests per rule, with small constructed blocks, for the rules the
//! real regtest-a data has no case for (tests/it/validation_regtest.rs covers
//! the 19 real invalid blocks and the whole real chain).

use super::*;
use std::collections::HashMap;

use bitcoin::absolute::LockTime;
use bitcoin::block::{Header, Version as BlockVersion};
use bitcoin::blockdata::script::Builder;
use bitcoin::hashes::sha256d;
use bitcoin::hashes::Hash;
use bitcoin::transaction::Version;
use bitcoin::{Amount, CompactTarget, ScriptBuf, Sequence, TxIn, TxOut, Witness};

const HEIGHT: u32 = 1000;
/// MTP of the parent of the test block, seconds.
const PREV_MTP: u32 = 1_700_000_000;

fn regtest() -> ChainParams {
    ChainParams::new(Network::Regtest)
}

/// A fake txid for funding coins.
fn funding_txid(n: u32) -> Txid {
    Txid::from_raw_hash(sha256d::Hash::hash(&n.to_le_bytes()))
}

fn p2wpkh() -> ScriptBuf {
    ScriptBuf::from_bytes([vec![0x00, 0x14], vec![7u8; 20]].concat())
}

fn coin(value: u64, script: ScriptBuf, height: u32, coinbase: bool) -> Coin {
    Coin {
        value: bitcoin::Amount::from_sat(value),
        script_pubkey: script.to_bytes(),
        height,
        coinbase,
    }
}

fn input(outpoint: OutPoint) -> TxIn {
    TxIn {
        previous_output: outpoint,
        script_sig: ScriptBuf::new(),
        sequence: Sequence::MAX,
        witness: Witness::new(),
    }
}

fn tx(inputs: Vec<TxIn>, outputs: Vec<(u64, ScriptBuf)>) -> Transaction {
    Transaction {
        version: Version::TWO,
        lock_time: LockTime::ZERO,
        input: inputs,
        output: outputs
            .into_iter()
            .map(|(v, s)| TxOut {
                value: Amount::from_sat(v),
                script_pubkey: s,
            })
            .collect(),
    }
}

/// A coinbase for `height` paying `value` to OP_TRUE, with the BIP34 push.
fn coinbase(height: u32, value: u64) -> Transaction {
    let script_sig = Builder::new()
        .push_int(i64::from(height))
        .push_int(0x1234)
        .into_script();
    let mut cb = tx(
        vec![input(OutPoint::null())],
        vec![(value, ScriptBuf::from_bytes(vec![0x51]))],
    );
    cb.input[0].script_sig = script_sig;
    cb
}

/// Sets the witness commitment (if any transaction has a witness) and the
/// merkle root.
fn seal(mut block: Block) -> Block {
    if block
        .txdata
        .iter()
        .any(|t| t.input.iter().any(|i| !i.witness.is_empty()))
    {
        block.txdata[0].input[0].witness = Witness::from_slice(&[[0u8; 32]]);
        // Push a placeholder commitment so the coinbase shape is final
        // (the coinbase wtxid counts as zero, so its content does not matter).
        let mut script = WITNESS_COMMITMENT_HEADER.to_vec();
        script.extend_from_slice(&[0u8; 32]);
        block.txdata[0].output.push(TxOut {
            value: Amount::ZERO,
            script_pubkey: script.into(),
        });
        let root = block.witness_root().expect("non-empty");
        let commitment = Block::compute_witness_commitment(&root, &[0u8; 32]);
        let last = block.txdata[0].output.len() - 1;
        let mut bytes = block.txdata[0].output[last].script_pubkey.to_bytes();
        bytes[6..38].copy_from_slice(&commitment.to_byte_array());
        block.txdata[0].output[last].script_pubkey = bytes.into();
    }
    block.header.merkle_root = block.compute_merkle_root().expect("non-empty");
    block
}

/// A block at [`HEIGHT`]: a coinbase paying `cb_value`, then `txs`.
fn block(cb_value: u64, txs: Vec<Transaction>) -> Block {
    let header = Header {
        version: BlockVersion::from_consensus(0x2000_0000),
        prev_blockhash: BlockHash::all_zeros(),
        merkle_root: TxMerkleNode::all_zeros(),
        time: PREV_MTP + 600,
        bits: CompactTarget::from_consensus(0x207f_ffff),
        nonce: 0,
    };
    let mut txdata = vec![coinbase(HEIGHT, cb_value)];
    txdata.extend(txs);
    seal(Block { header, txdata })
}

/// MTP of every height h: PREV_MTP - 600 × (HEIGHT - 1 - h).
fn mtp_at(h: u32) -> Option<u32> {
    (h < HEIGHT).then(|| PREV_MTP - 600 * (HEIGHT - 1 - h))
}

fn ctx<'a>(params: &'a ChainParams, block: &Block) -> BlockContext<'a> {
    BlockContext {
        params,
        height: HEIGHT,
        block_hash: block.block_hash(),
        prev_median_time_past: PREV_MTP,
        median_time_past_at: &mtp_at,
    }
}

fn validate(block: &Block, coins: &HashMap<OutPoint, Coin>) -> Result<BlockEffects, BlockError> {
    let params = regtest();
    let ctx = ctx(&params, block);
    check_block(block, &ctx)?;
    connect_block(block, &ctx, coins)
}

fn reason(result: Result<BlockEffects, BlockError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(e) => e.reject_reason(),
    }
}

/// One funding coin per (value, script, height, coinbase), outpoints
/// `funding_txid(i):0`.
fn funding(coins: &[(u64, ScriptBuf, u32, bool)]) -> (Vec<OutPoint>, HashMap<OutPoint, Coin>) {
    let outpoints: Vec<OutPoint> = (0..coins.len() as u32)
        .map(|i| OutPoint {
            txid: funding_txid(i),
            vout: 0,
        })
        .collect();
    let map = outpoints
        .iter()
        .zip(coins)
        .map(|(o, (v, s, h, cb))| (*o, coin(*v, s.clone(), *h, *cb)))
        .collect();
    (outpoints, map)
}

fn subsidy() -> u64 {
    regtest().block_subsidy(HEIGHT)
}

#[test]
fn valid_block_effects() {
    let (ops, coins) = funding(&[(100_000, p2wpkh(), 500, false)]);
    let a = tx(
        vec![input(ops[0])],
        vec![(60_000, p2wpkh()), (30_000, p2wpkh())],
    );
    let a_id = a.compute_txid();
    // b spends a:1 in the same block; it also creates an OP_RETURN output.
    let b = tx(
        vec![input(OutPoint {
            txid: a_id,
            vout: 1,
        })],
        vec![
            (29_000, p2wpkh()),
            (0, ScriptBuf::from_bytes(vec![0x6a, 0x01, 0x01])),
        ],
    );
    let b_id = b.compute_txid();
    let fees = 10_000 + 1_000;
    let blk = block(subsidy() + fees, vec![a, b]);
    // The store is read for ops[0] only: a:1 comes from the block itself.
    assert_eq!(spent_outpoints(&blk), vec![ops[0]]);
    let effects = validate(&blk, &coins).expect("valid");
    assert_eq!(effects.fees, fees);
    let created: Vec<OutPoint> = effects.created.iter().map(|c| c.0).collect();
    let cb_id = blk.txdata[0].compute_txid();
    assert_eq!(
        created,
        vec![
            OutPoint {
                txid: cb_id,
                vout: 0
            },
            OutPoint {
                txid: a_id,
                vout: 0
            },
            OutPoint {
                txid: a_id,
                vout: 1
            },
            OutPoint {
                txid: b_id,
                vout: 0
            },
        ],
        "OP_RETURN outputs are not created; coinbase first; same-block-spent included"
    );
    assert!(effects.created[0].1.coinbase);
    assert!(effects.created.iter().all(|c| c.1.height == HEIGHT));
    let spent: Vec<(OutPoint, Txid, u32)> = effects
        .spent
        .iter()
        .map(|s| (s.outpoint, s.txid, s.vin))
        .collect();
    assert_eq!(
        spent,
        vec![
            (ops[0], a_id, 0),
            (
                OutPoint {
                    txid: a_id,
                    vout: 1
                },
                b_id,
                0
            )
        ]
    );
    assert_eq!(effects.spent[1].coin.value.to_sat(), 30_000);
    // Coinbase: legacy 0 (OP_TRUE, push-only scriptSig); two P2WPKH spends: 1 each.
    assert_eq!(effects.sigop_cost, 2);
    // Claiming one more sat is bad-cb-amount.
    let blk = block(subsidy() + fees + 1, blk.txdata[1..].to_vec());
    assert_eq!(reason(validate(&blk, &coins)), "bad-cb-amount");
}

#[test]
fn same_block_spends_only_of_earlier_outputs() {
    let (ops, coins) = funding(&[(100_000, p2wpkh(), 500, false)]);
    let a = tx(
        vec![input(ops[0])],
        vec![(90_000, p2wpkh()), (0, ScriptBuf::from_bytes(vec![0x6a]))],
    );
    let a_id = a.compute_txid();
    let spend_a0 = tx(
        vec![input(OutPoint {
            txid: a_id,
            vout: 0,
        })],
        vec![(80_000, p2wpkh())],
    );
    // Later transaction's output spent first: missing.
    let blk = block(subsidy(), vec![spend_a0.clone(), a.clone()]);
    assert_eq!(
        reason(validate(&blk, &coins)),
        "bad-txns-inputs-missingorspent"
    );
    // The OP_RETURN output never exists.
    let spend_ret = tx(
        vec![input(OutPoint {
            txid: a_id,
            vout: 1,
        })],
        vec![(0, p2wpkh())],
    );
    let blk = block(subsidy(), vec![a.clone(), spend_ret]);
    assert_eq!(
        reason(validate(&blk, &coins)),
        "bad-txns-inputs-missingorspent"
    );
    // Two transactions spending the same outpoint: the second fails.
    let twice = tx(
        vec![input(OutPoint {
            txid: a_id,
            vout: 0,
        })],
        vec![(70_000, p2wpkh())],
    );
    let blk = block(subsidy(), vec![a.clone(), spend_a0.clone(), twice]);
    match validate(&blk, &coins) {
        Err(BlockError::MissingOrSpent { outpoint, vin, .. }) => {
            assert_eq!(
                (outpoint, vin),
                (
                    OutPoint {
                        txid: a_id,
                        vout: 0
                    },
                    0
                )
            )
        }
        other => panic!("{other:?}"),
    }
    // In order it is valid.
    let blk = block(subsidy() + 20_000, vec![a, spend_a0]);
    assert_eq!(reason(validate(&blk, &coins)), "ok");
}

#[test]
fn coinbase_maturity_boundary_is_100_blocks() {
    for (coin_height, expected) in [
        (HEIGHT - 100, "ok"),
        (HEIGHT - 99, "bad-txns-premature-spend-of-coinbase"),
    ] {
        let (ops, coins) = funding(&[(5_000_000_000, p2wpkh(), coin_height, true)]);
        let spend = tx(vec![input(ops[0])], vec![(4_999_000_000, p2wpkh())]);
        let blk = block(subsidy() + 1_000_000, vec![spend]);
        assert_eq!(
            reason(validate(&blk, &coins)),
            expected,
            "coin at {coin_height}"
        );
    }
    // A non-coinbase coin of the previous block is spendable at once.
    let (ops, coins) = funding(&[(5_000, p2wpkh(), HEIGHT - 1, false)]);
    let blk = block(
        subsidy(),
        vec![tx(vec![input(ops[0])], vec![(5_000, p2wpkh())])],
    );
    assert_eq!(reason(validate(&blk, &coins)), "ok");
    // A same-block coinbase output is immature.
    let cb_id = block(subsidy(), vec![]).txdata[0].compute_txid();
    let spend_cb = tx(
        vec![input(OutPoint {
            txid: cb_id,
            vout: 0,
        })],
        vec![(1, p2wpkh())],
    );
    let blk = block(subsidy(), vec![spend_cb]);
    // (the coinbase is the same, so the outpoint is right)
    assert_eq!(blk.txdata[0].compute_txid(), cb_id);
    assert_eq!(
        reason(validate(&blk, &HashMap::new())),
        "bad-txns-premature-spend-of-coinbase"
    );
}

#[test]
fn values_out_of_range() {
    let (ops, coins) = funding(&[(1_000, p2wpkh(), 500, false)]);
    let two_max = tx(
        vec![input(ops[0])],
        vec![(MAX_MONEY, p2wpkh()), (MAX_MONEY, p2wpkh())],
    );
    assert_eq!(
        reason(validate(&block(subsidy(), vec![two_max]), &coins)),
        "bad-txns-txouttotal-toolarge"
    );
    let negative = tx(vec![input(ops[0])], vec![(u64::MAX, p2wpkh())]);
    match validate(&block(subsidy(), vec![negative]), &coins) {
        Err(BlockError::NegativeOutput { value, vout, .. }) => assert_eq!((value, vout), (-1, 0)),
        other => panic!("{other:?}"),
    }
    let big = tx(vec![input(ops[0])], vec![(1u64 << 62, p2wpkh())]);
    assert_eq!(
        reason(validate(&block(subsidy(), vec![big]), &coins)),
        "bad-txns-vout-toolarge"
    );
    // A coin above MAX_MONEY in the store: input values out of range.
    let (ops, coins) = funding(&[(MAX_MONEY + 1, p2wpkh(), 500, false)]);
    let spend = tx(vec![input(ops[0])], vec![(1, p2wpkh())]);
    assert_eq!(
        reason(validate(&block(subsidy(), vec![spend]), &coins)),
        "bad-txns-inputvalues-outofrange"
    );
    // Outputs above inputs.
    let (ops, coins) = funding(&[(1_000, p2wpkh(), 500, false)]);
    let over = tx(vec![input(ops[0])], vec![(1_001, p2wpkh())]);
    match validate(&block(subsidy(), vec![over]), &coins) {
        Err(BlockError::InBelowOut {
            value_in,
            value_out,
            ..
        }) => assert_eq!((value_in, value_out), (1_000, 1_001)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn transaction_structure() {
    let (ops, coins) = funding(&[(1_000, p2wpkh(), 500, false), (1_000, p2wpkh(), 500, false)]);
    let no_in = tx(vec![], vec![(1, p2wpkh())]);
    assert_eq!(
        reason(validate(&block(subsidy(), vec![no_in]), &coins)),
        "bad-txns-vin-empty"
    );
    let no_out = tx(vec![input(ops[0])], vec![]);
    assert_eq!(
        reason(validate(&block(subsidy(), vec![no_out]), &coins)),
        "bad-txns-vout-empty"
    );
    let dup = tx(vec![input(ops[0]), input(ops[0])], vec![(1, p2wpkh())]);
    match validate(&block(subsidy(), vec![dup]), &coins) {
        Err(BlockError::DuplicateInput { outpoint, .. }) => assert_eq!(outpoint, ops[0]),
        other => panic!("{other:?}"),
    }
    let null = tx(
        vec![input(ops[1]), input(OutPoint::null())],
        vec![(1, p2wpkh())],
    );
    match validate(&block(subsidy(), vec![null]), &coins) {
        Err(BlockError::NullPrevout { vin, .. }) => assert_eq!(vin, 1),
        other => panic!("{other:?}"),
    }
    let second_cb = coinbase(HEIGHT, 0);
    assert_eq!(
        reason(validate(&block(subsidy(), vec![second_cb]), &coins)),
        "bad-cb-multiple"
    );
    // No coinbase at all.
    let mut blk = block(
        subsidy(),
        vec![tx(vec![input(ops[0])], vec![(1, p2wpkh())])],
    );
    blk.txdata.remove(0);
    let blk = seal(blk);
    assert_eq!(reason(validate(&blk, &coins)), "bad-cb-missing");
    // No transactions.
    let mut blk = block(subsidy(), vec![]);
    blk.txdata.clear();
    blk.header.merkle_root = TxMerkleNode::all_zeros();
    assert_eq!(reason(validate(&blk, &coins)), "bad-blk-length");
}

#[test]
fn coinbase_script_sig_length_and_bip34() {
    for (len, expected) in [
        (1usize, "bad-cb-length"),
        (2, "ok"),
        (100, "ok"),
        (101, "bad-cb-length"),
    ] {
        let mut blk = block(subsidy(), vec![]);
        // The BIP34 push for 1000 is 3 bytes (02 e8 03): lengths < 3 fail BIP34
        // unless BIP34 is off; check the length rule alone with BIP34 off.
        let mut script = vec![0x02, 0xe8, 0x03];
        script.resize(len, 0x00);
        blk.txdata[0].input[0].script_sig = ScriptBuf::from_bytes(script);
        let blk = seal(blk);
        let mut params = regtest();
        params.bip34_height = u32::MAX;
        let c = ctx(&params, &blk);
        let got = match check_block(&blk, &c) {
            Ok(()) => "ok",
            Err(e) => e.reject_reason(),
        };
        assert_eq!(got, expected, "scriptSig of {len} bytes");
    }
    // BIP34: height 1000 pushed as 999 is bad-cb-height; OP_1..OP_16 for small heights.
    let mut blk = block(subsidy(), vec![]);
    blk.txdata[0].input[0].script_sig = Builder::new().push_int(999).push_int(7).into_script();
    let blk = seal(blk);
    assert_eq!(reason(validate(&blk, &HashMap::new())), "bad-cb-height");
    let params = regtest();
    let mut small = coinbase(5, params.block_subsidy(5));
    assert_eq!(small.input[0].script_sig.as_bytes()[0], 0x55, "OP_5");
    small.input[0].script_sig = Builder::new().push_int(5).push_int(0).into_script();
    let blk = seal(Block {
        header: block(0, vec![]).header,
        txdata: vec![small],
    });
    let c = BlockContext {
        height: 5,
        ..ctx(&params, &blk)
    };
    assert_eq!(check_block(&blk, &c), Ok(()));
}

#[test]
fn merkle_root_and_mutation() {
    let (ops, coins) = funding(&[(1_000, p2wpkh(), 500, false)]);
    let a = tx(vec![input(ops[0])], vec![(900, p2wpkh())]);
    let mut blk = block(subsidy() + 100, vec![a.clone()]);
    assert_eq!(reason(validate(&blk, &coins)), "ok");
    blk.header.merkle_root = TxMerkleNode::all_zeros();
    assert!(matches!(
        validate(&blk, &coins),
        Err(BlockError::BadMerkleRoot { .. })
    ));
    // [cb, a] -> [cb, a, a'] where a' = a duplicated at the end of an odd list:
    // build [cb, a, b] then append b again: same root, mutated.
    let b = tx(
        vec![input(OutPoint {
            txid: a.compute_txid(),
            vout: 0,
        })],
        vec![(800, p2wpkh())],
    );
    let honest = block(subsidy() + 200, vec![a, b.clone()]);
    let mut mutated = honest.clone();
    mutated.txdata.push(b);
    assert_eq!(
        mutated.compute_merkle_root(),
        Some(honest.header.merkle_root)
    );
    let err = validate(&mutated, &coins).expect_err("mutated");
    assert_eq!(err.reject_reason(), "bad-txns-duplicate");
    assert!(err.is_mutation());
    assert_eq!(reason(validate(&honest, &coins)), "ok");
}

#[test]
fn witness_commitment_rules() {
    let (ops, coins) = funding(&[(1_000, p2wpkh(), 500, false)]);
    let mut a = tx(vec![input(ops[0])], vec![(900, p2wpkh())]);
    a.input[0].witness = Witness::from_slice(&[vec![1u8; 72], vec![2u8; 33]]);
    let good = block(subsidy() + 100, vec![a.clone()]);
    assert_eq!(reason(validate(&good, &coins)), "ok");

    // Commitment present but the reserved value is not one 32-byte item.
    let mut bad = good.clone();
    bad.txdata[0].input[0].witness = Witness::from_slice(&[[0u8; 31]]);
    bad.header.merkle_root = bad.compute_merkle_root().expect("root");
    assert_eq!(reason(validate(&bad, &coins)), "bad-witness-nonce-size");

    // Commitment bytes wrong.
    let mut bad = good.clone();
    let last = bad.txdata[0].output.len() - 1;
    let mut spk = bad.txdata[0].output[last].script_pubkey.to_bytes();
    spk[10] ^= 1;
    bad.txdata[0].output[last].script_pubkey = spk.into();
    bad.header.merkle_root = bad.compute_merkle_root().expect("root");
    let err = validate(&bad, &coins).expect_err("bad commitment");
    assert_eq!(err.reject_reason(), "bad-witness-merkle-match");
    assert!(err.is_mutation());

    // Witness without commitment.
    let mut bad = good.clone();
    bad.txdata[0].output.pop();
    bad.txdata[0].input[0].witness = Witness::new();
    bad.header.merkle_root = bad.compute_merkle_root().expect("root");
    assert_eq!(reason(validate(&bad, &coins)), "unexpected-witness");

    // Before segwit activation a commitment is ignored and witnesses are unexpected.
    let mut params = regtest();
    params.segwit_height = HEIGHT + 1;
    let c = ctx(&params, &good);
    assert_eq!(
        check_block(&good, &c).map_err(|e| e.reject_reason()),
        Err("unexpected-witness")
    );
}

#[test]
fn block_weight_limit() {
    // One transaction with a large witness: 4,000,000 WU exactly is fine,
    // one more byte of witness is not.
    let (ops, coins) = funding(&[(1_000, p2wpkh(), 500, false)]);
    let make = |witness_len: usize| {
        let mut a = tx(vec![input(ops[0])], vec![(900, p2wpkh())]);
        a.input[0].witness = Witness::from_slice(&[vec![0u8; witness_len]]);
        block(subsidy() + 100, vec![a])
    };
    let base = make(1_000).weight().to_wu();
    let fill = (MAX_BLOCK_WEIGHT - base) as usize + 1_000;
    let exact = make(fill);
    // The witness item's length prefix grows from 3 to 5 bytes past 65,535.
    let exact = if exact.weight().to_wu() > MAX_BLOCK_WEIGHT {
        make(fill - (exact.weight().to_wu() - MAX_BLOCK_WEIGHT) as usize)
    } else {
        exact
    };
    assert_eq!(exact.weight().to_wu(), MAX_BLOCK_WEIGHT);
    assert_eq!(reason(validate(&exact, &coins)), "ok");
    let over = make(fill + 1);
    assert!(over.weight().to_wu() > MAX_BLOCK_WEIGHT);
    match validate(&over, &coins) {
        Err(BlockError::Weight { weight }) => assert_eq!(weight, over.weight().to_wu()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn finality_by_height_and_median_time_past() {
    let (ops, coins) = funding(&[(1_000, p2wpkh(), 500, false)]);
    let with_lock = |lock: u32, sequence: u32| {
        let mut a = tx(vec![input(ops[0])], vec![(900, p2wpkh())]);
        a.lock_time = LockTime::from_consensus(lock);
        a.input[0].sequence = Sequence(sequence);
        block(subsidy() + 100, vec![a])
    };
    let nonfinal = 0xffff_fffe;
    assert_eq!(
        reason(validate(&with_lock(HEIGHT - 1, nonfinal), &coins)),
        "ok"
    );
    assert_eq!(
        reason(validate(&with_lock(HEIGHT, nonfinal), &coins)),
        "bad-txns-nonfinal"
    );
    // All sequences final: the lock time is ignored.
    assert_eq!(reason(validate(&with_lock(HEIGHT, u32::MAX), &coins)), "ok");
    // Time locks compare with the parent's MTP (BIP113), not the block time.
    assert_eq!(
        reason(validate(&with_lock(PREV_MTP - 1, nonfinal), &coins)),
        "ok"
    );
    assert_eq!(
        reason(validate(&with_lock(PREV_MTP, nonfinal), &coins)),
        "bad-txns-nonfinal"
    );
    // Before CSV activation the block's own time (PREV_MTP + 600) is the cutoff.
    let mut params = regtest();
    params.csv_height = HEIGHT + 1;
    let blk = with_lock(PREV_MTP + 599, nonfinal);
    assert_eq!(check_block(&blk, &ctx(&params, &blk)), Ok(()));
    let blk = with_lock(PREV_MTP + 600, nonfinal);
    assert!(check_block(&blk, &ctx(&params, &blk)).is_err());
}

#[test]
fn bip68_height_and_time_locks() {
    const TYPE: u32 = 1 << 22;
    const DISABLE: u32 = 1 << 31;
    let coin_height = 900;
    let (ops, coins) = funding(&[(1_000, p2wpkh(), coin_height, false)]);
    let spend = |version: i32, sequence: u32| {
        let mut a = tx(vec![input(ops[0])], vec![(900, p2wpkh())]);
        a.version = Version(version);
        a.input[0].sequence = Sequence(sequence);
        block(subsidy() + 100, vec![a])
    };
    // Height: coin_height + n - 1 < HEIGHT, i.e. n <= 100.
    assert_eq!(reason(validate(&spend(2, 100), &coins)), "ok");
    assert_eq!(
        reason(validate(&spend(2, 101), &coins)),
        "bad-txns-nonfinal"
    );
    // Version 1 and the disable flag turn BIP68 off.
    assert_eq!(reason(validate(&spend(1, 101), &coins)), "ok");
    assert_eq!(reason(validate(&spend(2, DISABLE | 101), &coins)), "ok");
    // Versions are compared unsigned, as in Core: -1 is 0xffffffff >= 2.
    assert_eq!(
        reason(validate(&spend(-1, 101), &coins)),
        "bad-txns-nonfinal"
    );

    // Time: measured from the MTP of block coin_height - 1:
    // locked while coin_time + n*512 - 1 >= PREV_MTP.
    let coin_time = mtp_at(coin_height - 1).expect("mtp");
    let elapsed = PREV_MTP - coin_time; // 600 * 100 = 60,000 s
    let n_ok = elapsed / 512; // n*512 <= elapsed  → coin_time + n*512 - 1 < PREV_MTP
    assert_eq!(reason(validate(&spend(2, TYPE | n_ok), &coins)), "ok");
    match validate(&spend(2, TYPE | (n_ok + 1)), &coins) {
        Err(BlockError::SequenceLocked {
            min_height,
            min_time,
            ..
        }) => {
            assert_eq!(min_height, -1);
            assert_eq!(
                min_time,
                i64::from(coin_time) + i64::from(n_ok + 1) * 512 - 1
            );
        }
        other => panic!("{other:?}"),
    }
    // Exact boundary: a parent MTP of coin_time + n*512 - 1 is still locked.
    let blk = spend(2, TYPE | 10);
    let params = regtest();
    let mut c = ctx(&params, &blk);
    c.prev_median_time_past = coin_time + 10 * 512 - 1;
    let err = connect_block(&blk, &c, &coins).expect_err("locked");
    assert_eq!(err.reject_reason(), "bad-txns-nonfinal");
    c.prev_median_time_past = coin_time + 10 * 512;
    assert!(connect_block(&blk, &c, &coins).is_ok());

    // Without the MTP of the coin's parent, the block cannot be judged.
    let no_mtp = |_h: u32| None;
    let c = BlockContext {
        median_time_past_at: &no_mtp,
        ..ctx(&params, &blk)
    };
    match connect_block(&blk, &c, &coins) {
        Err(e @ BlockError::MissingMedianTimePast { height }) => {
            assert_eq!(height, coin_height - 1);
            assert!(!e.is_consensus_failure());
        }
        other => panic!("{other:?}"),
    }
    // Before CSV activation nothing is enforced.
    let mut params = regtest();
    params.csv_height = HEIGHT + 1;
    let blk = spend(2, 5_000);
    assert!(connect_block(&blk, &ctx(&params, &blk), &coins).is_ok());
}

#[test]
fn bip68_time_lock_on_a_same_block_coin_uses_the_parent_mtp() {
    const TYPE: u32 = 1 << 22;
    let (ops, coins) = funding(&[(1_000, p2wpkh(), 500, false)]);
    let a = tx(vec![input(ops[0])], vec![(900, p2wpkh())]);
    let child = |n: u32| {
        let mut b = tx(
            vec![input(OutPoint {
                txid: a.compute_txid(),
                vout: 0,
            })],
            vec![(800, p2wpkh())],
        );
        b.input[0].sequence = Sequence(TYPE | n);
        block(subsidy() + 200, vec![a.clone(), b])
    };
    // coin_time = PREV_MTP: n = 0 gives PREV_MTP - 1 < PREV_MTP (ok), n = 1 is locked.
    let never_called =
        |h: u32| -> Option<u32> { panic!("MTP of {h} asked; the parent's is in the context") };
    let params = regtest();
    for (n, expected) in [(0, "ok"), (1, "bad-txns-nonfinal")] {
        let blk = child(n);
        let c = BlockContext {
            median_time_past_at: &never_called,
            ..ctx(&params, &blk)
        };
        check_block(&blk, &c).expect("structure");
        assert_eq!(reason(connect_block(&blk, &c, &coins)), expected, "n = {n}");
    }
}

#[test]
fn bip30_and_its_mainnet_exceptions() {
    // Mainnet block 91842 is an exception; its coinbase may duplicate an
    // unspent one. Any other block may not.
    let params = ChainParams::new(Network::Bitcoin);
    let (height, hash_hex) = params.bip30_exceptions[0];
    let mut cb = coinbase(height, params.block_subsidy(height));
    cb.input[0].script_sig = ScriptBuf::from_bytes(vec![0x04, 0xff, 0xff, 0x00, 0x1d]);
    let blk = seal(Block {
        header: block(0, vec![]).header,
        txdata: vec![cb.clone()],
    });
    let existing = OutPoint {
        txid: cb.compute_txid(),
        vout: 0,
    };
    let coins: HashMap<OutPoint, Coin> = [(
        existing,
        coin(
            5_000_000_000,
            ScriptBuf::from_bytes(vec![0x51]),
            91_812,
            true,
        ),
    )]
    .into();
    let mtp = |_h: u32| Some(PREV_MTP);
    let exception: BlockHash = hash_hex.parse().expect("hash");
    let mut c = BlockContext {
        params: &params,
        height,
        block_hash: exception,
        prev_median_time_past: PREV_MTP,
        median_time_past_at: &mtp,
    };
    let effects = connect_block(&blk, &c, &coins).expect("BIP30 exception");
    assert_eq!(
        effects.created[0].0, existing,
        "the duplicate overwrites the old coin"
    );
    c.block_hash = blk.block_hash();
    match connect_block(&blk, &c, &coins) {
        Err(BlockError::Bip30 { outpoint }) => assert_eq!(outpoint, existing),
        other => panic!("{other:?}"),
    }
    // On regtest too (no exceptions there).
    let blk = block(subsidy(), vec![]);
    let existing = OutPoint {
        txid: blk.txdata[0].compute_txid(),
        vout: 0,
    };
    let coins: HashMap<OutPoint, Coin> = [(
        existing,
        coin(1, ScriptBuf::from_bytes(vec![0x51]), 10, true),
    )]
    .into();
    assert_eq!(reason(validate(&blk, &coins)), "bad-txns-BIP30");
}

/// `n` P2WSH coins whose witness script is `sigops` × OP_CHECKSIG.
fn p2wsh_spend(n: u32, sigops: usize) -> (Transaction, HashMap<OutPoint, Coin>) {
    let witness_script = ScriptBuf::from_bytes(vec![0xac; sigops]);
    let spk = witness_script.to_p2wsh();
    let specs: Vec<(u64, ScriptBuf, u32, bool)> =
        (0..n).map(|_| (1_000, spk.clone(), 500, false)).collect();
    let (ops, coins) = funding(&specs);
    let inputs = ops
        .iter()
        .map(|o| {
            let mut i = input(*o);
            i.witness = Witness::from_slice(&[witness_script.to_bytes()]);
            i
        })
        .collect();
    (tx(inputs, vec![(1_000 * u64::from(n), p2wpkh())]), coins)
}

#[test]
fn sigop_cost_limit_counts_witness_scripts_exactly() {
    // 8 inputs × 10,000 sigops = 80,000: at the limit.
    let (spend, coins) = p2wsh_spend(8, 10_000);
    let effects = validate(&block(subsidy(), vec![spend]), &coins).expect("at the limit");
    assert_eq!(effects.sigop_cost, 80_000);
    // One more sigop in one of them: over.
    let (mut spend, coins) = p2wsh_spend(8, 10_000);
    let mut coins = coins;
    let bigger = ScriptBuf::from_bytes(vec![0xac; 10_001]);
    spend.input[0].witness = Witness::from_slice(&[bigger.to_bytes()]);
    coins
        .get_mut(&spend.input[0].previous_output)
        .expect("coin")
        .script_pubkey = bigger.to_p2wsh().to_bytes();
    match validate(&block(subsidy(), vec![spend]), &coins) {
        Err(BlockError::TooManySigops { cost }) => assert_eq!(cost, 80_001),
        other => panic!("{other:?}"),
    }
}

#[test]
fn sigop_cost_counts_p2sh_times_four_and_legacy_in_check_block() {
    // P2SH redeem script of 200 CHECKSIGs: 800 cost per input; 100 inputs = 80,000.
    let redeem = ScriptBuf::from_bytes(vec![0xac; 200]);
    let spk = redeem.to_p2sh();
    let make = |n: u32| {
        let specs: Vec<(u64, ScriptBuf, u32, bool)> =
            (0..n).map(|_| (1_000, spk.clone(), 500, false)).collect();
        let (ops, coins) = funding(&specs);
        let mut push = vec![0x4c, 200];
        push.extend_from_slice(redeem.as_bytes());
        let inputs = ops
            .iter()
            .map(|o| {
                let mut i = input(*o);
                i.script_sig = ScriptBuf::from_bytes(push.clone());
                i
            })
            .collect();
        (
            block(
                subsidy(),
                vec![tx(inputs, vec![(1_000 * u64::from(n), p2wpkh())])],
            ),
            coins,
        )
    };
    let (blk, coins) = make(100);
    assert_eq!(
        validate(&blk, &coins).expect("at the limit").sigop_cost,
        80_000
    );
    let (blk, coins) = make(101);
    assert_eq!(reason(validate(&blk, &coins)), "bad-blk-sigops");

    // Legacy: 1,001 bare 1-of-1 multisig outputs × 20 = 20,020 legacy sigops
    // = 80,080 cost: check_block rejects without any coin.
    let ms = ScriptBuf::from_bytes(
        vec![0x51, 0x21]
            .into_iter()
            .chain([2u8; 33])
            .chain([0x51, 0xae])
            .collect(),
    );
    let (ops, coins) = funding(&[(1_000_000, p2wpkh(), 500, false)]);
    let outputs = (0..1_001).map(|_| (1, ms.clone())).collect();
    let blk = block(subsidy(), vec![tx(vec![input(ops[0])], outputs)]);
    match validate(&blk, &coins) {
        Err(BlockError::TooManySigops { cost }) => assert_eq!(cost, 80_080),
        other => panic!("{other:?}"),
    }
}

#[test]
fn reject_reasons_are_cores_strings() {
    // Spot checks of the mapping against Core's literal strings.
    let txid = funding_txid(0);
    let outpoint = OutPoint { txid, vout: 0 };
    assert_eq!(
        BlockError::Bip30 { outpoint }.reject_reason(),
        "bad-txns-BIP30"
    );
    assert_eq!(
        BlockError::MutatedMerkleTree.reject_reason(),
        "bad-txns-duplicate"
    );
    assert_eq!(
        BlockError::SequenceLocked {
            txid,
            min_height: 1,
            min_time: -1
        }
        .reject_reason(),
        BlockError::NonFinal { txid, lock_time: 1 }.reject_reason()
    );
    assert!(BlockError::Bip30 { outpoint }.is_consensus_failure());
    assert!(!BlockError::Bip30 { outpoint }.is_mutation());
}

#[test]
fn bip30_is_skipped_only_where_core_skips_it() {
    let main = ChainParams::new(Network::Bitcoin);
    assert!(bip30_check_needed(&main, 91_842));
    assert!(
        bip30_check_needed(&main, 227_931),
        "BIP34 activation block itself"
    );
    assert!(!bip30_check_needed(&main, 227_932));
    assert!(!bip30_check_needed(&main, 1_983_701));
    assert!(bip30_check_needed(&main, 1_983_702));
    let test3 = ChainParams::new(Network::Testnet);
    assert!(!bip30_check_needed(&test3, 21_112));
    for network in [Network::Regtest, Network::Signet, Network::Testnet4] {
        assert!(bip30_check_needed(&ChainParams::new(network), 1_000));
    }
}

#[test]
fn mainnet_bip16_exception_block_counts_no_p2sh_sigops() {
    let params = ChainParams::new(Network::Bitcoin);
    let redeem = ScriptBuf::from_bytes(vec![0xac; 200]);
    let (ops, coins) = funding(&[(1_000, redeem.to_p2sh(), 100_000, false)]);
    let mut spend = tx(vec![input(ops[0])], vec![(1_000, p2wpkh())]);
    let mut push = vec![0x4c, 200];
    push.extend_from_slice(redeem.as_bytes());
    spend.input[0].script_sig = ScriptBuf::from_bytes(push);
    // Core's BIP16 exception block (mainnet, height 170,060).
    let (height, hash) = (
        170_060,
        "00000000000002dc756eebf4f49723ed8d30cc28a5f108eb94b1ba88ac4f9c22",
    );
    let blk = block(params.block_subsidy(height), vec![spend]);
    let mtp = |_h: u32| Some(PREV_MTP);
    let mut c = BlockContext {
        params: &params,
        height,
        block_hash: hash.parse().expect("hash"),
        prev_median_time_past: PREV_MTP,
        median_time_past_at: &mtp,
    };
    assert_eq!(
        connect_block(&blk, &c, &coins).expect("valid").sigop_cost,
        0
    );
    c.block_hash = blk.block_hash();
    assert_eq!(
        connect_block(&blk, &c, &coins).expect("valid").sigop_cost,
        800
    );
}
