//! Storage of everything but the UTXO table: sled typed trees for the block
//! index and metadata, kakehi's own sorted-run files for the index rows
//! ([`runs`], in `index/rows/`), flat append-only files for bulk data (seed
//! 001's layering).
//!
//! Every sled tree is declared once in [`Trees`], typed with [`TypedTree`],
//! named `value_by_key`, with big-endian keys so byte order is chain order.
//! No other module touches sled or the run files.
//!
//! | tree | where | key | value |
//! | --- | --- | --- | --- |
//! | `meta_by_name` | sled | UTF-8 name | bytes (format version, tip marker, flat-file positions) |
//! | `block_by_id` | sled | `BlockId` u32 BE | [`BlockRecord`] |
//! | `block_id_by_height` | sled | height u32 BE | `BlockId` of the active chain |
//! | `tx_by_txid_prefix` | runs `tx-*.run` | txid prefix (8) ‖ `BlockId` BE ‖ position u32 BE | none |
//! | `spend_by_outpoint_prefix` | runs `spend-*.run` | txid prefix (8) ‖ vout u32 BE ‖ spending `BlockId` BE | none |
//! | `history_by_script_prefix` | runs `history-*.run` | script-hash prefix (8) ‖ height ‖ `BlockId` ‖ position (`store::history`) | none |

pub mod durable;
pub mod fault;
pub mod flatfile;
pub mod headers;
pub mod history;
pub mod runs;
pub mod sled_watch;

use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bitcoin::block::Header;
use bitcoin::consensus::{deserialize, serialize};
use bitcoin::hashes::Hash;
use bitcoin::{BlockHash, OutPoint, Txid};

pub use flatfile::{sync_concurrently, FileLoc, FlatFileError, FlatFiles, FlatPos, FlatReader};
pub use history::HistoryKey;

use crate::chain::index::BlockStatus;
use crate::primitives::BlockId;

