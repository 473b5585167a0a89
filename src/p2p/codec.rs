//! Bounded wire codec for Bitcoin P2P messages (protocol 70016).
//!
//! A message on the wire is a 24-byte header followed by the payload:
//!
//! | bytes | field | checked here |
//! | --- | --- | --- |
//! | 0..4 | network magic | must equal the node's network magic |
//! | 4..16 | command, ASCII, NUL padded | printable ASCII, then only NULs (Core's `IsCommandValid`) |
//! | 16..20 | payload length, u32 LE | ≤ [`MAX_PAYLOAD`] (4,000,000 bytes) *before* any allocation |
//! | 20..24 | checksum: first 4 bytes of sha256d(payload) | must match |
//!
//! The payload is then decoded with [`bitcoin::p2p`] types, after the
//! CompactSize count of every peer-sized vector has been checked against
//! Bitcoin Core's caps (`net_processing.cpp`: `MAX_HEADERS_RESULTS`,
//! `MAX_INV_SZ`, `MAX_ADDR_TO_SEND`, `MAX_LOCATOR_SZ`) so no vector is sized
//! by a count the peer chose. Trailing bytes after a known payload are an
//! error. Unknown commands decode to [`NetworkMessage::Unknown`]; the peer
//! logic ignores them.
//!
//! Reading is incremental: the payload buffer grows as bytes arrive (starting
//! at most [`INITIAL_BUFFER`] bytes), so a peer announcing 4 MB and sending
//! nothing costs us nothing.

use std::io;
use std::time::Duration;

use bitcoin::block::Header;
use bitcoin::consensus::encode::{self, deserialize_partial, Decodable, VarInt};
use bitcoin::hashes::{sha256d, Hash};
use bitcoin::p2p::message::{CommandString, NetworkMessage, RawNetworkMessage};
use bitcoin::p2p::Magic;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Maximum payload size in bytes (Core's `MAX_PROTOCOL_MESSAGE_LENGTH`).
pub const MAX_PAYLOAD: u32 = 4_000_000;
/// Size of the message header in bytes.
pub const HEADER_LEN: usize = 24;
/// Maximum headers in one `headers` message (Core's `MAX_HEADERS_RESULTS`).
pub const MAX_HEADERS: u64 = 2_000;
/// Maximum entries in `inv`, `getdata`, `notfound` (Core's `MAX_INV_SZ`).
pub const MAX_INV: u64 = 50_000;
/// Maximum entries in `addr` / `addrv2` (Core's `MAX_ADDR_TO_SEND`).
pub const MAX_ADDR: u64 = 1_000;
/// Maximum block locator length in `getheaders` / `getblocks` (Core's
/// `MAX_LOCATOR_SZ`).
pub const MAX_LOCATOR: u64 = 101;
/// Maximum filter hashes in one `cfheaders` (BIP157 `MAX_CFHEADERS_RESULTS`).
pub const MAX_CFHEADERS: u64 = 2_000;
/// Initial payload buffer: the buffer grows only as bytes actually arrive.
pub const INITIAL_BUFFER: usize = 64 * 1024;

/// What went wrong reading or decoding one message. Every variant except
/// [`CodecError::Io`] is the peer's fault and ends the connection; only
/// those [`CodecError::discourages`] names also discourage the peer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The socket failed or closed (including EOF in the middle of a message).
    #[error("i/o error reading message: {source}")]
    Io {
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The first 4 bytes are not our network's magic.
    #[error("bad magic {got:02x?}, expected {expected:02x?}")]
    BadMagic {
        /// Our network's magic.
        expected: [u8; 4],
        /// What the peer sent.
        got: [u8; 4],
    },
    /// The 12-byte command is not printable ASCII followed by NUL padding.
    #[error("malformed command bytes {raw:02x?}")]
    BadCommand {
        /// The raw command field.
        raw: [u8; 12],
    },
    /// The header announces a payload above [`MAX_PAYLOAD`].
    #[error("{command}: payload length {len} bytes exceeds {max}")]
    PayloadTooLarge {
        /// The command.
        command: String,
        /// Announced payload length in bytes.
        len: u32,
        /// The limit in bytes.
        max: u32,
    },
    /// The checksum does not match the payload.
    #[error("{command}: bad checksum {got:02x?}, payload hashes to {expected:02x?}")]
    BadChecksum {
        /// The command.
        command: String,
        /// First 4 bytes of sha256d(payload).
        expected: [u8; 4],
        /// The checksum in the header.
        got: [u8; 4],
    },
    /// A vector's CompactSize count is above the protocol cap.
    #[error("{command}: {count} items exceeds the limit of {max}")]
    TooManyItems {
        /// The command.
        command: String,
        /// The count announced.
        count: u64,
        /// The cap.
        max: u64,
    },
    /// The payload does not decode as the command's type.
    #[error("{command}: malformed payload: {source}")]
    Malformed {
        /// The command.
        command: String,
        /// The decoding error.
        #[source]
        source: encode::Error,
    },
    /// The payload decoded but bytes were left over.
    #[error("{command}: {extra} trailing bytes after the payload")]
    TrailingBytes {
        /// The command.
        command: String,
        /// Bytes left over.
        extra: usize,
    },
}

impl CodecError {
    /// Whether Bitcoin Core discourages a peer for this (`Misbehaving` in
    /// `net_processing.cpp`, v28): only for a vector over its cap in
    /// `headers` (2,000), `inv` and `getdata` (50,000), `addr` and `addrv2`
    /// (1,000). Core never penalises a framing error (wrong magic, command
    /// bytes, length or checksum: `V1Transport` drops the message or the
    /// connection) nor a payload that does not decode (`ProcessMessages`
    /// catches the exception and drops the message), and only disconnects
    /// for an over-long locator; kakehi disconnects for all of these, and
    /// discourages where Core does.
    pub fn discourages(&self) -> bool {
        matches!(
            self,
            CodecError::TooManyItems { command, .. }
                if matches!(command.as_str(), "headers" | "inv" | "getdata" | "addr" | "addrv2")
        )
    }
}

/// A parsed, checked 24-byte message header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// The command, without NUL padding.
    pub command: String,
    /// Payload length in bytes (≤ [`MAX_PAYLOAD`]).
    pub len: u32,
    /// The checksum the peer sent.
    pub checksum: [u8; 4],
}

