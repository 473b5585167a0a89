//! Projected blocks: the mempool cut into the blocks a miner running
//! Bitcoin Core would assemble next, by Core's `BlockAssembler` order
//! (`addPackageTxs`: repeatedly the transaction whose package — it and its
//! ancestors not yet included — pays the highest feerate, the package
//! included ancestors first). Fee estimates read them; block templates
//! will.
//!
//! Each projected block holds at most [`BLOCK_MAX_VSIZE`] vbytes (Core's
//! `DEFAULT_BLOCK_MAX_WEIGHT` of 3,996,000 weight units, 4,000 below the
//! consensus limit for the coinbase). A package that does not fit in the
//! block being filled closes it and opens the next.
//!
//! Cost: one ancestor walk per entry, then O(log n) per inclusion and per
//! descendant whose package shrinks.
//!
//! Source: Bitcoin Core 30.0 `src/node/miner.cpp` (`BlockAssembler`,
//! `addPackageTxs`, `UpdatePackagesForAdded`), `src/policy/policy.h`.

use std::cmp::Ordering;
use std::collections::{BTreeSet, BinaryHeap, HashMap};

use bitcoin::Txid;

use super::entry::feerate_sat_per_kvb;
use super::pool::Pool;

/// Vbytes of transactions a block template holds at most (Core's
/// `DEFAULT_BLOCK_MAX_WEIGHT` 3,996,000 / 4).
pub const BLOCK_MAX_VSIZE: u64 = 999_000;

/// One projected block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProjectedBlock {
    /// Its transactions in block order (ancestors first).
    pub txids: Vec<Txid>,
    /// Sum of their virtual sizes, vbytes.
    pub vsize: u64,
    /// Sum of their fees, sats.
    pub fees: u64,
    /// The lowest package feerate included, sats per 1,000 vbytes: what a
    /// transaction had to pay to make this block.
    pub min_feerate: u64,
}

/// A package candidate in the heap: its feerate, then its txid (a stable
/// order), and the version of its package state it was pushed with.
#[derive(PartialEq, Eq)]
struct Candidate {
    fee: u64,
    vsize: u64,
    txid: Txid,
    version: u32,
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        // fee / vsize compared by cross-multiplication, higher first; ties
        // by txid, lower first.
        (u128::from(self.fee) * u128::from(other.vsize))
            .cmp(&(u128::from(other.fee) * u128::from(self.vsize)))
            .then_with(|| other.txid.cmp(&self.txid))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The package state of an entry not yet included: its ancestors not yet
/// included, their fees plus its own, their vsizes plus its own.
struct Package {
    ancestors: BTreeSet<Txid>,
    fee: u64,
    vsize: u64,
    version: u32,
}

/// The first `max_blocks` blocks Core's block assembler would make from
/// `pool`, each of at most `block_vsize` vbytes.
pub fn project_blocks(pool: &Pool, max_blocks: usize, block_vsize: u64) -> Vec<ProjectedBlock> {
    let mut packages: HashMap<Txid, Package> = HashMap::with_capacity(pool.len());
    let mut heap = BinaryHeap::with_capacity(pool.len());
    for e in pool.iter_by_entry() {
        let ancestors = pool.ancestors(&e.txid);
        let (v, f) = pool.sum_of(&ancestors);
        let p = Package {
            ancestors,
            fee: f + e.fee,
            vsize: v + e.vsize,
            version: 0,
        };
        heap.push(Candidate {
            fee: p.fee,
            vsize: p.vsize,
            txid: e.txid,
            version: 0,
        });
        packages.insert(e.txid, p);
    }
    let mut blocks: Vec<ProjectedBlock> = Vec::new();
    let mut current = ProjectedBlock::default();
    while let Some(c) = heap.pop() {
        let Some(p) = packages.get(&c.txid) else {
            continue;
        };
        if p.version != c.version {
            continue;
        }
        if current.vsize + p.vsize > block_vsize && !current.txids.is_empty() {
            blocks.push(std::mem::take(&mut current));
            if blocks.len() == max_blocks {
                return blocks;
            }
        }
        let rate = feerate_sat_per_kvb(p.fee, p.vsize);
        current.min_feerate = if current.txids.is_empty() {
            rate
        } else {
            current.min_feerate.min(rate)
        };
        // The package in entry order: a parent always entered before its
        // children.
        let mut members: Vec<(u64, Txid)> = p
            .ancestors
            .iter()
            .chain(std::iter::once(&c.txid))
            .filter_map(|t| pool.get(t).map(|e| (e.sequence, *t)))
            .collect();
        members.sort();
        for (_, t) in members {
            let Some(e) = pool.get(&t) else { continue };
            packages.remove(&t);
            current.txids.push(t);
            current.vsize += e.vsize;
            current.fees += e.fee;
            // Core's UpdatePackagesForAdded: every descendant's package
            // loses this transaction.
            for d in pool.descendants(&t) {
                if let Some(dp) = packages.get_mut(&d) {
                    if dp.ancestors.remove(&t) {
                        dp.fee -= e.fee;
                        dp.vsize -= e.vsize;
                        dp.version += 1;
                        heap.push(Candidate {
                            fee: dp.fee,
                            vsize: dp.vsize,
                            txid: d,
                            version: dp.version,
                        });
                    }
                }
            }
        }
    }
    if !current.txids.is_empty() && blocks.len() < max_blocks {
        blocks.push(current);
    }
    blocks
}
