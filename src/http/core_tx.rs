//! Bitcoin Core's transaction JSON (`TxToUniv` in `src/core_io.cpp`, as
//! `getblock <hash> 2` and `/rest/block/<hash>.json` render it): `txid`,
//! `hash` (wtxid), `version`, `size`, `vsize`, `weight`, `locktime`,
//! `vin` (`coinbase` or `txid`/`vout`/`scriptSig {asm, hex}`, then
//! `txinwitness` when present, `sequence`), `vout` (`value` in BTC, `n`,
//! `scriptPubKey {asm, desc, hex, address?, type}`), `fee` (BTC, when the
//! spent outputs are known and the tx is not a coinbase) and `hex`.
//!
//! `asm` follows `ScriptToAsmStr` (pushes of ≤ 4 bytes as script numbers,
//! longer ones as hex, `0`/`-1`/`1`…`16` for the small-number opcodes,
//! signature hash types decoded as `[ALL]`… in scriptSigs); `desc` follows
//! `InferDescriptor` without a signing provider (`pk()`, `multi()`,
//! `rawtr()`, `addr()`, `raw()`) with the BIP-380 checksum.

use bitcoin::consensus::encode::serialize_hex;
use bitcoin::opcodes::all as op;
use bitcoin::script::Instruction;
use bitcoin::{Address, Network, Script, Transaction};

use super::hex;
use crate::mempool::policy::solver::{multisig_keys, pay_to_pubkey_key, solver};

/// Core's `GetTxnOutputType` name of a scriptPubKey (`Solver`).
pub(crate) fn output_type(s: &Script) -> &'static str {
    solver(s).name()
}

/// Core's `CScriptNum` value of a push of ≤ 4 bytes (little-endian,
/// sign bit in the top byte; minimal encoding not required).
fn script_num(b: &[u8]) -> i64 {
    let mut v: i64 = 0;
    for (i, byte) in b.iter().enumerate() {
        v |= i64::from(*byte) << (8 * i);
    }
    match b.last() {
        Some(last) if last & 0x80 != 0 => -(v & !(0x80i64 << (8 * (b.len() - 1)))),
        _ => v,
    }
}

/// Core's `ScriptToAsmStr(script, attempt_sighash_decode)`.
pub(crate) fn asm(s: &Script, attempt_sighash_decode: bool) -> String {
    let mut out: Vec<String> = Vec::new();
    for i in s.instructions() {
        match i {
            Err(_) => {
                out.push("[error]".into());
                break;
            }
            Ok(Instruction::PushBytes(b)) => {
                let b = b.as_bytes();
                if b.len() <= 4 {
                    out.push(script_num(b).to_string());
                } else if attempt_sighash_decode && !s.is_op_return() {
                    match bitcoin::ecdsa::Signature::from_slice(b) {
                        Ok(sig) => out.push(format!(
                            "{}[{}]",
                            hex(&b[..b.len() - 1]),
                            sighash_name(sig.sighash_type)
                        )),
                        Err(_) => out.push(hex(b)),
                    }
                } else {
                    out.push(hex(b));
                }
            }
            Ok(Instruction::Op(o)) => {
                let v = o.to_u8();
                out.push(if v == op::OP_PUSHNUM_NEG1.to_u8() {
                    "-1".into()
                } else if (op::OP_PUSHNUM_1.to_u8()..=op::OP_PUSHNUM_16.to_u8()).contains(&v) {
                    (v - op::OP_PUSHNUM_1.to_u8() + 1).to_string()
                } else if v == op::OP_CLTV.to_u8() {
                    "OP_CHECKLOCKTIMEVERIFY".into()
                } else if v == op::OP_CSV.to_u8() {
                    "OP_CHECKSEQUENCEVERIFY".into()
                } else if v == 0xff {
                    "OP_INVALIDOPCODE".into()
                } else if v > op::OP_CHECKSIGADD.to_u8() {
                    "OP_UNKNOWN".into()
                } else {
                    o.to_string()
                });
            }
        }
    }
    out.join(" ")
}

