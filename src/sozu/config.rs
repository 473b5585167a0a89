//! [`SozuConfig`]: the table's tuning, and how its memory budget is split
//! (`docs/sozu-format.md`, "Memory").

use super::page::{MAX_GROWTH_BITS, MAX_PAGE_SIZE, MIN_PAGE_SIZE};
use super::SozuError;

/// Capacity and keep-ratio of one layer (the Sozu paper, "Tuning the flow between
/// layers").
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerConfig {
    /// Bytes of encoded entries a bucket of this layer holds before it
    /// overflows (at most `page_size - 32`; larger values are clamped).
    pub capacity: usize,
    /// α: fraction of `capacity` kept in an overflowing bucket after the
    /// spill, in [0, 1).
    pub alpha: f64,
}

/// Default memory budget of a table, MiB ([`SozuConfig::ram_mib`]).
pub const DEFAULT_RAM_MIB: usize = 512;

/// A generation's journal ends (a checkpoint starts the next one) once it
/// passes 1/`JOURNAL_SHARE` of the bytes of the table's other files, or
/// [`SozuConfig::checkpoint_bytes`] if less, but not before
/// [`JOURNAL_FLOOR`]: the page files hold 1.36–1.48× the live payload
/// (`docs/benchmarks-history.md`, Sozu round 26), so a journal of 2.5 % of them keeps
/// the bytes on disk under 1.5× the payload between checkpoints
/// (`docs/sozu-format.md`, "Rotation").
pub const JOURNAL_SHARE: u64 = 40;

/// The least journal bound, bytes (64 MiB, the default
/// [`SozuConfig::checkpoint_bytes`]; less if `checkpoint_bytes` is less).
/// Each generation's end writes every pinned page it changed (nearly all of
/// the pinned layers, up to their share of `ram_mib`), so the bound sets how
/// often that happens: with 4 MiB, the benchmark's 1M-entry table (every
/// layer pinned) spent 43 % more CPU per block than with 16 MiB (Sozu round
/// 15), and with 16 MiB 14 % more wall time and 7 % more CPU than with
/// 64 MiB (round 18), a full checkpoint every ~30 blocks against every ~120. The
/// price: a table of less than ~2.5 GB of files may hold up to 64 MiB of
/// journal between checkpoints (at rest, after a checkpoint, none).
pub const JOURNAL_FLOOR: u64 = 64 << 20;

