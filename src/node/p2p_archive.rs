//! The archive queries of [`super::p2p_backend::NodeP2p`] over a
//! [`ChainSnapshot`]: epoch headers, proofs (against the commitment or in
//! one sealed epoch, with txoutproofs on request), and whether the archive
//! is ready to be advertised (`NODE_ARCHIVE_PROOFS`).

use bitcoin::merkle_tree::MerkleBlock;
use bitcoin::{BlockHash, OutPoint, Txid};

use crate::archive::ProofBatch;
use crate::p2p::archive::{ArchEpochs, MAX_EPOCHS_PER_MESSAGE};
use crate::p2p::{ArchiveQueryError, BoxError};
use crate::snapshot::ChainSnapshot;

/// The txoutproof of `txid` in stored block `hash`, as Core's
/// `gettxoutproof` builds it; `None` when the block is not stored or does
/// not hold `txid`.
fn txoutproof(cs: &ChainSnapshot, hash: &BlockHash, txid: &Txid) -> Option<MerkleBlock> {
    let id = cs.index().id_of(hash)?;
    let block = cs.read_block(id).ok().flatten()?;
    let ids: Vec<Txid> = block.txdata.iter().map(|t| t.compute_txid()).collect();
    ids.contains(txid)
        .then(|| MerkleBlock::from_header_txids_with_predicate(&block.header, &ids, |t| t == txid))
}

/// [`NodeBackend::archive_epochs`] over the chain state: up to `count`
/// headers from `start` (none when `start` is at or beyond the sealed
/// count).
pub(super) fn epochs(cs: &ChainSnapshot, start: u32, count: u16) -> ArchEpochs {
    let a = cs.archive();
    let headers = a
        .epochs()
        .iter()
        .skip(start as usize)
        .take(usize::from(count.min(MAX_EPOCHS_PER_MESSAGE)))
        .copied()
        .collect();
    ArchEpochs {
        start,
        sealed: a.next_epoch(),
        commitment: a.commitment(),
        headers,
    }
}

/// [`NodeBackend::archive_proof`] over the chain state: against the
/// commitment (`epoch` `None`; with txoutproofs through
/// [`ChainSnapshot::prove_outpoints`]) or in one sealed epoch.
///
/// # Errors
/// [`ArchiveQueryError::NothingSealed`], [`ArchiveQueryError::NotSealed`],
/// [`ArchiveQueryError::Storage`].
pub(super) fn proof(
    cs: &ChainSnapshot,
    outpoints: &[OutPoint],
    epoch: Option<u32>,
    txoutproofs: bool,
) -> Result<ProofBatch, ArchiveQueryError> {
    let a = cs.archive();
    let sealed = a.next_epoch();
    if sealed == 0 {
        return Err(ArchiveQueryError::NothingSealed);
    }
    let storage = |e: BoxError| ArchiveQueryError::Storage { source: e };
    match epoch {
        None if txoutproofs => cs.prove_outpoints(outpoints).map_err(|e| storage(e.into())),
        None => a.prove(outpoints).map_err(|e| storage(e.into())),
        Some(e) if e >= sealed => Err(ArchiveQueryError::NotSealed { epoch: e, sealed }),
        Some(e) => {
            let f = |h: &BlockHash, t: &Txid| txoutproof(cs, h, t);
            a.prove_in_epoch(outpoints, e, txoutproofs.then_some(&f as _))
                .map_err(|e| storage(e.into()))
        }
    }
}

/// [`NodeBackend::archive_ready`] over the chain state: at least one epoch
/// sealed, every epoch final at the tip sealed (final = tip − 100 blocks),
/// and the tip at the best header height `best_header_height`.
pub(super) fn ready(cs: &ChainSnapshot, best_header_height: u32) -> bool {
    let a = cs.archive();
    let tip = cs.index().tip_height();
    let final_height = tip.saturating_sub(crate::sozu::PURGE_DEPTH);
    a.next_epoch() > 0
        && (tip < crate::sozu::PURGE_DEPTH || a.next_sealable(final_height).is_none())
        && tip >= best_header_height
}
