//! Archive messages (issue 5, `docs/archive.md` §8): epoch headers and
//! archival proofs over P2P, under the experimental service bit
//! [`NODE_ARCHIVE_PROOFS`].
//!
//! Four custom commands, carried as [`NetworkMessage::Unknown`] (the codec
//! passes unknown commands up undecoded; rust-bitcoin encodes them back
//! byte for byte):
//!
//! | command | direction | payload |
//! | --- | --- | --- |
//! | [`GETARCHEPOCH`] | client → node | [`GetArchEpochs`]: start u32 LE, count u16 LE (1..=2,000) |
//! | [`ARCHEPOCHS`] | node → client | [`ArchEpochs`]: start u32 LE, sealed u32 LE, commitment 32, CompactSize k ≤ 2,000, 81·k headers |
//! | [`GETARCHPROOF`] | client → node | [`GetArchProof`]: request id u64 LE, flags u8, epoch u32 LE, CompactSize n (1..=1,000), 36·n outpoints |
//! | [`ARCHPROOF`] | node → client | [`ArchProof`]: request id u64 LE, status u8, answered u16 LE, CompactSize len ≤ 3,900,000, proof |
//!
//! (`getarchepochs` would be 13 bytes, one more than the 12-byte command
//! field of the message header, hence `getarchepoch`.)
//!
//! Decoding is exact and bounded: every count is capped before anything is
//! allocated, the payload length must equal what the counts imply, and
//! CompactSizes must be canonical. A node answers requests only while it
//! advertises [`NODE_ARCHIVE_PROOFS`] to that peer (the archive has sealed
//! at least one epoch, every epoch final at the tip, and the node is at its
//! best header when the handshake happens). A request it did not advertise
//! for disconnects the peer (not discouraged, as Core does for unadvertised
//! BIP157 requests); a malformed or over-limit request disconnects and
//! discourages it ([`ArchiveMessageError::is_misbehaviour`]).

use std::sync::Arc;

use bitcoin::consensus::encode::{deserialize_partial, serialize, VarInt};
use bitcoin::merkle_tree::MerkleBlock;
use bitcoin::p2p::message::{CommandString, NetworkMessage};
use bitcoin::p2p::ServiceFlags;
use bitcoin::{BlockHash, OutPoint, Txid};
use tracing::{debug, warn};

use super::backend::{BoxError, NodeBackend};
use crate::archive::header::HEADER_LEN;
use crate::archive::{EpochHeader, ProofBatch};
use crate::snapshot::ChainSnapshot;

/// Service bit of nodes serving archive epochs and proofs: bit 24
/// (`0x0100_0000`), the first of the bits 24–31 Bitcoin Core reserves for
/// temporary experiments (`protocol.h`).
pub const NODE_ARCHIVE_PROOFS: u64 = 1 << 24;

/// [`NODE_ARCHIVE_PROOFS`] as [`ServiceFlags`] (rust-bitcoin has no const
/// constructor for flags outside its own list).
pub fn archive_service() -> ServiceFlags {
    ServiceFlags::from(NODE_ARCHIVE_PROOFS)
}

/// Command asking for epoch headers (12 bytes, the command field's limit).
pub const GETARCHEPOCH: &str = "getarchepoch";
/// Command answering [`GETARCHEPOCH`].
pub const ARCHEPOCHS: &str = "archepochs";
/// Command asking for a proof.
pub const GETARCHPROOF: &str = "getarchproof";
/// Command answering [`GETARCHPROOF`].
pub const ARCHPROOF: &str = "archproof";

/// Most epoch headers asked for or sent in one message (162,000 bytes of
/// headers).
pub const MAX_EPOCHS_PER_MESSAGE: u16 = 2_000;
/// Most outpoints per `getarchproof` (the HTTP `POST /proof/outpoints` cap,
/// [`crate::archive::proof::MAX_ITEMS`]).
pub const MAX_OUTPOINTS_PER_REQUEST: usize = crate::archive::proof::MAX_ITEMS;
/// Largest proof in one `archproof`, in bytes: the 4,000,000-byte payload
/// limit minus room for the other fields.
pub const MAX_ARCHPROOF_PROOF_BYTES: usize = 3_900_000;