/// Configuration of a [`super::SozuTable`]. `page_size`, `layer0_bits`,
/// `growth_bits` and `shards` are fixed when the table is created and read
/// back from its header afterwards (the values given at a later open are
/// ignored); the others apply to each open.
#[derive(Clone, Debug, PartialEq)]
pub struct SozuConfig {
    /// Bucket (page) size in bytes, a power of two in 512..=32,768; 4,096
    /// by default.
    pub page_size: usize,
    /// log2 of the number of layer-0 buckets (default 12: 4,096 buckets, 16 MiB).
    pub layer0_bits: u8,
    /// g: layer i+1 has 2^g times the buckets of layer i, in 1..=4
    /// (default 1: two children per bucket, so the deepest layer in use,
    /// which is never full, is at most about half of all pages;
    /// `docs/benchmarks-history.md`, Sozu round 5, measured 1 against 2 and 3).
    pub growth_bits: u8,
    /// Per-layer capacity and α, from layer 0 down; the last item applies to
    /// every deeper layer. Default: 3,000 / 3,600 / 4,064 bytes (a 4 KiB
    /// page's whole payload) with α 0.5 / 0.75 / 0.93 — room in the top
    /// layers for a block's new outputs, full pages below. Below layer 1
    /// the pages keep 3,779 bytes after a spill (3,600 with 4,000 bytes and
    /// α 0.9 until Sozu round 26 of `docs/benchmarks-history.md`): the deepest layers in
    /// use, never full, then hold fewer entries, and the bench's 1M-entry
    /// table takes 1.48x its live payload on disk instead of 1.55x, for 1 %
    /// more page images per block.
    pub layers: Vec<LayerConfig>,
    /// α of the layers `ram_mib` does not pin (the disk layers), replacing
    /// that of [`SozuConfig::layers`] there; `None` keeps `layers`' α.
    /// A lower α leaves room in a disk page after its spill and makes its
    /// disk pages emptier; it was meant to make spills out of disk pages
    /// larger and rarer, but at 20M entries in the benchmark α 0.75 left
    /// the spills per disk layer and the page reads unchanged, cut the
    /// checkpointed images by 10 % and took bytes on disk from 1.40x to
    /// 1.49x the live payload (`docs/sozu-format.md`, "Spill policy";
    /// `docs/benchmarks-history.md`, Sozu round 14).
    pub disk_alpha: Option<f64>,
    /// Memory budget of the table's pages, MiB (default
    /// [`DEFAULT_RAM_MIB`]): five eighths pin the top layers in memory (as
    /// many whole layers as fit), one eighth caches other pages by
    /// recency, a quarter plus what the pinned layers leave of their five
    /// eighths holds pages committed and not yet checkpointed and the
    /// copies a running checkpoint holds of pages edited since it started
    /// (a checkpoint starts when the pages exceed it less an eighth of the
    /// budget; a commit waits for a running one when both together exceed
    /// it). The page summaries (about 3 bytes per entry) come on top.
    pub ram_mib: usize,
    /// Overrides the number of pinned top layers that `ram_mib` gives
    /// (tests: 0 sends every lookup through the page cache and summaries).
    pub ram_layers: Option<u8>,
    /// Overrides the bytes of committed disk-layer pages not yet in their
    /// files past which a commit starts a checkpoint of the disk layers
    /// only (`docs/sozu-format.md`, "Checkpoints of the disk layers"),
    /// which `ram_mib` gives (tests: a few KiB make such checkpoints
    /// frequent).
    pub unflushed_bytes: Option<u64>,
    /// Scripts longer than this many bytes are stored out of line in the
    /// records files (default 100; at most 1,000).
    pub inline_script_max: usize,
    /// A checkpoint that starts a new generation starts at the first commit
    /// after the journal of the current generation grows past this many
    /// bytes (default 64 MiB), or past 1/[`JOURNAL_SHARE`] of the table's
    /// other files if that is less, but at least [`JOURNAL_FLOOR`] (64 MiB:
    /// with the default, every generation's bound is 64 MiB); in
    /// between, the memory bound starts checkpoints of the disk layers
    /// only. Open replays up to this many bytes of journal.
    pub checkpoint_bytes: u64,
    /// Whether checkpoints run on a background thread while commits go on
    /// (default true); false runs them inside the commit that starts them.
    pub background_checkpoints: bool,
    /// Whether open reads and verifies every page (default true; costs one
    /// sequential read of the table, and builds every page summary).
    pub verify_on_open: bool,
    /// Number of shards by hash prefix (power of two, ≤ 8; 1 = off).
    pub shards: u8,
    /// Spill policy (`docs/sozu-format.md`, "Spill policy"): true (default)
    /// sends an overflowing bucket's spill to as few children as possible,
    /// chosen by the spill order; false sends it to every child, as seed
    /// 000 does.
    pub spill_fewest_children: bool,
    /// Where entries consumed on the best chain come in the spill order
    /// (default [`SpillConsumed::LastIntoDisk`]). Read at each spill, not
    /// stored.
    pub spill_consumed: SpillConsumed,
    /// A records segment is compacted once at least this many bytes long
    /// and more than half dead (default 16 MiB; `docs/sozu-format.md`,
    /// "Records files").
    pub records_compact_min: u64,
}

/// The first key of the spill order (`docs/sozu-format.md`, "Spill
/// policy"): whether the entries of an overflowing bucket that are consumed
/// on the best chain flow down before the others or after them. A consumed
/// entry is purged [`super::PURGE_DEPTH`] blocks after its spend, when its
/// page is next rewritten; flowing first carries it down meanwhile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpillConsumed {
    /// The Sozu paper literally: consumed entries flow first in every layer, so
    /// that live entries stay up.
    First,
    /// First while the spill goes to a pinned layer, last when it goes to
    /// a layer `ram_mib` does not pin (the default): a consumed entry waits
    /// for its purge in the pinned layers or in the disk page that holds
    /// it, instead of being carried through the disk layers. At 20M entries
    /// in the benchmark this cut the entries spilled into the disk layers
    /// by 22 % and the page reads from files by 9 %; a table that the
    /// pinned layers hold whole spills as with `First` (`docs/benchmarks-history.md`,
    /// Sozu round 17).
    LastIntoDisk,
    /// Consumed entries flow last in every layer: fewer spills still, but
    /// live outputs sink sooner and their spends read deeper (+7 % per
    /// block at 1M entries in the benchmark, round 17).
    Last,
}

