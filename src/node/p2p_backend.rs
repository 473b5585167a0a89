//! The real node behind the P2P layer: [`NodeP2p`] implements
//! [`NodeBackend`] over the chain state (`Arc<Mutex<Chainstate>>`, the
//! writers' mutex, and its published snapshots), and [`start_p2p`] is the
//! one call the CLI makes.
//!
//! Locking: only the writes (`submit_block`, `accept_headers`) take the
//! chain state's mutex. Every read (headers, blocks, filters, filter
//! headers and checkpoints, archive epochs and proofs) runs on the latest
//! published [`ChainSnapshot`], so it never waits for the writer and never
//! holds it up. The cheap methods the P2P layer calls on the async executor
//! (`tip`, `best_header_tip`, `block_height`, `locator`, `blocks_to_fetch`,
//! `filter_index_synced`) read a summary ([`NodeP2p`]'s view) refreshed
//! from the latest snapshot whenever it changed.
//!
//! Headers whose chain has less work than Core's anti-DoS threshold (the
//! minimum chainwork, or 144 blocks below the tip's work) are followed
//! without being stored and fetched again once their chain passes it
//! (`super::presync`).

use std::sync::Arc;
use std::time::Duration;

use bitcoin::bip158::{FilterHash, FilterHeader};
use bitcoin::block::Header;
use bitcoin::hashes::Hash;
use bitcoin::pow::{Target, Work};
use bitcoin::{Block, BlockHash, Transaction, Txid, Wtxid};
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::watch;

use super::p2p_archive;
use super::p2p_mempool;
use super::p2p_view::{branch_ids, View};
use super::presync::{anti_dos_threshold, Offer, Presync};
use crate::chain::index::BlockStatus;
use crate::chain::ChainParams;
use crate::mempool::Mempool;
use crate::p2p::archive::ArchEpochs;
use crate::p2p::backend::{GenTxid, MempoolTx, TxSubmitError};
use crate::p2p::{
    ArchiveQueryError, FilterQueryError, HeadersError, HeadersOutcome, NodeBackend, P2pConfig,
    P2pError, P2pHandle, SubmitError, SubmitOutcome,
};
use crate::pipeline::{self, Chainstate, DUPLICATE_INVALID};
use crate::primitives::BlockId;
use crate::snapshot::{ChainSnapshot, Snapshots};

/// Period of the tip watcher started by [`start_p2p`], milliseconds.
pub const TIP_WATCH_INTERVAL_MS: u64 = 500;

/// A [`NodeBackend`] over the node's chain state. Build with
/// [`NodeP2p::new`]; see the module docs for locking.
pub struct NodeP2p {
    /// The writers' mutex: taken only to submit blocks and store headers.
    chain: Arc<Mutex<Chainstate>>,
    /// Where every read comes from.
    snapshots: Snapshots,
    params: ChainParams,
    view: Mutex<View>,
    presync: Mutex<Presync>,
    /// The mempool transactions are relayed from and submitted to (`None`:
    /// no transaction relay).
    mempool: Option<Arc<Mempool>>,
}

impl NodeP2p {
    /// Wraps the chain state: connects stored blocks left unconnected by a
    /// crash ([`Chainstate::activate_stored_blocks`]; a failure is logged)
    /// and builds the first view. Blocks until the chain state's mutex is
    /// free once.
    pub fn new(chain: Arc<Mutex<Chainstate>>) -> Self {
        let (params, snapshots) = {
            let mut cs = chain.lock();
            if let Err(e) = cs.activate_stored_blocks() {
                tracing::error!(error = %e, "connecting stored blocks at start-up");
            }
            (cs.params().clone(), cs.snapshots())
        };
        let mut view = View::default();
        view.refresh(&snapshots.progress(), &snapshots.load(), true);
        view.key = None;
        NodeP2p {
            chain,
            snapshots,
            params,
            view: Mutex::new(view),
            presync: Mutex::new(Presync::default()),
            mempool: None,
        }
    }

    /// Relays transactions through `mempool`: peers' transactions are
    /// submitted to it, `getdata` is served from it, and `version` asks
    /// peers for transaction relay.
    pub fn with_mempool(mut self, mempool: Arc<Mempool>) -> Self {
        self.mempool = Some(mempool);
        self
    }

