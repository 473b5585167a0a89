//! Block validation: the context-free and contextual block checks
//! ([`check_block`]), the economic checks against the coins the block
//! spends ([`connect_block`]), and, in [`script`], every input's scripts by
//! Bitcoin Core's own interpreter.
//!
//! Both are pure functions: they read the block, a [`BlockContext`] (height,
//! median-time-past, network parameters) and, for [`connect_block`], a map
//! of coins; they never touch a store. The pipeline reads the coins from the
//! Sozu table under the block's own chain view, calls [`check_block`] then
//! [`connect_block`] (the first gate: a block that fails it runs no
//! script), then [`script::verify_block_scripts`] with the spent outputs
//! [`connect_block`] returned, and writes the returned [`BlockEffects`].
//!
//! # Scope
//!
//! Checked: every consensus rule of Bitcoin Core's `CheckBlock`,
//! `ContextualCheckBlock` and `ConnectBlock` that does not need the header
//! chain or script evaluation — merkle root and its CVE-2012-2459 mutation,
//! block size and weight, coinbase shape and BIP34 height, transaction
//! structure (`CheckTransaction`, including CVE-2018-17144 duplicate inputs),
//! transaction finality (BIP113), the witness commitment (BIP141), BIP30,
//! input existence and unspentness on the branch, values and sums within
//! `MAX_MONEY`, coinbase maturity, coinbase ≤ subsidy + fees, BIP68 relative
//! lock-times and the 80,000 sigop-cost limit.
//!
//! Scripts and signatures are [`script`]'s (Core's interpreter); a block
//! whose only defect is a bad signature (regtest-a's `16-bad-signature.blk`)
//! passes these two functions and fails there. Header rules (proof of work,
//! difficulty, timestamps, version) belong to the chain index.
//!
//! The order of the checks follows Core, so the first failure reported is
//! the one Core reports; [`BlockError::reject_reason`] gives Core's reject
//! string.
//!
//! # Differences from Bitcoin Core
//!
//! - No signet block-solution check (Core's `CheckSignetBlockSolution`).
//! - BIP30 looks only at the candidates the caller puts in `coins`
//!   ([`bip30_check_needed`] says when Core looks at all).
//! - Coin heights come from the caller (the Sozu payload's creation height
//!   on the block's branch); maturity and BIP68 trust them.
//!
//! Evidence: `tests/it/validation_regtest.rs` replays all 1,529 blocks of
//! regtest-a (bcoin) without a false rejection, ends on bcoin's exact UTXO
//! set and filters, and rejects its 19 invalid blocks with bcoin's reasons.
//!
//! Source: Bitcoin Core `src/validation.cpp` (`CheckBlock`,
//! `ContextualCheckBlock`, `ConnectBlock`), `src/consensus/tx_check.cpp`,
//! `src/consensus/tx_verify.cpp`; BIPs 30, 34, 68, 113, 141.

mod check;
mod connect;
pub mod merkle;
pub mod script;
pub mod sigops;

pub use check::{check_block, check_transaction};
pub use connect::{check_sequence_locks, check_tx_inputs, connect_block};

use std::collections::HashSet;
use std::fmt;

use bitcoin::{Block, BlockHash, Network, OutPoint, Transaction, TxMerkleNode, Txid};

use crate::chain::params::{ChainParams, MAX_BLOCK_SIGOPS_COST, MAX_BLOCK_WEIGHT, MAX_MONEY};
use crate::primitives::Coin;

/// Largest scriptPubKey that can be spent, in bytes (Core's
/// `MAX_SCRIPT_SIZE`); larger outputs never enter the UTXO set.
pub const MAX_SCRIPT_SIZE: usize = 10_000;

/// nLockTime values below this are block heights, others UNIX times in
/// seconds (Core's `LOCKTIME_THRESHOLD`).
pub const LOCKTIME_THRESHOLD: u32 = 500_000_000;

