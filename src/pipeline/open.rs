//! Opening the chain state: the stores, the block index, and the reconciliation
//! of the stores after a crash (flat files cut to their committed length, a
//! UTXO-table commit missing after the index's replayed).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use crate::chain::assumevalid::{AssumeValid, AssumeValidState};
use crate::chain::ChainParams;
use crate::muhash::MuHash3072;
use crate::primitives::BlockId;
use crate::snapshot::{ChainSnapshot, Snapshots};
use crate::sozu::UtxoTable;
use crate::store::{
    Budgets, FlatFiles, FlatPos, Store, WriteBatch, META_ADDRESS_INDEX, META_FLAT_BLOCKS,
    META_FLAT_FILTERS, META_FLAT_HEADERS, META_FLAT_SPENT, META_SOZU_BASE, META_SOZU_LAST,
    META_TIP,
};

use super::address_index::AddressIndexState;
use super::{
    group, load, Chainstate, GroupLimits, PipelineError, PipelineStats, MAX_FLAT_FILE_SIZE,
};

pub(super) fn flat_pos_bytes(p: FlatPos) -> Vec<u8> {
    let mut v = p.file.to_be_bytes().to_vec();
    v.extend_from_slice(&p.len.to_be_bytes());
    v
}

/// Decodes a committed flat-file position stored under meta key `name`
/// (see [`META_FLAT_BLOCKS`]); a missing key is a fresh datadir (position 0).
///
/// # Errors
/// [`PipelineError::Inconsistent`] when the value is not 12 bytes: the
/// files must not be truncated to a position read from a corrupt row.
fn flat_pos_from(name: &str, bytes: Option<Vec<u8>>) -> Result<FlatPos, PipelineError> {
    let Some(b) = bytes else {
        return Ok(FlatPos::default());
    };
    let a: [u8; 12] = b
        .as_slice()
        .try_into()
        .map_err(|_| PipelineError::Inconsistent {
            reason: format!(
                "meta key {name} holds {} bytes; a flat-file position has 12",
                b.len()
            ),
        })?;
    let file = u32::from_be_bytes([a[0], a[1], a[2], a[3]]);
    let len = u64::from_be_bytes([a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11]]);
    Ok(FlatPos { file, len })
}

/// The four series of flat files of a datadir, opened at the lengths the
/// index database committed (longer files are cut back to them).
struct FlatSeries {
    blocks: FlatFiles,
    filters: FlatFiles,
    spent: FlatFiles,
    headers: FlatFiles,
}

impl FlatSeries {
    /// Opens `blocks/blk*`, `filters/flt*`, `spent/sp*` and `headers/hdr*`
    /// under `datadir`, framed with the network's `magic`, each at the
    /// position its meta key in `store` holds.
    ///
    /// # Errors
    /// [`PipelineError`] when a position row is corrupt or a file fails.
    fn open(store: &Store, datadir: &Path, magic: [u8; 4]) -> Result<Self, PipelineError> {
        let open =
            |dir: &str, prefix: &'static str, key: &str| -> Result<FlatFiles, PipelineError> {
                let pos = flat_pos_from(key, store.meta(key)?)?;
                Ok(FlatFiles::open(
                    &datadir.join(dir),
                    prefix,
                    magic,
                    MAX_FLAT_FILE_SIZE,
                    pos,
                )?)
            };
        Ok(FlatSeries {
            blocks: open("blocks", "blk", META_FLAT_BLOCKS)?,
            filters: open("filters", "flt", META_FLAT_FILTERS)?,
            spent: open("spent", "sp", META_FLAT_SPENT)?,
            headers: open("headers", "hdr", META_FLAT_HEADERS)?,
        })
    }

    /// Refuses flat files beside an index database that has never committed
    /// (no tip): a new index beside block files is one that was lost (sled
    /// can open a damaged `db` as an empty database), and opening at its
    /// positions would later cut every block away.
    ///
    /// # Errors
    /// [`PipelineError::Inconsistent`] naming the directory and its bytes.
    fn check_empty_for_new_index(&self, datadir: &Path) -> Result<(), PipelineError> {
        for (dir, files) in [
            ("blocks", &self.blocks),
            ("filters", &self.filters),
            ("spent", &self.spent),
            ("headers", &self.headers),
        ] {
            let bytes = files.bytes_past_position()?;
            if bytes > 0 {
                return Err(PipelineError::Inconsistent {
                    reason: format!(
                        "the index database ({}/index) is new, but {}/{dir} holds {bytes} bytes of \
                         records: the index was lost; rebuild it from the block files with \
                         `kakehi reindex-chainstate`, or restore the datadir from a backup",
                        datadir.display(),
                        datadir.display(),
                    ),
                });
            }
        }
        Ok(())
    }
}

