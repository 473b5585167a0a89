//! Cases ported from Bitcoin Core 30.0: `src/test/transaction_tests.cpp`
//! (`test_IsStandard`, `max_standard_legacy_sigops`),
//! `src/test/script_p2sh_tests.cpp` (`AreInputsStandard`),
//! `test/functional/mempool_accept.py` (the standardness cases that need no
//! mempool), each asserting Core's verdict and reason string.

use bitcoin::absolute::LockTime;
use bitcoin::hashes::Hash;
use bitcoin::opcodes::all as op;
use bitcoin::opcodes::Opcode;
use bitcoin::script::{Builder, PushBytesBuf};
use bitcoin::transaction::Version;
use bitcoin::{Amount, OutPoint, ScriptBuf, Sequence, Transaction, TxIn, TxOut, Witness};

use super::inputs::{REASON_NONSTANDARD_INPUTS, REASON_NONSTANDARD_WITNESS};
use super::truc::{check_truc_size, TrucViolation, TxIds, TRUC_MAX_VSIZE};
use super::*;
use crate::mempool::reject::TxRejectClass;

const CENT: u64 = 1_000_000;

/// A push of `data` with the smallest push opcode that fits its length.
fn push(b: Builder, data: Vec<u8>) -> Builder {
    b.push_slice(PushBytesBuf::try_from(data).expect("test push ≤ 4 GiB"))
}

fn script(bytes: &[u8]) -> ScriptBuf {
    ScriptBuf::from_bytes(bytes.to_vec())
}

fn key33() -> Vec<u8> {
    let mut k = vec![0x02];
    k.extend_from_slice(&[0x11; 32]);
    k
}

fn key65() -> Vec<u8> {
    let mut k = vec![0x04];
    k.extend_from_slice(&[0x33; 64]);
    k
}

/// `<key> OP_CHECKSIG`.
fn p2pk(key: Vec<u8>) -> ScriptBuf {
    push(Builder::new(), key)
        .push_opcode(op::OP_CHECKSIG)
        .into_script()
}

fn p2pkh() -> ScriptBuf {
    let mut s = vec![0x76, 0xa9, 0x14];
    s.extend_from_slice(&[0x22; 20]);
    s.extend_from_slice(&[0x88, 0xac]);
    script(&s)
}

fn p2sh_of(redeem: &ScriptBuf) -> ScriptBuf {
    redeem.to_p2sh()
}

/// `OP_m <keys…> OP_n OP_CHECKMULTISIG` with `n` copies of a compressed key.
fn bare_multisig(m: u8, n: u8) -> ScriptBuf {
    let mut b = Builder::new().push_int(i64::from(m));
    for _ in 0..n {
        b = push(b, key33());
    }
    b.push_int(i64::from(n))
        .push_opcode(op::OP_CHECKMULTISIG)
        .into_script()
}

fn input(script_sig: ScriptBuf) -> TxIn {
    TxIn {
        previous_output: OutPoint::null(),
        script_sig,
        sequence: Sequence::MAX,
        witness: Witness::new(),
    }
}

fn out(sats: u64, script_pubkey: ScriptBuf) -> TxOut {
    TxOut {
        value: Amount::from_sat(sats),
        script_pubkey,
    }
}

fn tx(input: Vec<TxIn>, output: Vec<TxOut>) -> Transaction {
    let input = input
        .into_iter()
        .enumerate()
        .map(|(i, mut txin)| {
            // Distinct, non-null outpoints: not a coinbase.
            txin.previous_output = OutPoint {
                txid: bitcoin::Txid::from_byte_array([1; 32]),
                vout: i as u32,
            };
            txin
        })
        .collect();
    Transaction {
        version: Version::TWO,
        lock_time: LockTime::ZERO,
        input,
        output,
    }
}

/// Core's `test_IsStandard` starting transaction: one input whose
/// scriptSig pushes 65 zero bytes, one 0.9 BTC P2PKH output.
fn reference_tx() -> Transaction {
    let sig = push(Builder::new(), vec![0; 65]).into_script();
    tx(vec![input(sig)], vec![out(90 * CENT, p2pkh())])
}

fn reason(tx: &Transaction, config: &PolicyConfig) -> Option<&'static str> {
    is_standard_tx(tx, config).err().map(|e| {
        assert_eq!(e.class, TxRejectClass::NotStandard);
        static_reason(e.reason)
    })
}

fn with_datacarrier(bytes: u32) -> PolicyConfig {
    PolicyConfig {
        max_datacarrier_bytes: Some(bytes),
        ..PolicyConfig::default()
    }
}

#[test]
fn defaults_are_core_30s() {
    let c = PolicyConfig::default();
    assert_eq!(c.dust_relay_feerate, 3_000);
    assert_eq!(c.max_datacarrier_bytes, Some(100_000));
    assert!(c.permit_bare_multisig);
    assert_eq!(c.bytes_per_sigop, 20);
    assert_eq!(c.min_relay_feerate, 100);
    assert_eq!(c.incremental_relay_feerate, 100);
    assert_eq!(
        MANDATORY_SCRIPT_VERIFY_FLAGS.to_string(),
        "P2SH,DERSIG,NULLDUMMY,CHECKLOCKTIMEVERIFY,CHECKSEQUENCEVERIFY,WITNESS,TAPROOT"
    );
    assert_eq!(
        STANDARD_NOT_MANDATORY_VERIFY_FLAGS.to_string(),
        "STRICTENC,LOW_S,MINIMALDATA,DISCOURAGE_UPGRADABLE_NOPS,CLEANSTACK,\
         DISCOURAGE_UPGRADABLE_WITNESS_PROGRAM,MINIMALIF,NULLFAIL,WITNESS_PUBKEYTYPE,\
         CONST_SCRIPTCODE,DISCOURAGE_UPGRADABLE_TAPROOT_VERSION,DISCOURAGE_OP_SUCCESS,\
         DISCOURAGE_UPGRADABLE_PUBKEYTYPE"
    );
    // SIGPUSHONLY is the one flag neither set has.
    assert!(
        !STANDARD_SCRIPT_VERIFY_FLAGS.contains(crate::validation::script::ScriptFlags::SIGPUSHONLY)
    );
}