/// BIP68: a sequence with this bit set has no relative lock.
const SEQUENCE_LOCKTIME_DISABLE_FLAG: u32 = 1 << 31;
/// BIP68: with this bit set the lock is in units of 512 seconds, else blocks.
const SEQUENCE_LOCKTIME_TYPE_FLAG: u32 = 1 << 22;
/// BIP68: the lock value is the low 16 bits.
const SEQUENCE_LOCKTIME_MASK: u32 = 0x0000_ffff;
/// BIP68: time locks are in units of 2^9 = 512 seconds.
const SEQUENCE_LOCKTIME_GRANULARITY: u32 = 9;

/// The first 6 bytes of a witness commitment output: `OP_RETURN`, push 36,
/// then the tag `aa21a9ed` (BIP141).
const WITNESS_COMMITMENT_HEADER: [u8; 6] = [0x6a, 0x24, 0xaa, 0x21, 0xa9, 0xed];

/// What the checks need to know about the block's place in its chain.
pub struct BlockContext<'a> {
    /// The network's parameters (activation heights, subsidy, BIP30
    /// exceptions).
    pub params: &'a ChainParams,
    /// Height of the block being checked (≥ 1: genesis is never checked).
    pub height: u32,
    /// The block's hash (BIP30 exceptions are named by hash).
    pub block_hash: BlockHash,
    /// Median-time-past of the parent block, in seconds since the UNIX
    /// epoch (BIP113): the median of the timestamps of the parent and its
    /// up to 10 ancestors.
    pub prev_median_time_past: u32,
    /// Median-time-past of the block at height `h` on this block's branch,
    /// for `h < height`, in seconds; `None` if unknown. Used for BIP68
    /// time-based relative locks, which measure from the MTP of the block
    /// *before* the coin's block (Core's `CalculateSequenceLocks`). Never
    /// called for `h == height - 1` (that is `prev_median_time_past`).
    pub median_time_past_at: &'a dyn Fn(u32) -> Option<u32>,
}

impl fmt::Debug for BlockContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockContext")
            .field("network", &self.params.network)
            .field("height", &self.height)
            .field("block_hash", &self.block_hash)
            .field("prev_median_time_past", &self.prev_median_time_past)
            .finish_non_exhaustive()
    }
}

/// What connecting a valid block does to the UTXO set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockEffects {
    /// Every spendable output the block creates (no `OP_RETURN` and no
    /// scripts over [`MAX_SCRIPT_SIZE`] bytes), in block order, coinbase
    /// first, with `height` = the block's height. Outputs spent later in
    /// the same block are included (they also appear in `spent`).
    pub created: Vec<(OutPoint, Coin)>,
    /// Every output the block spends, in block order (transaction, then
    /// input), same-block spends included; the coinbase spends nothing.
    pub spent: Vec<SpentOutput>,
    /// Sum of the fees of the block's transactions, in sats.
    pub fees: u64,
    /// The block's sigop cost (BIP141 units; at most 80,000).
    pub sigop_cost: u64,
}

/// One output spent by the block, with the spending input (the
/// spending data of Teranode's UTXO model).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpentOutput {
    /// The spent outpoint.
    pub outpoint: OutPoint,
    /// The coin it held (value, script, creation height, coinbase flag).
    pub coin: Coin,
    /// The spending transaction.
    pub txid: Txid,
    /// The index of the spending input in that transaction.
    pub vin: u32,
}

