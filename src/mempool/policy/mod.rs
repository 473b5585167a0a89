//! Relay policy that needs no mempool: Bitcoin Core 30.0's standardness
//! rules (`policy/policy.cpp`), the ephemeral-dust pre-check
//! (`policy/ephemeral_policy.cpp`) and the lone-transaction TRUC limit
//! (`policy/truc_policy.cpp`), with Core's defaults and reject reasons.
//!
//! - [`solver`](mod@solver): which template a scriptPubKey follows ([`solver()`],
//!   [`TxoutType`]).
//! - this module: [`PolicyConfig`], [`is_standard_tx`],
//!   [`check_tx_size_small`], dust ([`dust_threshold`], [`is_dust`],
//!   [`dust_outputs`]), the sigop-adjusted virtual size
//!   ([`sigop_adjusted_vsize`]), the policy script flags.
//! - [`ephemeral`]: ephemeral dust ([`pre_check_ephemeral_tx`],
//!   [`check_ephemeral_spends`]).
//! - [`inputs`]: what needs the spent outputs ([`are_inputs_standard`],
//!   [`is_witness_standard`], [`check_standard_sigops`]).
//! - [`truc`]: BIP-431 limits and Core's texts for their violations.
//!
//! # Where each check sits in Core's `MemPoolAccept::PreChecks`
//!
//! 1. `IsStandardTx` ([`is_standard_tx`]), when `-acceptnonstdtxn` is off;
//! 2. `tx-size-small` ([`check_tx_size_small`]), always (it guards against
//!    64-byte transactions, a consensus-adjacent attack, not a preference);
//! 3. finality, inputs, `AreInputsStandard` ([`are_inputs_standard`]),
//!    `IsWitnessStandard` ([`is_witness_standard`], only for a transaction
//!    with a witness), the sigop cost ([`check_standard_sigops`]);
//! 4. after the fee is known: `PreCheckEphemeralTx`
//!    ([`pre_check_ephemeral_tx`]), then the TRUC checks
//!    ([`truc::check_truc_size`] among them, after Core's inheritance
//!    checks against mempool parents).
//!
//! # Core 30.0's data-carrier rules
//!
//! Core 30.0 permits any number of `OP_RETURN` outputs; their
//! scriptPubKeys' sizes together must fit `-datacarriersize`, 100,000 bytes
//! by default ([`MAX_OP_RETURN_RELAY`]), so the weight limit binds first.
//! `-datacarrier=0` ([`PolicyConfig::max_datacarrier_bytes`] `None`)
//! refuses every one. Core 29 and earlier refused a second `OP_RETURN`
//! (`multi-op-return`) and capped the one at 83 bytes; that reason no
//! longer exists.
//!
//! Source: Bitcoin Core 30.0 `src/policy/policy.h`, `src/policy/policy.cpp`,
//! `src/policy/ephemeral_policy.cpp`, `src/policy/feerate.cpp`,
//! `src/validation.cpp` (`PreChecks`), `src/test/transaction_tests.cpp`
//! (`test_IsStandard`), `doc/release-notes/release-notes-30.0.md`.

pub mod ephemeral;
pub mod inputs;
pub mod solver;
pub mod truc;

#[cfg(test)]
mod tests;

use bitcoin::{Amount, Transaction, TxOut};

use super::reject::TxReject;
#[cfg(doc)]
use super::reject::TxRejectClass;
use crate::validation::script::ScriptFlags;

pub use ephemeral::{check_ephemeral_spends, pre_check_ephemeral_tx};
pub use inputs::{
    are_inputs_standard, check_standard_sigops, is_witness_standard, transaction_sigop_cost,
};
pub use solver::{solver, TxoutType};

