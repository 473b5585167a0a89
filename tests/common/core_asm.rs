//! Bitcoin Core's short script notation, as its test vectors write scripts
//! (`script_tests.json`, `tx_valid.json`, `tx_invalid.json`): Core's
//! `ParseScript` (`src/core_io.cpp`, Core 31.99).
//!
//! Words separated by spaces: a decimal number (pushed as a script number:
//! `OP_1NEGATE`, `OP_0`, `OP_1`..`OP_16`, else a minimal push of its
//! `CScriptNum` encoding); `0x<hex>` (raw bytes, inserted, not pushed);
//! `'text'` (pushed); an opcode name with or without `OP_` (`OP_RESERVED`
//! and `OP_NOP`..`OP_NOP10`; not the push opcodes, not `OP_CHECKSIGADD`).

/// Names of the opcodes Core's parser knows (`GetOpName` for `OP_RESERVED`
/// and `OP_NOP` (0x61) ..= `OP_NOP10` (0xb9)).
const OPCODES: &[(u8, &str)] = &[
    (0x50, "OP_RESERVED"),
    (0x61, "OP_NOP"),
    (0x62, "OP_VER"),
    (0x63, "OP_IF"),
    (0x64, "OP_NOTIF"),
    (0x65, "OP_VERIF"),
    (0x66, "OP_VERNOTIF"),
    (0x67, "OP_ELSE"),
    (0x68, "OP_ENDIF"),
    (0x69, "OP_VERIFY"),
    (0x6a, "OP_RETURN"),
    (0x6b, "OP_TOALTSTACK"),
    (0x6c, "OP_FROMALTSTACK"),
    (0x6d, "OP_2DROP"),
    (0x6e, "OP_2DUP"),
    (0x6f, "OP_3DUP"),
    (0x70, "OP_2OVER"),
    (0x71, "OP_2ROT"),
    (0x72, "OP_2SWAP"),
    (0x73, "OP_IFDUP"),
    (0x74, "OP_DEPTH"),
    (0x75, "OP_DROP"),
    (0x76, "OP_DUP"),
    (0x77, "OP_NIP"),
    (0x78, "OP_OVER"),
    (0x79, "OP_PICK"),
    (0x7a, "OP_ROLL"),
    (0x7b, "OP_ROT"),
    (0x7c, "OP_SWAP"),
    (0x7d, "OP_TUCK"),
    (0x7e, "OP_CAT"),
    (0x7f, "OP_SUBSTR"),
    (0x80, "OP_LEFT"),
    (0x81, "OP_RIGHT"),
    (0x82, "OP_SIZE"),
    (0x83, "OP_INVERT"),
    (0x84, "OP_AND"),
    (0x85, "OP_OR"),
    (0x86, "OP_XOR"),
    (0x87, "OP_EQUAL"),
    (0x88, "OP_EQUALVERIFY"),
    (0x89, "OP_RESERVED1"),
    (0x8a, "OP_RESERVED2"),
    (0x8b, "OP_1ADD"),
    (0x8c, "OP_1SUB"),
    (0x8d, "OP_2MUL"),
    (0x8e, "OP_2DIV"),
    (0x8f, "OP_NEGATE"),
    (0x90, "OP_ABS"),
    (0x91, "OP_NOT"),
    (0x92, "OP_0NOTEQUAL"),
    (0x93, "OP_ADD"),
    (0x94, "OP_SUB"),
    (0x95, "OP_MUL"),
    (0x96, "OP_DIV"),
    (0x97, "OP_MOD"),
    (0x98, "OP_LSHIFT"),
    (0x99, "OP_RSHIFT"),
    (0x9a, "OP_BOOLAND"),
    (0x9b, "OP_BOOLOR"),
    (0x9c, "OP_NUMEQUAL"),
    (0x9d, "OP_NUMEQUALVERIFY"),
    (0x9e, "OP_NUMNOTEQUAL"),
    (0x9f, "OP_LESSTHAN"),
    (0xa0, "OP_GREATERTHAN"),
    (0xa1, "OP_LESSTHANOREQUAL"),
    (0xa2, "OP_GREATERTHANOREQUAL"),
    (0xa3, "OP_MIN"),
    (0xa4, "OP_MAX"),
    (0xa5, "OP_WITHIN"),
    (0xa6, "OP_RIPEMD160"),
    (0xa7, "OP_SHA1"),
    (0xa8, "OP_SHA256"),
    (0xa9, "OP_HASH160"),
    (0xaa, "OP_HASH256"),
    (0xab, "OP_CODESEPARATOR"),
    (0xac, "OP_CHECKSIG"),
    (0xad, "OP_CHECKSIGVERIFY"),
    (0xae, "OP_CHECKMULTISIG"),
    (0xaf, "OP_CHECKMULTISIGVERIFY"),
    (0xb0, "OP_NOP1"),
    (0xb1, "OP_CHECKLOCKTIMEVERIFY"),
    (0xb2, "OP_CHECKSEQUENCEVERIFY"),
    (0xb3, "OP_NOP4"),
    (0xb4, "OP_NOP5"),
    (0xb5, "OP_NOP6"),
    (0xb6, "OP_NOP7"),
    (0xb7, "OP_NOP8"),
    (0xb8, "OP_NOP9"),
    (0xb9, "OP_NOP10"),
];

/// Appends a data push as Core's `CScript << std::vector` does (direct
/// length below 76, else `OP_PUSHDATA1/2/4`).
pub fn push_data(script: &mut Vec<u8>, data: &[u8]) {
    let n = data.len();
    if n < 0x4c {
        script.push(n as u8);
    } else if n <= 0xff {
        script.extend_from_slice(&[0x4c, n as u8]);
    } else if n <= 0xffff {
        script.push(0x4d);
        script.extend_from_slice(&(n as u16).to_le_bytes());
    } else {
        script.push(0x4e);
        script.extend_from_slice(&(n as u32).to_le_bytes());
    }
    script.extend_from_slice(data);
}

/// Appends a number as Core's `CScript << int64_t` does.
fn push_int(script: &mut Vec<u8>, n: i64) {
    match n {
        0 => script.push(0x00),
        -1 | 1..=16 => script.push((n + 0x50) as u8),
        _ => {
            let mut buf = [0u8; 8];
            let len = bitcoin::script::write_scriptint(&mut buf, n);
            push_data(script, &buf[..len]);
        }
    }
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// Core's `ParseScript`.
///
/// # Panics
/// On what Core's parser throws on (unknown word, number out of range).
pub fn parse(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for w in s.split([' ', '\t', '\n']).filter(|w| !w.is_empty()) {
        if is_digits(w) || (w.starts_with('-') && is_digits(&w[1..])) {
            let n: i64 = w.parse().expect("number");
            assert!(
                (-0xffff_ffff..=0xffff_ffff).contains(&n),
                "number {w} out of ParseScript's range"
            );
            push_int(&mut out, n);
        } else if let Some(hex) = w.strip_prefix("0x").filter(|h| !h.is_empty()) {
            let raw: Vec<u8> =
                bitcoin::hex::FromHex::from_hex(hex).unwrap_or_else(|e| panic!("bad hex {w}: {e}"));
            out.extend_from_slice(&raw);
        } else if w.len() >= 2 && w.starts_with('\'') && w.ends_with('\'') {
            push_data(&mut out, &w.as_bytes()[1..w.len() - 1]);
        } else {
            let op = OPCODES
                .iter()
                .find(|(_, name)| *name == w || name.strip_prefix("OP_") == Some(w))
                .unwrap_or_else(|| panic!("unknown opcode {w:?}"));
            out.push(op.0);
        }
    }
    out
}
