//! MuHash3072's cost per element and of the digest (Bitcoin Core's
//! `crypto/muhash.cpp`, kakehi's `muhash` module): an insertion of N
//! 60-byte elements (`MuHash3072::insert`), the same elements' numbers
//! alone (`MuHash3072::of`: SHA-256 and the ChaCha20 keystream, no
//! product), their difference (one 3072-bit modular product), and one
//! digest (`finalize`: the modular inversion). N = 20,000 by default
//! (`KAKEHI_BENCH_N`).
//!
//! Run: `cargo bench --bench muhash`.

#[path = "common/env.rs"]
mod env;

use std::hint::black_box;
use std::time::Instant;

use env::env_or;
use kakehi::muhash::MuHash3072;

fn main() {
    let n: u32 = env_or("KAKEHI_BENCH_N", 20_000u32).max(1);
    let data: Vec<[u8; 60]> = (0..n)
        .map(|i| {
            let mut d = [7u8; 60];
            d[..4].copy_from_slice(&i.to_le_bytes());
            d
        })
        .collect();

    let t = Instant::now();
    let mut acc = MuHash3072::new();
    for d in &data {
        acc.insert(black_box(d));
    }
    let insert = t.elapsed() / n;

    let t = Instant::now();
    for d in &data {
        black_box(MuHash3072::of(black_box(d)));
    }
    let number = t.elapsed() / n;

    let t = Instant::now();
    let digest = black_box(&acc).finalize();
    let finalize = t.elapsed();

    println!(
        "muhash: {n} elements: insert {insert:?} each = element's number \
         (sha256 + chacha20) {number:?} + one product {:?}; digest {finalize:?} ({:02x}…)",
        insert.saturating_sub(number),
        digest[0]
    );
}
