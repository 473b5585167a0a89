//! assumevalid: when the scripts of a block may be skipped, by Bitcoin
//! Core's rule (`Chainstate::ConnectBlock`, `src/validation.cpp`, Core
//! 31.99; unchanged since Core 0.14 but for the reasons' wording).
//!
//! A block's scripts are skipped only when all of these hold:
//! 1. an assumevalid block hash is set (`--assumevalid=HASH`; `0` turns the
//!    rule off, and regtest has no default);
//! 2. that hash is in the header index;
//! 3. the block is an ancestor of it (or it);
//! 4. the block is an ancestor of the best header (Core's `m_best_header`);
//! 5. the best header has at least the network's minimum chainwork;
//! 6. the best header is more than two weeks of proof-equivalent time past
//!    the block (`GetBlockProofEquivalentTime`: the chainwork between them,
//!    at the best header's difficulty, in seconds of target spacing).
//!
//! Everything else (proof of work, merkle roots, every economic rule) is
//! still checked for every block. [`ScriptCheck`] gives Core's reason for
//! checking, which the pipeline logs when it changes, as Core does.

use bitcoin::BlockHash;
use crypto_bigint::{NonZero, U256};

use super::index::{ChainIndex, IndexEntry};
use crate::primitives::BlockId;

/// Two weeks in seconds (Core's `TWO_WEEKS_IN_SECONDS`).
pub const TWO_WEEKS: i64 = 60 * 60 * 24 * 7 * 2;

/// The assumevalid setting (Core's `-assumevalid`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AssumeValid {
    /// Verify every script (`0`).
    Off,
    /// Skip the scripts of this block's ancestors under Core's conditions.
    Block(BlockHash),
}

impl AssumeValid {
    /// The network's default (Core's `defaultAssumeValid`,
    /// [`crate::chain::ChainParams::default_assume_valid`]): none on regtest.
    pub fn default_for(params: &super::ChainParams) -> Self {
        params
            .default_assume_valid
            .and_then(|h| h.parse().ok())
            .map_or(AssumeValid::Off, AssumeValid::Block)
    }

    /// The block hash, if the rule is on.
    pub fn hash(self) -> Option<BlockHash> {
        match self {
            AssumeValid::Off => None,
            AssumeValid::Block(h) => Some(h),
        }
    }
}

/// `0`, or the block hash in hex (display order, as the RPC prints it).
impl std::fmt::Display for AssumeValid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AssumeValid::Off => f.write_str("0"),
            AssumeValid::Block(h) => write!(f, "{h}"),
        }
    }
}

/// A bad `--assumevalid` value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad assumevalid {value:?}: expected 0 or a block hash of 64 hex characters")]
pub struct AssumeValidParseError {
    /// The value given.
    pub value: String,
}

/// Parses `0` (off) or a block hash (64 hex characters, display order).
impl std::str::FromStr for AssumeValid {
    type Err = AssumeValidParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s == "0" {
            return Ok(AssumeValid::Off);
        }
        let bad = || AssumeValidParseError {
            value: s.to_string(),
        };
        if s.len() != 64 {
            return Err(bad());
        }
        s.parse().map(AssumeValid::Block).map_err(|_| bad())
    }
}

/// Whether a block's scripts are verified, and Core's reason when they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScriptCheck {
    /// Verify them; the reason is Core's `script_check_reason`.
    Verify(&'static str),
    /// Skip them: the block is assumed valid.
    Skip,
}

/// Decides [`ScriptCheck`] block by block, caching what does not change
/// between blocks: the assumevalid block's ancestors (height → id, built
/// once its header is known) and, per best header, where the best header's
/// chain leaves them.
#[derive(Debug)]
pub struct AssumeValidState {
    setting: AssumeValid,
    /// `chain[h]` is the assumevalid block's ancestor at height `h`.
    chain: Vec<BlockId>,
    /// (best header, height of its last common ancestor with `chain`).
    fork: Option<(BlockId, u32)>,
}

impl AssumeValidState {
    /// The state for `setting`.
    pub fn new(setting: AssumeValid) -> Self {
        AssumeValidState {
            setting,
            chain: Vec::new(),
            fork: None,
        }
    }

    /// The setting.
    pub fn setting(&self) -> AssumeValid {
        self.setting
    }