fn sighash_name(t: bitcoin::EcdsaSighashType) -> &'static str {
    use bitcoin::EcdsaSighashType as T;
    match t {
        T::All => "ALL",
        T::None => "NONE",
        T::Single => "SINGLE",
        T::AllPlusAnyoneCanPay => "ALL|ANYONECANPAY",
        T::NonePlusAnyoneCanPay => "NONE|ANYONECANPAY",
        T::SinglePlusAnyoneCanPay => "SINGLE|ANYONECANPAY",
    }
}

/// BIP-380 descriptor checksum (Core's `DescriptorChecksum`): 8 characters.
pub(crate) fn descriptor_checksum(desc: &str) -> Option<String> {
    const INPUT: &str = "0123456789()[],'/*abcdefgh@:$%{}IJKLMNOPQRSTUVWXYZ&+-.;<=>?!^_|~ijklmnopqrstuvwxyzABCDEFGH`#\"\\ ";
    const CHECKSUM: &[u8] = b"qpzry9x8gf2tvdw0s3jn54khce6mua7l";
    fn polymod(c: u64, val: u64) -> u64 {
        let c0 = c >> 35;
        let mut c = ((c & 0x7_ffff_ffff) << 5) ^ val;
        for (bit, k) in [
            0xf5dee51989u64,
            0xa9fdca3312,
            0x1bab10e32d,
            0x3706b1677a,
            0x644d626ffd,
        ]
        .iter()
        .enumerate()
        {
            if c0 & (1 << bit) != 0 {
                c ^= k;
            }
        }
        c
    }
    let (mut c, mut cls, mut count) = (1u64, 0u64, 0);
    for ch in desc.chars() {
        let pos = INPUT.find(ch)? as u64;
        c = polymod(c, pos & 31);
        cls = cls * 3 + (pos >> 5);
        count += 1;
        if count == 3 {
            c = polymod(c, cls);
            cls = 0;
            count = 0;
        }
    }
    if count > 0 {
        c = polymod(c, cls);
    }
    for _ in 0..8 {
        c = polymod(c, 0);
    }
    c ^= 1;
    Some(
        (0..8)
            .map(|j| CHECKSUM[((c >> (5 * (7 - j))) & 31) as usize] as char)
            .collect(),
    )
}

/// Core's `InferDescriptor(script, DUMMY_SIGNING_PROVIDER)->ToString()`.
pub(crate) fn infer_descriptor(s: &Script, network: Network) -> String {
    let b = s.as_bytes();
    let body = if let Some(key) = pay_to_pubkey_key(s) {
        format!("pk({})", hex(key))
    } else if let Some((k, keys)) = multisig_keys(s) {
        let keys: Vec<String> = keys.iter().map(|k| hex(k)).collect();
        format!("multi({k},{})", keys.join(","))
    } else if s.is_p2tr() {
        format!("rawtr({})", hex(&b[2..]))
    } else if let Ok(a) = Address::from_script(s, network) {
        format!("addr({a})")
    } else {
        format!("raw({})", hex(b))
    };
    match descriptor_checksum(&body) {
        Some(c) => format!("{body}#{c}"),
        None => body,
    }
}

/// BTC value of `sats` as Core's `ValueFromAmount` (a JSON number).
pub(crate) fn btc(sats: i64) -> serde_json::Value {
    serde_json::Value::from(sats as f64 / 100_000_000.0)
}