/// Parses and checks a 24-byte header: magic, command syntax, payload length.
///
/// # Errors
/// [`CodecError::BadMagic`], [`CodecError::BadCommand`],
/// [`CodecError::PayloadTooLarge`].
pub fn parse_header(bytes: &[u8; HEADER_LEN], magic: Magic) -> Result<FrameHeader, CodecError> {
    let mut got = [0u8; 4];
    got.copy_from_slice(&bytes[0..4]);
    if got != magic.to_bytes() {
        return Err(CodecError::BadMagic {
            expected: magic.to_bytes(),
            got,
        });
    }
    let mut raw = [0u8; 12];
    raw.copy_from_slice(&bytes[4..16]);
    let end = raw.iter().position(|b| *b == 0).unwrap_or(12);
    if end == 0
        || !raw[..end].iter().all(|b| (0x20..0x7f).contains(b))
        || !raw[end..].iter().all(|b| *b == 0)
    {
        return Err(CodecError::BadCommand { raw });
    }
    let command = String::from_utf8_lossy(&raw[..end]).into_owned();
    let len = u32::from_le_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
    if len > MAX_PAYLOAD {
        return Err(CodecError::PayloadTooLarge {
            command,
            len,
            max: MAX_PAYLOAD,
        });
    }
    let mut checksum = [0u8; 4];
    checksum.copy_from_slice(&bytes[20..24]);
    Ok(FrameHeader {
        command,
        len,
        checksum,
    })
}

