//! Regtest blocks built by the tests themselves, on top of regtest-a, with
//! outputs the tests can spend: coinbase (BIP34 height, BIP141 witness
//! commitment), merkle root, proof of work; and a small wallet signing the
//! common output types with rust-bitcoin's signature-hash code and
//! libsecp256k1 (never kakehi's code). Shared by `tests/` and `benches/`.

use bitcoin::blockdata::script::{Builder, PushBytesBuf};
use bitcoin::consensus::encode::serialize;
use bitcoin::hashes::Hash;
use bitcoin::opcodes::all::{OP_CHECKMULTISIG, OP_PUSHNUM_2, OP_PUSHNUM_3};
use bitcoin::secp256k1::{All, Keypair, Message, PublicKey, Secp256k1, SecretKey};
use bitcoin::sighash::{EcdsaSighashType, Prevouts, SighashCache, TapSighashType};
use bitcoin::{
    absolute, block, transaction, Amount, Block, BlockHash, CompactTarget, OutPoint, ScriptBuf,
    Sequence, Transaction, TxIn, TxMerkleNode, TxOut, Witness,
};

/// Regtest's proof-of-work limit (`0x207fffff`): about two tries per block.
pub const REGTEST_BITS: u32 = 0x207f_ffff;

/// The output types the wallet signs for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Pay to public key hash (compressed key).
    P2pkh,
    /// Native segwit v0 key hash.
    P2wpkh,
    /// P2WPKH nested in P2SH.
    P2shP2wpkh,
    /// Taproot, key path (BIP86 tweak, no script tree).
    P2tr,
    /// 2-of-3 bare multisig inside P2SH.
    P2shMultisig,
    /// 2-of-3 multisig inside P2WSH.
    P2wshMultisig,
}

impl Kind {
    /// Every kind, in a fixed order.
    pub const ALL: [Kind; 6] = [
        Kind::P2pkh,
        Kind::P2wpkh,
        Kind::P2shP2wpkh,
        Kind::P2tr,
        Kind::P2shMultisig,
        Kind::P2wshMultisig,
    ];
}

/// Three fixed keys and the scripts built from them.
pub struct Wallet {
    secp: Secp256k1<All>,
    keys: [SecretKey; 3],
}

impl Default for Wallet {
    fn default() -> Self {
        Self::new()
    }
}

fn push(b: Builder, data: &[u8]) -> Builder {
    b.push_slice(PushBytesBuf::try_from(data.to_vec()).expect("push size"))
}

impl Wallet {
    /// The wallet with secret keys 0x11.., 0x22.., 0x33...
    pub fn new() -> Self {
        let key = |b: u8| SecretKey::from_slice(&[b; 32]).expect("valid key");
        Wallet {
            secp: Secp256k1::new(),
            keys: [key(0x11), key(0x22), key(0x33)],
        }
    }

    fn pubkey(&self, i: usize) -> PublicKey {
        self.keys[i].public_key(&self.secp)
    }

    fn key_hash(&self) -> bitcoin::PubkeyHash {
        bitcoin::PublicKey::new(self.pubkey(0)).pubkey_hash()
    }

    fn wpubkey_hash(&self) -> bitcoin::WPubkeyHash {
        bitcoin::CompressedPublicKey(self.pubkey(0)).wpubkey_hash()
    }

    /// `2 <k0> <k1> <k2> 3 CHECKMULTISIG`.
    pub fn multisig_script(&self) -> ScriptBuf {
        let mut b = Builder::new().push_opcode(OP_PUSHNUM_2);
        for i in 0..3 {
            b = push(b, &self.pubkey(i).serialize());
        }
        b.push_opcode(OP_PUSHNUM_3)
            .push_opcode(OP_CHECKMULTISIG)
            .into_script()
    }

