//! Archive messages (`docs/archive.md` §8): epoch headers and archival
//! proofs over P2P, under the experimental service bit
//! [`NODE_ARCHIVE_PROOFS`]. This file is the wire format only; serving the
//! requests is `super::archive_serve`.
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
//! Every field is written and read with rust-bitcoin's consensus
//! `Encodable`/`Decodable` (integers little-endian, `VarInt` CompactSizes,
//! `OutPoint`s); only the 81-byte epoch header is kakehi's own layout
//! ([`EpochHeader::encode`]). Decoding is exact and bounded: every count is
//! capped before anything is allocated, the payload length must equal what
//! the counts imply, and CompactSizes must be canonical (rust-bitcoin
//! refuses non-minimal ones). A node answers requests only while it
//! advertises [`NODE_ARCHIVE_PROOFS`] to that peer (the archive has sealed
//! at least one epoch, every epoch final at the tip, and the node is at its
//! best header when the handshake happens). A request it did not advertise
//! for disconnects the peer (not discouraged, as Core does for unadvertised
//! BIP157 requests); a malformed or over-limit request disconnects and
//! discourages it ([`ArchiveMessageError::is_misbehaviour`]).

use std::io::Cursor;

use bitcoin::consensus::encode::{self, serialize, Decodable, Encodable, VarInt};
use bitcoin::io::Write;
use bitcoin::p2p::message::{CommandString, NetworkMessage};
use bitcoin::p2p::ServiceFlags;
use bitcoin::OutPoint;

use crate::archive::header::HEADER_LEN;
use crate::archive::EpochHeader;

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

/// Bytes of one outpoint on the wire (txid 32, vout u32 LE).
const OUTPOINT_LEN: usize = 36;

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

fn wrong_length(command: &'static str, len: usize, expected: usize) -> ArchiveMessageError {
    ArchiveMessageError::Length {
        command,
        len,
        expected,
    }
}

fn unknown(command: &'static str, payload: Vec<u8>) -> NetworkMessage {
    let command = CommandString::try_from_static(command)
        .expect("invariant: the four commands are constant ASCII of at most 12 bytes (unit test)");
    NetworkMessage::Unknown { command, payload }
}

/// Reads a payload's fields in order with rust-bitcoin's `Decodable`,
/// turning a short payload into [`ArchiveMessageError::Length`] (with the
/// minimum the caller checked first) and a non-canonical CompactSize into
/// [`ArchiveMessageError::Invalid`].
struct Fields<'a> {
    command: &'static str,
    r: Cursor<&'a [u8]>,
}

impl<'a> Fields<'a> {
    /// Starts reading `b`, which must hold at least `min` bytes (the fixed
    /// fields before the first count).
    fn new(command: &'static str, b: &'a [u8], min: usize) -> Result<Self, ArchiveMessageError> {
        if b.len() < min {
            return Err(wrong_length(command, b.len(), min));
        }
        Ok(Fields {
            command,
            r: Cursor::new(b),
        })
    }

    fn len(&self) -> usize {
        self.r.get_ref().len()
    }

    fn at(&self) -> usize {
        self.r.position() as usize
    }

    fn read<T: Decodable>(&mut self, field: &'static str) -> Result<T, ArchiveMessageError> {
        let (command, len, at) = (self.command, self.len(), self.at());
        T::consensus_decode(&mut self.r).map_err(|e| match e {
            encode::Error::Io(_) => wrong_length(command, len, at + 1),
            _ => ArchiveMessageError::Invalid { command, field },
        })
    }

    /// A CompactSize count in `lo..=max`.
    fn count(&mut self, what: &'static str, lo: u64, max: u64) -> Result<u64, ArchiveMessageError> {
        let n = self.read::<VarInt>(what)?.0;
        if n < lo || n > max {
            return Err(ArchiveMessageError::Count {
                command: self.command,
                what,
                count: n,
                max,
            });
        }
        Ok(n)
    }

    /// Checks that exactly `n` items of `size` bytes are left (no more, no
    /// fewer) and returns them.
    fn rest_exact(&self, n: usize, size: usize) -> Result<&'a [u8], ArchiveMessageError> {
        let expected = self.at() + n * size;
        if self.len() != expected {
            return Err(wrong_length(self.command, self.len(), expected));
        }
        Ok(&self.r.get_ref()[self.at()..])
    }
}

