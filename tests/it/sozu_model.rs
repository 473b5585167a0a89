//! Model-based property test: random block sequences (creations, spends,
//! same-block spends, competing branches, reorgs of depth 1–12, purges,
//! clean restarts and crashes before a commit) applied to the Sozu table and
//! to `ModelTable`; every unspent read under every live view must agree.
//!
//! `KAKEHI_LONG=1` runs 64 cases instead of 6.

use crate::sozu_common;

use std::collections::HashSet;

use bitcoin::OutPoint;
use kakehi::sozu::model::ModelTable;
use kakehi::sozu::*;
use proptest::prelude::*;
use sozu_common::{gen_block, small_config, unspent_summary, Chain, Rng};

#[derive(Clone, Debug)]
enum Action {
    /// Extend the best chain by 1..=3 blocks.
    Extend(u8, u64),
    /// Fork `depth` below the best tip and add `len` blocks (a reorg when
    /// `len > depth`).
    Side { depth: u32, len: u32, seed: u64 },
    /// Drop and reopen the table.
    Restart,
    /// Write a block, crash (power loss) before its commit, reopen.
    Crash(u64),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        14 => (1u8..=3, any::<u64>()).prop_map(|(n, s)| Action::Extend(n, s)),
        3 => (1u32..=12, 1u32..=14, any::<u64>()).prop_map(|(depth, len, seed)| Action::Side { depth, len, seed }),
        1 => Just(Action::Restart),
        1 => any::<u64>().prop_map(Action::Crash),
    ]
}

struct Harness {
    chain: Chain,
    model: ModelTable,
    storage: MemStorage,
    table: Option<SozuTable>,
    model_purged: HashSet<OutPoint>,
    sozu_purged: HashSet<OutPoint>,
    /// This run's configuration, given again at every reopen.
    cfg: SozuConfig,
    /// Counters summed over every open.
    totals: Totals,
}

/// Counters of a run, summed over every open of its table.
#[derive(Default)]
struct Totals {
    /// Checkpoints of the disk layers only finished.
    disk_only_checkpoints: u64,
    /// Cold spends filed as spend markers.
    spend_markers: u64,
    /// Entries inserted onto a spend marker of their key.
    markers_absorbed: u64,
}

impl Harness {
    fn new(cfg: SozuConfig) -> Self {
        let storage = MemStorage::new();
        let table =
            SozuTable::open_with_storage(Box::new(storage.clone()), cfg.clone()).expect("create");
        Harness {
            chain: Chain::new(),
            model: ModelTable::new(),
            storage,
            table: Some(table),
            model_purged: HashSet::new(),
            sozu_purged: HashSet::new(),
            cfg,
            totals: Totals::default(),
        }
    }

    /// Drops the table (a process exit, or a power loss: every thread
    /// stops), keeping its counters.
    fn close(&mut self) {
        if let Some(t) = self.table.take() {
            let c = t.counters();
            self.totals.disk_only_checkpoints += c.disk_only_checkpoints;
            self.totals.spend_markers += c.spend_markers;
            self.totals.markers_absorbed += c.markers_absorbed;
        }
    }

    fn table(&mut self) -> &mut SozuTable {
        self.table.as_mut().expect("table open")
    }

    fn reopen(&mut self) {
        self.close();
        let t = SozuTable::open_with_storage(Box::new(self.storage.clone()), self.cfg.clone())
            .expect("reopen");
        self.table = Some(t);
    }

    /// Adds, writes and commits one random block on `parent`.
    fn block(&mut self, parent: u32, rng: &mut Rng, commit: bool) -> Result<(), TestCaseError> {
        self.add(parent, commit, |model, view, id, height| {
            gen_block(rng, model, view, id, height, 4)
        })
        .map(|_| ())
    }