/// Format version of the index database: (major, minor). A major mismatch
/// refuses to open; a minor upgrade runs in place.
///
/// 1.1 added `spend_by_outpoint_block`; a 1.0 datadir opens, and the blocks
/// it connected before have no rows there (the HTTP API then reports such
/// outputs spent without the spender once the UTXO table purged them).
///
/// 2.0 (a 1.x datadir is refused: move it aside and re-import or resync):
/// - each spent-output record in the `spent/` flat files ends in a CRC-32
///   (`pipeline::spent`), so a damaged file is refused instead of feeding
///   wrong values to the archive and HTTP answers; 1.x records have none and
///   cannot be told apart;
/// - `block_id_by_hash` is gone: it was written for every block record and
///   never read (the block index, rebuilt from `block_by_id` at open, maps
///   hashes to ids in memory), and its random-order inserts were most of
///   the database's work in a headers sync.
///
/// 2.1: headers accepted without their block (a P2P headers sync) are
/// appended to the `headers/` flat files (`store::headers`, committed
/// length under meta key `flat_headers`) instead of `block_by_id`, so the
/// block ids in `block_by_id` are no longer dense. A 2.0 datadir opens
/// as is. A 2.1 datadir with headers-only blocks is refused by a 2.0
/// build ("not dense"), which changes nothing.
///
/// 3.0 (a 2.x datadir is refused: `kakehi reindex-chainstate` rebuilds it
/// from its block files): the transaction and spend rows keep only what the
/// flat files do not (electrs's layout): `tx_position_by_txid_block` (txid
/// ‖ block → position, 40 bytes a row) became `tx_by_txid_prefix` (txid
/// prefix ‖ block ‖ position, 16 bytes), and `spend_by_outpoint_block`
/// (outpoint ‖ block → spending txid ‖ vin, 76 bytes) became
/// `spend_by_outpoint_prefix` (txid prefix ‖ vout ‖ block, 16 bytes; the
/// spender is read from the block's spent-output record). Readers check a
/// row against the files it points at.
///
/// 4.0 (a 3.x datadir is refused: `kakehi reindex-chainstate` rebuilds it):
/// the address index takes the same layout. `history_by_script` (script
/// hash ‖ height ‖ block ‖ position ‖ kind ‖ vout/vin → txid ‖ value [‖
/// spent outpoint]: 49-byte keys, 40–76-byte values, one row per output and
/// per input) became `history_by_script_prefix` (script-hash prefix (8) ‖
/// height ‖ block ‖ position: 20 bytes, no value, one row per script and
/// transaction); readers take the txid, values and spent outpoints from the
/// block and spent-output files and check the full script hash there, so
/// neither a prefix shared with another script nor a row left by a block
/// that was never recorded under its id (a crash between the rows' flush
/// and the block records', then another block given the same id) can
/// show.
///
/// 5.0 (a 4.x datadir is refused: `kakehi reindex-chainstate` rebuilds it):
/// the three row trees (`tx_by_txid_prefix`, `spend_by_outpoint_prefix`,
/// `history_by_script_prefix`, same keys) moved out of sled into kakehi's
/// own sorted-run files under `index/rows/` ([`runs`]): sled rewrote their
/// pages at every group (the index was 5x the raw blocks at 26k blocks for
/// 0.3 GB of rows) and replayed every log segment written since the last
/// open at each open (12.6 s at that height).
///
/// 5.1: a commit's rows go to a write-ahead row log (`index/rows/LOG`,
/// one synced record per commit) until 16 MiB of them are in memory, then
/// to run files; the row manifest's layout names the log's generation
/// (`KKHRMAN2`). A 5.0 datadir opens as is (no log: an empty one); a 5.0
/// build refuses a 5.1 row manifest as damaged, naming `kakehi
/// reindex-chainstate`.
pub const FORMAT_VERSION: (u16, u16) = (5, 1);

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Reading the index database failed: sled reported an I/O error or
    /// damaged data (a flipped byte in `db` shows here, at the first read
    /// of the damaged page, not at open).
    #[error("index database at {path}: reading failed: {source}; restore the datadir from a backup or rebuild it with `kakehi reindex-chainstate`")]
    Read {
        /// The database directory.
        path: PathBuf,
        /// sled's error.
        #[source]
        source: sled::Error,
    },
    /// The database files cannot be opened: sled refused them, or panicked
    /// while recovering them (`source` is `None` then). Damaged files.
    #[error(
        "the index database at {path} cannot be opened ({}); restore the datadir from a backup or resync",
        source.as_ref().map_or_else(|| "sled panicked while recovering its files".to_owned(), |e| e.to_string())
    )]
    Open {
        /// The database directory.
        path: PathBuf,
        /// sled's error.
        #[source]
        source: Option<sled::Error>,
    },
    /// Writing a batch to the index database failed (a full disk, an I/O
    /// error): nothing of the batch is durable.
    #[error("index database at {path}: writing failed: {source}")]
    Write {
        /// The database directory.
        path: PathBuf,
        /// sled's error.
        #[source]
        source: sled::Error,
    },
    /// sled's background flusher failed (its fsync or segment rewrite:
    /// [`sled_watch`]), which sled only logs: what it wrote since may not
    /// be durable, so no commit is made after it.
    #[error("index database at {path}: its background flush failed ({message}); writes stopped: restart the node (it recovers to the last commit every store agrees on), or `kakehi reindex-chainstate`")]
    Background {
        /// The database directory.
        path: PathBuf,
        /// sled's logged error, "target: message".
        message: String,
    },
    /// A flat file failed.
    #[error(transparent)]
    Flat(#[from] FlatFileError),
    /// A stored value does not decode, or the database files are damaged.
    #[error(
        "corrupt index database at {path} ({tree}): {reason}; restore the datadir from a backup or rebuild it with `kakehi reindex-chainstate`"
    )]
    Corrupt {
        /// The database directory.
        path: PathBuf,
        /// The tree.
        tree: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// The database was written by an incompatible version of kakehi.
    #[error("index database at {path} has format version {found_major}.{found_minor}; this build reads {major}.x: rebuild the chain state from the block files with `kakehi reindex-chainstate` (see docs/operations.md)")]
    FormatMismatch {
        /// The database directory.
        path: PathBuf,
        /// Its major version.
        found_major: u16,
        /// Its minor version.
        found_minor: u16,
        /// The major version this build reads.
        major: u16,
    },
    /// The row store (`index/rows/`) failed: I/O or a damaged file, named.
    #[error(transparent)]
    Rows(#[from] runs::RunError),
    /// The thread that applies a group's index rows ahead of its commit
    /// could not be started, or stopped: nothing after the last durable
    /// boundary may be committed.
    #[error("index database at {path}: the index rows thread failed: {source}")]
    Thread {
        /// The database directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

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

/// Leading bytes of a txid kept in the keys of `tx_by_txid_prefix` and
/// `spend_by_outpoint_prefix` (electrs's layout): 8 bytes tell 10⁷
/// transactions apart but for about one pair in 2⁴⁰; a row is a candidate,
/// checked against the block (or spent-output) files it points at, which
/// hold the full txids.
pub const TXID_PREFIX_LEN: usize = 8;

/// The first [`TXID_PREFIX_LEN`] bytes of `txid` (internal byte order).
pub fn txid_prefix(txid: &Txid) -> [u8; TXID_PREFIX_LEN] {
    let mut p = [0u8; TXID_PREFIX_LEN];
    p.copy_from_slice(&txid.as_byte_array()[..TXID_PREFIX_LEN]);
    p
}

/// Key of `tx_by_txid_prefix` (16 bytes, value empty): txid prefix (8) ‖
/// `BlockId` u32 BE ‖ position in the block u32 BE. A candidate location
/// of every transaction whose txid starts with the prefix.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TxRowKey {
    /// [`txid_prefix`] of the transaction.
    pub prefix: [u8; TXID_PREFIX_LEN],
    /// A block that contains it.
    pub block: BlockId,
    /// Its position in that block.
    pub position: u32,
}

impl TxRowKey {
    /// The 16-byte key.
    pub fn to_bytes(&self) -> [u8; runs::TX_KEY] {
        let mut k = [0u8; runs::TX_KEY];
        k[..TXID_PREFIX_LEN].copy_from_slice(&self.prefix);
        k[8..12].copy_from_slice(&self.block.0.to_be_bytes());
        k[12..].copy_from_slice(&self.position.to_be_bytes());
        k
    }
}

impl Codec for TxRowKey {
    fn encode(&self) -> Vec<u8> {
        self.to_bytes().to_vec()
    }
    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != TXID_PREFIX_LEN + 8 {
            return None;
        }
        let (prefix, rest) = b.split_at(TXID_PREFIX_LEN);
        Some(TxRowKey {
            prefix: prefix.try_into().ok()?,
            block: BlockId(u32::decode(&rest[..4])?),
            position: u32::decode(&rest[4..])?,
        })
    }
}

/// Key of `spend_by_outpoint_prefix` (16 bytes, value empty): the spent
/// outpoint's txid prefix (8) ‖ its vout u32 BE ‖ the spending block's
/// `BlockId` u32 BE. The spender (txid, input) is in that block's
/// spent-output record (`spent/` files), which is checked to name the
/// outpoint.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SpendRowKey {
    /// [`txid_prefix`] of the spent outpoint's txid.
    pub prefix: [u8; TXID_PREFIX_LEN],
    /// The spent outpoint's output index.
    pub vout: u32,
    /// A connected block that spends an outpoint with this prefix and vout.
    pub block: BlockId,
}

