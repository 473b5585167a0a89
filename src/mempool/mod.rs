//! The mempool: unconfirmed transactions accepted by Bitcoin Core's rules
//! (`MemPoolAccept` in `validation.cpp`, `policy/`), kept beside the chain
//! state and never inside its writer.
//!
//! - [`reject`]: why a transaction is refused, with Core's reject reasons.
//! - [`policy`]: Core 30.0's relay policy that needs no mempool:
//!   standardness of a transaction, its outputs, inputs and witnesses,
//!   dust, sigop limits, the lone-transaction TRUC limit.
//! - [`accept`]: the acceptance checks of one transaction, in Core's order.
//! - [`assemble`]: projected blocks, in Core's block-assembly order.
//! - [`pool`] and [`entry`]: the contents, as persistent maps.
//! - [`persist`]: `mempool.dat`, saved at a clean stop, reloaded at start.
//!
//! # Threads and locks
//!
//! One [`Mempool`] per node. Submissions (HTTP, P2P, CLI) and chain
//! updates take its writer lock in turn; readers (HTTP, relay) load a
//! [`MempoolSnapshot`], an O(1) copy of the pool published after every
//! change, without locks. The chain writer never waits for the mempool:
//! the mempool follows the published [`ChainSnapshot`]s, comparing its tip
//! with theirs ([`Mempool::sync_with_chain`]): a connected block removes
//! its transactions and their conflicts; a reorg returns the disconnected
//! blocks' transactions and re-checks every entry against the new tip.
//!
//! Source: Bitcoin Core 30.0 (`src/txmempool.cpp`, `src/validation.cpp`,
//! `src/policy/`, `src/node/mempool_persist.cpp`). Differences are listed
//! in `docs/mempool.md`.

pub mod accept;
pub mod assemble;
pub mod entry;
pub mod persist;
pub mod policy;
pub mod pool;
pub mod reject;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use bitcoin::{Transaction, Txid};
use parking_lot::Mutex;
use tracing::{debug, info, warn};

pub use accept::{AcceptError, Accepted};
pub use entry::MempoolEntry;
pub use pool::{Pool, Totals};
pub use reject::{TxReject, TxRejectClass};

use crate::snapshot::{ChainSnapshot, Snapshots};
use entry::feerate_sat_per_kvb;

/// Core's ancestor and descendant limits (`-limitancestorcount`,
/// `-limitancestorsize`, `-limitdescendantcount`,
/// `-limitdescendantsize`; defaults 25 transactions and 101,000 vbytes,
/// `policy/policy.h`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AncestorLimits {
    /// Most in-mempool ancestors, the transaction included.
    pub ancestor_count: u64,
    /// Most vbytes of a transaction and its in-mempool ancestors.
    pub ancestor_size_vbytes: u64,
    /// Most in-mempool descendants of any ancestor, itself included.
    pub descendant_count: u64,
    /// Most vbytes of any ancestor and its in-mempool descendants.
    pub descendant_size_vbytes: u64,
}

impl Default for AncestorLimits {
    fn default() -> Self {
        AncestorLimits {
            ancestor_count: 25,
            ancestor_size_vbytes: 101_000,
            descendant_count: 25,
            descendant_size_vbytes: 101_000,
        }
    }
}

/// The mempool's settings (the config file's `[mempool]` section sets
/// some: [`crate::config::MempoolSection`]).
#[derive(Clone, Debug, PartialEq)]
pub struct MempoolConfig {
    /// Most memory the pool accounts for, MiB (Core's `-maxmempool`,
    /// default 300; Core's MB are 1,000,000 bytes, ours 1,048,576).
    pub max_mib: u64,
    /// Transactions older than this leave, hours (Core's
    /// `-mempoolexpiry`, default 336: two weeks).
    pub expiry_hours: u64,
    /// Save the pool at a clean stop and reload it at start (Core's
    /// `-persistmempool`, default on).
    pub persist: bool,
    /// Largest feerate `POST /tx` accepts, sats per 1,000 vbytes (Core's
    /// `sendrawtransaction` `maxfeerate`, default 0.10 BTC/kvB); 0 turns
    /// the check off.
    pub max_feerate: u64,
    /// The relay policy.
    pub policy: policy::PolicyConfig,
    /// The package limits.
    pub limits: AncestorLimits,
}

