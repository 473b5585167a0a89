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
//! Headers below the network's minimum chainwork are held in memory (Core's
//! headers presync, simplified: see [`PRESYNC_MAX_HEADERS`]) and stored only
//! once their chain passes it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bitcoin::bip158::{FilterHash, FilterHeader};
use bitcoin::block::Header;
use bitcoin::hashes::Hash;
use bitcoin::pow::{Target, Work};
use bitcoin::{Block, BlockHash};
use tokio::sync::watch;

use super::archive::{ArchEpochs, ArchiveQueryError};
use super::backend::{
    FilterQueryError, HeadersError, HeadersOutcome, NodeBackend, SubmitError, SubmitOutcome,
};
use super::{P2pConfig, P2pError, P2pHandle};
use crate::chain::index::{BlockStatus, ChainIndex, IndexEntry};
use crate::chain::ChainParams;
use crate::pipeline::{self, Chainstate};
use crate::snapshot::{ChainSnapshot, Snapshots};
use crate::primitives::BlockId;

/// Most headers held in memory below the minimum chainwork (all presync
/// chains together): 500,000 headers, 40 MB. A chain that outgrows it is
/// stored anyway once its headers pass the full header checks: a
/// simplification of Core's `HeadersSyncState` (which keeps 1-bit
/// commitments and downloads the headers twice). It matters only on
/// testnet3, whose minimum chainwork lies ~4.8 M headers up and whose
/// minimum-difficulty headers cost nothing to forge anyway; testnet4 and
/// signet fit under the cap.
pub const PRESYNC_MAX_HEADERS: usize = 500_000;
/// Most presync chains held at once (one per peer in practice); the oldest
/// is dropped beyond this.
pub const PRESYNC_MAX_CHAINS: usize = 8;
/// Most hashes remembered as "body arrived mutated" (oldest forgotten
/// first). Each one cost its sender a discouragement.
pub const MUTATED_MEMORY: usize = 64;
/// Period of the tip watcher started by [`start_p2p`], milliseconds.
pub const TIP_WATCH_INTERVAL_MS: u64 = 500;

/// A header chain below the minimum chainwork, held until it passes it.
struct PresyncChain {
    /// Headers after a stored block, in chain order (non-empty).
    headers: Vec<Header>,
    /// Chainwork at the last header.
    work: Work,
    /// Height of the last header.
    height: u32,
    /// Insertion sequence number (for dropping the oldest).
    seq: u64,
}

#[derive(Default)]
struct Presync {
    /// Keyed by the hash of the chain's last header.
    chains: HashMap<BlockHash, PresyncChain>,
    seq: u64,
}

impl Presync {
    fn held(&self) -> usize {
        self.chains.values().map(|c| c.headers.len()).sum()
    }
}

/// The summary the cheap backend methods read (see the module docs).
struct View {
    /// (index length, tip id, blocks connected, blocks rejected) at the
    /// last refresh.
    key: Option<(usize, u32, u64, u64)>,
    /// Index entries already folded into `heights` and `best`.
    scanned: usize,
    rejected_seen: u64,
    /// Height of every header of the index.
    heights: HashMap<BlockHash, u32>,
    /// The most-work non-invalid header; among equal work the first seen,
    /// unless its body arrived mutated and another's did not (below).
    best: Option<(BlockId, Work)>,
    /// Headers whose body arrived mutated (bad merkle root, witness
    /// commitment, CVE-2012-2459 duplicates) and that stayed headers-only,
    /// as in Core: at most [`MUTATED_MEMORY`], oldest first. They lose ties
    /// for `best`, so the download plan follows an equal-work competitor
    /// instead of a block no honest peer may have.
    mutated: VecDeque<BlockHash>,
    /// The chain ending at `best`, by height: (id, hash).
    header_chain: Vec<(BlockId, BlockHash)>,
    tip: (u32, BlockHash),
    locator: Vec<BlockHash>,
    /// Missing blocks of the best header chain above the fork with the
    /// active chain, ≤ 1,024 heights above the tip, in chain order.
    fetch: Vec<BlockHash>,
    synced: bool,
    /// [`super::archive::node_ready`] at the last refresh.
    archive_ready: bool,
}

