//! Network parameters: genesis, magic, ports, proof-of-work rules, soft-fork
//! activation heights, subsidy schedule, archive epoch length.
//!
//! Source: Bitcoin Core `src/kernel/chainparams.cpp` (activation heights,
//! halving intervals, DNS seeds, script-flag exceptions; minimum chainwork
//! and the default assumevalid blocks as of Core 31.99, the version vendored
//! by the crates.io package `libbitcoinkernel-sys` 0.4.1) and rust-bitcoin's
//! [`bitcoin::params::Params`] (PoW limits and retarget rules).

use bitcoin::block::Header;
use bitcoin::hex::FromHex;
use bitcoin::{BlockHash, Network};

/// Everything kakehi needs to know about one network.
#[derive(Clone, Debug)]
pub struct ChainParams {
    /// The network.
    pub network: Network,
    /// Proof-of-work rules (limit, spacing, timespan, min-difficulty and
    /// no-retarget flags) from rust-bitcoin.
    pub pow: bitcoin::params::Params,
    /// Height from which BIP34 (height in coinbase) is enforced.
    pub bip34_height: u32,
    /// Height from which BIP65 (CHECKLOCKTIMEVERIFY) is active.
    pub bip65_height: u32,
    /// Height from which BIP66 (strict DER) is active.
    pub bip66_height: u32,
    /// Height from which CSV (BIP68/112/113) is active.
    pub csv_height: u32,
    /// Height from which segwit (BIP141/143/147) is active.
    pub segwit_height: u32,
    /// Blocks a coinbase output must wait before it can be spent
    /// ([`COINBASE_MATURITY`] = 100 on every network; only tests replaying
    /// btcd's fixtures, built with btcd's `CoinbaseMaturity = 1`, lower it).
    pub coinbase_maturity: u32,
    /// Blocks between subsidy halvings (210,000; 150 on regtest).
    pub subsidy_halving_interval: u32,
    /// Whether testnet4's BIP94 rules apply (timewarp fix, and the
    /// min-difficulty exception measured from the first block of the period).
    pub enforce_bip94: bool,
    /// Default P2P port.
    pub p2p_port: u16,
    /// Default HTTP port (Esplora's convention: 3000 mainnet, 3001 testnet3,
    /// 3002 regtest, 3003 signet, 3004 testnet4).
    pub http_port: u16,
    /// Default port of the JSON-RPC server (Core's `BaseParams::RPCPort`,
    /// `src/chainparamsbase.cpp`: 8332 mainnet, 18332 testnet3, 48332
    /// testnet4, 38332 signet, 18443 regtest).
    pub rpc_port: u16,
    /// DNS seeds to bootstrap the address book.
    pub dns_seeds: &'static [&'static str],
    /// Minimum total chainwork (big-endian 32 bytes) below which headers are
    /// not stored (Core's `nMinimumChainWork`; zero on regtest).
    pub minimum_chain_work: [u8; 32],
    /// The block whose ancestors' scripts may be skipped by default (Core's
    /// `defaultAssumeValid`, hex in display order; see
    /// [`crate::chain::assumevalid`]); `None` on regtest.
    pub default_assume_valid: Option<&'static str>,
    /// Length of an archive epoch in blocks (2,016; 144 on regtest).
    pub archive_epoch_length: u32,
    /// Blocks whose coinbase duplicates an earlier one and is allowed to
    /// (BIP30's two historical mainnet exceptions): (height, hash hex).
    pub bip30_exceptions: &'static [(u32, &'static str)],
    /// Blocks whose scripts are verified under other flags than every
    /// other block's (Core's `script_flag_exceptions`: the one block before
    /// BIP16 that breaks P2SH, on mainnet and testnet3, and mainnet's one
    /// block that breaks taproot): (hash hex, Core's `SCRIPT_VERIFY_*` bits,
    /// see [`crate::validation::script::ScriptFlags`]).
    pub script_flag_exceptions: &'static [(&'static str, u32)],
}

/// Coinbase outputs can be spent only this many blocks later (Core's
/// `COINBASE_MATURITY`).
pub const COINBASE_MATURITY: u32 = 100;

/// 21 million BTC in satoshis (Core's `MAX_MONEY`).
pub const MAX_MONEY: u64 = 21_000_000 * 100_000_000;