    /// The view, refreshed from the latest snapshot if it changed.
    fn view(&self) -> MutexGuard<'_, View> {
        let (progress, snapshot) = (self.snapshots.progress(), self.snapshots.load());
        let mut v = self.view.lock();
        v.refresh(&progress, &snapshot, false);
        v
    }

    /// Refreshes the view after a write through this backend (the writer
    /// published its snapshot before returning).
    fn refresh_after_write(&self) {
        let (progress, snapshot) = (self.snapshots.progress(), self.snapshots.load());
        self.view.lock().refresh(&progress, &snapshot, true);
    }

    /// Stores headers through the chain state (full checks).
    fn store_headers(&self, headers: &[Header]) -> Result<HeadersOutcome, HeadersError> {
        let mut cs = self.chain.lock();
        let result = cs
            .accept_headers(headers)
            .map_err(|e| HeadersError::Storage { source: e.into() });
        drop(cs);
        self.refresh_after_write();
        let accepted = result?;
        if let Some(refused) = accepted.refused {
            let hash = headers[refused.index].block_hash();
            return Err(match refused.error {
                crate::chain::index::HeaderError::UnknownParent { hash, prev } => {
                    HeadersError::Unconnected { hash, prev }
                }
                crate::chain::index::HeaderError::TimeTooNew { hash, .. } => {
                    HeadersError::TimeTooNew { hash }
                }
                e => HeadersError::Invalid {
                    hash,
                    source: Box::new(e),
                },
            });
        }
        let new = accepted.new;
        let last_height = headers
            .last()
            .and_then(|h| {
                self.snapshots
                    .load()
                    .index()
                    .by_hash(&h.block_hash())
                    .map(|e| e.height)
            })
            .unwrap_or(0);
        Ok(HeadersOutcome::new(
            new,
            last_height,
            self.best_header_tip(),
        ))
    }

    /// Context-free checks of a presync header: target within the
    /// network's limit and PoW matching it (Core's presync checks little
    /// more; the full checks run when the chain is stored).
    fn light_check(&self, h: &Header) -> Result<(), HeadersError> {
        let target = Target::from_compact(h.bits);
        let limit = self.params.pow.max_attainable_target;
        let bad = || HeadersError::Invalid {
            hash: h.block_hash(),
            source: "high-hash: proof of work failed (presync)".into(),
        };
        if target > limit {
            return Err(bad());
        }
        h.validate_pow(target).map(|_| ()).map_err(|_| bad())
    }
}

impl NodeBackend for NodeP2p {
    fn params(&self) -> &ChainParams {
        &self.params
    }

    fn tip(&self) -> (u32, BlockHash) {
        self.view().tip
    }

    fn best_header_tip(&self) -> (u32, BlockHash) {
        let v = self.view();
        match v.header_chain.last() {
            Some((_, hash)) => ((v.header_chain.len() - 1) as u32, *hash),
            None => v.tip,
        }
    }

    fn block_height(&self, hash: &BlockHash) -> Option<u32> {
        // The writer's index (every header it holds), as the view reads it.
        let progress = self.snapshots.progress();
        progress.index.by_hash(hash).map(|e| e.height)
    }

    fn locator(&self) -> Vec<BlockHash> {
        self.view().locator.clone()
    }

    fn headers_after(&self, locator: &[BlockHash], stop: BlockHash, max: usize) -> Vec<Header> {
        let cs = self.snapshots.load();
        let index = cs.index();
        let start = locator
            .iter()
            .filter_map(|h| index.id_of(h))
            .find(|id| index.is_active(*id))
            .and_then(|id| index.get(id))
            .map(|e| e.height + 1)
            .unwrap_or(1);
        let mut out = Vec::new();
        let mut h = start;
        while out.len() < max {
            let Some(e) = index.active_at(h) else { break };
            out.push(e.header);
            if e.hash == stop {
                break;
            }
            h += 1;
        }
        out
    }

    fn header(&self, hash: &BlockHash) -> Option<Header> {
        let cs = self.snapshots.load();
        let index = cs.index();
        let id = index.id_of(hash)?;
        let e = index.get(id)?;
        (index.is_active(id) || e.status == crate::chain::index::BlockStatus::Valid)
            .then_some(e.header)
    }