/// Heaviest standard transaction, weight units (`MAX_STANDARD_TX_WEIGHT`).
pub const MAX_STANDARD_TX_WEIGHT: u64 = 400_000;
/// Smallest standard transaction without its witness, bytes
/// (`MIN_STANDARD_TX_NONWITNESS_SIZE`): 64-byte transactions could pass
/// for inner Merkle nodes (CVE-2017-12842).
pub const MIN_STANDARD_TX_NONWITNESS_SIZE: usize = 65;
/// Largest standard scriptSig, bytes (`MAX_STANDARD_SCRIPTSIG_SIZE`):
/// enough for a 15-of-15 P2SH multisig spend.
pub const MAX_STANDARD_SCRIPTSIG_SIZE: usize = 1_650;
/// Most sigops a standard P2SH redeem script may have, counted
/// accurately (`MAX_P2SH_SIGOPS`).
pub const MAX_P2SH_SIGOPS: u64 = 15;
/// Most sigop cost a standard transaction may have
/// (`MAX_STANDARD_TX_SIGOPS_COST`, a fifth of the block's 80,000).
pub const MAX_STANDARD_TX_SIGOPS_COST: u64 = 16_000;
/// Most legacy sigops (BIP-54 counting) a standard transaction may have
/// (`MAX_TX_LEGACY_SIGOPS`, new in Core 30.0).
pub const MAX_TX_LEGACY_SIGOPS: u64 = 2_500;
/// Most witness items before the witness script of a standard P2WSH spend
/// (`MAX_STANDARD_P2WSH_STACK_ITEMS`).
pub const MAX_STANDARD_P2WSH_STACK_ITEMS: usize = 100;
/// Largest witness item before the witness script of a standard P2WSH
/// spend, bytes (`MAX_STANDARD_P2WSH_STACK_ITEM_SIZE`).
pub const MAX_STANDARD_P2WSH_STACK_ITEM_SIZE: usize = 80;
/// Largest stack item of a standard tapscript spend, bytes
/// (`MAX_STANDARD_TAPSCRIPT_STACK_ITEM_SIZE`).
pub const MAX_STANDARD_TAPSCRIPT_STACK_ITEM_SIZE: usize = 80;
/// Largest standard P2WSH witness script, bytes
/// (`MAX_STANDARD_P2WSH_SCRIPT_SIZE`).
pub const MAX_STANDARD_P2WSH_SCRIPT_SIZE: usize = 3_600;
/// Lowest standard transaction version (`TX_MIN_STANDARD_VERSION`).
pub const TX_MIN_STANDARD_VERSION: u32 = 1;
/// Highest standard transaction version (`TX_MAX_STANDARD_VERSION`; 3 is
/// TRUC, BIP-431).
pub const TX_MAX_STANDARD_VERSION: u32 = 3;
/// Most dust outputs [`is_standard_tx`] lets through
/// (`MAX_DUST_OUTPUTS_PER_TX`): one, as ephemeral dust that a 0-fee
/// transaction's child must spend.
pub const MAX_DUST_OUTPUTS_PER_TX: usize = 1;
/// Default `-datacarriersize`, bytes of `OP_RETURN` scriptPubKeys per
/// transaction (`MAX_OP_RETURN_RELAY`, Core 30.0:
/// `MAX_STANDARD_TX_WEIGHT / WITNESS_SCALE_FACTOR`).
pub const MAX_OP_RETURN_RELAY: u32 = 100_000;
/// Default `-dustrelayfee`, sat/kvB (`DUST_RELAY_TX_FEE`).
pub const DUST_RELAY_TX_FEE: u64 = 3_000;
/// Default `-minrelaytxfee`, sat/kvB (`DEFAULT_MIN_RELAY_TX_FEE`; 1,000
/// before Core 30.0).
pub const DEFAULT_MIN_RELAY_TX_FEE: u64 = 100;
/// Default `-incrementalrelayfee`, sat/kvB
/// (`DEFAULT_INCREMENTAL_RELAY_FEE`; 1,000 before Core 30.0).
pub const DEFAULT_INCREMENTAL_RELAY_FEE: u64 = 100;
/// Default `-bytespersigop` (`DEFAULT_BYTES_PER_SIGOP`).
pub const DEFAULT_BYTES_PER_SIGOP: u32 = 20;

/// Script flags whose failure makes a transaction invalid, not merely
/// nonstandard (Core 30.0's `MANDATORY_SCRIPT_VERIFY_FLAGS`: the flags
/// every block since the last soft fork is checked under).
pub const MANDATORY_SCRIPT_VERIFY_FLAGS: ScriptFlags = ScriptFlags::from_bits(
    ScriptFlags::P2SH.bits()
        | ScriptFlags::DERSIG.bits()
        | ScriptFlags::NULLDUMMY.bits()
        | ScriptFlags::CHECKLOCKTIMEVERIFY.bits()
        | ScriptFlags::CHECKSEQUENCEVERIFY.bits()
        | ScriptFlags::WITNESS.bits()
        | ScriptFlags::TAPROOT.bits(),
);

/// Script flags a standard transaction's inputs must pass (Core 30.0's
/// `STANDARD_SCRIPT_VERIFY_FLAGS`): the mandatory flags plus Core's
/// malleability and upgrade-hook rules.
pub const STANDARD_SCRIPT_VERIFY_FLAGS: ScriptFlags = ScriptFlags::from_bits(
    MANDATORY_SCRIPT_VERIFY_FLAGS.bits()
        | ScriptFlags::STRICTENC.bits()
        | ScriptFlags::MINIMALDATA.bits()
        | ScriptFlags::DISCOURAGE_UPGRADABLE_NOPS.bits()
        | ScriptFlags::CLEANSTACK.bits()
        | ScriptFlags::MINIMALIF.bits()
        | ScriptFlags::NULLFAIL.bits()
        | ScriptFlags::LOW_S.bits()
        | ScriptFlags::DISCOURAGE_UPGRADABLE_WITNESS_PROGRAM.bits()
        | ScriptFlags::WITNESS_PUBKEYTYPE.bits()
        | ScriptFlags::CONST_SCRIPTCODE.bits()
        | ScriptFlags::DISCOURAGE_UPGRADABLE_TAPROOT_VERSION.bits()
        | ScriptFlags::DISCOURAGE_OP_SUCCESS.bits()
        | ScriptFlags::DISCOURAGE_UPGRADABLE_PUBKEYTYPE.bits(),
);