impl Default for MempoolConfig {
    fn default() -> Self {
        MempoolConfig {
            max_mib: 300,
            expiry_hours: 336,
            persist: true,
            max_feerate: 10_000_000,
            policy: policy::PolicyConfig::default(),
            limits: AncestorLimits::default(),
        }
    }
}

/// Core's `ROLLING_FEE_HALFLIFE`: the mempool minimum feerate halves in
/// this many seconds once a block has been connected since it last rose.
const ROLLING_FEE_HALFLIFE: f64 = 12.0 * 3600.0;

/// An immutable state of the mempool, published after every change: the
/// pool, the chain tip it was made consistent with, and its minimum
/// feerate.
#[derive(Clone)]
pub struct MempoolSnapshot {
    /// The transactions and their indexes.
    pub pool: Pool,
    /// The mempool's current minimum feerate, sats per 1,000 vbytes
    /// (Core's `mempoolminfee`: the larger of the rolling minimum and the
    /// minimum relay feerate).
    pub min_feerate: u64,
    /// Counters since start.
    pub counters: Arc<Counters>,
}

/// Counters since start, for `/metrics` and the status page.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    /// Transactions accepted.
    pub accepted: u64,
    /// Refusals by Core's reject reason (script failures grouped under
    /// `mempool-script-verify-flag-failed`).
    pub rejected: BTreeMap<String, u64>,
    /// Transactions removed by reason: `confirmed`, `conflict`,
    /// `replaced`, `sizelimit`, `expiry`, `reorg`.
    pub removed: BTreeMap<&'static str, u64>,
}

/// What a successful submission did.
#[derive(Clone, Debug)]
pub struct Submitted {
    /// The new entry.
    pub entry: Arc<MempoolEntry>,
    /// Txids it replaced (with their descendants).
    pub replaced: Vec<Txid>,
}

/// A callback run after each accepted transaction, outside the lock (the
/// P2P relay announces it).
pub type OnAccepted = Box<dyn Fn(&Arc<MempoolEntry>) + Send + Sync>;

/// The writer's state.
struct Inner {
    pool: Pool,
    /// Core's `rollingMinimumFeeRate`, sats per 1,000 vbytes.
    rolling_min_fee: f64,
    last_rolling_update: u64,
    block_since_bump: bool,
    counters: Counters,
}

/// The node's mempool. See the module docs.
pub struct Mempool {
    inner: Mutex<Inner>,
    published: ArcSwap<MempoolSnapshot>,
    chain: Snapshots,
    config: MempoolConfig,
    on_accepted: Mutex<Vec<OnAccepted>>,
}