    fn block_bytes(&self, hash: &BlockHash) -> Option<Vec<u8>> {
        let cs = self.snapshots.load();
        let id = cs.index().id_of(hash)?;
        match cs.read_block_raw(id) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(block_hash = %hash, error = %e, "cannot read stored block");
                None
            }
        }
    }

    fn accept_headers(&self, headers: &[Header]) -> Result<HeadersOutcome, HeadersError> {
        let Some(first) = headers.first() else {
            return Ok(HeadersOutcome::new(0, 0, self.best_header_tip()));
        };
        for i in 1..headers.len() {
            if headers[i].prev_blockhash != headers[i - 1].block_hash() {
                return Err(HeadersError::NotContinuous { index: i });
            }
        }
        let last_hash = headers[headers.len() - 1].block_hash();
        // Where the message attaches (a stored header, or nothing stored),
        // and the work a chain needs to be stored.
        let (parent, threshold) = {
            let cs = self.snapshots.load();
            let index = cs.index();
            let tip = index.tip();
            let threshold = anti_dos_threshold(
                Work::from_be_bytes(self.params.minimum_chain_work),
                tip.chainwork,
                tip.header.work(),
            );
            if index.id_of(&last_hash).is_some() {
                // Nothing new beyond what is stored: no presync needed.
                return self.store_headers(headers);
            }
            let parent = index
                .by_hash(&first.prev_blockhash)
                .map(|e| (e.height, e.chainwork));
            (parent, threshold)
        };
        for h in headers {
            self.light_check(h)?;
        }
        let offer = self.presync.lock().offer(headers, parent, threshold);
        match offer {
            Offer::NotOurs => self.store_headers(headers),
            Offer::Store { headers, height } if headers.is_empty() => {
                Ok(HeadersOutcome::new(0, height, self.best_header_tip()))
            }
            Offer::Store { headers, .. } => self.store_headers(&headers),
            Offer::Held { last } => {
                tracing::debug!(block_hash = %last, "headers followed below the work threshold, not stored");
                Err(HeadersError::BelowMinimumWork { last })
            }
            Offer::Passed { from } => {
                tracing::info!(from = %from, "a presync chain passed the work threshold: fetching it again");
                Err(HeadersError::PresyncPassed { from })
            }
            Offer::Mismatch { height } => Err(HeadersError::Invalid {
                hash: last_hash,
                source: format!(
                    "header at height {height} differs from the chain followed in presync"
                )
                .into(),
            }),
        }
    }

    fn blocks_to_fetch(&self, max: usize) -> Vec<BlockHash> {
        let v = self.view();
        v.fetch.iter().take(max).copied().collect()
    }

    fn submit_block(&self, block: Block) -> Result<SubmitOutcome, SubmitError> {
        self.submit_block_with_next(Arc::new(block), None)
    }

    fn submit_block_with_next(
        &self,
        block: Arc<Block>,
        next: Option<Arc<Block>>,
    ) -> Result<SubmitOutcome, SubmitError> {
        let hash = block.block_hash();
        let mut cs = self.chain.lock();
        if cs.index().id_of(&hash).is_none()
            && cs.index().id_of(&block.header.prev_blockhash).is_none()
        {
            return Err(SubmitError::UnknownHeader { hash });
        }
        let before = cs.index().tip().id;
        let result = cs.submit_block_with_next(block, next);
        match &result {
            // Rejected but not invalid: the body was mutated, the header
            // stays headers-only (see `View::mutated`).
            Ok(pipeline::SubmitOutcome::Rejected { .. }) => {
                let headers_only = cs
                    .index()
                    .id_of(&hash)
                    .and_then(|id| cs.index().get(id))
                    .is_some_and(|e| e.status == BlockStatus::HeadersOnly);
                if headers_only {
                    self.view.lock().note_mutated(hash, true);
                }
            }
            Ok(pipeline::SubmitOutcome::Accepted { .. }) => {
                let mut v = self.view.lock();
                if v.mutated.contains(&hash) {
                    v.note_mutated(hash, false);
                }
            }
            _ => {}
        }
        let after = cs.index().tip().id;
        // Caught up with the best header: nothing more is coming soon, so
        // the blocks waiting in a group are made durable (and published) now.
        if result.is_ok() && cs.index().tip().chainwork >= cs.index().best_header_work() {
            if let Err(e) = cs.flush() {
                tracing::error!(error = %e, "making the synced blocks durable");
            }
        }
        drop(cs);
        self.refresh_after_write();
        match result {
            Err(e) => Err(SubmitError::Storage { source: e.into() }),
            Ok(pipeline::SubmitOutcome::Duplicate) => Ok(SubmitOutcome::Duplicate),
            Ok(pipeline::SubmitOutcome::Rejected { reason, .. }) if reason == DUPLICATE_INVALID => {
                Err(SubmitError::KnownInvalid { hash })
            }
            Ok(pipeline::SubmitOutcome::Rejected { reason, detail }) => Err(SubmitError::Invalid {
                hash,
                source: format!("{reason}: {detail}").into(),
            }),
            Ok(pipeline::SubmitOutcome::Accepted { tip, height }) => {
                if after != before {
                    Ok(SubmitOutcome::NewTip { height, hash: tip })
                } else {
                    Ok(SubmitOutcome::Accepted)
                }
            }
        }
    }

    fn filter_index_synced(&self) -> bool {
        self.view().synced
    }

    fn cfilters(
        &self,
        start_height: u32,
        stop: BlockHash,
    ) -> Result<Vec<(BlockHash, Vec<u8>)>, FilterQueryError> {
        let cs = self.snapshots.load();
        let ids = branch(&cs, start_height, stop)?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let (filter, _) = filter_of(&cs, id)?;
            out.push((hash_of(&cs, id), filter));
        }
        Ok(out)
    }

    fn cfheaders(
        &self,
        start_height: u32,
        stop: BlockHash,
    ) -> Result<(FilterHeader, Vec<FilterHash>), FilterQueryError> {
        let cs = self.snapshots.load();
        let ids = branch(&cs, start_height, stop)?;
        let prev = match ids
            .first()
            .and_then(|id| cs.index().get(*id))
            .and_then(|e| e.prev)
        {
            Some(parent) if start_height > 0 => filter_of(&cs, parent)?.1,
            _ => FilterHeader::all_zeros(),
        };
        let mut hashes = Vec::with_capacity(ids.len());
        for id in ids {
            hashes.push(FilterHash::hash(&filter_of(&cs, id)?.0));
        }
        Ok((prev, hashes))
    }

    fn cfcheckpt(&self, stop: BlockHash) -> Result<Vec<FilterHeader>, FilterQueryError> {
        let cs = self.snapshots.load();
        let ids = branch(&cs, 0, stop)?;
        let mut out = Vec::new();
        for (height, id) in ids.iter().enumerate() {
            if height > 0 && (height as u32).is_multiple_of(crate::p2p::CFCHECKPT_INTERVAL) {
                out.push(filter_of(&cs, *id)?.1);
            }
        }
        Ok(out)
    }

    fn archive_ready(&self) -> bool {
        self.view().archive_ready
    }

    fn archive_epochs(&self, start: u32, count: u16) -> Result<ArchEpochs, ArchiveQueryError> {
        let cs = self.snapshots.load();
        Ok(p2p_archive::epochs(&cs, start, count))
    }

    fn archive_proof(
        &self,
        outpoints: &[bitcoin::OutPoint],
        epoch: Option<u32>,
        txoutproofs: bool,
    ) -> Result<crate::archive::ProofBatch, ArchiveQueryError> {
        let cs = self.snapshots.load();
        p2p_archive::proof(&cs, outpoints, epoch, txoutproofs)
    }

    fn mempool_min_feerate(&self) -> Option<u64> {
        self.mempool.as_ref().map(|m| m.snapshot().min_feerate)
    }

    fn mempool_tx(&self, id: GenTxid) -> Option<MempoolTx> {
        p2p_mempool::tx(self.mempool.as_deref()?, id)
    }

    fn mempool_txids(&self, from: u64, max: usize) -> (Vec<(Txid, Wtxid)>, u64) {
        match &self.mempool {
            Some(m) => p2p_mempool::txids(m, from, max),
            None => (Vec::new(), 0),
        }
    }

    fn submit_tx(&self, tx: Arc<Transaction>) -> Result<(), TxSubmitError> {
        match &self.mempool {
            Some(m) => p2p_mempool::submit(m, tx),
            None => Err(TxSubmitError::Unavailable {
                source: "no mempool".into(),
            }),
        }
    }
}