    /// The scriptPubKey of `kind`.
    pub fn script_pubkey(&self, kind: Kind) -> ScriptBuf {
        match kind {
            Kind::P2pkh => ScriptBuf::new_p2pkh(&self.key_hash()),
            Kind::P2wpkh => ScriptBuf::new_p2wpkh(&self.wpubkey_hash()),
            Kind::P2shP2wpkh => {
                ScriptBuf::new_p2sh(&ScriptBuf::new_p2wpkh(&self.wpubkey_hash()).script_hash())
            }
            Kind::P2tr => {
                let (internal, _) = self.pubkey(0).x_only_public_key();
                ScriptBuf::new_p2tr(&self.secp, internal, None)
            }
            Kind::P2shMultisig => ScriptBuf::new_p2sh(&self.multisig_script().script_hash()),
            Kind::P2wshMultisig => ScriptBuf::new_p2wsh(&self.multisig_script().wscript_hash()),
        }
    }

    fn ecdsa(&self, key: usize, digest: [u8; 32]) -> Vec<u8> {
        let sig = self
            .secp
            .sign_ecdsa(&Message::from_digest(digest), &self.keys[key]);
        bitcoin::ecdsa::Signature {
            signature: sig,
            sighash_type: EcdsaSighashType::All,
        }
        .to_vec()
    }

    /// Signs every input of `tx`, which spends `prevouts` (same order,
    /// each of one of the wallet's kinds) with SIGHASH_ALL / DEFAULT.
    pub fn sign(&self, tx: &mut Transaction, prevouts: &[(Kind, TxOut)]) {
        let outs: Vec<TxOut> = prevouts.iter().map(|(_, o)| o.clone()).collect();
        let unsigned = tx.clone();
        let mut cache = SighashCache::new(&unsigned);
        for (i, (kind, out)) in prevouts.iter().enumerate() {
            let (script_sig, witness) = self.sign_input(&mut cache, i, *kind, out, &outs);
            tx.input[i].script_sig = script_sig;
            tx.input[i].witness = witness;
        }
    }

    fn sign_input(
        &self,
        cache: &mut SighashCache<&Transaction>,
        i: usize,
        kind: Kind,
        out: &TxOut,
        outs: &[TxOut],
    ) -> (ScriptBuf, Witness) {
        let pk0 = self.pubkey(0).serialize();
        let ms = self.multisig_script();
        let all = EcdsaSighashType::All;
        match kind {
            Kind::P2pkh => {
                let h = cache
                    .legacy_signature_hash(i, &out.script_pubkey, all.to_u32())
                    .expect("index");
                let sig = self.ecdsa(0, h.to_byte_array());
                (
                    push(push(Builder::new(), &sig), &pk0).into_script(),
                    Witness::new(),
                )
            }
            Kind::P2wpkh | Kind::P2shP2wpkh => {
                let program = ScriptBuf::new_p2wpkh(&self.wpubkey_hash());
                let h = cache
                    .p2wpkh_signature_hash(i, &program, out.value, all)
                    .expect("p2wpkh");
                let sig = self.ecdsa(0, h.to_byte_array());
                let script_sig = if kind == Kind::P2shP2wpkh {
                    push(Builder::new(), program.as_bytes()).into_script()
                } else {
                    ScriptBuf::new()
                };
                (script_sig, Witness::from_slice(&[sig, pk0.to_vec()]))
            }
            Kind::P2tr => {
                let h = cache
                    .taproot_key_spend_signature_hash(
                        i,
                        &Prevouts::All(outs),
                        TapSighashType::Default,
                    )
                    .expect("taproot");
                let keypair = Keypair::from_secret_key(&self.secp, &self.keys[0]);
                let tweaked = bitcoin::key::TapTweak::tap_tweak(keypair, &self.secp, None);
                let sig = self.secp.sign_schnorr_no_aux_rand(
                    &Message::from_digest(h.to_byte_array()),
                    &tweaked.to_keypair(),
                );
                (
                    ScriptBuf::new(),
                    Witness::from_slice(&[sig.serialize().to_vec()]),
                )
            }
            Kind::P2shMultisig => {
                let h = cache
                    .legacy_signature_hash(i, &ms, all.to_u32())
                    .expect("index");
                let d = h.to_byte_array();
                let b = Builder::new().push_int(0);
                let b = push(push(b, &self.ecdsa(0, d)), &self.ecdsa(1, d));
                (push(b, ms.as_bytes()).into_script(), Witness::new())
            }
            Kind::P2wshMultisig => {
                let h = cache
                    .p2wsh_signature_hash(i, &ms, out.value, all)
                    .expect("p2wsh");
                let d = h.to_byte_array();
                let items = [
                    Vec::new(),
                    self.ecdsa(0, d),
                    self.ecdsa(1, d),
                    ms.to_bytes(),
                ];
                (ScriptBuf::new(), Witness::from_slice(&items))
            }
        }
    }
}

