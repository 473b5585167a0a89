//! The table's geometry: hashing keys to shards, buckets and children
//! (`docs/sozu-format.md`, "Hashing and addressing"), and the keyed 16-bit
//! key signatures of the page summaries.

use siphasher::sip::SipHasher24;

use super::config::{LayerConfig, SpillConsumed};
use super::page::{PageHead, PAGE_HEADER_LEN};
use super::types::OutPointKey;

/// A page's address in its shard: (layer, page number in the layer).
pub(super) type Addr = (u8, u64);

/// The key of the 16-bit key signatures of the page summaries: two words
/// drawn from the table's secret SipHash key, so nobody can choose
/// outpoints whose signatures collide.
///
/// The signatures were once the txid's first two bytes xor the vout:
/// unkeyed. Outputs whose txids share those 16 bits (trivial to grind)
/// defeated the summaries, and a lookup read every page on its descent:
/// 1.575 pages per cold lookup instead of 1.000 at 1M entries
/// (`benches/hash_flood.rs`, BENCHMARKS.md "Hash flooding"). Summaries live
/// in RAM only, so the key changes no byte on disk.
#[derive(Clone, Copy, Debug)]
pub(super) struct SignatureKey {
    k0: u64,
    /// Odd, for the multiply-shift step.
    k1: u64,
}

impl SignatureKey {
    pub(super) fn new(hasher: &SipHasher24) -> Self {
        Self {
            k0: hasher.hash(b"kakehi sozu page signature k0"),
            k1: hasher.hash(b"kakehi sozu page signature k1") | 1,
        }
    }

    /// 16-bit key signature of an outpoint key (as in Lokad's
    /// implementation of the Sozu table): keyed multiply-shift hashing of
    /// txid bytes 8–15 mixed with the vout. Forcing two signatures to
    /// collide needs the key, or two txids equal in those 8 bytes (2^32
    /// work for one pair, 2^64 to hit a given txid); a collision costs one
    /// page read, never a wrong answer.
    pub(super) fn signature(&self, key: &[u8]) -> u16 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&key[8..16]);
        let word = u64::from_le_bytes(w);
        let vout = u64::from(u32::from_be_bytes([key[32], key[33], key[34], key[35]]));
        let vout = vout.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        ((word ^ vout ^ self.k0).wrapping_mul(self.k1) >> 48) as u16
    }
}

/// A page header's descent fields: where below it a key it does not hold
/// may be ([`Geo::child_of`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Descent {
    pub(super) max_child_height: u32,
    pub(super) children: u64,
    pub(super) child_mask: u16,
}

impl Descent {
    pub(super) fn of(h: &PageHead) -> Self {
        Self {
            max_child_height: h.max_child_height,
            children: h.children,
            child_mask: h.child_mask,
        }
    }
}

/// Geometry shared by all shards, fixed for a table's life (from its
/// header) except the layer tuning, which each open may change.
#[derive(Clone, Debug)]
pub(super) struct Geo {
    pub(super) page_size: usize,
    pub(super) b0: u32,
    pub(super) g: u32,
    pub(super) shard_bits: u32,
    pub(super) max_layer: u8,
    /// Layers 0..ram_layers are pinned in memory.
    pub(super) ram_layers: u8,
    pub(super) layers: Vec<LayerConfig>,
    /// [`super::SozuConfig::disk_alpha`]: α of the layers from
    /// `ram_layers` down, if set.
    pub(super) disk_alpha: Option<f64>,
    pub(super) inline_script_max: usize,
    pub(super) spill_fewest_children: bool,
    pub(super) spill_consumed: SpillConsumed,
    pub(super) hasher: SipHasher24,
    pub(super) signature_key: SignatureKey,
}

impl Geo {
    pub(super) fn hash(&self, key: &OutPointKey) -> u64 {
        self.hasher.hash(key)
    }
    pub(super) fn shard_of(&self, h: u64) -> u8 {
        if self.shard_bits == 0 {
            0
        } else {
            (h >> (64 - self.shard_bits)) as u8
        }
    }
    /// Layer-0 pages of one shard.
    pub(super) fn layer0_pages(&self) -> u64 {
        1u64 << (self.b0 - self.shard_bits)
    }
    pub(super) fn layer0_page(&self, h: u64) -> u64 {
        (h >> (64 - self.b0)) & (self.layer0_pages() - 1)
    }
    /// Index of the child (within its group) covering `h` at `layer` ≥ 1.
    pub(super) fn child_index(&self, h: u64, layer: u8) -> u64 {
        let bits = self.b0 + u32::from(layer) * self.g;
        (h >> (64 - bits)) & ((1u64 << self.g) - 1)
    }
    /// Bit of the child covering `h` at `layer` ≥ 1 in its parent's
    /// written-children mask.
    pub(super) fn child_bit(&self, h: u64, layer: u8) -> u16 {
        1u16 << self.child_index(h, layer)
    }
    /// Page of the child covering `h`; saturating, so a damaged `children`
    /// field reads past the file and is reported as corruption.
    pub(super) fn child_page(&self, children: u64, h: u64, layer: u8) -> u64 {
        children
            .saturating_sub(1)
            .saturating_mul(1 << self.g)
            .saturating_add(self.child_index(h, layer))
    }
    /// The page one layer down where a key of hash `h` that a page (at
    /// `layer`, descent fields `d`) does not hold may be: the child
    /// covering `h`, if written and if entries produced at `min_height` or
    /// later ever went below (the Sozu paper's `ReadSozu` early stop; 0: no floor).
    pub(super) fn child_of(&self, d: Descent, h: u64, layer: u8, min_height: u32) -> Option<u64> {
        (layer < self.max_layer
            && d.children != 0
            && d.child_mask & self.child_bit(h, layer + 1) != 0
            && d.max_child_height >= min_height)
            .then(|| self.child_page(d.children, h, layer + 1))
    }
    /// The pages of the children a page's descent fields say exist.
    pub(super) fn children_of(&self, d: Descent) -> impl Iterator<Item = u64> {
        let base = d.children.saturating_sub(1).saturating_mul(1 << self.g);
        let mask = if d.children == 0 { 0 } else { d.child_mask };
        (0..(1u64 << self.g))
            .filter(move |c| mask & (1 << c) != 0)
            .map(move |c| base.saturating_add(c))
    }
    /// Capacity (clamped to a page's payload) and α of `layer` (that of
    /// [`Geo::disk_alpha`] below the pinned layers, when set).
    pub(super) fn layer_cfg(&self, layer: u8) -> LayerConfig {
        let c = self
            .layers
            .get(layer as usize)
            .or(self.layers.last())
            .copied()
            .unwrap_or(LayerConfig {
                capacity: self.page_size,
                alpha: 0.5,
            });
        let alpha = match self.disk_alpha {
            Some(a) if !self.is_ram(layer) => a,
            _ => c.alpha,
        };
        LayerConfig {
            capacity: c.capacity.min(self.page_size - PAGE_HEADER_LEN),
            alpha,
        }
    }
    pub(super) fn is_ram(&self, layer: u8) -> bool {
        layer < self.ram_layers
    }
}