/// The standard flags that are not mandatory
/// (`STANDARD_NOT_MANDATORY_VERIFY_FLAGS`): a failure under these alone is
/// `TX_NOT_STANDARD`, not consensus.
pub const STANDARD_NOT_MANDATORY_VERIFY_FLAGS: ScriptFlags =
    STANDARD_SCRIPT_VERIFY_FLAGS.without(MANDATORY_SCRIPT_VERIFY_FLAGS);

/// The relay-policy settings (Core's `-dustrelayfee`, `-datacarrier`,
/// `-datacarriersize`, `-permitbaremultisig`, `-bytespersigop`,
/// `-minrelaytxfee`, `-incrementalrelayfee`), with Core 30.0's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyConfig {
    /// Feerate that defines dust, sat/kvB (`-dustrelayfee`, 3,000).
    pub dust_relay_feerate: u64,
    /// Bytes of `OP_RETURN` scriptPubKeys one transaction may carry, in
    /// total (`-datacarriersize`, 100,000); `None` refuses every
    /// `OP_RETURN` output (`-datacarrier=0`).
    pub max_datacarrier_bytes: Option<u32>,
    /// Whether bare multisig outputs are standard (`-permitbaremultisig`,
    /// true).
    pub permit_bare_multisig: bool,
    /// Virtual bytes each sigop counts for in the virtual size
    /// (`-bytespersigop`, 20).
    pub bytes_per_sigop: u32,
    /// Lowest feerate relayed, sat/kvB (`-minrelaytxfee`, 100 = 0.1 sat/vB).
    pub min_relay_feerate: u64,
    /// Feerate step for replacement and mempool-limiting, sat/kvB
    /// (`-incrementalrelayfee`, 100).
    pub incremental_relay_feerate: u64,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            dust_relay_feerate: DUST_RELAY_TX_FEE,
            max_datacarrier_bytes: Some(MAX_OP_RETURN_RELAY),
            permit_bare_multisig: true,
            bytes_per_sigop: DEFAULT_BYTES_PER_SIGOP,
            min_relay_feerate: DEFAULT_MIN_RELAY_TX_FEE,
            incremental_relay_feerate: DEFAULT_INCREMENTAL_RELAY_FEE,
        }
    }
}

/// The fee at `feerate` (sat/kvB) for `vsize` virtual bytes, rounded up
/// (Core's `CFeeRate::GetFee`: 182 vbytes at 3,702 sat/kvB cost 674 sats,
/// `test_IsStandard`).
pub fn fee_at_rate(feerate: u64, vsize: u64) -> Amount {
    let fee = (u128::from(feerate) * u128::from(vsize)).div_ceil(1_000);
    Amount::from_sat(u64::try_from(fee).unwrap_or(u64::MAX))
}

/// The value below which `txout` is dust at `dust_relay_feerate` (sat/kvB):
/// the fee, at that rate, of the output plus the smallest input that could
/// spend it (Core's `GetDustThreshold`).
///
/// The input is 148 bytes (outpoint 36, scriptSig length 1, a 107-byte
/// signature and key, sequence 4), or 67 virtual bytes when the output is
/// a witness program (the 107 bytes at a quarter). An unspendable output
/// (starting with `OP_RETURN`, or over 10,000 bytes) is never dust: 0.
/// At 3,000 sat/kvB: P2PKH 546, P2SH 540, P2WPKH 294, P2WSH and P2TR 330.
pub fn dust_threshold(txout: &TxOut, dust_relay_feerate: u64) -> Amount {
    const MAX_SCRIPT_SIZE: usize = 10_000;
    let spk = &txout.script_pubkey;
    if spk.is_op_return() || spk.len() > MAX_SCRIPT_SIZE {
        return Amount::ZERO;
    }
    let input_size: u64 = if spk.is_witness_program() {
        32 + 4 + 1 + 107 / 4 + 4
    } else {
        32 + 4 + 1 + 107 + 4
    };
    fee_at_rate(dust_relay_feerate, txout.size() as u64 + input_size)
}

/// Whether `txout` is dust: its value is below [`dust_threshold`] (Core's
/// `IsDust`).
pub fn is_dust(txout: &TxOut, dust_relay_feerate: u64) -> bool {
    txout.value < dust_threshold(txout, dust_relay_feerate)
}