    /// Adds one block on `parent` whose write `make` builds (from the
    /// model, the block's view, id and height), writes it to the table and
    /// the model, and commits it (or, without `commit`, crashes before the
    /// commit); returns its id.
    fn add(
        &mut self,
        parent: u32,
        commit: bool,
        make: impl FnOnce(&mut ModelTable, &sozu_common::View, u32, u32) -> BlockWrite,
    ) -> Result<u32, TestCaseError> {
        let prev_best = self.chain.best;
        let id = self.chain.add(parent);
        let height = self.chain.height[id as usize];
        let view = self.chain.view(id);
        let w = make(&mut self.model, &view, id, height);
        let chain = self.chain.clone();
        let mut mp = Vec::new();
        self.model
            .write_block(&w, &chain, &mut |e| mp.push(e.outpoint))
            .expect("model write");
        let mut sp = Vec::new();
        self.table()
            .write_block(&w, &chain, &mut |e| sp.push(e))
            .map_err(|e| TestCaseError::fail(format!("sozu write: {e}")))?;
        for e in &sp {
            prop_assert!(
                e.is_purgeable(&chain),
                "purged a live entry {:?}",
                e.outpoint
            );
        }
        self.model_purged.extend(mp);
        self.sozu_purged.extend(sp.iter().map(|e| e.outpoint));
        let tag = CommitTag {
            block: BlockId(id),
            height,
            block_hash: [id as u8; 32],
        };
        if commit {
            self.table()
                .commit(tag)
                .map_err(|e| TestCaseError::fail(format!("commit: {e}")))?;
            self.model.commit(tag).expect("model commit");
        } else {
            self.model.crash();
            self.chain.forget(id, prev_best);
        }
        Ok(id)
    }

    fn check(&mut self) -> Result<(), TestCaseError> {
        prop_assert_eq!(self.table().committed(), self.model.committed());
        // Point reads through get_batch (batched descent) first, before any
        // walk of the whole table reloads every page (and its summary).
        let mut keys = Vec::new();
        self.model
            .for_each(&mut |e| keys.push(e.outpoint))
            .expect("model");
        keys.push(OutPoint::null());
        // A key asked twice in one batch is answered twice.
        keys.push(keys[0]);
        let got = self
            .table()
            .get_batch(&keys)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        // The concurrent reader (committed state: everything is committed
        // here) returns exactly what the writer's own reads return.
        let via_reader = self
            .table()
            .reader()
            .get_batch(&keys)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&via_reader, &got, "reader and writer disagree");
        let want = self.model.get_batch(&keys).expect("model");
        let view = self.chain.view(self.chain.best);
        for ((k, g), w) in keys.iter().zip(got).zip(want) {
            let gs = g.as_ref().map(|e| e.is_unspent_in(&view));
            let ws = w.as_ref().map(|e| e.is_unspent_in(&view));
            prop_assert_eq!(gs.unwrap_or(false), ws.unwrap_or(false), "get_batch {}", k);
            if let (Some(g), Some(w)) = (g, w) {
                prop_assert_eq!(&g.coin, &w.coin);
            }
        }
        // Full scans under every live view agree.
        let tips = self.chain.live_tips(12);
        for tip in tips {
            let view = self.chain.view(tip);
            let a = unspent_summary(self.table.as_mut().expect("open"), &view);
            let b = unspent_summary(&mut self.model, &view);
            prop_assert_eq!(a, b, "unspent sets differ under the view of tip {}", tip);
        }
        // The Sozu paper's height filter: with a floor at or below an entry's
        // lowest production height, the early-stopping descent still finds it.
        let mut floors = Vec::new();
        self.model
            .for_each(&mut |e| {
                let min = e.produced.iter().map(|p| p.height).min().unwrap_or(0);
                floors.push((e.outpoint, min));
            })
            .expect("model");
        let found = self
            .table()
            .get_batch_since(&floors)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        for ((op, floor), f) in floors.iter().zip(found) {
            let purged_lazily = self.model_purged.contains(op);
            prop_assert!(
                f.is_some() || purged_lazily,
                "{} not found with height floor {}",
                op,
                floor
            );
        }
        prop_assert!(
            self.sozu_purged.is_subset(&self.model_purged),
            "sozu purged entries the model kept"
        );
        Ok(())
    }
}

/// `small_config()` with the knobs the tests vary: shards, spill policy
/// (`spill_fewest_children`; the proptest varies `spill_consumed` too),
/// growth bits g, RAM layers (0 puts every layer on the disk path: page
/// cache, key-signature summaries), and
/// whether checkpoints of the disk layers only run between those of a
/// generation's end (2 KiB of unflushed disk pages start one; the journal
/// bound is 64 KiB).
fn config(
    shards: u8,
    fewest: bool,
    growth_bits: u8,
    ram_layers: u8,
    disk_only: bool,
) -> SozuConfig {
    let base = small_config();
    SozuConfig {
        shards,
        spill_fewest_children: fewest,
        growth_bits,
        ram_layers: Some(ram_layers),
        unflushed_bytes: disk_only.then_some(2 << 10),
        checkpoint_bytes: if disk_only {
            64 << 10
        } else {
            base.checkpoint_bytes
        },
        ..base
    }
}