impl SpendRowKey {
    /// The 16-byte key.
    pub fn to_bytes(&self) -> [u8; runs::SPEND_KEY] {
        let mut k = [0u8; runs::SPEND_KEY];
        k[..12].copy_from_slice(&spend_prefix(&self.prefix, self.vout));
        k[12..].copy_from_slice(&self.block.0.to_be_bytes());
        k
    }
}

impl Codec for SpendRowKey {
    fn encode(&self) -> Vec<u8> {
        self.to_bytes().to_vec()
    }
    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != TXID_PREFIX_LEN + 8 {
            return None;
        }
        let (prefix, rest) = b.split_at(TXID_PREFIX_LEN);
        Some(SpendRowKey {
            prefix: prefix.try_into().ok()?,
            vout: u32::decode(&rest[..4])?,
            block: BlockId(u32::decode(&rest[4..])?),
        })
    }
}

/// The 12-byte key prefix of an outpoint in `spend_by_outpoint_prefix`.
fn spend_prefix(prefix: &[u8; TXID_PREFIX_LEN], vout: u32) -> [u8; TXID_PREFIX_LEN + 4] {
    let mut v = [0u8; TXID_PREFIX_LEN + 4];
    v[..TXID_PREFIX_LEN].copy_from_slice(prefix);
    v[TXID_PREFIX_LEN..].copy_from_slice(&vout.to_be_bytes());
    v
}

/// The spender of an outpoint: the spending transaction and its input.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SpendRecord {
    /// The spending transaction.
    pub txid: Txid,
    /// Its input that spends the outpoint.
    pub vin: u32,
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

/// What the index database keeps per block.
///
/// Layout (all integers big-endian): header (80) ‖ height u32 ‖ chainwork
/// (32, BE) ‖ status u8 ‖ prev u32 (`u32::MAX` = none) ‖ data loc (file u32,
/// offset u64, len u32; len 0 = none) ‖ filter loc (16) ‖ spent loc (16) ‖
/// filter header (32, internal order) ‖ txouts u64 ‖ total sats u64 ‖
/// tx count u32 ‖ reject reason length u8 ‖ reject reason (ASCII).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockRecord {
    /// The 80-byte header.
    pub header: Header,
    /// Height.
    pub height: u32,
    /// Cumulative chainwork, big-endian.
    pub chainwork: [u8; 32],
    /// Validation status.
    pub status: BlockStatus,
    /// Parent id, `None` for genesis.
    pub prev: Option<BlockId>,
    /// Raw block in `blocks/`.
    pub data: Option<FileLoc>,
    /// BIP-158 basic filter in `filters/` (once connected).
    pub filter: Option<FileLoc>,
    /// Spent outputs (prevouts) in `spent/` (once connected).
    pub spent: Option<FileLoc>,
    /// BIP-158 filter header (once connected), internal byte order.
    pub filter_header: [u8; 32],
    /// UTXO count on this block's branch after it (once connected).
    pub txouts: u64,
    /// Sum of those UTXOs, sats.
    pub total_sats: u64,
    /// Number of transactions.
    pub tx_count: u32,
    /// Core-style reject reason when invalid (at most 255 bytes).
    pub reject_reason: String,
}

fn put_loc(v: &mut Vec<u8>, loc: Option<FileLoc>) {
    let l = loc.unwrap_or_default();
    v.extend_from_slice(&l.file.to_be_bytes());
    v.extend_from_slice(&l.offset.to_be_bytes());
    v.extend_from_slice(&(if loc.is_some() { l.len } else { 0 }).to_be_bytes());
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
    fn arr32(&mut self) -> Option<[u8; 32]> {
        self.take(32)?.try_into().ok()
    }
    fn loc(&mut self) -> Option<Option<FileLoc>> {
        let file = self.u32()?;
        let offset = self.u64()?;
        let len = self.u32()?;
        Some((len > 0).then_some(FileLoc { file, offset, len }))
    }
}

impl Codec for BlockRecord {
    fn encode(&self) -> Vec<u8> {
        let mut v = serialize(&self.header);
        v.extend_from_slice(&self.height.to_be_bytes());
        v.extend_from_slice(&self.chainwork);
        v.push(self.status.to_u8());
        v.extend_from_slice(&self.prev.map(|p| p.0).unwrap_or(u32::MAX).to_be_bytes());
        put_loc(&mut v, self.data);
        put_loc(&mut v, self.filter);
        put_loc(&mut v, self.spent);
        v.extend_from_slice(&self.filter_header);
        v.extend_from_slice(&self.txouts.to_be_bytes());
        v.extend_from_slice(&self.total_sats.to_be_bytes());
        v.extend_from_slice(&self.tx_count.to_be_bytes());
        let reason = self.reject_reason.as_bytes();
        let n = reason.len().min(255);
        v.push(n as u8);
        v.extend_from_slice(&reason[..n]);
        v
    }