/// Writes `msg`'s payload into a `Vec`.
fn payload(msg: &impl Encodable) -> Vec<u8> {
    serialize(msg)
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

impl Encodable for GetArchEpochs {
    fn consensus_encode<W: Write + ?Sized>(&self, w: &mut W) -> Result<usize, bitcoin::io::Error> {
        Ok(self.start.consensus_encode(w)? + self.count.consensus_encode(w)?)
    }
}

impl GetArchEpochs {
    /// The 6-byte payload.
    pub fn encode(&self) -> Vec<u8> {
        payload(self)
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
            return Err(wrong_length(GETARCHEPOCH, b.len(), 6));
        }
        let mut f = Fields::new(GETARCHEPOCH, b, 6)?;
        let start = f.read::<u32>("start")?;
        let count = f.read::<u16>("count")?;
        if count == 0 || count > MAX_EPOCHS_PER_MESSAGE {
            return Err(ArchiveMessageError::Count {
                command: GETARCHEPOCH,
                what: "count",
                count: count.into(),
                max: MAX_EPOCHS_PER_MESSAGE.into(),
            });
        }
        Ok(GetArchEpochs { start, count })
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

impl Encodable for ArchEpochs {
    fn consensus_encode<W: Write + ?Sized>(&self, w: &mut W) -> Result<usize, bitcoin::io::Error> {
        let mut n = self.start.consensus_encode(w)?;
        n += self.sealed.consensus_encode(w)?;
        n += self.commitment.consensus_encode(w)?;
        n += VarInt(self.headers.len() as u64).consensus_encode(w)?;
        for h in &self.headers {
            w.write_all(&h.encode())?;
            n += HEADER_LEN;
        }
        Ok(n)
    }
}

impl ArchEpochs {
    /// The payload.
    pub fn encode(&self) -> Vec<u8> {
        payload(self)
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
        let mut f = Fields::new(C, b, 41)?;
        let start = f.read::<u32>("start")?;
        let sealed = f.read::<u32>("sealed")?;
        let commitment = f.read::<[u8; 32]>("commitment")?;
        let k = f.count("header count", 0, MAX_EPOCHS_PER_MESSAGE.into())? as usize;
        let headers = f
            .rest_exact(k, HEADER_LEN)?
            .chunks_exact(HEADER_LEN)
            .map(|c| {
                EpochHeader::decode(c).ok_or(ArchiveMessageError::Invalid {
                    command: C,
                    field: "epoch header",
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ArchEpochs {
            start,
            sealed,
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

impl Encodable for GetArchProof {
    fn consensus_encode<W: Write + ?Sized>(&self, w: &mut W) -> Result<usize, bitcoin::io::Error> {
        let mut flags = 0u8;
        if self.txoutproofs {
            flags |= FLAG_TXOUTPROOFS;
        }
        if self.epoch.is_some() {
            flags |= FLAG_SINGLE_EPOCH;
        }
        let mut n = self.request_id.consensus_encode(w)?;
        n += flags.consensus_encode(w)?;
        n += self.epoch.unwrap_or(0).consensus_encode(w)?;
        n += VarInt(self.outpoints.len() as u64).consensus_encode(w)?;
        for op in &self.outpoints {
            n += op.consensus_encode(w)?;
        }
        Ok(n)
    }
}

impl GetArchProof {
    /// The payload.
    pub fn encode(&self) -> Vec<u8> {
        payload(self)
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
        let mut f = Fields::new(C, b, 14)?;
        let request_id = f.read::<u64>("request id")?;
        let flags = f.read::<u8>("flags")?;
        if flags & !(FLAG_TXOUTPROOFS | FLAG_SINGLE_EPOCH) != 0 {
            return Err(ArchiveMessageError::Invalid {
                command: C,
                field: "flags (unknown bit set)",
            });
        }
        let epoch_field = f.read::<u32>("epoch")?;
        let epoch = match (flags & FLAG_SINGLE_EPOCH != 0, epoch_field) {
            (true, e) => Some(e),
            (false, 0) => None,
            (false, _) => {
                return Err(ArchiveMessageError::Invalid {
                    command: C,
                    field: "epoch (non-zero without the single-epoch flag)",
                })
            }
        };
        let n = f.count("outpoint count", 1, MAX_OUTPOINTS_PER_REQUEST as u64)? as usize;
        f.rest_exact(n, OUTPOINT_LEN)?;
        let mut outpoints = Vec::with_capacity(n);
        let mut seen = std::collections::HashSet::with_capacity(n);
        for _ in 0..n {
            let op = f.read::<OutPoint>("outpoint")?;
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

    fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(ArchProofStatus::Ok),
            1 => Some(ArchProofStatus::Partial),
            2 => Some(ArchProofStatus::Unavailable),
            _ => None,
        }
    }
}

/// `archproof`: the answer to a `getarchproof`.
///
/// Payload: request id u64 LE, status u8 (0 ok, 1 partial, 2 unavailable),
/// answered u16 LE (outpoints the proof covers: the first `answered` of the
/// request), CompactSize len (≤ 3,900,000; 0 when unavailable), then the
/// proof in its binary form (`docs/archive.md` §6, `ProofBatch::to_bytes`).
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

impl Encodable for ArchProof {
    fn consensus_encode<W: Write + ?Sized>(&self, w: &mut W) -> Result<usize, bitcoin::io::Error> {
        let mut n = self.request_id.consensus_encode(w)?;
        n += self.status.byte().consensus_encode(w)?;
        n += self.answered.consensus_encode(w)?;
        // A CompactSize length, then the bytes (Vec<u8>'s consensus form).
        n += self.proof.consensus_encode(w)?;
        Ok(n)
    }
}

impl ArchProof {
    /// The payload.
    pub fn encode(&self) -> Vec<u8> {
        payload(self)
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
        let mut f = Fields::new(C, b, 12)?;
        let request_id = f.read::<u64>("request id")?;
        let status = ArchProofStatus::from_byte(f.read::<u8>("status")?).ok_or(
            ArchiveMessageError::Invalid {
                command: C,
                field: "status",
            },
        )?;
        let answered = f.read::<u16>("answered")?;
        let len = f.count("proof length", 0, MAX_ARCHPROOF_PROOF_BYTES as u64)? as usize;
        let proof = f.rest_exact(len, 1)?.to_vec();
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
            proof,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::hashes::Hash;
    use bitcoin::hex::{DisplayHex, FromHex};
    use bitcoin::Txid;
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

    /// The four payloads byte for byte, written out by hand from the
    /// layouts in the module doc (they were the bytes of the hand-written
    /// encoder this file had before rust-bitcoin's encodings replaced it).
    #[test]
    fn payload_bytes_are_pinned() {
        let hex = |s: &str| Vec::<u8>::from_hex(s).unwrap();
        let h = EpochHeader {
            epoch: 5,
            first_height: 720,
            last_height: 863,
            leaf_count: 3,
            root: [1; 32],
            prev: [2; 32],
        };
        let epochs = ArchEpochs {
            start: 5,
            sealed: 7,
            commitment: [0xcc; 32],
            headers: vec![h],
        };
        let want = format!(
            "0500000007000000{}010100000005000002d00000035f00000003{}{}",
            "cc".repeat(32),
            "01".repeat(32),
            "02".repeat(32)
        );
        assert_eq!(epochs.encode().to_lower_hex_string(), want);
        assert_eq!(ArchEpochs::decode(&hex(&want)).unwrap(), epochs);

        let req = GetArchProof {
            request_id: 0x1122_3344_5566_7788,
            txoutproofs: false,
            epoch: None,
            outpoints: vec![op(0xaa, 1), op(0xbb, 0xffff_fffe)],
        };
        let want = format!(
            "88776655443322110000000000 02{}01000000{}feffffff",
            "aa".repeat(32),
            "bb".repeat(32)
        )
        .replace(' ', "");
        assert_eq!(req.encode().to_lower_hex_string(), want);
        assert_eq!(GetArchProof::decode(&hex(&want)).unwrap(), req);

        let proof = ArchProof {
            request_id: 1,
            status: ArchProofStatus::Ok,
            answered: 2,
            proof: vec![0x5a; 253],
        };
        let want = format!("0100000000000000000200fdfd00{}", "5a".repeat(253));
        assert_eq!(proof.encode().to_lower_hex_string(), want);
        assert_eq!(ArchProof::decode(&hex(&want)).unwrap(), proof);

        let get = GetArchEpochs {
            start: 0x0102_0304,
            count: 2000,
        };
        assert_eq!(get.encode().to_lower_hex_string(), "04030201d007");
    }

    #[test]
    fn getarchepoch_limits() {
        let m = GetArchEpochs {
            start: 0x0102_0304,
            count: 2000,
        };
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
        assert!(matches!(
            GetArchProof::decode(&noncanon),
            Err(ArchiveMessageError::Invalid { .. })
        ));
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