/// Runs `actions` against the model; returns its counters.
fn run(actions: Vec<Action>, cfg: SozuConfig) -> Result<Totals, TestCaseError> {
    let mut h = Harness::new(cfg);
    for a in actions {
        match a {
            Action::Extend(n, seed) => {
                let mut rng = Rng::new(seed);
                for _ in 0..n {
                    let best = h.chain.best;
                    h.block(best, &mut rng, true)?;
                }
            }
            Action::Side { depth, len, seed } => {
                let mut rng = Rng::new(seed);
                let mut fork = h.chain.best;
                for _ in 0..depth {
                    fork = h.chain.parent[fork as usize].unwrap_or(0);
                }
                let mut tip = fork;
                for _ in 0..len {
                    h.block(tip, &mut rng, true)?;
                    tip = h.chain.parent.len() as u32 - 1;
                }
            }
            Action::Restart => h.reopen(),
            Action::Crash(seed) => {
                let mut rng = Rng::new(seed);
                let best = h.chain.best;
                h.block(best, &mut rng, false)?;
                // A power loss stops every thread of the process: the
                // table (and a checkpoint it runs in the background) stops
                // before the storage loses its unsynced writes.
                h.close();
                h.storage.crash(seed);
                h.reopen();
            }
        }
        h.check()?;
    }
    let stats = h
        .table()
        .stats()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    eprintln!("{stats:?}");
    prop_assert!(
        stats.layers.len() >= 2,
        "expected spills into deeper layers: {stats:?}"
    );
    h.close();
    Ok(h.totals)
}