#[test]
fn test_is_standard_dust_and_version() {
    let c = PolicyConfig::default();
    let mut t = reference_tx();
    assert_eq!(reason(&t, &c), None);
    // One dust output (ephemeral dust) is still standard.
    t.output.push(out(0, p2pkh()));
    assert_eq!(reason(&t, &c), None);
    // A second one is not.
    t.output[0].value = Amount::from_sat(545);
    assert_eq!(reason(&t, &c), Some("dust"));
    t.output[0].value = Amount::from_sat(546);
    assert_eq!(reason(&t, &c), None);

    for (version, verdict) in [
        (-1, Some("version")), // u32::MAX
        (0, Some("version")),
        (1, None),
        (2, None),
        (3, None),
        (4, Some("version")),
    ] {
        t.version = Version(version);
        assert_eq!(reason(&t, &c), verdict, "version {version}");
    }
    t.version = Version::TWO;

    // An odd dust feerate rounds the threshold up: 182 × 3702 / 1000 = 673.764.
    let odd = PolicyConfig {
        dust_relay_feerate: 3_702,
        ..PolicyConfig::default()
    };
    t.output[0].value = Amount::from_sat(673);
    assert_eq!(reason(&t, &odd), Some("dust"));
    t.output[0].value = Amount::from_sat(674);
    assert_eq!(reason(&t, &odd), None);

    t.output[0].script_pubkey = script(&[0x51]);
    assert_eq!(reason(&t, &c), Some("scriptpubkey"));
}

/// Core 30.0: any number of OP_RETURN outputs, their scriptPubKeys
/// counted together against `-datacarriersize`.
#[test]
fn test_is_standard_datacarrier() {
    let data80: Vec<u8> = (0..80).collect();
    let data40: Vec<u8> = (0..40).collect();
    let op_return =
        |data: Vec<u8>| push(Builder::new().push_opcode(op::OP_RETURN), data).into_script();
    let mut t = reference_tx();
    t.output[0].script_pubkey = op_return(data80.clone());
    assert_eq!(t.output[0].script_pubkey.len(), 83);
    assert_eq!(reason(&t, &with_datacarrier(83)), None);
    assert_eq!(reason(&t, &with_datacarrier(82)), Some("datacarrier"));
    // -datacarrier=0 refuses even a bare OP_RETURN.
    let off = PolicyConfig {
        max_datacarrier_bytes: None,
        ..PolicyConfig::default()
    };
    t.output[0].script_pubkey = script(&[0x6a]);
    assert_eq!(reason(&t, &off), Some("datacarrier"));

    // Any pushes, OP_RESERVED included (IsPushOnly counts it), in any form.
    for s in [
        vec![0x6a, 0x00],
        vec![0x6a, 0x01, 0x00, 0x01, 0x01],
        vec![0x6a, 0x50, 0x4f, 0x00, 0x01, 0x01, 0x52, 0x53, 0x60],
        vec![0x6a, 0x4c, 0x02, 0xff, 0xff],
    ] {
        t.output[0].script_pubkey = script(&s);
        assert_eq!(reason(&t, &PolicyConfig::default()), None, "{s:x?}");
    }
    // ...so long as it only pushes.
    t.output[0].script_pubkey = script(&[0x6a, 0x6a]);
    assert_eq!(reason(&t, &PolicyConfig::default()), Some("scriptpubkey"));

    // Several OP_RETURN outputs: standard (Core 29 said multi-op-return).
    t.output = vec![out(0, op_return(data40.clone())), out(0, op_return(data40))];
    assert_eq!(reason(&t, &PolicyConfig::default()), None);
    t.output = vec![out(0, script(&[0x6a])), out(0, script(&[0x6a]))];
    assert_eq!(reason(&t, &PolicyConfig::default()), None);
    t.output = vec![out(0, op_return(data80.clone())), out(0, op_return(data80))];
    assert_eq!(reason(&t, &PolicyConfig::default()), None);
    assert_eq!(reason(&t, &with_datacarrier(166)), None);
    assert_eq!(reason(&t, &with_datacarrier(165)), Some("datacarrier"));

    // mempool_accept.py: 42 OP_RETURN outputs of `OP_RETURN 0xff`.
    let mut t = reference_tx();
    t.output = vec![out(0, script(&[0x6a, 0x01, 0xff])); 42];
    assert_eq!(reason(&t, &PolicyConfig::default()), None);
}