/// Core's `TxToUniv(tx, uint256(), entry, include_hex = true, undo,
/// SHOW_DETAILS)`; `input_total` is the sum of the spent outputs' values
/// (sats) when known, which adds `fee`.
pub(crate) fn tx_json(
    tx: &Transaction,
    network: Network,
    input_total: Option<u64>,
) -> serde_json::Value {
    let coinbase = tx.is_coinbase();
    let vin: Vec<serde_json::Value> = tx
        .input
        .iter()
        .map(|i| {
            let mut o = serde_json::Map::new();
            if coinbase {
                o.insert("coinbase".into(), hex(i.script_sig.as_bytes()).into());
            } else {
                o.insert("txid".into(), i.previous_output.txid.to_string().into());
                o.insert("vout".into(), i.previous_output.vout.into());
                o.insert(
                    "scriptSig".into(),
                    serde_json::json!({
                        "asm": asm(&i.script_sig, true),
                        "hex": hex(i.script_sig.as_bytes()),
                    }),
                );
            }
            if !i.witness.is_empty() {
                let w: Vec<String> = i.witness.iter().map(hex).collect();
                o.insert("txinwitness".into(), w.into());
            }
            o.insert("sequence".into(), i.sequence.0.into());
            o.into()
        })
        .collect();
    let vout: Vec<serde_json::Value> = tx
        .output
        .iter()
        .enumerate()
        .map(|(n, out)| {
            let s = &out.script_pubkey;
            let mut spk = serde_json::Map::new();
            spk.insert("asm".into(), asm(s, false).into());
            spk.insert("desc".into(), infer_descriptor(s, network).into());
            spk.insert("hex".into(), hex(s.as_bytes()).into());
            if !s.is_p2pk() {
                if let Ok(a) = Address::from_script(s, network) {
                    spk.insert("address".into(), a.to_string().into());
                }
            }
            spk.insert("type".into(), output_type(s).into());
            serde_json::json!({
                "value": btc(out.value.to_sat() as i64),
                "n": n,
                "scriptPubKey": spk,
            })
        })
        .collect();
    let weight = tx.weight().to_wu();
    let mut v = serde_json::json!({
        "txid": tx.compute_txid().to_string(),
        "hash": tx.compute_wtxid().to_string(),
        "version": tx.version.0,
        "size": tx.total_size(),
        "vsize": weight.div_ceil(4),
        "weight": weight,
        "locktime": tx.lock_time.to_consensus_u32(),
        "vin": vin,
        "vout": vout,
    });
    if let (false, Some(total_in)) = (coinbase, input_total) {
        let total_out: u64 = tx.output.iter().map(|o| o.value.to_sat()).sum();
        v["fee"] = btc(total_in as i64 - total_out as i64);
    }
    v["hex"] = serialize_hex(tx).into();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// BIP-380's test vector, and checksums computed by Bitcoin Core's
    /// functional-test framework (`descsum_create`, verystable 28.1).
    #[test]
    fn descriptor_checksum_matches_bip380() {
        assert_eq!(
            descriptor_checksum("raw(deadbeef)").as_deref(),
            Some("89f8spxm")
        );
        assert_eq!(
            descriptor_checksum("addr(bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080)").as_deref(),
            Some("8pk5s7ya")
        );
        assert_eq!(
            descriptor_checksum(
                "pk(02aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa)"
            )
            .as_deref(),
            Some("rkg34naf")
        );
    }

    /// Core's `script_tests`/`ScriptToAsmStr` conventions on a P2PKH
    /// scriptPubKey and a scriptSig with an `ALL` signature.
    #[test]
    fn asm_follows_core() {
        let spk =
            bitcoin::ScriptBuf::from_hex("76a91489abcdefabbaabbaabbaabbaabbaabbaabbaabba88ac")
                .unwrap();
        assert_eq!(
            asm(&spk, false),
            "OP_DUP OP_HASH160 89abcdefabbaabbaabbaabbaabbaabbaabbaabba OP_EQUALVERIFY OP_CHECKSIG"
        );
        let small = bitcoin::ScriptBuf::from_hex("004f02ff806a").unwrap();
        assert_eq!(asm(&small, false), "0 -1 -255 OP_RETURN");
        assert_eq!(script_num(&[0x81, 0x80]), -129);
    }
}
