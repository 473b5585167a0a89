//! A plain in-memory reference implementation of the Sozu table's lifecycle
//! rules: one `BTreeMap` from outpoint to entry, no layers, no I/O.
//!
//! It is the model the property tests compare the real table against, and a
//! stand-in for it in pipeline unit tests. Purges happen eagerly at every
//! write (the real table purges lazily when a bucket is rewritten); both
//! agree on every unspent read under every allowed view.

use std::collections::BTreeMap;

use bitcoin::OutPoint;

use super::types::{BlockOracle, BlockWrite, CommitTag, Entry, Production, ViewStatus};
use super::{SozuError, UtxoTable};

/// The in-memory model: a sorted map and a committed snapshot.
#[derive(Default, Debug, Clone)]
pub struct ModelTable {
    live: BTreeMap<OutPoint, Entry>,
    committed: BTreeMap<OutPoint, Entry>,
    tag: Option<CommitTag>,
}

impl ModelTable {
    /// An empty model.
    pub fn new() -> Self {
        Self::default()
    }

    /// Drops everything written since the last commit (what a crash does).
    pub fn crash(&mut self) {
        self.live = self.committed.clone();
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
        self.committed = self.live.clone();
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