#[test]
fn test_is_standard_scriptsig() {
    let c = PolicyConfig::default();
    let mut t = reference_tx();
    t.output[0].value = Amount::MAX_MONEY;
    // OP_PUSHDATA2, its 2-byte length and 1647 bytes: 1650 bytes.
    t.input[0].script_sig = push(Builder::new(), vec![0; 1647]).into_script();
    assert_eq!(t.input[0].script_sig.len(), 1650);
    assert_eq!(reason(&t, &c), None);
    t.input[0].script_sig = push(Builder::new(), vec![0; 1648]).into_script();
    assert_eq!(reason(&t, &c), Some("scriptsig-size"));

    // Every kind of push is push-only.
    let mut b = Builder::new()
        .push_opcode(op::OP_PUSHNUM_1)
        .push_opcode(op::OP_PUSHBYTES_0)
        .push_opcode(op::OP_PUSHNUM_NEG1)
        .push_opcode(op::OP_PUSHNUM_16);
    for len in [75, 235, 1234] {
        b = push(b, vec![0; len]);
    }
    let good = b.push_opcode(op::OP_PUSHNUM_9).into_script();
    t.input[0].script_sig = good.clone();
    assert_eq!(reason(&t, &c), None);

    // Replacing any one-byte push with a non-push opcode makes it not push-only.
    let non_push = [
        op::OP_NOP,
        op::OP_VERIFY,
        op::OP_IF,
        op::OP_ROT,
        op::OP_3DUP,
        op::OP_SIZE,
        op::OP_EQUAL,
        op::OP_ADD,
        op::OP_SUB,
        op::OP_HASH256,
        op::OP_CODESEPARATOR,
        op::OP_CHECKSIG,
        op::OP_CLTV,
    ];
    let one_byte_ops: Vec<usize> = good
        .instruction_indices()
        .filter_map(|i| match i.expect("well formed") {
            (at, bitcoin::script::Instruction::Op(_)) => Some(at),
            (at, bitcoin::script::Instruction::PushBytes(b)) if b.is_empty() => Some(at),
            _ => None,
        })
        .collect();
    assert_eq!(one_byte_ops.len(), 5);
    for at in one_byte_ops {
        for bad in non_push {
            let mut bytes = good.to_bytes();
            bytes[at] = bad.to_u8();
            t.input[0].script_sig = ScriptBuf::from_bytes(bytes);
            assert_eq!(
                reason(&t, &c),
                Some("scriptsig-not-pushonly"),
                "{bad} at {at}"
            );
        }
    }
    // mempool_accept.py: a scriptSig of OP_HASH160.
    t.input[0].script_sig = Builder::new().push_opcode(op::OP_HASH160).into_script();
    assert_eq!(reason(&t, &c), Some("scriptsig-not-pushonly"));
}

#[test]
fn test_is_standard_tx_size() {
    let c = PolicyConfig::default();
    let op_return =
        |n: usize| push(Builder::new().push_opcode(op::OP_RETURN), vec![0; n]).into_script();
    // 2438 inputs with empty scriptSigs (41 bytes each), one 30-byte output.
    let mut t = tx(
        vec![input(ScriptBuf::new()); 2438],
        vec![out(Amount::MAX_MONEY.to_sat(), op_return(19))],
    );
    assert_eq!(t.weight().to_wu(), 400_000);
    assert_eq!(reason(&t, &c), None);
    t.output[0].script_pubkey = op_return(20);
    assert_eq!(t.weight().to_wu(), 400_004);
    assert_eq!(reason(&t, &c), Some("tx-size"));

    // mempool_accept.py: enough 540-sat P2SH outputs to pass 100 kvB.
    let burn = out(540, p2sh_of(&script(b"burn")));
    let mut t = reference_tx();
    t.output = vec![burn.clone(); 100_000 / 32];
    assert_eq!(reason(&t, &c), Some("tx-size"));
    // One such output 1 sat short is dust, but alone it passes
    // IsStandardTx; a fee-paying transaction then fails the ephemeral check.
    let mut t = reference_tx();
    t.output[0] = out(539, burn.script_pubkey);
    assert_eq!(reason(&t, &c), None);
    let e = pre_check_ephemeral_tx(&t, c.dust_relay_feerate, 1_000, 1_000).unwrap_err();
    assert_eq!((e.class, &*e.reason), (TxRejectClass::NotStandard, "dust"));
    assert_eq!(e.to_string(), "dust, tx with dust output must be 0-fee");
}

#[test]
fn test_is_standard_bare_multisig() {
    let mut t = reference_tx();
    t.output[0].script_pubkey = bare_multisig(1, 1);
    assert_eq!(reason(&t, &PolicyConfig::default()), None);
    let no_bare = PolicyConfig {
        permit_bare_multisig: false,
        ..PolicyConfig::default()
    };
    assert_eq!(reason(&t, &no_bare), Some("bare-multisig"));
    // mempool_accept.py: a 2-of-3.
    t.output[0].script_pubkey = bare_multisig(2, 3);
    assert_eq!(reason(&t, &no_bare), Some("bare-multisig"));
    assert_eq!(reason(&t, &PolicyConfig::default()), None);
    // More than 3 keys is not a standard output, permitted or not.
    t.output[0].script_pubkey = bare_multisig(1, 4);
    assert_eq!(reason(&t, &PolicyConfig::default()), Some("scriptpubkey"));
    assert_eq!(reason(&t, &no_bare), Some("scriptpubkey"));
}

