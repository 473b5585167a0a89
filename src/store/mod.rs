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

mod batch;
pub mod budgets;
pub mod byte_cache;
mod codec;
pub mod durable;
mod error;
pub mod fault;
pub mod flatfile;
pub mod headers;
pub mod history;
mod meta;
mod records;
pub mod runs;
mod sled_open;
pub mod sled_watch;
pub mod spent;
mod tree;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bitcoin::{OutPoint, Txid};

pub use budgets::Budgets;
pub use flatfile::{sync_concurrently, FileLoc, FlatFileError, FlatFiles, FlatPos, FlatReader};
pub use history::HistoryKey;

pub use batch::{RowBatch, WriteBatch};
pub use codec::Codec;
pub use error::StoreError;
pub use meta::{
    FORMAT_VERSION, META_ADDRESS_INDEX, META_FLAT_BLOCKS, META_FLAT_FILTERS, META_FLAT_HEADERS,
    META_FLAT_SPENT, META_MUHASH, META_ROWS_LOG, META_SOZU_BASE, META_SOZU_LAST, META_TIP,
};
pub use records::{txid_prefix, BlockRecord, SpendRecord, SpendRowKey, TxRowKey, TXID_PREFIX_LEN};
pub use sled_open::SledOpenError;
pub use spent::{SpentRecord, SpentRecordError};
pub use tree::{Trees, TypedTree};

use meta::{check_format, META_FORMAT};
use records::spend_prefix;

use crate::primitives::BlockId;

/// Default page cache of the index database (sled's `cache_capacity`),
/// MiB: 128 (config `index.cache_mib`). sled's own default (1 GiB) made a
/// headers sync of 1M headers use 1.4 GiB of RSS; the block index the node
/// keeps in memory serves every hot read, so the database's cache only
/// needs the recent rows.
pub const DEFAULT_INDEX_CACHE_MIB: usize = 128;

/// Opens the row store of the database at `path` (`path/rows`) and checks
/// it against the database's metadata: a database with a format version
/// (`versioned`) has a row manifest, and the row log reaches the position
/// of the last commit ([`META_ROWS_LOG`]).
fn open_rows(
    path: &Path,
    trees: &Trees,
    versioned: bool,
    options: runs::RowOptions,
) -> Result<runs::RowSets, StoreError> {
    // A fresh database gets its row manifest before its format version: a
    // database with a version and no manifest lost it.
    let (rows, created) = runs::RowSets::open(&path.join("rows"), options)?;
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

/// sled 0.34's one data file in the database directory.
const SLED_DB_FILE: &str = "db";

/// Fsyncs the database directory (the entries of the files sled created)
/// and sled's `db` file, and returns the file, open for the commits'
/// fsyncs ([`Store::sync_db_file`]).
fn sled_files_synced(path: &Path) -> Result<Arc<std::fs::File>, StoreError> {
    let failed = |path: &Path| {
        let path = path.to_path_buf();
        move |source: std::io::Error| StoreError::Write {
            path,
            source: source.into(),
        }
    };
    durable::sync_dir(path).map_err(failed(path))?;
    let db_path = path.join(SLED_DB_FILE);
    let db = std::fs::File::open(&db_path)
        .and_then(|file| durable::sync_file(&db_path, &file).map(|()| file))
        .map_err(failed(&db_path))?;
    Ok(Arc::new(db))
}

/// Removes the snapshot files sled began and never finished
/// (`snap.<lsn>.generating`) from the database directory `path`.
///
/// sled 0.34.7 writes a snapshot of its page table at every open that
/// replayed log records: to `snap.<lsn>.generating`, synced, then renamed
/// to `snap.<lsn>`; the older snapshots are removed only after the rename.
/// Its open then reads the newest name among the files starting `snap.`,
/// `.generating` ones included, and `snap.<lsn>.generating` sorts after
/// `snap.<lsn>`: a kill during that write (a crash in the node's start-up)
/// left a torn file that the next open took for the snapshot, refusing
/// the database ("Read corrupted data at file offset None",
/// spacejam/sled#1527). Such a file was never the database's snapshot
/// (the rename publishes it), so removing it restores what sled holds
/// without it: the previous snapshot and the log.
///
/// # Errors
/// [`StoreError::Write`] when the directory cannot be listed or a file
/// cannot be removed.
fn remove_unfinished_snapshots(path: &Path) -> Result<(), StoreError> {
    let failed = |source: std::io::Error| StoreError::Write {
        path: path.to_path_buf(),
        source: source.into(),
    };
    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(failed(e)),
    };
    for entry in entries {
        let file = entry.map_err(failed)?.path();
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("snap.") && name.ends_with(".generating") {
            tracing::warn!(path = %file.display(), "removing a snapshot of the index database that sled did not finish (a crash while it was written)");
            durable::remove_file(&file).map_err(failed)?;
        }
    }
    Ok(())
}