impl SpillConsumed {
    /// Whether consumed entries flow first in a spill into a pinned layer
    /// (`into_pinned`) or into a disk layer.
    pub(super) fn first_into(self, into_pinned: bool) -> bool {
        match self {
            Self::First => true,
            Self::LastIntoDisk => into_pinned,
            Self::Last => false,
        }
    }
}

impl Default for SozuConfig {
    fn default() -> Self {
        Self {
            page_size: 4096,
            layer0_bits: 12,
            growth_bits: 1,
            layers: vec![
                LayerConfig {
                    capacity: 3000,
                    alpha: 0.5,
                },
                LayerConfig {
                    capacity: 3600,
                    alpha: 0.75,
                },
                LayerConfig {
                    capacity: 4064,
                    alpha: 0.93,
                },
            ],
            disk_alpha: None,
            ram_mib: DEFAULT_RAM_MIB,
            ram_layers: None,
            unflushed_bytes: None,
            inline_script_max: 100,
            checkpoint_bytes: 64 << 20,
            background_checkpoints: true,
            verify_on_open: true,
            shards: 1,
            spill_fewest_children: true,
            spill_consumed: SpillConsumed::LastIntoDisk,
            records_compact_min: 16 << 20,
        }
    }
}

impl SozuConfig {
    /// Checks the options that apply to every open.
    ///
    /// # Errors
    /// [`SozuError::Config`].
    pub(super) fn check(&self) -> Result<(), SozuError> {
        if self.inline_script_max > 1000 || self.layers.is_empty() {
            return Err(SozuError::Config {
                reason: "inline_script_max over 1000 or no layer config",
            });
        }
        if self
            .layers
            .iter()
            .any(|l| !(0.0..1.0).contains(&l.alpha) || l.capacity < 256)
            || self.disk_alpha.is_some_and(|a| !(0.0..1.0).contains(&a))
        {
            return Err(SozuError::Config {
                reason: "layer alpha must be in [0,1), capacity ≥ 256 bytes",
            });
        }
        Ok(())
    }

    /// Checks the options fixed at creation.
    ///
    /// # Errors
    /// [`SozuError::Config`].
    pub(super) fn check_geometry(&self) -> Result<(), SozuError> {
        let ps = self.page_size;
        if !ps.is_power_of_two() || !(MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&ps) {
            return Err(SozuError::Config {
                reason: "page_size must be a power of two in 512..=32768",
            });
        }
        if !(1..=32).contains(&self.layer0_bits)
            || !(1..=MAX_GROWTH_BITS).contains(&self.growth_bits)
        {
            return Err(SozuError::Config {
                reason: "layer0_bits in 1..=32, growth_bits in 1..=4",
            });
        }
        let s = self.shards;
        if s == 0
            || s > 8
            || !s.is_power_of_two()
            || s.trailing_zeros() > u32::from(self.layer0_bits)
        {
            return Err(SozuError::Config {
                reason: "shards must be a power of two ≤ 8 and ≤ layer-0 buckets",
            });
        }
        Ok(())
    }
}

/// How a table's memory budget is spent (per table, all shards together).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MemoryPlan {
    /// Top layers pinned in memory.
    pub(super) ram_layers: u8,
    /// Bytes of clean disk pages the caches keep (split across shards).
    pub(super) cache_bytes: u64,
    /// Bytes of committed disk pages not yet checkpointed beyond which a
    /// checkpoint starts.
    pub(super) unflushed_bytes: u64,
    /// Bound on those bytes plus the page images held twice while a
    /// checkpoint runs (its images that commits have since replaced,
    /// pinned or not): a commit that finds it passed waits for the
    /// checkpoint. [`MemoryPlan::unflushed_bytes`] leaves an eighth of the
    /// budget below it for that.
    pub(super) in_flight_bytes: u64,
}

