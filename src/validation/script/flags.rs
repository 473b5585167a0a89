//! Script verification flags (Core's `SCRIPT_VERIFY_*`) and the flags a
//! block is verified under (Core's `GetBlockScriptFlags`).
//!
//! Source: Bitcoin Core `src/script/interpreter.h` (the bits; the glue in
//! `engine.cpp` asserts at compile time that each bit here is Core 26.0's)
//! and `src/validation.cpp` `GetBlockScriptFlags` (Core 26.0 to 31.99 alike).

use bitcoin::BlockHash;

use crate::chain::params::ChainParams;

/// A set of Core's script verification flags (`SCRIPT_VERIFY_*`, 21 bits).
///
/// Seven are consensus rules, the ones a block is checked under: [`P2SH`],
/// [`DERSIG`], [`NULLDUMMY`], [`CHECKLOCKTIMEVERIFY`],
/// [`CHECKSEQUENCEVERIFY`], [`WITNESS`], [`TAPROOT`]. The others are Core's
/// relay policy; kakehi never sets them on blocks, but the interpreter
/// takes them (Core's test vectors use them).
///
/// [`P2SH`]: ScriptFlags::P2SH
/// [`DERSIG`]: ScriptFlags::DERSIG
/// [`NULLDUMMY`]: ScriptFlags::NULLDUMMY
/// [`CHECKLOCKTIMEVERIFY`]: ScriptFlags::CHECKLOCKTIMEVERIFY
/// [`CHECKSEQUENCEVERIFY`]: ScriptFlags::CHECKSEQUENCEVERIFY
/// [`WITNESS`]: ScriptFlags::WITNESS
/// [`TAPROOT`]: ScriptFlags::TAPROOT
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ScriptFlags(u32);

impl ScriptFlags {
    /// No flag.
    pub const NONE: Self = Self(0);
    /// Evaluate P2SH redeem scripts (BIP16).
    pub const P2SH: Self = Self(1 << 0);
    /// Policy: strict signature and public key encodings.
    pub const STRICTENC: Self = Self(1 << 1);
    /// Strict DER signatures (BIP66).
    pub const DERSIG: Self = Self(1 << 2);
    /// Policy: low S signatures.
    pub const LOW_S: Self = Self(1 << 3);
    /// The CHECKMULTISIG dummy must be empty (BIP147).
    pub const NULLDUMMY: Self = Self(1 << 4);
    /// Policy: scriptSig push-only.
    pub const SIGPUSHONLY: Self = Self(1 << 5);
    /// Policy: minimal pushes and numbers.
    pub const MINIMALDATA: Self = Self(1 << 6);
    /// Policy: executed upgradable NOPs fail.
    pub const DISCOURAGE_UPGRADABLE_NOPS: Self = Self(1 << 7);
    /// Policy: exactly one stack element left (needs P2SH and WITNESS).
    pub const CLEANSTACK: Self = Self(1 << 8);
    /// OP_CHECKLOCKTIMEVERIFY (BIP65).
    pub const CHECKLOCKTIMEVERIFY: Self = Self(1 << 9);
    /// OP_CHECKSEQUENCEVERIFY (BIP112).
    pub const CHECKSEQUENCEVERIFY: Self = Self(1 << 10);
    /// Segregated witness (BIP141, BIP143; needs P2SH).
    pub const WITNESS: Self = Self(1 << 11);
    /// Policy: unknown witness versions fail.
    pub const DISCOURAGE_UPGRADABLE_WITNESS_PROGRAM: Self = Self(1 << 12);
    /// Policy: minimal OP_IF arguments in segwit v0.
    pub const MINIMALIF: Self = Self(1 << 13);
    /// Policy: failed signature checks need empty signatures.
    pub const NULLFAIL: Self = Self(1 << 14);
    /// Policy: compressed keys in segwit v0.
    pub const WITNESS_PUBKEYTYPE: Self = Self(1 << 15);
    /// Policy: no OP_CODESEPARATOR or FindAndDelete in legacy scripts.
    pub const CONST_SCRIPTCODE: Self = Self(1 << 16);
    /// Taproot and tapscript (BIP341, BIP342).
    pub const TAPROOT: Self = Self(1 << 17);
    /// Policy: unknown taproot leaf versions fail.
    pub const DISCOURAGE_UPGRADABLE_TAPROOT_VERSION: Self = Self(1 << 18);
    /// Policy: OP_SUCCESSx fail.
    pub const DISCOURAGE_OP_SUCCESS: Self = Self(1 << 19);
    /// Policy: unknown tapscript public key types fail.
    pub const DISCOURAGE_UPGRADABLE_PUBKEYTYPE: Self = Self(1 << 20);