impl Chainstate {
    /// Opens the chain state in `datadir` with the UTXO table `table` and
    /// the memory knobs `budgets` (the index database's page cache, the
    /// index rows' memory bound and partition cache, the archive's filter
    /// cache: [`Budgets`]), reconciling the stores
    /// after a crash (flat files truncated to their committed length; a
    /// UTXO-table commit missing after the index's is replayed).
    ///
    /// # Errors
    /// [`PipelineError`] when a store fails or the datadir is inconsistent.
    pub fn open(
        params: ChainParams,
        datadir: &Path,
        table: Box<dyn UtxoTable + Send>,
        budgets: &Budgets,
    ) -> Result<Self, PipelineError> {
        let store = Store::open(&datadir.join("index"), budgets)?;
        let files = FlatSeries::open(&store, datadir, params.magic())?;
        // An index database that has never committed has no tip.
        let new_index = store.meta(META_TIP)?.is_none();
        if new_index {
            files.check_empty_for_new_index(datadir)?;
        }
        let (index, meta) = load::load_index(
            &params,
            &store,
            &files.headers.reader(),
            files.headers.position(),
        )?;
        let archive = crate::archive::Archive::open_with_cache(
            &datadir.join("archive"),
            params.archive_epoch_length,
            budgets.archive_filter_cache,
        )?;
        let utxo = table.reader();
        let datadir: Arc<Path> = Arc::from(datadir);
        let first = ChainSnapshot {
            index: index.core().clone(),
            meta: meta.clone(),
            store: store.clone(),
            blocks: files.blocks.reader(),
            filters: files.filters.reader(),
            spent: files.spent.reader(),
            archive: archive.clone(),
            utxo: utxo.clone(),
            stats: PipelineStats::default(),
            table_counters: None,
            datadir: datadir.clone(),
            muhash: Arc::new(MuHash3072::new()),
            assume_valid: AssumeValid::default_for(&params),
            address_index: false,
        };
        let rows = super::rows::RowWriter::new(store.clone());
        let mut cs = Chainstate {
            sealer: super::sealer::Sealer::new(archive),
            index,
            meta,
            store,
            blocks: files.blocks,
            filters: files.filters,
            spent: files.spent,
            headers: files.headers,
            table,
            utxo,
            refused_tips: HashSet::new(),
            stats: PipelineStats::default(),
            datadir,
            failed: None,
            published: Snapshots::new(first),
            muhash: Arc::new(MuHash3072::new()),
            group_limits: GroupLimits::PER_BLOCK,
            group: None,
            pending: WriteBatch::default(),
            rows,
            assume_valid: AssumeValidState::new(AssumeValid::default_for(&params)),
            last_script_check: None,
            script_threads: std::thread::available_parallelism()
                .unwrap_or(std::num::NonZeroUsize::MIN),
            script_pool: None,
            unwritten: None,
            ahead: None,
            last_reject: None,
            address_index: AddressIndexState {
                write: true,
                complete: false,
            },
        };
        if new_index {
            cs.persist_genesis()?;
        }
        cs.load_address_index()?;
        cs.check_flat_lengths()?;
        cs.reconcile_table()?;
        cs.cut_uncommitted()?;
        cs.load_muhash()?;
        cs.seal_final_epochs()?;
        cs.publish();
        Ok(cs)
    }

    /// Cuts every flat-file series back to its committed position
    /// ([`FlatFiles::cut_uncommitted`]): what a crash appended after the
    /// last commit. Only once the index and the UTXO table agree
    /// ([`Chainstate::reconcile_table`]): an index that lost commits holds
    /// positions before blocks the table connected, and a cut there would
    /// destroy the blocks a reindex needs.
    fn cut_uncommitted(&mut self) -> Result<(), PipelineError> {
        for files in [
            &mut self.blocks,
            &mut self.filters,
            &mut self.spent,
            &mut self.headers,
        ] {
            files.cut_uncommitted()?;
        }
        Ok(())
    }

    /// Persists genesis (its record, the active row at height 0 and the tip
    /// marker) in a new datadir, whose index database has no tip yet.
    ///
    /// # Errors
    /// [`PipelineError::Store`] when the index database fails.
    fn persist_genesis(&mut self) -> Result<(), PipelineError> {
        let mut batch = WriteBatch::default();
        self.put_record(&mut batch, BlockId(0));
        batch.put_active(0, BlockId(0));
        batch.put_meta(META_TIP, &0u32.to_be_bytes());
        // The address index starts complete (genesis has no rows: its
        // output is not spendable, Core never adds it to the UTXO set).
        batch.put_meta(META_ADDRESS_INDEX, &[1]);
        self.store.commit(batch)?;
        Ok(())
    }