/// Why a block is invalid (or, for [`BlockError::MissingMedianTimePast`],
/// why it could not be checked).
///
/// [`BlockError::reject_reason`] gives Bitcoin Core's reject string;
/// [`BlockError::is_mutation`] says whether the block's *content* is bad
/// while its header may still be valid; [`BlockError::is_consensus_failure`]
/// says whether the block is invalid at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BlockError {
    /// The header's merkle root is not the root of the transactions
    /// (`bad-txnmrklroot`).
    #[error("merkle root mismatch: header has {header}, transactions give {computed}")]
    BadMerkleRoot {
        /// The root in the header.
        header: TxMerkleNode,
        /// The root of the transaction list.
        computed: TxMerkleNode,
    },
    /// The transaction list repeats transactions so that its merkle root
    /// equals that of a shorter list (CVE-2012-2459; `bad-txns-duplicate`).
    #[error("merkle tree mutated by duplicate transactions (CVE-2012-2459)")]
    MutatedMerkleTree,
    /// No transactions, or too many bytes even without witnesses
    /// (`bad-blk-length`).
    #[error("bad block length: {tx_count} transactions, {stripped_size} bytes without witness")]
    BadLength {
        /// Number of transactions.
        tx_count: usize,
        /// Serialized size without witness data, in bytes.
        stripped_size: usize,
    },
    /// The first transaction is not a coinbase (`bad-cb-missing`).
    #[error("first transaction is not a coinbase")]
    CoinbaseMissing,
    /// A transaction other than the first is a coinbase (`bad-cb-multiple`).
    #[error("transaction {index} ({txid}) is a second coinbase")]
    MultipleCoinbases {
        /// Position in the block.
        index: usize,
        /// Its txid.
        txid: Txid,
    },
    /// A transaction has no inputs (`bad-txns-vin-empty`).
    #[error("transaction {txid} has no inputs")]
    NoInputs {
        /// The transaction.
        txid: Txid,
    },
    /// A transaction has no outputs (`bad-txns-vout-empty`).
    #[error("transaction {txid} has no outputs")]
    NoOutputs {
        /// The transaction.
        txid: Txid,
    },
    /// A transaction is larger than a block can be (`bad-txns-oversize`).
    #[error("transaction {txid} is {stripped_size} bytes without witness, over the block limit")]
    TransactionOversize {
        /// The transaction.
        txid: Txid,
        /// Its size without witness, in bytes.
        stripped_size: usize,
    },
    /// An output value is negative as a signed 64-bit integer
    /// (`bad-txns-vout-negative`). A serialized `-1` decodes as
    /// `0xffff_ffff_ffff_ffff`.
    #[error("output {txid}:{vout} has negative value {value} sat")]
    NegativeOutput {
        /// The transaction.
        txid: Txid,
        /// The output index.
        vout: u32,
        /// The value as Core reads it (signed), in sats.
        value: i64,
    },
    /// An output value exceeds 21 million BTC (`bad-txns-vout-toolarge`).
    #[error("output {txid}:{vout} has value {value} sat, above MAX_MONEY")]
    OutputTooLarge {
        /// The transaction.
        txid: Txid,
        /// The output index.
        vout: u32,
        /// The value, in sats.
        value: u64,
    },
    /// A transaction's outputs sum above 21 million BTC
    /// (`bad-txns-txouttotal-toolarge`).
    #[error("outputs of {txid} sum above MAX_MONEY")]
    OutputTotalTooLarge {
        /// The transaction.
        txid: Txid,
    },
    /// A transaction spends the same outpoint twice (CVE-2018-17144;
    /// `bad-txns-inputs-duplicate`).
    #[error("transaction {txid} spends {outpoint} twice")]
    DuplicateInput {
        /// The transaction.
        txid: Txid,
        /// The repeated outpoint.
        outpoint: OutPoint,
    },
    /// The coinbase scriptSig is not 2..=100 bytes (`bad-cb-length`).
    #[error("coinbase scriptSig is {length} bytes, not 2..=100")]
    CoinbaseLength {
        /// Its length in bytes.
        length: usize,
    },
    /// A non-coinbase input has the null prevout (`bad-txns-prevout-null`).
    #[error("input {vin} of {txid} has a null prevout")]
    NullPrevout {
        /// The transaction.
        txid: Txid,
        /// The input index.
        vin: u32,
    },
    /// The block's sigop cost exceeds 80,000 (`bad-blk-sigops`); `cost` is
    /// the cost counted so far (legacy sigops × 4 when raised by
    /// [`check_block`]).
    #[error("sigop cost {cost} exceeds 80,000")]
    TooManySigops {
        /// The cost when the limit was crossed.
        cost: u64,
    },
    /// A transaction's nLockTime is not yet reached (`bad-txns-nonfinal`).
    #[error("transaction {txid} is not final: nLockTime {lock_time}")]
    NonFinal {
        /// The transaction.
        txid: Txid,
        /// Its nLockTime (height if < 500,000,000, else seconds).
        lock_time: u32,
    },
    /// The coinbase scriptSig does not start with the block height (BIP34;
    /// `bad-cb-height`).
    #[error("coinbase does not start with the BIP34 height push for {height}")]
    CoinbaseHeight {
        /// The block's height.
        height: u32,
    },
    /// The coinbase witness is not exactly one 32-byte item while the block
    /// commits to witnesses (`bad-witness-nonce-size`).
    #[error("coinbase witness must be one 32-byte reserved value, has {items} items")]
    WitnessNonceSize {
        /// Number of items in the coinbase input's witness.
        items: usize,
    },
    /// The witness commitment does not match the witnesses
    /// (`bad-witness-merkle-match`).
    #[error("witness commitment does not match the transactions' witnesses")]
    WitnessMerkleMatch,
    /// A transaction carries witness data but the block has no witness
    /// commitment (or segwit is not active) (`unexpected-witness`).
    #[error("transaction {txid} has a witness but the block commits to none")]
    UnexpectedWitness {
        /// The transaction.
        txid: Txid,
    },
    /// The block weight exceeds 4,000,000 (`bad-blk-weight`).
    #[error("block weight {weight} exceeds 4,000,000")]
    Weight {
        /// The weight in weight units.
        weight: u64,
    },
    /// An output of the block already exists unspent (BIP30;
    /// `bad-txns-BIP30`).
    #[error("output {outpoint} already exists unspent (BIP30)")]
    Bip30 {
        /// The existing outpoint.
        outpoint: OutPoint,
    },
    /// An input's coin does not exist or is already spent on this branch,
    /// including by an earlier transaction of the same block
    /// (`bad-txns-inputs-missingorspent`).
    #[error("input {vin} of {txid} spends {outpoint}, missing or spent")]
    MissingOrSpent {
        /// The spending transaction.
        txid: Txid,
        /// The input index.
        vin: u32,
        /// The outpoint.
        outpoint: OutPoint,
    },
    /// A coinbase output is spent before 100 confirmations
    /// (`bad-txns-premature-spend-of-coinbase`).
    #[error(
        "{txid} spends coinbase output {outpoint} of height {coin_height} at height {spend_height}"
    )]
    PrematureCoinbaseSpend {
        /// The spending transaction.
        txid: Txid,
        /// The coinbase output.
        outpoint: OutPoint,
        /// Height of the coinbase.
        coin_height: u32,
        /// Height of the spending block.
        spend_height: u32,
    },
    /// A spent coin's value, or the sum of a transaction's inputs, is out
    /// of 0..=MAX_MONEY (`bad-txns-inputvalues-outofrange`).
    #[error("input values of {txid} out of range")]
    InputValuesOutOfRange {
        /// The transaction.
        txid: Txid,
    },
    /// A transaction's outputs exceed its inputs (`bad-txns-in-belowout`).
    #[error("{txid} spends {value_in} sat but creates {value_out} sat")]
    InBelowOut {
        /// The transaction.
        txid: Txid,
        /// Sum of its inputs, in sats.
        value_in: u64,
        /// Sum of its outputs, in sats.
        value_out: u64,
    },
    /// The block's fees sum above MAX_MONEY
    /// (`bad-txns-accumulated-fee-outofrange`).
    #[error("accumulated fees out of range at {txid}")]
    AccumulatedFeeOutOfRange {
        /// The transaction whose fee crossed the limit.
        txid: Txid,
    },
    /// A BIP68 relative lock-time is not yet satisfied (`bad-txns-nonfinal`).
    /// `min_height` / `min_time` are Core's lock pair: the block must be
    /// above `min_height` and its parent's MTP above `min_time` (-1 = none).
    #[error("{txid} is relative-locked: needs height > {min_height} and parent MTP > {min_time}")]
    SequenceLocked {
        /// The transaction.
        txid: Txid,
        /// Last height at which it is still locked (-1: no height lock).
        min_height: i64,
        /// Last MTP (seconds) at which it is still locked (-1: no time lock).
        min_time: i64,
    },
    /// The coinbase claims more than subsidy + fees (`bad-cb-amount`).
    #[error("coinbase pays {value_out} sat, limit is {limit} sat (subsidy + fees)")]
    CoinbaseAmount {
        /// Sum of the coinbase outputs, in sats.
        value_out: u64,
        /// Subsidy + fees, in sats.
        limit: u64,
    },
    /// The caller's [`BlockContext::median_time_past_at`] had no MTP for a
    /// height a BIP68 time lock needs. Not a consensus failure: a bug in
    /// the caller; the block must not be marked invalid.
    #[error("median-time-past of height {height} unavailable")]
    MissingMedianTimePast {
        /// The height asked for.
        height: u32,
    },
}