/// Checks the checksum and decodes `payload` as `header.command`, with count
/// caps and no trailing bytes. Unknown commands give
/// [`NetworkMessage::Unknown`].
///
/// # Errors
/// [`CodecError::BadChecksum`], [`CodecError::TooManyItems`],
/// [`CodecError::Malformed`], [`CodecError::TrailingBytes`].
pub fn decode_payload(header: &FrameHeader, payload: &[u8]) -> Result<NetworkMessage, CodecError> {
    let hash = sha256d::Hash::hash(payload);
    let expected = [hash[0], hash[1], hash[2], hash[3]];
    if expected != header.checksum {
        return Err(CodecError::BadChecksum {
            command: header.command.clone(),
            expected,
            got: header.checksum,
        });
    }
    let cmd = header.command.as_str();
    let d = Dec { cmd, payload };
    let msg = match cmd {
        "version" => NetworkMessage::Version(d.whole()?),
        "verack" => d.empty(NetworkMessage::Verack)?,
        "sendheaders" => d.empty(NetworkMessage::SendHeaders)?,
        "getaddr" => d.empty(NetworkMessage::GetAddr)?,
        "mempool" => d.empty(NetworkMessage::MemPool)?,
        "wtxidrelay" => d.empty(NetworkMessage::WtxidRelay)?,
        "sendaddrv2" => d.empty(NetworkMessage::SendAddrV2)?,
        "filterclear" => d.empty(NetworkMessage::FilterClear)?,
        "addr" => {
            d.cap(0, MAX_ADDR)?;
            NetworkMessage::Addr(d.whole()?)
        }
        "addrv2" => {
            d.cap(0, MAX_ADDR)?;
            NetworkMessage::AddrV2(d.whole()?)
        }
        "inv" => {
            d.cap(0, MAX_INV)?;
            NetworkMessage::Inv(d.whole()?)
        }
        "getdata" => {
            d.cap(0, MAX_INV)?;
            NetworkMessage::GetData(d.whole()?)
        }
        "notfound" => {
            d.cap(0, MAX_INV)?;
            NetworkMessage::NotFound(d.whole()?)
        }
        "getheaders" => {
            d.cap(4, MAX_LOCATOR)?;
            NetworkMessage::GetHeaders(d.whole()?)
        }
        "getblocks" => {
            d.cap(4, MAX_LOCATOR)?;
            NetworkMessage::GetBlocks(d.whole()?)
        }
        "headers" => {
            d.cap(0, MAX_HEADERS)?;
            NetworkMessage::Headers(d.headers()?)
        }
        "block" => NetworkMessage::Block(d.whole()?),
        "tx" => NetworkMessage::Tx(d.whole()?),
        "ping" => NetworkMessage::Ping(d.whole()?),
        "pong" => NetworkMessage::Pong(d.whole()?),
        "feefilter" => NetworkMessage::FeeFilter(d.whole()?),
        "getcfilters" => NetworkMessage::GetCFilters(d.whole()?),
        "cfilter" => NetworkMessage::CFilter(d.whole()?),
        "getcfheaders" => NetworkMessage::GetCFHeaders(d.whole()?),
        "cfheaders" => {
            d.cap(1 + 32 + 32, MAX_CFHEADERS)?;
            NetworkMessage::CFHeaders(d.whole()?)
        }
        "getcfcheckpt" => NetworkMessage::GetCFCheckpt(d.whole()?),
        "cfcheckpt" => NetworkMessage::CFCheckpt(d.whole()?),
        "sendcmpct" => NetworkMessage::SendCmpct(d.whole()?),
        "reject" => NetworkMessage::Reject(d.whole()?),
        // Everything else (compact blocks, bloom filters, alert, and commands
        // we do not know) is passed up undecoded and ignored by the peer logic.
        _ => NetworkMessage::Unknown {
            command: CommandString::try_from(header.command.clone()).map_err(|_| {
                CodecError::BadCommand {
                    raw: command_bytes(&header.command),
                }
            })?,
            payload: payload.to_vec(),
        },
    };
    Ok(msg)
}

fn command_bytes(command: &str) -> [u8; 12] {
    let mut raw = [0u8; 12];
    for (dst, src) in raw.iter_mut().zip(command.bytes()) {
        *dst = src;
    }
    raw
}

struct Dec<'a> {
    cmd: &'a str,
    payload: &'a [u8],
}