impl MemoryPlan {
    /// The plan for `cfg` over a table of the given geometry: as many whole
    /// top layers as fit five eighths of the budget (layer 0 always), one
    /// eighth for the caches, a quarter for unflushed pages plus what the
    /// pinned layers leave of their five eighths, of which an eighth of the
    /// budget is kept for the copies a running checkpoint holds.
    pub(super) fn new(cfg: &SozuConfig, page_size: usize, b0: u32, g: u32, max_layer: u8) -> Self {
        let budget = (cfg.ram_mib as u64) << 20;
        let pinned = budget / 8 * 5;
        // A pinned page is edited in nearly every block: it holds its edit
        // allocation, not just its used bytes.
        let held = super::page::edit_capacity(page_size) as u64;
        let layer_bytes = |n: u8| {
            let pages = 1u64.checked_shl(b0 + u32::from(n) * g).unwrap_or(u64::MAX);
            pages.saturating_mul(held)
        };
        let ram_layers = cfg.ram_layers.unwrap_or_else(|| {
            let mut total = 0u64;
            let mut n = 0u8;
            while n <= max_layer {
                total = total.saturating_add(layer_bytes(n));
                if total > pinned && n > 0 {
                    break;
                }
                n += 1;
            }
            n
        });
        let ram_layers = ram_layers.min(max_layer.saturating_add(1));
        let pinned_used = (0..ram_layers).fold(0u64, |t, n| t.saturating_add(layer_bytes(n)));
        let floor = 256 * page_size as u64;
        let in_flight = (budget / 4 + pinned.saturating_sub(pinned_used)).max(2 * floor);
        Self {
            ram_layers,
            cache_bytes: (budget / 8).max(64 * page_size as u64),
            unflushed_bytes: cfg
                .unflushed_bytes
                .unwrap_or_else(|| in_flight.saturating_sub(budget / 8).max(floor)),
            in_flight_bytes: in_flight,
        }
    }

    /// Whether a commit must wait for the running checkpoint: the disk
    /// pages not yet in their files (`unflushed`) and the images held twice
    /// (`held_twice`), bytes, together past their share.
    pub(super) fn must_wait(&self, unflushed: u64, held_twice: u64) -> bool {
        unflushed.saturating_add(held_twice) > self.in_flight_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_alpha_out_of_range_is_refused() {
        for a in [1.0, -0.1, f64::NAN] {
            let cfg = SozuConfig {
                disk_alpha: Some(a),
                ..SozuConfig::default()
            };
            assert!(matches!(cfg.check(), Err(SozuError::Config { .. })), "{a}");
        }
        let ok = SozuConfig {
            disk_alpha: Some(0.5),
            ..SozuConfig::default()
        };
        assert!(ok.check().is_ok());
    }

    #[test]
    fn budget_pins_whole_layers() {
        let cfg = SozuConfig {
            ram_mib: 512,
            ..SozuConfig::default()
        };
        // b0 = 10, g = 1: 1,024 + 2,048 + … pages of 4 KiB, each held in
        // a 5 KiB allocation; 320 MiB pinned hold layers 0–5 (63 × 1,024
        // pages = 315 MiB), not layer 6 too.
        let p = MemoryPlan::new(&cfg, 4096, 10, 1, 20);
        assert_eq!(p.ram_layers, 6);
        assert_eq!(p.cache_bytes, 64 << 20);
        // A quarter, plus the 320 − 315 MiB the pinned layers leave; a
        // checkpoint starts an eighth below that.
        assert_eq!(p.in_flight_bytes, (128 + 320 - 315) << 20);
        assert_eq!(p.unflushed_bytes, (128 + 320 - 315 - 64) << 20);
        // The copies count: a commit waits once both pass the share.
        assert!(!p.must_wait(p.unflushed_bytes, 64 << 20));
        assert!(p.must_wait(p.unflushed_bytes, (64 << 20) + 1));
        assert!(p.must_wait(p.in_flight_bytes + 1, 0));
        // Layer 0 is pinned whatever the budget; an override wins.
        let tiny = SozuConfig {
            ram_mib: 1,
            ..cfg.clone()
        };
        assert_eq!(MemoryPlan::new(&tiny, 4096, 12, 1, 20).ram_layers, 1);
        let over = SozuConfig {
            ram_layers: Some(0),
            ..cfg
        };
        assert_eq!(MemoryPlan::new(&over, 4096, 10, 1, 20).ram_layers, 0);
    }
}
