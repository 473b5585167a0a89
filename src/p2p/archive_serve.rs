//! Serving the archive requests of `super::archive` (`getarchepoch`,
//! `getarchproof`) from the node behind [`NodeBackend`], on blocking
//! threads, with answers kept under the message size limit.

use std::sync::Arc;

use bitcoin::p2p::message::NetworkMessage;
use bitcoin::OutPoint;
use tracing::{debug, warn};

use super::archive::{
    ArchProof, ArchProofStatus, ArchiveMessageError, GetArchEpochs, GetArchProof, GETARCHEPOCH,
    GETARCHPROOF, MAX_ARCHPROOF_PROOF_BYTES,
};
use super::backend::{blocking, ArchiveQueryError, NodeBackend};

/// Handles an unknown-command message for the peer task: `Ok(Some(reply))`
/// for an archive request, `Ok(None)` for anything else (other unknown
/// commands, and `archepochs` / `archproof` we never asked for: ignored).
///
/// # Errors
/// [`ArchiveMessageError`]: the peer task disconnects, and discourages when
/// [`ArchiveMessageError::is_misbehaviour`].
pub(crate) async fn on_message(
    backend: Arc<dyn NodeBackend>,
    advertised: bool,
    command: &str,
    payload: &[u8],
) -> Result<Option<NetworkMessage>, ArchiveMessageError> {
    let command = match command {
        GETARCHEPOCH => GETARCHEPOCH,
        GETARCHPROOF => GETARCHPROOF,
        _ => return Ok(None),
    };
    if !advertised {
        return Err(ArchiveMessageError::NotAdvertised { command });
    }
    if command == GETARCHEPOCH {
        let req = GetArchEpochs::decode(payload)?;
        let res = blocking(move || backend.archive_epochs(req.start, req.count)).await;
        return Ok(match res {
            Some(Ok(answer)) => Some(answer.to_message()),
            Some(Err(e)) => {
                debug!(error = %e, "getarchepoch not answered");
                None
            }
            None => None,
        });
    }
    let req = GetArchProof::decode(payload)?;
    Ok(Some(answer_proof(backend, req).await.to_message()))
}

/// Builds the `archproof` for `req` on a blocking thread (see
/// [`answer_within`]); unavailable if that thread panicked.
async fn answer_proof(backend: Arc<dyn NodeBackend>, req: GetArchProof) -> ArchProof {
    let id = req.request_id;
    blocking(move || {
        answer_within(id, &req.outpoints, MAX_ARCHPROOF_PROOF_BYTES, |ops| {
            backend
                .archive_proof(ops, req.epoch, req.txoutproofs)
                .map(|p| p.to_bytes())
        })
    })
    .await
    .unwrap_or_else(|| unavailable(id))
}

fn unavailable(request_id: u64) -> ArchProof {
    ArchProof {
        request_id,
        status: ArchProofStatus::Unavailable,
        answered: 0,
        proof: Vec::new(),
    }
}

/// The answer to a request for `outpoints`: the proof of all of them if it
/// fits in `limit` bytes (status ok), else of the longest prefix found that
/// fits (partial): the prefix shrinks in proportion to the overshoot, with a
/// 10% margin, until it fits (proofs share nodes, so they grow less than
/// linearly and one or two rounds do). Unavailable when `prove` fails or
/// when one outpoint's proof alone exceeds `limit`.
fn answer_within(
    request_id: u64,
    outpoints: &[OutPoint],
    limit: usize,
    mut prove: impl FnMut(&[OutPoint]) -> Result<Vec<u8>, ArchiveQueryError>,
) -> ArchProof {
    let total = outpoints.len();
    let mut n = total;
    while n >= 1 {
        let bytes = match prove(&outpoints[..n]) {
            Ok(bytes) => bytes,
            Err(e @ ArchiveQueryError::Storage { .. }) => {
                warn!(error = %e, "getarchproof: archive read failed");
                return unavailable(request_id);
            }
            Err(e) => {
                debug!(error = %e, "getarchproof: unavailable");
                return unavailable(request_id);
            }
        };
        if bytes.len() <= limit {
            return ArchProof {
                request_id,
                status: if n == total {
                    ArchProofStatus::Ok
                } else {
                    ArchProofStatus::Partial
                },
                // invariant: n ≤ 1,000 (the decoder caps requests).
                answered: u16::try_from(n).unwrap_or(u16::MAX),
                proof: bytes,
            };
        }
        let scaled = (n as u128 * limit as u128 * 9) / (bytes.len() as u128 * 10);
        n = if n == 1 {
            0
        } else {
            (scaled as usize).clamp(1, n - 1)
        };
    }
    unavailable(request_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::hashes::Hash;
    use bitcoin::Txid;

    #[test]
    fn oversized_answers_shrink_to_a_fitting_prefix() {
        let txid = Txid::from_byte_array([1; 32]);
        let ops: Vec<OutPoint> = (0..1000).map(|vout| OutPoint { txid, vout }).collect();
        // A proof model: shared part 5,000 bytes + 300 bytes per outpoint.
        let mut calls = Vec::new();
        let mut prove = |o: &[OutPoint]| {
            calls.push(o.len());
            Ok(vec![0u8; 5_000 + 300 * o.len()])
        };
        let a = answer_within(9, &ops, 100_000, &mut prove);
        assert_eq!(a.status, ArchProofStatus::Partial);
        let n = a.answered as usize;
        assert!(a.proof.len() <= 100_000);
        // Within 10% (the margin) of the largest prefix that fits (316).
        assert!((285..=316).contains(&n), "{n}");
        assert!(calls.len() <= 3, "{calls:?}");
        // Everything fits: ok in one call.
        let a = answer_within(9, &ops[..10], 100_000, |o| Ok(vec![1; 10 * o.len()]));
        assert_eq!((a.status, a.answered), (ArchProofStatus::Ok, 10));
        // Not even one fits, or the archive fails: unavailable.
        let a = answer_within(9, &ops, 100, |o| Ok(vec![1; 1000 + o.len()]));
        assert_eq!(
            (a.status, a.answered, a.proof.len()),
            (ArchProofStatus::Unavailable, 0, 0)
        );
        let a = answer_within(9, &ops, 100, |_| Err(ArchiveQueryError::NothingSealed));
        assert_eq!(a.status, ArchProofStatus::Unavailable);
        assert_eq!(ArchProof::decode(&a.encode()).unwrap(), a);
    }
}