/// `test_IsStandard`'s dust thresholds per output type, at 3,000 sat/kvB:
/// standard at the threshold, `dust` one below (with a second, 0-value
/// output taking the one ephemeral-dust place).
#[test]
fn dust_threshold_per_output_type() {
    let c = PolicyConfig::default();
    let uncompressed = key65();
    let wp = |version: Opcode, len: usize| {
        push(Builder::new().push_opcode(version), vec![0; len]).into_script()
    };
    let mut cases = vec![
        ("compressed P2PK", p2pk(key33()), 576),
        ("uncompressed P2PK", p2pk(uncompressed), 672),
        ("P2PKH", p2pkh(), 546),
        ("P2SH", p2sh_of(&script(&[0x51])), 540),
        ("P2WPKH", wp(op::OP_PUSHBYTES_0, 20), 294),
        ("P2WSH", wp(op::OP_PUSHBYTES_0, 32), 330),
        ("P2TR", wp(op::OP_PUSHNUM_1, 32), 330),
        ("anchor", script(&[0x51, 0x02, 0x4e, 0x73]), 240),
    ];
    for v in op::OP_PUSHNUM_1.to_u8()..=op::OP_PUSHNUM_16.to_u8() {
        cases.push(("future witness", wp(Opcode::from(v), 2), 240));
    }
    for (what, spk, threshold) in cases {
        let o = out(threshold, spk.clone());
        assert_eq!(
            dust_threshold(&o, 3_000),
            Amount::from_sat(threshold),
            "{what}"
        );
        let mut t = reference_tx();
        t.output = vec![o, out(0, spk)];
        assert_eq!(reason(&t, &c), None, "{what} at {threshold}");
        t.output[0].value = Amount::from_sat(threshold - 1);
        assert_eq!(reason(&t, &c), Some("dust"), "{what} below {threshold}");
        assert!(is_dust(&t.output[0], 3_000));
        assert_eq!(dust_outputs(&t, 3_000), vec![0, 1]);
    }
    // Unspendable outputs are never dust.
    assert_eq!(
        dust_threshold(&out(0, script(&[0x6a])), 3_000),
        Amount::ZERO
    );
    let huge = out(0, ScriptBuf::from_bytes(vec![0x51; 10_001]));
    assert_eq!(dust_threshold(&huge, 3_000), Amount::ZERO);
}

#[test]
fn ephemeral_dust_needs_zero_fee() {
    let mut t = reference_tx();
    t.output.push(out(0, p2pkh()));
    assert_eq!(pre_check_ephemeral_tx(&t, 3_000, 0, 0), Ok(()));
    assert!(pre_check_ephemeral_tx(&t, 3_000, 1, 1).is_err());
    // A priority delta alone is enough to refuse (Core checks both fees).
    assert!(pre_check_ephemeral_tx(&t, 3_000, 0, 500).is_err());
    assert!(pre_check_ephemeral_tx(&t, 3_000, 500, 0).is_err());
    // Without dust, any fee.
    t.output.pop();
    assert_eq!(pre_check_ephemeral_tx(&t, 3_000, 500, 500), Ok(()));
}

/// mempool_accept.py: 64 bytes without the witness is refused, 65 is not.
#[test]
fn tx_size_small_counts_non_witness_bytes() {
    let mut spend = input(ScriptBuf::new());
    spend.witness = Witness::from_slice(&[vec![0x51]]);
    let mut t = tx(vec![spend], vec![out(0, script(&[0x6a, 0x00, 0x00, 0x00]))]);
    assert_eq!(t.base_size(), 64);
    assert!(t.total_size() > 64);
    let e = check_tx_size_small(&t).unwrap_err();
    assert_eq!(
        (e.class, &*e.reason),
        (TxRejectClass::NotStandard, "tx-size-small")
    );
    t.output[0].script_pubkey = script(&[0x6a, 0x00, 0x00, 0x00, 0x00]);
    assert_eq!(t.base_size(), MIN_STANDARD_TX_NONWITNESS_SIZE);
    assert_eq!(check_tx_size_small(&t), Ok(()));
}

#[test]
fn solver_on_every_template() {
    let uncompressed = key65();
    let wp = |version: u8, len: usize| {
        let mut s = vec![version, len as u8];
        s.extend(std::iter::repeat_n(0x5a, len));
        ScriptBuf::from_bytes(s)
    };
    use TxoutType as T;
    let cases: Vec<(&str, ScriptBuf, TxoutType)> = vec![
        ("P2PK compressed", p2pk(key33()), T::PubKey),
        ("P2PK uncompressed", p2pk(uncompressed.clone()), T::PubKey),
        (
            "P2PK hybrid 0x06",
            p2pk([&[0x06][..], &uncompressed[1..]].concat()),
            T::PubKey,
        ),
        ("P2PKH", p2pkh(), T::PubKeyHash),
        ("P2SH", p2sh_of(&script(&[0x51])), T::ScriptHash),
        (
            "1-of-1",
            bare_multisig(1, 1),
            T::Multisig {
                required: 1,
                keys: 1,
            },
        ),
        (
            "2-of-3",
            bare_multisig(2, 3),
            T::Multisig {
                required: 2,
                keys: 3,
            },
        ),
        (
            "1-of-16",
            bare_multisig(1, 16),
            T::Multisig {
                required: 1,
                keys: 16,
            },
        ),
        ("nulldata", script(&[0x6a, 0x01, 0xff]), T::NullData),
        ("bare OP_RETURN", script(&[0x6a]), T::NullData),
        ("P2WPKH", wp(0x00, 20), T::WitnessV0KeyHash),
        ("P2WSH", wp(0x00, 32), T::WitnessV0ScriptHash),
        ("P2TR", wp(0x51, 32), T::WitnessV1Taproot),
        ("anchor", script(&[0x51, 0x02, 0x4e, 0x73]), T::Anchor),
        ("v1 2-byte", wp(0x51, 2), T::WitnessUnknown { version: 1 }),
        ("v1 20-byte", wp(0x51, 20), T::WitnessUnknown { version: 1 }),
        (
            "v16 40-byte",
            wp(0x60, 40),
            T::WitnessUnknown { version: 16 },
        ),
    ];
    for (what, spk, expected) in &cases {
        assert_eq!(solver(spk), *expected, "{what}");
    }
    // Names as Core's GetTxnOutputType (and decoderawtransaction) print them.
    let names: Vec<&str> = cases.iter().map(|(_, _, t)| t.name()).collect();
    assert_eq!(
        names,
        [
            "pubkey",
            "pubkey",
            "pubkey",
            "pubkeyhash",
            "scripthash",
            "multisig",
            "multisig",
            "multisig",
            "nulldata",
            "nulldata",
            "witness_v0_keyhash",
            "witness_v0_scripthash",
            "witness_v1_taproot",
            "anchor",
            "witness_unknown",
            "witness_unknown",
            "witness_unknown"
        ]
    );
    assert_eq!(solver(&wp(0x00, 25)).name(), "nonstandard");
}

