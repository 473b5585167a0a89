//! The per-epoch binary fuse filter over outpoint keys (the archival
//! filter of Stellar CAP-57), used to find the epochs that
//! may hold an outpoint.
//!
//! `xorf::BinaryFuse16`: about 18 bits per key and a false-positive rate of
//! about 2⁻¹⁶ (measured in `benches/archive.rs`, see BENCHMARKS.md). The
//! filter is a local index, not part of any commitment: a false positive
//! costs one binary search of an epoch file, a false negative cannot happen.
//! Construction is deterministic (xorf seeds its hash from a fixed counter),
//! so two nodes build identical filters from identical epochs. xorf builds
//! it; reading it back (at every load of an evicted filter, see
//! `archive/store.rs`) and looking keys up are done here on its bytes, as
//! xorf 0.11 does (checked against xorf in the tests): a load is a copy of
//! the fingerprints, not a JSON value per fingerprint through serde.

use bitcoin::hashes::{sha256, Hash};
use xorf::BinaryFuse16;

use crate::primitives::OutPointKey;

/// The 64-bit filter key of an outpoint: the first 8 bytes, little-endian,
/// of `SHA256(outpoint key)` (36-byte key: txid internal order, vout BE).
pub fn filter_key(key: &OutPointKey) -> u64 {
    let h = sha256::Hash::hash(key).to_byte_array();
    u64::from_le_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]])
}

/// A binary fuse filter's fields as xorf 0.11's `BinaryFuse16` has them,
/// read without xorf: its fields are private and serde is their only way
/// in, which cost a JSON value per fingerprint at every load. Lookups
/// follow `bfuse_contains_impl` (xorf `src/prelude/bfuse.rs`), checked
/// against xorf's own `contains` in the tests below.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fuse {
    seed: u64,
    segment_length: u32,
    segment_length_mask: u32,
    segment_count_length: u32,
    fingerprints: Box<[u16]>,
}

impl Fuse {
    /// Whether `key` may be in the set (xorf's `contains`: murmur3's
    /// finalizer of key + seed, the fingerprint `h ^ h >> 32`, and the
    /// three positions of `hash_of_hash`, whose fingerprints XOR to it).
    fn contains(&self, key: u64) -> bool {
        let mut h = key.wrapping_add(self.seed);
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^= h >> 33;
        let f = (h ^ (h >> 32)) as u16;
        let h0 = ((u128::from(h) * u128::from(self.segment_count_length)) >> 64) as u32;
        let h1 = (h0 + self.segment_length) ^ (((h >> 18) as u32) & self.segment_length_mask);
        let h2 = (h0 + 2 * self.segment_length) ^ ((h as u32) & self.segment_length_mask);
        let at = |i: u32| self.fingerprints.get(i as usize).copied().unwrap_or(0);
        f ^ at(h0) ^ at(h1) ^ at(h2) == 0
    }
}

/// An epoch's filter. `None` inside when the epoch holds no spent output.
#[derive(Debug, Clone)]
pub struct EpochFilter(Option<Fuse>);

/// Encoded size of a filter's fixed part: seed u64, segment_length u32,
/// segment_length_mask u32, segment_count_length u32, fingerprint count u32.
const FIXED: usize = 8 + 4 * 4;

