//! The per-run filter over the keys' 8-byte prefixes: a blocked Bloom
//! filter (one 512-bit block per prefix, [`PROBES`] bits set in it), about
//! [`BITS_PER_KEY`] bits per distinct prefix, false-positive rate about 1 %
//! (measured in the unit test below).
//!
//! Every lookup of the row store names at least an 8-byte prefix (a txid
//! or script-hash prefix), so one probe per run tells most runs apart
//! without reading them: the writer's `tx_maybe_known` for every
//! transaction of every block is the hot path. xorf's binary fuse filters
//! were the first choice (the crate is in the build for the archive), but
//! their fields are private and serde is their only way out and in, which
//! would cost a JSON value per fingerprint at every open; this filter is
//! its bytes as they are on disk.

/// Bits per distinct prefix.
pub const BITS_PER_KEY: usize = 10;
/// Bits set per prefix, all in one 512-bit block.
const PROBES: u32 = 6;
/// Bytes of a block (one cache line): a lookup reads one block.
pub const BLOCK_BYTES: usize = 64;

/// A filter over `u64` prefixes, as the writer builds it; its bytes are
/// its on-disk form (read back one block at a time: [`block_of`],
/// [`block_may_contain`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bloom {
    bytes: Box<[u8]>,
}

/// The block holding `prefix`'s bits in a filter of `blocks` blocks (the
/// prefix is a hash prefix already; the multiply spreads it anyway).
pub fn block_of(prefix: u64, blocks: usize) -> usize {
    let h = prefix.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (((h >> 32) * blocks as u64) >> 32) as usize
}

/// The bit positions of `prefix` within its block.
fn bits(prefix: u64) -> [u32; PROBES as usize] {
    let mut g = (prefix ^ (prefix >> 31)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let mut bits = [0u32; PROBES as usize];
    for b in &mut bits {
        *b = (g & 511) as u32;
        g >>= 9;
    }
    bits
}

/// Whether `prefix` may have been added, given its block's
/// [`BLOCK_BYTES`] bytes (`false`: it was not).
pub fn block_may_contain(block: &[u8], prefix: u64) -> bool {
    bits(prefix).iter().all(|&bit| {
        block
            .get((bit / 8) as usize)
            .is_some_and(|b| b & (1 << (bit % 8)) != 0)
    })
}

impl Bloom {
    /// An empty filter sized for `keys` distinct prefixes (at least one
    /// block).
    pub fn with_capacity(keys: usize) -> Bloom {
        let blocks = (keys * BITS_PER_KEY).div_ceil(BLOCK_BYTES * 8).max(1);
        Bloom {
            bytes: vec![0u8; blocks * BLOCK_BYTES].into_boxed_slice(),
        }
    }

    /// The on-disk form.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Adds `prefix`.
    pub fn insert(&mut self, prefix: u64) {
        let block = block_of(prefix, self.bytes.len() / BLOCK_BYTES);
        let b = &mut self.bytes[block * BLOCK_BYTES..][..BLOCK_BYTES];
        for bit in bits(prefix) {
            b[(bit / 8) as usize] |= 1 << (bit % 8);
        }
    }

    /// Whether `prefix` may have been added (`false`: it was not).
    #[cfg(test)]
    pub fn may_contain(&self, prefix: u64) -> bool {
        let block = block_of(prefix, self.bytes.len() / BLOCK_BYTES);
        block_may_contain(&self.bytes[block * BLOCK_BYTES..][..BLOCK_BYTES], prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_false_negatives_and_about_one_percent_false_positives() {
        let key = |i: u64| i.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ (i << 7);
        let mut f = Bloom::with_capacity(100_000);
        for i in 0..100_000 {
            f.insert(key(i));
        }
        assert!((0..100_000).all(|i| f.may_contain(key(i))));
        let fp = (100_000..300_000)
            .filter(|&i| f.may_contain(key(i)))
            .count();
        let rate = fp as f64 / 200_000.0;
        assert!(rate < 0.02, "false-positive rate {rate}");
    }
}
