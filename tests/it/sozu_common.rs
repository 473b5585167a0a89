//! Shared helpers of the Sozu tests: a block tree with an oracle and chain
//! views, a deterministic block generator, small table configurations.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};

use bitcoin::hashes::Hash;
use bitcoin::{Amount, OutPoint, Txid};
use kakehi::sozu::model::ModelTable;
use kakehi::sozu::*;

/// The tests' seeded generator.
pub use crate::common::Rng;

/// A block tree: ids are indices; block 0 is genesis.
#[derive(Clone, Debug, Default)]
pub struct Chain {
    pub parent: Vec<Option<u32>>,
    pub height: Vec<u32>,
    pub best: u32,
    best_set: HashMap<u32, u32>,
}

impl Chain {
    pub fn new() -> Self {
        let mut c = Chain {
            parent: vec![None],
            height: vec![0],
            best: 0,
            best_set: HashMap::new(),
        };
        c.recompute();
        c
    }
    fn recompute(&mut self) {
        self.best_set.clear();
        let mut b = Some(self.best);
        while let Some(x) = b {
            self.best_set.insert(x, self.height[x as usize]);
            b = self.parent[x as usize];
        }
    }
    /// Adds a block on `parent`; it becomes best if strictly higher.
    pub fn add(&mut self, parent: u32) -> u32 {
        let id = self.parent.len() as u32;
        self.parent.push(Some(parent));
        self.height.push(self.height[parent as usize] + 1);
        if self.height[id as usize] > self.height[self.best as usize] {
            self.best = id;
            self.recompute();
        }
        id
    }
    /// Forgets a block that was never committed (only the last one added).
    pub fn forget(&mut self, id: u32, previous_best: u32) {
        if id as usize + 1 == self.parent.len() {
            self.parent.pop();
            self.height.pop();
            self.best = previous_best;
            self.recompute();
        }
    }
    pub fn tip_height(&self) -> u32 {
        self.height[self.best as usize]
    }
    /// The view of the branch ending at `tip`.
    pub fn view(&self, tip: u32) -> View {
        let mut set = HashSet::new();
        let mut b = Some(tip);
        while let Some(x) = b {
            set.insert(BlockId(x));
            b = self.parent[x as usize];
        }
        View(set)
    }
    /// Tips (blocks without children) whose branch forks at most `max_depth` below the best tip.
    pub fn live_tips(&self, max_depth: u32) -> Vec<u32> {
        let mut has_child = vec![false; self.parent.len()];
        for p in self.parent.iter().flatten() {
            has_child[*p as usize] = true;
        }
        let tip_h = self.tip_height();
        (0..self.parent.len() as u32)
            .filter(|&b| !has_child[b as usize])
            .filter(|&b| {
                let mut x = b;
                while !self.best_set.contains_key(&x) {
                    x = self.parent[x as usize].unwrap_or(0);
                }
                self.height[x as usize] + max_depth >= tip_h
            })
            .collect()
    }
}

impl BlockOracle for Chain {
    fn best_height(&self, block: BlockId) -> Option<u32> {
        self.best_set.get(&block.0).copied()
    }
    fn height(&self, block: BlockId) -> Option<u32> {
        self.height.get(block.0 as usize).copied()
    }
    fn tip_height(&self) -> u32 {
        Chain::tip_height(self)
    }
}

pub struct View(pub HashSet<BlockId>);

impl ChainView for View {
    fn contains(&self, block: BlockId) -> bool {
        self.0.contains(&block)
    }
}

/// A script of a realistic length, rarely large (out of line).
pub fn script(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.below(100) {
        0 => 10_000,
        1..=3 => 101 + rng.below(900) as usize,
        4..=9 => 67,
        _ => 22 + rng.below(13) as usize,
    };
    let b = rng.next() as u8;
    (0..len).map(|i| b.wrapping_add(i as u8)).collect()
}

