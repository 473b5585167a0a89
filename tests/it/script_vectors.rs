//! Bitcoin Core's script and transaction test vectors, every case, through
//! kakehi's verification call ([`PreparedTx::verify`], Core 26.0's
//! interpreter): `testnet-data/core-vectors/` (Core 31.99's
//! `src/test/data/`, see that directory's README).
//!
//! Each runner does what Core's own does (`script_tests.cpp`
//! `script_json_test` + `DoTest`, `transaction_tests.cpp` `tx_valid` /
//! `tx_invalid` + `CheckTxScripts`), with the one-flag variations and
//! without the random ones. A mismatch is any verdict that differs, or a
//! script error other than the one the vector names. The vectors are Core
//! 31.99's and the engine is Core 26.0: where Core changed the error a case
//! reports between the two (three changes, `common::core_versions`), the
//! engine's older error is accepted and counted; the verdict must still be
//! the same.

use crate::common;

use std::collections::HashMap;

use bitcoin::consensus::{deserialize, serialize};
use bitcoin::hex::FromHex;
use bitcoin::taproot::{LeafVersion, TaprootBuilder};
use bitcoin::{Amount, OutPoint, ScriptBuf, Transaction, Txid};
use kakehi::validation::check_transaction;
use kakehi::validation::script::{PreparedTx, ScriptError, ScriptFlags, SpentTxOut, VerifyError};

use common::{core_asm, core_versions};

/// All 21 flags Core defines.
const ALL: ScriptFlags = ScriptFlags::from_bits((1 << 21) - 1);

fn vectors(name: &str) -> Vec<serde_json::Value> {
    match common::json(&format!("core-vectors/{name}")) {
        serde_json::Value::Array(v) => v,
        other => panic!("{name} is not an array: {other}"),
    }
}

fn hex(s: &str) -> Vec<u8> {
    Vec::from_hex(s).unwrap_or_else(|e| panic!("bad hex {s}: {e}"))
}

/// Core's `ParseScriptFlags`: `NONE`, or names joined by commas.
fn parse_flags(s: &str) -> ScriptFlags {
    if s.is_empty() || s == "NONE" {
        return ScriptFlags::NONE;
    }
    s.split(',').fold(ScriptFlags::NONE, |acc, name| {
        acc | ScriptFlags::from_name(name).unwrap_or_else(|| panic!("unknown flag {name}"))
    })
}

/// Core's `TrimFlags`: WITNESS needs P2SH, CLEANSTACK needs WITNESS.
fn trim(mut f: ScriptFlags) -> ScriptFlags {
    if !f.contains(ScriptFlags::P2SH) {
        f = f.without(ScriptFlags::WITNESS);
    }
    if !f.contains(ScriptFlags::WITNESS) {
        f = f.without(ScriptFlags::CLEANSTACK);
    }
    f
}

/// Core's `FillFlags`: CLEANSTACK implies WITNESS implies P2SH.
fn fill(mut f: ScriptFlags) -> ScriptFlags {
    if f.contains(ScriptFlags::CLEANSTACK) {
        f |= ScriptFlags::WITNESS;
    }
    if f.contains(ScriptFlags::WITNESS) {
        f |= ScriptFlags::P2SH;
    }
    f
}

/// `!f` over the 21 defined bits.
fn complement(f: ScriptFlags) -> ScriptFlags {
    ALL.without(f)
}

/// How the engine's error compares with the one a vector names.
#[derive(Debug, PartialEq, Eq)]
enum Match {
    /// The same error.
    Same,
    /// Core changed the error for this case after 26.0 (`common::core_versions`).
    Translated,
    /// A mismatch.
    Different,
}

/// Compares the engine's (Core 26.0) error with the one a Core 31.99
/// vector names. `scripts` are the case's scripts (scriptSig, scriptPubKey,
/// witness), for the OP_IF change.
fn compare(expected: &str, got: &str, scripts: &[&[u8]]) -> Match {
    let has_if = scripts
        .iter()
        .any(|s| s.iter().any(|b| *b == 0x63 || *b == 0x64));
    match (expected, got) {
        _ if expected == got => Match::Same,
        // The same enumerator; Core's test table spells it without `SIG_`.
        ("NULLFAIL", "SIG_NULLFAIL") => Match::Same,
        _ if core_versions::is_version_change(expected, got, has_if) => Match::Translated,
        _ => Match::Different,
    }
}

