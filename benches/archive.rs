//! Archive benchmark on the real regtest-a chain (L = 144, 9 sealed epochs).
//!
//! Run: `cargo bench --bench archive` (release profile). Prints epoch
//! sealing time and bytes per leaf on disk, proofs generated and verified
//! per second (single and batched, existence and absence), proof sizes, and
//! filter bits per key with the measured false-positive rate.

#[path = "../tests/common/feed.rs"]
mod feed;

use std::time::Instant;

use bitcoin::OutPoint;
use feed::{Chain, EPOCH_LENGTH};
use kakehi::archive::filter::filter_key;
use kakehi::archive::{verify_bytes, Anchor, Archive, ProofBatch};

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn rate(n: usize, secs: f64) -> String {
    format!("{:>10.0}/s", n as f64 / secs)
}

fn main() {
    let t = Instant::now();
    let chain = Chain::load();
    println!("feed built from regtest-a in {:.2?}", t.elapsed());
    let dir = std::env::temp_dir().join(format!("kakehi-archive-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);

    // Sealing.
    let mut a = Archive::open(&dir, EPOCH_LENGTH).expect("open");
    let epochs: Vec<_> = (0..chain.complete_epochs())
        .map(|n| chain.epoch_leaves(n))
        .collect();
    let leaves: usize = epochs.iter().map(Vec::len).sum();
    let t = Instant::now();
    for (n, l) in epochs.iter().enumerate() {
        a.seal(n as u32, l.clone()).expect("seal");
    }
    let seal = t.elapsed().as_secs_f64();
    let bytes: u64 = (0..a.next_epoch())
        .map(|n| {
            std::fs::metadata(a.epoch_path(n))
                .map(|m| m.len())
                .unwrap_or(0)
        })
        .sum();
    println!("## sealing");
    println!(
        "epochs {} | spent-output leaves {} | seal total {:.3} s, {:.1} ms/epoch, {} leaves",
        a.next_epoch(),
        leaves,
        seal,
        seal * 1000.0 / f64::from(a.next_epoch()),
        rate(leaves, seal)
    );
    println!("epoch files {} bytes = {:.1} bytes/leaf on disk (leaf encoding + 8 offset + ~64 tree nodes + filter)", bytes, bytes as f64 / leaves as f64);
    let t = Instant::now();
    for n in 0..a.next_epoch() {
        a.verify_epoch_file(n).expect("deep verify");
    }
    println!(
        "deep verify of all epoch files: {:.3} s",
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    drop(a);
    let a = Archive::open(&dir, EPOCH_LENGTH).expect("reopen");
    println!("reopen (cheap checks, filters loaded): {:.2?}", t.elapsed());

    // Filters.
    let mut fps = 0usize;
    let mut keys = 0usize;
    let mut false_pos = 0u64;
    let mut seed = 0x6b61_6b65_6869u64;
    let queries = 1_000_000u64;
    for (n, l) in epochs.iter().enumerate() {
        let f = a.filter(n as u32).expect("read").expect("filter");
        fps += f.fingerprints();
        keys += l.len();
        for _ in 0..queries {
            // Random keys: none is in the epoch with probability ~1 - 2^-55.
            if f.may_contain(splitmix(&mut seed)) {
                false_pos += 1;
            }
        }
    }
    println!("## filters (BinaryFuse16)");
    println!(
        "bits per key {:.2} | measured false-positive rate {:.2e} ({} of {} random queries over {} epochs; 2^-16 = 1.53e-5)",
        (fps * 16) as f64 / keys as f64,
        false_pos as f64 / (queries * u64::from(a.next_epoch())) as f64,
        false_pos,
        queries * u64::from(a.next_epoch()),
        a.next_epoch()
    );
    let held: Vec<u64> = epochs[3].iter().map(|l| filter_key(&l.key())).collect();
    let f3 = a.filter(3).expect("read").expect("filter");
    assert!(
        held.iter().all(|k| f3.may_contain(*k)),
        "no false negatives"
    );

    // Proofs.
    let anchor = Anchor::Commitment(a.commitment());
    let mut spent: Vec<OutPoint> = epochs.iter().flatten().map(|l| l.outpoint).collect();
    let mut unspent: Vec<OutPoint> = feed::utxo_lines().into_iter().map(|u| u.0).collect();
    // Shuffle deterministically.
    for v in [&mut spent, &mut unspent] {
        for i in (1..v.len()).rev() {
            let j = (splitmix(&mut seed) % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
    let txo = |h: &bitcoin::BlockHash, t: &bitcoin::Txid| chain.txoutproof(h, t);
    println!("## proofs (commitment anchor, 9 epochs)");
    println!("| kind | batch | prove | verify | bytes/outpoint |");
    println!("| --- | --- | --- | --- | --- |");
    for (kind, set) in [("existence", &spent), ("absence (all 9 epochs)", &unspent)] {
        for batch in [1usize, 1000] {
            let n = if batch == 1 { 3000 } else { 10_000 };
            let ops = &set[..n.min(set.len())];
            let t = Instant::now();
            let proofs: Vec<ProofBatch> = ops
                .chunks(batch)
                .map(|c| a.prove(c).expect("prove"))
                .collect();
            let pt = t.elapsed().as_secs_f64();
            let enc: Vec<Vec<u8>> = proofs.iter().map(ProofBatch::to_bytes).collect();
            let t = Instant::now();
            for e in &enc {
                verify_bytes(e, anchor).expect("verify");
            }
            let vt = t.elapsed().as_secs_f64();
            let size: usize = enc.iter().map(Vec::len).sum();
            println!(
                "| {kind} | {batch} | {} | {} | {:.0} |",
                rate(ops.len(), pt),
                rate(ops.len(), vt),
                size as f64 / ops.len() as f64
            );
        }
    }
    let ops = &spent[..1000];
    let t = Instant::now();
    let p = a.prove_with(ops, &txo).expect("prove");
    let pt = t.elapsed().as_secs_f64();
    let e = p.to_bytes();
    let t = Instant::now();
    verify_bytes(&e, anchor).expect("verify");
    let vt = t.elapsed().as_secs_f64();
    println!(
        "| existence + txoutproof | 1000 | {} | {} | {:.0} |",
        rate(1000, pt),
        rate(1000, vt),
        e.len() as f64 / 1000.0
    );
    let json = p.to_json();
    println!(
        "JSON form of that batch: {:.0} bytes/outpoint",
        json.len() as f64 / 1000.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}