    /// Whether the scripts of `block` (an entry of `index`) are verified.
    /// O(1) once the assumevalid block's ancestors are cached, but for the
    /// first block after the best header changes (a walk from the best
    /// header down to the assumevalid chain).
    pub fn decide(&mut self, index: &ChainIndex, block: &IndexEntry) -> ScriptCheck {
        let AssumeValid::Block(hash) = self.setting else {
            return ScriptCheck::Verify("assumevalid=0 (always verify)");
        };
        let Some(av) = index.by_hash(&hash) else {
            return ScriptCheck::Verify("assumevalid hash not in headers");
        };
        if self.chain.len() != av.height as usize + 1 {
            self.chain = ancestors(index, av);
        }
        if self.chain.get(block.height as usize) != Some(&block.id) {
            return ScriptCheck::Verify(if block.height > av.height {
                "block height above assumevalid height"
            } else {
                "block not in assumevalid chain"
            });
        }
        let best = index.best_header();
        if block.height > self.fork_height(index, best) {
            return ScriptCheck::Verify("block not in best header chain");
        }
        let minimum = U256::from_be_slice(&index.params().minimum_chain_work);
        if U256::from_be_slice(&best.chainwork.to_be_bytes()) < minimum {
            return ScriptCheck::Verify("best header chainwork below minimumchainwork");
        }
        let spacing = index.params().pow.pow_target_spacing;
        if proof_equivalent_time(best, block, best, spacing) <= TWO_WEEKS {
            return ScriptCheck::Verify("block too recent relative to best header");
        }
        ScriptCheck::Skip
    }

    /// Height of the last block the best header's chain shares with the
    /// assumevalid chain.
    fn fork_height(&mut self, index: &ChainIndex, best: &IndexEntry) -> u32 {
        if let Some((id, h)) = self.fork {
            if id == best.id {
                return h;
            }
        }
        let mut cur = Some(best);
        let mut height = 0;
        while let Some(e) = cur {
            if self.chain.get(e.height as usize) == Some(&e.id) {
                height = e.height;
                break;
            }
            cur = e.prev.and_then(|p| index.get(p));
        }
        self.fork = Some((best.id, height));
        height
    }
}

/// The ids of `tip` and its ancestors by height (`[0]` is genesis).
fn ancestors(index: &ChainIndex, tip: &IndexEntry) -> Vec<BlockId> {
    let mut chain = vec![BlockId(0); tip.height as usize + 1];
    let mut cur = Some(tip);
    while let Some(e) = cur {
        if let Some(slot) = chain.get_mut(e.height as usize) {
            *slot = e.id;
        }
        cur = e.prev.and_then(|p| index.get(p));
    }
    chain
}