/// The verdict of one input: `Ok` or Core's error name.
fn verdict(p: &PreparedTx, input: usize, flags: ScriptFlags) -> Result<(), &'static str> {
    match p.verify(input, flags) {
        Ok(()) => Ok(()),
        Err(VerifyError::Script { error }) => Err(error.name()),
        Err(e) => panic!("engine refused the call ({flags}): {e}"),
    }
}

/// Core's `BuildCreditingTransaction` + `BuildSpendingTransaction`.
fn spending_tx(script_sig: Vec<u8>, witness: Vec<Vec<u8>>, spk: &[u8], value: u64) -> Vec<u8> {
    let credit = Transaction {
        version: bitcoin::transaction::Version::ONE,
        lock_time: bitcoin::absolute::LockTime::ZERO,
        input: vec![bitcoin::TxIn {
            previous_output: OutPoint::null(),
            script_sig: ScriptBuf::from_bytes(vec![0x00, 0x00]),
            sequence: bitcoin::Sequence::MAX,
            witness: bitcoin::Witness::new(),
        }],
        output: vec![bitcoin::TxOut {
            value: Amount::from_sat(value),
            script_pubkey: ScriptBuf::from_bytes(spk.to_vec()),
        }],
    };
    let spend = Transaction {
        version: bitcoin::transaction::Version::ONE,
        lock_time: bitcoin::absolute::LockTime::ZERO,
        input: vec![bitcoin::TxIn {
            previous_output: OutPoint {
                txid: credit.compute_txid(),
                vout: 0,
            },
            script_sig: ScriptBuf::from_bytes(script_sig),
            sequence: bitcoin::Sequence::MAX,
            witness: bitcoin::Witness::from_slice(&witness),
        }],
        output: vec![bitcoin::TxOut {
            value: Amount::from_sat(value),
            script_pubkey: ScriptBuf::new(),
        }],
    };
    serialize(&spend)
}

/// The taproot output and control block Core's test builds for
/// `#TAPROOTOUTPUT#` / `#CONTROLBLOCK#`: one tapscript leaf at depth 0,
/// internal key key0 (secret key 1).
fn taproot_leaf(script: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let secp = bitcoin::secp256k1::Secp256k1::new();
    let mut one = [0u8; 32];
    one[31] = 1;
    let key = bitcoin::secp256k1::SecretKey::from_slice(&one).expect("key 1");
    let (internal, _) = key.public_key(&secp).x_only_public_key();
    let leaf = ScriptBuf::from_bytes(script.to_vec());
    let info = TaprootBuilder::new()
        .add_leaf(0, leaf.clone())
        .expect("leaf")
        .finalize(&secp, internal)
        .expect("finalize");
    let control = info
        .control_block(&(leaf, LeafVersion::TapScript))
        .expect("control block");
    let mut spk = vec![0x51, 0x20];
    spk.extend_from_slice(&info.output_key().serialize());
    (spk, control.serialize())
}

/// Tallies of a runner.
#[derive(Default, Debug)]
struct Tally {
    cases: usize,
    checks: usize,
    translated: usize,
    mismatches: Vec<String>,
}

#[test]
fn vector_files_are_the_documented_copies() {
    use bitcoin::hashes::{sha256, Hash};
    for (name, sum) in [
        (
            "script_tests.json",
            "bc23cb1dfa760d50042f534da23cbbe4b6fbb03d7def0b64f8de049453d6ead5",
        ),
        (
            "tx_valid.json",
            "f8a9e275c581aa24650695bd2b1c718d30f948452934accee83cb32331a9a7a0",
        ),
        (
            "tx_invalid.json",
            "0c02ce44ff3a880458f9569a25589315a07f924fcaadac828613d4615776ca52",
        ),
        (
            "bip341_wallet_vectors.json",
            "403e19fb81dd1f31e745699216308f61fb403774b2aafa87b631b8f7c042d37f",
        ),
    ] {
        let bytes = std::fs::read(common::data(&format!("core-vectors/{name}"))).expect("read");
        // sha256sum's order: the digest's bytes as computed, not reversed.
        let digest = sha256::Hash::hash(&bytes).to_byte_array();
        let shown: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(shown, sum, "{name} (testnet-data/core-vectors/README.md)");
    }
}

