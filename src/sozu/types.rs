//! Entry, key and chain-view types shared by the Sozu table, its in-memory
//! model and the block pipeline.
//!
//! Source: the Sozu paper (payload with production and consumption lists) and
//! Teranode's UTXO model (its spending data: spending txid + input index); both
//! in `docs/references.md`.

use bitcoin::{OutPoint, Txid};

pub use crate::primitives::{key_outpoint, outpoint_key, BlockId, Coin, OutPointKey};

/// One spend of an entry: which block consumed it, by which transaction and
/// input (the spending data of Teranode's UTXO model).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, PartialOrd, Ord)]
pub struct Consumption {
    /// The consuming block.
    pub block: BlockId,
    /// The spending transaction's txid.
    pub txid: Txid,
    /// The index of the spending input in that transaction.
    pub vin: u32,
}

/// One production of an entry: the block that created it, and its height.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, PartialOrd, Ord)]
pub struct Production {
    /// The producing block.
    pub block: BlockId,
    /// Its height (equal on every branch for a coinbase, and usually for
    /// re-included transactions, but not necessarily).
    pub height: u32,
}

/// A full entry of the table: outpoint, coin, and its lifecycle records.
///
/// The lists are kept sorted and free of duplicates, so merging the same
/// block twice is idempotent (the pipeline relies on that after a crash
/// between the table's commit and the index's commit).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Entry {
    /// The entry's key.
    pub outpoint: OutPoint,
    /// Amount, scriptPubKey, creation height, coinbase flag.
    pub coin: Coin,
    /// Every block that produced the outpoint (one per branch that holds the
    /// creating transaction).
    pub produced: Vec<Production>,
    /// Every block that consumed it (one per branch that spends it).
    pub consumed: Vec<Consumption>,
}

/// The state of an entry under one chain view.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ViewStatus<'a> {
    /// Produced by a block of the view and not consumed by one.
    Unspent,
    /// Produced and consumed by blocks of the view.
    Spent(&'a Consumption),
    /// Not produced by any block of the view.
    Absent,
}

impl Entry {
    /// Whether the outpoint is unspent, spent or absent under `view`.
    pub fn status_in(&self, view: &dyn ChainView) -> ViewStatus<'_> {
        if !self.produced.iter().any(|p| view.contains(p.block)) {
            return ViewStatus::Absent;
        }
        match self.consumed.iter().find(|c| view.contains(c.block)) {
            Some(c) => ViewStatus::Spent(c),
            None => ViewStatus::Unspent,
        }
    }

    /// Whether the outpoint is unspent under `view`.
    pub fn is_unspent_in(&self, view: &dyn ChainView) -> bool {
        matches!(self.status_in(view), ViewStatus::Unspent)
    }

    /// The creation height on the branch `view` describes, if produced there.
    pub fn creation_height_in(&self, view: &dyn ChainView) -> Option<u32> {
        self.produced
            .iter()
            .find(|p| view.contains(p.block))
            .map(|p| p.height)
    }

    /// Highest production height (the spill order and `max height` use it).
    pub fn max_production_height(&self) -> u32 {
        self.produced
            .iter()
            .map(|p| p.height)
            .max()
            .unwrap_or(self.coin.height)
    }

    /// Merges `other`'s lifecycle records into `self` (set union, sorted).
    /// The coins must be equal; the caller checks (the Sozu paper: "otherwise the
    /// write operation itself is invalid").
    pub fn merge_records(&mut self, produced: &[Production], consumed: &[Consumption]) {
        for p in produced {
            if let Err(i) = self.produced.binary_search(p) {
                self.produced.insert(i, *p);
            }
        }
        for c in consumed {
            if let Err(i) = self.consumed.binary_search(c) {
                self.consumed.insert(i, *c);
            }
        }
    }

    /// The Sozu paper's hard-delete rule, judged against the best chain:
    /// permanently consumed (a consumption on the best chain at least
    /// [`PURGE_DEPTH`] deep) or dead (every production on blocks off the best
    /// chain at least [`PURGE_DEPTH`] below the tip, so no allowed reorg can
    /// bring them back).
    pub fn is_purgeable(&self, oracle: &dyn BlockOracle) -> bool {
        self.is_purgeable_at(oracle, oracle.tip_height())
    }

    /// [`Entry::is_purgeable`] with the best tip's height `tip` already
    /// asked of `oracle` (the table tests every entry of a bucket it
    /// rewrites, and asks once).
    pub fn is_purgeable_at(&self, oracle: &dyn BlockOracle, tip: u32) -> bool {
        is_purgeable(
            self.produced.iter().copied(),
            self.consumed.iter().copied(),
            oracle,
            tip,
        )
    }

    /// Whether the entry is consumed on the best chain (the first key of the
    /// seed's spill order, "consumed on all known chains": stale branches
    /// are about to die, so the best chain is the one that matters).
    pub fn is_consumed_on_best(&self, oracle: &dyn BlockOracle) -> bool {
        self.consumed
            .iter()
            .any(|c| oracle.best_height(c.block).is_some())
    }
}

