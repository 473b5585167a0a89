//! Topologically restricted until confirmation (TRUC, BIP-431): the limits
//! on version-3 transactions, and Core's texts for each violation.
//!
//! Only the size limit of a lone version-3 transaction needs no mempool
//! ([`check_truc_size`]). The rest (a TRUC transaction has at most one
//! unconfirmed parent and one unconfirmed child, a child is at most
//! [`TRUC_CHILD_MAX_VSIZE`], TRUC and non-TRUC transactions do not spend
//! each other while unconfirmed) needs the pool: the acceptance code builds
//! a [`TrucViolation`] and turns it into Core's refusal with
//! [`TrucViolation::reject`], so every text is Core's.
//!
//! Source: Bitcoin Core 30.0 `src/policy/truc_policy.h`,
//! `src/policy/truc_policy.cpp` (`SingleTRUCChecks`, `PackageTRUCChecks`),
//! `src/validation.cpp` (`TRUC-violation`, `TX_MEMPOOL_POLICY`).

use std::fmt;

use bitcoin::{Transaction, Txid, Wtxid};

use crate::mempool::reject::{TxReject, TxRejectClass};

/// The transaction version that opts into TRUC rules (`TRUC_VERSION`).
pub const TRUC_VERSION: i32 = 3;
/// Most transactions in a TRUC transaction's unconfirmed ancestry,
/// itself included (`TRUC_ANCESTOR_LIMIT`).
pub const TRUC_ANCESTOR_LIMIT: usize = 2;
/// Most transactions in a TRUC transaction's unconfirmed descendants,
/// itself included (`TRUC_DESCENDANT_LIMIT`).
pub const TRUC_DESCENDANT_LIMIT: usize = 2;
/// Largest TRUC transaction, sigop-adjusted virtual bytes
/// (`TRUC_MAX_VSIZE`).
pub const TRUC_MAX_VSIZE: u64 = 10_000;
/// Largest TRUC transaction with an unconfirmed parent, sigop-adjusted
/// virtual bytes (`TRUC_CHILD_MAX_VSIZE`).
pub const TRUC_CHILD_MAX_VSIZE: u64 = 1_000;
/// Core's reject reason for every TRUC rule.
pub const REASON_TRUC_VIOLATION: &str = "TRUC-violation";

/// A transaction's ids, as Core's TRUC messages name it: `<txid> (wtxid=<wtxid>)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxIds {
    /// The transaction's txid.
    pub txid: Txid,
    /// The transaction's wtxid.
    pub wtxid: Wtxid,
}

impl TxIds {
    /// The ids of `tx` (computes both hashes).
    pub fn of(tx: &Transaction) -> Self {
        TxIds {
            txid: tx.compute_txid(),
            wtxid: tx.compute_wtxid(),
        }
    }
}

impl fmt::Display for TxIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (wtxid={})", self.txid, self.wtxid)
    }
}

/// A broken TRUC rule, with what Core's debug message names.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TrucViolation {
    /// A TRUC transaction over [`TRUC_MAX_VSIZE`].
    TooBig {
        /// The transaction.
        tx: TxIds,
        /// Its sigop-adjusted virtual size, vbytes.
        vsize: u64,
    },
    /// A TRUC transaction with an unconfirmed parent over
    /// [`TRUC_CHILD_MAX_VSIZE`].
    ChildTooBig {
        /// The transaction.
        tx: TxIds,
        /// Its sigop-adjusted virtual size, vbytes.
        vsize: u64,
    },
    /// More than [`TRUC_ANCESTOR_LIMIT`] in the unconfirmed ancestry.
    TooManyAncestors {
        /// The transaction that would have them.
        tx: TxIds,
    },
    /// A TRUC parent would have more than [`TRUC_DESCENDANT_LIMIT`].
    TooManyDescendants {
        /// The parent.
        parent: TxIds,
    },
    /// A TRUC transaction spends an unconfirmed non-TRUC one.
    TrucSpendsNonTruc {
        /// The spending transaction.
        tx: TxIds,
        /// The unconfirmed parent.
        parent: TxIds,
    },
    /// A non-TRUC transaction spends an unconfirmed TRUC one.
    NonTrucSpendsTruc {
        /// The spending transaction.
        tx: TxIds,
        /// The unconfirmed parent.
        parent: TxIds,
    },
}

impl fmt::Display for TrucViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrucViolation::TooBig { tx, vsize } => write!(
                f,
                "version=3 tx {tx} is too big: {vsize} > {TRUC_MAX_VSIZE} virtual bytes"
            ),
            TrucViolation::ChildTooBig { tx, vsize } => write!(
                f,
                "version=3 child tx {tx} is too big: {vsize} > {TRUC_CHILD_MAX_VSIZE} virtual bytes"
            ),
            TrucViolation::TooManyAncestors { tx } => {
                write!(f, "tx {tx} would have too many ancestors")
            }
            TrucViolation::TooManyDescendants { parent } => {
                write!(f, "tx {parent} would exceed descendant count limit")
            }
            TrucViolation::TrucSpendsNonTruc { tx, parent } => write!(
                f,
                "version=3 tx {tx} cannot spend from non-version=3 tx {parent}"
            ),
            TrucViolation::NonTrucSpendsTruc { tx, parent } => write!(
                f,
                "non-version=3 tx {tx} cannot spend from version=3 tx {parent}"
            ),
        }
    }
}

impl TrucViolation {
    /// Core's refusal: [`TxRejectClass::MempoolPolicy`], reason
    /// `TRUC-violation`, this violation's text as the debug message.
    pub fn reject(&self) -> TxReject {
        TxReject::with_debug(
            TxRejectClass::MempoolPolicy,
            REASON_TRUC_VIOLATION,
            self.to_string(),
        )
    }
}

/// Whether `tx` opts into TRUC rules (version 3).
pub fn is_truc(tx: &Transaction) -> bool {
    tx.version.0 == TRUC_VERSION
}

/// The TRUC rule that needs no mempool: a version-3 transaction of
/// `vsize` (sigop-adjusted virtual bytes,
/// [`super::sigop_adjusted_vsize`]) is at most [`TRUC_MAX_VSIZE`]
/// (the first size check of Core's `SingleTRUCChecks`). Other versions
/// pass.
///
/// # Errors
///
/// [`TrucViolation::TooBig`]'s refusal: `TRUC-violation, version=3 tx
/// <txid> (wtxid=<wtxid>) is too big: <vsize> > 10000 virtual bytes`.
pub fn check_truc_size(tx: &Transaction, vsize: u64) -> Result<(), TxReject> {
    if is_truc(tx) && vsize > TRUC_MAX_VSIZE {
        return Err(TrucViolation::TooBig {
            tx: TxIds::of(tx),
            vsize,
        }
        .reject());
    }
    Ok(())
}
