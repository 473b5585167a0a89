//! Storage of everything but the UTXO table: sled typed trees for indexes
//! and metadata, flat append-only files for bulk data (seed 001's layering).
//!
//! Every tree is declared once in [`Trees`], typed with [`TypedTree`], named
//! `value_by_key`, with big-endian keys so byte order is chain order. No other
//! module touches sled.
//!
//! | tree | key | value |
//! | --- | --- | --- |
//! | `meta_by_name` | UTF-8 name | bytes (format version, tip marker, flat-file positions) |
//! | `block_by_id` | `BlockId` u32 BE | [`BlockRecord`] |
//! | `block_id_by_height` | height u32 BE | `BlockId` of the active chain |
//! | `tx_position_by_txid_block` | txid (32) ‖ `BlockId` BE | position in block, u32 BE |
//! | `spend_by_outpoint_block` | outpoint (36) ‖ `BlockId` BE | spending txid (32) ‖ vin u32 BE |
//! | `history_by_script` | script hash (32) ‖ height ‖ `BlockId` ‖ position ‖ kind ‖ vout/vin | [`HistoryValue`] (`store::history`) |

pub mod fault;
pub mod flatfile;
pub mod headers;
pub mod history;

use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bitcoin::block::Header;
use bitcoin::consensus::{deserialize, serialize};
use bitcoin::hashes::Hash;
use bitcoin::{BlockHash, OutPoint, Txid};

pub use flatfile::{sync_concurrently, FileLoc, FlatFileError, FlatFiles, FlatPos, FlatReader};
pub use history::{HistoryKey, HistoryValue, RowKind};

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
pub const FORMAT_VERSION: (u16, u16) = (2, 1);

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// sled reported an error.
    #[error("index database error: {0}")]
    Sled(#[from] sled::Error),
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
    /// A flat file failed.
    #[error(transparent)]
    Flat(#[from] FlatFileError),
    /// A stored value does not decode, or the database files are damaged.
    #[error(
        "corrupt index database ({tree}): {reason}; restore the datadir from a backup or resync"
    )]
    Corrupt {
        /// The tree.
        tree: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// The database was written by an incompatible version of kakehi.
    #[error("database at {path} has format {found_major}.{found_minor}, this kakehi reads {major}.x: move it aside and re-import or resync (see docs/operations.md)")]
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

/// Key of `tx_position_by_txid_block`: txid then block id (36 bytes).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TxBlockKey {
    /// The transaction.
    pub txid: Txid,
    /// A block that contains it.
    pub block: BlockId,
}

impl Codec for TxBlockKey {
    fn encode(&self) -> Vec<u8> {
        let mut v = self.txid.as_byte_array().to_vec();
        v.extend_from_slice(&self.block.0.to_be_bytes());
        v
    }
    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != 36 {
            return None;
        }
        Some(TxBlockKey {
            txid: Txid::from_byte_array(b[..32].try_into().ok()?),
            block: BlockId(u32::decode(&b[32..])?),
        })
    }
}

/// Key of `spend_by_outpoint_block`: the spent outpoint (txid 32 ‖ vout
/// u32 BE) then the spending block's id (u32 BE), 40 bytes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct OutPointBlockKey {
    /// The spent outpoint.
    pub outpoint: OutPoint,
    /// A block that spends it.
    pub block: BlockId,
}

impl Codec for OutPointBlockKey {
    fn encode(&self) -> Vec<u8> {
        let mut v = outpoint_prefix(&self.outpoint);
        v.extend_from_slice(&self.block.0.to_be_bytes());
        v
    }
    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != 40 {
            return None;
        }
        Some(OutPointBlockKey {
            outpoint: OutPoint {
                txid: Txid::from_byte_array(b[..32].try_into().ok()?),
                vout: u32::decode(&b[32..36])?,
            },
            block: BlockId(u32::decode(&b[36..])?),
        })
    }
}

/// The 36-byte key prefix of an outpoint in `spend_by_outpoint_block`.
fn outpoint_prefix(o: &OutPoint) -> Vec<u8> {
    let mut v = o.txid.as_byte_array().to_vec();
    v.extend_from_slice(&o.vout.to_be_bytes());
    v
}

/// Value of `spend_by_outpoint_block`: the spending transaction's txid (32)
/// ‖ the input index u32 BE, 36 bytes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SpendRecord {
    /// The spending transaction.
    pub txid: Txid,
    /// Its input that spends the outpoint.
    pub vin: u32,
}