/// Seconds since the UNIX epoch.
fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Mempool {
    /// An empty mempool following `chain`'s publications.
    pub fn new(chain: Snapshots, config: MempoolConfig) -> Self {
        let tip = chain.load().index().tip().hash;
        let mut pool = Pool::default();
        pool.set_tip(tip);
        let inner = Inner {
            pool,
            rolling_min_fee: 0.0,
            last_rolling_update: now(),
            block_since_bump: false,
            counters: Counters::default(),
        };
        let published = ArcSwap::from_pointee(MempoolSnapshot {
            pool: inner.pool.clone(),
            min_feerate: config.policy.min_relay_feerate,
            counters: Arc::new(Counters::default()),
        });
        Mempool {
            inner: Mutex::new(inner),
            published,
            chain,
            config,
            on_accepted: Mutex::new(Vec::new()),
        }
    }

    /// The settings.
    pub fn config(&self) -> &MempoolConfig {
        &self.config
    }

    /// The latest published state (lock-free).
    pub fn snapshot(&self) -> Arc<MempoolSnapshot> {
        self.published.load_full()
    }

    /// Runs `f` after every accepted transaction (outside the lock).
    pub fn on_accepted(&self, f: OnAccepted) {
        self.on_accepted.lock().push(f);
    }

    /// Checks `tx` by Core's rules against the chain tip and the pool, and
    /// adds it (replacing what it conflicts with) when it passes. With
    /// `max_feerate` (sats per 1,000 vbytes), a transaction paying more is
    /// refused (`max-fee-exceeded`, `sendrawtransaction`'s `maxfeerate`). Brings
    /// the pool up to the latest chain snapshot first. Blocking: reads the
    /// UTXO set and runs scripts.
    ///
    /// # Errors
    /// [`AcceptError::Rejected`] with Core's reason (`mempool full` when
    /// the size limit evicts the transaction itself);
    /// [`AcceptError::Storage`] when the chain state cannot be read.
    pub fn submit(
        &self,
        tx: Transaction,
        max_feerate: Option<u64>,
    ) -> Result<Submitted, AcceptError> {
        let chain = self.chain.load();
        let (result, snapshot) = {
            let mut inner = self.inner.lock();
            self.update_locked(&mut inner, &chain);
            let result = self.accept_with(&mut inner, &chain, Arc::new(tx), max_feerate, false);
            match &result {
                Ok(_) => inner.counters.accepted += 1,
                Err(AcceptError::Rejected(r)) => {
                    *inner.counters.rejected.entry(reason_key(r)).or_default() += 1;
                }
                Err(AcceptError::Storage(_)) => {}
            }
            (result, self.publish_locked(&mut inner))
        };
        self.published.store(snapshot);
        if let Ok(s) = &result {
            for f in self.on_accepted.lock().iter() {
                f(&s.entry);
            }
        }
        result
    }

    /// Brings the pool up to the latest published chain snapshot: removes
    /// what connected blocks confirmed or conflict with, returns the
    /// transactions of disconnected blocks, re-checks the rest after a
    /// reorg, expires old entries. Cheap when the tip has not moved.
    pub fn sync_with_chain(&self) {
        let chain = self.chain.load();
        if self.inner.lock().pool.tip() == Some(chain.index().tip().hash) {
            return;
        }
        let snapshot = {
            let mut inner = self.inner.lock();
            self.update_locked(&mut inner, &chain);
            self.publish_locked(&mut inner)
        };
        self.published.store(snapshot);
    }

    /// The acceptance and its effects, under the writer lock (the fee
    /// and size limits bypassed for transactions returning after a reorg
    /// or a restart, as Core's `bypass_limits`).
    fn accept_with(
        &self,
        inner: &mut Inner,
        chain: &ChainSnapshot,
        tx: Arc<Transaction>,
        max_feerate: Option<u64>,
        bypass_limits: bool,
    ) -> Result<Submitted, AcceptError> {
        let now = now();
        let ctx = accept::AcceptContext {
            snapshot: chain,
            config: &self.config,
            now,
            min_feerate: self.rolling_min_feerate(inner, now),
            bypass_limits,
        };
        let Accepted { entry, replaced } = accept::check(&inner.pool, &ctx, tx)?;
        if let Some(max) = max_feerate.filter(|m| *m > 0) {
            if entry.fee > policy::fee_at_rate(max, entry.vsize).to_sat() {
                return Err(TxReject::new(TxRejectClass::MempoolPolicy, "max-fee-exceeded").into());
            }
        }
        let txid = entry.txid;
        let mut removed = Vec::new();
        for t in &replaced {
            removed.extend(inner.pool.remove(t).map(|e| e.txid));
        }
        count_removed(&mut inner.counters, "replaced", removed.len());
        let entry = inner.pool.insert(entry);
        if !bypass_limits {
            self.trim_to_size(inner, now);
            if !inner.pool.contains(&txid) {
                return Err(TxReject::new(TxRejectClass::MempoolPolicy, "mempool full").into());
            }
        }
        debug!(%txid, fee = entry.fee, vsize = entry.vsize, replaced = removed.len(), "transaction accepted to the mempool");
        Ok(Submitted {
            entry,
            replaced: removed,
        })
    }

    /// Core's `GetMinFee`: the rolling minimum feerate, decayed since its
    /// last rise (faster when the pool is far below its limit), sats per
    /// 1,000 vbytes; 0 while it has never risen.
    fn rolling_min_feerate(&self, inner: &mut Inner, now: u64) -> u64 {
        if !inner.block_since_bump || inner.rolling_min_fee == 0.0 {
            return inner.rolling_min_fee.round() as u64;
        }
        if now > inner.last_rolling_update + 10 {
            let limit = self.size_limit_bytes();
            let usage = inner.pool.totals().usage;
            let mut halflife = ROLLING_FEE_HALFLIFE;
            if usage < limit / 4 {
                halflife /= 4.0;
            } else if usage < limit / 2 {
                halflife /= 2.0;
            }
            let elapsed = (now - inner.last_rolling_update) as f64;
            inner.rolling_min_fee /= 2f64.powf(elapsed / halflife);
            inner.last_rolling_update = now;
            if inner.rolling_min_fee < self.config.policy.incremental_relay_feerate as f64 / 2.0 {
                inner.rolling_min_fee = 0.0;
                return 0;
            }
        }
        (inner.rolling_min_fee.round() as u64).max(self.config.policy.incremental_relay_feerate)
    }

    /// The size limit, bytes.
    fn size_limit_bytes(&self) -> u64 {
        self.config.max_mib.saturating_mul(1 << 20)
    }

    /// Core's `TrimToSize`: while the pool accounts for more than its
    /// limit, evict the transaction whose package (it and its
    /// descendants) has the lowest feerate, with its descendants, and
    /// raise the rolling minimum feerate to that feerate plus the
    /// incremental relay feerate.
    fn trim_to_size(&self, inner: &mut Inner, now: u64) {
        let limit = self.size_limit_bytes();
        let mut evicted = 0;
        while inner.pool.totals().usage > limit {
            let Some((txid, rate)) = lowest_descendant_score(&inner.pool) else {
                break;
            };
            let new_floor = (rate + self.config.policy.incremental_relay_feerate) as f64;
            if new_floor > inner.rolling_min_fee {
                inner.rolling_min_fee = new_floor;
                inner.last_rolling_update = now;
                inner.block_since_bump = false;
            }
            evicted += inner.pool.remove_with_descendants(&txid).len();
        }
        if evicted > 0 {
            count_removed(&mut inner.counters, "sizelimit", evicted);
            info!(
                evicted,
                min_feerate = inner.rolling_min_fee,
                "mempool full: evicted the lowest-feerate packages"
            );
        }
    }

    /// Makes the pool consistent with `chain`'s tip (see
    /// [`Mempool::sync_with_chain`]).
    fn update_locked(&self, inner: &mut Inner, chain: &ChainSnapshot) {
        let index = chain.index();
        let new_tip = index.tip();
        let old_tip = inner.pool.tip();
        if old_tip == Some(new_tip.hash) {
            self.expire(inner);
            return;
        }
        let old_id = old_tip.and_then(|h| index.id_of(&h));
        let (disconnected, connected) = match old_id {
            Some(old) => match index.fork_point(old, new_tip.id) {
                Some(fork) => (
                    index.path_from(fork, old),
                    index.path_from(fork, new_tip.id),
                ),
                None => (Vec::new(), Vec::new()),
            },
            None => (Vec::new(), Vec::new()),
        };
        let mut returning: Vec<Arc<Transaction>> = Vec::new();
        for id in &disconnected {
            match chain.read_block(*id) {
                Ok(Some(block)) => returning.extend(
                    block
                        .txdata
                        .into_iter()
                        .filter(|t| !t.is_coinbase())
                        .map(Arc::new),
                ),
                Ok(None) => {}
                Err(e) => {
                    warn!(error = %e, "a disconnected block could not be read: its transactions do not return to the mempool")
                }
            }
        }
        let mut confirmed_txids = BTreeSet::new();
        for id in &connected {
            match chain.read_block(*id) {
                Ok(Some(block)) => {
                    self.remove_for_block(inner, &block.txdata);
                    confirmed_txids.extend(block.txdata.iter().map(Transaction::compute_txid));
                }
                Ok(None) => {}
                Err(e) => {
                    warn!(error = %e, "a connected block could not be read: its transactions stay in the mempool until re-checked")
                }
            }
        }
        inner.block_since_bump = true;
        inner.pool.set_tip(new_tip.hash);
        if old_id.is_none() || !disconnected.is_empty() {
            returning.retain(|t| !confirmed_txids.contains(&t.compute_txid()));
            self.recheck_after_reorg(inner, chain, returning);
        }
        self.expire(inner);
        debug!(tip = %new_tip.hash, height = new_tip.height, txs = inner.pool.len(), "mempool follows the new tip");
    }

    /// Core's `removeForBlock`: the block's transactions leave, and so
    /// does every mempool transaction spending an outpoint they spend
    /// (with its descendants).
    fn remove_for_block(&self, inner: &mut Inner, txdata: &[Transaction]) {
        let mut confirmed = 0;
        let mut conflicts = 0;
        for tx in txdata {
            let txid = tx.compute_txid();
            if inner.pool.remove(&txid).is_some() {
                confirmed += 1;
            }
            if tx.is_coinbase() {
                continue;
            }
            for input in &tx.input {
                if let Some(spender) = inner.pool.spender(&input.previous_output) {
                    conflicts += inner.pool.remove_with_descendants(&spender).len();
                }
            }
        }
        count_removed(&mut inner.counters, "confirmed", confirmed);
        count_removed(&mut inner.counters, "conflict", conflicts);
    }

    /// Core's `MaybeUpdateMempoolForReorg`: the disconnected blocks'
    /// transactions return (limits bypassed), then every entry is checked
    /// again against the new tip (maturity, finality, inputs); what fails
    /// leaves.
    fn recheck_after_reorg(
        &self,
        inner: &mut Inner,
        chain: &ChainSnapshot,
        returning: Vec<Arc<Transaction>>,
    ) {
        let old: Vec<Arc<MempoolEntry>> = inner.pool.iter_by_entry().cloned().collect();
        let tip = inner.pool.tip();
        inner.pool = Pool::default();
        if let Some(t) = tip {
            inner.pool.set_tip(t);
        }
        let mut dropped = 0;
        let candidates = returning
            .into_iter()
            .map(|tx| (tx, None))
            .chain(old.into_iter().map(|e| (e.tx.clone(), Some(e.time))));
        for (tx, time) in candidates {
            match self.accept_with(inner, chain, tx, None, true) {
                Ok(s) => {
                    if let Some(time) = time {
                        restore_time(&mut inner.pool, &s.entry, time);
                    }
                }
                Err(AcceptError::Rejected(r)) if r.class == TxRejectClass::Duplicate => {}
                Err(e) => {
                    dropped += u64::from(time.is_some());
                    debug!(error = %e, "transaction left the mempool after a reorg");
                }
            }
        }
        count_removed(&mut inner.counters, "reorg", dropped as usize);
        self.trim_to_size(inner, now());
    }

    /// Core's `Expire`: entries older than `expiry_hours` leave, with
    /// their descendants.
    fn expire(&self, inner: &mut Inner) {
        let cutoff = now().saturating_sub(self.config.expiry_hours.saturating_mul(3600));
        let old: Vec<Txid> = inner.pool.entered_before(cutoff).collect();
        let mut expired = 0;
        for t in old {
            expired += inner.pool.remove_with_descendants(&t).len();
        }
        count_removed(&mut inner.counters, "expiry", expired);
    }

    /// A new published state from the writer's.
    fn publish_locked(&self, inner: &mut Inner) -> Arc<MempoolSnapshot> {
        let rolling = self.rolling_min_feerate(inner, now());
        Arc::new(MempoolSnapshot {
            pool: inner.pool.clone(),
            min_feerate: rolling.max(self.config.policy.min_relay_feerate),
            counters: Arc::new(inner.counters.clone()),
        })
    }

    /// Adds transactions read from `mempool.dat` with their entry times,
    /// through full acceptance (limits bypassed, expired ones skipped).
    /// Returns (accepted, refused).
    pub fn load(&self, txs: Vec<(Transaction, u64)>) -> (usize, usize) {
        let chain = self.chain.load();
        let cutoff = now().saturating_sub(self.config.expiry_hours.saturating_mul(3600));
        let (mut ok, mut failed) = (0, 0);
        let snapshot = {
            let mut inner = self.inner.lock();
            self.update_locked(&mut inner, &chain);
            for (tx, time) in txs {
                if time < cutoff {
                    failed += 1;
                    continue;
                }
                match self.accept_with(&mut inner, &chain, Arc::new(tx), None, true) {
                    Ok(s) => {
                        restore_time(&mut inner.pool, &s.entry, time);
                        ok += 1;
                    }
                    Err(_) => failed += 1,
                }
            }
            self.trim_to_size(&mut inner, now());
            self.publish_locked(&mut inner)
        };
        self.published.store(snapshot);
        (ok, failed)
    }
}

