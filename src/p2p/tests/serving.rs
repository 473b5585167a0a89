//! Serving headers, blocks and transactions to peers, and a slow reader that must not hold the others up.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_headers_and_blocks() {
    let data = dataset();
    let a = Node::start(MockBackend::regtest_a(), test_config()).await;
    let mut p = TestPeer::handshake(a.addr).await;
    let genesis = data.best_chain[0];
    p.send(NetworkMessage::GetHeaders(GetHeadersMessage::new(
        vec![genesis],
        BlockHash::all_zeros(),
    )))
    .await;
    let hs: Vec<Header> = p
        .recv_until(|m| match m {
            NetworkMessage::Headers(h) => Some(h),
            _ => None,
        })
        .await;
    assert_eq!(hs.len(), 1500);
    for (i, h) in hs.iter().enumerate() {
        assert_eq!(h.block_hash(), data.best_chain[i + 1]);
    }
    // Stop hash limits the answer.
    p.send(NetworkMessage::GetHeaders(GetHeadersMessage::new(
        vec![data.best_chain[100]],
        data.best_chain[110],
    )))
    .await;
    let hs: Vec<Header> = p
        .recv_until(|m| match m {
            NetworkMessage::Headers(h) => Some(h),
            _ => None,
        })
        .await;
    assert_eq!(hs.len(), 10);
    assert_eq!(hs[9].block_hash(), data.best_chain[110]);

    // Witness block by getdata: byte-identical to blocks.dat; a stale block
    // too; an unknown one gives notfound.
    let by_hash: std::collections::HashMap<_, _> = data.blocks.iter().cloned().collect();
    let (stale, _) = data.stale[0];
    let unknown = BlockHash::from_byte_array([9; 32]);
    p.send(NetworkMessage::GetData(vec![
        Inventory::WitnessBlock(data.best_chain[1200]),
        Inventory::WitnessBlock(stale),
        Inventory::WitnessBlock(unknown),
    ]))
    .await;
    for want in [data.best_chain[1200], stale] {
        let b = p
            .recv_until(|m| match m {
                NetworkMessage::Block(b) => Some(b),
                _ => None,
            })
            .await;
        assert_eq!(b.block_hash(), want);
        assert_eq!(&bitcoin::consensus::serialize(&b), &by_hash[&want]);
    }
    let nf = p
        .recv_until(|m| match m {
            NetworkMessage::NotFound(n) => Some(n),
            _ => None,
        })
        .await;
    assert_eq!(nf, vec![Inventory::WitnessBlock(unknown)]);
    // Non-witness request: witnesses stripped, same txids and merkle root.
    let h = data.best_chain[1300];
    p.send(NetworkMessage::GetData(vec![Inventory::Block(h)]))
        .await;
    let b = p
        .recv_until(|m| match m {
            NetworkMessage::Block(b) => Some(b),
            _ => None,
        })
        .await;
    assert_eq!(b.block_hash(), h);
    assert!(b
        .txdata
        .iter()
        .all(|t| t.input.iter().all(|i| i.witness.is_empty())));
    assert!(b.check_merkle_root());
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_reader_is_dropped_others_still_served() {
    let data = dataset();
    let mut config = test_config();
    config.timeouts.write = Duration::from_secs(1);
    let a = Node::start(MockBackend::regtest_a(), config).await;
    let mut good = TestPeer::handshake(a.addr).await;
    let mut slow = TestPeer::handshake(a.addr).await;
    // 1,500 blocks (17 MB) requested, never read.
    let inv = data.best_chain[1..]
        .iter()
        .map(|h| Inventory::WitnessBlock(*h))
        .collect();
    slow.send(NetworkMessage::GetData(inv)).await;
    let t = Instant::now();
    while a.handle.peer_count() > 1 {
        assert!(good.ping(7).await < Duration::from_secs(2));
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "slow reader never dropped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(good.ping(8).await < Duration::from_secs(2));
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayed_transaction_is_announced_by_wtxid_and_served() {
    let data = dataset();
    let a = Node::start(MockBackend::genesis_only(), test_config()).await;
    let mut quiet = TestPeer::handshake_with(a.addr, false).await;
    let mut p = TestPeer::handshake_with(a.addr, true).await;
    // A real segwit transaction from regtest-a (block 1200, second tx).
    let block: bitcoin::Block = bitcoin::consensus::deserialize(
        &data
            .blocks
            .iter()
            .find(|(h, _)| *h == data.best_chain[1200])
            .unwrap()
            .1,
    )
    .unwrap();
    let tx = block.txdata[1].clone();
    // A pong proves the node finished both handshakes (commands that arrive
    // during a handshake are dropped).
    p.ping(1).await;
    quiet.ping(1).await;
    a.handle.relay_transaction(tx.clone()).unwrap();
    let inv = p
        .recv_until(|m| match m {
            NetworkMessage::Inv(i) => Some(i),
            _ => None,
        })
        .await;
    assert_eq!(inv, vec![Inventory::WTx(tx.compute_wtxid())]);
    p.send(NetworkMessage::GetData(inv)).await;
    let got = p
        .recv_until(|m| match m {
            NetworkMessage::Tx(t) => Some(t),
            _ => None,
        })
        .await;
    assert_eq!(got, tx);
    // The peer that asked for no relay got no inv before its pong.
    quiet.send(NetworkMessage::Ping(11)).await;
    let first = quiet
        .recv_until(|m| match m {
            NetworkMessage::Inv(_) => Some(false),
            NetworkMessage::Pong(11) => Some(true),
            _ => None,
        })
        .await;
    assert!(first);
    a.stop().await;
}

/// `getheaders` with an empty locator: the stop block's header alone (a
/// stale validated block too), nothing for an unknown one (Core).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn getheaders_with_empty_locator_answers_the_stop_header() {
    let data = dataset();
    let a = Node::start(MockBackend::regtest_a(), test_config()).await;
    let mut p = TestPeer::handshake(a.addr).await;
    let (stale, _) = data.stale[0];
    for want in [data.best_chain[700], stale] {
        p.send(NetworkMessage::GetHeaders(GetHeadersMessage::new(
            vec![],
            want,
        )))
        .await;
        let got = p
            .recv_until(|m| match m {
                NetworkMessage::Headers(h) => Some(h),
                _ => None,
            })
            .await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].block_hash(), want);
    }
    let unknown = BlockHash::from_byte_array([7; 32]);
    p.send(NetworkMessage::GetHeaders(GetHeadersMessage::new(
        vec![],
        unknown,
    )))
    .await;
    p.send(NetworkMessage::Ping(9)).await;
    let answered = p
        .recv_until(|m| match m {
            NetworkMessage::Headers(_) => Some(true),
            NetworkMessage::Pong(9) => Some(false),
            _ => None,
        })
        .await;
    assert!(!answered, "an unknown stop hash was answered");
    a.stop().await;
}
