//! Transactions from drafts: every input unlocked and signed as a wallet
//! would, with the weight and signature-operation cost a draft will have once
//! signed.
//!
//! ECDSA signatures are RFC 6979 (deterministic, low S, strict DER) with
//! `SIGHASH_ALL`: BIP-143 digests for the segwit v0 kinds, the legacy digest
//! for P2PKH and bare multisig. Taproot key-path signatures are BIP-340
//! Schnorr without auxiliary randomness over the BIP-341 digest with
//! `SIGHASH_DEFAULT` (64 bytes). So the same draft always gives the same
//! bytes, whatever thread signs it.

use bitcoin::absolute::LockTime;
use bitcoin::hashes::Hash;
use bitcoin::script::PushBytes;
use bitcoin::secp256k1::Message;
use bitcoin::sighash::{EcdsaSighashType, Prevouts, SighashCache, TapSighashType};
use bitcoin::transaction::Version;
use bitcoin::{Amount, ScriptBuf, Sequence, Transaction, TxIn, TxOut, Witness};

use crate::coins::Coin;
use crate::keys::{KeyPool, Kind};

/// An unsigned transaction: what it spends, with which nSequence, and what
/// it pays.
#[derive(Clone, Debug)]
pub struct Draft {
    /// nVersion (2 wherever BIP-68 must apply).
    pub version: i32,
    /// nLockTime (a height here).
    pub lock_time: u32,
    /// The outputs spent and each input's nSequence.
    pub inputs: Vec<(Coin, u32)>,
    /// The outputs paid.
    pub outputs: Vec<TxOut>,
}

impl Draft {
    /// Sum of the spent outputs' values, sats.
    pub fn value_in(&self) -> u64 {
        self.inputs.iter().map(|(c, _)| c.value).sum()
    }

    /// Sum of the outputs' values, sats.
    pub fn value_out(&self) -> u64 {
        self.outputs.iter().map(|o| o.value.to_sat()).sum()
    }

    /// An upper bound of the signed transaction's weight (weight units,
    /// BIP-141): every ECDSA signature counted at its largest low-S size.
    pub fn max_weight(&self) -> u64 {
        let counts = varint_len(self.inputs.len() as u64) + varint_len(self.outputs.len() as u64);
        4 * (4 + 4 + counts)
            + 2
            + self
                .inputs
                .iter()
                .map(|(c, _)| input_weight(c))
                .sum::<u64>()
            + self.outputs.iter().map(output_weight).sum::<u64>()
    }

    /// The signature-operation cost Core counts for it in a block
    /// (`GetTransactionSigOpCost`, consensus/tx_verify.cpp): four per legacy
    /// sigop in the outputs, one per witness signature check.
    pub fn sigop_cost(&self) -> u64 {
        let outputs: u64 = self
            .outputs
            .iter()
            .map(|o| 4 * o.script_pubkey.count_sigops_legacy() as u64)
            .sum();
        let inputs: u64 = self
            .inputs
            .iter()
            .map(|(c, _)| match c.kind {
                Kind::P2wpkh | Kind::P2shP2wpkh | Kind::P2wshCltv | Kind::P2wshCsv => 1,
                Kind::P2wshMultisig => 3,
                Kind::P2tr | Kind::P2pkh | Kind::BareMultisig => 0,
            })
            .sum();
        outputs + inputs
    }
}

/// Bytes of a ECDSA signature push at most: push opcode, DER with a low S
/// (≤ 71), sighash byte.
const SIG: u64 = 1 + 72;
/// Bytes of a compressed public key push.
const PUBKEY: u64 = 1 + 33;
/// Weight of an input's outpoint, empty scriptSig length and nSequence.
const BARE_INPUT: u64 = 4 * (36 + 1 + 4);

/// Upper bound of the weight one signed input adds.
fn input_weight(c: &Coin) -> u64 {
    match c.kind {
        Kind::P2wpkh => BARE_INPUT + 1 + SIG + PUBKEY,
        Kind::P2tr => BARE_INPUT + 1 + 1 + 64,
        Kind::P2pkh => BARE_INPUT + 4 * (SIG + PUBKEY) + 1,
        Kind::P2shP2wpkh => BARE_INPUT + 4 * 23 + 1 + SIG + PUBKEY,
        Kind::P2wshMultisig => BARE_INPUT + 1 + 1 + 2 * SIG + 1 + 105,
        Kind::BareMultisig => BARE_INPUT + 4 * (1 + SIG) + 1,
        // <lock> (≤ 6 bytes) OP_CLTV/OP_CSV OP_DROP <key> OP_CHECKSIG
        Kind::P2wshCltv | Kind::P2wshCsv => BARE_INPUT + 1 + SIG + 1 + 43,
    }
}