/// Core's `GetBlockProofEquivalentTime(to, from, tip)`: the chainwork from
/// `from` to `to` expressed in seconds at `tip`'s difficulty (`spacing`
/// seconds per block of `tip`'s proof), negative when `from` has more work,
/// saturated at ±`i64::MAX`.
pub fn proof_equivalent_time(
    to: &IndexEntry,
    from: &IndexEntry,
    tip: &IndexEntry,
    spacing: u64,
) -> i64 {
    let to_work = U256::from_be_slice(&to.chainwork.to_be_bytes());
    let from_work = U256::from_be_slice(&from.chainwork.to_be_bytes());
    let (r, sign) = if to_work > from_work {
        (to_work.wrapping_sub(&from_work), 1)
    } else {
        (from_work.wrapping_sub(&to_work), -1)
    };
    let proof = U256::from_be_slice(&tip.header.work().to_be_bytes());
    let Some(proof) = NonZero::new(proof).into_option() else {
        return sign * i64::MAX;
    };
    let Some(scaled) = r.checked_mul(&U256::from_u64(spacing)).into_option() else {
        return sign * i64::MAX;
    };
    let seconds = scaled.wrapping_div(&proof);
    if seconds.bit_width() > 63 {
        return sign * i64::MAX;
    }
    let bytes = seconds.to_be_bytes();
    let mut low = [0u8; 8];
    low.copy_from_slice(&bytes.as_ref()[24..32]);
    sign * i64::try_from(u64::from_be_bytes(low)).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::index::BlockIndex;
    use crate::chain::ChainParams;
    use bitcoin::block::{Header, Version};
    use bitcoin::hashes::Hash;
    use bitcoin::{CompactTarget, Network, TxMerkleNode};

    /// `count` regtest headers on `from`, their merkle roots tagged `tag`
    /// so that branches differ; returns their ids.
    fn grow(index: &mut BlockIndex, from: BlockId, count: u32, tag: u8) -> Vec<BlockId> {
        let mut prev = index.get(from).expect("from").clone();
        let mut ids = Vec::new();
        for _ in 0..count {
            let mut header = Header {
                version: Version::from_consensus(0x2000_0000),
                prev_blockhash: prev.hash,
                merkle_root: TxMerkleNode::from_byte_array([tag; 32]),
                time: prev.header.time + 600,
                bits: CompactTarget::from_consensus(0x207f_ffff),
                nonce: 0,
            };
            while header.validate_pow(header.target()).is_err() {
                header.nonce += 1;
            }
            let id = index
                .accept_header(&header, u64::MAX / 2)
                .expect("valid header");
            prev = index.get(id).expect("added").clone();
            ids.push(id);
        }
        ids
    }

    fn decide(setting: AssumeValid, index: &BlockIndex, id: BlockId) -> ScriptCheck {
        let block = index.get(id).expect("block").clone();
        AssumeValidState::new(setting).decide(index.core(), &block)
    }

    #[test]
    fn cores_conditions_one_by_one() {
        let mut index = BlockIndex::new(ChainParams::new(Network::Regtest));
        let main = grow(&mut index, BlockId(0), 3_000, 1);
        let av = AssumeValid::Block(index.get(main[2_499]).expect("av").hash);
        // Height 100: 2,900 blocks (1,740,000 s) below the best header.
        assert_eq!(decide(av, &index, main[99]), ScriptCheck::Skip);
        assert_eq!(
            decide(AssumeValid::Off, &index, main[99]),
            ScriptCheck::Verify("assumevalid=0 (always verify)")
        );
        let unknown = AssumeValid::Block(BlockHash::from_byte_array([9; 32]));
        assert_eq!(
            decide(unknown, &index, main[99]),
            ScriptCheck::Verify("assumevalid hash not in headers")
        );
        assert_eq!(
            decide(av, &index, main[2_500]),
            ScriptCheck::Verify("block height above assumevalid height")
        );
        let side = grow(&mut index, main[49], 10, 2);
        assert_eq!(
            decide(av, &index, side[0]),
            ScriptCheck::Verify("block not in assumevalid chain")
        );
        // 2,016 blocks (two weeks exactly) below the best header (height
        // 3,000): checked; 2,017 below: skipped. main[i] is at height i + 1.
        assert_eq!(
            decide(av, &index, main[3_000 - 2_016 - 1]),
            ScriptCheck::Verify("block too recent relative to best header")
        );
        assert_eq!(
            decide(av, &index, main[3_000 - 2_017 - 1]),
            ScriptCheck::Skip
        );
        // A header chain with more work forking at height 200 becomes the
        // best header: height 300 of the assumevalid chain is not on it.
        let fork = grow(&mut index, main[199], 2_900, 3);
        assert_eq!(index.best_header().id, *fork.last().expect("fork"));
        assert_eq!(
            decide(av, &index, main[299]),
            ScriptCheck::Verify("block not in best header chain")
        );
        assert_eq!(decide(av, &index, main[99]), ScriptCheck::Skip);
    }

    #[test]
    fn minimum_chainwork_of_the_best_header() {
        let mut params = ChainParams::new(Network::Regtest);
        params.minimum_chain_work[0] = 1;
        let mut index = BlockIndex::new(params);
        let main = grow(&mut index, BlockId(0), 2_200, 1);
        let av = AssumeValid::Block(index.get(main[99]).expect("av").hash);
        assert_eq!(
            decide(av, &index, main[9]),
            ScriptCheck::Verify("best header chainwork below minimumchainwork")
        );
    }

    #[test]
    fn proof_equivalent_time_is_cores() {
        let mut index = BlockIndex::new(ChainParams::new(Network::Regtest));
        let main = grow(&mut index, BlockId(0), 10, 1);
        let e = |i: usize| index.get(main[i]).expect("entry").clone();
        assert_eq!(proof_equivalent_time(&e(9), &e(0), &e(9), 600), 9 * 600);
        assert_eq!(proof_equivalent_time(&e(0), &e(9), &e(9), 600), -9 * 600);
    }

    #[test]
    fn settings_parse_and_print() {
        assert_eq!("0".parse::<AssumeValid>(), Ok(AssumeValid::Off));
        let h = "00000008414aab61092ef93f1aacc54cf9e9f16af29ddad493b908a01ff5c329";
        let av: AssumeValid = h.parse().expect("hash");
        assert_eq!(av.to_string(), h);
        for bad in ["", "1", "00", &h[1..], "zz", &format!("{h}0")] {
            assert!(bad.parse::<AssumeValid>().is_err(), "{bad:?}");
        }
        let signet = ChainParams::new(Network::Signet);
        assert_eq!(AssumeValid::default_for(&signet), av);
        let regtest = ChainParams::new(Network::Regtest);
        assert_eq!(AssumeValid::default_for(&regtest), AssumeValid::Off);
    }
}