/// `getarchproof` flag bit 0: attach the spending transaction's txoutproof
/// to each existence proof.
pub const FLAG_TXOUTPROOFS: u8 = 1;
/// `getarchproof` flag bit 1: prove in the one epoch named by the `epoch`
/// field only (root-anchored proof, `Archive::prove_in_epoch`).
pub const FLAG_SINGLE_EPOCH: u8 = 2;

/// A malformed, over-limit or unwanted archive message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArchiveMessageError {
    /// A request sent to a node that did not advertise
    /// [`NODE_ARCHIVE_PROOFS`] to this peer. Disconnect, no discouragement.
    #[error("{command} sent but NODE_ARCHIVE_PROOFS was not advertised")]
    NotAdvertised {
        /// The command.
        command: &'static str,
    },
    /// The payload's length is not what its fields and counts imply.
    #[error("{command}: payload is {len} bytes, expected {expected}")]
    Length {
        /// The command.
        command: &'static str,
        /// Bytes received.
        len: usize,
        /// Bytes the fields imply (or the minimum, when too short to tell).
        expected: usize,
    },
    /// A count outside its allowed range.
    #[error("{command}: {what} {count} outside 1..={max}")]
    Count {
        /// The command.
        command: &'static str,
        /// What is counted.
        what: &'static str,
        /// The count sent.
        count: u64,
        /// The limit.
        max: u64,
    },
    /// A field with a value the format does not allow.
    #[error("{command}: invalid {field}")]
    Invalid {
        /// The command.
        command: &'static str,
        /// The field.
        field: &'static str,
    },
    /// The same outpoint twice in one `getarchproof`.
    #[error("getarchproof: outpoint {outpoint} requested twice")]
    DuplicateOutpoint {
        /// The outpoint.
        outpoint: OutPoint,
    },
}

impl ArchiveMessageError {
    /// Whether the peer broke a rule (disconnect and discourage) rather
    /// than asked a node that did not offer the service (disconnect only).
    pub fn is_misbehaviour(&self) -> bool {
        !matches!(self, ArchiveMessageError::NotAdvertised { .. })
    }
}

/// Why the node could not answer an archive query (the answer is then an
/// `archproof` with status [`ArchProofStatus::Unavailable`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArchiveQueryError {
    /// This backend has no archive.
    #[error("no archive")]
    NoArchive,
    /// No epoch is sealed yet: nothing can be proven.
    #[error("no archive epoch is sealed yet")]
    NothingSealed,
    /// The single epoch asked for is not sealed.
    #[error("epoch {epoch} is not sealed ({sealed} sealed)")]
    NotSealed {
        /// The epoch asked for.
        epoch: u32,
        /// Epochs sealed.
        sealed: u32,
    },
    /// The node failed to read its archive or blocks. Not the peer's fault.
    #[error("archive storage error: {source}")]
    Storage {
        /// The cause.
        #[source]
        source: BoxError,
    },
}

fn too_short(command: &'static str, len: usize, expected: usize) -> ArchiveMessageError {
    ArchiveMessageError::Length {
        command,
        len,
        expected,
    }
}

/// Reads a canonical CompactSize at `at`; returns (value, bytes used).
fn compact_size(
    command: &'static str,
    field: &'static str,
    b: &[u8],
    at: usize,
) -> Result<(u64, usize), ArchiveMessageError> {
    let rest = b.get(at..).unwrap_or(&[]);
    // rust-bitcoin rejects non-minimal encodings.
    deserialize_partial::<VarInt>(rest)
        .map(|(v, used)| (v.0, used))
        .map_err(|_| ArchiveMessageError::Invalid { command, field })
}