#[test]
fn solver_refuses_lookalikes() {
    let with = |s: &ScriptBuf, at: usize, byte: u8| {
        let mut b = s.to_bytes();
        b[at] = byte;
        ScriptBuf::from_bytes(b)
    };
    let key17 = |m: &[u8], n: &[u8]| {
        let mut s = m.to_vec();
        for _ in 0..17 {
            s.push(33);
            s.extend_from_slice(&key33());
        }
        s.extend_from_slice(n);
        s.push(0xae);
        ScriptBuf::from_bytes(s)
    };
    let ms = bare_multisig(1, 2);
    let cases: Vec<(&str, ScriptBuf)> = vec![
        ("empty", ScriptBuf::new()),
        ("OP_1", script(&[0x51])),
        (
            "P2PK, 33 bytes with header 0x04",
            p2pk([&[0x04][..], &[0x11; 32]].concat()),
        ),
        (
            "P2PK, 65 bytes with header 0x02",
            p2pk([&[0x02][..], &[0x11; 64]].concat()),
        ),
        (
            "P2PK, 33 bytes with header 0x05",
            p2pk([&[0x05][..], &[0x11; 32]].concat()),
        ),
        ("P2PKH with OP_EQUAL", with(&p2pkh(), 23, 0x87)),
        (
            "P2SH with OP_EQUALVERIFY",
            with(&p2sh_of(&script(&[0x51])), 22, 0x88),
        ),
        (
            "v0 program of 25 bytes",
            ScriptBuf::from_bytes([&[0x00, 25][..], &[0; 25]].concat()),
        ),
        (
            "v1 program of 41 bytes",
            ScriptBuf::from_bytes([&[0x51, 41][..], &[0; 41]].concat()),
        ),
        ("v1 program of 1 byte", script(&[0x51, 0x01, 0x00])),
        ("OP_RETURN OP_RETURN", script(&[0x6a, 0x6a])),
        ("OP_RETURN truncated push", script(&[0x6a, 0x05, 0x01])),
        ("multisig m > n", bare_multisig(3, 2)),
        ("multisig m = 0", with(&ms, 0, 0x00)),
        ("multisig n ≠ key count", with(&ms, ms.len() - 2, 0x53)),
        ("multisig key of bad header", with(&ms, 2, 0x05)),
        (
            "multisig OP_CHECKMULTISIGVERIFY",
            with(&ms, ms.len() - 1, 0xaf),
        ),
        (
            "multisig with an op after",
            ScriptBuf::from_bytes([ms.as_bytes(), &[0xae]].concat()),
        ),
        (
            "multisig n as non-minimal push",
            key17(&[0x51], &[0x02, 0x11, 0x00]),
        ),
        ("multisig m as push of 5", {
            let mut s = vec![0x01, 0x05];
            s.extend_from_slice(&ms.as_bytes()[1..]);
            ScriptBuf::from_bytes(s)
        }),
    ];
    for (what, spk) in &cases {
        assert_eq!(solver(spk), TxoutType::NonStandard, "{what}");
    }
    // n = 17 as a one-byte push is a (nonstandard-output) multisig to Core.
    assert_eq!(
        solver(&key17(&[0x51], &[0x01, 0x11])),
        TxoutType::Multisig {
            required: 1,
            keys: 17
        }
    );
    // A key pushed with OP_PUSHDATA1 still counts.
    let mut s = vec![0x51, 0x4c, 33];
    s.extend_from_slice(&key33());
    s.extend_from_slice(&[0x51, 0xae]);
    assert_eq!(
        solver(&ScriptBuf::from_bytes(s)),
        TxoutType::Multisig {
            required: 1,
            keys: 1
        }
    );
}

/// A P2SH redeem script of `n` CHECKSIGs, and an input that spends it.
fn p2sh_checksigs(n: usize) -> (TxIn, TxOut) {
    let redeem = ScriptBuf::from_bytes(vec![0xac; n]);
    let sig = push(
        Builder::new().push_opcode(op::OP_PUSHBYTES_0),
        redeem.to_bytes(),
    )
    .into_script();
    (input(sig), out(10_000, p2sh_of(&redeem)))
}

fn inputs_reject(tx: &Transaction, spent: &[TxOut]) -> Option<&'static str> {
    are_inputs_standard(tx, spent).err().map(|e| {
        assert_eq!(e.class, TxRejectClass::InputsNotStandard);
        assert!(e.debug.is_empty());
        static_reason(e.reason)
    })
}