impl Default for View {
    fn default() -> Self {
        View {
            key: None,
            scanned: 0,
            rejected_seen: 0,
            heights: HashMap::new(),
            best: None,
            mutated: VecDeque::new(),
            header_chain: Vec::new(),
            tip: (0, BlockHash::all_zeros()),
            locator: Vec::new(),
            fetch: Vec::new(),
            synced: false,
            archive_ready: false,
        }
    }
}

impl View {
    fn refresh(&mut self, cs: &ChainSnapshot, force: bool) {
        let index = cs.index();
        let stats = cs.stats();
        let key = (
            index.len(),
            index.tip().id.0,
            stats.blocks_connected,
            stats.blocks_rejected,
        );
        if !force && self.key == Some(key) {
            return;
        }
        self.key = Some(key);
        // A rejection may have invalidated the best header: rescan all.
        if self.best.is_none() || stats.blocks_rejected != self.rejected_seen {
            self.best = None;
            for e in index.entries() {
                self.consider(index, e);
            }
            self.rejected_seen = stats.blocks_rejected;
        } else {
            for e in index.entries_from(self.scanned) {
                self.consider(index, e);
            }
        }
        for e in index.entries_from(self.scanned) {
            self.heights.insert(e.hash, e.height);
        }
        self.scanned = index.len();
        let tip = index.tip();
        self.tip = (tip.height, tip.hash);
        let best = self.best.map(|b| b.0).unwrap_or(tip.id);
        self.update_header_chain(index, best);
        self.locator = locator(&self.header_chain);
        // Fork of the best header chain with the active chain.
        let best_height = self.header_chain.len().saturating_sub(1) as u32;
        let mut fork = tip.height.min(best_height);
        while fork > 0
            && index.active_at(fork).map(|e| e.id) != Some(self.header_chain[fork as usize].0)
        {
            fork -= 1;
        }
        let end = best_height.min(tip.height.saturating_add(super::DOWNLOAD_WINDOW as u32));
        self.fetch.clear();
        for h in fork + 1..=end {
            let (id, hash) = self.header_chain[h as usize];
            if index
                .get(id)
                .is_some_and(|e| e.status == BlockStatus::HeadersOnly)
            {
                self.fetch.push(hash);
            }
        }
        // The filter index is built at connect time, so it is complete up to
        // the tip; it has "caught up" when no downloaded block of the best
        // header chain waits to be connected (the tip is the best fully
        // downloaded block).
        self.synced = match self.header_chain.get(fork as usize + 1) {
            None => true,
            Some((id, _)) => !index.get(*id).is_some_and(|e| e.status.has_data()),
        };
        self.archive_ready = super::archive::node_ready(cs, best_height);
    }

    /// Makes `e` the best header if it has more work, or equal work and the
    /// current best's body arrived mutated while `e`'s did not.
    fn consider(&mut self, index: &ChainIndex, e: &IndexEntry) {
        if e.status.is_invalid() {
            return;
        }
        let better = match self.best {
            None => true,
            Some((_, w)) if e.chainwork > w => true,
            Some((id, w)) if e.chainwork == w && !self.mutated.is_empty() => {
                let best_mutated = index
                    .get(id)
                    .is_some_and(|b| self.mutated.contains(&b.hash));
                best_mutated && !self.mutated.contains(&e.hash)
            }
            Some(_) => false,
        };
        if better {
            self.best = Some((e.id, e.chainwork));
        }
    }

    /// Remembers that `hash`'s body arrived mutated (or forgets it, when a
    /// valid body was stored).
    fn note_mutated(&mut self, hash: BlockHash, mutated: bool) {
        self.mutated.retain(|h| *h != hash);
        if mutated {
            if self.mutated.len() == MUTATED_MEMORY {
                self.mutated.pop_front();
            }
            self.mutated.push_back(hash);
        }
        // Re-choose the best header from scratch at the next refresh.
        self.best = None;
    }

