//! Every input of a block through Core's interpreter, spread over threads.
//!
//! Like Core's `CCheckQueue` (`src/checkqueue.h`): the inputs are the unit
//! of work, taken in chunks from a shared counter by `threads` workers (the
//! caller's thread is one of them), so one large transaction is spread as
//! well as many small ones. Each transaction is decoded and its signature
//! hashes precomputed once, by the first worker that reaches one of its
//! inputs. Unlike Core, the failure reported is always the first failing
//! input in block order: a failure at position `p` stops the inputs after
//! `p`, never those before it, so the verdict and the error do not depend
//! on the thread count or on scheduling.
//!
//! [`verify_block_scripts`] starts its threads for one block;
//! [`super::pool::ScriptPool`] keeps them across blocks and runs the same
//! [`BlockChecks`].

use std::num::NonZeroUsize;
use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use bitcoin::consensus::serialize;
use bitcoin::{Block, Txid};

use super::engine::{PreparedTx, ScriptError, SpentTxOut, VerifyError};
use super::flags::ScriptFlags;
use crate::validation::SpentOutput;

/// Inputs a worker takes at once: big enough that the shared counter is no
/// contention, small enough to balance a block of a few hundred inputs.
const CHUNK: usize = 8;

/// Below this many inputs the caller's thread verifies them alone:
/// starting a thread (~20 µs) costs about what one signature does.
const MIN_PARALLEL_INPUTS: usize = 16;

/// Why a block's scripts do not verify.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BlockScriptError {
    /// An input's scripts fail (the first such input in block order).
    #[error("input {vin} of {txid}: {error}")]
    Script {
        /// The spending transaction.
        txid: Txid,
        /// The input's index in it.
        vin: u32,
        /// Core's script error.
        error: ScriptError,
    },
    /// The spent outputs do not line up with the block's inputs (a caller's
    /// bug: `spent` must be what `connect_block` returned for this block).
    #[error("spent outputs do not match the block's inputs at transaction {txid}")]
    SpentMismatch {
        /// The first transaction that does not match.
        txid: Txid,
    },
    /// The interpreter could not check a transaction (it does not decode
    /// for Core, or threw): nothing was decided.
    #[error("the script engine could not check {txid}: {source}")]
    Engine {
        /// The transaction.
        txid: Txid,
        /// The engine's error.
        #[source]
        source: VerifyError,
    },
}

impl BlockScriptError {
    /// Core's reject reason: `block-script-verify-flag-failed (<error>)`
    /// for a script failure; `None` for the other variants, which say
    /// nothing about the block.
    pub fn reject_reason(&self) -> Option<&'static str> {
        match self {
            BlockScriptError::Script { error, .. } => Some(error.block_reject_reason()),
            _ => None,
        }
    }
}

/// One non-coinbase transaction of the block: its position in the block,
/// and where its inputs start in the block's flat list of inputs.
struct TxJob {
    /// Index in the block's transactions.
    tx: usize,
    txid: Txid,
    first_input: usize,
    inputs: usize,
    prepared: OnceLock<Result<PreparedTx, VerifyError>>,
}

/// The first failure found, by position in the block's flat input list.
struct FirstFailure {
    /// Inputs after this position need not be checked (`usize::MAX`: none
    /// failed yet).
    limit: AtomicUsize,
    found: std::sync::Mutex<Option<(usize, BlockScriptError)>>,
}

impl FirstFailure {
    fn record(&self, position: usize, error: BlockScriptError) {
        self.limit.fetch_min(position, Ordering::AcqRel);
        let mut found = self
            .found
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if found.as_ref().is_none_or(|(p, _)| position < *p) {
            *found = Some((position, error));
        }
    }
}

/// Every input check of one block, shared by the threads that run them
/// ([`BlockChecks::work`]): the block (`B`: `&Block` or `Arc<Block>`), its
/// spent outputs (`S`: `&[SpentOutput]` or `Arc<[SpentOutput]>`), the flags,
/// the shared counter of inputs taken, and the first failure.
pub struct BlockChecks<B, S> {
    block: B,
    spent: S,
    flags: ScriptFlags,
    jobs: Vec<TxJob>,
    /// Input position -> job index, so a worker finds its transaction in O(1).
    owner: Vec<usize>,
    next: AtomicUsize,
    failure: FirstFailure,
}

