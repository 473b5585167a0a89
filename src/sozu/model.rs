//! A plain in-memory reference implementation of the Sozu table's lifecycle
//! rules: one `BTreeMap` from outpoint to entry, no layers, no I/O.
//!
//! It is the model the property tests compare the real table against, and a
//! stand-in for it in pipeline unit tests. Purges happen eagerly at every
//! write (the real table purges lazily when a bucket is rewritten); both
//! agree on every unspent read under every allowed view.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

use bitcoin::OutPoint;

use super::types::{BlockOracle, BlockWrite, CommitTag, Entry, Production, ViewStatus};
use super::{SozuError, UtxoReader, UtxoTable};

type Map = BTreeMap<OutPoint, Entry>;

/// The in-memory model: a sorted map and a committed snapshot.
#[derive(Default, Debug)]
pub struct ModelTable {
    live: Map,
    /// The state of the last commit, shared with [`ModelTable::reader`]s
    /// (replaced whole at each commit).
    committed: Arc<RwLock<Arc<Map>>>,
    tag: Option<CommitTag>,
}

/// A clone is independent: its commits are not the original's.
impl Clone for ModelTable {
    fn clone(&self) -> Self {
        let committed = self
            .committed
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        Self {
            live: self.live.clone(),
            committed: Arc::new(RwLock::new(committed)),
            tag: self.tag,
        }
    }
}

/// [`UtxoReader`] of a [`ModelTable`]: its last committed map.
#[derive(Debug)]
struct ModelReader(Arc<RwLock<Arc<Map>>>);

impl UtxoReader for ModelReader {
    fn get_batch(&self, keys: &[OutPoint]) -> Result<Vec<Option<Entry>>, SozuError> {
        let map = self
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        Ok(keys.iter().map(|k| map.get(k).cloned()).collect())
    }
}

impl ModelTable {
    /// An empty model.
    pub fn new() -> Self {
        Self::default()
    }

    /// Drops everything written since the last commit (what a crash does).
    pub fn crash(&mut self) {
        let committed = self
            .committed
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        self.live = Map::clone(&committed);
    }

    /// Number of entries (spent ones not yet purged included).
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether the model holds no entry.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }
}

impl UtxoTable for ModelTable {
    fn reader(&self) -> Arc<dyn UtxoReader> {
        Arc::new(ModelReader(self.committed.clone()))
    }

    fn get_batch(&mut self, keys: &[OutPoint]) -> Result<Vec<Option<Entry>>, SozuError> {
        Ok(keys.iter().map(|k| self.live.get(k).cloned()).collect())
    }

    fn write_block(
        &mut self,
        write: &BlockWrite,
        oracle: &dyn BlockOracle,
        purged: &mut dyn FnMut(Entry),
    ) -> Result<(), SozuError> {
        for new in &write.created {
            let production = Production {
                block: write.block,
                height: write.height,
            };
            match self.live.get_mut(&new.outpoint) {
                Some(entry) => {
                    if entry.coin.value != new.coin.value
                        || entry.coin.script_pubkey != new.coin.script_pubkey
                    {
                        return Err(SozuError::CoinMismatch {
                            outpoint: new.outpoint,
                        });
                    }
                    entry.merge_records(&[production], &[]);
                }
                None => {
                    self.live.insert(
                        new.outpoint,
                        Entry {
                            outpoint: new.outpoint,
                            coin: new.coin.clone(),
                            produced: vec![production],
                            consumed: Vec::new(),
                        },
                    );
                }
            }
        }
        for (outpoint, consumption) in &write.spent {
            let entry = self.live.get_mut(outpoint).ok_or(SozuError::MissingEntry {
                outpoint: *outpoint,
            })?;
            entry.merge_records(&[], &[*consumption]);
        }
        let dead: Vec<OutPoint> = self
            .live
            .values()
            .filter(|e| e.is_purgeable(oracle))
            .map(|e| e.outpoint)
            .collect();
        for outpoint in dead {
            if let Some(entry) = self.live.remove(&outpoint) {
                purged(entry);
            }
        }
        Ok(())
    }

    fn commit(&mut self, tag: CommitTag) -> Result<(), SozuError> {
        *self
            .committed
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(self.live.clone());
        self.tag = Some(tag);
        Ok(())
    }

    fn committed(&self) -> Option<CommitTag> {
        self.tag
    }

    fn for_each(&mut self, f: &mut dyn FnMut(&Entry)) -> Result<(), SozuError> {
        self.live.values().for_each(f);
        Ok(())
    }
}

/// Convenience for tests: the unspent entries under a view, sorted.
pub fn unspent_in(table: &mut dyn UtxoTable, view: &dyn super::ChainView) -> Vec<Entry> {
    let mut out = Vec::new();
    let _ = table.for_each(&mut |e| {
        if matches!(e.status_in(view), ViewStatus::Unspent) {
            out.push(e.clone());
        }
    });
    out.sort_by_key(|e| e.outpoint);
    out
}