/// Puts back an entry's original entry time (a reorg or a reload keeps
/// it: expiry counts from when the node first saw the transaction).
fn restore_time(pool: &mut Pool, entry: &Arc<MempoolEntry>, time: u64) {
    if entry.time != time {
        pool.set_time(&entry.txid, time);
    }
}

/// The key a refusal is counted under: Core's reason, with a script
/// error's detail dropped.
fn reason_key(r: &TxReject) -> String {
    match r.reason.split_once(" (") {
        Some((head, _)) => head.to_string(),
        None => r.reason.to_string(),
    }
}

fn count_removed(counters: &mut Counters, why: &'static str, n: usize) {
    if n > 0 {
        *counters.removed.entry(why).or_default() += n as u64;
    }
}

/// The entry with the lowest descendant score (Core's
/// `CompareTxMemPoolEntryByDescendantScore`: the larger of its own
/// feerate and its package's), and that score, sats per 1,000 vbytes.
fn lowest_descendant_score(pool: &Pool) -> Option<(Txid, u64)> {
    pool.iter_by_entry()
        .map(|e| {
            let desc = pool.descendants(&e.txid);
            let (v, f) = pool.sum_of(&desc);
            let package = feerate_sat_per_kvb(e.fee + f, e.vsize + v);
            (e.txid, package.max(e.feerate_sat_per_kvb()))
        })
        .min_by_key(|(_, rate)| *rate)
}