impl EpochFilter {
    /// Builds the filter over `keys` (duplicates are removed first), with
    /// xorf's `BinaryFuse16`.
    ///
    /// # Errors
    /// xorf's construction error (it gives up after 1,000 seeds; with
    /// distinct keys this does not happen in practice).
    pub fn build(mut keys: Vec<u64>) -> Result<EpochFilter, &'static str> {
        keys.sort_unstable();
        keys.dedup();
        if keys.is_empty() {
            return Ok(EpochFilter(None));
        }
        let f = BinaryFuse16::try_from(&keys)?;
        // The private fields, through serde (once per seal).
        let v = serde_json::to_value(&f).map_err(|_| "filter fields unreadable")?;
        let num = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
        Ok(EpochFilter(Some(Fuse {
            seed: num("seed"),
            segment_length: num("segment_length") as u32,
            segment_length_mask: num("segment_length_mask") as u32,
            segment_count_length: num("segment_count_length") as u32,
            fingerprints: f.fingerprints,
        })))
    }

    /// Whether the epoch may hold the outpoint with this filter key.
    pub fn may_contain(&self, key: u64) -> bool {
        self.0.as_ref().is_some_and(|f| f.contains(key))
    }

    /// Number of 16-bit fingerprints (the filter's size is twice this, in
    /// bytes).
    pub fn fingerprints(&self) -> usize {
        self.0.as_ref().map_or(0, |f| f.fingerprints.len())
    }

    /// Serializes: an empty vector for an empty filter, else seed u64,
    /// segment_length u32, segment_length_mask u32, segment_count_length
    /// u32, fingerprint count u32, then the fingerprints as u16, all
    /// big-endian.
    pub fn to_bytes(&self) -> Vec<u8> {
        let Some(f) = &self.0 else { return Vec::new() };
        let mut out = Vec::with_capacity(FIXED + 2 * f.fingerprints.len());
        out.extend_from_slice(&f.seed.to_be_bytes());
        for n in [
            f.segment_length,
            f.segment_length_mask,
            f.segment_count_length,
            f.fingerprints.len() as u32,
        ] {
            out.extend_from_slice(&n.to_be_bytes());
        }
        for fp in f.fingerprints.iter() {
            out.extend_from_slice(&fp.to_be_bytes());
        }
        out
    }

    /// Parses [`EpochFilter::to_bytes`], checking that every lookup stays in
    /// bounds (segment length a power of two, mask = length − 1, the
    /// fingerprint array covers `segment_count_length + 2 × segment_length`).
    ///
    /// # Errors
    /// A reason when the bytes are malformed.
    pub fn from_bytes(b: &[u8]) -> Result<EpochFilter, &'static str> {
        if b.is_empty() {
            return Ok(EpochFilter(None));
        }
        if b.len() < FIXED {
            return Err("filter truncated");
        }
        let u = |at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let mut s = [0u8; 8];
        s.copy_from_slice(&b[..8]);
        let seed = u64::from_be_bytes(s);
        let (sl, mask, scl, count) = (u(8), u(12), u(16), u(20) as usize);
        if b.len() != FIXED + 2 * count {
            return Err("filter length does not match its fingerprint count");
        }
        if sl == 0 || !sl.is_power_of_two() || mask != sl - 1 || scl % sl != 0 {
            return Err("filter segment parameters inconsistent");
        }
        if (scl as u64) + 2 * (sl as u64) > count as u64 {
            return Err("filter fingerprint array too short for its segments");
        }
        let fingerprints = b[FIXED..]
            .chunks_exact(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
            .collect();
        Ok(EpochFilter(Some(Fuse {
            seed,
            segment_length: sl,
            segment_length_mask: mask,
            segment_count_length: scl,
            fingerprints,
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_membership() {
        let keys: Vec<u64> = (0u32..3000)
            .map(|i| filter_key(&[i as u8; 36]) ^ u64::from(i))
            .collect();
        let f = EpochFilter::build(keys.clone()).unwrap();
        let b = f.to_bytes();
        let g = EpochFilter::from_bytes(&b).unwrap();
        assert_eq!(g.to_bytes(), b);
        assert!(keys.iter().all(|k| g.may_contain(*k)));
        let mut bad = b.clone();
        bad[11] ^= 1; // segment_length
        assert!(EpochFilter::from_bytes(&bad).is_err());
        assert!(!EpochFilter::build(vec![]).unwrap().may_contain(1));
    }

    /// The lookup read without xorf answers as xorf's own `contains`, for
    /// every member and 200,000 other keys, over filters of 1 to 100,000
    /// keys (segment lengths from the smallest up), also after a round
    /// trip through the bytes.
    #[test]
    fn lookup_equals_xorfs_contains() {
        use xorf::Filter;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for n in [1usize, 2, 3, 100, 5_000, 100_000] {
            let keys: Vec<u64> = (0..n).map(|_| next()).collect();
            let xorf = BinaryFuse16::try_from(&keys).unwrap();
            let ours =
                EpochFilter::from_bytes(&EpochFilter::build(keys.clone()).unwrap().to_bytes())
                    .unwrap();
            assert!(keys.iter().all(|k| ours.may_contain(*k)), "{n}");
            let mut positives = 0;
            for _ in 0..200_000 {
                let k = next();
                assert_eq!(ours.may_contain(k), xorf.contains(&k), "{n} {k}");
                positives += usize::from(xorf.contains(&k));
            }
            assert!(positives < 50, "{n}: {positives}");
        }
    }

    /// Two builds from the same keys are byte-identical. Fails if xorf's
    /// default `uniform-random` feature gets enabled anywhere in the build
    /// (it fills unused slots from a thread RNG).
    #[test]
    fn construction_is_deterministic() {
        let keys: Vec<u64> = (0u32..5000)
            .map(|i| filter_key(&[(i % 251) as u8; 36]) ^ u64::from(i))
            .collect();
        let mut rev = keys.clone();
        rev.reverse();
        let a = EpochFilter::build(keys).unwrap().to_bytes();
        let b = EpochFilter::build(rev).unwrap().to_bytes();
        assert!(a == b);
    }
}