fn output_weight(o: &TxOut) -> u64 {
    let len = o.script_pubkey.len() as u64;
    4 * (8 + varint_len(len) + len)
}

fn varint_len(n: u64) -> u64 {
    match n {
        0..0xfd => 1,
        0xfd..=0xffff => 3,
        0x1_0000..=0xffff_ffff => 5,
        _ => 9,
    }
}

/// Builds and signs `draft`.
pub fn sign(draft: &Draft, keys: &KeyPool) -> Transaction {
    let mut tx = Transaction {
        version: Version(draft.version),
        lock_time: LockTime::from_consensus(draft.lock_time),
        input: draft
            .inputs
            .iter()
            .map(|(c, seq)| TxIn {
                previous_output: c.outpoint,
                script_sig: ScriptBuf::new(),
                sequence: Sequence(*seq),
                witness: Witness::new(),
            })
            .collect(),
        output: draft.outputs.clone(),
    };
    let prevouts: Vec<TxOut> = draft
        .inputs
        .iter()
        .map(|(c, _)| TxOut {
            value: Amount::from_sat(c.value),
            script_pubkey: keys.script_pubkey(c.kind, c.key, c.lock),
        })
        .collect();
    let digests: Vec<Message> = {
        let mut cache = SighashCache::new(&tx);
        draft
            .inputs
            .iter()
            .enumerate()
            .map(|(i, (c, _))| digest(&mut cache, i, c, &prevouts, keys))
            .collect()
    };
    for (i, ((coin, _), msg)) in draft.inputs.iter().zip(&digests).enumerate() {
        let (script_sig, witness) = unlock(coin, msg, keys);
        tx.input[i].script_sig = script_sig;
        tx.input[i].witness = witness;
    }
    tx
}