/// The index database.
#[derive(Clone, Debug)]
pub struct Store {
    db: sled::Db,
    /// sled's `db` file, fsynced by every commit.
    db_file: Arc<std::fs::File>,
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
    /// `budgets.index_cache_mib` MiB ([`DEFAULT_INDEX_CACHE_MIB`]),
    /// checking its format version, then its row store in `path/rows`
    /// ([`runs::RowSets::open`] with `budgets.rows`). Snapshots sled began
    /// and never finished (`snap.<lsn>.generating`: a crash while sled wrote
    /// one) are removed first.
    ///
    /// # Errors
    /// [`StoreError::FormatMismatch`] for another major version;
    /// [`StoreError::Open`] when sled refuses the files or panics while
    /// recovering them ([`SledOpenError`]); other sled errors;
    /// [`StoreError::Write`] when an unfinished snapshot cannot be removed;
    /// [`StoreError::Rows`] for the row store (a damaged run or manifest,
    /// named); [`StoreError::Corrupt`] when a database with a format
    /// version has no row manifest.
    pub fn open(path: &Path, budgets: &Budgets) -> Result<Self, StoreError> {
        let cache_mib = budgets.index_cache_mib;
        remove_unfinished_snapshots(path)?;
        // sled panics on some damaged files during recovery: caught, and
        // refused like any other corrupt database (`sled_open`).
        let config = sled::Config::new()
            .path(path)
            .mode(sled::Mode::LowSpace)
            .cache_capacity((cache_mib as u64).saturating_mul(1 << 20));
        let db = sled_open::open(config).map_err(|source| StoreError::Open {
            path: path.into(),
            source,
        })?;
        let db_file = sled_files_synced(path)?;
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
        let rows = open_rows(&path, &trees, format.is_some(), budgets.rows)?;
        let store = Store {
            db,
            db_file,
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
            store.sync_db_file()?;
        }
        Ok(store)
    }

    /// Fsyncs sled's `db` file: sled's own flush makes its log writes
    /// stable with `sync_file_range(2)` alone, which writes the pages but
    /// neither the file's metadata nor the disk's cache ("none of these
    /// operations writes out the file's metadata … there are no guarantees
    /// that the data will be available after a crash", the man page), and
    /// fsyncs only from its flusher thread, every 500 ms. Without this a
    /// power cut lost index commits reported durable (`tests/it/power_loss.rs`,
    /// the lazy file system: the index at height 336 under a UTXO table at
    /// 400).
    fn sync_db_file(&self) -> Result<(), StoreError> {
        let path = self.path.join(SLED_DB_FILE);
        durable::sync_file(&path, &self.db_file).map_err(|source| StoreError::Write {
            path,
            source: source.into(),
        })
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
    /// last open (`docs/benchmarks-history.md`, "Row store"). A crash between the rows' flush
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
        self.sync_db_file()?;
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
    use bitcoin::hashes::Hash;

    use super::*;

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
        let s = Store::open(dir.path(), &Budgets::default()).unwrap();
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
        drop(Store::open(dir.path(), &Budgets::default()).unwrap());
        drop(Store::open(dir.path(), &Budgets::default()).unwrap());
        std::fs::remove_file(dir.path().join("rows/MANIFEST")).unwrap();
        let err = Store::open(dir.path(), &Budgets::default()).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("rows/MANIFEST"), "{err}");
    }

    /// A kill -9 while sled writes its snapshot at open (every open that
    /// replayed log writes one: `snap.<lsn>.generating`, renamed to
    /// `snap.<lsn>` once synced) leaves the file half written; sled 0.34.7
    /// then reads it as the newest snapshot (its listing keeps
    /// `.generating` files, and that name sorts after `snap.<lsn>`) and
    /// refuses the database ("Read corrupted data at file offset None",
    /// spacejam/sled#1527; seen once in `tests/it/crash_loop.rs`). The store
    /// opens it, with the rows committed before.
    #[test]
    fn a_snapshot_torn_by_a_kill_during_open_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let txid = Txid::from_byte_array([7; 32]);
        {
            let s = Store::open(dir.path(), &Budgets::default()).unwrap();
            let mut b = WriteBatch::default();
            b.put_tx(&txid, BlockId(3), 1);
            b.put_meta(META_TIP, b"tip");
            s.commit(b).unwrap();
        }
        // Reopened once, so sled has written a complete snapshot.
        drop(Store::open(dir.path(), &Budgets::default()).unwrap());
        let snap = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .starts_with("snap.")
            })
            .expect("sled wrote a snapshot");
        let bytes = std::fs::read(&snap).unwrap();
        let torn = snap.with_file_name(format!(
            "{}.generating",
            snap.file_name().unwrap().to_str().unwrap()
        ));
        std::fs::write(&torn, &bytes[..bytes.len() / 2]).unwrap();

        let s = Store::open(dir.path(), &Budgets::default()).unwrap();
        assert_eq!(s.meta(META_TIP).unwrap().as_deref(), Some(&b"tip"[..]));
        assert_eq!(s.tx_candidates(&txid).unwrap(), vec![(BlockId(3), 1)]);
        assert!(
            !torn.exists(),
            "the torn snapshot was left for sled to read"
        );
    }

    /// Another major version, newer or older (5.1: run files of layout
    /// 1), is refused naming `kakehi reindex-chainstate`.
    #[test]
    fn format_mismatch_refuses_to_open() {
        for (major, minor) in [(9u16, 0u16), (5, 1)] {
            let dir = tempfile::tempdir().unwrap();
            {
                let s = Store::open(dir.path(), &Budgets::default()).unwrap();
                let mut b = WriteBatch::default();
                let mut v = major.to_be_bytes().to_vec();
                v.extend_from_slice(&minor.to_be_bytes());
                b.put_meta(META_FORMAT, &v);
                s.commit(b).unwrap();
            }
            let err = Store::open(dir.path(), &Budgets::default()).unwrap_err();
            assert!(
                matches!(err, StoreError::FormatMismatch { found_major, .. } if found_major == major),
                "{err}"
            );
            assert!(
                err.to_string().contains("kakehi reindex-chainstate"),
                "{err}"
            );
        }
    }
}
