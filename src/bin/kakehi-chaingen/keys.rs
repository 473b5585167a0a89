//! The generator's keys, derived from the seed, and the output scripts they
//! lock.
//!
//! A pool of `POOL_SIZE` secp256k1 keys: key `i` is the first valid secret
//! key among `SHA256("kakehi-chaingen/key" || seed_le64 || i_le32 ||
//! attempt_le32)`. For each key the pool keeps its compressed public key and
//! its BIP-341 key-path output key (the internal key tweaked with an empty
//! script tree), so signing never derives anything twice. Multisig scripts
//! use three consecutive keys of the pool.

use bitcoin::hashes::{sha256, Hash, HashEngine};
use bitcoin::key::{CompressedPublicKey, TapTweak, TweakedPublicKey};
use bitcoin::opcodes::all::{
    OP_CHECKMULTISIG, OP_CHECKSIG, OP_CLTV, OP_CSV, OP_DROP, OP_PUSHNUM_1, OP_PUSHNUM_2,
    OP_PUSHNUM_3,
};
use bitcoin::script::Builder;
use bitcoin::secp256k1::{All, Keypair, Secp256k1, SecretKey};
use bitcoin::{PubkeyHash, ScriptBuf, ScriptHash, WPubkeyHash, WScriptHash};

/// Keys in the pool: enough that a block's filter rarely sees one key twice,
/// few enough to derive in well under a second.
pub const POOL_SIZE: u32 = 16_384;

/// How an output is locked, and so how it is spent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Kind {
    /// BIP-141 pay-to-witness-public-key-hash (`0014<hash160>`).
    P2wpkh,
    /// BIP-341 pay-to-taproot, spent by the key path (`5120<x-only key>`).
    P2tr,
    /// Legacy pay-to-public-key-hash (`76a914<hash160>88ac`).
    P2pkh,
    /// P2WPKH nested in BIP-16 pay-to-script-hash (`a914<hash160>87`).
    P2shP2wpkh,
    /// BIP-141 pay-to-witness-script-hash of a 2-of-3 `OP_CHECKMULTISIG`.
    P2wshMultisig,
    /// A bare 1-of-3 `OP_CHECKMULTISIG` scriptPubKey.
    BareMultisig,
    /// P2WSH of `<lock> OP_CHECKLOCKTIMEVERIFY OP_DROP <key> OP_CHECKSIG`
    /// (BIP-65): spendable once a transaction's nLockTime can be `lock`.
    P2wshCltv,
    /// P2WSH of `<lock> OP_CHECKSEQUENCEVERIFY OP_DROP <key> OP_CHECKSIG`
    /// (BIP-112): spendable `lock` blocks after its creation.
    P2wshCsv,
}

impl Kind {
    /// Every kind, in declaration order.
    #[cfg(test)]
    pub const ALL: [Kind; 8] = [
        Kind::P2wpkh,
        Kind::P2tr,
        Kind::P2pkh,
        Kind::P2shP2wpkh,
        Kind::P2wshMultisig,
        Kind::BareMultisig,
        Kind::P2wshCltv,
        Kind::P2wshCsv,
    ];

    /// The name used in the manifest's statistics.
    pub fn name(self) -> &'static str {
        match self {
            Kind::P2wpkh => "p2wpkh",
            Kind::P2tr => "p2tr",
            Kind::P2pkh => "p2pkh",
            Kind::P2shP2wpkh => "p2sh_p2wpkh",
            Kind::P2wshMultisig => "p2wsh_multisig_2of3",
            Kind::BareMultisig => "bare_multisig_1of3",
            Kind::P2wshCltv => "p2wsh_cltv",
            Kind::P2wshCsv => "p2wsh_csv",
        }
    }
}