    /// Checks that no flat file is shorter than the records the index
    /// points into it: a file truncated after its commit would otherwise
    /// open fine and fail (or serve nothing) only when a record past the cut
    /// is read.
    ///
    /// # Errors
    /// [`PipelineError::Flat`] with [`crate::store::FlatFileError::Truncated`]
    /// naming the file.
    pub(super) fn check_flat_lengths(&self) -> Result<(), PipelineError> {
        use std::collections::BTreeMap;
        let mut ends: [BTreeMap<u32, u64>; 3] = Default::default();
        for m in self.meta.iter() {
            for (series, loc) in [m.data, m.filter, m.spent].into_iter().enumerate() {
                if let Some(loc) = loc {
                    let end = ends[series].entry(loc.file).or_default();
                    *end = (*end).max(loc.offset + u64::from(loc.len));
                }
            }
        }
        let [data, filters, spent] = ends;
        self.blocks.reader().check_lengths(&data)?;
        self.filters.reader().check_lengths(&filters)?;
        self.spent.reader().check_lengths(&spent)?;
        Ok(())
    }

    /// Replays the last boundary's writes to the UTXO table if the table's
    /// commit did not happen (crash between the index's commit and the
    /// table's): one block, or the group of blocks that boundary made
    /// durable.
    pub(super) fn reconcile_table(&mut self) -> Result<(), PipelineError> {
        let Some(last) = self
            .store
            .meta(META_SOZU_LAST)?
            .and_then(|b| <u32 as crate::store::Codec>::decode(&b))
        else {
            // No block was ever connected per the index: the table must be
            // empty too (an index database that lost its rows would
            // otherwise open at genesis beside a full table).
            return match self.table.committed() {
                None => Ok(()),
                Some(tag) => Err(PipelineError::Inconsistent {
                    reason: format!(
                        "the UTXO table ({}/utxo) holds blocks up to height {}, but the index \
                         database ({}/index) has none connected: it lost its rows; rebuild both from \
                         the block files with `kakehi reindex-chainstate`, or restore the datadir \
                         from a backup",
                        self.datadir.display(),
                        tag.height,
                        self.datadir.display()
                    ),
                }),
            };
        };
        let last = BlockId(last);
        let committed = self.table.committed().map(|t| t.block);
        if committed == Some(last) {
            return Ok(());
        }
        let Some(entry) = self.index.get(last).cloned() else {
            return Err(PipelineError::Inconsistent {
                reason: format!("sozu_last {} not in the index", last.0),
            });
        };
        // Only the last boundary's table commit may be missing (the index
        // commits first): the table must be exactly where that boundary's
        // writes began. A table further behind lost commits it had made
        // durable, and replaying on top of it would build a wrong UTXO set.
        let (base, first) = match self.store.meta(META_SOZU_BASE)? {
            Some(b) => group::decode_base(&b).ok_or_else(|| PipelineError::Inconsistent {
                reason: format!("meta key {META_SOZU_BASE} holds {} bytes, not 8", b.len()),
            })?,
            // A datadir from before groups: one block on its parent.
            None => (entry.prev.unwrap_or(BlockId(0)), last),
        };
        if committed.unwrap_or(BlockId(0)) != base {
            let table_height = match committed {
                None => "empty".to_owned(),
                Some(c) => match self.index.get(c) {
                    Some(e) => format!("at height {}", e.height),
                    None => format!(
                        "at block id {}, which the index database does not hold",
                        c.0
                    ),
                },
            };
            return Err(PipelineError::Inconsistent {
                reason: format!(
                    "the UTXO table ({}/utxo) is {table_height}, but the index database has \
                     connected blocks up to height {}: the table lost commits; rebuild it from \
                     the block files with `kakehi reindex-chainstate`, or restore the datadir \
                     from a backup",
                    self.datadir.display(),
                    entry.height
                ),
            });
        }
        tracing::warn!(height = entry.height, block_hash = %entry.hash, "UTXO table is behind the index: replaying its last boundary");
        self.replay_group(first, last)?;
        if self.table.committed().map(|t| t.block) != Some(last) {
            return Err(PipelineError::Inconsistent {
                reason: "UTXO table commit did not take".into(),
            });
        }
        Ok(())
    }
}