fn u32_le(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn unknown(command: &'static str, payload: Vec<u8>) -> NetworkMessage {
    let command = CommandString::try_from_static(command)
        .expect("invariant: the four commands are constant ASCII of at most 12 bytes (unit test)");
    NetworkMessage::Unknown { command, payload }
}

/// `getarchepoch`: asks for `count` epoch headers from `start`.
///
/// Payload, 6 bytes: start epoch u32 LE, count u16 LE (1..=
/// [`MAX_EPOCHS_PER_MESSAGE`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GetArchEpochs {
    /// First epoch wanted.
    pub start: u32,
    /// Headers wanted (1..=2,000).
    pub count: u16,
}

impl GetArchEpochs {
    /// The 6-byte payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(6);
        out.extend_from_slice(&self.start.to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        out
    }

    /// The message, ready for the codec.
    pub fn to_message(&self) -> NetworkMessage {
        unknown(GETARCHEPOCH, self.encode())
    }

    /// Decodes a payload.
    ///
    /// # Errors
    /// [`ArchiveMessageError::Length`] unless exactly 6 bytes,
    /// [`ArchiveMessageError::Count`] for a count of 0 or above 2,000.
    pub fn decode(b: &[u8]) -> Result<GetArchEpochs, ArchiveMessageError> {
        if b.len() != 6 {
            return Err(too_short(GETARCHEPOCH, b.len(), 6));
        }
        let count = u16::from_le_bytes([b[4], b[5]]);
        if count == 0 || count > MAX_EPOCHS_PER_MESSAGE {
            return Err(ArchiveMessageError::Count {
                command: GETARCHEPOCH,
                what: "count",
                count: count.into(),
                max: MAX_EPOCHS_PER_MESSAGE.into(),
            });
        }
        Ok(GetArchEpochs {
            start: u32_le(b, 0),
            count,
        })
    }
}

/// `archepochs`: the sender's epoch headers from `start`.
///
/// Payload: start u32 LE, sealed u32 LE (epochs the sender has sealed),
/// commitment 32 bytes (hash of its last header, zeros when none), a
/// CompactSize k (≤ 2,000; 0 when `start ≥ sealed`), then k 81-byte
/// headers (`docs/archive.md` §3, big-endian fields), epochs start..start+k−1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchEpochs {
    /// First epoch in `headers` (echoes the request).
    pub start: u32,
    /// Epochs the sender has sealed.
    pub sealed: u32,
    /// The sender's archive commitment.
    pub commitment: [u8; 32],
    /// Headers `start..start + k`.
    pub headers: Vec<EpochHeader>,
}