    fn decode(b: &[u8]) -> Option<Self> {
        let mut r = Reader(b);
        let header: Header = deserialize(r.take(80)?).ok()?;
        let height = r.u32()?;
        let chainwork = r.arr32()?;
        let status = BlockStatus::from_u8(r.u8()?)?;
        let prev = match r.u32()? {
            u32::MAX => None,
            p => Some(BlockId(p)),
        };
        let data = r.loc()?;
        let filter = r.loc()?;
        let spent = r.loc()?;
        let filter_header = r.arr32()?;
        let txouts = r.u64()?;
        let total_sats = r.u64()?;
        let tx_count = r.u32()?;
        let n = r.u8()? as usize;
        let reject_reason = String::from_utf8(r.take(n)?.to_vec()).ok()?;
        if !r.0.is_empty() {
            return None;
        }
        Some(BlockRecord {
            header,
            height,
            chainwork,
            status,
            prev,
            data,
            filter,
            spent,
            filter_header,
            txouts,
            total_sats,
            tx_count,
            reject_reason,
        })
    }
}

/// A sled tree with typed keys and values.
#[derive(Clone, Debug)]
pub struct TypedTree<K, V> {
    name: &'static str,
    tree: sled::Tree,
    /// The database directory, named by every error.
    path: Arc<Path>,
    _types: PhantomData<(K, V)>,
}

impl<K: Codec, V: Codec> TypedTree<K, V> {
    fn open(db: &sled::Db, path: &Arc<Path>, name: &'static str) -> Result<Self, StoreError> {
        let tree = db.open_tree(name).map_err(|source| StoreError::Open {
            path: path.to_path_buf(),
            source: Some(source),
        })?;
        Ok(TypedTree {
            name,
            tree,
            path: path.clone(),
            _types: PhantomData,
        })
    }

    /// [`StoreError::Read`] of this tree's database.
    fn read_err(&self, source: sled::Error) -> StoreError {
        StoreError::Read {
            path: self.path.to_path_buf(),
            source,
        }
    }

    /// [`StoreError::Corrupt`] for an entry of this tree.
    fn corrupt(&self, reason: &'static str) -> StoreError {
        StoreError::Corrupt {
            path: self.path.to_path_buf(),
            tree: self.name,
            reason,
        }
    }

    /// One stored (key, value), decoded.
    fn decode_entry(&self, k: &[u8], v: &[u8]) -> Result<(K, V), StoreError> {
        K::decode(k)
            .zip(V::decode(v))
            .ok_or_else(|| self.corrupt("entry does not decode"))
    }

    /// The value of `key`.
    ///
    /// # Errors
    /// [`StoreError::Read`] (sled failure, damaged files), or
    /// [`StoreError::Corrupt`] if the value does not decode.
    pub fn get(&self, key: &K) -> Result<Option<V>, StoreError> {
        match self.tree.get(key.encode()).map_err(|e| self.read_err(e))? {
            None => Ok(None),
            Some(v) => V::decode(&v)
                .map(Some)
                .ok_or_else(|| self.corrupt("value does not decode")),
        }
    }

    /// Every (key, value) whose key starts with `prefix`, in key order.
    ///
    /// # Errors
    /// [`StoreError::Read`] or [`StoreError::Corrupt`] entries.
    pub fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<(K, V)>, StoreError> {
        let mut out = Vec::new();
        for item in self.tree.scan_prefix(prefix) {
            let (k, v) = item.map_err(|e| self.read_err(e))?;
            out.push(self.decode_entry(&k, &v)?);
        }
        Ok(out)
    }

    /// Calls `f` with every (key, value), in key order, one at a time.
    ///
    /// # Errors
    /// [`StoreError::Read`], [`StoreError::Corrupt`] entries, `f`'s errors.
    pub fn for_each<E: From<StoreError>>(
        &self,
        f: &mut dyn FnMut(K, V) -> Result<(), E>,
    ) -> Result<(), E> {
        for item in self.tree.iter() {
            let (k, v) = item.map_err(|e| self.read_err(e))?;
            let (k, v) = self.decode_entry(&k, &v)?;
            f(k, v)?;
        }
        Ok(())
    }