/// Checks that own their block and spent outputs, for threads that outlive
/// the caller's borrow ([`super::pool::ScriptPool`]).
pub type OwnedBlockChecks = BlockChecks<Arc<Block>, Arc<[SpentOutput]>>;

impl<B, S> BlockChecks<B, S>
where
    B: Deref<Target = Block>,
    S: Deref<Target = [SpentOutput]>,
{
    /// The checks of every input of `block` under `flags`. `spent` is the
    /// block's spent outputs in block order, transaction by transaction,
    /// input by input, the coinbase excluded: exactly
    /// [`crate::validation::BlockEffects::spent`] for this block.
    ///
    /// # Errors
    /// [`BlockScriptError::SpentMismatch`] when `spent` does not match the
    /// block.
    pub fn new(block: B, spent: S, flags: ScriptFlags) -> Result<Self, BlockScriptError> {
        let jobs = tx_jobs(&block, &spent)?;
        let mut owner = Vec::with_capacity(spent.len());
        for (j, job) in jobs.iter().enumerate() {
            owner.extend(std::iter::repeat_n(j, job.inputs));
        }
        Ok(BlockChecks {
            block,
            spent,
            flags,
            jobs,
            owner,
            next: AtomicUsize::new(0),
            failure: FirstFailure {
                limit: AtomicUsize::new(usize::MAX),
                found: std::sync::Mutex::new(None),
            },
        })
    }

    /// The number of inputs to check.
    pub fn inputs(&self) -> usize {
        self.owner.len()
    }

    /// Whether every input has been taken by some thread (or none need
    /// checking after a failure or [`BlockChecks::cancel`]).
    pub fn exhausted(&self) -> bool {
        let next = self.next.load(Ordering::Relaxed);
        next >= self.owner.len() || next > self.failure.limit.load(Ordering::Acquire)
    }

    /// Stops the checks: inputs not taken yet are never checked (the
    /// verdict is then meaningless; for a caller that no longer wants it).
    pub fn cancel(&self) {
        self.failure.limit.store(0, Ordering::Release);
        self.next.fetch_max(self.owner.len(), Ordering::AcqRel);
    }

    /// Takes chunks of inputs and checks them until none is left or every
    /// remaining one is after a failure. Any number of threads may run it
    /// at once.
    pub fn work(&self) {
        loop {
            let start = self.next.fetch_add(CHUNK, Ordering::Relaxed);
            if start >= self.owner.len() {
                return;
            }
            for position in start..(start + CHUNK).min(self.owner.len()) {
                if position > self.failure.limit.load(Ordering::Acquire) {
                    return;
                }
                self.check(position);
            }
        }
    }

    /// Checks the input at `position` in the block's flat list.
    fn check(&self, position: usize) {
        let job = &self.jobs[self.owner[position]];
        let vin = position - job.first_input;
        let prepared = job.prepared.get_or_init(|| {
            let tx = &self.block.txdata[job.tx];
            let spent: Vec<SpentTxOut<'_>> = self.spent
                [job.first_input..job.first_input + job.inputs]
                .iter()
                .map(|s| SpentTxOut {
                    value: s.coin.value,
                    script_pubkey: &s.coin.script_pubkey,
                })
                .collect();
            PreparedTx::new(&serialize(tx), &spent)
        });
        let result = match prepared {
            Ok(prepared) => prepared.verify(vin, self.flags),
            Err(e) => Err(e.clone()),
        };
        let error = match result {
            Ok(()) => return,
            Err(VerifyError::Script { error }) => BlockScriptError::Script {
                txid: job.txid,
                vin: vin as u32,
                error,
            },
            Err(source) => BlockScriptError::Engine {
                txid: job.txid,
                source,
            },
        };
        self.failure.record(position, error);
    }

    /// The verdict once every thread running [`BlockChecks::work`] has
    /// returned: the first failing input in block order, if any.
    ///
    /// # Errors
    /// As [`verify_block_scripts`].
    pub fn verdict(&self) -> Result<(), BlockScriptError> {
        let found = self
            .failure
            .found
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match found.as_ref() {
            Some((_, error)) => Err(error.clone()),
            None => Ok(()),
        }
    }
}

