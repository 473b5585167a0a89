//! Which template a scriptPubKey follows: Bitcoin Core's `Solver` and
//! `GetTxnOutputType`, the one classifier kakehi uses for relay policy
//! ([`super::is_standard_tx`], [`super::are_inputs_standard`]) and for the
//! `type` of Core's transaction JSON (`http::core_tx`).
//!
//! The order of the tests is Core's, and matters: P2SH first, then witness
//! programs (a version-0 program of any length but 20 or 32 bytes is
//! nonstandard, not `witness_unknown`), then `OP_RETURN` data, bare keys,
//! key hashes, bare multisig.
//!
//! Source: Bitcoin Core 30.0 `src/script/solver.cpp` (`Solver`,
//! `MatchPayToPubkey`, `MatchMultisig`, `GetScriptNumber`),
//! `src/script/script.cpp` (`IsPayToAnchor`, `IsWitnessProgram`,
//! `IsPushOnly`), `src/pubkey.h` (`CPubKey::ValidSize`).

use bitcoin::opcodes::all as op;
use bitcoin::script::Instruction;
use bitcoin::Script;

/// Most keys a bare `OP_CHECKMULTISIG` may name (`MAX_PUBKEYS_PER_MULTISIG`).
const MAX_PUBKEYS_PER_MULTISIG: u8 = 20;

/// The template of a scriptPubKey (Core's `TxoutType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TxoutType {
    /// None of the templates below (`nonstandard`).
    NonStandard,
    /// `<33- or 65-byte key> OP_CHECKSIG`, the key's first byte matching
    /// its length (`pubkey`).
    PubKey,
    /// `OP_DUP OP_HASH160 <20> OP_EQUALVERIFY OP_CHECKSIG` (`pubkeyhash`).
    PubKeyHash,
    /// `OP_HASH160 <20> OP_EQUAL`, BIP-16 (`scripthash`).
    ScriptHash,
    /// `<m> <key>… <n> OP_CHECKMULTISIG` with 1 ≤ m ≤ n ≤ 20 and n keys
    /// (`multisig`). Only n ≤ 3 is standard as an output.
    Multisig {
        /// Signatures required (m).
        required: u8,
        /// Keys named (n).
        keys: u8,
    },
    /// `OP_RETURN` followed by pushes only, of any size (`nulldata`).
    NullData,
    /// Version-0 witness program of 20 bytes, BIP-141 (`witness_v0_keyhash`).
    WitnessV0KeyHash,
    /// Version-0 witness program of 32 bytes, BIP-141
    /// (`witness_v0_scripthash`).
    WitnessV0ScriptHash,
    /// Version-1 witness program of 32 bytes, BIP-341 (`witness_v1_taproot`).
    WitnessV1Taproot,
    /// Pay-to-anchor, `OP_1 <0x4e73>` (`anchor`).
    Anchor,
    /// A witness program of version 1 to 16 that is none of the above
    /// (`witness_unknown`): spendable by anyone until a soft fork gives it
    /// meaning.
    WitnessUnknown {
        /// The witness version, 1..=16.
        version: u8,
    },
}

impl TxoutType {
    /// Core's name of the type (`GetTxnOutputType`), as `decoderawtransaction`
    /// and `getblock` print it in `scriptPubKey.type`.
    pub fn name(self) -> &'static str {
        match self {
            TxoutType::NonStandard => "nonstandard",
            TxoutType::PubKey => "pubkey",
            TxoutType::PubKeyHash => "pubkeyhash",
            TxoutType::ScriptHash => "scripthash",
            TxoutType::Multisig { .. } => "multisig",
            TxoutType::NullData => "nulldata",
            TxoutType::WitnessV0KeyHash => "witness_v0_keyhash",
            TxoutType::WitnessV0ScriptHash => "witness_v0_scripthash",
            TxoutType::WitnessV1Taproot => "witness_v1_taproot",
            TxoutType::Anchor => "anchor",
            TxoutType::WitnessUnknown { .. } => "witness_unknown",
        }
    }
}

/// Classifies `script` as Core's `Solver` does.
pub fn solver(script: &Script) -> TxoutType {
    let bytes = script.as_bytes();
    if script.is_p2sh() {
        return TxoutType::ScriptHash;
    }
    if let Some(version) = script.witness_version() {
        let program_len = bytes.len() - 2;
        let version = version.to_num();
        return match (version, program_len) {
            (0, 20) => TxoutType::WitnessV0KeyHash,
            (0, 32) => TxoutType::WitnessV0ScriptHash,
            (1, 32) => TxoutType::WitnessV1Taproot,
            _ if is_pay_to_anchor(script) => TxoutType::Anchor,
            (0, _) => TxoutType::NonStandard,
            (version, _) => TxoutType::WitnessUnknown { version },
        };
    }
    if bytes.first() == Some(&op::OP_RETURN.to_u8())
        && Script::from_bytes(&bytes[1..]).is_push_only()
    {
        return TxoutType::NullData;
    }
    if pay_to_pubkey_key(script).is_some() {
        return TxoutType::PubKey;
    }
    if script.is_p2pkh() {
        return TxoutType::PubKeyHash;
    }
    if let Some((required, keys)) = multisig_keys(script) {
        // Both are ≤ MAX_PUBKEYS_PER_MULTISIG (20): multisig_keys checked.
        let keys = u8::try_from(keys.len()).unwrap_or(u8::MAX);
        return TxoutType::Multisig { required, keys };
    }
    TxoutType::NonStandard
}