#[test]
fn core_asm_parser_matches_cores_encoding() {
    assert_eq!(
        core_asm::parse("0 1 16 -1 17"),
        [0x00, 0x51, 0x60, 0x4f, 0x01, 0x11]
    );
    assert_eq!(
        core_asm::parse("DUP OP_HASH160 0x14 0xab"),
        [0x76, 0xa9, 0x14, 0xab]
    );
    assert_eq!(core_asm::parse("'ab' ''"), [0x02, b'a', b'b', 0x00]);
    assert_eq!(
        core_asm::parse("-128 128"),
        [0x02, 0x80, 0x80, 0x02, 0x80, 0x00]
    );
}

/// One `script_tests.json` case.
struct ScriptCase {
    witness: Vec<Vec<u8>>,
    /// The crediting output's value, sats.
    value: u64,
    script_sig: Vec<u8>,
    spk: Vec<u8>,
    flags: String,
    /// Core's error name, or `OK`.
    expected: String,
}

fn script_case(t: &[serde_json::Value]) -> ScriptCase {
    let mut pos = 0;
    let mut witness = Vec::new();
    let mut value = 0;
    let mut leaf = None;
    if let Some(serde_json::Value::Array(w)) = t.first() {
        let (amount, items) = w.split_last().expect("witness array has an amount");
        for item in items {
            let s = item.as_str().expect("witness item");
            if let Some(asm) = s.strip_prefix("#SCRIPT#") {
                witness.push(core_asm::parse(asm));
            } else if s == "#CONTROLBLOCK#" {
                let script = witness.last().expect("script before control block").clone();
                let (spk, control) = taproot_leaf(&script);
                witness.push(control);
                leaf = Some(spk);
            } else {
                witness.push(hex(s));
            }
        }
        value = (amount.as_f64().expect("amount") * 1e8).round() as u64;
        pos = 1;
    }
    let text = |i: usize| t[pos + i].as_str().expect("string").to_string();
    let script_sig = core_asm::parse(&text(0));
    let spk = match text(1).as_str() {
        "0x51 0x20 #TAPROOTOUTPUT#" => leaf.expect("#TAPROOTOUTPUT# needs a #CONTROLBLOCK#"),
        s => core_asm::parse(s),
    };
    ScriptCase {
        witness,
        value,
        script_sig,
        spk,
        flags: text(2),
        expected: text(3),
    }
}

#[test]
fn script_tests_json_every_case() {
    let mut tally = Tally::default();
    for t in vectors("script_tests.json") {
        let t = t.as_array().expect("case is an array");
        let offset = usize::from(matches!(t.first(), Some(serde_json::Value::Array(_))));
        if t.len() < 4 + offset {
            continue; // a comment
        }
        let ScriptCase {
            witness,
            value,
            script_sig,
            spk,
            flags,
            expected,
        } = script_case(t);
        let mut flags = parse_flags(&flags);
        if flags.contains(ScriptFlags::CLEANSTACK) {
            flags |= ScriptFlags::P2SH | ScriptFlags::WITNESS;
        }
        let tx = spending_tx(script_sig.clone(), witness.clone(), &spk, value);
        let spent = [SpentTxOut {
            value: Amount::from_sat(value),
            script_pubkey: &spk,
        }];
        let p = PreparedTx::new(&tx, &spent).expect("prepare");
        tally.cases += 1;
        let got = verdict(&p, 0, flags);
        tally.checks += 1;
        let mut scripts: Vec<&[u8]> = vec![&script_sig, &spk];
        scripts.extend(witness.iter().map(Vec::as_slice));
        match compare(&expected, got.err().unwrap_or("OK"), &scripts) {
            Match::Same => {}
            Match::Translated => tally.translated += 1,
            Match::Different => {
                tally
                    .mismatches
                    .push(format!("{t:?}: got {got:?}, want {expected}"));
                continue;
            }
        }
        let want: Result<(), ()> = if expected == "OK" { Ok(()) } else { Err(()) };
        // Removing a flag from a passing case, or adding one to a failing
        // case, does not change the verdict (DoTest, one flag at a time).
        for (name, f) in ScriptFlags::NAMED {
            let other = if want.is_ok() {
                flags.without(f)
            } else {
                flags | f
            };
            if other.contains(ScriptFlags::CLEANSTACK)
                && !other.contains(ScriptFlags::P2SH | ScriptFlags::WITNESS)
                || other.contains(ScriptFlags::WITNESS) && !other.contains(ScriptFlags::P2SH)
            {
                continue;
            }
            tally.checks += 1;
            if verdict(&p, 0, other).is_ok() != want.is_ok() {
                tally
                    .mismatches
                    .push(format!("{t:?}: verdict changes with {name}"));
            }
        }
    }
    eprintln!(
        "script_tests.json: {} cases, {} checks, {} error names translated from Core 31.99, {} mismatches",
        tally.cases,
        tally.checks,
        tally.translated,
        tally.mismatches.len()
    );
    assert_eq!(
        tally.cases, 1222,
        "every case of Core's script_tests.json ran"
    );
    assert!(tally.mismatches.is_empty(), "{:#?}", tally.mismatches);
}