    /// Rewrites `header_chain` to end at `best` (O(reorg depth)).
    fn update_header_chain(&mut self, index: &ChainIndex, best: BlockId) {
        let mut branch = Vec::new();
        let mut cur = index.get(best);
        while let Some(e) = cur {
            if self.header_chain.get(e.height as usize).map(|x| x.0) == Some(e.id) {
                break;
            }
            branch.push((e.id, e.hash));
            cur = e.prev.and_then(|p| index.get(p));
        }
        let keep = match cur {
            Some(e) => e.height as usize + 1,
            None => 0,
        };
        self.header_chain.truncate(keep);
        self.header_chain.extend(branch.into_iter().rev());
        let best_height = index.get(best).map(|e| e.height as usize).unwrap_or(0);
        self.header_chain.truncate(best_height + 1);
    }
}

/// Core's `LocatorEntries` over a chain given by height.
fn locator(chain: &[(BlockId, BlockHash)]) -> Vec<BlockHash> {
    let mut out = Vec::new();
    let mut height = chain.len() as i64 - 1;
    let mut step = 1i64;
    while height >= 0 {
        out.push(chain[height as usize].1);
        if out.len() >= 10 {
            step *= 2;
        }
        height -= step;
    }
    if let Some(g) = chain.first() {
        if out.last() != Some(&g.1) {
            out.push(g.1);
        }
    }
    out
}

