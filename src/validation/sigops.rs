//! Signature-operation counting, exactly as Bitcoin Core counts for the
//! block sigop-cost limit (BIP141: 80,000 per block).
//!
//! Core counts in two ways: *legacy* (`OP_CHECKMULTISIG` always counts 20)
//! for scriptSigs and scriptPubKeys, and *accurate* (a multisig preceded by
//! `OP_1`..`OP_16` counts that number) for P2SH redeem scripts and P2WSH
//! witness scripts. The cost of a transaction is legacy × 4 + P2SH × 4 +
//! witness sigops (`GetTransactionSigOpCost`).
//!
//! rust-bitcoin's `Script::count_sigops` differs from Core in one corner
//! (it does not forget a preceding `OP_n` across an intervening
//! `OP_CHECKSIG`), so kakehi counts with its own loop that follows Core's
//! `CScript::GetSigOpCount` opcode by opcode.
//!
//! Source: Bitcoin Core `src/script/script.cpp` (`GetSigOpCount`),
//! `src/script/interpreter.cpp` (`CountWitnessSigOps`),
//! `src/consensus/tx_verify.cpp` (`GetLegacySigOpCount`,
//! `GetP2SHSigOpCount`, `GetTransactionSigOpCost`).

use bitcoin::script::Instruction;
use bitcoin::{Script, Transaction, TxIn};

use super::script::ScriptFlags;

/// Weight units per byte of base data, and the factor legacy and P2SH
/// sigops are multiplied by (BIP141 `WITNESS_SCALE_FACTOR`).
pub const WITNESS_SCALE_FACTOR: u64 = 4;

/// Sigops a legacy `OP_CHECKMULTISIG` counts for (`MAX_PUBKEYS_PER_MULTISIG`).
const MAX_PUBKEYS_PER_MULTISIG: u64 = 20;

const OP_1: u8 = 0x51;
const OP_16: u8 = 0x60;
const OP_CHECKSIG: u8 = 0xac;
const OP_CHECKSIGVERIFY: u8 = 0xad;
const OP_CHECKMULTISIG: u8 = 0xae;
const OP_CHECKMULTISIGVERIFY: u8 = 0xaf;

/// Counts the sigops of `script` (Core's `CScript::GetSigOpCount(fAccurate)`).
///
/// Parsing stops at the first malformed push, counting what came before.
pub fn count_sigops(script: &Script, accurate: bool) -> u64 {
    let mut count = 0u64;
    // The previous opcode, if it was OP_1..OP_16 (pushes and other opcodes reset it).
    let mut last_op: Option<u8> = None;
    for instruction in script.instructions() {
        let op = match instruction {
            Err(_) => break,
            Ok(Instruction::PushBytes(_)) => {
                last_op = None;
                continue;
            }
            Ok(Instruction::Op(op)) => op.to_u8(),
        };
        match op {
            OP_CHECKSIG | OP_CHECKSIGVERIFY => count += 1,
            OP_CHECKMULTISIG | OP_CHECKMULTISIGVERIFY => match last_op {
                Some(n) if accurate && (OP_1..=OP_16).contains(&n) => {
                    count += u64::from(n - OP_1 + 1)
                }
                _ => count += MAX_PUBKEYS_PER_MULTISIG,
            },
            _ => {}
        }
        last_op = Some(op);
    }
    count
}

/// The data of the last push of `script_sig`, or `None` when the script
/// has an opcode above `OP_16` or a malformed push (Core returns 0 sigops
/// then). A final `OP_n` leaves empty data, as in Core's `GetOp`.
fn last_push(script_sig: &Script) -> Option<Vec<u8>> {
    let mut data = Vec::new();
    for instruction in script_sig.instructions() {
        match instruction {
            Err(_) => return None,
            Ok(Instruction::PushBytes(bytes)) => data = bytes.as_bytes().to_vec(),
            Ok(Instruction::Op(op)) if op.to_u8() <= OP_16 => data.clear(),
            Ok(Instruction::Op(_)) => return None,
        }
    }
    Some(data)
}

/// Legacy sigops of a transaction: every scriptSig and scriptPubKey counted
/// the legacy way (Core's `GetLegacySigOpCount`). Not yet scaled by 4.
pub fn legacy_sigops(tx: &Transaction) -> u64 {
    let inputs: u64 = tx
        .input
        .iter()
        .map(|i| count_sigops(&i.script_sig, false))
        .sum();
    let outputs: u64 = tx
        .output
        .iter()
        .map(|o| count_sigops(&o.script_pubkey, false))
        .sum();
    inputs + outputs
}

/// P2SH sigops of one input spending `spent_script`: the accurate count of
/// the redeem script (the scriptSig's last push) when `spent_script` is
/// P2SH, else 0 (Core's `CScript::GetSigOpCount(scriptSig)` as used by
/// `GetP2SHSigOpCount`). Not yet scaled by 4.
pub fn p2sh_sigops(input: &TxIn, spent_script: &Script) -> u64 {
    if !spent_script.is_p2sh() {
        return 0;
    }
    match last_push(&input.script_sig) {
        Some(redeem) => count_sigops(Script::from_bytes(&redeem), true),
        None => 0,
    }
}

/// Witness sigops of one input spending `spent_script` (Core's
/// `CountWitnessSigOps`): P2WPKH counts 1, P2WSH the accurate count of the
/// witness script (the last witness item), the same for witness programs
/// wrapped in P2SH; other witness versions count 0 (BIP342 has its own
/// budget). The caller applies it only when segwit is active.
pub fn witness_sigops(input: &TxIn, spent_script: &Script) -> u64 {
    if spent_script.is_witness_program() {
        return witness_program_sigops(spent_script.as_bytes(), input);
    }
    if spent_script.is_p2sh() && input.script_sig.is_push_only() {
        if let Some(redeem) = last_push(&input.script_sig) {
            if Script::from_bytes(&redeem).is_witness_program() {
                return witness_program_sigops(&redeem, input);
            }
        }
    }
    0
}

