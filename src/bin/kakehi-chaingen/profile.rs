//! The chain sizes: three profiles, and the checks on flags that override
//! them.

use crate::generate::FIRST_SPEND;
use crate::manifest::Parameters;

/// A preset chain size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// About 5,000 blocks and 200,000 live UTXOs: the chain `cargo test`
    /// generates, judges with Core's engine and imports.
    Ci,
    /// 120,000 blocks, 5,000,000 live UTXOs at the tip and over 10,000,000
    /// transactions: testnet4's order of size, for `cargo bench --bench scale`.
    Testnet4,
    /// 200,000 blocks and 20,000,000 live UTXOs.
    Large,
}

impl Profile {
    /// The profile's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Ci => "ci",
            Profile::Testnet4 => "testnet4",
            Profile::Large => "large",
        }
    }

    /// The profile's sizes.
    pub fn parameters(self) -> Parameters {
        let (blocks, txs_per_block, live_utxos_target, every) = match self {
            Profile::Ci => (5_000, 24, 200_000, 400),
            Profile::Testnet4 => (120_000, 85, 5_000_000, 2_000),
            Profile::Large => (200_000, 120, 20_000_000, 2_000),
        };
        Parameters {
            blocks,
            txs_per_block,
            live_utxos_target,
            reorg_every: every,
            full_block_every: every * 2,
        }
    }
}

/// Flags that cannot go together.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProfileError {
    /// The UTXO target is beyond what the blocks and transactions can make.
    #[error(
        "--live-utxos {wanted} cannot be reached with {blocks} blocks of {txs_per_block} \
         transactions (at most {most}); raise --blocks or --txs-per-block"
    )]
    Unreachable {
        /// The target.
        wanted: u64,
        /// Blocks.
        blocks: u32,
        /// Transactions per block.
        txs_per_block: u32,
        /// The most these make.
        most: u64,
    },
}

/// Unspent outputs one transaction adds at most, on average, when every
/// block is steered towards growth (30% batch payouts of 250 outputs).
const MOST_GROWTH_PER_TX: u64 = 50;

/// Checks that `p`'s flags go together.
///
/// # Errors
/// [`ProfileError::Unreachable`] when the UTXO target cannot be reached.
pub fn check(p: &Parameters) -> Result<(), ProfileError> {
    let most = u64::from(p.blocks - FIRST_SPEND) * u64::from(p.txs_per_block) * MOST_GROWTH_PER_TX;
    if p.live_utxos_target > most {
        return Err(ProfileError::Unreachable {
            wanted: p.live_utxos_target,
            blocks: p.blocks,
            txs_per_block: p.txs_per_block,
            most,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_meet_their_promises_and_pass_their_own_checks() {
        for p in [Profile::Ci, Profile::Testnet4, Profile::Large] {
            assert_eq!(check(&p.parameters()), Ok(()), "{}", p.name());
        }
        let t = Profile::Testnet4.parameters();
        assert!(t.blocks >= 120_000 && t.live_utxos_target >= 5_000_000);
        assert!(u64::from(t.blocks - FIRST_SPEND) * u64::from(t.txs_per_block) >= 10_000_000);
        assert!(Profile::Large.parameters().live_utxos_target >= 20_000_000);
    }

    #[test]
    fn an_unreachable_target_is_refused() {
        let mut p = Profile::Ci.parameters();
        p.blocks = 300;
        p.txs_per_block = 1;
        p.live_utxos_target = 1_000_000;
        assert!(matches!(
            check(&p),
            Err(ProfileError::Unreachable { most: 9_950, .. })
        ));
    }
}