    /// Every value, in key order.
    ///
    /// # Errors
    /// [`StoreError::Read`] or [`StoreError::Corrupt`] entries.
    pub fn values(&self) -> Result<Vec<V>, StoreError> {
        self.scan_prefix(&[])
            .map(|v| v.into_iter().map(|(_, v)| v).collect())
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

/// Every tree of the index database, declared once.
#[derive(Clone, Debug)]
pub struct Trees {
    /// Metadata by name.
    pub meta_by_name: TypedTree<String, Vec<u8>>,
    /// Block records by id.
    pub block_by_id: TypedTree<BlockId, BlockRecord>,
    /// Active-chain block ids by height.
    pub block_id_by_height: TypedTree<u32, BlockId>,
}

/// A set of changes made durable together ([`Store::commit`]); `#[must_use]`
/// so a batch is never silently dropped.
#[must_use]
#[derive(Default)]
pub struct WriteBatch {
    meta: sled::Batch,
    blocks: sled::Batch,
    by_height: sled::Batch,
    txs: Vec<[u8; runs::TX_KEY]>,
    spends: Vec<[u8; runs::SPEND_KEY]>,
    history: Vec<[u8; runs::HISTORY_KEY]>,
}

impl WriteBatch {
    /// Sets a metadata value.
    pub fn put_meta(&mut self, name: &str, value: &[u8]) {
        self.meta.insert(name.as_bytes(), value);
    }
    /// Removes a metadata value.
    pub fn remove_meta(&mut self, name: &str) {
        self.meta.remove(name.as_bytes());
    }
    /// Writes a block record.
    pub fn put_block(&mut self, id: BlockId, record: &BlockRecord) {
        self.blocks.insert(id.encode(), record.encode());
    }
    /// Sets the active chain's block at `height`.
    pub fn put_active(&mut self, height: u32, id: BlockId) {
        self.by_height.insert(height.encode(), id.encode());
    }
    /// Removes the active chain's block at `height` (after a reorg to a
    /// shorter chain).
    pub fn remove_active(&mut self, height: u32) {
        self.by_height.remove(height.encode());
    }
    /// Records that `txid` is at `position` in `block`.
    pub fn put_tx(&mut self, txid: &Txid, block: BlockId, position: u32) {
        let key = TxRowKey {
            prefix: txid_prefix(txid),
            block,
            position,
        };
        self.txs.push(key.to_bytes());
    }
    /// Records that `block` spends `outpoint` (the spender is in the
    /// block's spent-output record).
    pub fn put_spend(&mut self, outpoint: &OutPoint, block: BlockId) {
        let key = SpendRowKey {
            prefix: txid_prefix(&outpoint.txid),
            vout: outpoint.vout,
            block,
        };
        self.spends.push(key.to_bytes());
    }
    /// Writes one row of the address index (callers give each key once).
    pub fn put_history(&mut self, key: &HistoryKey) {
        self.history.push(key.to_bytes());
    }
    /// Rows of the address index this batch writes.
    pub fn history_rows(&self) -> usize {
        self.history.len()
    }
    /// Takes this batch's index rows (transactions, spends, address
    /// history) out of it, to be applied ahead of the batch's commit with
    /// [`Store::apply_rows`]; the metadata, block records and active chain
    /// stay.
    pub fn take_rows(&mut self) -> RowBatch {
        RowBatch {
            txs: std::mem::take(&mut self.txs),
            spends: std::mem::take(&mut self.spends),
            history: std::mem::take(&mut self.history),
        }
    }
}

/// The index rows of a [`WriteBatch`] (transaction, spend and address
/// history rows), taken out with [`WriteBatch::take_rows`]. Rows of blocks
/// that are not connected are ignored by every reader (format 3.0), so
/// they may reach the database before the commit of their block, in any
/// order with it.
#[must_use]
#[derive(Default)]
pub struct RowBatch {
    txs: Vec<[u8; runs::TX_KEY]>,
    spends: Vec<[u8; runs::SPEND_KEY]>,
    history: Vec<[u8; runs::HISTORY_KEY]>,
}

impl RowBatch {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.txs.len() + self.spends.len() + self.history.len()
    }
    /// Whether it holds no row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Meta key of the format version: major u16 BE ‖ minor u16 BE.
const META_FORMAT: &str = "format_version";
/// Meta key of the tip marker: the active tip's `BlockId`, u32 BE.
pub const META_TIP: &str = "tip";
/// Meta key of the last block whose changes were written to the UTXO table
/// (`BlockId`, u32 BE): one block ahead of the table's own commit after a
/// crash between the two, which start-up then replays.
pub const META_SOZU_LAST: &str = "sozu_last";
/// Meta key of where the UTXO table's writes not yet committed begin, in
/// the same batch as [`META_SOZU_LAST`]: the table's committed tip before
/// them (`BlockId` u32 BE; genesis for an empty table) ‖ the first block
/// written after it (u32 BE). After a crash between the index commit and
/// the table's, start-up checks that the table is at that tip and replays
/// the blocks from the first to `sozu_last` (one block, or a group of
/// blocks made durable together while catching up). Absent in datadirs
/// from before groups: the last block alone, on its parent.
pub const META_SOZU_BASE: &str = "sozu_base";
/// Meta keys of the committed end of each flat-file series (blocks,
/// filters, spent outputs): a [`FlatPos`], file number u32 BE ‖ length u64
/// BE. At open, each series is truncated to it.
pub const META_FLAT_BLOCKS: &str = "flat_blocks";
/// See [`META_FLAT_BLOCKS`].
pub const META_FLAT_FILTERS: &str = "flat_filters";
/// See [`META_FLAT_BLOCKS`].
pub const META_FLAT_SPENT: &str = "flat_spent";
/// See [`META_FLAT_BLOCKS`]: the `headers/` files (since format 2.1).
pub const META_FLAT_HEADERS: &str = "flat_headers";
/// Meta key of the UTXO set's MuHash3072 at the active tip, written in the
/// same batch as [`META_TIP`]: tip `BlockId` u32 BE ‖ numerator (384 bytes
/// LE) ‖ denominator (384 bytes LE) (`src/pipeline/utxo_hash.rs`). Absent or
/// naming another tip (a datadir from before it existed): rebuilt once from
/// the UTXO table at open; no format change needed.
pub const META_MUHASH: &str = "muhash";
/// Meta key of the address index's state (`history_by_script_prefix`): absent =
/// off or never built; `[1]` = complete (rows for every block of the active
/// chain, kept by every later connect); `[0] ‖ next height u32 BE ‖ BlockId
/// u32 BE of the block below it` = being built from the block files, up to
/// there (a build resumes from it while that block is still active).
pub const META_ADDRESS_INDEX: &str = "address_index";
/// Meta key of where the index rows' log ends after the rows of the
/// blocks this commit names ([`runs::LogPosition`]: generation u64 BE ‖
/// end u64 BE; since format 5.1). At open the log must reach it: a crash
/// mid-append tears only records after it, so a shorter log is damaged.
pub const META_ROWS_LOG: &str = "rows_log";

/// Default page cache of the index database (sled's `cache_capacity`),
/// MiB: 128 (config `index.cache_mib`). sled's own default (1 GiB) made a
/// headers sync of 1M headers use 1.4 GiB of RSS; the block index the node
/// keeps in memory serves every hot read, so the database's cache only
/// needs the recent rows.
pub const DEFAULT_INDEX_CACHE_MIB: usize = 128;

/// Checks a stored format version `v` (major u16 BE ‖ minor u16 BE).
fn check_format(path: &Path, trees: &Trees, v: &[u8]) -> Result<(), StoreError> {
    let [a, b, c, d] = v else {
        return Err(trees.meta_by_name.corrupt("bad format_version"));
    };
    let (major, minor) = (u16::from_be_bytes([*a, *b]), u16::from_be_bytes([*c, *d]));
    if major != FORMAT_VERSION.0 {
        return Err(StoreError::FormatMismatch {
            path: path.to_path_buf(),
            found_major: major,
            found_minor: minor,
            major: FORMAT_VERSION.0,
        });
    }
    Ok(())
}

/// Opens the row store of the database at `path` (`path/rows`) and checks
/// it against the database's metadata: a database with a format version
/// (`versioned`) has a row manifest, and the row log reaches the position
/// of the last commit ([`META_ROWS_LOG`]).
fn open_rows(path: &Path, trees: &Trees, versioned: bool) -> Result<runs::RowSets, StoreError> {
    // A fresh database gets its row manifest before its format version: a
    // database with a version and no manifest lost it.
    let (rows, created) = runs::RowSets::open(&path.join("rows"))?;
    if created && versioned {
        return Err(trees
            .meta_by_name
            .corrupt("the row store's manifest (rows/MANIFEST) is missing"));
    }
    if let Some(v) = trees.meta_by_name.get(&META_ROWS_LOG.to_string())? {
        let committed = runs::LogPosition::decode(&v)
            .ok_or_else(|| trees.meta_by_name.corrupt("bad rows_log"))?;
        rows.check_log(committed)?;
    }
    Ok(rows)
}

/// The index database.
#[derive(Clone, Debug)]
pub struct Store {
    db: sled::Db,
    path: Arc<Path>,
    /// Whether [`Store::apply_rows`] applied rows since the last
    /// [`Store::commit`] (shared by the clones): that commit then flushes
    /// them before its transaction, as it does its own rows.
    rows_applied: Arc<AtomicBool>,
    /// The index rows (`rows/` inside the database directory).
    rows: runs::RowSets,
    /// The typed trees.
    pub trees: Trees,
}

impl Store {
    /// Opens (or creates) the database in `path` with a page cache of
    /// `cache_mib` MiB ([`DEFAULT_INDEX_CACHE_MIB`]), checking its format
    /// version, then its row store in `path/rows` ([`runs::RowSets::open`]).
    ///
    /// # Errors
    /// [`StoreError::FormatMismatch`] for another major version; sled errors;
    /// [`StoreError::Rows`] for the row store (a damaged run or manifest,
    /// named); [`StoreError::Corrupt`] when a database with a format
    /// version has no row manifest.
    pub fn open(path: &Path, cache_mib: usize) -> Result<Self, StoreError> {
        // sled panics on some damaged files during recovery (seen with a
        // `db` file cut to half: an index out of bounds); a panic must not
        // escape as a crash, it is a corrupt database like any other. The
        // config is moved in and dropped with whatever state the panic left
        // (hence AssertUnwindSafe): nothing of it is used afterwards.
        let config = sled::Config::new()
            .path(path)
            .mode(sled::Mode::LowSpace)
            .cache_capacity((cache_mib as u64).saturating_mul(1 << 20));
        let db = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || config.open()))
            .map_err(|_| None)
            .and_then(|r| r.map_err(Some))
            .map_err(|source| StoreError::Open {
                path: path.into(),
                source,
            })?;
        let path: Arc<Path> = Arc::from(path);
        let trees = Trees {
            meta_by_name: TypedTree::open(&db, &path, "meta_by_name")?,
            block_by_id: TypedTree::open(&db, &path, "block_by_id")?,
            block_id_by_height: TypedTree::open(&db, &path, "block_id_by_height")?,
        };
        let format = trees.meta_by_name.get(&META_FORMAT.to_string())?;
        if let Some(v) = &format {
            check_format(&path, &trees, v)?;
        }
        let rows = open_rows(&path, &trees, format.is_some())?;
        let store = Store {
            db,
            path,
            trees,
            rows,
            rows_applied: Arc::new(AtomicBool::new(false)),
        };
        if format.is_none() {
            let write_err = |source| StoreError::Write {
                path: store.path.to_path_buf(),
                source,
            };
            let mut v = FORMAT_VERSION.0.to_be_bytes().to_vec();
            v.extend_from_slice(&FORMAT_VERSION.1.to_be_bytes());
            store
                .trees
                .meta_by_name
                .tree
                .insert(META_FORMAT, v)
                .map_err(write_err)?;
            store.db.flush().map_err(write_err)?;
        }
        Ok(store)
    }

