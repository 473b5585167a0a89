//! Unit tests of the block index against real headers (mainnet's first
//! blocks, regtest-a).

use super::*;
use bitcoin::Network;

fn mainnet_headers() -> Vec<Header> {
    let data = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/testnet-data/mainnet-samples/mainnet-blocks-1-256.dat"
    ))
    .unwrap();
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 8 <= data.len() {
        let len = u32::from_le_bytes(data[pos + 4..pos + 8].try_into().unwrap()) as usize;
        let block: bitcoin::Block =
            bitcoin::consensus::deserialize(&data[pos + 8..pos + 8 + len]).unwrap();
        out.push(block.header);
        pos += 8 + len;
    }
    out
}

/// Core's walk in `GetNextWorkRequired` (pow.cpp) for a block that is
/// not at a retarget height and not 20 minutes after its parent: back
/// from `prev` while the block is a min-difficulty block, to the first
/// one that is not (or a retarget height, or genesis).
fn walked_bits(index: &ChainIndex, prev: &IndexEntry) -> CompactTarget {
    let pow = &index.params().pow;
    let limit = pow.max_attainable_target.to_compact_lossy();
    let interval = (pow.pow_target_timespan / pow.pow_target_spacing) as u32;
    let mut e = prev;
    while let Some(parent) = e.prev.and_then(|p| index.get(p)) {
        if e.height.is_multiple_of(interval) || e.header.bits != limit {
            break;
        }
        e = parent;
    }
    e.header.bits
}

/// The per-entry anchor the writer keeps gives the bits of Core's walk
/// at every height of a testnet-like chain that mixes min-difficulty
/// runs of every length with ordinary blocks, across three retarget
/// intervals; a load from stored entries rebuilds the same anchors.
#[test]
fn min_difficulty_anchor_equals_cores_walk() {
    let params = ChainParams::new(Network::Testnet);
    let limit = params.pow.max_attainable_target.to_compact_lossy();
    let genesis = params.genesis_header();
    let mut entries = vec![IndexEntry {
        id: BlockId(0),
        hash: genesis.block_hash(),
        header: genesis,
        height: 0,
        chainwork: genesis.work(),
        status: BlockStatus::Valid,
        prev: None,
    }];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for height in 1..6_100u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Runs of min-difficulty blocks whose lengths vary widely.
        let bits = if x % 97 < 90 {
            limit
        } else {
            CompactTarget::from_consensus(0x1c00_0000 | (height % 0xffff))
        };
        let prev = &entries[height as usize - 1];
        let header = Header {
            prev_blockhash: prev.hash,
            bits,
            time: genesis.time + height * 600,
            ..genesis
        };
        entries.push(IndexEntry {
            id: BlockId(height),
            hash: header.block_hash(),
            header,
            height,
            chainwork: prev.chainwork,
            status: BlockStatus::Valid,
            prev: Some(BlockId(height - 1)),
        });
    }
    let tip = BlockId(entries.len() as u32 - 1);
    let index = BlockIndex::from_entries(params, entries, tip).unwrap();
    let mut differing_from_parent = 0;
    for e in index.entries() {
        if (e.height + 1).is_multiple_of(2016) {
            continue;
        }
        let want = walked_bits(&index, e);
        assert_eq!(
            index.next_work_required(e, e.header.time + 600),
            want,
            "height {}",
            e.height
        );
        differing_from_parent += usize::from(want != e.header.bits);
    }
    assert!(
        differing_from_parent > 1_000,
        "the walk matters in this chain"
    );
}

#[test]
fn mainnet_headers_connect_and_tampering_is_refused() {
    let mut index = BlockIndex::new(ChainParams::new(Network::Bitcoin));
    let headers = mainnet_headers();
    // The fixture holds blocks 1-255 (btcd's blk_1_to_256 despite its name).
    assert_eq!(headers.len(), 255);
    let now = 2_000_000_000;
    for h in &headers {
        index.accept_header(h, now).unwrap();
    }
    assert_eq!(index.len(), 256);
    // A nonce change breaks the proof of work.
    let mut bad = headers[10];
    bad.nonce ^= 1;
    assert!(matches!(
        index.accept_header(&bad, now),
        Err(HeaderError::HighHash { .. })
    ));
    // Wrong bits.
    let mut bad = headers[10];
    bad.bits = CompactTarget::from_consensus(0x1d00fffe);
    assert!(matches!(
        index.accept_header(&bad, now),
        Err(HeaderError::BadDiffBits { .. })
    ));
    // A block from the future (against a clock in 2009).
    let mut index = BlockIndex::new(ChainParams::new(Network::Bitcoin));
    let first = headers[0];
    let err = index
        .accept_header(&first, u64::from(first.time) - 3 * 3600)
        .unwrap_err();
    assert!(matches!(err, HeaderError::TimeTooNew { .. }));
}

#[test]
fn locator_and_mtp() {
    let mut index = BlockIndex::new(ChainParams::new(Network::Bitcoin));
    let headers = mainnet_headers();
    let mut last = BlockId(0);
    for h in &headers {
        last = index.accept_header(h, 2_000_000_000).unwrap();
        index.set_status(last, BlockStatus::Valid);
    }
    index.set_active_tip(last);
    assert_eq!(index.tip_height(), 255);
    let loc = index.locator();
    assert_eq!(loc[0], headers[254].block_hash());
    assert_eq!(*loc.last().unwrap(), index.params().genesis_hash());
    assert!(loc.len() <= 101);
    let mut times: Vec<u32> = headers[244..255].iter().map(|h| h.time).collect();
    times.sort_unstable();
    assert_eq!(index.median_time_past(last), times[5]);
}
/// Headers of testnet-data/regtest-a/blocks.dat (bcoin's regtest chain
/// with 7 reorgs), in file order: parents before children.
fn regtest_a_headers() -> Vec<Header> {
    let data = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/testnet-data/regtest-a/blocks.dat"
    ))
    .unwrap();
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 8 <= data.len() && data[pos..pos + 4] != [0, 0, 0, 0] {
        let len = u32::from_le_bytes(data[pos + 4..pos + 8].try_into().unwrap()) as usize;
        let header: Header = bitcoin::consensus::deserialize(&data[pos + 8..pos + 88]).unwrap();
        out.push(header);
        pos += 8 + len;
    }
    out
}