impl ArchEpochs {
    /// The payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(43 + HEADER_LEN * self.headers.len());
        out.extend_from_slice(&self.start.to_le_bytes());
        out.extend_from_slice(&self.sealed.to_le_bytes());
        out.extend_from_slice(&self.commitment);
        out.extend_from_slice(&serialize(&VarInt(self.headers.len() as u64)));
        for h in &self.headers {
            out.extend_from_slice(&h.encode());
        }
        out
    }

    /// The message, ready for the codec.
    pub fn to_message(&self) -> NetworkMessage {
        unknown(ARCHEPOCHS, self.encode())
    }

    /// Decodes a payload (for clients), bounded.
    ///
    /// # Errors
    /// Length, count (> 2,000) and header-version errors.
    pub fn decode(b: &[u8]) -> Result<ArchEpochs, ArchiveMessageError> {
        const C: &str = ARCHEPOCHS;
        if b.len() < 41 {
            return Err(too_short(C, b.len(), 41));
        }
        let (k, used) = compact_size(C, "header count", b, 40)?;
        if k > u64::from(MAX_EPOCHS_PER_MESSAGE) {
            return Err(ArchiveMessageError::Count {
                command: C,
                what: "header count",
                count: k,
                max: MAX_EPOCHS_PER_MESSAGE.into(),
            });
        }
        let start_of_headers = 40 + used;
        let expected = start_of_headers + HEADER_LEN * k as usize;
        if b.len() != expected {
            return Err(too_short(C, b.len(), expected));
        }
        let mut commitment = [0u8; 32];
        commitment.copy_from_slice(&b[8..40]);
        let headers = b[start_of_headers..]
            .chunks_exact(HEADER_LEN)
            .map(|c| {
                EpochHeader::decode(c).ok_or(ArchiveMessageError::Invalid {
                    command: C,
                    field: "epoch header",
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ArchEpochs {
            start: u32_le(b, 0),
            sealed: u32_le(b, 4),
            commitment,
            headers,
        })
    }
}

/// `getarchproof`: asks for one proof about 1..=1,000 outpoints.
///
/// Payload: request id u64 LE (echoed), flags u8 ([`FLAG_TXOUTPROOFS`],
/// [`FLAG_SINGLE_EPOCH`]; other bits must be 0), epoch u32 LE (the epoch of
/// a single-epoch request; must be 0 otherwise), CompactSize n (1..=1,000),
/// then n outpoints in Bitcoin wire encoding (txid in internal byte order,
/// vout u32 LE), all distinct.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GetArchProof {
    /// Echoed in the answer.
    pub request_id: u64,
    /// Attach txoutproofs to existence proofs.
    pub txoutproofs: bool,
    /// `Some(e)`: prove in epoch e only (anchor: its root); `None`: prove
    /// against the commitment (every sealed epoch).
    pub epoch: Option<u32>,
    /// The outpoints, 1..=1,000, distinct.
    pub outpoints: Vec<OutPoint>,
}

impl GetArchProof {
    /// The payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + 36 * self.outpoints.len());
        out.extend_from_slice(&self.request_id.to_le_bytes());
        let mut flags = 0;
        if self.txoutproofs {
            flags |= FLAG_TXOUTPROOFS;
        }
        if self.epoch.is_some() {
            flags |= FLAG_SINGLE_EPOCH;
        }
        out.push(flags);
        out.extend_from_slice(&self.epoch.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&serialize(&VarInt(self.outpoints.len() as u64)));
        for op in &self.outpoints {
            out.extend_from_slice(&serialize(op));
        }
        out
    }

    /// The message, ready for the codec.
    pub fn to_message(&self) -> NetworkMessage {
        unknown(GETARCHPROOF, self.encode())
    }

    /// Decodes a payload, bounded: the count is checked against 1,000 and
    /// against the bytes present before the outpoint vector is allocated.
    ///
    /// # Errors
    /// Length, count, flag, epoch-field and duplicate errors.
    pub fn decode(b: &[u8]) -> Result<GetArchProof, ArchiveMessageError> {
        const C: &str = GETARCHPROOF;
        if b.len() < 14 {
            return Err(too_short(C, b.len(), 14));
        }
        let request_id = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
        let flags = b[8];
        if flags & !(FLAG_TXOUTPROOFS | FLAG_SINGLE_EPOCH) != 0 {
            return Err(ArchiveMessageError::Invalid {
                command: C,
                field: "flags (unknown bit set)",
            });
        }
        let epoch_field = u32_le(b, 9);
        let epoch = if flags & FLAG_SINGLE_EPOCH != 0 {
            Some(epoch_field)
        } else if epoch_field != 0 {
            return Err(ArchiveMessageError::Invalid {
                command: C,
                field: "epoch (non-zero without the single-epoch flag)",
            });
        } else {
            None
        };
        let (n, used) = compact_size(C, "outpoint count", b, 13)?;
        if n == 0 || n > MAX_OUTPOINTS_PER_REQUEST as u64 {
            return Err(ArchiveMessageError::Count {
                command: C,
                what: "outpoint count",
                count: n,
                max: MAX_OUTPOINTS_PER_REQUEST as u64,
            });
        }
        let at = 13 + used;
        let expected = at + 36 * n as usize;
        if b.len() != expected {
            return Err(too_short(C, b.len(), expected));
        }
        let mut outpoints = Vec::with_capacity(n as usize);
        let mut seen = std::collections::HashSet::with_capacity(n as usize);
        for chunk in b[at..].chunks_exact(36) {
            let (op, _) = deserialize_partial::<OutPoint>(chunk).map_err(|_| {
                ArchiveMessageError::Invalid {
                    command: C,
                    field: "outpoint",
                }
            })?;
            if !seen.insert(op) {
                return Err(ArchiveMessageError::DuplicateOutpoint { outpoint: op });
            }
            outpoints.push(op);
        }
        Ok(GetArchProof {
            request_id,
            txoutproofs: flags & FLAG_TXOUTPROOFS != 0,
            epoch,
            outpoints,
        })
    }
}

