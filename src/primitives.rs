//! Primitives every layer shares: block ids, outpoint keys and coins.
//!
//! The chain index allocates [`BlockId`]s, the Sozu table, the stores, the
//! validation and the archive all name blocks by them and outpoints by
//! [`OutPointKey`]; [`Coin`] is an output as validation and the UTXO table
//! see it. This module depends on nothing of kakehi's, so any layer may
//! import it (the Sozu table re-exports these for its own API).

use bitcoin::hashes::Hash;
use bitcoin::{Amount, OutPoint, Txid};

/// A 4-byte identifier given once to every block the node connects, stale
/// blocks included (the Sozu paper: "4-bytes integers are sufficient to uniquely
/// identify all blocks in existence"). Allocated by the chain index in
/// arrival order; `BlockId(0)` is the genesis block.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
pub struct BlockId(pub u32);

/// The serialized key of an entry: 32-byte txid (internal byte order)
/// followed by the output index `vout` as 4 bytes big-endian, so byte order
/// equals (txid, vout) order. 36 bytes.
pub type OutPointKey = [u8; 36];

/// Encodes an outpoint as its 36-byte key (txid internal order, vout BE).
pub fn outpoint_key(outpoint: &OutPoint) -> OutPointKey {
    let mut key = [0u8; 36];
    key[..32].copy_from_slice(outpoint.txid.as_byte_array());
    key[32..].copy_from_slice(&outpoint.vout.to_be_bytes());
    key
}

/// The script hash of a scriptPubKey: its SHA-256, in the digest's own
/// byte order (Esplora's `/scripthash/:hash` and Electrum's
/// `blockchain.scripthash.*` key; Electrum prints it reversed, Esplora
/// does not). 32 bytes.
pub fn script_hash(script_pubkey: &[u8]) -> [u8; 32] {
    bitcoin::hashes::sha256::Hash::hash(script_pubkey).to_byte_array()
}

/// Decodes a 36-byte key back into an outpoint (inverse of [`outpoint_key`]).
pub fn key_outpoint(key: &OutPointKey) -> OutPoint {
    let mut txid = [0u8; 32];
    txid.copy_from_slice(&key[..32]);
    let mut vout = [0u8; 4];
    vout.copy_from_slice(&key[32..]);
    OutPoint {
        txid: Txid::from_byte_array(txid),
        vout: u32::from_be_bytes(vout),
    }
}

/// The immutable part of a transaction output as the table stores it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Coin {
    /// The output's amount (0..=21,000,000 BTC; stored as satoshis, u64 LE).
    pub value: Amount,
    /// The output's scriptPubKey, 0..=10,000 bytes (larger outputs are
    /// unspendable and never enter the table).
    pub script_pubkey: Vec<u8>,
    /// Height of the block that created the output (the first production
    /// block; a transaction re-included on a competing branch at another
    /// height keeps the height of the branch asked about, see
    /// `sozu::Entry::creation_height_in`).
    pub height: u32,
    /// Whether the output belongs to a coinbase transaction (maturity 100).
    pub coinbase: bool,
}