/// The Sozu paper's hard-delete rule over an entry's lifecycle records, judged
/// against the best chain whose tip is at height `tip`: permanently
/// consumed (a consumption on the best chain at least [`PURGE_DEPTH`]
/// deep) or dead (every production on blocks off the best chain at least
/// [`PURGE_DEPTH`] below the tip, so no allowed reorg can bring them
/// back). [`Entry::is_purgeable_at`] and the table's in-place pages both
/// use it.
pub fn is_purgeable(
    mut produced: impl Iterator<Item = Production> + Clone,
    mut consumed: impl Iterator<Item = Consumption>,
    oracle: &dyn BlockOracle,
    tip: u32,
) -> bool {
    let deep = |h: u32| h.saturating_add(PURGE_DEPTH) <= tip;
    if consumed.any(|c| oracle.best_height(c.block).is_some_and(deep)) {
        return true;
    }
    // The stored production height (the producing block's height) is
    // tested first: a recent production cannot be dead, and most entries
    // a write looks at are recent, so most need no oracle call.
    produced.clone().next().is_some()
        && produced.all(|p| deep(p.height) && settled_off_best(p.block, oracle, tip))
}

/// Whether `block` is off the best chain at least [`PURGE_DEPTH`] below
/// the tip `tip`: no allowed reorg can bring it back (an unknown block
/// never is).
fn settled_off_best(block: BlockId, oracle: &dyn BlockOracle, tip: u32) -> bool {
    oracle.best_height(block).is_none()
        && oracle
            .height(block)
            .is_some_and(|h| h.saturating_add(PURGE_DEPTH) <= tip)
}

/// The hard-delete rule of a spend marker (`docs/sozu-format.md`, "Spend
/// markers"): every consumption it carries is on a block off the best
/// chain at least [`PURGE_DEPTH`] below the tip `tip`. A consumption on the
/// best chain keeps it until it meets its entry, whatever its depth: the
/// entry below would otherwise read as unspent.
pub fn is_dead_marker(
    mut consumed: impl Iterator<Item = Consumption>,
    oracle: &dyn BlockOracle,
    tip: u32,
) -> bool {
    consumed.all(|c| settled_off_best(c.block, oracle, tip))
}

/// Depth in blocks after which spent and dead entries are hard-deleted and
/// beyond which reorgs are refused (the Sozu paper suggests 100, the coinbase
/// maturity).
pub const PURGE_DEPTH: u32 = 100;

/// A set of blocks forming one branch from genesis to a tip: the active
/// chain, or a side branch being validated. Every read of the table is
/// interpreted under a view (the Sozu paper: "query not just one UTXO dataset, but
/// all the recent UTXO datasets").
pub trait ChainView {
    /// Whether `block` is an ancestor of (or equal to) the view's tip.
    fn contains(&self, block: BlockId) -> bool;
}

/// What the table needs to know of the chain to hard-delete entries and to
/// order spills: the best chain's heights and the tip.
///
/// `Sync` because the sharded Sozu table consults it from one worker thread
/// per shard.
pub trait BlockOracle: Sync {
    /// Height of `block` if it is on the best chain, else `None`.
    fn best_height(&self, block: BlockId) -> Option<u32>;
    /// Height of any known block, else `None`.
    fn height(&self, block: BlockId) -> Option<u32>;
    /// Height of the best chain's tip.
    fn tip_height(&self) -> u32;
}

/// A new output for [`BlockWrite`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct NewOutput {
    /// Its outpoint.
    pub outpoint: OutPoint,
    /// Its coin (height = the producing block's height).
    pub coin: Coin,
    /// Proof of absence (the Sozu paper's flag `m = 0`): the caller guarantees the
    /// outpoint is not in the table, so no lookup is needed. `false` means
    /// "may be present" and the table must find and merge it.
    pub known_absent: bool,
}

/// Everything one block changes in the table: the `WriteSozu` batch.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct BlockWrite {
    /// The block.
    pub block: BlockId,
    /// Its height.
    pub height: u32,
    /// Outputs it creates (spendable ones only: no OP_RETURN, no script over
    /// 10,000 bytes).
    pub created: Vec<NewOutput>,
    /// Outpoints it spends, each with its spend record. Every one of them is
    /// present in the table (validation looked them up), except outputs
    /// created earlier in the same block, which are in `created`.
    pub spent: Vec<(OutPoint, Consumption)>,
}

/// Identifies the state a commit made durable, stored with the commit and
/// returned at open so the caller can reconcile with its own stores.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct CommitTag {
    /// The committed block's id.
    pub block: BlockId,
    /// Its height.
    pub height: u32,
    /// Its hash (internal byte order).
    pub block_hash: [u8; 32],
}