/// Verifies every input of `block` under `flags` with Core's interpreter,
/// on up to `threads` threads (the caller's included), started for this
/// block ([`super::pool::ScriptPool`] keeps them across blocks).
///
/// `spent` is the block's spent outputs in block order, transaction by
/// transaction, input by input, the coinbase excluded: exactly
/// [`crate::validation::BlockEffects::spent`] for this block.
///
/// # Errors
/// [`BlockScriptError::Script`] for the first input (in block order) whose
/// scripts fail; [`BlockScriptError::SpentMismatch`] when `spent` does not
/// match the block; [`BlockScriptError::Engine`] when Core cannot check a
/// transaction.
pub fn verify_block_scripts(
    block: &Block,
    spent: &[SpentOutput],
    flags: ScriptFlags,
    threads: NonZeroUsize,
) -> Result<(), BlockScriptError> {
    let checks = BlockChecks::new(block, spent, flags)?;
    let threads = threads.get().min(checks.inputs().div_ceil(CHUNK)).max(1);
    if threads == 1 || checks.inputs() < MIN_PARALLEL_INPUTS {
        checks.work();
    } else {
        std::thread::scope(|s| {
            for _ in 1..threads {
                s.spawn(|| checks.work());
            }
            checks.work();
        });
    }
    checks.verdict()
}

/// The block's non-coinbase transactions with their places in `spent`.
///
/// Each transaction's slice must be its inputs in order (the outpoint each
/// spends, its index, one spending txid for all); the txid is taken from
/// the slice (`connect_block` computed it), not hashed again. A
/// transaction without inputs (never in a block that passed the economic
/// checks) or a slice that does not match is [`BlockScriptError::SpentMismatch`].
fn tx_jobs(block: &Block, spent: &[SpentOutput]) -> Result<Vec<TxJob>, BlockScriptError> {
    let mut jobs = Vec::with_capacity(block.txdata.len().saturating_sub(1));
    let mut offset = 0;
    for (index, tx) in block.txdata.iter().enumerate().skip(1) {
        let end = offset + tx.input.len();
        let slice = spent.get(offset..end).filter(|s| spends_of(tx, s));
        let Some(first) = slice.and_then(|s| s.first()) else {
            let txid = tx.compute_txid();
            return Err(BlockScriptError::SpentMismatch { txid });
        };
        jobs.push(TxJob {
            tx: index,
            txid: first.txid,
            first_input: offset,
            inputs: tx.input.len(),
            prepared: OnceLock::new(),
        });
        offset = end;
    }
    if offset != spent.len() {
        let txid = block
            .txdata
            .last()
            .map(|t| t.compute_txid())
            .unwrap_or_else(|| Txid::from_raw_hash(bitcoin::hashes::Hash::all_zeros()));
        return Err(BlockScriptError::SpentMismatch { txid });
    }
    Ok(jobs)
}

