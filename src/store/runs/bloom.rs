//! The per-run filter over the keys' 8-byte prefixes: a blocked Bloom
//! filter (one 512-bit block per prefix, [`PROBES`] bits set in it), about
//! [`BITS_PER_KEY`] bits per key, false-positive rate about 1 % (measured
//! in the unit test below).
//!
//! Every lookup of the row store names at least an 8-byte prefix (a txid
//! or script-hash prefix), so one probe per run tells most runs apart
//! without reading them: the writer's `tx_maybe_known` for every
//! transaction of every block is the hot path. xorf's binary fuse filters
//! were the first choice (the crate is in the build for the archive), but
//! their fields are private and serde is their only way out and in, which
//! would cost a JSON value per fingerprint at every open; this filter is
//! its bytes as they are on disk.
//!
//! A prefix's block is chosen by the prefix's value, in order
//! ([`block_of`]: prefix × blocks / 2⁶⁴). The prefixes are hash prefixes
//! (txids, script hashes), uniform over `u64`, so the blocks fill as
//! evenly as with a hashed choice; and since a run's keys are written in
//! ascending order, its filter's blocks are finished in ascending order
//! too: the writer keeps only the partition it is filling and writes each
//! as the keys pass it, whatever the run's size (`run.rs`). Prefixes
//! bunched in a narrow range (not hashes) only cost false positives, never
//! a missed key.

/// Bits per key.
pub const BITS_PER_KEY: usize = 10;
/// Bits set per prefix, all in one 512-bit block.
const PROBES: u32 = 6;
/// Bytes of a block (one cache line): a lookup reads one block.
pub const BLOCK_BYTES: usize = 64;

/// Bytes of the filter of a run of at most `keys` keys (at least one
/// block).
pub fn filter_bytes(keys: u64) -> Option<u64> {
    let bits = keys.checked_mul(BITS_PER_KEY as u64)?;
    let blocks = bits.div_ceil(BLOCK_BYTES as u64 * 8).max(1);
    blocks.checked_mul(BLOCK_BYTES as u64)
}

/// The block holding `prefix`'s bits in a filter of `blocks` blocks:
/// ⌊prefix × blocks / 2⁶⁴⌋, so ascending prefixes give ascending blocks.
pub fn block_of(prefix: u64, blocks: usize) -> usize {
    ((u128::from(prefix) * blocks as u128) >> 64) as usize
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

/// Sets `prefix`'s bits in its block's [`BLOCK_BYTES`] bytes `block`.
pub fn insert(block: &mut [u8], prefix: u64) {
    for bit in bits(prefix) {
        if let Some(b) = block.get_mut((bit / 8) as usize) {
            *b |= 1 << (bit % 8);
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A whole filter in memory, as the writer makes it partition by
    /// partition.
    fn filter(keys: &[u64]) -> Vec<u8> {
        let len = filter_bytes(keys.len() as u64).unwrap() as usize;
        let mut f = vec![0u8; len];
        for &k in keys {
            let b = block_of(k, len / BLOCK_BYTES);
            insert(&mut f[b * BLOCK_BYTES..][..BLOCK_BYTES], k);
        }
        f
    }

    fn may_contain(f: &[u8], k: u64) -> bool {
        let b = block_of(k, f.len() / BLOCK_BYTES);
        block_may_contain(&f[b * BLOCK_BYTES..][..BLOCK_BYTES], k)
    }

    #[test]
    fn no_false_negatives_and_about_one_percent_false_positives() {
        let key = |i: u64| i.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ (i << 7);
        let mut keys: Vec<u64> = (0..100_000).map(key).collect();
        keys.sort_unstable();
        let f = filter(&keys);
        assert!(keys.iter().all(|&k| may_contain(&f, k)));
        let fp = (100_000..300_000)
            .filter(|&i| may_contain(&f, key(i)))
            .count();
        let rate = fp as f64 / 200_000.0;
        assert!(rate < 0.02, "false-positive rate {rate}");
    }

    #[test]
    fn blocks_ascend_with_prefixes() {
        for blocks in [1usize, 7, 1 << 20] {
            assert_eq!(block_of(0, blocks), 0);
            assert_eq!(block_of(u64::MAX, blocks), blocks - 1);
            let mut last = 0;
            for i in 0..10_000u64 {
                let b = block_of(i * (u64::MAX / 10_000), blocks);
                assert!(b >= last && b < blocks);
                last = b;
            }
        }
        assert_eq!(filter_bytes(0), Some(64));
        assert_eq!(filter_bytes(u64::MAX), None);
    }
}