/// Signs every draft of `drafts` (as [`sign`]), on up to `threads` threads;
/// the transactions in the drafts' order.
pub fn sign_all<'a, I>(drafts: I, keys: &KeyPool, threads: usize) -> Vec<Transaction>
where
    I: ExactSizeIterator<Item = &'a Draft>,
{
    let drafts: Vec<&Draft> = drafts.collect();
    // Below this many drafts a thread costs more than it saves.
    const PER_THREAD: usize = 8;
    let threads = threads.min(drafts.len() / PER_THREAD).max(1);
    if threads == 1 {
        return drafts.iter().map(|d| sign(d, keys)).collect();
    }
    let chunk = drafts.len().div_ceil(threads);
    std::thread::scope(|s| {
        let mut parts = drafts.chunks(chunk);
        let first = parts.next().unwrap_or_default();
        let others: Vec<_> = parts
            .map(|part| s.spawn(move || part.iter().map(|d| sign(d, keys)).collect::<Vec<_>>()))
            .collect();
        let mut txs: Vec<Transaction> = first.iter().map(|d| sign(d, keys)).collect();
        for h in others {
            txs.extend(h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
        }
        txs
    })
}

/// The digest input `i` signs.
fn digest(
    cache: &mut SighashCache<&Transaction>,
    i: usize,
    coin: &Coin,
    prevouts: &[TxOut],
    keys: &KeyPool,
) -> Message {
    // The input index is in range and each script has the shape its digest
    // needs (the kinds are built by KeyPool): these cannot fail.
    const SHAPE: &str = "input index in range, script of the digest's shape";
    let amount = Amount::from_sat(coin.value);
    let all = EcdsaSighashType::All;
    let bytes = match coin.kind {
        Kind::P2wpkh => cache
            .p2wpkh_signature_hash(i, &prevouts[i].script_pubkey, amount, all)
            .expect(SHAPE)
            .to_byte_array(),
        Kind::P2shP2wpkh => cache
            .p2wpkh_signature_hash(i, &keys.redeem_script(coin.key), amount, all)
            .expect(SHAPE)
            .to_byte_array(),
        Kind::P2tr => cache
            .taproot_key_spend_signature_hash(i, &Prevouts::All(prevouts), TapSighashType::Default)
            .expect(SHAPE)
            .to_byte_array(),
        Kind::P2pkh | Kind::BareMultisig => cache
            .legacy_signature_hash(i, &prevouts[i].script_pubkey, all.to_u32())
            .expect(SHAPE)
            .to_byte_array(),
        Kind::P2wshMultisig | Kind::P2wshCltv | Kind::P2wshCsv => {
            let ws = keys.witness_script(coin.kind, coin.key, coin.lock);
            cache
                .p2wsh_signature_hash(i, &ws, amount, all)
                .expect(SHAPE)
                .to_byte_array()
        }
    };
    Message::from_digest(bytes)
}

/// The scriptSig and witness that unlock `coin` with signatures over `msg`.
fn unlock(coin: &Coin, msg: &Message, keys: &KeyPool) -> (ScriptBuf, Witness) {
    let ecdsa = |key: u32| {
        bitcoin::ecdsa::Signature {
            signature: keys.secp.sign_ecdsa(msg, &keys.key(key).secret),
            sighash_type: EcdsaSighashType::All,
        }
        .to_vec()
    };
    let pubkey = keys.key(coin.key).public;
    match coin.kind {
        Kind::P2wpkh => (
            ScriptBuf::new(),
            Witness::from_slice(&[ecdsa(coin.key), pubkey.to_vec()]),
        ),
        Kind::P2shP2wpkh => (
            pushes(&[keys.redeem_script(coin.key).as_bytes()]),
            Witness::from_slice(&[ecdsa(coin.key), pubkey.to_vec()]),
        ),
        Kind::P2tr => {
            let sig = keys
                .secp
                .sign_schnorr_no_aux_rand(msg, &keys.key(coin.key).tap);
            (ScriptBuf::new(), Witness::from_slice(&[sig.as_ref()]))
        }
        Kind::P2pkh => (pushes(&[&ecdsa(coin.key), &pubkey]), Witness::new()),
        // OP_0 (CHECKMULTISIG's extra pop, empty as BIP-147 requires) <sig>
        Kind::BareMultisig => (pushes(&[&[], &ecdsa(coin.key)]), Witness::new()),
        Kind::P2wshMultisig => {
            let ws = keys.witness_script(coin.kind, coin.key, coin.lock);
            let sigs = [ecdsa(coin.key), ecdsa(coin.key.wrapping_add(1))];
            let items: [&[u8]; 4] = [&[], &sigs[0], &sigs[1], ws.as_bytes()];
            (ScriptBuf::new(), Witness::from_slice(&items))
        }
        Kind::P2wshCltv | Kind::P2wshCsv => {
            let ws = keys.witness_script(coin.kind, coin.key, coin.lock);
            (
                ScriptBuf::new(),
                Witness::from_slice(&[ecdsa(coin.key), ws.into_bytes()]),
            )
        }
    }
}

/// A scriptSig of data pushes only (an empty item is `OP_0`).
fn pushes(items: &[&[u8]]) -> ScriptBuf {
    let mut b = bitcoin::script::Builder::new();
    for item in items {
        let item: &PushBytes = (*item)
            .try_into()
            .expect("signatures, keys and redeem scripts are far below 4 GiB");
        b = b.push_slice(item);
    }
    b.into_script()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::hashes::Hash;

    fn coin(kind: Kind, n: u8) -> Coin {
        Coin {
            outpoint: bitcoin::OutPoint::new(bitcoin::Txid::from_byte_array([n; 32]), 1),
            value: 50_000,
            height: 10,
            key: u32::from(n),
            lock: 20,
            kind,
            coinbase: false,
        }
    }

    #[test]
    fn signed_weight_and_sigops_stay_within_the_estimate() {
        let keys = crate::keys::shared();
        let inputs: Vec<(Coin, u32)> = Kind::ALL
            .iter()
            .enumerate()
            .map(|(n, k)| (coin(*k, n as u8), 0xffff_fffd))
            .collect();
        let outputs = Kind::ALL
            .iter()
            .map(|k| TxOut {
                value: Amount::from_sat(1_000),
                script_pubkey: keys.script_pubkey(*k, 9, 30),
            })
            .collect();
        let draft = Draft {
            version: 2,
            lock_time: 25,
            inputs,
            outputs,
        };
        let tx = sign(&draft, keys);
        let weight = tx.weight().to_wu();
        assert!(
            weight <= draft.max_weight(),
            "{weight} > {}",
            draft.max_weight()
        );
        assert!(draft.max_weight() - weight < 40, "the bound is tight");
        // P2PKH output 4, bare multisig output 80; witness checks 1+1+3+1+1.
        assert_eq!(draft.sigop_cost(), 4 + 80 + 7);
        assert_eq!(sign(&draft, keys), tx, "deterministic");
    }
}
