//! Standardness of what a transaction spends, which needs the spent
//! outputs: Bitcoin Core's `AreInputsStandard` (with the BIP-54 legacy
//! sigop limit Core 30.0 added), `IsWitnessStandard` and the sigop cost
//! check of `MemPoolAccept::PreChecks`.
//!
//! `spent` is always the outputs the inputs spend, one per input, in input
//! order (what Core reads from its `CCoinsViewCache`).
//!
//! Source: Bitcoin Core 30.0 `src/policy/policy.cpp` (`AreInputsStandard`,
//! `CheckSigopsBIP54`, `IsWitnessStandard`), `src/validation.cpp`
//! (`PreChecks`), `src/consensus/tx_verify.cpp` (`GetTransactionSigOpCost`).

use bitcoin::opcodes::all as op;
use bitcoin::script::Instruction;
use bitcoin::{Script, Transaction, TxIn, TxOut};

use super::solver::{is_pay_to_anchor, solver, TxoutType};
use super::{
    MAX_P2SH_SIGOPS, MAX_STANDARD_P2WSH_SCRIPT_SIZE, MAX_STANDARD_P2WSH_STACK_ITEMS,
    MAX_STANDARD_P2WSH_STACK_ITEM_SIZE, MAX_STANDARD_TAPSCRIPT_STACK_ITEM_SIZE,
    MAX_STANDARD_TX_SIGOPS_COST, MAX_TX_LEGACY_SIGOPS, STANDARD_SCRIPT_VERIFY_FLAGS,
};
use crate::mempool::reject::{TxReject, TxRejectClass};
use crate::validation::sigops::{self, WITNESS_SCALE_FACTOR};

/// Core's reject reason for [`are_inputs_standard`].
pub const REASON_NONSTANDARD_INPUTS: &str = "bad-txns-nonstandard-inputs";
/// Core's reject reason for [`is_witness_standard`].
pub const REASON_NONSTANDARD_WITNESS: &str = "bad-witness-nonstandard";
/// Core's reject reason for [`check_standard_sigops`].
pub const REASON_TOO_MANY_SIGOPS: &str = "bad-txns-too-many-sigops";

/// Largest element a script may push (`MAX_SCRIPT_ELEMENT_SIZE`), bytes.
const MAX_SCRIPT_ELEMENT_SIZE: usize = 520;
/// Largest script the interpreter runs (`MAX_SCRIPT_SIZE`), bytes.
const MAX_SCRIPT_SIZE: usize = 10_000;
/// Most elements on the interpreter's stacks (`MAX_STACK_SIZE`).
const MAX_STACK_SIZE: usize = 1_000;
/// First byte of a BIP-341 annex (`ANNEX_TAG`).
const ANNEX_TAG: u8 = 0x50;
/// Leaf-version bits of a control block's first byte (`TAPROOT_LEAF_MASK`).
const TAPROOT_LEAF_MASK: u8 = 0xfe;
/// Leaf version of BIP-342 tapscript (`TAPROOT_LEAF_TAPSCRIPT`).
const TAPROOT_LEAF_TAPSCRIPT: u8 = 0xc0;