    /// Every flag with Core's name (without `SCRIPT_VERIFY_`), in bit order.
    pub const NAMED: [(&'static str, Self); 21] = [
        ("P2SH", Self::P2SH),
        ("STRICTENC", Self::STRICTENC),
        ("DERSIG", Self::DERSIG),
        ("LOW_S", Self::LOW_S),
        ("NULLDUMMY", Self::NULLDUMMY),
        ("SIGPUSHONLY", Self::SIGPUSHONLY),
        ("MINIMALDATA", Self::MINIMALDATA),
        (
            "DISCOURAGE_UPGRADABLE_NOPS",
            Self::DISCOURAGE_UPGRADABLE_NOPS,
        ),
        ("CLEANSTACK", Self::CLEANSTACK),
        ("CHECKLOCKTIMEVERIFY", Self::CHECKLOCKTIMEVERIFY),
        ("CHECKSEQUENCEVERIFY", Self::CHECKSEQUENCEVERIFY),
        ("WITNESS", Self::WITNESS),
        (
            "DISCOURAGE_UPGRADABLE_WITNESS_PROGRAM",
            Self::DISCOURAGE_UPGRADABLE_WITNESS_PROGRAM,
        ),
        ("MINIMALIF", Self::MINIMALIF),
        ("NULLFAIL", Self::NULLFAIL),
        ("WITNESS_PUBKEYTYPE", Self::WITNESS_PUBKEYTYPE),
        ("CONST_SCRIPTCODE", Self::CONST_SCRIPTCODE),
        ("TAPROOT", Self::TAPROOT),
        (
            "DISCOURAGE_UPGRADABLE_TAPROOT_VERSION",
            Self::DISCOURAGE_UPGRADABLE_TAPROOT_VERSION,
        ),
        ("DISCOURAGE_OP_SUCCESS", Self::DISCOURAGE_OP_SUCCESS),
        (
            "DISCOURAGE_UPGRADABLE_PUBKEYTYPE",
            Self::DISCOURAGE_UPGRADABLE_PUBKEYTYPE,
        ),
    ];

    /// The flags with these bits (unknown bits are kept; the interpreter
    /// refuses them).
    pub const fn from_bits(bits: u32) -> Self {
        Self(bits)
    }

    /// The bits, as Core's `unsigned int flags`.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// `self` with the flags of `other` removed.
    pub const fn without(self, other: Self) -> Self {
        Self(self.0 & !other.0)
    }

    /// The flag named `name` (Core's name without `SCRIPT_VERIFY_`).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::NAMED
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, f)| *f)
    }
}

impl std::ops::BitOr for ScriptFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for ScriptFlags {
    fn bitor_assign(&mut self, rhs: Self) {
        self.0 |= rhs.0;
    }
}

/// Comma-separated names (`P2SH,DERSIG,WITNESS`), `NONE` when empty, and
/// `0x…` for bits Core does not define.
impl std::fmt::Display for ScriptFlags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0 == 0 {
            return f.write_str("NONE");
        }
        let mut rest = self.0;
        let mut first = true;
        for (name, flag) in Self::NAMED {
            if self.contains(flag) {
                if !first {
                    f.write_str(",")?;
                }
                f.write_str(name)?;
                first = false;
                rest &= !flag.0;
            }
        }
        if rest != 0 {
            if !first {
                f.write_str(",")?;
            }
            write!(f, "{rest:#x}")?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for ScriptFlags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScriptFlags({self})")
    }
}

