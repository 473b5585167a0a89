//! The fixed byte encoding of the index database's keys and values
//! ([`Codec`]) for the primitive types; the records have theirs beside them
//! (`records`).

use bitcoin::hashes::Hash;
use bitcoin::BlockHash;

use crate::primitives::BlockId;

/// A fixed byte encoding for keys and values.
pub trait Codec: Sized {
    /// Encodes to bytes.
    fn encode(&self) -> Vec<u8>;
    /// Decodes; `None` when the bytes are not a valid encoding.
    fn decode(bytes: &[u8]) -> Option<Self>;
}

impl Codec for u32 {
    fn encode(&self) -> Vec<u8> {
        self.to_be_bytes().to_vec()
    }
    fn decode(b: &[u8]) -> Option<Self> {
        Some(u32::from_be_bytes(b.try_into().ok()?))
    }
}

impl Codec for BlockId {
    fn encode(&self) -> Vec<u8> {
        self.0.encode()
    }
    fn decode(b: &[u8]) -> Option<Self> {
        u32::decode(b).map(BlockId)
    }
}

impl Codec for BlockHash {
    fn encode(&self) -> Vec<u8> {
        self.as_byte_array().to_vec()
    }
    fn decode(b: &[u8]) -> Option<Self> {
        Some(BlockHash::from_byte_array(b.try_into().ok()?))
    }
}

/// The empty value of the rows whose key says everything.
impl Codec for () {
    fn encode(&self) -> Vec<u8> {
        Vec::new()
    }
    fn decode(b: &[u8]) -> Option<Self> {
        b.is_empty().then_some(())
    }
}

impl Codec for Vec<u8> {
    fn encode(&self) -> Vec<u8> {
        self.clone()
    }
    fn decode(b: &[u8]) -> Option<Self> {
        Some(b.to_vec())
    }
}

impl Codec for String {
    fn encode(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
    fn decode(b: &[u8]) -> Option<Self> {
        String::from_utf8(b.to_vec()).ok()
    }
}