/// The hash → id map is shared by the writer and its published read
/// cores: a core published before a header was accepted must not find
/// it (its entries end before that id), the writer and later cores
/// must; an index rebuilt from the entries finds every one.
#[test]
fn published_cores_see_only_their_own_hashes() {
    let headers = regtest_a_headers();
    let mut index = BlockIndex::new(ChainParams::new(bitcoin::Network::Regtest));
    let now = u64::from(u32::MAX);
    let half = headers.len() / 2;
    for h in &headers[..half] {
        index.accept_header(h, now).expect("valid header");
    }
    let before = index.core().clone();
    for h in &headers[half..] {
        index.accept_header(h, now).expect("valid header");
    }
    let after = index.core().clone();
    for (i, h) in headers.iter().enumerate() {
        let hash = h.block_hash();
        let id = index.id_of(&hash).expect("the writer knows every header");
        assert_eq!(after.id_of(&hash), Some(id));
        assert_eq!(before.id_of(&hash).is_some(), i < half, "header {i}");
        assert_eq!(before.by_hash(&hash).is_some(), i < half, "header {i}");
    }
    let entries: Vec<IndexEntry> = index.entries().cloned().collect();
    let tip = index.tip().id;
    let rebuilt =
        BlockIndex::from_entries(index.params().clone(), entries.clone(), tip).expect("rebuilt");
    for e in &entries {
        assert_eq!(rebuilt.id_of(&e.hash), Some(e.id));
    }
    let mut twice = entries;
    twice[1].hash = twice[2].hash;
    assert!(matches!(
        BlockIndex::from_entries(index.params().clone(), twice, tip),
        Err(IndexLoadError::DuplicateHash { .. })
    ));
}

/// The reference for [`BlockIndex::best_candidate`]: a full scan (the
/// former implementation): complete = has data and parent complete;
/// the most-work complete block, lower id on ties, if it beats the tip.
fn best_candidate_by_scan(index: &BlockIndex) -> BlockId {
    let entries = index.entries();
    let mut complete = vec![false; entries.len()];
    let tip = index.tip();
    let mut best = tip.id;
    let mut best_work = tip.chainwork;
    for e in entries {
        complete[e.id.0 as usize] =
            e.status.has_data() && e.prev.is_none_or(|p| complete[p.0 as usize]);
        if complete[e.id.0 as usize] && e.chainwork > best_work {
            best = e.id;
            best_work = e.chainwork;
        }
    }
    best
}

/// Model test: blocks of regtest-a get their data in random order, some
/// are marked invalid, the tip follows the best candidate; after every
/// step the kept candidate set gives the scan's answer.
#[test]
fn best_candidate_matches_a_full_scan_on_regtest_a() {
    let headers = regtest_a_headers();
    assert_eq!(headers.len(), 1529);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    for round in 0..3 {
        let mut index = BlockIndex::new(ChainParams::new(Network::Regtest));
        for h in &headers {
            index.accept_header(h, 2_000_000_000).unwrap();
        }
        let n = index.len();
        // Round 0: data in file order (an import); later: random order
        // (out-of-order download).
        let mut order: Vec<usize> = (1..n).collect();
        if round > 0 {
            for i in (1..order.len()).rev() {
                order.swap(i, (next() % (i as u64 + 1)) as usize);
            }
        }
        let mut moved = 0;
        for (step, i) in order.into_iter().enumerate() {
            let id = BlockId(i as u32);
            if index.get(id).unwrap().status == BlockStatus::HeadersOnly {
                index.set_status(id, BlockStatus::HaveData);
            }
            if round == 2 && step % 97 == 0 {
                // Invalidate a random block of the last 200 (heights
                // ~1,300-1,500) off the active chain.
                let victim = BlockId((n as u64 - 1 - next() % 200) as u32);
                if !index.is_active(victim) {
                    index.mark_invalid(victim);
                }
            }
            let best = index.best_candidate();
            assert_eq!(
                best,
                best_candidate_by_scan(&index),
                "round {round} step {step}"
            );
            // The best header: the first-seen most-work header not
            // invalid, by a scan of every entry.
            let by_scan =
                index
                    .entries()
                    .filter(|e| !e.status.is_invalid())
                    .fold(BlockId(0), |b, e| {
                        if e.chainwork > index.get(b).unwrap().chainwork {
                            e.id
                        } else {
                            b
                        }
                    });
            assert_eq!(index.best_header().id, by_scan, "round {round} step {step}");
            if next() % 3 == 0 && best != index.tip().id {
                for b in index.path_from(index.fork_point(index.tip().id, best).unwrap(), best) {
                    index.set_status(b, BlockStatus::Valid);
                }
                index.set_active_tip(best);
                moved += 1;
                assert_eq!(index.best_candidate(), best_candidate_by_scan(&index));
            }
        }
        eprintln!("round {round}: the tip moved {moved} times");
        assert!(moved > 0, "round {round}: the tip never moved");
        if round < 2 {
            let best = index.best_candidate();
            index.set_active_tip(best);
            assert_eq!(index.tip_height(), 1500, "round {round}");
        }
    }
}