/// One key of the pool, with the hashes its scripts commit to (computed
/// once: hashing them per output was most of the generator's time).
pub struct Key {
    /// The secret key (ECDSA signing).
    pub secret: SecretKey,
    /// Its compressed public key, serialized (33 bytes).
    pub public: [u8; 33],
    /// HASH160 of the public key (P2PKH and P2WPKH programs).
    pub hash: PubkeyHash,
    /// HASH160 of the P2SH-P2WPKH redeem script.
    pub nested: ScriptHash,
    /// SHA-256 of the 2-of-3 multisig witness script starting at this key.
    pub multisig: WScriptHash,
    /// The BIP-341 tweaked key pair (key-path Schnorr signing).
    pub tap: Keypair,
    /// The BIP-341 output key the P2TR scriptPubKey commits to.
    pub tap_output: TweakedPublicKey,
}

/// The seed's keys, and the scripts built from them.
pub struct KeyPool {
    keys: Vec<Key>,
    /// The signing and verification context, shared by every thread.
    pub secp: Secp256k1<All>,
}

impl KeyPool {
    /// Derives the pool of `seed` on up to `threads` threads.
    pub fn derive(seed: u64, threads: usize) -> KeyPool {
        let secp = Secp256k1::new();
        let threads = threads.clamp(1, 64) as u32;
        let per = POOL_SIZE.div_ceil(threads);
        let keys: Vec<Key> = std::thread::scope(|s| {
            let parts: Vec<_> = (0..threads)
                .map(|t| {
                    let secp = &secp;
                    s.spawn(move || {
                        (t * per..((t + 1) * per).min(POOL_SIZE))
                            .map(|i| derive_key(secp, seed, i))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            parts
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        });
        let mut pool = KeyPool { keys, secp };
        let multisig: Vec<WScriptHash> = (0..POOL_SIZE)
            .map(|i| pool.multisig(i, 2).wscript_hash())
            .collect();
        for (key, hash) in pool.keys.iter_mut().zip(multisig) {
            key.multisig = hash;
        }
        pool
    }

    /// Key `i` (taken modulo the pool size).
    pub fn key(&self, i: u32) -> &Key {
        &self.keys[(i % POOL_SIZE) as usize]
    }

    /// The scriptPubKey of an output of `kind` locked to key `key` (and, for
    /// the lock-time kinds, `lock`).
    pub fn script_pubkey(&self, kind: Kind, key: u32, lock: u32) -> ScriptBuf {
        let k = self.key(key);
        match kind {
            Kind::P2wpkh => {
                ScriptBuf::new_p2wpkh(&WPubkeyHash::from_byte_array(k.hash.to_byte_array()))
            }
            Kind::P2tr => ScriptBuf::new_p2tr_tweaked(k.tap_output),
            Kind::P2pkh => ScriptBuf::new_p2pkh(&k.hash),
            Kind::P2shP2wpkh => ScriptBuf::new_p2sh(&k.nested),
            Kind::BareMultisig => self.multisig(key, 1),
            Kind::P2wshMultisig => ScriptBuf::new_p2wsh(&k.multisig),
            Kind::P2wshCltv | Kind::P2wshCsv => {
                ScriptBuf::new_p2wsh(&self.witness_script(kind, key, lock).wscript_hash())
            }
        }
    }

    /// The P2SH redeem script of a P2SH-P2WPKH output: its witness program.
    pub fn redeem_script(&self, key: u32) -> ScriptBuf {
        redeem_script(&self.key(key).hash)
    }

    /// The witness script of a P2WSH kind (any other kind gets the 2-of-3
    /// multisig script, which only P2WSH multisig outputs use).
    pub fn witness_script(&self, kind: Kind, key: u32, lock: u32) -> ScriptBuf {
        let lock_op = match kind {
            Kind::P2wshCltv => OP_CLTV,
            Kind::P2wshCsv => OP_CSV,
            _ => return self.multisig(key, 2),
        };
        Builder::new()
            .push_int(i64::from(lock))
            .push_opcode(lock_op)
            .push_opcode(OP_DROP)
            .push_slice(self.key(key).public)
            .push_opcode(OP_CHECKSIG)
            .into_script()
    }

    /// `OP_<m> <key> <key+1> <key+2> OP_3 OP_CHECKMULTISIG`.
    fn multisig(&self, key: u32, m: u8) -> ScriptBuf {
        let mut b = Builder::new().push_opcode(if m == 1 { OP_PUSHNUM_1 } else { OP_PUSHNUM_2 });
        for i in 0..3 {
            b = b.push_slice(self.key(key.wrapping_add(i)).public);
        }
        b.push_opcode(OP_PUSHNUM_3)
            .push_opcode(OP_CHECKMULTISIG)
            .into_script()
    }
}

fn derive_key(secp: &Secp256k1<All>, seed: u64, index: u32) -> Key {
    let secret = (0u32..)
        .find_map(|attempt| {
            let mut e = sha256::Hash::engine();
            e.input(b"kakehi-chaingen/key");
            e.input(&seed.to_le_bytes());
            e.input(&index.to_le_bytes());
            e.input(&attempt.to_le_bytes());
            SecretKey::from_slice(&sha256::Hash::from_engine(e).to_byte_array()).ok()
        })
        .expect("a SHA-256 output is a valid secret key with probability 1 - 2^-128");
    let public = CompressedPublicKey(secret.public_key(secp));
    let hash = public.pubkey_hash();
    let tweaked = Keypair::from_secret_key(secp, &secret).tap_tweak(secp, None);
    let (tap_output, _) = tweaked.public_parts();
    Key {
        secret,
        public: public.to_bytes(),
        hash,
        nested: redeem_script(&hash).script_hash(),
        // Filled once every key exists (it needs the next two).
        multisig: WScriptHash::all_zeros(),
        tap: tweaked.to_keypair(),
        tap_output,
    }
}

/// `0014<hash>`: the P2WPKH program, as a P2SH redeem script.
fn redeem_script(hash: &PubkeyHash) -> ScriptBuf {
    ScriptBuf::new_p2wpkh(&WPubkeyHash::from_byte_array(hash.to_byte_array()))
}

/// One pool (seed 1) for every unit test: deriving it takes a while.
#[cfg(test)]
pub fn shared() -> &'static KeyPool {
    static POOL: std::sync::OnceLock<KeyPool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| KeyPool::derive(1, 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_depend_on_the_seed_and_index_only() {
        let pool = shared();
        for i in [0, 1, 5_000, POOL_SIZE - 1] {
            assert_eq!(pool.key(i).secret, derive_key(&pool.secp, 1, i).secret);
            assert_ne!(pool.key(i).secret, derive_key(&pool.secp, 2, i).secret);
        }
        assert_ne!(pool.key(0).secret, pool.key(1).secret);
        // Multisig hashes were filled after every key existed.
        let ws = pool.witness_script(Kind::P2wshMultisig, POOL_SIZE - 1, 0);
        assert_eq!(pool.key(POOL_SIZE - 1).multisig, ws.wscript_hash());
    }

    #[test]
    fn scripts_have_the_standard_shapes() {
        let pool = shared();
        let spk = |k| pool.script_pubkey(k, 3, 700);
        assert!(spk(Kind::P2wpkh).is_p2wpkh());
        assert!(spk(Kind::P2tr).is_p2tr());
        assert!(spk(Kind::P2pkh).is_p2pkh());
        assert!(spk(Kind::P2shP2wpkh).is_p2sh());
        assert!(spk(Kind::P2wshMultisig).is_p2wsh());
        assert!(spk(Kind::P2wshCltv).is_p2wsh());
        assert!(spk(Kind::BareMultisig).is_multisig());
        // <700> CLTV DROP <33-byte key> CHECKSIG: 700 is the two-byte script number bc02.
        let cltv = pool.witness_script(Kind::P2wshCltv, 3, 700);
        assert_eq!(&cltv.as_bytes()[..5], &[0x02, 0xbc, 0x02, 0xb1, 0x75]);
        assert_eq!(cltv.len(), 5 + 34 + 1);
    }
}
