//! Malformed and refused traffic: who is disconnected, who is discouraged, what is ignored (Core's p2p_invalid_messages.py cases and friends).

use super::*;

/// A node with two inbound slots (so that a discouraged address may not
/// take the last one) and a well-behaved peer; a second peer (handshaken
/// first or not) sends `bytes` and must be disconnected within 2 s.
/// Returns the node and the well-behaved peer.
async fn sender_disconnected(
    name: &str,
    bytes: Vec<u8>,
    handshake_first: bool,
) -> (Node, TestPeer) {
    let mut config = test_config();
    config.max_inbound = 2;
    let a = Node::start(MockBackend::genesis_only(), config).await;
    let good = TestPeer::handshake(a.addr).await;
    let mut bad = if handshake_first {
        TestPeer::handshake(a.addr).await
    } else {
        TestPeer::connect(a.addr).await
    };
    let _ = bad.send_raw(&bytes).await;
    assert!(
        bad.closed_within(Duration::from_secs(2)).await,
        "{name}: sender not disconnected"
    );
    (a, good)
}

/// One malformed message: the sender is disconnected and discouraged, a
/// second peer's pings are answered within 2 s throughout.
async fn malformed_case(name: &str, bytes: Vec<u8>, handshake_first: bool) {
    let (a, mut good) = sender_disconnected(name, bytes, handshake_first).await;
    let rtt = good.ping(1).await;
    assert!(rtt < Duration::from_secs(2), "{name}: ping took {rtt:?}");
    // Discouraged: a new connection from the same IP may not take the
    // last inbound slot, so it is dropped at once.
    let mut again = TestPeer::connect(a.addr).await;
    assert!(
        again.closed_within(Duration::from_secs(2)).await,
        "{name}: banned IP accepted"
    );
    assert!(good.ping(2).await < Duration::from_secs(2));
    assert_eq!(a.handle.peer_count(), 1, "{name}");
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_traffic_disconnects_sender_only() {
    // Over-limit counts: disconnected and discouraged, as Core's
    // `Misbehaving` ("headers message size", "inv message size").
    let genesis = bitcoin::constants::genesis_block(bitcoin::Network::Regtest).header;
    let headers = encode_message(M, NetworkMessage::Headers(vec![genesis; 2001]));
    malformed_case("2001 headers", headers, true).await;

    let inv = vec![Inventory::Block(BlockHash::all_zeros()); 50_001];
    malformed_case(
        "50001 inv",
        encode_message(M, NetworkMessage::Inv(inv.clone())),
        true,
    )
    .await;
    malformed_case(
        "50001 getdata",
        encode_message(M, NetworkMessage::GetData(inv)),
        true,
    )
    .await;
    // Core's "addr message size" / "addrv2 message size" (MAX_ADDR_TO_SEND).
    let peer: SocketAddr = "10.0.0.1:18444".parse().expect("addr");
    let addr = vec![(1_700_000_000, Address::new(&peer, ServiceFlags::NETWORK)); 1_001];
    malformed_case(
        "1001 addr",
        encode_message(M, NetworkMessage::Addr(addr)),
        true,
    )
    .await;
    let v2 = bitcoin::p2p::address::AddrV2Message {
        time: 1_700_000_000,
        services: ServiceFlags::NETWORK,
        addr: bitcoin::p2p::address::AddrV2::Ipv4("10.0.0.1".parse().expect("ip")),
        port: 18444,
    };
    malformed_case(
        "1001 addrv2",
        encode_message(M, NetworkMessage::AddrV2(vec![v2; 1_001])),
        true,
    )
    .await;

    // Framing errors and undecodable payloads: disconnected, not
    // discouraged (Core never penalises them). Mid-stream bad magic (the
    // first bytes of a connection: `not_v1_first_bytes`).
    let mut bad_magic = encode_message(M, NetworkMessage::Ping(1));
    bad_magic[..4].copy_from_slice(&Magic::BITCOIN.to_bytes());
    refused_case("bad magic", bad_magic, true).await;

    let mut bad_checksum = encode_message(M, NetworkMessage::Ping(1));
    bad_checksum[20] ^= 0xff;
    refused_case("bad checksum", bad_checksum, true).await;

    // Header announcing 4,000,001 bytes; no payload follows.
    let mut oversized = codec::encode_raw(M, "block", &[]);
    oversized[16..20].copy_from_slice(&4_000_001u32.to_le_bytes());
    refused_case("oversized payload", oversized, true).await;

    // A 4-byte ping (undersized payload).
    refused_case(
        "4-byte ping",
        codec::encode_raw(M, "ping", &[1, 2, 3, 4]),
        true,
    )
    .await;

    // 80 junk messages of 4,000,000 bytes each (bad checksum): the first
    // one ends the connection.
    let mut junk = Vec::with_capacity(80 * 4_000_024);
    for i in 0..80u8 {
        let mut one = codec::encode_raw(M, "block", &vec![i; 4_000_000]);
        one[20] ^= 0xff;
        junk.extend_from_slice(&one);
    }
    refused_case("80 junk 4 MB messages", junk, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redundant_version_is_ignored() {
    let a = Node::start(MockBackend::genesis_only(), test_config()).await;
    let mut p = TestPeer::handshake(a.addr).await;
    p.send(version_with_agent(a.addr, "/again/".into())).await;
    assert!(p.ping(7).await < Duration::from_secs(2));
    a.stop().await;
}

/// One message Core answers by a disconnect without discouragement (or
/// first bytes that are not a v1 message): the sender is disconnected, and
/// a new connection from its IP may still take the last inbound slot.
async fn refused_case(name: &str, bytes: Vec<u8>, handshake_first: bool) {
    let (a, mut good) = sender_disconnected(name, bytes, handshake_first).await;
    assert!(good.ping(1).await < Duration::from_secs(2), "{name}");
    // Not discouraged: the same IP takes the last inbound slot.
    let mut again = TestPeer::handshake(a.addr).await;
    assert!(again.ping(2).await < Duration::from_secs(2), "{name}");
    assert_eq!(a.handle.peer_count(), 2, "{name}");
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_v1_first_bytes_close_without_discouragement() {
    // A BIP324 v2 initiator's first 64 bytes (an ElligatorSwift key: to us,
    // random bytes).
    let mut v2 = [0u8; 64];
    getrandom::getrandom(&mut v2).unwrap();
    if v2[..4] == M.to_bytes() {
        v2[0] ^= 1;
    }
    refused_case("v2 handshake bytes", v2.to_vec(), false).await;
    let mut other_net = encode_message(M, NetworkMessage::Ping(1));
    other_net[..4].copy_from_slice(&Magic::BITCOIN.to_bytes());
    refused_case("mainnet magic first", other_net, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_refusals_disconnect_without_discouragement() {
    let cases = [
        ("mempool", NetworkMessage::MemPool),
        ("filterclear", NetworkMessage::FilterClear),
        ("wtxidrelay after verack", NetworkMessage::WtxidRelay),
        ("sendaddrv2 after verack", NetworkMessage::SendAddrV2),
    ];
    for (name, msg) in cases {
        refused_case(name, encode_message(M, msg), true).await;
    }
}

/// Transactions and their `inv`, though our `version` said relay = false:
/// ignored, the peer kept (light clients broadcast to any peer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsolicited_transactions_are_ignored_not_punished() {
    let a = Node::start(MockBackend::genesis_only(), test_config()).await;
    let mut p = TestPeer::handshake(a.addr).await;
    let tx = bitcoin::constants::genesis_block(bitcoin::Network::Regtest).txdata[0].clone();
    let wtxid = tx.compute_wtxid();
    p.send(NetworkMessage::Inv(vec![Inventory::WTx(wtxid)]))
        .await;
    p.send(NetworkMessage::Tx(tx)).await;
    p.send(NetworkMessage::Ping(5)).await;
    let first = p
        .recv_until(|m| match m {
            NetworkMessage::GetData(_) => Some(false),
            NetworkMessage::Pong(5) => Some(true),
            _ => None,
        })
        .await;
    assert!(first, "the tx inv was fetched");
    assert_eq!(a.handle.peer_count(), 1);
    a.stop().await;
}

fn version_with_agent(addr: SocketAddr, user_agent: String) -> NetworkMessage {
    let me: SocketAddr = "127.0.0.1:1".parse().unwrap();
    NetworkMessage::Version(VersionMessage {
        version: 70016,
        services: ServiceFlags::NETWORK | ServiceFlags::WITNESS,
        timestamp: 0,
        receiver: Address::new(&addr, ServiceFlags::NONE),
        sender: Address::new(&me, ServiceFlags::NONE),
        nonce: 43,
        user_agent,
        start_height: 0,
        relay: false,
    })
}

/// Core reads the user agent with `LIMITED_STRING(.., MAX_SUBVERSION_LENGTH)`
/// (256 bytes): longer is refused, not truncated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_long_user_agent_disconnects() {
    // Exactly 256 bytes (multi-byte characters count in bytes): accepted.
    let a = Node::start(MockBackend::genesis_only(), test_config()).await;
    let agent = "é".repeat(MAX_SUBVERSION_LENGTH / 2);
    assert_eq!(agent.len(), MAX_SUBVERSION_LENGTH);
    let mut p = TestPeer::connect(a.addr).await;
    p.send(version_with_agent(a.addr, agent.clone())).await;
    p.send(NetworkMessage::Verack).await;
    p.recv_until(|m| matches!(m, NetworkMessage::Verack).then_some(()))
        .await;
    assert!(p.ping(5).await < Duration::from_secs(2));
    assert_eq!(a.handle.peers()[0].user_agent, agent);
    a.stop().await;

    let addr: SocketAddr = "127.0.0.1:8333".parse().unwrap();
    // 129 two-byte characters: 258 bytes but 129 chars.
    let v = version_with_agent(addr, "é".repeat(MAX_SUBVERSION_LENGTH / 2 + 1));
    malformed_case("258-byte user agent", encode_message(M, v), false).await;
    // Just under the 4,000,000-byte payload cap.
    let v = version_with_agent(addr, "x".repeat(3_999_000));
    malformed_case("3,999,000-byte user agent", encode_message(M, v), false).await;
}

/// Unconnecting `headers` count also while our `getheaders` to that peer is
/// unanswered: 11 in a row disconnect (Core's
/// `MAX_NUM_UNCONNECTING_HEADERS_MSGS` = 10), and a connecting message
/// resets the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unconnecting_headers_count_while_getheaders_unanswered() {
    let data = dataset();
    let by_hash: std::collections::HashMap<_, _> = data.blocks.iter().cloned().collect();
    let header = |height: usize| -> Header {
        bitcoin::consensus::deserialize(&by_hash[&data.best_chain[height]][..80]).unwrap()
    };
    let a = Node::start(MockBackend::genesis_only(), test_config()).await;
    let mut p = TestPeer::connect(a.addr).await;
    // A full node claiming a higher chain: A starts header sync with it.
    let mut v = version_with_agent(a.addr, "/test/".into());
    if let NetworkMessage::Version(v) = &mut v {
        v.start_height = 100;
    }
    p.send(v).await;
    p.send(NetworkMessage::Verack).await;
    p.recv_until(|m| matches!(m, NetworkMessage::GetHeaders(_)).then_some(()))
        .await;
    // Our getheaders is unanswered; 10 unconnecting messages are tolerated.
    for h in 50..60 {
        p.send(NetworkMessage::Headers(vec![header(h)])).await;
    }
    assert!(p.ping(6).await < Duration::from_secs(2));
    // A connecting answer resets the count: 10 more are tolerated.
    p.send(NetworkMessage::Headers((1..=5).map(header).collect()))
        .await;
    for h in 60..70 {
        p.send(NetworkMessage::Headers(vec![header(h)])).await;
    }
    assert!(p.ping(7).await < Duration::from_secs(2));
    assert_eq!(a.handle.peer_count(), 1);
    // The 11th in a row disconnects.
    p.send(NetworkMessage::Headers(vec![header(70)])).await;
    assert!(
        p.closed_within(Duration::from_secs(2)).await,
        "11 unconnecting headers messages tolerated"
    );
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_peer_hits_handshake_timeout_and_unknown_commands_are_ignored() {
    let a = Node::start(MockBackend::genesis_only(), test_config()).await;
    let mut silent = TestPeer::connect(a.addr).await;
    let mut p = TestPeer::handshake(a.addr).await;
    p.send_raw(&codec::encode_raw(M, "kakehi-zz", &[1, 2, 3]))
        .await
        .unwrap();
    assert!(p.ping(3).await < Duration::from_secs(2));
    let t = Instant::now();
    assert!(silent.closed_within(Duration::from_secs(5)).await);
    assert!(
        t.elapsed() >= Duration::from_millis(1500),
        "closed before the 2 s handshake timeout"
    );
    // Not discouraged: a handshake timeout is not misbehaviour.
    let mut again = TestPeer::handshake(a.addr).await;
    assert!(again.ping(4).await < Duration::from_secs(2));
    a.stop().await;
}
