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

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

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

/// One non-coinbase transaction of the block and where its inputs start in
/// the block's flat list of inputs.
struct TxJob<'a> {
    tx: &'a bitcoin::Transaction,
    txid: Txid,
    spent: &'a [SpentOutput],
    first_input: usize,
    prepared: OnceLock<Result<PreparedTx, VerifyError>>,
}

impl TxJob<'_> {
    fn prepared(&self) -> &Result<PreparedTx, VerifyError> {
        self.prepared.get_or_init(|| {
            let bytes = serialize(self.tx);
            let spent: Vec<SpentTxOut<'_>> = self
                .spent
                .iter()
                .map(|s| SpentTxOut {
                    value: s.coin.value,
                    script_pubkey: &s.coin.script_pubkey,
                })
                .collect();
            PreparedTx::new(&bytes, &spent)
        })
    }
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

/// Verifies every input of `block` under `flags` with Core's interpreter,
/// on up to `threads` threads (the caller's included).
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
    let jobs = tx_jobs(block, spent)?;
    // Input position -> job index, so a worker finds its transaction in O(1).
    let mut owner = Vec::with_capacity(spent.len());
    for (j, job) in jobs.iter().enumerate() {
        owner.extend(std::iter::repeat_n(j, job.spent.len()));
    }
    let next = AtomicUsize::new(0);
    let failure = FirstFailure {
        limit: AtomicUsize::new(usize::MAX),
        found: std::sync::Mutex::new(None),
    };
    let work = || worker(&jobs, &owner, flags, &next, &failure);
    let threads = threads.get().min(owner.len().div_ceil(CHUNK)).max(1);
    if threads == 1 || owner.len() < MIN_PARALLEL_INPUTS {
        work();
    } else {
        std::thread::scope(|s| {
            for _ in 1..threads {
                s.spawn(work);
            }
            work();
        });
    }
    let found = failure
        .found
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match found {
        Some((_, error)) => Err(error),
        None => Ok(()),
    }
}

/// The block's non-coinbase transactions with their slices of `spent`.
///
/// Each slice must be the transaction's inputs in order (the outpoint each
/// spends, its index, one spending txid for all); the txid is taken from
/// the slice (`connect_block` computed it), not hashed again. A
/// transaction without inputs (never in a block that passed the economic
/// checks) or a slice that does not match is [`BlockScriptError::SpentMismatch`].
fn tx_jobs<'a>(
    block: &'a Block,
    spent: &'a [SpentOutput],
) -> Result<Vec<TxJob<'a>>, BlockScriptError> {
    let mut jobs = Vec::with_capacity(block.txdata.len().saturating_sub(1));
    let mut offset = 0;
    for tx in block.txdata.iter().skip(1) {
        let end = offset + tx.input.len();
        let slice = spent.get(offset..end).filter(|s| spends_of(tx, s));
        let Some((slice, first)) = slice.and_then(|s| Some((s, s.first()?))) else {
            let txid = tx.compute_txid();
            return Err(BlockScriptError::SpentMismatch { txid });
        };
        jobs.push(TxJob {
            tx,
            txid: first.txid,
            spent: slice,
            first_input: offset,
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

/// Takes chunks of inputs until none is left or every remaining one is
/// after a failure.
fn worker(
    jobs: &[TxJob<'_>],
    owner: &[usize],
    flags: ScriptFlags,
    next: &AtomicUsize,
    failure: &FirstFailure,
) {
    loop {
        let start = next.fetch_add(CHUNK, Ordering::Relaxed);
        if start >= owner.len() {
            return;
        }
        for position in start..(start + CHUNK).min(owner.len()) {
            if position > failure.limit.load(Ordering::Acquire) {
                return;
            }
            let job = &jobs[owner[position]];
            let vin = position - job.first_input;
            let result = match job.prepared() {
                Ok(prepared) => prepared.verify(vin, flags),
                Err(e) => Err(e.clone()),
            };
            let error = match result {
                Ok(()) => continue,
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
            failure.record(position, error);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::primitives::Coin;
    use bitcoin::hashes::Hash;
    use bitcoin::{Amount, OutPoint, ScriptBuf, Sequence, Transaction, TxIn, TxOut, Witness};

    /// A block of `txs` transactions of `inputs` inputs each, spending
    /// outputs whose scriptPubKey is OP_TRUE, except the flat input
    /// positions in `failing` (OP_FALSE: EVAL_FALSE).
    fn block(txs: usize, inputs: usize, failing: &[usize]) -> (Block, Vec<SpentOutput>) {
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