impl Dec<'_> {
    fn malformed(&self, source: encode::Error) -> CodecError {
        CodecError::Malformed {
            command: self.cmd.to_owned(),
            source,
        }
    }

    /// Decodes the whole payload as `T`, rejecting trailing bytes.
    fn whole<T: Decodable>(&self) -> Result<T, CodecError> {
        let (value, used) =
            deserialize_partial::<T>(self.payload).map_err(|e| self.malformed(e))?;
        self.end(used)?;
        Ok(value)
    }

    fn end(&self, used: usize) -> Result<(), CodecError> {
        if used != self.payload.len() {
            return Err(CodecError::TrailingBytes {
                command: self.cmd.to_owned(),
                extra: self.payload.len().saturating_sub(used),
            });
        }
        Ok(())
    }

    fn empty(&self, msg: NetworkMessage) -> Result<NetworkMessage, CodecError> {
        self.end(0)?;
        Ok(msg)
    }

    /// Checks the CompactSize count at `offset` against `max`.
    fn cap(&self, offset: usize, max: u64) -> Result<(), CodecError> {
        let rest = self.payload.get(offset..).unwrap_or(&[]);
        let (count, _) = deserialize_partial::<VarInt>(rest).map_err(|e| self.malformed(e))?;
        if count.0 > max {
            return Err(CodecError::TooManyItems {
                command: self.cmd.to_owned(),
                count: count.0,
                max,
            });
        }
        Ok(())
    }

    /// `headers`: CompactSize count, then per header 80 bytes and a zero
    /// transaction count. The count is capped by [`Dec::cap`] beforehand.
    fn headers(&self) -> Result<Vec<Header>, CodecError> {
        let mut r = self.payload;
        let count = VarInt::consensus_decode(&mut r)
            .map_err(|e| self.malformed(e))?
            .0;
        let mut out = Vec::with_capacity(count.min(MAX_HEADERS) as usize);
        for _ in 0..count {
            out.push(Header::consensus_decode(&mut r).map_err(|e| self.malformed(e))?);
            let txs = VarInt::consensus_decode(&mut r)
                .map_err(|e| self.malformed(e))?
                .0;
            if txs != 0 {
                return Err(self.malformed(encode::Error::ParseFailed(
                    "headers message carries transactions",
                )));
            }
        }
        if !r.is_empty() {
            return Err(CodecError::TrailingBytes {
                command: self.cmd.to_owned(),
                extra: r.len(),
            });
        }
        Ok(out)
    }
}

/// Reads one message from `reader`: the 24-byte header (no time limit: an
/// idle peer is the ping logic's business), then the payload within
/// `body_timeout` (growing the buffer only as bytes arrive), then decodes it.
///
/// Not cancel safe: run it in a task of its own (the peer's reader task), not
/// directly in a `select!`.
///
/// # Errors
/// Every [`CodecError`]; [`CodecError::Io`] with `UnexpectedEof` when the
/// peer closes mid-message, `TimedOut` when the payload is too slow.
pub async fn read_message<R: AsyncRead + Unpin>(
    reader: &mut R,
    magic: Magic,
    body_timeout: Duration,
) -> Result<NetworkMessage, CodecError> {
    let mut head = [0u8; HEADER_LEN];
    reader
        .read_exact(&mut head)
        .await
        .map_err(|source| CodecError::Io { source })?;
    let header = parse_header(&head, magic)?;
    let len = header.len as usize;
    let mut payload = Vec::with_capacity(len.min(INITIAL_BUFFER));
    let mut limited = (&mut *reader).take(len as u64);
    let got = tokio::time::timeout(body_timeout, limited.read_to_end(&mut payload))
        .await
        .map_err(|_| CodecError::Io {
            source: io::ErrorKind::TimedOut.into(),
        })?
        .map_err(|source| CodecError::Io { source })?;
    if got != len {
        return Err(CodecError::Io {
            source: io::ErrorKind::UnexpectedEof.into(),
        });
    }
    decode_payload(&header, &payload)
}