/// The flags the scripts of block `hash` at `height` are verified under
/// (Core's `GetBlockScriptFlags`): P2SH, WITNESS and TAPROOT always (Core
/// applies them retroactively: no historical block violates them but the
/// exceptions), replaced by the network's exception for the blocks listed in
/// [`ChainParams::script_flag_exceptions`]; then DERSIG from
/// [`ChainParams::bip66_height`], CHECKLOCKTIMEVERIFY from
/// [`ChainParams::bip65_height`], CHECKSEQUENCEVERIFY from
/// [`ChainParams::csv_height`] and NULLDUMMY from
/// [`ChainParams::segwit_height`].
pub fn block_script_flags(params: &ChainParams, height: u32, hash: &BlockHash) -> ScriptFlags {
    let mut flags = ScriptFlags::P2SH | ScriptFlags::WITNESS | ScriptFlags::TAPROOT;
    if let Some(bits) = params.script_flag_exception(hash) {
        flags = ScriptFlags::from_bits(bits);
    }
    if height >= params.bip66_height {
        flags |= ScriptFlags::DERSIG;
    }
    if height >= params.bip65_height {
        flags |= ScriptFlags::CHECKLOCKTIMEVERIFY;
    }
    if height >= params.csv_height {
        flags |= ScriptFlags::CHECKSEQUENCEVERIFY;
    }
    if height >= params.segwit_height {
        flags |= ScriptFlags::NULLDUMMY;
    }
    flags
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::hashes::Hash;
    use bitcoin::Network;

    fn hash(s: &str) -> BlockHash {
        s.parse().unwrap()
    }

    #[test]
    fn mainnet_flags_by_height_and_exceptions() {
        let p = ChainParams::new(Network::Bitcoin);
        let any = hash("00000000000000000000000000000000000000000000000000000000000000aa");
        let base = ScriptFlags::P2SH | ScriptFlags::WITNESS | ScriptFlags::TAPROOT;
        assert_eq!(block_script_flags(&p, 1, &any), base);
        assert_eq!(
            block_script_flags(&p, 363_725, &any),
            base | ScriptFlags::DERSIG
        );
        assert_eq!(
            block_script_flags(&p, 481_824, &any),
            base | ScriptFlags::DERSIG
                | ScriptFlags::CHECKLOCKTIMEVERIFY
                | ScriptFlags::CHECKSEQUENCEVERIFY
                | ScriptFlags::NULLDUMMY
        );
        // BIP16 exception (height 170,060): no flag at all.
        let bip16 = hash("00000000000002dc756eebf4f49723ed8d30cc28a5f108eb94b1ba88ac4f9c22");
        assert_eq!(block_script_flags(&p, 170_060, &bip16), ScriptFlags::NONE);
        // Taproot exception (height 692,261): P2SH and WITNESS, not TAPROOT.
        let taproot = hash("0000000000000000000f14c35b2d841e986ab5441de8c585d5ffe55ea1e395ad");
        let f = block_script_flags(&p, 692_261, &taproot);
        assert!(f.contains(ScriptFlags::P2SH | ScriptFlags::WITNESS | ScriptFlags::NULLDUMMY));
        assert!(!f.contains(ScriptFlags::TAPROOT));
        // The testnet3 exception is not mainnet's.
        let t3 = hash("00000000dd30457c001f4095d208cc1296b0eed002427aa599874af7a432b105");
        assert_eq!(block_script_flags(&p, 1, &t3), base);
        let t = ChainParams::new(Network::Testnet);
        assert_eq!(block_script_flags(&t, 1, &t3), ScriptFlags::NONE);
    }

    #[test]
    fn regtest_checks_every_consensus_flag_from_height_1() {
        let p = ChainParams::new(Network::Regtest);
        let f = block_script_flags(&p, 1, &BlockHash::from_byte_array([7; 32]));
        assert_eq!(
            f.to_string(),
            "P2SH,DERSIG,NULLDUMMY,CHECKLOCKTIMEVERIFY,CHECKSEQUENCEVERIFY,WITNESS,TAPROOT"
        );
    }

    #[test]
    fn names_round_trip() {
        for (name, flag) in ScriptFlags::NAMED {
            assert_eq!(ScriptFlags::from_name(name), Some(flag));
            assert_eq!(flag.to_string(), name);
        }
        assert_eq!(ScriptFlags::NONE.to_string(), "NONE");
        assert_eq!(
            ScriptFlags::from_bits(1 << 22 | 1).to_string(),
            "P2SH,0x400000"
        );
    }
}