impl Codec for SpendRecord {
    fn encode(&self) -> Vec<u8> {
        let mut v = self.txid.as_byte_array().to_vec();
        v.extend_from_slice(&self.vin.to_be_bytes());
        v
    }
    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != 36 {
            return None;
        }
        Some(SpendRecord {
            txid: Txid::from_byte_array(b[..32].try_into().ok()?),
            vin: u32::decode(&b[32..])?,
        })
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
    _types: PhantomData<(K, V)>,
}

impl<K: Codec, V: Codec> TypedTree<K, V> {
    fn open(db: &sled::Db, name: &'static str) -> Result<Self, StoreError> {
        Ok(TypedTree {
            name,
            tree: db.open_tree(name)?,
            _types: PhantomData,
        })
    }

    /// The value of `key`.
    ///
    /// # Errors
    /// sled failure, or [`StoreError::Corrupt`] if the value does not decode.
    pub fn get(&self, key: &K) -> Result<Option<V>, StoreError> {
        match self.tree.get(key.encode())? {
            None => Ok(None),
            Some(v) => V::decode(&v).map(Some).ok_or(StoreError::Corrupt {
                tree: self.name,
                reason: "value does not decode",
            }),
        }
    }

    /// Every (key, value) whose key starts with `prefix`, in key order.
    ///
    /// # Errors
    /// sled failure or corrupt entries.
    pub fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<(K, V)>, StoreError> {
        let mut out = Vec::new();
        for item in self.tree.scan_prefix(prefix) {
            let (k, v) = item?;
            let corrupt = StoreError::Corrupt {
                tree: self.name,
                reason: "entry does not decode",
            };
            out.push((
                K::decode(&k).ok_or(corrupt)?,
                V::decode(&v).ok_or(StoreError::Corrupt {
                    tree: self.name,
                    reason: "entry does not decode",
                })?,
            ));
        }
        Ok(out)
    }

    /// Whether any key starts with `prefix`.
    ///
    /// # Errors
    /// sled failure.
    pub fn has_prefix(&self, prefix: &[u8]) -> Result<bool, StoreError> {
        Ok(self.tree.scan_prefix(prefix).next().transpose()?.is_some())
    }

    /// Calls `f` with every (key, value), in key order, one at a time.
    ///
    /// # Errors
    /// sled failure, corrupt entries, `f`'s errors.
    pub fn for_each<E: From<StoreError>>(
        &self,
        f: &mut dyn FnMut(K, V) -> Result<(), E>,
    ) -> Result<(), E> {
        for item in self.tree.iter() {
            let (k, v) = item.map_err(StoreError::from)?;
            let corrupt = || StoreError::Corrupt {
                tree: self.name,
                reason: "entry does not decode",
            };
            f(
                K::decode(&k).ok_or_else(corrupt)?,
                V::decode(&v).ok_or_else(corrupt)?,
            )?;
        }
        Ok(())
    }

    /// Every value, in key order.
    ///
    /// # Errors
    /// sled failure or corrupt entries.
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
    /// Position of a transaction in each block that contains it.
    pub tx_position_by_txid_block: TypedTree<TxBlockKey, u32>,
    /// The spender of an outpoint in each connected block that spends it
    /// (active or stale; readers pick the active one). Since format 1.1:
    /// a datadir created by 1.0 lacks the rows of the blocks it connected.
    pub spend_by_outpoint_block: TypedTree<OutPointBlockKey, SpendRecord>,
    /// The address index: funding and spending rows by script hash, in
    /// chain order (`store::history`). Written when the address index is
    /// on (meta key [`META_ADDRESS_INDEX`]).
    pub history_by_script: TypedTree<HistoryKey, HistoryValue>,
}