/// script_p2sh_tests.cpp `AreInputsStandard`: 15 sigops in a P2SH redeem
/// script are standard, 16 are not.
#[test]
fn are_inputs_standard_p2sh_sigops() {
    let (in15, out15) = p2sh_checksigs(15);
    let (in16, out16) = p2sh_checksigs(16);
    let t = tx(vec![in15.clone()], vec![out(1_000, p2pkh())]);
    assert_eq!(inputs_reject(&t, std::slice::from_ref(&out15)), None);
    let t = tx(vec![in15, in16], vec![out(1_000, p2pkh())]);
    assert_eq!(
        inputs_reject(&t, &[out15, out16.clone()]),
        Some(REASON_NONSTANDARD_INPUTS)
    );
    // The redeem script must exist: an empty scriptSig leaves no stack.
    let t = tx(vec![input(ScriptBuf::new())], vec![out(1_000, p2pkh())]);
    assert_eq!(
        inputs_reject(&t, std::slice::from_ref(&out16)),
        Some(REASON_NONSTANDARD_INPUTS)
    );
    // OP_RESERVED is push-only to IsPushOnly but fails evaluation.
    let t = tx(vec![input(script(&[0x50]))], vec![out(1_000, p2pkh())]);
    assert_eq!(
        inputs_reject(&t, std::slice::from_ref(&out16)),
        Some(REASON_NONSTANDARD_INPUTS)
    );
    // A push over 520 bytes fails evaluation.
    let big = push(Builder::new(), vec![0x51; 521]).into_script();
    let t = tx(vec![input(big)], vec![out(1_000, p2pkh())]);
    assert_eq!(inputs_reject(&t, &[out16]), Some(REASON_NONSTANDARD_INPUTS));
}

#[test]
fn are_inputs_standard_spent_types() {
    let t = tx(vec![input(ScriptBuf::new())], vec![out(1_000, p2pkh())]);
    let ok = |spk: ScriptBuf| inputs_reject(&t, &[out(10_000, spk)]);
    assert_eq!(ok(p2pkh()), None);
    assert_eq!(
        ok(bare_multisig(1, 16)),
        None,
        "any solvable multisig may be spent"
    );
    assert_eq!(ok(script(&[0x51, 0x02, 0x4e, 0x73])), None, "anchor");
    assert_eq!(
        ok(script(&[0x51])),
        Some(REASON_NONSTANDARD_INPUTS),
        "nonstandard"
    );
    // mempool_accept.py: spending a future witness version is refused.
    let v2 = ScriptBuf::from_bytes([&[0x52, 32][..], &[0; 32]].concat());
    assert_eq!(ok(v2), Some(REASON_NONSTANDARD_INPUTS), "witness_unknown");
    // One spent output per input, or nothing passes.
    assert_eq!(inputs_reject(&t, &[]), Some(REASON_NONSTANDARD_INPUTS));
    // A coinbase passes.
    let mut cb = t.clone();
    cb.input[0].previous_output = OutPoint::null();
    assert!(cb.is_coinbase());
    assert_eq!(inputs_reject(&cb, &[]), None);
}

/// transaction_tests.cpp `max_standard_legacy_sigops` (BIP-54, Core 30.0).
#[test]
fn are_inputs_standard_bip54_legacy_sigops() {
    let mut redeem = push(Builder::new().push_opcode(op::OP_PUSHBYTES_0), key33());
    for _ in 0..MAX_P2SH_SIGOPS - 1 {
        redeem = redeem
            .push_opcode(op::OP_2DUP)
            .push_opcode(op::OP_CHECKSIG)
            .push_opcode(op::OP_DROP);
    }
    let redeem = redeem
        .push_opcode(op::OP_CHECKSIG)
        .push_opcode(op::OP_NOT)
        .into_script();
    let p2sh_in = input(push(Builder::new(), redeem.to_bytes()).into_script());
    let p2sh_out = out(424_242, p2sh_of(&redeem));
    let p2sh_count = (MAX_TX_LEGACY_SIGOPS / MAX_P2SH_SIGOPS) as usize; // 166
    let payee = vec![out(1_000, p2pkh())];

    let mut ins = vec![p2sh_in.clone(); p2sh_count];
    let mut spent = vec![p2sh_out.clone(); p2sh_count];
    assert_eq!(inputs_reject(&tx(ins.clone(), payee.clone()), &spent), None); // 2490
    ins.push(p2sh_in);
    spent.push(p2sh_out);
    assert_eq!(
        inputs_reject(&tx(ins.clone(), payee.clone()), &spent),
        Some(REASON_NONSTANDARD_INPUTS)
    ); // 2505
    ins.pop();
    spent.pop();

    // Reach exactly 2500 with P2PK inputs.
    let p2pk_spk = p2pk(key33());
    for _ in 0..10 {
        ins.push(input(ScriptBuf::new()));
        spent.push(out(212_121, p2pk_spk.clone()));
    }
    assert_eq!(inputs_reject(&tx(ins.clone(), payee.clone()), &spent), None);
    // Segwit inputs add no legacy sigops.
    for len in [20usize, 32] {
        ins.push(input(ScriptBuf::new()));
        spent.push(out(
            1,
            ScriptBuf::from_bytes([&[0x00, len as u8][..], &vec![0; len]].concat()),
        ));
    }
    ins.push(input(ScriptBuf::new()));
    spent.push(out(
        1,
        ScriptBuf::from_bytes([&[0x51, 32][..], &[0; 32]].concat()),
    ));
    assert_eq!(inputs_reject(&tx(ins.clone(), payee.clone()), &spent), None);
    // One more P2PK: 2501.
    ins.push(input(ScriptBuf::new()));
    spent.push(out(212_121, p2pk_spk));
    assert_eq!(
        inputs_reject(&tx(ins, payee), &spent),
        Some(REASON_NONSTANDARD_INPUTS)
    );
}

