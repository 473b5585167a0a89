//! The address book: addr gossip, DNS seeds, getaddr, and inbound eviction.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addr_gossip_is_persisted_and_served_and_book_is_dialed() {
    use bitcoin::p2p::address::{AddrV2, AddrV2Message};
    let dir = tempfile::tempdir().unwrap();
    let book = dir.path().join("peers.json");
    // A (regtest-a) listens; C learns A's address by gossip from a test
    // peer, persists it, and after a restart dials it from the book alone.
    let a = Node::start(MockBackend::regtest_a(), test_config()).await;
    let mut cc = test_config();
    cc.addr_file = Some(book.clone());
    let c = Node::start(MockBackend::genesis_only(), cc.clone()).await;
    let mut p = TestPeer::handshake(c.addr).await;
    let std::net::IpAddr::V4(ip) = a.addr.ip() else {
        panic!("v4 loopback")
    };
    let gossip = vec![AddrV2Message {
        time: 1_700_000_000,
        services: ServiceFlags::NETWORK | ServiceFlags::WITNESS,
        addr: AddrV2::Ipv4(ip),
        port: a.addr.port(),
    }];
    p.send(NetworkMessage::AddrV2(gossip)).await;
    p.send(NetworkMessage::GetAddr).await;
    let back = p
        .recv_until(|m| match m {
            NetworkMessage::AddrV2(v) => Some(v),
            _ => None,
        })
        .await;
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].socket_addr().unwrap(), a.addr);
    drop(p);
    c.stop().await;
    let saved = std::fs::read_to_string(&book).unwrap();
    assert!(saved.contains(&a.addr.to_string()), "{saved}");
    // Restart C: no connect, no addnode, no DNS: it dials A from the book.
    let c = Node::start(MockBackend::genesis_only(), cc).await;
    wait_for_tip(&c.backend, a.backend.tip(), Duration::from_secs(20)).await;
    c.stop().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_seed_fills_the_book_and_is_dialed() {
    let a = Node::start(MockBackend::regtest_a_prefix(300), test_config()).await;
    // "localhost" as the only DNS seed, on A's port: resolved with
    // tokio::net::lookup_host like a real seed, then dialed from the book.
    let mut cc = test_config();
    cc.listen = None;
    cc.dns_seeds = true;
    let c = Node::start_with(
        MockBackend::genesis_only().with_dns_seeds(&["localhost"], a.addr.port()),
        cc,
    )
    .await;
    wait_for_tip(&c.backend, a.backend.tip(), Duration::from_secs(20)).await;
    c.stop().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_inbound_slots_evict_an_unprotected_peer() {
    let mut config = test_config();
    config.max_inbound = 20;
    config.per_ip_limit = 30;
    let a = Node::start(MockBackend::genesis_only(), config).await;
    let mut peers = Vec::new();
    for _ in 0..20 {
        peers.push(TestPeer::handshake(a.addr).await);
    }
    // The 8 youngest answer the node's ping (sent after the handshake), so
    // they are protected by lowest ping; the others never answer it.
    for (i, p) in peers.iter_mut().enumerate().skip(12) {
        p.ping(i as u64).await;
    }
    // Let the node record the pongs.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(a.handle.peer_count(), 20);
    // A 21st peer: peers 12..20 protected by ping, the older half of peers
    // 0..12 by uptime; the youngest of the rest (peer 11) is evicted.
    let mut newcomer = TestPeer::handshake(a.addr).await;
    assert!(
        peers[11].closed_within(Duration::from_secs(2)).await,
        "peer 11 not evicted"
    );
    assert!(newcomer.ping(100).await < Duration::from_secs(2));
    for (i, p) in peers.iter_mut().enumerate() {
        if i != 11 {
            assert!(
                p.ping(200 + i as u64).await < Duration::from_secs(2),
                "peer {i} dropped"
            );
        }
    }
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn getaddr_answered_once_with_addr_gossip() {
    let a = Node::start(MockBackend::genesis_only(), test_config()).await;
    let mut p = TestPeer::handshake(a.addr).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as u32;
    let list: Vec<(u32, Address)> = (1..=5u8)
        .map(|i| {
            let sa: SocketAddr = format!("11.22.33.{i}:18444").parse().unwrap();
            (
                now,
                Address::new(&sa, ServiceFlags::NETWORK | ServiceFlags::WITNESS),
            )
        })
        .collect();
    p.send(NetworkMessage::Addr(list)).await;
    p.ping(1).await;
    p.send(NetworkMessage::GetAddr).await;
    // The test peer sent sendaddrv2: the answer is an addrv2.
    let back = p
        .recv_until(|m| match m {
            NetworkMessage::AddrV2(v) => Some(v),
            _ => None,
        })
        .await;
    assert_eq!(back.len(), 5, "{back:?}");
    p.send(NetworkMessage::GetAddr).await;
    p.send(NetworkMessage::Ping(77)).await;
    let second = p
        .recv_until(|m| match m {
            NetworkMessage::Addr(_) | NetworkMessage::AddrV2(_) => Some(false),
            NetworkMessage::Pong(77) => Some(true),
            _ => None,
        })
        .await;
    assert!(second, "a second getaddr was answered");
    a.stop().await;
}