/// Builds the write of a block `id` at `height` on the branch `view`, using
/// the model to choose unspent outputs. `reinclude` may hold outputs of
/// abandoned branches to produce again (known_absent = false).
pub fn gen_block(
    rng: &mut Rng,
    model: &mut ModelTable,
    view: &View,
    id: u32,
    height: u32,
    max_txs: u64,
) -> BlockWrite {
    let mut unspent: Vec<Entry> = kakehi::sozu::model::unspent_in(model, view);
    let mut absent_recent = absent_recent(model, view, height);
    let block = BlockId(id);
    let mut w = BlockWrite {
        block,
        height,
        created: Vec::new(),
        spent: Vec::new(),
    };
    // coinbase
    let cb = Txid::from_byte_array(rng.bytes32());
    w.created.push(NewOutput {
        outpoint: OutPoint { txid: cb, vout: 0 },
        coin: Coin {
            value: Amount::from_sat(50_000),
            script_pubkey: script(rng),
            height,
            coinbase: true,
        },
        known_absent: true,
    });
    // re-included outputs of a competing branch
    if !absent_recent.is_empty() && rng.below(2) == 0 {
        let n = 1 + rng.below(absent_recent.len() as u64);
        for _ in 0..n {
            let e = absent_recent.swap_remove(rng.below(absent_recent.len() as u64) as usize);
            w.created.push(NewOutput {
                outpoint: e.outpoint,
                coin: e.coin.clone(),
                known_absent: false,
            });
            if absent_recent.is_empty() {
                break;
            }
        }
    }
    push_txs(rng, &mut unspent, &mut w, max_txs);
    w
}

/// Entries absent from `view` whose productions are all within 12 blocks
/// of `height`: outputs of abandoned branches that a block may re-include.
fn absent_recent(model: &mut ModelTable, view: &View, height: u32) -> Vec<Entry> {
    let mut out = Vec::new();
    let _ = model.for_each(&mut |e| {
        if matches!(e.status_in(view), ViewStatus::Absent)
            && e.produced.iter().all(|p| p.height + 12 >= height)
        {
            out.push(e.clone());
        }
    });
    out
}

/// Up to `max_txs` transactions into `w`: each spends up to 3 outputs (an
/// output of `unspent`, or one a transaction before it in the block
/// created) and creates 1 to 3.
fn push_txs(rng: &mut Rng, unspent: &mut Vec<Entry>, w: &mut BlockWrite, max_txs: u64) {
    let (block, height) = (w.block, w.height);
    let ntx = rng.below(max_txs + 1);
    let mut fresh: Vec<OutPoint> = Vec::new();
    for _ in 0..ntx {
        let txid = Txid::from_byte_array(rng.bytes32());
        let nin = rng.below(4);
        for vin in 0..nin as u32 {
            let same_block = !fresh.is_empty() && rng.below(4) == 0;
            let op = if same_block {
                fresh.swap_remove(rng.below(fresh.len() as u64) as usize)
            } else if !unspent.is_empty() {
                unspent
                    .swap_remove(rng.below(unspent.len() as u64) as usize)
                    .outpoint
            } else {
                continue;
            };
            w.spent.push((op, Consumption { block, txid, vin }));
        }
        let nout = 1 + rng.below(3) as u32;
        for vout in 0..nout {
            let op = OutPoint { txid, vout };
            w.created.push(NewOutput {
                outpoint: op,
                coin: Coin {
                    value: Amount::from_sat(rng.below(1_000_000)),
                    script_pubkey: script(rng),
                    height,
                    coinbase: false,
                },
                known_absent: true,
            });
            fresh.push(op);
        }
    }
}

/// A configuration with tiny buckets so spills, child allocation, deep
/// layers and checkpoints all happen with a few hundred entries.
pub fn small_config() -> SozuConfig {
    SozuConfig {
        page_size: 4096,
        layer0_bits: 2,
        growth_bits: 1,
        layers: vec![
            LayerConfig {
                capacity: 400,
                alpha: 0.5,
            },
            LayerConfig {
                capacity: 600,
                alpha: 0.6,
            },
            LayerConfig {
                capacity: 800,
                alpha: 0.7,
            },
        ],
        disk_alpha: None,
        ram_mib: 1,
        ram_layers: Some(2),
        unflushed_bytes: None,
        inline_script_max: 100,
        checkpoint_bytes: 256 << 10,
        background_checkpoints: true,
        verify_on_open: true,
        shards: 1,
        spill_fewest_children: true,
        spill_consumed: SpillConsumed::LastIntoDisk,
        records_compact_min: 4 << 10,
    }
}

/// The unspent entries under `view`, as (outpoint, value, script, height in view).
pub fn unspent_summary(
    t: &mut dyn UtxoTable,
    view: &dyn ChainView,
) -> Vec<(OutPoint, Amount, Vec<u8>, Option<u32>)> {
    let mut v = Vec::new();
    t.for_each(&mut |e| {
        if e.is_unspent_in(view) {
            v.push((
                e.outpoint,
                e.coin.value,
                e.coin.script_pubkey.clone(),
                e.creation_height_in(view),
            ));
        }
    })
    .expect("for_each");
    v.sort();
    v
}