/// Whether `spent` lists `tx`'s inputs in order: input `i` spends
/// `spent[i].outpoint`, recorded as input `i` of one spending transaction.
fn spends_of(tx: &bitcoin::Transaction, spent: &[SpentOutput]) -> bool {
    let txid = spent.first().map(|s| s.txid);
    tx.input.len() == spent.len()
        && tx
            .input
            .iter()
            .zip(spent)
            .enumerate()
            .all(|(i, (input, s))| {
                input.previous_output == s.outpoint && s.vin as usize == i && Some(s.txid) == txid
            })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::primitives::Coin;
    use bitcoin::hashes::Hash;
    use bitcoin::{Amount, OutPoint, ScriptBuf, Sequence, Transaction, TxIn, TxOut, Witness};

    /// A block of `txs` transactions of `inputs` inputs each, spending
    /// outputs whose scriptPubKey is OP_TRUE, except the flat input
    /// positions in `failing` (OP_FALSE: EVAL_FALSE).
    pub(in crate::validation::script) fn block(
        txs: usize,
        inputs: usize,
        failing: &[usize],
    ) -> (Block, Vec<SpentOutput>) {
        let coinbase = Transaction {
            version: bitcoin::transaction::Version::ONE,
            lock_time: bitcoin::absolute::LockTime::ZERO,
            input: vec![TxIn {
                previous_output: OutPoint::null(),
                script_sig: ScriptBuf::from_bytes(vec![0x51, 0x51]),
                sequence: Sequence::MAX,
                witness: Witness::new(),
            }],
            output: vec![TxOut::NULL],
        };
        let mut txdata = vec![coinbase];
        let mut spent = Vec::new();
        for t in 0..txs {
            let input: Vec<TxIn> = (0..inputs)
                .map(|i| TxIn {
                    previous_output: OutPoint {
                        txid: Txid::from_byte_array([t as u8 + 1; 32]),
                        vout: i as u32,
                    },
                    ..TxIn::default()
                })
                .collect();
            let tx = Transaction {
                version: bitcoin::transaction::Version::TWO,
                lock_time: bitcoin::absolute::LockTime::ZERO,
                input,
                output: vec![TxOut::NULL],
            };
            let txid = tx.compute_txid();
            for (vin, i) in tx.input.iter().enumerate() {
                let position = t * inputs + vin;
                let script = if failing.contains(&position) {
                    0x00
                } else {
                    0x51
                };
                spent.push(SpentOutput {
                    outpoint: i.previous_output,
                    coin: Coin {
                        value: Amount::from_sat(1_000),
                        script_pubkey: vec![script],
                        height: 1,
                        coinbase: false,
                    },
                    txid,
                    vin: vin as u32,
                });
            }
            txdata.push(tx);
        }
        let header = bitcoin::block::Header {
            version: bitcoin::block::Version::ONE,
            prev_blockhash: bitcoin::BlockHash::all_zeros(),
            merkle_root: bitcoin::TxMerkleNode::all_zeros(),
            time: 0,
            bits: bitcoin::CompactTarget::from_consensus(0x207f_ffff),
            nonce: 0,
        };
        (Block { header, txdata }, spent)
    }

    fn threads(n: usize) -> NonZeroUsize {
        NonZeroUsize::new(n).unwrap()
    }

    #[test]
    fn the_first_failure_in_block_order_whatever_the_threads() {
        let (blk, spent) = block(6, 30, &[171, 47, 48]);
        let flags = ScriptFlags::P2SH | ScriptFlags::WITNESS;
        for n in [1, 2, 3, 8] {
            match verify_block_scripts(&blk, &spent, flags, threads(n)) {
                Err(BlockScriptError::Script { txid, vin, error }) => {
                    assert_eq!(txid, blk.txdata[2].compute_txid(), "{n} threads");
                    assert_eq!(vin, 17, "{n} threads");
                    assert_eq!(error.name(), "EVAL_FALSE");
                }
                other => panic!("{n} threads: {other:?}"),
            }
        }
        let (good, spent) = block(6, 30, &[]);
        for n in [1, 2, 8] {
            assert_eq!(
                verify_block_scripts(&good, &spent, flags, threads(n)),
                Ok(())
            );
        }
    }

    #[test]
    fn spent_outputs_must_match_the_block() {
        let (blk, mut spent) = block(2, 3, &[]);
        let flags = ScriptFlags::P2SH;
        spent.pop();
        assert!(matches!(
            verify_block_scripts(&blk, &spent, flags, threads(2)),
            Err(BlockScriptError::SpentMismatch { .. })
        ));
        let (blk, mut spent) = block(2, 3, &[]);
        spent.swap(0, 1);
        assert!(matches!(
            verify_block_scripts(&blk, &spent, flags, threads(2)),
            Err(BlockScriptError::SpentMismatch { .. })
        ));
        // The right count and order, but one input's outpoint is another's.
        let (blk, mut spent) = block(2, 3, &[]);
        spent[1].outpoint.vout ^= 1;
        assert!(matches!(
            verify_block_scripts(&blk, &spent, flags, threads(2)),
            Err(BlockScriptError::SpentMismatch { .. })
        ));
    }
}
