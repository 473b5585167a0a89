//! P2P sync against file import, and BIP-157 filter serving, in one run
//! (release build, loopback, both nodes validating everything):
//!
//! 1. node A imports `testnet-data/regtest-a/blocks.dat` (1,529 blocks, 7
//!    reorgs; timed: file import, blocks/s);
//! 2. an empty node B syncs from A over loopback P2P (`--connect A`):
//!    headers first, then the 1,500 blocks of the best chain (timed from
//!    the start of B's P2P layer to B's tip equal to A's: P2P sync,
//!    blocks/s), and the ratio `p2p sync vs import`;
//! 3. a raw P2P client asks A for `getcfilters` batches of 1,000 filters
//!    (heights 1–1,000 and 501–1,500 alternately) for
//!    `KAKEHI_BENCH_SECS` seconds (default 3): batches/s and bytes/s of
//!    `cfilter` messages (header and payload).
//!
//! The sync line also gives the time B spent inside
//! `Chainstate::submit_block` (`PipelineStats::submit_micros`): the rest is
//! the P2P layer's own cost (handshake, header sync, waiting for blocks).
//!
//! Blocks/s counts the blocks each node processed: 1,529 for the import
//! (stale branches included), 1,500 for the sync (only the best chain is
//! downloaded). `KAKEHI_BENCH_RUNS=N` (default 2) repeats steps 1 and 2 with
//! fresh nodes and prints each run's ratio.
//!
//! Run: `cargo bench --bench p2p_sync`.

#[path = "common/env.rs"]
mod env;
#[path = "common/p2p_node.rs"]
mod p2p_node;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use bitcoin::p2p::address::Address;
use bitcoin::p2p::message::NetworkMessage;
use bitcoin::p2p::message_filter::GetCFilters;
use bitcoin::p2p::message_network::VersionMessage;
use bitcoin::p2p::{Magic, ServiceFlags};
use bitcoin::BlockHash;
use env::env_or;
use kakehi::import::import_files;
use kakehi::p2p::codec::{encode_message, read_message};
use p2p_node::Node;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const MAGIC: Magic = Magic::REGTEST;
/// Longest time B's tip may stay unmoved (a stuck sync fails the bench
/// instead of hanging).
const STALL_LIMIT: Duration = Duration::from_secs(300);

/// One run: import into a fresh A, sync a fresh B from it. Returns
/// (import blocks/s, P2P blocks/s) and A (kept for the filter bench).
async fn run(file: &Path) -> (f64, f64, Node, tempfile::TempDir) {
    let dir_a = tempfile::tempdir().expect("tempdir");
    let a = Node::open(dir_a.path());
    let t = Instant::now();
    let summary = import_files(
        &a.chain,
        &[file.to_path_buf()],
        &AtomicBool::new(false),
        false,
    )
    .expect("import");
    let import_secs = t.elapsed().as_secs_f64();
    assert!(summary.rejected.is_empty(), "{:?}", summary.rejected);
    let import_rate = summary.blocks_read as f64 / import_secs;
    println!(
        "  file import: {} blocks in {import_secs:.2} s = {import_rate:.0} blocks/s",
        summary.blocks_read
    );

    let run_a = a.start(true, vec![]);
    let addr = run_a.handle.local_addr().await.expect("listen address");
    let dir_b = tempfile::tempdir().expect("tempdir");
    let b = Node::open(dir_b.path());
    let want = a.tip();
    let t = Instant::now();
    let run_b = b.start(false, vec![addr]);
    let sync_secs = b
        .wait_for_tip(want, t, Duration::from_millis(2), STALL_LIMIT, |_, _| {})
        .await
        .as_secs_f64();
    let (connected, submit_secs) = {
        let cs = b.chain.lock();
        (
            cs.stats().blocks_connected,
            cs.stats().submit_micros as f64 / 1e6,
        )
    };
    let sync_rate = connected as f64 / sync_secs;
    println!(
        "  p2p sync:    {connected} blocks in {sync_secs:.2} s = {sync_rate:.0} blocks/s; B's pipeline (submit_block) busy {submit_secs:.2} s = {:.0} % of it",
        100.0 * submit_secs / sync_secs
    );
    run_b.stop().await;
    run_a.stop().await;
    assert_eq!(
        a.chain.lock().snapshot().utxo_stats(),
        b.chain.lock().snapshot().utxo_stats()
    );
    drop(b);
    drop(dir_b);
    (import_rate, sync_rate, a, dir_a)
}