fn hash_of(cs: &ChainSnapshot, id: BlockId) -> BlockHash {
    cs.index()
        .get(id)
        .map(|e| e.hash)
        .unwrap_or_else(BlockHash::all_zeros)
}

/// The ids from `start_height` to `stop` on its branch, checked.
fn branch(
    cs: &ChainSnapshot,
    start_height: u32,
    stop: BlockHash,
) -> Result<Vec<BlockId>, FilterQueryError> {
    let index = cs.index();
    let e = index
        .by_hash(&stop)
        .ok_or(FilterQueryError::UnknownStop { stop })?;
    if start_height > e.height {
        return Err(FilterQueryError::StartAboveStop {
            start_height,
            stop_height: e.height,
        });
    }
    Ok(branch_ids(index, start_height, e.id))
}

/// A block's filter and filter header, or `NotIndexed`.
fn filter_of(cs: &ChainSnapshot, id: BlockId) -> Result<(Vec<u8>, FilterHeader), FilterQueryError> {
    match cs.filter(id) {
        Ok(Some(f)) => Ok(f),
        Ok(None) => Err(FilterQueryError::NotIndexed {
            hash: hash_of(cs, id),
        }),
        Err(e) => Err(FilterQueryError::Storage { source: e.into() }),
    }
}

/// Starts the P2P layer for the node on the current tokio runtime: wraps
/// `chain` in a [`NodeP2p`], spawns [`crate::p2p::run`], and spawns a tip
/// watcher that calls [`P2pHandle::announce_tip`] whenever the active tip
/// changes (every [`TIP_WATCH_INTERVAL_MS`]), so blocks connected by file
/// import or HTTP are announced too (the P2P layer skips peers that already
/// know the tip). Both tasks stop when `shutdown` turns true.
///
/// Returns the handle and the network task (its error is a bind failure,
/// [`P2pError::Bind`]).
///
/// # Panics
/// Outside a tokio runtime (like `tokio::spawn`).
pub fn start_p2p(
    chain: Arc<Mutex<Chainstate>>,
    config: P2pConfig,
    shutdown: watch::Receiver<bool>,
) -> (P2pHandle, tokio::task::JoinHandle<Result<(), P2pError>>) {
    start_p2p_with_mempool(chain, None, config, shutdown)
}