/// A transaction case: its inputs' prevouts and the transaction.
struct TxCase {
    prevouts: HashMap<OutPoint, (Vec<u8>, u64)>,
    raw: Vec<u8>,
    flags: String,
    text: String,
}

fn tx_cases(name: &str) -> Vec<TxCase> {
    let mut out = Vec::new();
    for t in vectors(name) {
        let a = t.as_array().expect("case is an array");
        let Some(serde_json::Value::Array(inputs)) = a.first() else {
            continue; // a comment
        };
        let mut prevouts = HashMap::new();
        for i in inputs {
            let i = i.as_array().expect("input");
            let txid: Txid = i[0].as_str().expect("txid").parse().expect("txid hex");
            let vout = i[1].as_i64().expect("vout") as u32;
            let spk = core_asm::parse(i[2].as_str().expect("script"));
            let value = i.get(3).and_then(|v| v.as_u64()).unwrap_or(0);
            prevouts.insert(OutPoint { txid, vout }, (spk, value));
        }
        out.push(TxCase {
            prevouts,
            raw: hex(a[1].as_str().expect("tx hex")),
            flags: a[2].as_str().expect("flags").to_string(),
            text: t.to_string(),
        });
    }
    out
}

impl TxCase {
    fn prepare(&self) -> (PreparedTx, usize) {
        let tx: Transaction = deserialize(&self.raw).expect("rust-bitcoin decodes the transaction");
        let spent: Vec<SpentTxOut<'_>> = tx
            .input
            .iter()
            .map(|i| {
                let (spk, value) = &self.prevouts[&i.previous_output];
                SpentTxOut {
                    value: Amount::from_sat(*value),
                    script_pubkey: spk,
                }
            })
            .collect();
        (
            PreparedTx::new(&self.raw, &spent).expect("prepare"),
            tx.input.len(),
        )
    }

    /// Core's `CheckTxScripts`: every input in order, stopping at the first
    /// failure; true when all pass.
    fn all_pass(&self, p: &PreparedTx, inputs: usize, flags: ScriptFlags) -> bool {
        (0..inputs).all(|i| verdict(p, i, flags).is_ok())
    }
}

#[test]
fn tx_valid_json_every_case() {
    let mut tally = Tally::default();
    for case in tx_cases("tx_valid.json") {
        tally.cases += 1;
        let tx: Transaction = deserialize(&case.raw).expect("decodes");
        if let Err(e) = check_transaction(&tx) {
            tally
                .mismatches
                .push(format!("{}: CheckTransaction: {e}", case.text));
            continue;
        }
        let (p, inputs) = case.prepare();
        let excluded = parse_flags(&case.flags);
        assert_eq!(
            complement(excluded),
            fill(complement(excluded)),
            "bad flags: {}",
            case.text
        );
        let mut check = |flags: ScriptFlags, want: bool, what: &str| {
            tally.checks += 1;
            if case.all_pass(&p, inputs, flags) != want {
                tally
                    .mismatches
                    .push(format!("{}: {what} ({flags})", case.text));
            }
        };
        check(
            complement(excluded),
            true,
            "fails with the flags not excluded",
        );
        for (name, f) in ScriptFlags::NAMED {
            // Removing a flag never invalidates a valid transaction.
            check(
                trim(complement(excluded | f)),
                true,
                &format!("fails without {name}"),
            );
            // The exclusions are minimal: enabling any excluded flag fails.
            let fewer = trim(excluded.without(f));
            if fewer != excluded {
                check(complement(fewer), false, &format!("passes with {name}"));
            }
        }
    }
    eprintln!(
        "tx_valid.json: {} cases, {} checks, {} mismatches",
        tally.cases,
        tally.checks,
        tally.mismatches.len()
    );
    assert_eq!(tally.cases, 121, "every case of Core's tx_valid.json ran");
    assert!(tally.mismatches.is_empty(), "{:#?}", tally.mismatches);
}