fn witness_reject(tx: &Transaction, spent: &[TxOut]) -> Option<&'static str> {
    is_witness_standard(tx, spent).err().map(|e| {
        assert_eq!(e.class, TxRejectClass::WitnessMutated);
        static_reason(e.reason)
    })
}

/// A one-input transaction with `witness` spending `spk`: its verdict.
fn witness_verdict(
    spk: ScriptBuf,
    script_sig: ScriptBuf,
    witness: Vec<Vec<u8>>,
) -> Option<&'static str> {
    let mut spend = input(script_sig);
    spend.witness = Witness::from_slice(&witness);
    let t = tx(vec![spend], vec![out(1_000, p2pkh())]);
    witness_reject(&t, &[out(10_000, spk)])
}

#[test]
fn is_witness_standard_p2wsh_limits() {
    let bad = Some(REASON_NONSTANDARD_WITNESS);
    let p2wsh = |ws: &ScriptBuf| ws.to_p2wsh();
    let ws = script(&[0x51]);
    assert_eq!(
        witness_verdict(p2wsh(&ws), ScriptBuf::new(), vec![ws.to_bytes()]),
        None
    );
    // Witness script of 3600 bytes, then 3601.
    for (len, verdict) in [(3_600, None), (3_601, bad)] {
        let ws = ScriptBuf::from_bytes(vec![0x51; len]);
        assert_eq!(
            witness_verdict(p2wsh(&ws), ScriptBuf::new(), vec![ws.to_bytes()]),
            verdict
        );
    }
    // 100 items before the script, then 101; an item of 80 bytes, then 81.
    for (items, size, verdict) in [(100, 1, None), (101, 1, bad), (1, 80, None), (1, 81, bad)] {
        let mut w = vec![vec![0u8; size]; items];
        w.push(ws.to_bytes());
        assert_eq!(
            witness_verdict(p2wsh(&ws), ScriptBuf::new(), w.clone()),
            verdict
        );
        // The same limits through P2SH-P2WSH.
        let program = p2wsh(&ws);
        let sig = push(Builder::new(), program.to_bytes()).into_script();
        assert_eq!(witness_verdict(p2sh_of(&program), sig, w), verdict);
    }
}

#[test]
fn is_witness_standard_spent_types() {
    let bad = Some(REASON_NONSTANDARD_WITNESS);
    let w = vec![vec![1u8; 72], key33()];
    let p2wpkh = ScriptBuf::from_bytes([&[0x00, 20][..], &[0; 20]].concat());
    assert_eq!(witness_verdict(p2wpkh, ScriptBuf::new(), w.clone()), None);
    // A witness on a non-witness output.
    assert_eq!(witness_verdict(p2pkh(), ScriptBuf::new(), w.clone()), bad);
    // mempool_accept.py: witness stuffing on an anchor; an empty witness passes.
    let anchor = script(&[0x51, 0x02, 0x4e, 0x73]);
    assert_eq!(
        witness_verdict(anchor.clone(), ScriptBuf::new(), vec![vec![]]),
        bad
    );
    assert_eq!(witness_verdict(anchor, ScriptBuf::new(), vec![]), None);
    // P2SH whose scriptSig leaves no redeem script.
    assert_eq!(
        witness_verdict(p2sh_of(&script(&[0x51])), ScriptBuf::new(), w),
        bad
    );
    // Every failure is Core's class and reason.
    let mut spend = input(ScriptBuf::new());
    spend.witness = Witness::from_slice(&[vec![1u8]]);
    let t = tx(vec![spend], vec![out(1_000, p2pkh())]);
    let e = is_witness_standard(&t, &[out(1, p2pkh())]).unwrap_err();
    assert_eq!(e.to_string(), "bad-witness-nonstandard");
    assert_eq!(witness_reject(&t, &[]), bad, "spent outputs missing");
}

#[test]
fn is_witness_standard_taproot() {
    let bad = Some(REASON_NONSTANDARD_WITNESS);
    let p2tr = ScriptBuf::from_bytes([&[0x51, 32][..], &[7; 32]].concat());
    let sig = vec![1u8; 64];
    let leaf = vec![0x51];
    let control = |version: u8| [&[version][..], &[9; 32]].concat();
    let v = |w: Vec<Vec<u8>>| witness_verdict(p2tr.clone(), ScriptBuf::new(), w);
    assert_eq!(v(vec![sig.clone()]), None, "key path");
    assert_eq!(v(vec![sig.clone(), vec![0x50, 1]]), bad, "annex");
    assert_eq!(v(vec![vec![80; 80], leaf.clone(), control(0xc0)]), None);
    assert_eq!(
        v(vec![vec![81; 81], leaf.clone(), control(0xc0)]),
        bad,
        "tapscript item"
    );
    assert_eq!(
        v(vec![vec![81; 81], leaf.clone(), control(0xc1)]),
        bad,
        "parity bit"
    );
    assert_eq!(
        v(vec![vec![81; 81], leaf.clone(), control(0xc2)]),
        None,
        "other leaf version"
    );
    assert_eq!(v(vec![leaf.clone(), vec![]]), bad, "empty control block");
    // Wrapped in P2SH, a v1 program gets no taproot rules.
    let sig_script = push(Builder::new(), p2tr.to_bytes()).into_script();
    assert_eq!(
        witness_verdict(p2sh_of(&p2tr), sig_script, vec![sig, vec![0x50, 1]]),
        None
    );
}