    /// Waits until the row store's background compaction requested so far
    /// is done (the end of an import, a shutdown).
    ///
    /// # Errors
    /// [`StoreError::Rows`]: a compaction failed (nothing durable is lost;
    /// the node stops writing, as for any failed write of the index).
    pub fn settle_rows(&self) -> Result<(), StoreError> {
        Ok(self.rows.settle()?)
    }

    /// Stops the row store's background compaction for good (after a
    /// write failure: the node writes nothing more until a restart);
    /// returns once no compaction runs.
    pub fn halt_rows(&self) {
        self.rows.halt();
    }

    /// Reads a metadata value.
    ///
    /// # Errors
    /// [`StoreError::Read`] or [`StoreError::Corrupt`].
    pub fn meta(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.trees.meta_by_name.get(&name.to_string())
    }

    /// Makes `batch` durable: first the rows (transactions, spends, address
    /// history, with every row applied before: [`runs::RowSets::commit`],
    /// one record of the row log synced once, or, past its bounds, one
    /// fsynced run file per tree and the row manifest); then the
    /// metadata, block records and active chain in one sled transaction,
    /// flushed (one durable commit of the chain state).
    ///
    /// The rows are not in sled: a sled transaction reads every key it
    /// writes (its conflict check), sled rewrites its pages at every
    /// flush, and its open replays every log segment written since the
    /// last open (BENCHMARKS.md "Scale"). A crash between the rows' flush
    /// and the transaction leaves rows of blocks the
    /// index does not count as connected, under block ids that the next
    /// blocks accepted after the restart are given again (ids are dense).
    /// No row is trusted for that: every row only names a key prefix, and
    /// readers check it against the block (or spent-output record) now
    /// recorded under its id, so a row left by another block yields
    /// nothing unless it states a fact of this block (then it is this
    /// block's own row, the same key); connecting a block again writes the
    /// same keys.
    ///
    /// # Errors
    /// sled or row-store failure: the chain state (metadata, records,
    /// active chain) is unchanged; some rows may be written.
    pub fn commit(&self, batch: WriteBatch) -> Result<(), StoreError> {
        use sled::Transactional;
        let write_err = |source| StoreError::Write {
            path: self.path.to_path_buf(),
            source,
        };
        let fault_err = |source: std::io::Error| write_err(source.into());
        fault::check(fault::IoOp::Write, &self.path).map_err(fault_err)?;
        self.check_background()?;
        let t = &self.trees;
        let rows = RowBatch {
            txs: batch.txs,
            spends: batch.spends,
            history: batch.history,
        };
        let applied = self.rows_applied.swap(false, Ordering::AcqRel);
        let mut meta = batch.meta;
        if !rows.is_empty() || applied {
            self.apply_rows(rows)?;
            self.rows_applied.store(false, Ordering::Release);
            let logged = self.rows.commit()?;
            meta.insert(META_ROWS_LOG.as_bytes(), &logged.encode()[..]);
        }
        (
            &t.meta_by_name.tree,
            &t.block_by_id.tree,
            &t.block_id_by_height.tree,
        )
            .transaction(|(meta_tree, blocks, by_height)| {
                meta_tree.apply_batch(&meta)?;
                blocks.apply_batch(&batch.blocks)?;
                by_height.apply_batch(&batch.by_height)?;
                Ok::<(), sled::transaction::ConflictableTransactionError<()>>(())
            })
            .map_err(|e| match e {
                sled::transaction::TransactionError::Storage(source) => write_err(source),
                sled::transaction::TransactionError::Abort(()) => StoreError::Corrupt {
                    path: self.path.to_path_buf(),
                    tree: "*",
                    reason: "transaction aborted",
                },
            })?;
        fault::check(fault::IoOp::Sync, &self.path).map_err(fault_err)?;
        self.db.flush().map_err(write_err)?;
        // A background failure logged while this commit ran may concern
        // pages the flush above reported durable.
        self.check_background()
    }