fn cases() -> u32 {
    if std::env::var("KAKEHI_LONG").is_ok() {
        64
    } else {
        6
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn sozu_agrees_with_model(actions in prop::collection::vec(action(), 40..90), two_shards in any::<bool>(), seed_spill in any::<bool>(), growth_bits in 1u8..=3, ram_layers in 0u8..=2, disk_only in any::<bool>(), disk_alpha in prop::option::of(0.0f64..0.9), spill_consumed in prop::sample::select(vec![SpillConsumed::First, SpillConsumed::LastIntoDisk, SpillConsumed::Last])) {
        let cfg = SozuConfig { disk_alpha, spill_consumed, ..config(if two_shards { 2 } else { 1 }, !seed_spill, growth_bits, ram_layers, disk_only) };
        run(actions, cfg)?;
    }
}

/// A fixed long sequence that crosses the purge depth (100 blocks) with
/// reorgs, so purges and dead-branch deletion are always exercised.
#[test]
fn long_sequence_with_purges() {
    let mut actions = Vec::new();
    let mut rng = Rng::new(7);
    for i in 0..140u64 {
        actions.push(match i % 17 {
            5 => Action::Side {
                depth: 1 + (i % 12) as u32,
                len: 1 + (i % 14) as u32,
                seed: rng.next(),
            },
            11 => Action::Restart,
            13 => Action::Crash(rng.next()),
            _ => Action::Extend(1, rng.next()),
        });
    }
    let two_pinned = run(actions.clone(), config(1, true, 1, 2, false)).expect("long sequence");
    eprintln!(
        "{} spend markers, {} absorbed",
        two_pinned.spend_markers, two_pinned.markers_absorbed
    );
    assert!(
        two_pinned.spend_markers > 0,
        "no spend of an entry below the pinned layers went through a spend marker"
    );
    run(actions.clone(), config(2, true, 1, 2, false)).expect("long sequence, two shards");
    run(actions.clone(), config(1, false, 1, 2, false))
        .expect("long sequence, the Sozu paper's literal spill");
    run(actions.clone(), config(1, true, 1, 0, false)).expect("long sequence, no RAM layer");
    for spill_consumed in [SpillConsumed::First, SpillConsumed::Last] {
        run(
            actions.clone(),
            SozuConfig {
                spill_consumed,
                ..config(1, true, 1, 1, false)
            },
        )
        .unwrap_or_else(|e| panic!("long sequence, consumed entries {spill_consumed:?}: {e}"));
    }
    run(actions.clone(), config(1, true, 2, 1, false)).expect("long sequence, g = 2");
    run(
        actions.clone(),
        SozuConfig {
            disk_alpha: Some(0.2),
            ..config(1, true, 1, 1, true)
        },
    )
    .expect("long sequence, a low α below the pinned layer");
    let disk_only = run(actions, config(2, true, 1, 2, true))
        .expect("long sequence, checkpoints of the disk layers only")
        .disk_only_checkpoints;
    eprintln!("{disk_only} checkpoints of the disk layers only");
    assert!(
        disk_only > 0,
        "no checkpoint of the disk layers only ran: replay up to one went untested"
    );
}

/// An output produced again long after its branch was abandoned lands
/// where a spend marker of its key still is (`plan_page`'s absorption):
/// with layer 0 alone pinned, a spend of an output below it files its
/// marker in layer 0, where inserts go. Branch A produces K, pushes it
/// below layer 0 with other outputs, and spends it (a marker); branch B,
/// from genesis, leaves A more than 100 blocks behind with empty blocks
/// (no page is rewritten, so the marker stays), then re-mines K's
/// transaction: K's old entry is below the re-production's height floor
/// and not found, so K is inserted onto its marker and takes its place.
/// The table must agree with the model then, after K is spent on B, and
/// after a reopen (the journal's replay of the absorption).
#[test]
fn a_re_mined_output_absorbs_its_spend_marker() {
    use bitcoin::hashes::Hash;
    use bitcoin::{Amount, Txid};
    let mut h = Harness::new(config(1, true, 1, 1, false));
    let k = OutPoint {
        txid: Txid::from_byte_array([7; 32]),
        vout: 0,
    };
    let coin = Coin {
        value: Amount::from_sat(5_000),
        script_pubkey: vec![0x51; 22],
        height: 1,
        coinbase: false,
    };
    let write = |id: u32, height: u32, created: Vec<NewOutput>, spent| BlockWrite {
        block: BlockId(id),
        height,
        created,
        spent,
    };
    let spend = |id: u32, tag: u8| {
        vec![(
            k,
            Consumption {
                block: BlockId(id),
                txid: Txid::from_byte_array([tag; 32]),
                vin: 0,
            },
        )]
    };
    let k_out = |known_absent| NewOutput {
        outpoint: k,
        coin: coin.clone(),
        known_absent,
    };
    // Branch A.
    let mut tip = h
        .add(0, true, |_, _, id, height| {
            write(id, height, vec![k_out(true)], Vec::new())
        })
        .expect("A: K");
    for b in 0..10u8 {
        tip = h
            .add(tip, true, |_, _, id, height| {
                let created = (0..100)
                    .map(|vout| NewOutput {
                        outpoint: OutPoint {
                            txid: Txid::from_byte_array([b + 10; 32]),
                            vout,
                        },
                        coin: Coin {
                            height,
                            ..coin.clone()
                        },
                        known_absent: true,
                    })
                    .collect();
                write(id, height, created, Vec::new())
            })
            .expect("A: fillers");
    }
    let markers = h.table().counters().spend_markers;
    h.add(tip, true, |_, _, id, height| {
        write(id, height, Vec::new(), spend(id, 1))
    })
    .expect("A: K spent");
    assert_eq!(
        h.table().counters().spend_markers,
        markers + 1,
        "K's spend was not filed as a marker: K still in layer 0"
    );
    h.check().expect("after A");
    // Branch B: empty blocks past the purge depth, then K re-mined.
    let mut tip = 0;
    for _ in 0..115 {
        tip = h
            .add(tip, true, |_, _, id, height| {
                write(id, height, Vec::new(), Vec::new())
            })
            .expect("B: empty");
    }
    h.check().expect("after B's empty blocks");
    tip = h
        .add(tip, true, |_, _, id, height| {
            write(id, height, vec![k_out(false)], Vec::new())
        })
        .expect("B: K re-mined");
    assert_eq!(
        h.table().counters().markers_absorbed,
        1,
        "K did not meet its marker"
    );
    h.check().expect("after K re-mined");
    h.add(tip, true, |_, _, id, height| {
        write(id, height, Vec::new(), spend(id, 2))
    })
    .expect("B: K spent");
    h.check().expect("after K spent on B");
    h.reopen();
    h.check().expect("after a reopen");
}

/// Typed refusals: a spend of an unknown outpoint, a re-production with
/// another coin, a block more than 100 below the tip; each poisons the
/// table, and a reopen returns to the last commit. Each poisoned table is
/// dropped before the reopen, as a process exit would: a table still alive
/// may be finishing a background checkpoint into the same files.
#[test]
fn typed_write_errors() {
    use bitcoin::hashes::Hash;
    let storage = MemStorage::new();
    let (mut t, model, chain) = table_of_105_blocks(&storage);
    let tag = t.committed();
    let block = BlockId(chain.best);
    let unknown = OutPoint {
        txid: bitcoin::Txid::from_byte_array([7; 32]),
        vout: 3,
    };
    let spend = BlockWrite {
        block,
        height: 105,
        created: Vec::new(),
        spent: vec![(
            unknown,
            Consumption {
                block,
                txid: unknown.txid,
                vin: 0,
            },
        )],
    };
    assert!(
        matches!(t.write_block(&spend, &chain, &mut |_| {}), Err(SozuError::MissingEntry { outpoint }) if outpoint == unknown)
    );
    assert!(matches!(
        t.commit(CommitTag::default()),
        Err(SozuError::Poisoned)
    ));
    drop(t);
    let mut t = reopen(&storage);
    assert_eq!(t.committed(), tag);
    let e = most_recent_entry(model);
    let mut coin = e.coin.clone();
    coin.value += bitcoin::Amount::from_sat(1);
    let again = BlockWrite {
        block,
        height: 105,
        created: vec![NewOutput {
            outpoint: e.outpoint,
            coin,
            known_absent: false,
        }],
        spent: Vec::new(),
    };
    assert!(matches!(
        t.write_block(&again, &chain, &mut |_| {}),
        Err(SozuError::CoinMismatch { .. })
    ));
    drop(t);
    let mut t = reopen(&storage);
    let deep = BlockWrite {
        block,
        height: 3,
        created: Vec::new(),
        spent: Vec::new(),
    };
    assert!(matches!(
        t.write_block(&deep, &chain, &mut |_| {}),
        Err(SozuError::ReorgTooDeep {
            height: 3,
            tip: 105
        })
    ));
}

fn reopen(storage: &MemStorage) -> SozuTable {
    SozuTable::open_with_storage(Box::new(storage.clone()), small_config())
        .unwrap_or_else(|e| panic!("open: {e:?}"))
}

/// A table on `storage` with 105 committed blocks of a single chain, and
/// the model and chain that wrote it.
fn table_of_105_blocks(storage: &MemStorage) -> (SozuTable, ModelTable, Chain) {
    let mut t = reopen(storage);
    let mut chain = Chain::new();
    let mut model = ModelTable::new();
    let mut rng = Rng::new(3);
    for _ in 0..105 {
        let id = chain.add(chain.best);
        let w = gen_block(&mut rng, &mut model, &chain.view(id), id, id, 2);
        model.write_block(&w, &chain, &mut |_| {}).expect("model");
        t.write_block(&w, &chain, &mut |_| {}).expect("write");
        t.commit(CommitTag {
            block: BlockId(id),
            height: id,
            block_hash: [0; 32],
        })
        .expect("commit");
    }
    (t, model, chain)
}

/// The model's entry with the highest production: lookups for outputs
/// that may be present search entries produced in the last 100 blocks
/// (older ones cannot be re-produced, BIP30).
fn most_recent_entry(mut model: ModelTable) -> Entry {
    let mut some = Vec::new();
    model
        .for_each(&mut |e| some.push(e.clone()))
        .expect("model");
    some.into_iter()
        .max_by_key(|e| e.max_production_height())
        .expect("entries")
}

/// `SozuConfig::disk_alpha`: the same blocks with a low α below the pinned
/// layer spill out of disk pages in larger batches, so the layers under
/// the first disk layer are spilled into fewer times per entry that
/// reaches them, and the table still agrees with the model.
#[test]
fn low_disk_alpha_spills_larger_batches() {
    let flow = |disk_alpha: Option<f64>| {
        let mut h = Harness::new(SozuConfig {
            disk_alpha,
            ..config(1, true, 1, 1, false)
        });
        let mut rng = Rng::new(11);
        for _ in 0..120 {
            let best = h.chain.best;
            h.block(best, &mut rng, true).expect("block");
        }
        h.check().expect("agrees with the model");
        let flow = h.table().counters().flow;
        // Below the first disk layer (layer 1): spilled out of disk pages.
        let deep = flow.iter().skip(2);
        let targets: u64 = deep.clone().map(|f| f.spill_targets).sum();
        let entries: u64 = deep.map(|f| f.spilled_entries).sum();
        assert!(flow[1].spill_targets > 0, "nothing reached the disk layers");
        (targets, entries)
    };
    let (t_keep, e_keep) = flow(None);
    let (t_low, e_low) = flow(Some(0.2));
    eprintln!("spills below layer 1: α of the list {t_keep} for {e_keep} entries, α 0.2 {t_low} for {e_low}");
    assert!(t_keep > 0 && t_low > 0, "no spill out of a disk page");
    assert!(
        e_low * t_keep > e_keep * t_low,
        "entries per spill out of disk pages not larger with α 0.2"
    );
}