/// [`start_p2p`] relaying transactions through `mempool` (see
/// [`NodeP2p::with_mempool`]; `None`: as [`start_p2p`]). The caller
/// hands the mempool's accepted transactions to
/// [`P2pHandle::relay_transaction`] (`Mempool::on_accepted`).
///
/// # Panics
/// Outside a tokio runtime (like `tokio::spawn`).
pub fn start_p2p_with_mempool(
    chain: Arc<Mutex<Chainstate>>,
    mempool: Option<Arc<Mempool>>,
    config: P2pConfig,
    shutdown: watch::Receiver<bool>,
) -> (P2pHandle, tokio::task::JoinHandle<Result<(), P2pError>>) {
    let mut node = NodeP2p::new(chain);
    if let Some(m) = mempool {
        node = node.with_mempool(m);
    }
    let backend = Arc::new(node);
    let (handle, task) = crate::p2p::spawn(backend.clone(), config, shutdown.clone());
    let watcher = handle.clone();
    let mut shutdown = shutdown;
    tokio::spawn(async move {
        let mut last = backend.tip();
        let mut tick = tokio::time::interval(Duration::from_millis(TIP_WATCH_INTERVAL_MS));
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let tip = backend.tip();
                    if tip != last {
                        last = tip;
                        watcher.announce_tip();
                    }
                }
                r = shutdown.changed() => {
                    if r.is_err() || *shutdown.borrow() {
                        return;
                    }
                }
            }
        }
    });
    (handle, task)
}