impl BlockError {
    /// Bitcoin Core's reject reason for this failure (`bad-txns-...`),
    /// as `getblocktemplate`/`submitblock` and the debug log show it.
    /// [`BlockError::MissingMedianTimePast`] has no Core equivalent and
    /// returns `kakehi-missing-median-time-past`.
    pub fn reject_reason(&self) -> &'static str {
        use BlockError::*;
        match self {
            BadMerkleRoot { .. } => "bad-txnmrklroot",
            MutatedMerkleTree => "bad-txns-duplicate",
            BadLength { .. } => "bad-blk-length",
            CoinbaseMissing => "bad-cb-missing",
            MultipleCoinbases { .. } => "bad-cb-multiple",
            NoInputs { .. } => "bad-txns-vin-empty",
            NoOutputs { .. } => "bad-txns-vout-empty",
            TransactionOversize { .. } => "bad-txns-oversize",
            NegativeOutput { .. } => "bad-txns-vout-negative",
            OutputTooLarge { .. } => "bad-txns-vout-toolarge",
            OutputTotalTooLarge { .. } => "bad-txns-txouttotal-toolarge",
            DuplicateInput { .. } => "bad-txns-inputs-duplicate",
            CoinbaseLength { .. } => "bad-cb-length",
            NullPrevout { .. } => "bad-txns-prevout-null",
            TooManySigops { .. } => "bad-blk-sigops",
            NonFinal { .. } => "bad-txns-nonfinal",
            CoinbaseHeight { .. } => "bad-cb-height",
            WitnessNonceSize { .. } => "bad-witness-nonce-size",
            WitnessMerkleMatch => "bad-witness-merkle-match",
            UnexpectedWitness { .. } => "unexpected-witness",
            Weight { .. } => "bad-blk-weight",
            Bip30 { .. } => "bad-txns-BIP30",
            MissingOrSpent { .. } => "bad-txns-inputs-missingorspent",
            PrematureCoinbaseSpend { .. } => "bad-txns-premature-spend-of-coinbase",
            InputValuesOutOfRange { .. } => "bad-txns-inputvalues-outofrange",
            InBelowOut { .. } => "bad-txns-in-belowout",
            AccumulatedFeeOutOfRange { .. } => "bad-txns-accumulated-fee-outofrange",
            SequenceLocked { .. } => "bad-txns-nonfinal",
            CoinbaseAmount { .. } => "bad-cb-amount",
            MissingMedianTimePast { .. } => "kakehi-missing-median-time-past",
        }
    }

    /// Whether the failure shows that these *bytes* do not match their
    /// header (Core's `BLOCK_MUTATED`: merkle root, CVE-2012-2459 mutation,
    /// witness commitment, unexpected witness). The header itself may still
    /// belong to a valid block: drop the bytes (and maybe the peer that
    /// sent them), do not mark the block hash invalid.
    pub fn is_mutation(&self) -> bool {
        use BlockError::*;
        matches!(
            self,
            BadMerkleRoot { .. }
                | MutatedMerkleTree
                | WitnessNonceSize { .. }
                | WitnessMerkleMatch
                | UnexpectedWitness { .. }
        )
    }

    /// Whether the block breaks a consensus rule (everything except
    /// [`BlockError::MissingMedianTimePast`], which is the caller's bug).
    pub fn is_consensus_failure(&self) -> bool {
        !matches!(self, BlockError::MissingMedianTimePast { .. })
    }
}