/// A version-2 transaction of `n` inputs spending `prevout` (of `kind`)
/// at the made-up outpoints (`[t % 251 + 1; 32]`, `t·10 + i`), paying
/// `value` sats to the wallet's P2WPKH, signed: benchmark material (the
/// outpoints exist nowhere; the scripts verify).
pub fn signed_spend(
    wallet: &Wallet,
    kind: Kind,
    prevout: &TxOut,
    (t, n): (usize, usize),
    value: u64,
) -> Transaction {
    let input = (0..n)
        .map(|i| TxIn {
            previous_output: OutPoint {
                txid: bitcoin::Txid::from_byte_array([(t % 251) as u8 + 1; 32]),
                vout: (t * 10 + i) as u32,
            },
            sequence: Sequence::MAX,
            ..TxIn::default()
        })
        .collect();
    let mut tx = Transaction {
        version: transaction::Version::TWO,
        lock_time: absolute::LockTime::ZERO,
        input,
        output: vec![TxOut {
            value: Amount::from_sat(value),
            script_pubkey: wallet.script_pubkey(Kind::P2wpkh),
        }],
    };
    wallet.sign(&mut tx, &vec![(kind, prevout.clone()); n]);
    tx
}

/// A version-2 transaction spending output 0 of `funding` (a P2WPKH output
/// of `wallet`) to the wallet's P2WPKH for a fee of `fee` sats, signed; its
/// signature's byte 10 flipped when `corrupt` (a script failure).
pub fn spend_p2wpkh(
    wallet: &Wallet,
    funding: &Transaction,
    fee: u64,
    corrupt: bool,
) -> Transaction {
    let coin = funding.output[0].clone();
    let mut tx = Transaction {
        version: transaction::Version::TWO,
        lock_time: absolute::LockTime::ZERO,
        input: vec![TxIn {
            previous_output: OutPoint {
                txid: funding.compute_txid(),
                vout: 0,
            },
            sequence: Sequence::MAX,
            ..TxIn::default()
        }],
        output: vec![TxOut {
            value: coin.value - Amount::from_sat(fee),
            script_pubkey: wallet.script_pubkey(Kind::P2wpkh),
        }],
    };
    wallet.sign(&mut tx, &[(Kind::P2wpkh, coin)]);
    if corrupt {
        let mut items: Vec<Vec<u8>> = tx.input[0].witness.iter().map(<[u8]>::to_vec).collect();
        items[0][10] ^= 0x01;
        tx.input[0].witness = Witness::from_slice(&items);
    }
    tx
}

/// Regtest's genesis, then blocks 1..=`height` on it, each paying its
/// subsidy to the wallet's P2WPKH (the coinbase of block h is spendable
/// from h + 100).
pub fn mature_chain(wallet: &Wallet, height: u32) -> Vec<Block> {
    let mut chain = vec![bitcoin::blockdata::constants::genesis_block(
        bitcoin::Network::Regtest,
    )];
    for h in 1..=height {
        let b = block_on(wallet, &chain[chain.len() - 1], h, 0, vec![]);
        chain.push(b);
    }
    chain
}

/// A block on `prev` at `height` paying its subsidy to the wallet's P2WPKH,
/// with `txs`; `tag` tells apart blocks at the same height.
pub fn block_on(
    wallet: &Wallet,
    prev: &Block,
    height: u32,
    tag: u32,
    txs: Vec<Transaction>,
) -> Block {
    let pay = TxOut {
        value: Amount::from_sat(subsidy(height)),
        script_pubkey: wallet.script_pubkey(Kind::P2wpkh),
    };
    mine(
        (prev.block_hash(), prev.header.time),
        coinbase(height, tag, vec![pay]),
        txs,
    )
}

