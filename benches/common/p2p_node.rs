//! A real node for the P2P benchmarks (included with `#[path]`): a chain
//! state behind the writers' mutex with its datadir, its P2P layer started
//! on loopback, and a wait for its tip that polls the published snapshots
//! (never the writer's lock).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bitcoin::{BlockHash, Network};
use kakehi::chain::ChainParams;
use kakehi::node::{open_chainstate, start_p2p, DataDir};
use kakehi::p2p::{P2pConfig, P2pError, P2pHandle};
use kakehi::pipeline::Chainstate;
use parking_lot::Mutex;
use tokio::sync::watch;

/// A chain state and its datadir (the datadir's lock lives as long as it).
pub struct Node {
    pub chain: Arc<Mutex<Chainstate>>,
    _datadir: DataDir,
}

/// A running P2P layer: its handle, its task, and the switch that stops it.
pub struct Running {
    pub handle: P2pHandle,
    task: tokio::task::JoinHandle<Result<(), P2pError>>,
    stop: watch::Sender<bool>,
}

impl Running {
    /// Asks the P2P layer to stop and waits for it (at most 20 s).
    pub async fn stop(self) {
        self.stop.send_replace(true);
        let _ = tokio::time::timeout(Duration::from_secs(20), self.task).await;
    }
}

impl Node {
    /// A regtest chain state on the datadir at `path` (created if absent).
    pub fn open(path: &Path) -> Node {
        let datadir = DataDir::open(path).expect("datadir");
        let chain = open_chainstate(ChainParams::new(Network::Regtest), &datadir).expect("open");
        Node::new(chain, datadir)
    }

    /// Wraps a chain state already open on `datadir`.
    pub fn new(chain: Chainstate, datadir: DataDir) -> Node {
        Node {
            chain: Arc::new(Mutex::new(chain)),
            _datadir: datadir,
        }
    }

    /// The active tip: (height, hash).
    pub fn tip(&self) -> (u32, BlockHash) {
        let cs = self.chain.lock();
        let t = cs.index().tip();
        (t.height, t.hash)
    }

    /// Starts the node's P2P layer (on the current tokio runtime):
    /// listening on 127.0.0.1:<ephemeral> when `listen`, connecting only
    /// to `connect`, no DNS seeds.
    pub fn start(&self, listen: bool, connect: Vec<SocketAddr>) -> Running {
        let mut c = P2pConfig::default();
        c.listen = listen.then(|| "127.0.0.1:0".parse().expect("addr"));
        c.connect = connect;
        c.dns_seeds = false;
        let (stop, rx) = watch::channel(false);
        let (handle, task) = start_p2p(self.chain.clone(), c, rx);
        Running { handle, task, stop }
    }

    /// Waits until the published tip is `want`, polling every `poll`;
    /// `on_move(height, since)` is called at each poll that sees the tip
    /// moved (`since`: time since `since`). Returns the time from `since`.
    ///
    /// # Panics
    /// When the tip has not moved for `stall` (a stuck sync fails the
    /// bench instead of hanging it).
    pub async fn wait_for_tip(
        &self,
        want: (u32, BlockHash),
        since: Instant,
        poll: Duration,
        stall: Duration,
        mut on_move: impl FnMut(u32, Duration),
    ) -> Duration {
        let snapshots = self.chain.lock().snapshots();
        let (mut last, mut moved) = (None, Instant::now());
        loop {
            let at = {
                let cs = snapshots.load();
                let t = cs.index().tip();
                (t.height, t.hash)
            };
            if at == want {
                on_move(at.0, since.elapsed());
                return since.elapsed();
            }
            if last != Some(at) {
                last = Some(at);
                moved = Instant::now();
                on_move(at.0, since.elapsed());
            }
            assert!(
                moved.elapsed() < stall,
                "sync stuck at height {} {} for {stall:?}",
                at.0,
                at.1
            );
            tokio::time::sleep(poll).await;
        }
    }
}
