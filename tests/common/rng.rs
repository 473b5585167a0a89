//! The tests' one random generator: ChaCha8 (`rand_chacha`) from a 64-bit
//! seed, so a run that fails replays from the seed it printed. ChaCha's
//! output is the same on every platform and `rand_chacha` version, so a
//! seed names one stream.

use std::time::Duration;

use rand::distributions::uniform::SampleUniform;
use rand::{Rng as _, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A seeded ChaCha8 stream and the seed it came from.
#[derive(Clone, Debug)]
pub struct Rng {
    seed: u64,
    stream: ChaCha8Rng,
}

impl Rng {
    /// The stream of `seed` (`ChaCha8Rng::seed_from_u64`).
    pub fn new(seed: u64) -> Self {
        Rng {
            seed,
            stream: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// Seeded from `KAKEHI_SEED` when set, else from the clock; prints the
    /// seed under `what`, with the variable that replays it.
    pub fn from_env_or_clock(what: &str) -> Self {
        let seed = std::env::var("KAKEHI_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
        eprintln!("{what} seed {seed} (KAKEHI_SEED={seed} replays it)");
        Rng::new(seed)
    }

    /// The seed this stream started from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.stream.next_u64()
    }

    /// Uniform in `0..n`; 0 when `n` is 0 (or below).
    pub fn below<T: SampleUniform + PartialOrd + Default + Copy>(&mut self, n: T) -> T {
        let zero = T::default();
        if n > zero {
            self.stream.gen_range(zero..n)
        } else {
            zero
        }
    }

    /// Uniform in `lo..hi` milliseconds (`lo` when `hi <= lo`).
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi.saturating_sub(lo)))
    }

    /// 32 random bytes.
    pub fn bytes32(&mut self) -> [u8; 32] {
        let mut b = [0u8; 32];
        self.stream.fill_bytes(&mut b);
        b
    }
}