/// Maximum block weight in weight units (BIP141).
pub const MAX_BLOCK_WEIGHT: u64 = 4_000_000;

/// Maximum block sigop cost (BIP141).
pub const MAX_BLOCK_SIGOPS_COST: u64 = 80_000;

/// Core's `SCRIPT_VERIFY_P2SH` bit (for the script-flag exceptions).
const SCRIPT_VERIFY_P2SH: u32 = 1 << 0;
/// Core's `SCRIPT_VERIFY_WITNESS` bit (for the script-flag exceptions).
const SCRIPT_VERIFY_WITNESS: u32 = 1 << 11;

/// Blocks may be at most this many seconds ahead of adjusted time (Core's
/// `MAX_FUTURE_BLOCK_TIME`).
pub const MAX_FUTURE_BLOCK_TIME: u64 = 2 * 60 * 60;

/// 32 bytes from the 64 hex digits of a constant of this file.
///
/// # Panics
/// On a literal that is not 64 hex digits: only the constants below are
/// passed, and `every_network_has_parameters` builds each network's.
fn hex32(s: &str) -> [u8; 32] {
    <[u8; 32]>::from_hex(s).expect("a chain-parameter constant is 64 hex digits (tested)")
}

impl ChainParams {
    /// The parameters of `network`.
    pub fn new(network: Network) -> Self {
        match network {
            Network::Bitcoin => Self::mainnet(),
            Network::Testnet => Self::testnet3(),
            Network::Testnet4 => Self::testnet4(),
            Network::Signet => Self::signet(),
            _ => Self::regtest(),
        }
    }

    /// The parameters of mainnet (Core's `CMainParams`, `src/kernel/chainparams.cpp`).
    fn mainnet() -> Self {
        ChainParams {
            network: Network::Bitcoin,
            pow: bitcoin::params::Params::new(Network::Bitcoin),
            bip34_height: 227_931,
            bip65_height: 388_381,
            bip66_height: 363_725,
            csv_height: 419_328,
            segwit_height: 481_824,
            coinbase_maturity: COINBASE_MATURITY,
            subsidy_halving_interval: 210_000,
            enforce_bip94: false,
            p2p_port: 8333,
            http_port: 3000,
            rpc_port: 8332,
            dns_seeds: &[
                "seed.bitcoin.sipa.be",
                "dnsseed.bluematt.me",
                "seed.bitcoin.jonasschnelli.ch",
                "seed.btc.petertodd.net",
                "seed.bitcoin.sprovoost.nl",
                "dnsseed.emzy.de",
                "seed.bitcoin.wiz.biz",
            ],
            minimum_chain_work: hex32(
                "0000000000000000000000000000000000000001128750f82f4c366153a3a030",
            ),
            // Height 938,343.
            default_assume_valid: Some(
                "00000000000000000000ccebd6d74d9194d8dcdc1d177c478e094bfad51ba5ac",
            ),
            archive_epoch_length: 2016,
            bip30_exceptions: &[
                (
                    91_842,
                    "00000000000a4d0a398161ffc163c503763b1f4360639393e0e4c8e300e0caec",
                ),
                (
                    91_880,
                    "00000000000743f190a18c5577a3c2d2a1f610ae9601ac046a38084ccb7cd721",
                ),
            ],
            script_flag_exceptions: &[
                // BIP16 exception (height 170,060): SCRIPT_VERIFY_NONE.
                (
                    "00000000000002dc756eebf4f49723ed8d30cc28a5f108eb94b1ba88ac4f9c22",
                    0,
                ),
                // Taproot exception (height 692,261): P2SH | WITNESS.
                (
                    "0000000000000000000f14c35b2d841e986ab5441de8c585d5ffe55ea1e395ad",
                    SCRIPT_VERIFY_P2SH | SCRIPT_VERIFY_WITNESS,
                ),
            ],
        }
    }