/// The indices of `tx`'s dust outputs (Core's `GetDust`).
pub fn dust_outputs(tx: &Transaction, dust_relay_feerate: u64) -> Vec<u32> {
    (0u32..)
        .zip(&tx.output)
        .filter(|(_, o)| is_dust(o, dust_relay_feerate))
        .map(|(i, _)| i)
        .collect()
}

/// The reject reason [`is_standard_tx`] and [`pre_check_ephemeral_tx`]
/// give for dust.
pub const REASON_DUST: &str = "dust";

/// Checks `tx` alone against Core's standardness rules (`IsStandardTx`),
/// in Core 30.0's order, the first failure winning:
///
/// 1. version within [`TX_MIN_STANDARD_VERSION`]..=[`TX_MAX_STANDARD_VERSION`]
///    (`version`);
/// 2. weight ≤ [`MAX_STANDARD_TX_WEIGHT`] (`tx-size`);
/// 3. each scriptSig ≤ [`MAX_STANDARD_SCRIPTSIG_SIZE`] bytes
///    (`scriptsig-size`) and push-only (`scriptsig-not-pushonly`);
/// 4. each output a standard template, bare multisig at most 3 keys
///    (`scriptpubkey`); the `OP_RETURN` scriptPubKeys within
///    [`PolicyConfig::max_datacarrier_bytes`] in total (`datacarrier`);
///    bare multisig only if permitted (`bare-multisig`);
/// 5. at most [`MAX_DUST_OUTPUTS_PER_TX`] dust output (`dust`); whether
///    that one may stay is [`pre_check_ephemeral_tx`]'s question.
///
/// The 65-byte minimum is a separate step of Core's `PreChecks`:
/// [`check_tx_size_small`].
///
/// # Errors
///
/// [`TxRejectClass::NotStandard`] with the reason above and no debug
/// message (Core 30.0 gives none).
pub fn is_standard_tx(tx: &Transaction, config: &PolicyConfig) -> Result<(), TxReject> {
    let refuse = |reason| Err(TxReject::not_standard(reason));
    let version = tx.version.0 as u32;
    if !(TX_MIN_STANDARD_VERSION..=TX_MAX_STANDARD_VERSION).contains(&version) {
        return refuse("version");
    }
    if tx.weight().to_wu() > MAX_STANDARD_TX_WEIGHT {
        return refuse("tx-size");
    }
    for input in &tx.input {
        if input.script_sig.len() > MAX_STANDARD_SCRIPTSIG_SIZE {
            return refuse("scriptsig-size");
        }
        if !input.script_sig.is_push_only() {
            return refuse("scriptsig-not-pushonly");
        }
    }
    let mut datacarrier_left = config.max_datacarrier_bytes.map_or(0, |b| b as usize);
    for output in &tx.output {
        match solver(&output.script_pubkey) {
            TxoutType::NonStandard => return refuse("scriptpubkey"),
            TxoutType::Multisig { required, keys }
                if !(1..=3).contains(&keys) || required > keys =>
            {
                return refuse("scriptpubkey")
            }
            TxoutType::NullData => {
                let size = output.script_pubkey.len();
                if size > datacarrier_left {
                    return refuse("datacarrier");
                }
                datacarrier_left -= size;
            }
            TxoutType::Multisig { .. } if !config.permit_bare_multisig => {
                return refuse("bare-multisig")
            }
            _ => {}
        }
    }
    if dust_outputs(tx, config.dust_relay_feerate).len() > MAX_DUST_OUTPUTS_PER_TX {
        return refuse(REASON_DUST);
    }
    Ok(())
}

/// Refuses a transaction whose serialization without witness is under
/// [`MIN_STANDARD_TX_NONWITNESS_SIZE`] bytes, as Core's `PreChecks` does
/// right after `IsStandardTx`, whether or not standardness is required.
///
/// # Errors
///
/// [`TxRejectClass::NotStandard`] with Core's reason `tx-size-small`.
pub fn check_tx_size_small(tx: &Transaction) -> Result<(), TxReject> {
    if tx.base_size() < MIN_STANDARD_TX_NONWITNESS_SIZE {
        return Err(TxReject::not_standard("tx-size-small"));
    }
    Ok(())
}

/// The virtual size Core's mempool accounts a transaction at, vbytes
/// (`GetVirtualTransactionSize`): the weight, or the sigop cost ×
/// `bytes_per_sigop` when larger, divided by 4 and rounded up.
///
/// `weight` in weight units; `sigop_cost` as
/// [`transaction_sigop_cost`] gives it.
pub fn sigop_adjusted_vsize(weight: u64, sigop_cost: u64, bytes_per_sigop: u32) -> u64 {
    let sigop_weight = sigop_cost.saturating_mul(u64::from(bytes_per_sigop));
    weight.max(sigop_weight).div_ceil(4)
}