/// The outpoints the pipeline must read for `block` (item (a) of
/// [`connect_block`]'s `coins`): every outpoint a non-coinbase input spends
/// that is not an output of an *earlier* transaction of the same block,
/// each once, in block order.
pub fn spent_outpoints(block: &Block) -> Vec<OutPoint> {
    let mut earlier: HashSet<Txid> = HashSet::with_capacity(block.txdata.len());
    let mut seen: HashSet<OutPoint> = HashSet::new();
    let mut out = Vec::new();
    for tx in &block.txdata {
        if !tx.is_coinbase() {
            for input in &tx.input {
                let outpoint = input.previous_output;
                if !earlier.contains(&outpoint.txid) && seen.insert(outpoint) {
                    out.push(outpoint);
                }
            }
        }
        earlier.insert(tx.compute_txid());
    }
    out
}

/// From this height BIP34 no longer makes coinbase txids unique (an early
/// block's coinbase scriptSig can read as a valid BIP34 height push), so
/// Core checks BIP30 again (Core's `BIP34_IMPLIES_BIP30_LIMIT`).
pub const BIP34_IMPLIES_BIP30_LIMIT: u32 = 1_983_702;

/// Whether Bitcoin Core looks for BIP30 duplicates in a block at `height`
/// (`ConnectBlock`'s `fEnforceBIP30`): always, except on the networks whose
/// BIP34 activation block Core pins by hash (mainnet, testnet3) from the
/// block after BIP34 activation up to [`BIP34_IMPLIES_BIP30_LIMIT`], where
/// BIP34 makes a duplicate impossible. When this is false the pipeline need
/// not put BIP30 candidates in [`connect_block`]'s `coins`.
pub fn bip30_check_needed(params: &ChainParams, height: u32) -> bool {
    match params.network {
        Network::Bitcoin | Network::Testnet => {
            !(height > params.bip34_height && height < BIP34_IMPLIES_BIP30_LIMIT)
        }
        _ => true,
    }
}

/// Whether an output can never be spent, so never enters the UTXO set:
/// its script starts with `OP_RETURN` or is over 10,000 bytes (Core's
/// `CScript::IsUnspendable`).
pub fn is_unspendable(script_pubkey: &[u8]) -> bool {
    script_pubkey.first() == Some(&0x6a) || script_pubkey.len() > MAX_SCRIPT_SIZE
}

/// Whether `tx` is final in a block at `height` whose lock-time cutoff is
/// `cutoff_time` seconds (the parent's MTP once BIP113 is active, else the
/// block's own time): Core's `IsFinalTx`.
pub fn is_final_tx(tx: &Transaction, height: u32, cutoff_time: u32) -> bool {
    let lock_time = tx.lock_time.to_consensus_u32();
    if lock_time == 0 {
        return true;
    }
    let limit = if lock_time < LOCKTIME_THRESHOLD {
        height
    } else {
        cutoff_time
    };
    if lock_time < limit {
        return true;
    }
    tx.input.iter().all(|input| input.sequence.0 == u32::MAX)
}

#[cfg(test)]
mod tests;
