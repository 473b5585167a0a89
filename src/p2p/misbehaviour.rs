//! Why a peer connection ends: [`Disconnect`], and the rules a peer can
//! break, [`Misbehaviour`] (disconnected and discouraged, as Core's
//! `Misbehaving` with a score of 100).

use super::archive::ArchiveMessageError;
use super::backend::{HeadersError, SubmitError};
use super::codec::CodecError;

/// A rule the peer broke. The peer is disconnected and its IP discouraged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Misbehaviour {
    /// A message the codec refused that Core penalises: a vector over its
    /// cap ([`CodecError::discourages`]).
    #[error("bad message: {0}")]
    Codec(#[source] CodecError),
    /// A message other than version before the handshake.
    #[error("{command} before version")]
    BeforeVersion {
        /// The command.
        command: &'static str,
    },
    /// A `version` whose user agent is longer than
    /// [`MAX_SUBVERSION_LENGTH`](super::peer::MAX_SUBVERSION_LENGTH) bytes.
    #[error("user agent of {len} bytes, limit {max}")]
    UserAgentTooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// Headers refused by the node.
    #[error("headers refused: {0}")]
    Headers(#[source] HeadersError),
    /// Too many unconnecting `headers` messages in a row.
    #[error("{count} unconnecting headers messages in a row")]
    Unconnecting {
        /// Messages in a row.
        count: u32,
    },
    /// A block refused as invalid.
    #[error("invalid block: {0}")]
    Block(#[source] SubmitError),
    /// A filter request for a type other than basic (0).
    #[error("{command}: unsupported filter type {filter_type}")]
    FilterType {
        /// The command.
        command: &'static str,
        /// The type asked.
        filter_type: u8,
    },
    /// A malformed or over-limit archive request (`docs/archive.md` §8).
    #[error("archive message: {0}")]
    Archive(#[source] ArchiveMessageError),
    /// A filter request spanning too many blocks, or start above stop.
    #[error("{command}: start {start_height}, stop height {stop_height}, limit {max}")]
    FilterRange {
        /// The command.
        command: &'static str,
        /// Requested start height.
        start_height: u32,
        /// Height of the stop block.
        stop_height: u32,
        /// The limit in blocks.
        max: u32,
    },
}

/// Why a peer connection ended.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Disconnect {
    /// The peer broke a rule: disconnected and discouraged.
    #[error("misbehaviour: {0}")]
    Misbehaving(#[source] Misbehaviour),
    /// The socket closed or failed.
    #[error("connection closed: {0}")]
    Io(#[source] std::io::Error),
    /// A message that breaks the framing (magic after the first message,
    /// command bytes, length, checksum) or whose payload does not decode:
    /// disconnected, not discouraged (Core drops such a message or the
    /// connection and never penalises it; see `CodecError::discourages`).
    #[error("bad message: {0}")]
    BadMessage(#[source] CodecError),
    /// version/verack not done in time.
    #[error("handshake timeout")]
    HandshakeTimeout,
    /// The peer speaks a protocol older than we accept.
    #[error("obsolete protocol version {0}")]
    ObsoleteVersion(u32),
    /// We connected to ourselves.
    #[error("connected to self")]
    SelfConnection,
    /// Ping not answered in time.
    #[error("ping timeout")]
    PingTimeout,
    /// Our writes did not drain in time (slow reader).
    #[error("write timeout (slow reader)")]
    WriteTimeout,
    /// The header-sync peer did not answer in time.
    #[error("headers sync timeout")]
    HeadersTimeout,
    /// The peer held the block download window past the stall timeout.
    #[error("stalling block download")]
    Stalling,
    /// A block request went unanswered too long.
    #[error("block request timeout")]
    BlockTimeout,
    /// Evicted to make room for a new inbound peer (inbound slots full).
    #[error("evicted for a new inbound peer")]
    Evicted,
    /// The node is shutting down.
    #[error("shutdown")]
    Shutdown,
    /// A message Core answers by disconnecting, without discouraging: a
    /// feature we do not offer (`mempool`, BIP37 `filterload`/`filteradd`/
    /// `filterclear` without NODE_BLOOM), negotiation after `verack`
    /// (BIP339 `wtxidrelay`, BIP155 `sendaddrv2`).
    #[error("{command}: {reason}")]
    Refused {
        /// The command.
        command: &'static str,
        /// Why (Core's log wording).
        reason: &'static str,
    },
    /// The first bytes of an inbound connection are not a v1 message for
    /// our network: a BIP324 v2 initiator (64 bytes of ElligatorSwift key),
    /// or a node of another network. Closed without an answer, so a v2
    /// peer retries in v1 (Core's `V2Transport` fallback); not discouraged
    /// (Core never penalises a wrong message start).
    #[error(
        "not a v1 message for this network (first bytes {got:02x?}); a v2 (BIP324) handshake?"
    )]
    NotV1 {
        /// The four bytes where the magic should be.
        got: [u8; 4],
    },
    /// A request for a service we did not advertise to this peer (an
    /// archive request without `NODE_ARCHIVE_PROOFS`). Not discouraged.
    #[error("{command} without the service advertised")]
    NotAdvertised {
        /// The command.
        command: &'static str,
    },
}

impl Disconnect {
    /// Whether the peer's IP is discouraged (misbehaviour only).
    pub(crate) fn discourage(&self) -> bool {
        matches!(self, Disconnect::Misbehaving(_))
    }
}

pub(crate) fn misbehaving(m: Misbehaviour) -> Disconnect {
    Disconnect::Misbehaving(m)
}

pub(crate) fn refused(command: &'static str, reason: &'static str) -> Disconnect {
    Disconnect::Refused { command, reason }
}

/// The disconnect for a message the codec refused: a socket error is
/// just a closed connection, an over-limit count misbehaviour (discouraged
/// as in Core: [`CodecError::discourages`]), anything else a disconnect
/// without discouragement.
pub(crate) fn codec_disconnect(e: CodecError) -> Disconnect {
    match e {
        CodecError::Io { source } => Disconnect::Io(source),
        e if e.discourages() => misbehaving(Misbehaviour::Codec(e)),
        e => Disconnect::BadMessage(e),
    }
}
