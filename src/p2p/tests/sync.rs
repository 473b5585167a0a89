//! Syncing between nodes: headers-first download, following announced tips through reorgs, stalling and lagging peers, tip announcements.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_b_syncs_headers_and_blocks_from_a() {
    let data = dataset();
    let a = Node::start(MockBackend::regtest_a(), test_config()).await;
    let mut cb = test_config();
    cb.listen = None;
    cb.connect = vec![a.addr];
    let backend_b = Arc::new(MockBackend::genesis_only());
    let (hb, control) = handle();
    let (stop_b, rx) = watch::channel(false);
    let started = Instant::now();
    let task_b = tokio::spawn(run(backend_b.clone(), cb, control, rx));
    let target = *data.best_chain.last().unwrap();
    let done = timeout(Duration::from_secs(90), async {
        while backend_b.tip().1 != target {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let elapsed = started.elapsed();
    assert!(done.is_ok(), "B reached only {:?} in 90 s", backend_b.tip());
    assert_eq!(backend_b.tip(), (1500, target));
    assert_eq!(backend_b.best_header_tip(), (1500, target));
    // Every best-chain block is byte-identical to the data set's.
    let by_hash: std::collections::HashMap<_, _> = data.blocks.iter().cloned().collect();
    for h in &data.best_chain[1..] {
        assert_eq!(
            backend_b.block_bytes(h).as_ref(),
            by_hash.get(h),
            "block {h}"
        );
    }
    eprintln!(
        "p2p sync of regtest-a: 1500 blocks in {:.2} s ({:.0} blocks/s), {} submitted",
        elapsed.as_secs_f64(),
        1500.0 / elapsed.as_secs_f64(),
        backend_b.submitted()
    );
    assert_eq!(hb.peer_count(), 1);
    assert!(!a.handle.peers()[0].user_agent.is_empty());
    stop_b.send_replace(true);
    timeout(Duration::from_secs(10), task_b)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b_follows_announced_tips_through_every_reorg() {
    let data = dataset();
    let backend_a = Arc::new(MockBackend::regtest_a_prefix(200));
    let (ha, control) = handle();
    let (stop_a, rx) = watch::channel(false);
    let task_a = tokio::spawn(run(backend_a.clone(), test_config(), control, rx));
    let addr_a = timeout(Duration::from_secs(5), ha.local_addr())
        .await
        .unwrap()
        .unwrap();
    let mut cb = test_config();
    cb.listen = None;
    cb.connect = vec![addr_a];
    let b = Node::start_with(MockBackend::genesis_only(), cb).await;
    wait_for_tip(&b.backend, backend_a.tip(), Duration::from_secs(20)).await;
    // Then the rest of blocks.dat in file order: one block at a time around
    // the first reorgs (headers announcements), in chunks of 37 after that
    // (inv announcements, more than 8 blocks). Each of the 7 reorgs of the
    // data set replays on A, and B must follow through announcements only.
    let mut pos = 200;
    while pos < data.blocks.len() {
        let step = if pos < 440 { 1 } else { 37 };
        let end = (pos + step).min(data.blocks.len());
        backend_a.load_blocks(pos..end);
        ha.announce_tip();
        wait_for_tip(&b.backend, backend_a.tip(), Duration::from_secs(10)).await;
        pos = end;
    }
    assert_eq!(b.backend.tip(), (1500, *data.best_chain.last().unwrap()));
    // One connection throughout: no announcement was punished.
    assert_eq!(
        b.handle.peers().iter().map(|p| p.id).collect::<Vec<_>>(),
        vec![1]
    );
    assert_eq!(ha.peers().iter().map(|p| p.id).collect::<Vec<_>>(), vec![1]);
    b.stop().await;
    stop_a.send_replace(true);
    timeout(Duration::from_secs(10), task_a)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// A peer that serves headers but never blocks: B must detect the stall,
/// drop it and finish from A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalling_peer_is_replaced() {
    let data = dataset();
    let fake_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fake_addr = fake_listener.local_addr().unwrap();
    // Reserve a port for A, started later so the fake gets the first blocks.
    let addr_a = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let headers: Vec<Header> = {
        let by_hash: std::collections::HashMap<_, _> = data.blocks.iter().cloned().collect();
        data.best_chain[1..]
            .iter()
            .map(|h| bitcoin::consensus::deserialize::<Header>(&by_hash[h][..80]).unwrap())
            .collect()
    };
    let fake = tokio::spawn(async move {
        let (s, _) = fake_listener.accept().await.unwrap();
        drop(fake_listener);
        let (rd, wr) = s.into_split();
        let mut p = TestPeer {
            rd,
            wr,
            version: None,
        };
        let v = VersionMessage {
            version: 70016,
            services: ServiceFlags::NETWORK | ServiceFlags::WITNESS,
            timestamp: 0,
            receiver: Address::new(&fake_addr, ServiceFlags::NONE),
            sender: Address::new(&fake_addr, ServiceFlags::NONE),
            nonce: 7,
            user_agent: "/staller/".into(),
            start_height: 1500,
            relay: false,
        };
        p.send(NetworkMessage::Version(v)).await;
        p.send(NetworkMessage::Verack).await;
        let mut getdata = 0usize;
        loop {
            let m = match timeout(
                Duration::from_secs(30),
                codec::read_message(&mut p.rd, M, Duration::from_secs(5)),
            )
            .await
            {
                Ok(Ok(m)) => m,
                _ => return getdata,
            };
            match m {
                NetworkMessage::GetHeaders(_) => {
                    let _ = p
                        .wr
                        .write_all(&encode_message(M, NetworkMessage::Headers(headers.clone())))
                        .await;
                }
                NetworkMessage::Ping(n) => {
                    let _ =
                        p.wr.write_all(&encode_message(M, NetworkMessage::Pong(n)))
                            .await;
                }
                NetworkMessage::GetData(inv) => getdata += inv.len(),
                _ => {}
            }
        }
    });
    let mut cb = test_config();
    cb.listen = None;
    cb.connect = vec![fake_addr, addr_a];
    cb.timeouts.stall_base = Duration::from_secs(1);
    let b = Node::start_with(MockBackend::genesis_only(), cb).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut ca = test_config();
    ca.listen = Some(addr_a);
    let a = Node::start(MockBackend::regtest_a(), ca).await;
    let t = Instant::now();
    wait_for_tip(
        &b.backend,
        (1500, *data.best_chain.last().unwrap()),
        Duration::from_secs(40),
    )
    .await;
    let requested_from_fake = timeout(Duration::from_secs(5), fake)
        .await
        .expect("fake peer was not disconnected")
        .unwrap();
    assert!(
        requested_from_fake > 0,
        "the fake peer was never asked for blocks"
    );
    eprintln!("stall recovered: {requested_from_fake} blocks re-requested, synced {:.1} s after A came up", t.elapsed().as_secs_f64());
    b.stop().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_tip_announced_by_headers_or_inv() {
    let data = dataset();
    let backend = Arc::new(MockBackend::regtest_a_prefix(100));
    let (h, control) = handle();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(run(backend.clone(), test_config(), control, rx));
    let addr = timeout(Duration::from_secs(5), h.local_addr())
        .await
        .unwrap()
        .unwrap();
    let mut with_headers = TestPeer::handshake(addr).await;
    with_headers.send(NetworkMessage::SendHeaders).await;
    // Tell A which block the peer has (its getheaders answer), so the next
    // announcement can connect to it.
    with_headers
        .send(NetworkMessage::GetHeaders(GetHeadersMessage::new(
            vec![data.best_chain[0]],
            BlockHash::all_zeros(),
        )))
        .await;
    let first = with_headers
        .recv_until(|m| match m {
            NetworkMessage::Headers(h) => Some(h),
            _ => None,
        })
        .await;
    assert_eq!(first.len(), 100);
    let mut with_inv = TestPeer::handshake(addr).await;
    assert!(with_inv.ping(1).await < Duration::from_secs(2));
    backend.load_blocks(100..101);
    h.announce_tip();
    let new_tip = data.best_chain[101];
    let hs = with_headers
        .recv_until(|m| match m {
            NetworkMessage::Headers(h) => Some(h),
            _ => None,
        })
        .await;
    assert_eq!(
        hs.iter().map(|x| x.block_hash()).collect::<Vec<_>>(),
        vec![new_tip]
    );
    let inv = with_inv
        .recv_until(|m| match m {
            NetworkMessage::Inv(i) => Some(i),
            _ => None,
        })
        .await;
    assert_eq!(inv, vec![Inventory::Block(new_tip)]);
    stop.send_replace(true);
    timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syncs_from_two_peers_one_lagging_and_keeps_both() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("kakehi=debug")
        .with_test_writer()
        .try_init();
    let data = dataset();
    let full = Node::start(MockBackend::regtest_a(), test_config()).await;
    let lagging = Node::start(MockBackend::regtest_a_prefix(700), test_config()).await;
    let mut cb = test_config();
    cb.listen = None;
    cb.connect = vec![lagging.addr, full.addr];
    let b = Node::start_with(MockBackend::genesis_only(), cb).await;
    wait_for_tip(
        &b.backend,
        (1500, *data.best_chain.last().unwrap()),
        Duration::from_secs(30),
    )
    .await;
    // No connection was dropped and remade on either side: the lagging
    // peer was never asked for blocks above its height, and B's tip
    // announcements to it (while it was behind) never failed to connect.
    let ids = |h: &P2pHandle| h.peers().iter().map(|p| p.id).collect::<Vec<_>>();
    assert_eq!(ids(&b.handle), vec![1, 2]);
    assert_eq!(ids(&full.handle), vec![1]);
    assert_eq!(ids(&lagging.handle), vec![1]);
    b.stop().await;
    full.stop().await;
    lagging.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsolicited_blocks_only_when_extending() {
    let data = dataset();
    let by_hash: std::collections::HashMap<_, _> = data.blocks.iter().cloned().collect();
    let block =
        |h: &BlockHash| -> bitcoin::Block { bitcoin::consensus::deserialize(&by_hash[h]).unwrap() };
    let a = Node::start(MockBackend::regtest_a_prefix(100), test_config()).await;
    let mut p = TestPeer::handshake(a.addr).await;
    // The next block (height 101), pushed unrequested: accepted, new tip.
    p.send(NetworkMessage::Block(block(&data.best_chain[101])))
        .await;
    wait_for_tip(
        &a.backend,
        (101, data.best_chain[101]),
        Duration::from_secs(5),
    )
    .await;
    // A block that does not link (height 103, parent unknown): ignored,
    // not punished.
    p.send(NetworkMessage::Block(block(&data.best_chain[103])))
        .await;
    assert!(p.ping(2).await < Duration::from_secs(2));
    assert_eq!(a.backend.tip().0, 101);
    assert_eq!(a.backend.block_height(&data.best_chain[103]), None);
    a.stop().await;
}