    /// The parameters of testnet3 (Core's `CTestNetParams`).
    fn testnet3() -> Self {
        ChainParams {
            network: Network::Testnet,
            pow: bitcoin::params::Params::new(Network::Testnet),
            bip34_height: 21_111,
            bip65_height: 581_885,
            bip66_height: 330_776,
            csv_height: 770_112,
            segwit_height: 834_624,
            coinbase_maturity: COINBASE_MATURITY,
            subsidy_halving_interval: 210_000,
            enforce_bip94: false,
            p2p_port: 18333,
            http_port: 3001,
            rpc_port: 18332,
            dns_seeds: &[
                "testnet-seed.bitcoin.jonasschnelli.ch",
                "seed.tbtc.petertodd.net",
                "seed.testnet.bitcoin.sprovoost.nl",
                "testnet-seed.bluematt.me",
            ],
            minimum_chain_work: hex32(
                "0000000000000000000000000000000000000000000017dde1c649f3708d14b6",
            ),
            // Height 4,842,348.
            default_assume_valid: Some(
                "000000007a61e4230b28ac5cb6b5e5a0130de37ac1faf2f8987d2fa6505b67f4",
            ),
            archive_epoch_length: 2016,
            bip30_exceptions: &[],
            script_flag_exceptions: &[
                // BIP16 exception: SCRIPT_VERIFY_NONE.
                (
                    "00000000dd30457c001f4095d208cc1296b0eed002427aa599874af7a432b105",
                    0,
                ),
            ],
        }
    }

    /// The parameters of testnet4 (Core's `CTestNet4Params`, BIP94 rules on).
    fn testnet4() -> Self {
        ChainParams {
            network: Network::Testnet4,
            pow: bitcoin::params::Params::new(Network::Testnet4),
            bip34_height: 1,
            bip65_height: 1,
            bip66_height: 1,
            csv_height: 1,
            segwit_height: 1,
            coinbase_maturity: COINBASE_MATURITY,
            subsidy_halving_interval: 210_000,
            enforce_bip94: true,
            p2p_port: 48333,
            http_port: 3004,
            rpc_port: 48332,
            dns_seeds: &[
                "seed.testnet4.bitcoin.sprovoost.nl",
                "seed.testnet4.wiz.biz",
            ],
            minimum_chain_work: hex32(
                "0000000000000000000000000000000000000000000009a0fe15d0177d086304",
            ),
            // Height 123,613.
            default_assume_valid: Some(
                "0000000002368b1e4ee27e2e85676ae6f9f9e69579b29093e9a82c170bf7cf8a",
            ),
            archive_epoch_length: 2016,
            bip30_exceptions: &[],
            script_flag_exceptions: &[],
        }
    }

    /// The parameters of the default signet (Core's `SigNetParams`).
    fn signet() -> Self {
        ChainParams {
            network: Network::Signet,
            pow: bitcoin::params::Params::new(Network::Signet),
            bip34_height: 1,
            bip65_height: 1,
            bip66_height: 1,
            csv_height: 1,
            segwit_height: 1,
            coinbase_maturity: COINBASE_MATURITY,
            subsidy_halving_interval: 210_000,
            enforce_bip94: false,
            p2p_port: 38333,
            http_port: 3003,
            rpc_port: 38332,
            dns_seeds: &[
                "seed.signet.bitcoin.sprovoost.nl",
                "seed.signet.achownodes.xyz",
            ],
            minimum_chain_work: hex32(
                "00000000000000000000000000000000000000000000000000000b463ea0a4b8",
            ),
            // Height 293,175.
            default_assume_valid: Some(
                "00000008414aab61092ef93f1aacc54cf9e9f16af29ddad493b908a01ff5c329",
            ),
            archive_epoch_length: 2016,
            bip30_exceptions: &[],
            script_flag_exceptions: &[],
        }
    }

    /// The parameters of regtest (Core's `CRegTestParams`), and any future network rust-bitcoin adds, treated as regtest-like until given real parameters.
    fn regtest() -> Self {
        ChainParams {
            network: Network::Regtest,
            pow: bitcoin::params::Params::new(Network::Regtest),
            bip34_height: 1,
            bip65_height: 1,
            bip66_height: 1,
            csv_height: 1,
            segwit_height: 0,
            coinbase_maturity: COINBASE_MATURITY,
            subsidy_halving_interval: 150,
            enforce_bip94: false,
            p2p_port: 18444,
            http_port: 3002,
            rpc_port: 18443,
            dns_seeds: &[],
            minimum_chain_work: [0u8; 32],
            default_assume_valid: None,
            archive_epoch_length: 144,
            bip30_exceptions: &[],
            script_flag_exceptions: &[],
        }
    }

