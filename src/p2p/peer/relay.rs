//! Transaction relay with one peer, as Bitcoin Core's `net_processing.cpp`:
//! fetching what it announces (`inv` → `getdata` through the shared
//! request tracker), submitting what it sends (`tx`, orphans and their
//! parents), announcing our mempool's transactions on a Poisson-delayed
//! trickle (batched `inv`, honouring its BIP-133 `feefilter`, never what
//! it is known to have), serving them (`getdata`), and sending our own
//! `feefilter`. Only when the node keeps a mempool
//! ([`NodeBackend::mempool_min_feerate`]) and the peer asked for relay
//! (`version` relay flag).

use super::*;
use crate::p2p::txdownload::BoundedSet;

/// Mean interval between `inv` trickles to inbound peers, one timer shared
/// by all of them (Core's `INBOUND_INVENTORY_BROADCAST_INTERVAL`).
pub const INBOUND_INVENTORY_BROADCAST_INTERVAL: Duration = Duration::from_secs(5);
/// Mean interval between `inv` trickles to each outbound peer (Core's
/// `OUTBOUND_INVENTORY_BROADCAST_INTERVAL`).
pub const OUTBOUND_INVENTORY_BROADCAST_INTERVAL: Duration = Duration::from_secs(2);
/// Transactions announced per second on average (Core's
/// `INVENTORY_BROADCAST_PER_SECOND`).
pub const INVENTORY_BROADCAST_PER_SECOND: usize = 14;
/// Target of one trickle (Core's `INVENTORY_BROADCAST_TARGET`: 14 × 5).
pub const INVENTORY_BROADCAST_TARGET: usize =
    INVENTORY_BROADCAST_PER_SECOND * INBOUND_INVENTORY_BROADCAST_INTERVAL.as_secs() as usize;
/// Most transactions in one trickle (Core's `INVENTORY_BROADCAST_MAX`).
pub const INVENTORY_BROADCAST_MAX: usize = 1_000;
/// Mean interval between our `feefilter` messages (Core's
/// `AVG_FEEFILTER_BROADCAST_INTERVAL`).
pub const AVG_FEEFILTER_BROADCAST_INTERVAL: Duration = Duration::from_secs(10 * 60);
/// A large change of our minimum feerate is sent within this (Core's
/// `MAX_FEEFILTER_CHANGE_DELAY`).
pub const MAX_FEEFILTER_CHANGE_DELAY: Duration = Duration::from_secs(5 * 60);
/// Protocol version from which `feefilter` is understood (BIP-133).
pub const FEEFILTER_VERSION: u32 = 70013;
/// Hashes remembered per peer as known to it (Core's
/// `m_tx_inventory_known_filter`, a rolling filter of 50,000).
pub const MAX_KNOWN_TXS: usize = 50_000;
/// Transactions waiting for a trickle per peer; more are dropped (the
/// mempool holds them all; the peer may still ask by `mempool` or get
/// them from others).
pub const MAX_TXS_TO_SEND: usize = 100_000;
/// The minimum relay feerate a `feefilter` never goes below, sats per
/// 1,000 vbytes (Core 30.0's `DEFAULT_MIN_RELAY_TX_FEE`).
pub const MIN_FEEFILTER: i64 = 100;
/// `MAX_MONEY` in sats: the `feefilter` sent while catching up.
const MAX_MONEY: i64 = 21_000_000 * 100_000_000;
/// Orphans re-submitted after one accepted transaction, at most.
const MAX_ORPHANS_PER_ACCEPT: usize = 100;

/// Relay state of one peer (Core's `Peer::TxRelay`).
pub(super) struct TxRelay {
    /// Hashes (as the peer names them) it has or was sent.
    known: BoundedSet,
    /// Accepted transactions waiting for the next trickle.
    to_send: HashSet<(Txid, Wtxid)>,
    /// The next trickle (`None`: the peer gets no announcements).
    next_inv_send: Option<Instant>,
    /// The mempool's next sequence when our last `inv` left: entries
    /// older than this may be served to the peer (Core's
    /// `m_last_inv_sequence`).
    last_inv_sequence: u64,
    /// Where the announcement of the mempool we had at the handshake
    /// stands (entry sequence), until done.
    mempool_cursor: Option<u64>,
    fee_filter_sent: i64,
    /// When our next `feefilter` is due (`None`: never, the peer does not
    /// speak BIP-133 or relay is off).
    next_feefilter: Option<Instant>,
}