/// A minimal P2P client: handshake, then messages in and out.
struct Client {
    stream: TcpStream,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let mut c = Client { stream };
        let me: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        c.send(NetworkMessage::Version(VersionMessage {
            version: 70016,
            services: ServiceFlags::NONE,
            timestamp: 0,
            receiver: Address::new(&addr, ServiceFlags::NONE),
            sender: Address::new(&me, ServiceFlags::NONE),
            nonce: 7,
            user_agent: "/p2p_sync-bench/".into(),
            start_height: 0,
            relay: false,
        }))
        .await;
        c.send(NetworkMessage::Verack).await;
        let (mut version, mut verack) = (false, false);
        while !(version && verack) {
            match c.recv().await {
                NetworkMessage::Version(_) => version = true,
                NetworkMessage::Verack => verack = true,
                _ => {}
            }
        }
        c
    }

    async fn send(&mut self, msg: NetworkMessage) {
        self.stream
            .write_all(&encode_message(MAGIC, msg))
            .await
            .expect("send");
    }

    async fn recv(&mut self) -> NetworkMessage {
        loop {
            let m = tokio::time::timeout(
                Duration::from_secs(30),
                read_message(&mut self.stream, MAGIC, Duration::from_secs(30)),
            )
            .await
            .expect("a message within 30 s")
            .expect("a valid message");
            if let NetworkMessage::Ping(n) = m {
                self.send(NetworkMessage::Pong(n)).await;
                continue;
            }
            return m;
        }
    }
}

/// getcfilters batches of 1,000 from A for `secs` seconds.
async fn bench_getcfilters(a: &Node, secs: f64) {
    let stops: Vec<(u32, BlockHash)> = {
        let cs = a.chain.lock();
        [1u32, 501]
            .iter()
            .map(|&start| {
                let stop = cs.index().active_at(start + 999).expect("height").hash;
                (start, stop)
            })
            .collect()
    };
    let run_a = a.start(true, vec![]);
    let addr = run_a.handle.local_addr().await.expect("listen address");
    // The service bit is advertised once the filter index is synced; A is.
    let mut c = Client::connect(addr).await;
    let t = Instant::now();
    let (mut batches, mut bytes) = (0u64, 0u64);
    while t.elapsed().as_secs_f64() < secs {
        let (start, stop) = stops[(batches % 2) as usize];
        c.send(NetworkMessage::GetCFilters(GetCFilters {
            filter_type: 0,
            start_height: start,
            stop_hash: stop,
        }))
        .await;
        let mut got = 0;
        while got < 1000 {
            if let NetworkMessage::CFilter(f) = c.recv().await {
                // 24-byte header, filter type, block hash, compact-size
                // length, filter.
                let n = f.filter.len() as u64;
                let varint = match n {
                    0..=0xfc => 1,
                    0xfd..=0xffff => 3,
                    _ => 5,
                };
                bytes += 24 + 1 + 32 + varint + n;
                got += 1;
            }
        }
        batches += 1;
    }
    let s = t.elapsed().as_secs_f64();
    println!(
        "getcfilters (real node A, 1,000 filters per batch): {batches} batches in {s:.2} s = {:.1} batches/s, {:.1} MB/s ({:.0} filters/s)",
        batches as f64 / s,
        bytes as f64 / s / 1e6,
        (batches * 1000) as f64 / s
    );
    run_a.stop().await;
}

fn main() {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testnet-data/regtest-a/blocks.dat");
    let runs: usize = env_or("KAKEHI_BENCH_RUNS", 2);
    let secs: f64 = env_or("KAKEHI_BENCH_SECS", 3.0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut last = None;
        for i in 0..runs {
            println!("run {}:", i + 1);
            let (import_rate, sync_rate, a, dir) = run(&file).await;
            println!("  p2p sync vs import: {:.2}x", sync_rate / import_rate);
            last = Some((a, dir));
        }
        if let Some((a, _dir)) = last {
            bench_getcfilters(&a, secs).await;
        }
    });
}