    /// The network's magic bytes, as they appear on the wire and in blk files.
    pub fn magic(&self) -> [u8; 4] {
        self.network.magic().to_bytes()
    }

    /// The genesis block.
    pub fn genesis_block(&self) -> bitcoin::Block {
        bitcoin::blockdata::constants::genesis_block(self.network)
    }

    /// The genesis block's header.
    pub fn genesis_header(&self) -> Header {
        self.genesis_block().header
    }

    /// The genesis block's hash.
    pub fn genesis_hash(&self) -> BlockHash {
        self.genesis_header().block_hash()
    }

    /// Block subsidy in sats at `height` (50 BTC halved every
    /// `subsidy_halving_interval` blocks; Core's `GetBlockSubsidy`).
    pub fn block_subsidy(&self, height: u32) -> u64 {
        let halvings = height / self.subsidy_halving_interval;
        if halvings >= 64 {
            return 0;
        }
        (50 * 100_000_000u64) >> halvings
    }

    /// The script flags (Core's `SCRIPT_VERIFY_*` bits) block `hash` is
    /// verified under instead of the usual ones, if it is one of
    /// [`ChainParams::script_flag_exceptions`].
    pub fn script_flag_exception(&self, hash: &BlockHash) -> Option<u32> {
        let shown = hash.to_string();
        self.script_flag_exceptions
            .iter()
            .find(|(h, _)| *h == shown)
            .map(|(_, bits)| *bits)
    }

    /// Whether `hash` at `height` is one of BIP30's two exceptions.
    pub fn is_bip30_exception(&self, height: u32, hash: &BlockHash) -> bool {
        let shown = hash.to_string();
        self.bip30_exceptions
            .iter()
            .any(|(h, s)| *h == height && *s == shown)
    }

    /// The name kakehi uses for the network on the CLI and in paths
    /// (`bitcoin`, `testnet`, `testnet4`, `signet`, `regtest`).
    pub fn name(&self) -> &'static str {
        match self.network {
            Network::Bitcoin => "bitcoin",
            Network::Testnet => "testnet",
            Network::Testnet4 => "testnet4",
            Network::Signet => "signet",
            _ => "regtest",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regtest_genesis_and_subsidy() {
        let p = ChainParams::new(Network::Regtest);
        assert_eq!(
            p.genesis_hash().to_string(),
            "0f9188f13cb7b2c71f2a335e3a4fc328bf5beb436012afca590b1a11466e2206"
        );
        assert_eq!(p.magic(), [0xfa, 0xbf, 0xb5, 0xda]);
        assert_eq!(p.block_subsidy(149), 50 * 100_000_000);
        assert_eq!(p.block_subsidy(150), 25 * 100_000_000);
        assert_eq!(p.block_subsidy(150 * 64), 0);
    }

    #[test]
    fn mainnet_bip30_exceptions() {
        let p = ChainParams::new(Network::Bitcoin);
        let h: BlockHash = "00000000000a4d0a398161ffc163c503763b1f4360639393e0e4c8e300e0caec"
            .parse()
            .unwrap();
        assert!(p.is_bip30_exception(91_842, &h));
        assert!(!p.is_bip30_exception(91_843, &h));
    }

    #[test]
    fn every_network_has_parameters() {
        for n in [
            Network::Bitcoin,
            Network::Testnet,
            Network::Testnet4,
            Network::Signet,
            Network::Regtest,
        ] {
            let p = ChainParams::new(n);
            assert_eq!(p.genesis_block().block_hash(), p.genesis_hash(), "{n}");
        }
        // Core 31.99's nMinimumChainWork for mainnet (kernel/chainparams.cpp),
        // big-endian: 0x01128750f82f4c366153a3a030.
        let p = ChainParams::new(Network::Bitcoin);
        assert_eq!(
            &p.minimum_chain_work[19..],
            &[0x01, 0x12, 0x87, 0x50, 0xf8, 0x2f, 0x4c, 0x36, 0x61, 0x53, 0xa3, 0xa0, 0x30]
        );
        assert_eq!(p.minimum_chain_work[..19], [0u8; 19]);
    }
}