impl Default for TxRelay {
    fn default() -> Self {
        TxRelay {
            known: BoundedSet::new(MAX_KNOWN_TXS),
            to_send: HashSet::new(),
            next_inv_send: None,
            last_inv_sequence: 0,
            mempool_cursor: None,
            fee_filter_sent: 0,
            next_feefilter: None,
        }
    }
}

impl TxRelay {
    /// When the peer task must wake for relay work.
    pub(super) fn next_wake(&self) -> Option<Instant> {
        let inv = self
            .next_inv_send
            .filter(|_| !self.to_send.is_empty() || self.mempool_cursor.is_some());
        match (inv, self.next_feefilter) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// An exponentially distributed duration of mean `mean` (Core's
/// `rand_exp_duration`), from the 64-bit random `r`.
pub(crate) fn rand_exp(mean: Duration, r: u64) -> Duration {
    // A uniform draw in (0, 1].
    let u = ((r >> 11) + 1) as f64 / (1u64 << 53) as f64;
    mean.mul_f64(-u.ln())
}

/// Core's `FeeFilterRounder::round`: the feerate rounded down to a bucket
/// of a geometric ladder (1.1 apart, from half the minimum relay feerate
/// to 10,000,000 sat/kvB, 0 below), one bucket lower two times in three
/// (randomized by `r`), so that a `feefilter` tells little about our
/// mempool.
pub(crate) fn round_fee_filter(fee: i64, r: u64) -> i64 {
    const MAX_FILTER_FEERATE: f64 = 1e7;
    const FEE_FILTER_SPACING: f64 = 1.1;
    let mut buckets = vec![0.0];
    let mut b = (MIN_FEEFILTER as f64 / 2.0).max(1.0);
    while b <= MAX_FILTER_FEERATE {
        buckets.push(b);
        b *= FEE_FILTER_SPACING;
    }
    // lower_bound: the first bucket ≥ fee.
    let mut i = buckets.partition_point(|x| *x < fee as f64);
    if i == buckets.len() || (i != 0 && !r.is_multiple_of(3)) {
        i -= 1;
    }
    buckets[i] as i64
}

impl Peer {
    /// Whether transactions are relayed with this peer: we keep a mempool
    /// and its `version` asked for relay.
    pub(super) fn relays_txs(&self) -> bool {
        self.net.backend.mempool_min_feerate().is_some()
            && self.version.as_ref().is_some_and(|v| v.relay)
    }

    /// Whether the node is still catching up (Core's
    /// `IsInitialBlockDownload`, latched like [`Peer::announce_tip`]'s).
    fn in_ibd(&self) -> bool {
        if self.net.caught_up.load(Ordering::Relaxed) {
            return false;
        }
        self.net.backend.tip().0 < self.net.backend.best_header_tip().0
    }

    /// The hash this peer uses for a transaction (BIP-339).
    fn relay_id(&self, txid: Txid, wtxid: Wtxid) -> GenTxid {
        if self.wtxid_relay {
            GenTxid::Wtxid(wtxid)
        } else {
            GenTxid::Txid(txid)
        }
    }

    /// Whether the node has `id` already: in the mempool, among the
    /// orphans, or recently rejected (Core's `AlreadyHaveTx`).
    fn already_have(&self, id: GenTxid) -> bool {
        let tip = self.net.backend.tip().1;
        {
            let mut d = self.net.txdownload.lock();
            if d.rejected(id, tip) || d.has_orphan(id) {
                return true;
            }
        }
        self.net.backend.mempool_tx(id).is_some()
    }

    /// Called once the handshake is done: schedules the first trickle and
    /// `feefilter`, and the announcement of the whole mempool.
    pub(super) fn start_relay(&mut self) {
        if !self.relays_txs() {
            return;
        }
        let now = Instant::now();
        self.relay.next_inv_send = Some(now);
        self.relay.mempool_cursor = Some(0);
        if self
            .version
            .as_ref()
            .is_some_and(|v| v.version >= FEEFILTER_VERSION)
        {
            self.relay.next_feefilter = Some(now);
        }
    }

    /// The transaction entries of an `inv` (Core: `MSG_WTX` from a
    /// wtxidrelay peer, `MSG_TX` from another; the other kind ignored):
    /// remembered as known to the peer, and the ones we lack tracked for
    /// a request (not while catching up).
    pub(super) async fn on_tx_inv(&mut self, ids: Vec<GenTxid>) -> Result<(), Disconnect> {
        if self.net.backend.mempool_min_feerate().is_none() {
            // No mempool: our `version` said relay = false; ignored rather
            // than disconnected (BIP-157 light clients announce anyway).
            return Ok(());
        }
        let ibd = self.in_ibd();
        let now = Instant::now();
        let preferred = !self.inbound;
        for id in ids {
            match (id, self.wtxid_relay) {
                (GenTxid::Wtxid(_), true) | (GenTxid::Txid(_), false) => {}
                _ => continue,
            }
            self.relay.known.insert(id.bytes());
            if ibd || self.already_have(id) {
                continue;
            }
            self.net
                .txdownload
                .lock()
                .requests
                .received_inv(self.id, id, preferred, now);
        }
        self.request_txs().await
    }

    /// Sends `getdata` for what the tracker says to ask this peer now.
    pub(super) async fn request_txs(&mut self) -> Result<(), Disconnect> {
        if self.net.backend.mempool_min_feerate().is_none() {
            return Ok(());
        }
        let ids = self
            .net
            .txdownload
            .lock()
            .requests
            .requestable(self.id, Instant::now());
        let inv: Vec<Inventory> = ids
            .into_iter()
            .filter(|id| !self.already_have(*id) || self.forget(*id))
            .map(|id| match id {
                GenTxid::Wtxid(w) => Inventory::WTx(w),
                // By txid (orphans' parents, pre-BIP-339 peers): with witness.
                GenTxid::Txid(t) => Inventory::WitnessTransaction(t),
            })
            .collect();
        if inv.is_empty() {
            return Ok(());
        }
        debug!(peer = %self.addr, count = inv.len(), "requesting transactions");
        self.send(NetworkMessage::GetData(inv)).await
    }

    /// Stops tracking `id`; false (for `filter`).
    fn forget(&self, id: GenTxid) -> bool {
        self.net.txdownload.lock().requests.forget(id);
        false
    }

    /// `notfound` for transactions: the peer's announcements are done.
    pub(super) fn on_tx_notfound(&mut self, ids: impl Iterator<Item = GenTxid>) {
        let mut d = self.net.txdownload.lock();
        for id in ids {
            d.requests.received_response(self.id, id);
        }
    }

    /// A `tx`, asked for or not: submitted to the mempool unless already
    /// had; an orphan is kept and its parents asked of this peer; a
    /// refusal is remembered and logged at debug. No refusal punishes the
    /// peer (Core 30.0).
    pub(super) async fn on_tx(&mut self, tx: Transaction) -> Result<(), Disconnect> {
        let (txid, wtxid) = (tx.compute_txid(), tx.compute_wtxid());
        if self.net.backend.mempool_min_feerate().is_none() {
            // Our `version` said relay = false, and Core's -blocksonly
            // disconnects here; but BIP157 light clients (kyoto sends to a
            // random peer) broadcast whatever the flag, and would lose
            // their filter server. Without a mempool: dropped.
            debug!(peer = %self.addr, %txid, "unsolicited tx ignored (no mempool)");
            return Ok(());
        }
        let rid = self.relay_id(txid, wtxid);
        self.relay.known.insert(rid.bytes());
        {
            let mut d = self.net.txdownload.lock();
            d.requests.received_response(self.id, GenTxid::Txid(txid));
            d.requests.received_response(self.id, GenTxid::Wtxid(wtxid));
        }
        if self.already_have(GenTxid::Wtxid(wtxid)) || self.already_have(GenTxid::Txid(txid)) {
            debug!(peer = %self.addr, %txid, "tx already had");
            return Ok(());
        }
        let mut queue = vec![(Arc::new(tx), self.id)];
        let mut accepted = 0usize;
        while let Some((tx, from)) = queue.pop() {
            if accepted > MAX_ORPHANS_PER_ACCEPT {
                break;
            }
            if let Some(parent) = self.submit_one(tx, from).await? {
                accepted += 1;
                let children = self.net.txdownload.lock().take_children(&parent);
                queue.extend(children);
            }
        }
        Ok(())
    }

    /// Submits one transaction (off the executor); the txid when it was
    /// accepted (its orphans are then tried).
    async fn submit_one(
        &mut self,
        tx: Arc<Transaction>,
        from: PeerId,
    ) -> Result<Option<Txid>, Disconnect> {
        let (txid, wtxid) = (tx.compute_txid(), tx.compute_wtxid());
        let b = self.backend();
        let t = tx.clone();
        let Some(res) = blocking(move || b.submit_tx(t)).await else {
            return Ok(None);
        };
        let tip = self.net.backend.tip().1;
        match res {
            Ok(()) => {
                debug!(peer = %self.addr, %txid, "tx accepted to the mempool");
                let mut d = self.net.txdownload.lock();
                d.requests.forget(GenTxid::Txid(txid));
                d.requests.forget(GenTxid::Wtxid(wtxid));
                Ok(Some(txid))
            }
            Err(TxSubmitError::MissingInputs) => {
                self.on_orphan(tx, from, tip).await?;
                Ok(None)
            }
            Err(TxSubmitError::Duplicate) => {
                self.net
                    .txdownload
                    .lock()
                    .requests
                    .forget(GenTxid::Wtxid(wtxid));
                Ok(None)
            }
            Err(TxSubmitError::Rejected {
                reason,
                remember,
                by_txid,
            }) => {
                debug!(peer = %self.addr, %txid, %wtxid, %reason, "tx rejected");
                let mut d = self.net.txdownload.lock();
                if remember {
                    d.reject(GenTxid::Wtxid(wtxid), tip);
                }
                if by_txid {
                    d.reject(GenTxid::Txid(txid), tip);
                }
                Ok(None)
            }
            Err(e) => {
                debug!(peer = %self.addr, %txid, error = %e, "tx not submitted");
                Ok(None)
            }
        }
    }

    /// A transaction with missing inputs (Core's `MempoolRejectedTx` for
    /// `TX_MISSING_INPUTS`): refused if a parent was refused; else kept as
    /// an orphan, and its parents we lack are asked of the peer that sent
    /// it (by txid, through the tracker).
    async fn on_orphan(
        &mut self,
        tx: Arc<Transaction>,
        from: PeerId,
        tip: BlockHash,
    ) -> Result<(), Disconnect> {
        let (txid, wtxid) = (tx.compute_txid(), tx.compute_wtxid());
        let mut parents: Vec<Txid> = tx.input.iter().map(|i| i.previous_output.txid).collect();
        parents.sort();
        parents.dedup();
        let rejected_parent = {
            let mut d = self.net.txdownload.lock();
            parents.iter().any(|p| d.rejected(GenTxid::Txid(*p), tip))
        };
        if rejected_parent {
            debug!(peer = %self.addr, %txid, "orphan of a rejected parent: rejected");
            let mut d = self.net.txdownload.lock();
            d.reject(GenTxid::Txid(txid), tip);
            d.reject(GenTxid::Wtxid(wtxid), tip);
            return Ok(());
        }
        let wanted: Vec<Txid> = parents
            .into_iter()
            .filter(|p| !self.already_have(GenTxid::Txid(*p)))
            .collect();
        let now = Instant::now();
        {
            let mut d = self.net.txdownload.lock();
            if d.add_orphan(tx, from, now) {
                debug!(peer = %self.addr, %txid, parents = wanted.len(), "orphan kept");
            }
            if from == self.id {
                for p in &wanted {
                    d.requests
                        .received_inv(self.id, GenTxid::Txid(*p), !self.inbound, now);
                }
            }
        }
        self.request_txs().await
    }

    /// An accepted transaction to announce at the next trickle (unless
    /// the peer is known to have it).
    pub(super) fn queue_announcement(&mut self, tx: &Transaction) {
        if self.relay.next_inv_send.is_none() || self.relay.to_send.len() >= MAX_TXS_TO_SEND {
            return;
        }
        let (txid, wtxid) = (tx.compute_txid(), tx.compute_wtxid());
        if !self
            .relay
            .known
            .contains(&self.relay_id(txid, wtxid).bytes())
        {
            self.relay.to_send.insert((txid, wtxid));
        }
    }

    /// Relay work due now: the `feefilter`, and the trickle when its time
    /// has come.
    pub(super) async fn relay_tick(&mut self) -> Result<(), Disconnect> {
        let now = Instant::now();
        self.maybe_send_feefilter(now).await?;
        match self.relay.next_inv_send {
            Some(t) if t <= now => {}
            _ => return Ok(()),
        }
        if self.relay.to_send.is_empty() && self.relay.mempool_cursor.is_none() {
            return Ok(());
        }
        let next = if self.inbound {
            self.net
                .next_inv_to_inbounds(now, INBOUND_INVENTORY_BROADCAST_INTERVAL)
        } else {
            now + rand_exp(
                OUTBOUND_INVENTORY_BROADCAST_INTERVAL,
                self.net.nonces.next(),
            )
        };
        self.relay.next_inv_send = Some(next);
        self.send_trickle().await
    }

    /// One trickle (Core's `SendMessages` inventory part): the waiting
    /// transactions still in the mempool, paying at least the peer's
    /// `feefilter` and not known to it, in entry order (parents first),
    /// at most `INVENTORY_BROADCAST_TARGET` + 5 per 1,000 waiting (up to
    /// [`INVENTORY_BROADCAST_MAX`]); the rest wait for the next one.
    async fn send_trickle(&mut self) -> Result<(), Disconnect> {
        let b = self.backend();
        // The mempool at the handshake, read on as the queue drains.
        if let Some(from) = self
            .relay
            .mempool_cursor
            .filter(|_| self.relay.to_send.len() < INVENTORY_BROADCAST_MAX)
        {
            let (ids, next) = b.mempool_txids(from, INVENTORY_BROADCAST_MAX);
            if ids.len() < INVENTORY_BROADCAST_MAX {
                self.relay.mempool_cursor = None;
            } else {
                self.relay.mempool_cursor = Some(next);
            }
            for (txid, wtxid) in ids {
                if self.relay.to_send.len() < MAX_TXS_TO_SEND {
                    self.relay.to_send.insert((txid, wtxid));
                }
            }
        }
        let mut waiting: Vec<(u64, u64, GenTxid)> = Vec::with_capacity(self.relay.to_send.len());
        for (txid, wtxid) in self.relay.to_send.drain() {
            if let Some(m) = b.mempool_tx(GenTxid::Wtxid(wtxid)) {
                let id = if self.wtxid_relay {
                    GenTxid::Wtxid(wtxid)
                } else {
                    GenTxid::Txid(txid)
                };
                waiting.push((m.sequence, m.feerate, id));
            }
        }
        waiting.sort();
        let max =
            (INVENTORY_BROADCAST_TARGET + waiting.len() / 1000 * 5).min(INVENTORY_BROADCAST_MAX);
        let mut inv = Vec::new();
        let mut rest = waiting.into_iter();
        for (_, feerate, id) in rest.by_ref() {
            if (feerate as i64) < self.fee_filter || self.relay.known.contains(&id.bytes()) {
                continue;
            }
            self.relay.known.insert(id.bytes());
            inv.push(match id {
                GenTxid::Wtxid(w) => Inventory::WTx(w),
                GenTxid::Txid(t) => Inventory::Transaction(t),
            });
            if inv.len() >= max {
                break;
            }
        }
        // What did not fit waits (looked up again next time).
        for (_, _, id) in rest {
            if let Some(m) = b.mempool_tx(id) {
                self.relay
                    .to_send
                    .insert((m.tx.compute_txid(), m.tx.compute_wtxid()));
            }
        }
        self.relay.last_inv_sequence = b.mempool_txids(u64::MAX, 0).1;
        if inv.is_empty() {
            return Ok(());
        }
        self.send(NetworkMessage::Inv(inv)).await
    }

    /// Our BIP-133 `feefilter` (Core's `MaybeSendFeefilter`): the
    /// mempool's minimum feerate, rounded ([`round_fee_filter`]) and at
    /// least [`MIN_FEEFILTER`], or `MAX_MONEY`'s bucket while catching up;
    /// sent when it differs from the last one sent, at Poisson times of
    /// mean [`AVG_FEEFILTER_BROADCAST_INTERVAL`], sooner (within
    /// [`MAX_FEEFILTER_CHANGE_DELAY`]) after a large change.
    async fn maybe_send_feefilter(&mut self, now: Instant) -> Result<(), Disconnect> {
        let (Some(min), Some(mut due)) = (
            self.net.backend.mempool_min_feerate(),
            self.relay.next_feefilter,
        ) else {
            return Ok(());
        };
        let max_filter = round_fee_filter(MAX_MONEY, 0);
        let current = if self.in_ibd() {
            MAX_MONEY
        } else {
            if self.relay.fee_filter_sent == max_filter {
                due = now;
            }
            min as i64
        };
        if now >= due {
            let filter = round_fee_filter(current, self.net.nonces.next()).max(MIN_FEEFILTER);
            self.relay.next_feefilter =
                Some(now + rand_exp(AVG_FEEFILTER_BROADCAST_INTERVAL, self.net.nonces.next()));
            if filter != self.relay.fee_filter_sent {
                self.relay.fee_filter_sent = filter;
                return self.send(NetworkMessage::FeeFilter(filter)).await;
            }
        } else if now + MAX_FEEFILTER_CHANGE_DELAY < due
            && (current < 3 * self.relay.fee_filter_sent / 4
                || current > 4 * self.relay.fee_filter_sent / 3)
        {
            let r = self.net.nonces.next() % MAX_FEEFILTER_CHANGE_DELAY.as_millis() as u64;
            self.relay.next_feefilter = Some(now + Duration::from_millis(r));
        }
        Ok(())
    }

    /// The mempool transaction `id` if it may be served to this peer: in
    /// the mempool since before our last `inv` to it (Core's
    /// `FindTxForGetData`: what we did not announce is not revealed).
    pub(super) fn tx_for_getdata(&self, id: GenTxid) -> Option<Arc<Transaction>> {
        let m = self.net.backend.mempool_tx(id)?;
        (m.sequence < self.relay.last_inv_sequence).then_some(m.tx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fee_filter_rounding_is_a_bucket_at_or_below() {
        for fee in [0i64, 100, 1_000, 12_345, 5_000_000] {
            for r in 0..6 {
                let got = round_fee_filter(fee, r);
                // The bucket at or above, or the one below: within 10 %.
                assert!(
                    got as f64 <= fee.max(50) as f64 * 1.1 + 1.0,
                    "{fee} → {got}"
                );
                assert!(got as f64 * 1.1 + 1.0 >= fee as f64, "{fee} → {got}");
            }
        }
        // r % 3 == 0 keeps the bucket at or above.
        assert_eq!(round_fee_filter(0, 0), 0);
        assert!(round_fee_filter(MAX_MONEY, 0) <= 10_000_000);
    }

    #[test]
    fn exponential_delays_have_the_right_mean() {
        let n = 20_000u64;
        let total: f64 = (0..n)
            .map(|i| {
                let r = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                rand_exp(Duration::from_secs(5), r).as_secs_f64()
            })
            .sum();
        let mean = total / n as f64;
        assert!((4.5..5.5).contains(&mean), "{mean}");
    }
}