    /// [`StoreError::Background`] once sled has logged a failure of its
    /// background threads ([`sled_watch`]).
    fn check_background(&self) -> Result<(), StoreError> {
        match sled_watch::background_failure() {
            None => Ok(()),
            Some(message) => Err(StoreError::Background {
                path: self.path.to_path_buf(),
                message: message.to_owned(),
            }),
        }
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Applies `rows` to the row store's memory, visible to readers at
    /// once, not durable: the next [`Store::commit`] makes them durable
    /// (row log or run files) before its own transaction. No I/O here.
    ///
    /// # Errors
    /// None today; the signature keeps the rows thread's error path.
    pub fn apply_rows(&self, rows: RowBatch) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        self.rows.txs().insert(rows.txs);
        self.rows.spends().insert(rows.spends);
        self.rows.history().insert(rows.history);
        self.rows_applied.store(true, Ordering::Release);
        Ok(())
    }

    /// Every (block, position) of a transaction whose txid starts as
    /// `txid`'s: candidates, to check against the block (8 bytes of prefix:
    /// another transaction's row shows up about once in 2⁴⁰ lookups at 10⁷
    /// transactions).
    ///
    /// # Errors
    /// [`StoreError::Rows`]: a run failed to read or is damaged.
    pub fn tx_candidates(&self, txid: &Txid) -> Result<Vec<(BlockId, u32)>, StoreError> {
        Ok(self
            .rows
            .txs()
            .scan_prefix(&txid_prefix(txid))?
            .into_iter()
            .map(|k| {
                let u = |i: usize| u32::from_be_bytes([k[i], k[i + 1], k[i + 2], k[i + 3]]);
                (BlockId(u(8)), u(12))
            })
            .collect())
    }

    /// Every connected block that may spend `outpoint` (same txid prefix
    /// and vout): candidates, to check against the block's spent-output
    /// record.
    ///
    /// # Errors
    /// [`StoreError::Rows`]: a run failed to read or is damaged.
    pub fn spend_candidates(&self, outpoint: &OutPoint) -> Result<Vec<BlockId>, StoreError> {
        Ok(self
            .rows
            .spends()
            .scan_prefix(&spend_prefix(&txid_prefix(&outpoint.txid), outpoint.vout))?
            .into_iter()
            .map(|k| BlockId(u32::from_be_bytes([k[12], k[13], k[14], k[15]])))
            .collect())
    }

