//! BIP-157 filter serving (getcfcheckpt, getcfheaders, getcfilters) checked against regtest-a's independent filters, its limits, and the NODE_COMPACT_FILTERS service bit.

use bitcoin::p2p::message_filter::{CFHeaders, CFilter};

use super::*;

fn display_filter_headers() -> Vec<FilterHeader> {
    let data = dataset();
    data.best_chain.iter().map(|h| data.filters[h].1).collect()
}

/// A `getcfheaders` for basic filters from `start_height` to `stop_hash`,
/// and its answer.
async fn cfheaders(p: &mut TestPeer, start_height: u32, stop_hash: BlockHash) -> CFHeaders {
    p.send(NetworkMessage::GetCFHeaders(GetCFHeaders {
        filter_type: 0,
        start_height,
        stop_hash,
    }))
    .await;
    p.recv_until(|m| match m {
        NetworkMessage::CFHeaders(c) => Some(c),
        _ => None,
    })
    .await
}

/// The next `cfilter` message.
async fn next_cfilter(p: &mut TestPeer) -> CFilter {
    p.recv_until(|m| match m {
        NetworkMessage::CFilter(f) => Some(f),
        _ => None,
    })
    .await
}

/// The header a chain of `hashes` reaches from `prev` (BIP-157).
fn chain_headers(prev: FilterHeader, hashes: &[FilterHash]) -> FilterHeader {
    hashes.iter().fold(prev, |prev, fh| fh.filter_header(&prev))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_filters_consistent_with_filters_json() {
    let a = Node::start(MockBackend::regtest_a(), test_config()).await;
    let mut p = TestPeer::handshake(a.addr).await;
    let version = p.version.as_ref().unwrap();
    assert!(version
        .services
        .has(ServiceFlags::COMPACT_FILTERS | ServiceFlags::NETWORK | ServiceFlags::WITNESS));
    assert_eq!(version.version, 70016);
    let all = serves_the_best_chain(&mut p).await;
    serves_filters_matching_their_hashes(&mut p, &all).await;
    serves_a_stale_branch(&mut p).await;
    ignores_an_unknown_stop_hash(&mut p).await;

    // Over the limit: 1,001 filters → disconnect (Core's p2p_blockfilters.py).
    let mut q = TestPeer::handshake(a.addr).await;
    q.send(NetworkMessage::GetCFilters(GetCFilters {
        filter_type: 0,
        start_height: 0,
        stop_hash: dataset().best_chain[1000],
    }))
    .await;
    assert!(
        q.closed_within(Duration::from_secs(3)).await,
        "1,001 filters must disconnect"
    );
    a.stop().await;
}

/// The checkpoint and the filter headers of the best chain equal
/// regtest-a's (bcoin's) at every height, from genesis and from mid-chain.
/// Returns the `cfheaders` of the whole chain (1,501 ≤ 2,000 hashes).
async fn serves_the_best_chain(p: &mut TestPeer) -> CFHeaders {
    let data = dataset();
    let expected = display_filter_headers();
    let tip = *data.best_chain.last().unwrap();
    // getcfcheckpt: one checkpoint (height 1000) below tip 1500.
    p.send(NetworkMessage::GetCFCheckpt(GetCFCheckpt {
        filter_type: 0,
        stop_hash: tip,
    }))
    .await;
    let cp = p
        .recv_until(|m| match m {
            NetworkMessage::CFCheckpt(c) => Some(c),
            _ => None,
        })
        .await;
    assert_eq!(cp.stop_hash, tip);
    assert_eq!(cp.filter_headers, vec![expected[1000]]);

    let ch = cfheaders(p, 0, tip).await;
    assert_eq!(ch.previous_filter_header, FilterHeader::all_zeros());
    assert_eq!(ch.filter_hashes.len(), 1501);
    let mut prev = ch.previous_filter_header;
    for (height, fh) in ch.filter_hashes.iter().enumerate() {
        prev = fh.filter_header(&prev);
        assert_eq!(prev, expected[height], "filter header at height {height}");
    }
    // Starting mid-chain: the previous header is the one below.
    let mid = cfheaders(p, 700, data.best_chain[900]).await;
    assert_eq!(mid.previous_filter_header, expected[699]);
    assert_eq!(mid.filter_hashes.len(), 201);
    ch
}

/// `getcfilters` 0..=999 (the maximum of 1,000): each filter is the
/// block's and hashes to its entry of `all` (the chain's `cfheaders`).
async fn serves_filters_matching_their_hashes(p: &mut TestPeer, all: &CFHeaders) {
    let data = dataset();
    p.send(NetworkMessage::GetCFilters(GetCFilters {
        filter_type: 0,
        start_height: 0,
        stop_hash: data.best_chain[999],
    }))
    .await;
    for height in 0..1000 {
        let f = next_cfilter(p).await;
        assert_eq!(f.block_hash, data.best_chain[height]);
        assert_eq!(
            FilterHash::hash(&f.filter),
            all.filter_hashes[height],
            "filter at {height}"
        );
    }
}

/// A stale branch, by stop hash (the deepest reorg's stale tip): its
/// header chain and filter are the branch's own, not the best chain's.
async fn serves_a_stale_branch(p: &mut TestPeer) {
    let data = dataset();
    let expected = display_filter_headers();
    let (stale_hash, stale_height) = data.stale.iter().copied().max_by_key(|(_, h)| *h).unwrap();
    let st = cfheaders(p, stale_height - 20, stale_hash).await;
    assert_eq!(st.stop_hash, stale_hash);
    let header = chain_headers(st.previous_filter_header, &st.filter_hashes);
    assert_eq!(
        header, data.filters[&stale_hash].1,
        "stale branch header chain"
    );
    assert_ne!(header, expected[stale_height as usize]);
    p.send(NetworkMessage::GetCFilters(GetCFilters {
        filter_type: 0,
        start_height: stale_height,
        stop_hash: stale_hash,
    }))
    .await;
    let sf = next_cfilter(p).await;
    assert_eq!(sf.block_hash, stale_hash);
    assert_eq!(sf.filter, data.filters[&stale_hash].0);
}

/// An unknown stop hash (a race at the tip) is ignored, not punished: no
/// answer to any of the three requests, and the next ping is answered.
async fn ignores_an_unknown_stop_hash(p: &mut TestPeer) {
    let unknown = BlockHash::from_byte_array([7; 32]);
    p.send(NetworkMessage::GetCFHeaders(GetCFHeaders {
        filter_type: 0,
        start_height: 0,
        stop_hash: unknown,
    }))
    .await;
    p.send(NetworkMessage::GetCFilters(GetCFilters {
        filter_type: 0,
        start_height: 0,
        stop_hash: unknown,
    }))
    .await;
    p.send(NetworkMessage::GetCFCheckpt(GetCFCheckpt {
        filter_type: 0,
        stop_hash: unknown,
    }))
    .await;
    p.send(NetworkMessage::Ping(99)).await;
    let first = p
        .recv_until(|m| match m {
            NetworkMessage::Pong(n) => Some(Ok(n)),
            NetworkMessage::CFHeaders(_)
            | NetworkMessage::CFilter(_)
            | NetworkMessage::CFCheckpt(_) => Some(Err(())),
            _ => None,
        })
        .await;
    assert_eq!(
        first,
        Ok(99),
        "unknown stop hash must be ignored, the ping answered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_filter_requests_disconnect_good_ones_are_served() {
    let data = dataset();
    // 127.0.0.1 becomes discouraged after the first case; with inbound
    // slots to spare it may still connect (Core's discouragement).
    let a = Node::start(MockBackend::regtest_a(), test_config()).await;
    let mut ok = TestPeer::handshake(a.addr).await;
    let cases: Vec<(&str, NetworkMessage)> = vec![
        (
            "cfilters 1,001 blocks",
            NetworkMessage::GetCFilters(GetCFilters {
                filter_type: 0,
                start_height: 500,
                stop_hash: data.best_chain[1500],
            }),
        ),
        (
            "cfheaders type 1",
            NetworkMessage::GetCFHeaders(GetCFHeaders {
                filter_type: 1,
                start_height: 0,
                stop_hash: data.best_chain[10],
            }),
        ),
        (
            "cfcheckpt type 1",
            NetworkMessage::GetCFCheckpt(GetCFCheckpt {
                filter_type: 1,
                stop_hash: data.best_chain[10],
            }),
        ),
        (
            "cfilters start above stop",
            NetworkMessage::GetCFilters(GetCFilters {
                filter_type: 0,
                start_height: 11,
                stop_hash: data.best_chain[10],
            }),
        ),
        (
            "cfheaders start above stop",
            NetworkMessage::GetCFHeaders(GetCFHeaders {
                filter_type: 0,
                start_height: 11,
                stop_hash: data.best_chain[10],
            }),
        ),
    ];
    for (name, bad) in cases {
        let mut p = TestPeer::handshake(a.addr).await;
        p.send(bad).await;
        assert!(
            p.closed_within(Duration::from_secs(3)).await,
            "{name} must disconnect"
        );
        assert!(ok.ping(5).await < Duration::from_secs(2), "{name}");
    }
    // The largest legal requests are served: 1,000 filters, 1,501 headers.
    ok.send(NetworkMessage::GetCFilters(GetCFilters {
        filter_type: 0,
        start_height: 501,
        stop_hash: data.best_chain[1500],
    }))
    .await;
    for height in 501..=1500 {
        let f = ok
            .recv_until(|m| match m {
                NetworkMessage::CFilter(f) => Some(f),
                _ => None,
            })
            .await;
        assert_eq!(f.block_hash, data.best_chain[height]);
    }
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_service_bit_only_when_index_synced() {
    let b = Node::start(MockBackend::genesis_only(), test_config()).await;
    let mut p = TestPeer::handshake(b.addr).await;
    let services = p.version.as_ref().unwrap().services;
    assert!(services.has(ServiceFlags::NETWORK | ServiceFlags::WITNESS));
    assert!(!services.has(ServiceFlags::COMPACT_FILTERS));
    // Filter requests are then ignored (not answered, not punished).
    let genesis = dataset().best_chain[0];
    p.send(NetworkMessage::GetCFCheckpt(GetCFCheckpt {
        filter_type: 0,
        stop_hash: genesis,
    }))
    .await;
    p.send(NetworkMessage::Ping(3)).await;
    let first = p
        .recv_until(|m| match m {
            NetworkMessage::CFCheckpt(_) => Some(false),
            NetworkMessage::Pong(3) => Some(true),
            _ => None,
        })
        .await;
    assert!(first);
    b.stop().await;
}
