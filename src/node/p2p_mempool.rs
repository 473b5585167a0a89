//! The mempool side of [`super::NodeP2p`]: lookups on the published
//! snapshot (lock-free) and submissions, with the mempool's refusals
//! mapped to what the P2P layer does with them (Core's
//! `TxDownloadManagerImpl::MempoolRejectedTx`).

use std::sync::Arc;

use bitcoin::{Transaction, Txid, Wtxid};

use crate::mempool::{AcceptError, Mempool, MempoolEntry, TxRejectClass};
use crate::p2p::backend::{GenTxid, MempoolTx, TxSubmitError};

fn relay_view(e: &Arc<MempoolEntry>) -> MempoolTx {
    MempoolTx::new(e.tx.clone(), e.feerate_sat_per_kvb(), e.sequence)
}

/// The entry `id` names, by txid or wtxid.
pub(super) fn tx(mempool: &Mempool, id: GenTxid) -> Option<MempoolTx> {
    let snap = mempool.snapshot();
    let e = match id {
        GenTxid::Txid(t) => snap.pool.get(&t),
        GenTxid::Wtxid(w) => snap.pool.get_by_wtxid(&w),
    }?;
    Some(relay_view(e))
}

/// Up to `max` entries from sequence `from` on, and the next sequence.
pub(super) fn txids(mempool: &Mempool, from: u64, max: usize) -> (Vec<(Txid, Wtxid)>, u64) {
    let snap = mempool.snapshot();
    let ids = snap
        .pool
        .iter_from(from)
        .take(max)
        .map(|e| (e.txid, e.wtxid))
        .collect();
    (ids, snap.pool.next_sequence())
}

/// Submits a peer's transaction (no fee ceiling: `maxfeerate` is
/// `sendrawtransaction`'s guard for the node's own user).
pub(super) fn submit(mempool: &Mempool, tx: Arc<Transaction>) -> Result<(), TxSubmitError> {
    let has_witness = tx.input.iter().any(|i| !i.witness.is_empty());
    match mempool.submit(Arc::unwrap_or_clone(tx), None) {
        Ok(_) => Ok(()),
        Err(AcceptError::Storage(source)) => Err(TxSubmitError::Unavailable { source }),
        Err(AcceptError::Rejected(r)) => Err(match r.class {
            TxRejectClass::MissingInputs => TxSubmitError::MissingInputs,
            TxRejectClass::Duplicate if r.reason == "txn-already-in-mempool" => {
                TxSubmitError::Duplicate
            }
            class => TxSubmitError::Rejected {
                reason: r.to_string(),
                // Core keeps a stripped or mutated witness out of the
                // filter: the same txid may come with the right one.
                remember: class != TxRejectClass::WitnessMutated,
                by_txid: class == TxRejectClass::InputsNotStandard && has_witness,
            },
        }),
    }
}