    /// Whether a transaction whose txid starts as `txid`'s is in any
    /// connected block: `false` proves `txid` was never connected; `true`
    /// may be another transaction with the same prefix.
    ///
    /// # Errors
    /// [`StoreError::Rows`]: a run failed to read or is damaged.
    pub fn tx_maybe_known(&self, txid: &Txid) -> Result<bool, StoreError> {
        Ok(self.rows.txs().has_prefix(&txid_prefix(txid))?)
    }

    /// Bytes the row store holds in memory
    /// ([`runs::RowSets::resident_bytes`]); sled's page cache is not
    /// counted (bounded by the `cache_mib` given to [`Store::open`]).
    pub fn rows_resident_bytes(&self) -> usize {
        self.rows.resident_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_record_exact_bytes_round_trip() {
        let header = bitcoin::blockdata::constants::genesis_block(bitcoin::Network::Regtest).header;
        let rec = BlockRecord {
            header,
            height: 7,
            chainwork: [1u8; 32],
            status: BlockStatus::Valid,
            prev: Some(BlockId(6)),
            data: Some(FileLoc {
                file: 1,
                offset: 8,
                len: 300,
            }),
            filter: None,
            spent: Some(FileLoc {
                file: 0,
                offset: 16,
                len: 3,
            }),
            filter_header: [2u8; 32],
            txouts: 10,
            total_sats: 5_000_000_000,
            tx_count: 1,
            reject_reason: "bad-cb-amount".into(),
        };
        let bytes = rec.encode();
        assert_eq!(
            bytes.len(),
            80 + 4 + 32 + 1 + 4 + 16 * 3 + 32 + 8 + 8 + 4 + 1 + 13
        );
        assert_eq!(&bytes[80..84], &7u32.to_be_bytes());
        assert_eq!(BlockRecord::decode(&bytes), Some(rec));
        assert_eq!(BlockRecord::decode(&bytes[..bytes.len() - 1]), None);
    }

    #[test]
    fn tx_and_spend_rows_exact_bytes_and_prefix_order() {
        let mut bytes = [0xab; 32];
        bytes[8] = 0xcd;
        let txid = Txid::from_byte_array(bytes);
        let mut b = WriteBatch::default();
        b.put_tx(&txid, BlockId(0x0a0b_0c0d), 7);
        let outpoint = OutPoint {
            txid,
            vout: 0x0102_0304,
        };
        b.put_spend(&outpoint, BlockId(5));
        let tx_key = TxRowKey {
            prefix: txid_prefix(&txid),
            block: BlockId(0x0a0b_0c0d),
            position: 7,
        };
        let k = tx_key.encode();
        assert_eq!(k.len(), 16);
        assert_eq!(&k[..8], &[0xab; 8]);
        assert_eq!(&k[8..], &[0x0a, 0x0b, 0x0c, 0x0d, 0, 0, 0, 7]);
        assert_eq!(TxRowKey::decode(&k), Some(tx_key));
        assert_eq!(TxRowKey::decode(&k[..15]), None);
        let spend_key = SpendRowKey {
            prefix: txid_prefix(&txid),
            vout: 0x0102_0304,
            block: BlockId(5),
        };
        let k = spend_key.encode();
        assert_eq!(k.len(), 16);
        assert_eq!(&k[8..], &[1, 2, 3, 4, 0, 0, 0, 5]);
        assert_eq!(SpendRowKey::decode(&k), Some(spend_key));
        assert_eq!(<()>::decode(&[0]), None);

        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path(), DEFAULT_INDEX_CACHE_MIB).unwrap();
        s.commit(b).unwrap();
        // A txid sharing the 8-byte prefix finds the row (a candidate the
        // reader checks); one differing there does not.
        let mut same = bytes;
        same[31] ^= 1;
        let same = Txid::from_byte_array(same);
        assert_eq!(
            s.tx_candidates(&same).unwrap(),
            vec![(BlockId(0x0a0b_0c0d), 7)]
        );
        assert!(s.tx_maybe_known(&txid).unwrap());
        let mut other = bytes;
        other[7] ^= 1;
        let other = Txid::from_byte_array(other);
        assert!(!s.tx_maybe_known(&other).unwrap());
        assert_eq!(s.spend_candidates(&outpoint).unwrap(), vec![BlockId(5)]);
        let next_vout = OutPoint {
            txid,
            vout: outpoint.vout + 1,
        };
        assert!(s.spend_candidates(&next_vout).unwrap().is_empty());
    }

    /// A database with a format version whose row manifest is gone (rows
    /// lost) is refused, not opened empty.
    #[test]
    fn a_lost_row_manifest_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open(dir.path(), DEFAULT_INDEX_CACHE_MIB).unwrap());
        drop(Store::open(dir.path(), DEFAULT_INDEX_CACHE_MIB).unwrap());
        std::fs::remove_file(dir.path().join("rows/MANIFEST")).unwrap();
        let err = Store::open(dir.path(), DEFAULT_INDEX_CACHE_MIB).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("rows/MANIFEST"), "{err}");
    }

    #[test]
    fn format_mismatch_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path(), DEFAULT_INDEX_CACHE_MIB).unwrap();
            let mut b = WriteBatch::default();
            b.put_meta(META_FORMAT, &[0, 9, 0, 0]);
            s.commit(b).unwrap();
        }
        let err = Store::open(dir.path(), DEFAULT_INDEX_CACHE_MIB).unwrap_err();
        assert!(
            matches!(err, StoreError::FormatMismatch { found_major: 9, .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("kakehi reindex-chainstate"),
            "{err}"
        );
    }
}
