//! Why a transaction is refused: Bitcoin Core's `TxValidationState`, as a
//! value. Every refusal carries Core's result class
//! ([`TxRejectClass`], `TxValidationResult` in `consensus/validation.h`),
//! Core's reject reason string (the text `sendrawtransaction` and
//! `testmempoolaccept` print, and Esplora's `POST /tx` passes through), and
//! an optional debug message (Core's `GetDebugMessage`).
//!
//! Source: Bitcoin Core 30.0 `src/consensus/validation.h`,
//! `src/validation.cpp` (`MemPoolAccept`), `src/policy/policy.cpp`.

use std::fmt;

/// Core's `TxValidationResult`: what kind of failure a refusal is, which
/// decides how a peer that relayed the transaction is treated
/// (`net_processing.cpp` `MaybePunishNodeForTx`) and whether the
/// transaction may be tried again later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TxRejectClass {
    /// Invalid by consensus rules (`TX_CONSENSUS`): the relaying peer is
    /// misbehaving.
    Consensus,
    /// Valid by consensus but refused by relay policy (`TX_NOT_STANDARD`).
    NotStandard,
    /// Spends an output in a way relay policy refuses: a nonstandard or
    /// future-witness-version output, a P2SH redeem script with too many
    /// sigops, too many legacy sigops (`TX_INPUTS_NOT_STANDARD`). Core
    /// remembers such a transaction by txid as well as wtxid, since no
    /// other witness can make it standard.
    InputsNotStandard,
    /// An input is neither in the UTXO set nor in the mempool
    /// (`TX_MISSING_INPUTS`): an orphan, perhaps valid later.
    MissingInputs,
    /// Not final yet, or spends an immature coinbase
    /// (`TX_PREMATURE_SPEND`).
    PrematureSpend,
    /// The witness was stripped or changed (`TX_WITNESS_MUTATED`).
    WitnessMutated,
    /// Spends an output another mempool transaction spends, and may not
    /// replace it (`TX_CONFLICT`).
    Conflict,
    /// Refused by a mempool limit: fee, size, ancestors, replacement
    /// rules (`TX_MEMPOOL_POLICY`).
    MempoolPolicy,
    /// Fee too low alone, but may pass within a package
    /// (`TX_RECONSIDERABLE`).
    Reconsiderable,
    /// Already known: in the mempool or confirmed (`TX_UNKNOWN`-like
    /// duplicates such as `txn-already-in-mempool`,
    /// `txn-already-known`).
    Duplicate,
}

/// A refused transaction: Core's reject reason, its class, and a debug
/// message.
///
/// `reason` is Core's exact string (e.g. `bad-txns-inputs-missingorspent`,
/// `min relay fee not met`, `dust`, `scriptpubkey`); [`fmt::Display`]
/// prints it as Core's `TxValidationState::ToString` does: the reason,
/// then `, <debug>` when there is a debug message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxReject {
    /// Core's result class.
    pub class: TxRejectClass,
    /// Core's reject reason string.
    pub reason: &'static str,
    /// Core's debug message (may be empty).
    pub debug: String,
}

impl TxReject {
    /// A refusal of class `class` with Core's `reason` and no debug text.
    pub fn new(class: TxRejectClass, reason: &'static str) -> Self {
        TxReject {
            class,
            reason,
            debug: String::new(),
        }
    }

    /// A refusal with a debug message.
    pub fn with_debug(
        class: TxRejectClass,
        reason: &'static str,
        debug: impl Into<String>,
    ) -> Self {
        TxReject {
            class,
            reason,
            debug: debug.into(),
        }
    }

    /// A policy refusal (`TX_NOT_STANDARD`).
    pub fn not_standard(reason: &'static str) -> Self {
        Self::new(TxRejectClass::NotStandard, reason)
    }

    /// A consensus refusal (`TX_CONSENSUS`).
    pub fn consensus(reason: &'static str) -> Self {
        Self::new(TxRejectClass::Consensus, reason)
    }
}

impl fmt::Display for TxReject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.debug.is_empty() {
            f.write_str(self.reason)
        } else {
            write!(f, "{}, {}", self.reason, self.debug)
        }
    }
}

impl std::error::Error for TxReject {}