/// The ids from `start_height` to `stop` on `stop`'s branch, in height
/// order (walks back to the active chain, then reads it).
fn branch_ids(index: &ChainIndex, start_height: u32, stop: BlockId) -> Vec<BlockId> {
    let mut rev = Vec::new();
    let mut cur = index.get(stop);
    while let Some(e) = cur {
        if e.height < start_height {
            break;
        }
        if index.is_active(e.id) {
            for h in (start_height..=e.height).rev() {
                if let Some(a) = index.active_at(h) {
                    rev.push(a.id);
                }
            }
            break;
        }
        rev.push(e.id);
        cur = e.prev.and_then(|p| index.get(p));
    }
    rev.reverse();
    rev
}

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
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl NodeP2p {
    /// Wraps the chain state: connects stored blocks left unconnected by a
    /// crash ([`Chainstate::activate_stored_blocks`]; a failure is logged)
    /// and builds the first view. Blocks until the chain state's mutex is
    /// free once.
    pub fn new(chain: Arc<Mutex<Chainstate>>) -> Self {
        let (params, snapshots) = {
            let mut cs = lock(&chain);
            if let Err(e) = cs.activate_stored_blocks() {
                tracing::error!(error = %e, "connecting stored blocks at start-up");
            }
            (cs.params().clone(), cs.snapshots())
        };
        let mut view = View::default();
        view.refresh(&snapshots.load(), true);
        view.key = None;
        NodeP2p {
            chain,
            snapshots,
            params,
            view: Mutex::new(view),
            presync: Mutex::new(Presync::default()),
        }
    }

    /// The view, refreshed from the latest snapshot if it changed.
    fn view(&self) -> MutexGuard<'_, View> {
        let snapshot = self.snapshots.load();
        let mut v = lock(&self.view);
        v.refresh(&snapshot, false);
        v
    }

    /// Refreshes the view after a write through this backend (the writer
    /// published its snapshot before returning).
    fn refresh_after_write(&self) {
        lock(&self.view).refresh(&self.snapshots.load(), true);
    }

    /// Stores headers through the chain state (full checks).
    fn store_headers(&self, headers: &[Header]) -> Result<HeadersOutcome, HeadersError> {
        let mut cs = lock(&self.chain);
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
        self.view().heights.get(hash).copied()
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
        let min_work = Work::from_be_bytes(self.params.minimum_chain_work);
        let last_hash = headers[headers.len() - 1].block_hash();
        // Where the message attaches: a stored header, or a presync chain.
        let parent = {
            let cs = self.snapshots.load();
            let index = cs.index();
            if index.id_of(&last_hash).is_some() {
                // Nothing new beyond what is stored: no presync needed.
                None
            } else {
                index
                    .by_hash(&first.prev_blockhash)
                    .map(|e| (e.chainwork, e.height))
            }
        };
        let mut presync = lock(&self.presync);
        let (held, base_work, base_height) = match parent {
            None if !presync.chains.contains_key(&first.prev_blockhash) => {
                drop(presync);
                return self.store_headers(headers);
            }
            None => {
                let Some(chain) = presync.chains.remove(&first.prev_blockhash) else {
                    return self.store_headers(headers);
                };
                (chain.headers, chain.work, chain.height)
            }
            Some((work, height)) => (Vec::new(), work, height),
        };
        let mut work = base_work;
        for h in headers {
            self.light_check(h)?;
            work = work + h.work();
        }
        let height = base_height.saturating_add(headers.len() as u32);
        let total = held.len() + headers.len();
        if work >= min_work || total > PRESYNC_MAX_HEADERS {
            if work < min_work {
                tracing::warn!(
                    headers = total,
                    "presync chain exceeds {PRESYNC_MAX_HEADERS} headers: storing it below the minimum chainwork"
                );
            }
            drop(presync);
            if !held.is_empty() {
                self.store_headers(&held)?;
            }
            return self.store_headers(headers);
        }
        let mut all = held;
        all.extend_from_slice(headers);
        presync.seq += 1;
        let seq = presync.seq;
        presync.chains.insert(
            last_hash,
            PresyncChain {
                headers: all,
                work,
                height,
                seq,
            },
        );
        // Bound memory: drop the oldest chains.
        while presync.chains.len() > PRESYNC_MAX_CHAINS || presync.held() > PRESYNC_MAX_HEADERS {
            let Some(oldest) = presync
                .chains
                .iter()
                .min_by_key(|(_, c)| c.seq)
                .map(|(k, _)| *k)
            else {
                break;
            };
            presync.chains.remove(&oldest);
        }
        tracing::debug!(height, "headers held below the minimum chainwork");
        Err(HeadersError::BelowMinimumWork { last: last_hash })
    }

    fn blocks_to_fetch(&self, max: usize) -> Vec<BlockHash> {
        let v = self.view();
        v.fetch.iter().take(max).copied().collect()
    }

    fn submit_block(&self, block: Block) -> Result<SubmitOutcome, SubmitError> {
        let hash = block.block_hash();
        let mut cs = lock(&self.chain);
        if cs.index().id_of(&hash).is_none()
            && cs.index().id_of(&block.header.prev_blockhash).is_none()
        {
            return Err(SubmitError::UnknownHeader { hash });
        }
        let before = cs.index().tip().id;
        let result = cs.submit_block(&block);
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
                    lock(&self.view).note_mutated(hash, true);
                }
            }
            Ok(pipeline::SubmitOutcome::Accepted { .. }) => {
                let mut v = lock(&self.view);
                if v.mutated.contains(&hash) {
                    v.note_mutated(hash, false);
                }
            }
            _ => {}
        }
        let after = cs.index().tip().id;
        drop(cs);
        self.refresh_after_write();
        match result {
            Err(e) => Err(SubmitError::Storage { source: e.into() }),
            Ok(pipeline::SubmitOutcome::Duplicate) => Ok(SubmitOutcome::Duplicate),
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
            if height > 0 && (height as u32).is_multiple_of(super::CFCHECKPT_INTERVAL) {
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
        Ok(super::archive::node_epochs(&cs, start, count))
    }

    fn archive_proof(
        &self,
        outpoints: &[bitcoin::OutPoint],
        epoch: Option<u32>,
        txoutproofs: bool,
    ) -> Result<crate::archive::ProofBatch, ArchiveQueryError> {
        let cs = self.snapshots.load();
        super::archive::node_proof(&cs, outpoints, epoch, txoutproofs)
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
/// `chain` in a [`NodeP2p`], spawns [`super::run`], and spawns a tip
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
    let backend = Arc::new(NodeP2p::new(chain));
    let (handle, task) = super::spawn(backend.clone(), config, shutdown.clone());
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