#[test]
fn tx_invalid_json_every_case() {
    let mut tally = Tally::default();
    let mut badtx = 0;
    for case in tx_cases("tx_invalid.json") {
        tally.cases += 1;
        // Core's CheckTransaction first; "BADTX" cases must fail it.
        let structure = deserialize::<Transaction>(&case.raw)
            .map_err(|e| e.to_string())
            .and_then(|tx| check_transaction(&tx).map_err(|e| e.to_string()));
        if structure.is_err() || case.flags == "BADTX" {
            if case.flags != "BADTX" || structure.is_ok() {
                tally.mismatches.push(format!(
                    "{}: CheckTransaction gives {structure:?}",
                    case.text
                ));
            }
            badtx += 1;
            continue;
        }
        let (p, inputs) = case.prepare();
        let flags = parse_flags(&case.flags);
        assert_eq!(flags, fill(flags), "bad flags: {}", case.text);
        let mut check = |flags: ScriptFlags, what: &str| {
            tally.checks += 1;
            if case.all_pass(&p, inputs, flags) {
                tally
                    .mismatches
                    .push(format!("{}: passes {what} ({flags})", case.text));
            }
        };
        check(flags, "with its flags");
        for (name, f) in ScriptFlags::NAMED {
            // Adding a flag never validates an invalid transaction.
            check(fill(flags | f), &format!("with {name} added"));
        }
    }
    eprintln!(
        "tx_invalid.json: {} cases ({badtx} BADTX), {} checks, {} mismatches",
        tally.cases,
        tally.checks,
        tally.mismatches.len()
    );
    assert_eq!(tally.cases, 93, "every case of Core's tx_invalid.json ran");
    assert!(tally.mismatches.is_empty(), "{:#?}", tally.mismatches);
}

#[test]
fn bip341_wallet_vectors_key_path_spends() {
    let v = common::json("core-vectors/bip341_wallet_vectors.json");
    let flags = ScriptFlags::P2SH | ScriptFlags::WITNESS | ScriptFlags::TAPROOT;
    let mut verified = 0;
    for case in v["keyPathSpending"].as_array().expect("keyPathSpending") {
        let utxos: Vec<(Vec<u8>, u64)> = case["given"]["utxosSpent"]
            .as_array()
            .expect("utxosSpent")
            .iter()
            .map(|u| {
                (
                    hex(u["scriptPubKey"].as_str().expect("spk")),
                    u["amountSats"].as_u64().expect("amount"),
                )
            })
            .collect();
        let spent: Vec<SpentTxOut<'_>> = utxos
            .iter()
            .map(|(spk, value)| SpentTxOut {
                value: Amount::from_sat(*value),
                script_pubkey: spk,
            })
            .collect();
        let unsigned: Transaction =
            deserialize(&hex(case["given"]["rawUnsignedTx"].as_str().expect("tx"))).expect("tx");
        for input in case["inputSpending"].as_array().expect("inputSpending") {
            let index = input["given"]["txinIndex"].as_u64().expect("index") as usize;
            let witness: Vec<Vec<u8>> = input["expected"]["witness"]
                .as_array()
                .expect("witness")
                .iter()
                .map(|w| hex(w.as_str().expect("item")))
                .collect();
            let mut tx = unsigned.clone();
            tx.input[index].witness = bitcoin::Witness::from_slice(&witness);
            let p = PreparedTx::new(&serialize(&tx), &spent).expect("prepare");
            assert_eq!(p.verify(index, flags), Ok(()), "input {index} verifies");
            // One flipped bit of the signature: Core's SCHNORR_SIG.
            let mut bad = witness.clone();
            bad[0][10] ^= 1;
            tx.input[index].witness = bitcoin::Witness::from_slice(&bad);
            let p = PreparedTx::new(&serialize(&tx), &spent).expect("prepare");
            let err = p
                .verify(index, flags)
                .expect_err("tampered signature fails");
            assert_eq!(
                err,
                VerifyError::Script {
                    error: ScriptError::from_name("SCHNORR_SIG").expect("name")
                }
            );
            verified += 1;
        }
        // The fully signed transaction: every input verifies, the P2PKH and
        // P2WPKH ones among them.
        let full = hex(case["auxiliary"]["fullySignedTx"].as_str().expect("tx"));
        let p = PreparedTx::new(&full, &spent).expect("prepare");
        for i in 0..utxos.len() {
            assert_eq!(p.verify(i, flags), Ok(()), "input {i} of fullySignedTx");
            verified += 1;
        }
    }
    assert_eq!(
        verified,
        7 + 9,
        "7 key-path spends, then the 9 inputs of the signed tx"
    );
}