impl Mempool {
    /// Saves the pool to `<datadir>/mempool.dat` (entry order, with entry
    /// times), as Core does at a clean stop. Returns how many were saved.
    ///
    /// # Errors
    /// [`persist::PersistError::Io`].
    pub fn save(&self) -> Result<usize, persist::PersistError> {
        let snapshot = self.snapshot();
        let entries: Vec<&Arc<MempoolEntry>> = snapshot.pool.iter_by_entry().collect();
        let chain = self.chain.load();
        persist::save(chain.datadir(), entries.iter().map(|e| (&*e.tx, e.time)))?;
        Ok(entries.len())
    }

    /// Reloads `<datadir>/mempool.dat` if there is one, re-checking every
    /// transaction against the current tip. Returns (accepted, refused);
    /// (0, 0) without a file.
    ///
    /// # Errors
    /// [`persist::PersistError`]: the file is unreadable or damaged (the
    /// mempool stays empty).
    pub fn load_saved(&self) -> Result<(usize, usize), persist::PersistError> {
        let chain = self.chain.load();
        match persist::load(chain.datadir())? {
            Some(txs) => Ok(self.load(txs)),
            None => Ok((0, 0)),
        }
    }
}

/// How often the follower thread compares the mempool's tip with the
/// chain's ([`Mempool::spawn_follower`]).
pub const FOLLOW_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

impl Mempool {
    /// Starts the thread that keeps the pool on the chain's tip
    /// ([`Mempool::sync_with_chain`] every [`FOLLOW_INTERVAL`]) until
    /// `stop` is set. The chain writer never waits for it.
    ///
    /// # Errors
    /// The OS refused a thread.
    pub fn spawn_follower(
        self: &Arc<Self>,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let mempool = self.clone();
        std::thread::Builder::new()
            .name("mempool-follow".into())
            .spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    mempool.sync_with_chain();
                    std::thread::sleep(FOLLOW_INTERVAL);
                }
            })
    }
}