/// A set of changes committed atomically ([`Store::commit`]); `#[must_use]`
/// so a batch is never silently dropped.
#[must_use]
#[derive(Default)]
pub struct WriteBatch {
    meta: sled::Batch,
    blocks: sled::Batch,
    by_height: sled::Batch,
    txs: sled::Batch,
    spends: sled::Batch,
    history: sled::Batch,
    history_rows: usize,
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
    pub fn put_tx(&mut self, txid: Txid, block: BlockId, position: u32) {
        self.txs
            .insert(TxBlockKey { txid, block }.encode(), position.encode());
    }
    /// Records that `block` spends `outpoint` by input `vin` of `txid`.
    pub fn put_spend(&mut self, outpoint: OutPoint, block: BlockId, txid: Txid, vin: u32) {
        self.spends.insert(
            OutPointBlockKey { outpoint, block }.encode(),
            SpendRecord { txid, vin }.encode(),
        );
    }
    /// Writes one row of the address index.
    pub fn put_history(&mut self, key: &HistoryKey, value: &HistoryValue) {
        self.history.insert(key.encode(), value.encode());
        self.history_rows += 1;
    }
    /// Rows of the address index this batch writes.
    pub fn history_rows(&self) -> usize {
        self.history_rows
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
/// Meta key of the address index's state (`history_by_script`): absent =
/// off or never built; `[1]` = complete (rows for every block of the active
/// chain, kept by every later connect); `[0] ‖ next height u32 BE ‖ BlockId
/// u32 BE of the block below it` = being built from the block files, up to
/// there (a build resumes from it while that block is still active).
pub const META_ADDRESS_INDEX: &str = "address_index";

/// Page cache of the index database (sled's `cache_capacity`), bytes:
/// 128 MiB. sled's own default (1 GiB) made a headers sync of 1M headers
/// use 1.4 GiB of RSS; the block index the node keeps in memory serves
/// every hot read, so the database's cache only needs the recent rows.
pub const INDEX_CACHE_BYTES: u64 = 128 * 1024 * 1024;

/// The index database.
#[derive(Clone, Debug)]
pub struct Store {
    db: sled::Db,
    path: Arc<Path>,
    /// The typed trees.
    pub trees: Trees,
}

impl Store {
    /// Opens (or creates) the database in `path`, checking its format
    /// version.
    ///
    /// # Errors
    /// [`StoreError::FormatMismatch`] for another major version; sled errors.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        // sled panics on some damaged files during recovery (seen with a
        // `db` file cut to half: an index out of bounds); a panic must not
        // escape as a crash, it is a corrupt database like any other. The
        // config is moved in and dropped with whatever state the panic left
        // (hence AssertUnwindSafe): nothing of it is used afterwards.
        let config = sled::Config::new()
            .path(path)
            .mode(sled::Mode::LowSpace)
            .cache_capacity(INDEX_CACHE_BYTES);
        let db = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || config.open()))
            .map_err(|_| None)
            .and_then(|r| r.map_err(Some))
            .map_err(|source| StoreError::Open {
                path: path.into(),
                source,
            })?;
        let trees = Trees {
            meta_by_name: TypedTree::open(&db, "meta_by_name")?,
            block_by_id: TypedTree::open(&db, "block_by_id")?,
            block_id_by_height: TypedTree::open(&db, "block_id_by_height")?,
            tx_position_by_txid_block: TypedTree::open(&db, "tx_position_by_txid_block")?,
            spend_by_outpoint_block: TypedTree::open(&db, "spend_by_outpoint_block")?,
            history_by_script: TypedTree::open(&db, "history_by_script")?,
        };
        let store = Store {
            db,
            path: Arc::from(path),
            trees,
        };
        match store.trees.meta_by_name.get(&META_FORMAT.to_string())? {
            None => {
                let mut v = FORMAT_VERSION.0.to_be_bytes().to_vec();
                v.extend_from_slice(&FORMAT_VERSION.1.to_be_bytes());
                store.trees.meta_by_name.tree.insert(META_FORMAT, v)?;
                store.db.flush()?;
            }
            Some(v) if v.len() == 4 => {
                let major = u16::from_be_bytes([v[0], v[1]]);
                let minor = u16::from_be_bytes([v[2], v[3]]);
                if major != FORMAT_VERSION.0 {
                    return Err(StoreError::FormatMismatch {
                        path: path.into(),
                        found_major: major,
                        found_minor: minor,
                        major: FORMAT_VERSION.0,
                    });
                }
            }
            Some(_) => {
                return Err(StoreError::Corrupt {
                    tree: "meta_by_name",
                    reason: "bad format_version",
                })
            }
        }
        Ok(store)
    }

    /// Reads a metadata value.
    ///
    /// # Errors
    /// sled failure.
    pub fn meta(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.trees.meta_by_name.get(&name.to_string())
    }

    /// Applies `batch` atomically across all trees and flushes it to disk
    /// (one durable commit).
    ///
    /// # Errors
    /// sled failure: nothing of the batch is applied.
    pub fn commit(&self, batch: WriteBatch) -> Result<(), StoreError> {
        use sled::Transactional;
        let write_error = |source: std::io::Error| StoreError::Write {
            path: self.path.to_path_buf(),
            source: source.into(),
        };
        fault::check(fault::IoOp::Write, &self.path).map_err(write_error)?;
        let t = &self.trees;
        (
            &t.meta_by_name.tree,
            &t.block_by_id.tree,
            &t.block_id_by_height.tree,
            &t.tx_position_by_txid_block.tree,
            &t.spend_by_outpoint_block.tree,
            &t.history_by_script.tree,
        )
            .transaction(|(meta, blocks, by_height, txs, spends, history)| {
                meta.apply_batch(&batch.meta)?;
                blocks.apply_batch(&batch.blocks)?;
                by_height.apply_batch(&batch.by_height)?;
                txs.apply_batch(&batch.txs)?;
                spends.apply_batch(&batch.spends)?;
                history.apply_batch(&batch.history)?;
                Ok::<(), sled::transaction::ConflictableTransactionError<()>>(())
            })
            .map_err(|e| match e {
                sled::transaction::TransactionError::Storage(source) => StoreError::Write {
                    path: self.path.to_path_buf(),
                    source,
                },
                sled::transaction::TransactionError::Abort(()) => StoreError::Corrupt {
                    tree: "*",
                    reason: "transaction aborted",
                },
            })?;
        fault::check(fault::IoOp::Sync, &self.path).map_err(write_error)?;
        self.db.flush().map_err(|source| StoreError::Write {
            path: self.path.to_path_buf(),
            source,
        })?;
        Ok(())
    }

    /// Every block id that contains `txid`, with the position.
    ///
    /// # Errors
    /// sled failure or corruption.
    pub fn tx_blocks(&self, txid: &Txid) -> Result<Vec<(BlockId, u32)>, StoreError> {
        Ok(self
            .trees
            .tx_position_by_txid_block
            .scan_prefix(txid.as_byte_array())?
            .into_iter()
            .map(|(k, pos)| (k.block, pos))
            .collect())
    }

    /// Every connected block that spends `outpoint`, with the spender.
    ///
    /// # Errors
    /// sled failure or corruption.
    pub fn spenders(&self, outpoint: &OutPoint) -> Result<Vec<(BlockId, SpendRecord)>, StoreError> {
        Ok(self
            .trees
            .spend_by_outpoint_block
            .scan_prefix(&outpoint_prefix(outpoint))?
            .into_iter()
            .map(|(k, v)| (k.block, v))
            .collect())
    }

    /// Whether `txid` is in any stored block.
    ///
    /// # Errors
    /// sled failure.
    pub fn tx_known(&self, txid: &Txid) -> Result<bool, StoreError> {
        self.trees
            .tx_position_by_txid_block
            .has_prefix(txid.as_byte_array())
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
    fn spend_row_exact_bytes_and_prefix_order() {
        let txid = Txid::from_byte_array([0xab; 32]);
        let key = OutPointBlockKey {
            outpoint: OutPoint {
                txid,
                vout: 0x0102_0304,
            },
            block: BlockId(0x0a0b_0c0d),
        };
        let k = key.encode();
        assert_eq!(k.len(), 40);
        assert_eq!(&k[..32], &[0xab; 32]);
        assert_eq!(&k[32..], &[1, 2, 3, 4, 0x0a, 0x0b, 0x0c, 0x0d]);
        assert_eq!(OutPointBlockKey::decode(&k), Some(key));
        assert_eq!(OutPointBlockKey::decode(&k[..39]), None);
        // The 36-byte prefix of an outpoint selects exactly its rows.
        assert_eq!(outpoint_prefix(&key.outpoint), k[..36].to_vec());
        let rec = SpendRecord {
            txid: Txid::from_byte_array([7; 32]),
            vin: 9,
        };
        let v = rec.encode();
        assert_eq!(v.len(), 36);
        assert_eq!(&v[32..], &[0, 0, 0, 9]);
        assert_eq!(SpendRecord::decode(&v), Some(rec));
        assert_eq!(SpendRecord::decode(&v[..35]), None);
    }

    #[test]
    fn format_mismatch_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path()).unwrap();
            let mut b = WriteBatch::default();
            b.put_meta(META_FORMAT, &[0, 9, 0, 0]);
            s.commit(b).unwrap();
        }
        let err = Store::open(dir.path()).unwrap_err();
        assert!(
            matches!(err, StoreError::FormatMismatch { found_major: 9, .. }),
            "{err}"
        );
    }
}