#[test]
fn sigop_cost_and_vsize() {
    assert_eq!(sigop_adjusted_vsize(400, 0, 20), 100);
    assert_eq!(sigop_adjusted_vsize(401, 0, 20), 101);
    assert_eq!(sigop_adjusted_vsize(400, 100, 20), 500);
    assert_eq!(sigop_adjusted_vsize(400, 100, 0), 100);
    // Each bare 1-of-1 output counts 20 legacy sigops: cost 80.
    let mut t = tx(
        vec![input(ScriptBuf::new())],
        vec![out(1_000, bare_multisig(1, 1)); 200],
    );
    let spent = [out(1, p2pkh())];
    assert_eq!(check_standard_sigops(&t, &spent), Ok(16_000));
    t.output.push(out(1_000, bare_multisig(1, 1)));
    let e = check_standard_sigops(&t, &spent).unwrap_err();
    assert_eq!(e.class, TxRejectClass::NotStandard);
    assert_eq!(e.to_string(), "bad-txns-too-many-sigops, 16080");
    // P2SH (× 4) and witness sigops need the spent outputs.
    let (p2sh_in, p2sh_out) = p2sh_checksigs(3);
    let mut wsh_in = input(ScriptBuf::new());
    let ws = ScriptBuf::from_bytes(vec![0xac; 2]);
    wsh_in.witness = Witness::from_slice(&[ws.to_bytes()]);
    let t = tx(vec![p2sh_in, wsh_in], vec![out(1_000, p2pkh())]);
    assert_eq!(
        transaction_sigop_cost(&t, &[p2sh_out, out(1, ws.to_p2wsh())]),
        4 + 12 + 2
    );
}

#[test]
fn truc_size_limit() {
    let mut t = reference_tx();
    t.version = Version(3);
    assert_eq!(check_truc_size(&t, TRUC_MAX_VSIZE), Ok(()));
    let e = check_truc_size(&t, TRUC_MAX_VSIZE + 1).unwrap_err();
    assert_eq!(
        (e.class, &*e.reason),
        (TxRejectClass::MempoolPolicy, "TRUC-violation")
    );
    let ids = TxIds::of(&t);
    assert_eq!(
        e.debug,
        format!(
            "version=3 tx {} (wtxid={}) is too big: 10001 > 10000 virtual bytes",
            ids.txid, ids.wtxid
        )
    );
    t.version = Version::TWO;
    assert_eq!(check_truc_size(&t, TRUC_MAX_VSIZE + 1), Ok(()));
    // The pool-dependent texts, as Core words them.
    let v = TrucViolation::NonTrucSpendsTruc {
        tx: ids,
        parent: ids,
    };
    assert_eq!(
        v.to_string(),
        format!("non-version=3 tx {ids} cannot spend from version=3 tx {ids}")
    );
    let v = TrucViolation::TooManyDescendants { parent: ids };
    assert_eq!(
        v.reject().to_string(),
        format!(
            "TRUC-violation, tx {} (wtxid={}) would exceed descendant count limit",
            ids.txid, ids.wtxid
        )
    );
}

/// mempool_ephemeral_dust.py: a child must sweep its parent's dust.
#[test]
fn ephemeral_dust_must_be_spent() {
    let parent = tx(
        vec![input(ScriptBuf::new())],
        vec![out(0, p2pkh()), out(50_000, p2pkh())],
    );
    let parent_txid = parent.compute_txid();
    let spending = |vouts: &[u32]| {
        let mut child = tx(
            vec![input(ScriptBuf::new()); vouts.len()],
            vec![out(40_000, p2pkh())],
        );
        for (txin, &vout) in child.input.iter_mut().zip(vouts) {
            txin.previous_output = OutPoint {
                txid: parent_txid,
                vout,
            };
        }
        child
    };
    let lookup = |txid: &bitcoin::Txid| (*txid == parent_txid).then_some(&parent);
    let child = spending(&[1]);
    let e = check_ephemeral_spends(&child, 3_000, lookup).unwrap_err();
    assert_eq!(
        (e.class, &*e.reason),
        (TxRejectClass::MempoolPolicy, "missing-ephemeral-spends")
    );
    let ids = TxIds::of(&child);
    assert_eq!(
        e.to_string(),
        format!(
            "missing-ephemeral-spends, tx {} (wtxid={}) did not spend parent's ephemeral dust",
            ids.txid, ids.wtxid
        )
    );
    assert_eq!(
        check_ephemeral_spends(&spending(&[0, 1]), 3_000, lookup),
        Ok(())
    );
    assert_eq!(
        check_ephemeral_spends(&spending(&[0]), 3_000, lookup),
        Ok(())
    );
    // A confirmed parent (not found) has no ephemeral dust to sweep.
    assert_eq!(check_ephemeral_spends(&child, 3_000, |_| None), Ok(()));
}

/// A reason the policy functions give: always one of Core's fixed strings.
fn static_reason(reason: std::borrow::Cow<'static, str>) -> &'static str {
    match reason {
        std::borrow::Cow::Borrowed(r) => r,
        std::borrow::Cow::Owned(r) => panic!("a formatted reason from the policy: {r}"),
    }
}