/// Checks the inputs of `tx` against the outputs they spend (Core's
/// `AreInputsStandard`). A coinbase passes.
///
/// In Core 30.0's order: the BIP-54 count of legacy sigops (every
/// scriptSig, every spent scriptPubKey, every P2SH redeem script, counted
/// accurately) must not exceed [`MAX_TX_LEGACY_SIGOPS`]; then no input may
/// spend a nonstandard or `witness_unknown` output; and a P2SH input's
/// redeem script (the last element its scriptSig pushes) must exist and
/// have at most [`MAX_P2SH_SIGOPS`] sigops.
///
/// # Errors
///
/// [`TxRejectClass::InputsNotStandard`] with Core's reason
/// `bad-txns-nonstandard-inputs` and, as in Core 30.0, no debug message;
/// also when `spent` does not hold one output per input.
pub fn are_inputs_standard(tx: &Transaction, spent: &[TxOut]) -> Result<(), TxReject> {
    if tx.is_coinbase() {
        return Ok(());
    }
    let refuse = || TxReject::new(TxRejectClass::InputsNotStandard, REASON_NONSTANDARD_INPUTS);
    if spent.len() != tx.input.len() || legacy_sigops_bip54(tx, spent) > MAX_TX_LEGACY_SIGOPS {
        return Err(refuse());
    }
    for (input, prev) in tx.input.iter().zip(spent) {
        match solver(&prev.script_pubkey) {
            TxoutType::NonStandard | TxoutType::WitnessUnknown { .. } => return Err(refuse()),
            TxoutType::ScriptHash => {
                let redeem = redeem_script(&input.script_sig).ok_or_else(refuse)?;
                if sigops::count_sigops(Script::from_bytes(&redeem), true) > MAX_P2SH_SIGOPS {
                    return Err(refuse());
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The legacy sigops BIP-54 counts for `tx` (Core's `CheckSigopsBIP54`):
/// for each input, its scriptSig counted accurately plus the spent
/// scriptPubKey (its redeem script's accurate count when it is P2SH, its
/// own accurate count otherwise).
fn legacy_sigops_bip54(tx: &Transaction, spent: &[TxOut]) -> u64 {
    tx.input
        .iter()
        .zip(spent)
        .map(|(input, prev)| {
            let spk = &prev.script_pubkey;
            let prev_sigops = if spk.is_p2sh() {
                sigops::p2sh_sigops(input, spk)
            } else {
                sigops::count_sigops(spk, true)
            };
            sigops::count_sigops(&input.script_sig, true) + prev_sigops
        })
        .sum()
}

/// The last element `script_sig` leaves on the stack when run alone, as
/// Core's `EvalScript(stack, scriptSig, SCRIPT_VERIFY_NONE, …)` then
/// `stack.back()` do in `AreInputsStandard` and `IsWitnessStandard`.
///
/// `None` when Core's evaluation fails or leaves an empty stack: a script
/// over 10,000 bytes, a malformed push, a push over 520 bytes, more than
/// 1,000 elements, `OP_RESERVED`, or any opcode above `OP_16`. (Core would
/// run such opcodes; [`super::is_standard_tx`] has already refused a
/// scriptSig that is not push-only, so only a transaction refused anyway
/// can differ.)
fn redeem_script(script_sig: &Script) -> Option<Vec<u8>> {
    if script_sig.len() > MAX_SCRIPT_SIZE {
        return None;
    }
    let mut depth = 0usize;
    let mut last: Option<Vec<u8>> = None;
    for ins in script_sig.instructions() {
        let element = match ins.ok()? {
            Instruction::PushBytes(b) if b.len() <= MAX_SCRIPT_ELEMENT_SIZE => {
                b.as_bytes().to_vec()
            }
            Instruction::PushBytes(_) => return None,
            Instruction::Op(o) if o == op::OP_PUSHNUM_NEG1 => vec![0x81],
            Instruction::Op(o) => {
                let v = o.to_u8();
                let one = op::OP_PUSHNUM_1.to_u8();
                if !(one..=op::OP_PUSHNUM_16.to_u8()).contains(&v) {
                    return None;
                }
                vec![v - one + 1]
            }
        };
        depth += 1;
        if depth > MAX_STACK_SIZE {
            return None;
        }
        last = Some(element);
    }
    last
}

/// Checks the witnesses of `tx` (Core's `IsWitnessStandard`). A coinbase
/// passes, and so does every input with an empty witness.
///
/// An input with a witness must spend a witness program (directly, or
/// through a P2SH redeem script) other than pay-to-anchor. A P2WSH spend
/// may have a witness script of at most [`MAX_STANDARD_P2WSH_SCRIPT_SIZE`]
/// bytes and at most [`MAX_STANDARD_P2WSH_STACK_ITEMS`] other items of at
/// most [`MAX_STANDARD_P2WSH_STACK_ITEM_SIZE`] bytes. A native P2TR spend
/// may have no annex, and a tapscript spend no stack item over
/// [`MAX_STANDARD_TAPSCRIPT_STACK_ITEM_SIZE`] bytes.
///
/// # Errors
///
/// [`TxRejectClass::WitnessMutated`] with Core's reason
/// `bad-witness-nonstandard` (Core treats a bloated witness like a
/// mutated one: the same transaction with a good witness may still come);
/// also when `spent` does not hold one output per input.
pub fn is_witness_standard(tx: &Transaction, spent: &[TxOut]) -> Result<(), TxReject> {
    if tx.is_coinbase() {
        return Ok(());
    }
    let refuse = || TxReject::new(TxRejectClass::WitnessMutated, REASON_NONSTANDARD_WITNESS);
    if spent.len() != tx.input.len() {
        return Err(refuse());
    }
    for (input, prev) in tx.input.iter().zip(spent) {
        if !input.witness.is_empty() && !witness_standard(input, &prev.script_pubkey) {
            return Err(refuse());
        }
    }
    Ok(())
}

/// [`is_witness_standard`] for one input with a non-empty witness.
fn witness_standard(input: &TxIn, spent_script: &Script) -> bool {
    // Witness stuffing: an anchor is spent with an empty witness.
    if is_pay_to_anchor(spent_script) {
        return false;
    }
    let redeem;
    let (program_script, p2sh) = if spent_script.is_p2sh() {
        match redeem_script(&input.script_sig) {
            Some(r) => redeem = r,
            None => return false,
        }
        (Script::from_bytes(&redeem), true)
    } else {
        (spent_script, false)
    };
    let Some(version) = program_script.witness_version() else {
        return false;
    };
    let program_len = program_script.len() - 2;
    let items: Vec<&[u8]> = input.witness.iter().collect();
    match (version.to_num(), program_len) {
        (0, 32) => p2wsh_standard(&items),
        (1, 32) if !p2sh => taproot_standard(&items),
        _ => true,
    }
}

/// The P2WSH limits on a non-empty witness stack (the last item is the
/// witness script).
fn p2wsh_standard(items: &[&[u8]]) -> bool {
    let Some((script, args)) = items.split_last() else {
        return false;
    };
    script.len() <= MAX_STANDARD_P2WSH_SCRIPT_SIZE
        && args.len() <= MAX_STANDARD_P2WSH_STACK_ITEMS
        && args
            .iter()
            .all(|a| a.len() <= MAX_STANDARD_P2WSH_STACK_ITEM_SIZE)
}

/// The BIP-341/342 policy limits on a non-empty native P2TR witness stack.
fn taproot_standard(items: &[&[u8]]) -> bool {
    let mut stack = items;
    if stack.len() >= 2 && stack.last().and_then(|a| a.first()) == Some(&ANNEX_TAG) {
        // Annexes are nonstandard while no semantics are defined for them.
        return false;
    }
    match stack.len() {
        0 => false,
        1 => true, // key path: no policy rules
        _ => {
            let Some((control, rest)) = stack.split_last() else {
                return false;
            };
            let Some(&first) = control.first() else {
                return false; // an empty control block is invalid
            };
            stack = rest.split_last().map_or(rest, |(_script, args)| args);
            first & TAPROOT_LEAF_MASK != TAPROOT_LEAF_TAPSCRIPT
                || stack
                    .iter()
                    .all(|a| a.len() <= MAX_STANDARD_TAPSCRIPT_STACK_ITEM_SIZE)
        }
    }
}

/// The sigop cost of `tx` spending `spent` under Core's standard script
/// flags (Core's `GetTransactionSigOpCost(tx, view,
/// STANDARD_SCRIPT_VERIFY_FLAGS)`): legacy sigops × 4, P2SH sigops × 4 and
/// witness sigops. A coinbase counts its legacy sigops only. Inputs beyond
/// the end of `spent` count no P2SH or witness sigops.
pub fn transaction_sigop_cost(tx: &Transaction, spent: &[TxOut]) -> u64 {
    let legacy = sigops::legacy_sigops(tx) * WITNESS_SCALE_FACTOR;
    if tx.is_coinbase() {
        return legacy;
    }
    let scripts = spent.iter().map(|o| o.script_pubkey.as_script());
    legacy + sigops::input_sigop_cost(tx, scripts, STANDARD_SCRIPT_VERIFY_FLAGS)
}

/// The sigop cost of `tx` ([`transaction_sigop_cost`]), refused above
/// [`MAX_STANDARD_TX_SIGOPS_COST`] as `MemPoolAccept::PreChecks` does.
/// The cost is returned for [`super::sigop_adjusted_vsize`].
///
/// # Errors
///
/// [`TxRejectClass::NotStandard`] with Core's reason
/// `bad-txns-too-many-sigops` and the cost as the debug message (Core's
/// `strprintf("%d", nSigOpsCost)`).
pub fn check_standard_sigops(tx: &Transaction, spent: &[TxOut]) -> Result<u64, TxReject> {
    let cost = transaction_sigop_cost(tx, spent);
    if cost > MAX_STANDARD_TX_SIGOPS_COST {
        return Err(TxReject::with_debug(
            TxRejectClass::NotStandard,
            REASON_TOO_MANY_SIGOPS,
            cost.to_string(),
        ));
    }
    Ok(cost)
}