/// Decodes one complete message from the front of `bytes`; returns it with
/// the number of bytes used. For tests and fuzzing; the network path is
/// [`read_message`].
///
/// # Errors
/// Every [`CodecError`]; [`CodecError::Io`] with `UnexpectedEof` when
/// `bytes` is shorter than the message.
pub fn decode_frame(bytes: &[u8], magic: Magic) -> Result<(NetworkMessage, usize), CodecError> {
    let eof = || CodecError::Io {
        source: io::ErrorKind::UnexpectedEof.into(),
    };
    let head: &[u8; HEADER_LEN] = bytes
        .get(..HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(eof)?;
    let header = parse_header(head, magic)?;
    let end = HEADER_LEN + header.len as usize;
    let payload = bytes.get(HEADER_LEN..end).ok_or_else(eof)?;
    Ok((decode_payload(&header, payload)?, end))
}

/// Serializes `msg` with header and checksum for network `magic`.
pub fn encode_message(magic: Magic, msg: NetworkMessage) -> Vec<u8> {
    bitcoin::consensus::serialize(&RawNetworkMessage::new(magic, msg))
}

/// Frames an already-serialized payload (for instance a stored block) as
/// `command`: header (magic, NUL-padded command, length, checksum) then the
/// payload, byte for byte. `command` must be ASCII of at most 12 bytes
/// (callers pass constants).
pub fn encode_raw(magic: Magic, command: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&magic.to_bytes());
    out.extend_from_slice(&command_bytes(command));
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    let hash = sha256d::Hash::hash(payload);
    out.extend_from_slice(&hash[..4]);
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::p2p::message_blockdata::{GetHeadersMessage, Inventory};
    use bitcoin::BlockHash;
    use proptest::prelude::*;

    const M: Magic = Magic::REGTEST;

    fn frame(command: &str, payload: &[u8]) -> Vec<u8> {
        encode_raw(M, command, payload)
    }

    #[test]
    fn verack_exact_bytes() {
        // Header of an empty regtest verack: magic, "verack" NUL padded,
        // length 0, checksum of the empty string = 5df6e0e2.
        let bytes = encode_message(M, NetworkMessage::Verack);
        assert_eq!(
            bytes,
            [
                0xfa, 0xbf, 0xb5, 0xda, b'v', b'e', b'r', b'a', b'c', b'k', 0, 0, 0, 0, 0, 0, 0, 0,
                0, 0, 0x5d, 0xf6, 0xe0, 0xe2
            ]
        );
        let (msg, used) = decode_frame(&bytes, M).unwrap();
        assert_eq!(msg, NetworkMessage::Verack);
        assert_eq!(used, 24);
    }

    #[test]
    fn ping_round_trip_exact_bytes() {
        let bytes = encode_message(M, NetworkMessage::Ping(0x0102030405060708));
        assert_eq!(&bytes[24..], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&bytes[16..20], &[8, 0, 0, 0]);
        assert_eq!(
            decode_frame(&bytes, M).unwrap().0,
            NetworkMessage::Ping(0x0102030405060708)
        );
    }

    #[test]
    fn bad_magic() {
        let mut bytes = encode_message(M, NetworkMessage::Verack);
        bytes[0] = 0xf9;
        assert!(
            matches!(decode_frame(&bytes, M), Err(CodecError::BadMagic { got, .. }) if got[0] == 0xf9)
        );
    }

    #[test]
    fn bad_checksum() {
        let mut bytes = encode_message(M, NetworkMessage::Ping(7));
        bytes[20] ^= 1;
        assert!(matches!(
            decode_frame(&bytes, M),
            Err(CodecError::BadChecksum { .. })
        ));
    }

    #[test]
    fn oversized_length_rejected_from_header_alone() {
        let mut head = [0u8; 24];
        head[..4].copy_from_slice(&M.to_bytes());
        head[4..9].copy_from_slice(b"block");
        head[16..20].copy_from_slice(&4_000_001u32.to_le_bytes());
        assert!(matches!(
            parse_header(&head, M),
            Err(CodecError::PayloadTooLarge { len: 4_000_001, .. })
        ));
        head[16..20].copy_from_slice(&4_000_000u32.to_le_bytes());
        assert!(parse_header(&head, M).is_ok());
    }

    #[test]
    fn bad_command_padding() {
        let mut bytes = encode_message(M, NetworkMessage::Verack);
        bytes[15] = b'x'; // "verack\0\0\0\0\0x": non-NUL after NUL
        assert!(matches!(
            decode_frame(&bytes, M),
            Err(CodecError::BadCommand { .. })
        ));
    }

    #[test]
    fn headers_cap_checked_before_decoding() {
        // 2,001 announced, no header bytes at all: rejected by the count.
        let mut payload = vec![0xfd];
        payload.extend_from_slice(&2001u16.to_le_bytes());
        let err = decode_frame(&frame("headers", &payload), M).unwrap_err();
        assert!(
            matches!(
                err,
                CodecError::TooManyItems {
                    count: 2001,
                    max: 2000,
                    ..
                }
            ),
            "{err}"
        );
        // 2,000 announced but missing: malformed, not a cap error.
        let mut payload = vec![0xfd];
        payload.extend_from_slice(&2000u16.to_le_bytes());
        let err = decode_frame(&frame("headers", &payload), M).unwrap_err();
        assert!(matches!(err, CodecError::Malformed { .. }), "{err}");
    }

    #[test]
    fn inv_cap() {
        let inv = vec![Inventory::Block(BlockHash::all_zeros()); 50_001];
        let bytes = encode_message(M, NetworkMessage::Inv(inv));
        assert!(matches!(
            decode_frame(&bytes, M),
            Err(CodecError::TooManyItems {
                count: 50_001,
                max: 50_000,
                ..
            })
        ));
        let inv = vec![Inventory::Block(BlockHash::all_zeros()); 50_000];
        let bytes = encode_message(M, NetworkMessage::GetData(inv.clone()));
        assert_eq!(
            decode_frame(&bytes, M).unwrap().0,
            NetworkMessage::GetData(inv)
        );
    }

    #[test]
    fn addr_and_locator_caps() {
        let mut payload = vec![0xfd];
        payload.extend_from_slice(&1001u16.to_le_bytes());
        assert!(matches!(
            decode_frame(&frame("addr", &payload), M),
            Err(CodecError::TooManyItems { count: 1001, .. })
        ));
        assert!(matches!(
            decode_frame(&frame("addrv2", &payload), M),
            Err(CodecError::TooManyItems { count: 1001, .. })
        ));
        let gh = GetHeadersMessage::new(vec![BlockHash::all_zeros(); 102], BlockHash::all_zeros());
        let bytes = encode_message(M, NetworkMessage::GetHeaders(gh));
        assert!(matches!(
            decode_frame(&bytes, M),
            Err(CodecError::TooManyItems {
                count: 102,
                max: 101,
                ..
            })
        ));
        let gh = GetHeadersMessage::new(vec![BlockHash::all_zeros(); 101], BlockHash::all_zeros());
        let bytes = encode_message(M, NetworkMessage::GetHeaders(gh.clone()));
        assert_eq!(
            decode_frame(&bytes, M).unwrap().0,
            NetworkMessage::GetHeaders(gh)
        );
    }

    #[test]
    fn trailing_bytes_rejected() {
        let err = decode_frame(&frame("ping", &[1, 2, 3, 4, 5, 6, 7, 8, 9]), M).unwrap_err();
        assert!(
            matches!(err, CodecError::TrailingBytes { extra: 1, .. }),
            "{err}"
        );
        let err = decode_frame(&frame("verack", &[0]), M).unwrap_err();
        assert!(
            matches!(err, CodecError::TrailingBytes { extra: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn unknown_command_is_not_an_error() {
        let (msg, _) = decode_frame(&frame("kakehi-x", &[1, 2, 3]), M).unwrap();
        match msg {
            NetworkMessage::Unknown { command, payload } => {
                assert_eq!(command.to_string(), "kakehi-x");
                assert_eq!(payload, vec![1, 2, 3]);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn headers_with_transactions_rejected() {
        let header = bitcoin::constants::genesis_block(bitcoin::Network::Regtest).header;
        let mut payload = vec![1];
        payload.extend_from_slice(&bitcoin::consensus::serialize(&header));
        payload.push(1);
        assert!(matches!(
            decode_frame(&frame("headers", &payload), M),
            Err(CodecError::Malformed { .. })
        ));
        *payload.last_mut().unwrap() = 0;
        let (msg, _) = decode_frame(&frame("headers", &payload), M).unwrap();
        assert_eq!(msg, NetworkMessage::Headers(vec![header]));
    }

    #[tokio::test]
    async fn async_reader_stops_at_eof_without_allocating_claimed_size() {
        // Announces 4,000,000 bytes, sends 10: EOF error, no panic.
        let mut bytes = M.to_bytes().to_vec();
        bytes.extend_from_slice(&command_bytes("block"));
        bytes.extend_from_slice(&4_000_000u32.to_le_bytes());
        bytes.extend_from_slice(&[0; 4]);
        bytes.extend_from_slice(&[0; 10]);
        let mut r = &bytes[..];
        let err = read_message(&mut r, M, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, CodecError::Io { .. }));
        let good = encode_message(M, NetworkMessage::Pong(5));
        let mut r = &good[..];
        assert_eq!(
            read_message(&mut r, M, Duration::from_secs(5))
                .await
                .unwrap(),
            NetworkMessage::Pong(5)
        );
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_frame(&bytes, M);
        }

        #[test]
        fn arbitrary_payloads_never_panic(
            cmd in prop::sample::select(vec![
                "version", "addr", "addrv2", "inv", "getdata", "notfound", "getheaders",
                "getblocks", "headers", "block", "tx", "ping", "feefilter", "getcfilters",
                "getcfheaders", "cfheaders", "getcfcheckpt", "cfcheckpt", "sendcmpct", "reject",
            ]),
            payload in proptest::collection::vec(any::<u8>(), 0..400),
        ) {
            let _ = decode_frame(&frame(cmd, &payload), M);
        }

        #[test]
        fn ping_round_trips(n in any::<u64>()) {
            let bytes = encode_message(M, NetworkMessage::Ping(n));
            prop_assert_eq!(decode_frame(&bytes, M).unwrap(), (NetworkMessage::Ping(n), 32));
        }
    }
}