/// Status of an [`ArchProof`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArchProofStatus {
    /// 0: the proof covers every outpoint asked.
    Ok,
    /// 1: the whole answer would exceed [`MAX_ARCHPROOF_PROOF_BYTES`]; the
    /// proof covers the first `answered` outpoints, in request order. Ask
    /// again for the rest.
    Partial,
    /// 2: no proof: nothing sealed yet, the single epoch asked for is not
    /// sealed, the node failed to read its archive, or one outpoint's proof
    /// alone would exceed the size limit. `answered` is 0, the proof empty.
    Unavailable,
}

impl ArchProofStatus {
    fn byte(self) -> u8 {
        match self {
            ArchProofStatus::Ok => 0,
            ArchProofStatus::Partial => 1,
            ArchProofStatus::Unavailable => 2,
        }
    }
}

/// `archproof`: the answer to a `getarchproof`.
///
/// Payload: request id u64 LE, status u8 (0 ok, 1 partial, 2 unavailable),
/// answered u16 LE (outpoints the proof covers: the first `answered` of the
/// request), CompactSize len (≤ 3,900,000; 0 when unavailable), then the
/// proof in its binary form (`docs/archive.md` §6, [`ProofBatch::to_bytes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchProof {
    /// The request's id.
    pub request_id: u64,
    /// Whether the proof covers all, some or none of the request.
    pub status: ArchProofStatus,
    /// Outpoints covered (the first `answered` of the request).
    pub answered: u16,
    /// The proof's binary form (empty when unavailable).
    pub proof: Vec<u8>,
}

impl ArchProof {
    /// The payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.proof.len());
        out.extend_from_slice(&self.request_id.to_le_bytes());
        out.push(self.status.byte());
        out.extend_from_slice(&self.answered.to_le_bytes());
        out.extend_from_slice(&serialize(&VarInt(self.proof.len() as u64)));
        out.extend_from_slice(&self.proof);
        out
    }

    /// The message, ready for the codec.
    pub fn to_message(&self) -> NetworkMessage {
        unknown(ARCHPROOF, self.encode())
    }

    /// Decodes a payload (for clients), bounded. The proof bytes are not
    /// decoded here: pass them to [`crate::archive::verify_bytes`].
    ///
    /// # Errors
    /// Length, status and consistency errors (an unavailable answer with a
    /// proof, an ok/partial one without).
    pub fn decode(b: &[u8]) -> Result<ArchProof, ArchiveMessageError> {
        const C: &str = ARCHPROOF;
        if b.len() < 12 {
            return Err(too_short(C, b.len(), 12));
        }
        let request_id = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
        let status = match b[8] {
            0 => ArchProofStatus::Ok,
            1 => ArchProofStatus::Partial,
            2 => ArchProofStatus::Unavailable,
            _ => {
                return Err(ArchiveMessageError::Invalid {
                    command: C,
                    field: "status",
                })
            }
        };
        let answered = u16::from_le_bytes([b[9], b[10]]);
        let (len, used) = compact_size(C, "proof length", b, 11)?;
        if len > MAX_ARCHPROOF_PROOF_BYTES as u64 {
            return Err(ArchiveMessageError::Count {
                command: C,
                what: "proof length",
                count: len,
                max: MAX_ARCHPROOF_PROOF_BYTES as u64,
            });
        }
        let at = 11 + used;
        let expected = at + len as usize;
        if b.len() != expected {
            return Err(too_short(C, b.len(), expected));
        }
        let consistent = match status {
            ArchProofStatus::Unavailable => answered == 0 && len == 0,
            _ => answered >= 1 && answered as usize <= MAX_OUTPOINTS_PER_REQUEST && len > 0,
        };
        if !consistent {
            return Err(ArchiveMessageError::Invalid {
                command: C,
                field: "answered / proof length for this status",
            });
        }
        Ok(ArchProof {
            request_id,
            status,
            answered,
            proof: b[at..].to_vec(),
        })
    }
}