/// A coinbase for `height`: scriptSig = BIP34 height push then `tag` (so
/// that blocks at the same height differ), paying `outputs`.
pub fn coinbase(height: u32, tag: u32, outputs: Vec<TxOut>) -> Transaction {
    let script_sig = Builder::new()
        .push_int(i64::from(height))
        .push_int(i64::from(tag))
        .into_script();
    Transaction {
        version: transaction::Version::ONE,
        lock_time: absolute::LockTime::ZERO,
        input: vec![TxIn {
            previous_output: OutPoint::null(),
            script_sig,
            sequence: Sequence::MAX,
            witness: Witness::new(),
        }],
        output: outputs,
    }
}

/// A block on `prev` (hash and time) with `coinbase` and `txs`: the
/// witness commitment added to the coinbase when a transaction has a
/// witness, the merkle root set, and the nonce ground to regtest's target.
pub fn mine(prev: (BlockHash, u32), mut coinbase: Transaction, txs: Vec<Transaction>) -> Block {
    let segwit = txs
        .iter()
        .any(|t| t.input.iter().any(|i| !i.witness.is_empty()));
    if segwit {
        coinbase.input[0].witness = Witness::from_slice(&[[0u8; 32]]);
    }
    let mut txdata = vec![coinbase];
    txdata.extend(txs);
    let header = block::Header {
        version: block::Version::from_consensus(0x2000_0000),
        prev_blockhash: prev.0,
        merkle_root: TxMerkleNode::all_zeros(),
        time: prev.1 + 600,
        bits: CompactTarget::from_consensus(REGTEST_BITS),
        nonce: 0,
    };
    let mut block = Block { header, txdata };
    if segwit {
        let root = block.witness_root().expect("witness root");
        let commitment = Block::compute_witness_commitment(&root, &[0u8; 32]);
        let mut spk = vec![0x6a, 0x24, 0xaa, 0x21, 0xa9, 0xed];
        spk.extend_from_slice(commitment.as_byte_array());
        block.txdata[0].output.push(TxOut {
            value: Amount::ZERO,
            script_pubkey: ScriptBuf::from_bytes(spk),
        });
    }
    block.header.merkle_root = block.compute_merkle_root().expect("merkle root");
    let target = block.header.target();
    while block.header.validate_pow(target).is_err() {
        block.header.nonce += 1;
    }
    block
}

/// `block` in Core's blk-file framing (magic, length, bytes), regtest.
pub fn framed(block: &Block) -> Vec<u8> {
    let raw = serialize(block);
    let mut out = vec![0xfa, 0xbf, 0xb5, 0xda];
    out.extend_from_slice(&(raw.len() as u32).to_le_bytes());
    out.extend_from_slice(&raw);
    out
}

/// Regtest's block subsidy at `height` (halving every 150 blocks), sats.
pub fn subsidy(height: u32) -> u64 {
    let halvings = height / 150;
    if halvings >= 64 {
        0
    } else {
        (50 * 100_000_000u64) >> halvings
    }
}

/// A version-2 transaction spending `coins` (outputs paying the wallet's
/// P2WPKH) to `outputs`, each input with `sequence`, changed by `edit`
/// before it is signed.
pub fn signed_p2wpkh_spend(
    wallet: &Wallet,
    coins: &[(OutPoint, TxOut)],
    outputs: Vec<TxOut>,
    sequence: Sequence,
    edit: impl FnOnce(&mut Transaction),
) -> Transaction {
    let mut tx = Transaction {
        version: transaction::Version::TWO,
        lock_time: absolute::LockTime::ZERO,
        input: coins
            .iter()
            .map(|(op, _)| TxIn {
                previous_output: *op,
                sequence,
                ..TxIn::default()
            })
            .collect(),
        output: outputs,
    };
    edit(&mut tx);
    let prevouts: Vec<(Kind, TxOut)> = coins
        .iter()
        .map(|(_, o)| (Kind::P2wpkh, o.clone()))
        .collect();
    wallet.sign(&mut tx, &prevouts);
    tx
}