/// Whether `script` is pay-to-anchor, exactly `OP_1 OP_PUSHBYTES_2 0x4e73`
/// (Core's `CScript::IsPayToAnchor`).
pub fn is_pay_to_anchor(script: &Script) -> bool {
    script.as_bytes() == [op::OP_PUSHNUM_1.to_u8(), 0x02, 0x4e, 0x73]
}

/// Whether `key` has the length its first byte announces: 33 bytes for
/// `0x02`/`0x03`, 65 for `0x04`/`0x06`/`0x07` (Core's
/// `CPubKey::ValidSize`; the point itself is not checked).
fn valid_pubkey_size(key: &[u8]) -> bool {
    match key.first() {
        Some(0x02 | 0x03) => key.len() == 33,
        Some(0x04 | 0x06 | 0x07) => key.len() == 65,
        _ => false,
    }
}

/// The key of a pay-to-pubkey script, `OP_PUSHBYTES_65 <65> OP_CHECKSIG`
/// or `OP_PUSHBYTES_33 <33> OP_CHECKSIG`, when its size is valid (Core's
/// `MatchPayToPubkey`).
pub fn pay_to_pubkey_key(script: &Script) -> Option<&[u8]> {
    let bytes = script.as_bytes();
    let checksig = op::OP_CHECKSIG.to_u8();
    let key = match bytes.len() {
        67 if bytes[0] == 65 && bytes[66] == checksig => &bytes[1..66],
        35 if bytes[0] == 33 && bytes[34] == checksig => &bytes[1..34],
        _ => return None,
    };
    valid_pubkey_size(key).then_some(key)
}

/// The required-signature count and the keys of a bare multisig script
/// (Core's `MatchMultisig`): `<m> <key>… <n> OP_CHECKMULTISIG` where each
/// key is a push of a valid-size key (any push opcode), 1 ≤ m ≤ n ≤ 20 and
/// n is the number of keys.
pub fn multisig_keys(script: &Script) -> Option<(u8, Vec<&[u8]>)> {
    let bytes = script.as_bytes();
    if bytes.last() != Some(&op::OP_CHECKMULTISIG.to_u8()) {
        return None;
    }
    let mut ins = script.instruction_indices();
    let (at, first) = ins.next()?.ok()?;
    let required = script_number(bytes[at], &first, 1)?;
    let mut keys = Vec::new();
    let count = loop {
        let (at, next) = ins.next()?.ok()?;
        match next {
            Instruction::PushBytes(b) if valid_pubkey_size(b.as_bytes()) => keys.push(b.as_bytes()),
            other => break script_number(bytes[at], &other, required)?,
        }
    };
    if usize::from(count) != keys.len() {
        return None;
    }
    // The count must be followed by the final OP_CHECKMULTISIG and nothing else.
    match ins.next() {
        Some(Ok((at, _))) if at + 1 == bytes.len() => Some((required, keys)),
        _ => None,
    }
}

/// The value of `OP_1`..`OP_16` (Core's `CScript::DecodeOP_N` on an
/// `IsSmallInteger` opcode).
fn small_integer(opcode: u8) -> Option<u8> {
    let one = op::OP_PUSHNUM_1.to_u8();
    (one..=op::OP_PUSHNUM_16.to_u8())
        .contains(&opcode)
        .then(|| opcode - one + 1)
}

/// The number an instruction (starting with opcode byte `opcode`) gives,
/// when it lies in `min..=20` (Core's `GetScriptNumber(opcode, data, min,
/// MAX_PUBKEYS_PER_MULTISIG)`).
///
/// Core takes `OP_1`..`OP_16`, or a minimally pushed minimally encoded
/// number. In the range 1..=20 that leaves `OP_1`..`OP_16` and a one-byte
/// push (`OP_PUSHBYTES_1`) of 17..=20: a one-byte push of 1..=16 should
/// have been `OP_n`, a longer push of a number this small is not minimal,
/// and `OP_0` is not a number here.
fn script_number(opcode: u8, ins: &Instruction<'_>, min: u8) -> Option<u8> {
    let n = match ins {
        Instruction::Op(o) => small_integer(o.to_u8())?,
        Instruction::PushBytes(b) if opcode == op::OP_PUSHBYTES_1.to_u8() => match b.as_bytes() {
            [v @ 17..=20] => *v,
            _ => return None,
        },
        Instruction::PushBytes(_) => return None,
    };
    (min..=MAX_PUBKEYS_PER_MULTISIG).contains(&n).then_some(n)
}