/// Runs a blocking backend call off the executor; `None` if it panicked.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let span = tracing::Span::current();
    match tokio::task::spawn_blocking(move || span.in_scope(f)).await {
        Ok(v) => Some(v),
        Err(e) => {
            warn!(error = %e, "archive backend call failed");
            None
        }
    }
}

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
pub(crate) fn node_epochs(cs: &ChainSnapshot, start: u32, count: u16) -> ArchEpochs {
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
pub(crate) fn node_proof(
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
pub(crate) fn node_ready(cs: &ChainSnapshot, best_header_height: u32) -> bool {
    let a = cs.archive();
    let tip = cs.index().tip_height();
    let final_height = tip.saturating_sub(crate::sozu::PURGE_DEPTH);
    a.next_epoch() > 0
        && (tip < crate::sozu::PURGE_DEPTH || a.next_sealable(final_height).is_none())
        && tip >= best_header_height
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::hashes::Hash;
    use proptest::prelude::*;

    fn op(b: u8, vout: u32) -> OutPoint {
        OutPoint {
            txid: Txid::from_byte_array([b; 32]),
            vout,
        }
    }

    #[test]
    fn service_bit_is_24() {
        assert_eq!(archive_service().to_u64(), 0x0100_0000);
        let taken = ServiceFlags::NETWORK | ServiceFlags::WITNESS | ServiceFlags::COMPACT_FILTERS;
        assert_eq!(NODE_ARCHIVE_PROOFS & taken.to_u64(), 0);
    }

    #[test]
    fn commands_fit_the_12_byte_field() {
        for c in [GETARCHEPOCH, ARCHEPOCHS, GETARCHPROOF, ARCHPROOF] {
            assert!(c.len() <= 12, "{c}");
            assert!(CommandString::try_from(c.to_owned()).is_ok());
        }
    }

    #[test]
    fn getarchepoch_exact_bytes_and_limits() {
        let m = GetArchEpochs {
            start: 0x0102_0304,
            count: 2000,
        };
        assert_eq!(m.encode(), [4, 3, 2, 1, 0xd0, 0x07]);
        assert_eq!(GetArchEpochs::decode(&m.encode()).unwrap(), m);
        for bad in [[0u8, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0xd1, 0x07]] {
            assert!(matches!(
                GetArchEpochs::decode(&bad),
                Err(ArchiveMessageError::Count { .. })
            ));
        }
        assert!(matches!(
            GetArchEpochs::decode(&[0, 0, 0, 0, 1, 0, 0]),
            Err(ArchiveMessageError::Length { len: 7, .. })
        ));
    }

    #[test]
    fn getarchproof_exact_bytes() {
        let m = GetArchProof {
            request_id: 7,
            txoutproofs: true,
            epoch: Some(3),
            outpoints: vec![op(0xaa, 0x0102_0304)],
        };
        let mut want = vec![7, 0, 0, 0, 0, 0, 0, 0, 3, 3, 0, 0, 0, 1];
        want.extend_from_slice(&[0xaa; 32]);
        want.extend_from_slice(&[4, 3, 2, 1]);
        assert_eq!(m.encode(), want);
        assert_eq!(GetArchProof::decode(&want).unwrap(), m);
    }

    #[test]
    fn getarchproof_rejects_bad_requests() {
        let good = GetArchProof {
            request_id: 1,
            txoutproofs: false,
            epoch: None,
            outpoints: vec![op(1, 0), op(2, 0)],
        };
        let b = good.encode();
        assert_eq!(GetArchProof::decode(&b).unwrap(), good);
        // Truncated, trailing byte.
        assert!(GetArchProof::decode(&b[..b.len() - 1]).is_err());
        let mut long = b.clone();
        long.push(0);
        assert!(GetArchProof::decode(&long).is_err());
        // Unknown flag; epoch without the flag.
        let mut f = b.clone();
        f[8] = 4;
        assert!(GetArchProof::decode(&f).is_err());
        let mut e = b.clone();
        e[9] = 1;
        assert!(GetArchProof::decode(&e).is_err());
        // Duplicate.
        let dup = GetArchProof {
            outpoints: vec![op(1, 0), op(1, 0)],
            ..good.clone()
        };
        assert!(matches!(
            GetArchProof::decode(&dup.encode()),
            Err(ArchiveMessageError::DuplicateOutpoint { .. })
        ));
        // 1,001 announced (no bytes behind): refused by the count.
        let mut over = b[..13].to_vec();
        over.extend_from_slice(&[0xfd, 0xe9, 0x03]);
        assert!(matches!(
            GetArchProof::decode(&over),
            Err(ArchiveMessageError::Count { count: 1001, .. })
        ));
        // Zero outpoints; non-canonical CompactSize (0xfd 0x02 0x00).
        let mut zero = b[..13].to_vec();
        zero.push(0);
        assert!(GetArchProof::decode(&zero).is_err());
        let mut noncanon = b[..13].to_vec();
        noncanon.extend_from_slice(&[0xfd, 2, 0]);
        noncanon.extend_from_slice(&b[14..]);
        assert!(GetArchProof::decode(&noncanon).is_err());
    }

    #[test]
    fn archproof_and_archepochs_round_trip_and_consistency() {
        let p = ArchProof {
            request_id: u64::MAX,
            status: ArchProofStatus::Partial,
            answered: 3,
            proof: vec![9; 300],
        };
        let b = p.encode();
        assert_eq!(&b[8..11], &[1, 3, 0]);
        assert_eq!(&b[11..14], &[0xfd, 0x2c, 0x01]);
        assert_eq!(ArchProof::decode(&b).unwrap(), p);
        let un = ArchProof {
            request_id: 1,
            status: ArchProofStatus::Unavailable,
            answered: 0,
            proof: vec![],
        };
        assert_eq!(ArchProof::decode(&un.encode()).unwrap(), un);
        let bad = ArchProof {
            answered: 1,
            ..un.clone()
        };
        assert!(ArchProof::decode(&bad.encode()).is_err());
        let h = EpochHeader {
            epoch: 0,
            first_height: 0,
            last_height: 143,
            leaf_count: 2,
            root: [1; 32],
            prev: [0; 32],
        };
        let e = ArchEpochs {
            start: 0,
            sealed: 1,
            commitment: h.hash(),
            headers: vec![h],
        };
        let b = e.encode();
        assert_eq!(b.len(), 4 + 4 + 32 + 1 + 81);
        assert_eq!(b[40], 1);
        assert_eq!(ArchEpochs::decode(&b).unwrap(), e);
        assert!(ArchEpochs::decode(&b[..b.len() - 1]).is_err());
    }

    #[test]
    fn oversized_answers_shrink_to_a_fitting_prefix() {
        let ops: Vec<OutPoint> = (0..1000).map(|i| op(1, i)).collect();
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

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = GetArchEpochs::decode(&bytes);
            let _ = ArchEpochs::decode(&bytes);
            let _ = GetArchProof::decode(&bytes);
            let _ = ArchProof::decode(&bytes);
        }

        #[test]
        fn getarchproof_round_trips(
            id in any::<u64>(),
            tx in any::<bool>(),
            epoch in proptest::option::of(any::<u32>()),
            n in 1usize..300,
        ) {
            let m = GetArchProof {
                request_id: id,
                txoutproofs: tx,
                epoch,
                outpoints: (0..n).map(|i| op((i % 251) as u8, i as u32)).collect(),
            };
            prop_assert_eq!(GetArchProof::decode(&m.encode()).unwrap(), m);
        }
    }
}