/// The sigop cost of `tx`'s inputs that needs the outputs they spend:
/// P2SH sigops × 4 when `flags` has P2SH, plus witness sigops when it has
/// WITNESS (the part of Core's `GetTransactionSigOpCost` after the legacy
/// count). `spent_scripts` yields the spent scriptPubKeys in input order;
/// inputs beyond its end count 0.
pub fn input_sigop_cost<'a>(
    tx: &Transaction,
    spent_scripts: impl IntoIterator<Item = &'a Script>,
    flags: ScriptFlags,
) -> u64 {
    let p2sh_active = flags.contains(ScriptFlags::P2SH);
    let segwit_active = flags.contains(ScriptFlags::WITNESS);
    let mut cost = 0;
    for (input, script) in tx.input.iter().zip(spent_scripts) {
        if p2sh_active {
            cost += p2sh_sigops(input, script) * WITNESS_SCALE_FACTOR;
        }
        if segwit_active {
            cost += witness_sigops(input, script);
        }
    }
    cost
}

/// `WitnessSigOps` for a script already known to be a witness program
/// (`version_opcode push_len program`).
fn witness_program_sigops(program_script: &[u8], input: &TxIn) -> u64 {
    // Version 0 is OP_0 (0x00); the program follows the 1-byte push length.
    if program_script.first() != Some(&0x00) {
        return 0;
    }
    match program_script.len() - 2 {
        20 => 1,
        32 => match input.witness.last() {
            Some(witness_script) => count_sigops(Script::from_bytes(witness_script), true),
            None => 0,
        },
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::hex::FromHex;
    use bitcoin::{ScriptBuf, Witness};

    fn script(hex: &str) -> ScriptBuf {
        ScriptBuf::from_bytes(Vec::from_hex(hex).expect("test hex"))
    }

    #[test]
    fn legacy_and_accurate_multisig() {
        // 1-of-3 bare multisig: OP_1 <33> <33> <33> OP_3 OP_CHECKMULTISIG
        let mut hex = String::from("51");
        for _ in 0..3 {
            hex.push_str("21");
            hex.push_str(&"02".repeat(33));
        }
        hex.push_str("53ae");
        let ms = script(&hex);
        assert_eq!(count_sigops(&ms, false), 20);
        assert_eq!(count_sigops(&ms, true), 3);
        // P2PKH: one sigop either way.
        let p2pkh = script("76a914000000000000000000000000000000000000000088ac");
        assert_eq!(count_sigops(&p2pkh, false), 1);
        assert_eq!(count_sigops(&p2pkh, true), 1);
        // OP_2 OP_CHECKSIG OP_CHECKMULTISIG: the OP_n is forgotten after CHECKSIG (Core).
        assert_eq!(count_sigops(&script("52acae"), true), 21);
        // A truncated push stops counting: CHECKSIG then PUSHBYTES_5 with 1 byte.
        assert_eq!(count_sigops(&script("ac0501"), false), 1);
    }

    #[test]
    fn p2sh_and_witness_counts() {
        // 2-of-2 multisig: OP_2 <33> <33> OP_2 OP_CHECKMULTISIG.
        let redeem = script(&format!("5221{}21{}52ae", "02".repeat(33), "03".repeat(33)));
        let p2sh = redeem.to_p2sh();
        let mut input = TxIn::default();
        let mut sig = Vec::from_hex("00").expect("hex");
        sig.push(redeem.len() as u8);
        sig.extend_from_slice(redeem.as_bytes());
        input.script_sig = ScriptBuf::from_bytes(sig);
        assert_eq!(p2sh_sigops(&input, &p2sh), 2);
        assert_eq!(witness_sigops(&input, &p2sh), 0);
        // A non-push opcode in the scriptSig: 0 P2SH sigops.
        input.script_sig = script("ac");
        assert_eq!(p2sh_sigops(&input, &p2sh), 0);

        // P2WSH 2-of-2 (accurate count of the witness script = 2).
        let p2wsh = redeem.to_p2wsh();
        let winput = TxIn {
            witness: Witness::from_slice(&[vec![], vec![1u8; 71], redeem.to_bytes()]),
            ..TxIn::default()
        };
        assert_eq!(witness_sigops(&winput, &p2wsh), 2);
        // Empty witness: 0.
        assert_eq!(witness_sigops(&TxIn::default(), &p2wsh), 0);
        // P2WPKH: 1, whatever the witness.
        let p2wpkh = script("0014000000000000000000000000000000000000000a");
        assert_eq!(witness_sigops(&TxIn::default(), &p2wpkh), 1);
        // P2SH-P2WSH: the scriptSig pushes the witness program.
        let wrapped = p2wsh.to_p2sh();
        let mut sh = TxIn::default();
        let mut push = vec![p2wsh.len() as u8];
        push.extend_from_slice(p2wsh.as_bytes());
        sh.script_sig = ScriptBuf::from_bytes(push);
        sh.witness = winput.witness.clone();
        assert_eq!(witness_sigops(&sh, &wrapped), 2);
        // The redeem script is a witness program: accurate count of it is 0.
        assert_eq!(p2sh_sigops(&sh, &wrapped), 0);
        // Taproot: 0.
        let p2tr = script(&format!("5120{}", "11".repeat(32)));
        assert_eq!(witness_sigops(&winput, &p2tr), 0);
    }
}
