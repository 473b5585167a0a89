//! Header sync and block download from a peer: locators and `getheaders`, `headers` (stored, unconnecting, below the minimum chainwork, invalid), `inv` announcements, the block download window, and received blocks.

use super::*;

impl Peer {
    pub(super) fn locator(&self) -> Vec<BlockHash> {
        let mut loc = self.net.backend.locator();
        loc.truncate(101);
        loc
    }

    pub(super) async fn send_getheaders(
        &mut self,
        locator: Vec<BlockHash>,
    ) -> Result<(), Disconnect> {
        let msg = GetHeadersMessage::new(locator, BlockHash::all_zeros());
        self.getheaders_at = Some(Instant::now());
        self.send(NetworkMessage::GetHeaders(msg)).await
    }

    /// Starts the initial header sync with this peer when it claims more
    /// than our best header and no other peer is doing it.
    pub(super) async fn maybe_start_header_sync(&mut self) -> Result<(), Disconnect> {
        let (best, _) = self.net.backend.best_header_tip();
        if self.best_height <= best || !self.is_full_node() {
            return Ok(());
        }
        {
            let mut hs = self.net.header_sync.lock();
            if hs.is_some() {
                return Ok(());
            }
            *hs = Some((self.id, Instant::now()));
        }
        debug!(peer = %self.addr, from = best, to = self.best_height, "starting header sync");
        let loc = self.locator();
        self.send_getheaders(loc).await
    }

    pub(super) fn is_full_node(&self) -> bool {
        self.version.as_ref().is_some_and(|v| {
            v.services.has(ServiceFlags::NETWORK) && v.services.has(ServiceFlags::WITNESS)
        })
    }

    /// Fills this peer's download slots from the window; detects a staller.
    pub(super) async fn request_blocks(&mut self) -> Result<(), Disconnect> {
        let (tip_height, _) = self.net.backend.tip();
        if !self.is_full_node() || self.best_height <= tip_height {
            return Ok(());
        }
        let window = self.net.backend.blocks_to_fetch(DOWNLOAD_WINDOW);
        if window.is_empty() {
            return Ok(());
        }
        let now = Instant::now();
        let (assigned, staller) = {
            let mut sched = self.net.sched.lock();
            // Only blocks the peer can have: at or below the height it is
            // known to have (Core's `pindexBestKnownBlock`, by height), and
            // not ones it said it does not have. Core sends no `notfound`
            // for blocks, so asking a lagging peer would only stall.
            // At the peer's own best height, only its best block: another
            // block there is on a branch it did not announce (say a header
            // whose body arrived mutated from someone else).
            let backend = &self.net.backend;
            let peer_height = self.best_height;
            let peer_best = self.best_hash;
            let assigned = sched.assign(
                self.id,
                &window,
                |h| {
                    self.not_found.contains(h)
                        || match backend.block_height(h) {
                            Some(x) if x < peer_height => false,
                            Some(x) if x == peer_height => peer_best.is_some_and(|b| b != *h),
                            _ => true,
                        }
                },
                now,
            );
            let mut staller = None;
            let (best, _) = self.net.backend.best_header_tip();
            let window_limits = best > tip_height + DOWNLOAD_WINDOW as u32;
            if assigned.is_empty()
                && sched.in_flight_of(self.id) < MAX_IN_FLIGHT_PER_PEER
                && window_limits
            {
                staller = sched.staller(&window, now).filter(|p| *p != self.id);
                if staller.is_some() {
                    sched.on_stall();
                }
            }
            (assigned, staller)
        };
        if let Some(p) = staller {
            warn!(
                staller = p,
                "block download stalled; disconnecting the staller"
            );
            self.net
                .send_to(p, PeerCmd::Disconnect(Disconnect::Stalling));
        }
        if assigned.is_empty() {
            return Ok(());
        }
        let inv = assigned.into_iter().map(Inventory::WitnessBlock).collect();
        self.send(NetworkMessage::GetData(inv)).await
    }

    pub(super) async fn on_inv(&mut self, inv: Vec<Inventory>) -> Result<(), Disconnect> {
        // Transaction entries go to the relay (`relay::on_tx_inv`).
        let mut unknown = false;
        let mut txs = Vec::new();
        for item in inv {
            match item {
                Inventory::Transaction(t) => txs.push(GenTxid::Txid(t)),
                Inventory::WTx(w) => txs.push(GenTxid::Wtxid(w)),
                _ => {}
            }
            if let Inventory::Block(h) | Inventory::WitnessBlock(h) = item {
                match self.net.backend.block_height(&h) {
                    Some(height) => {
                        self.peer_has = Some(h);
                        if height > self.best_height {
                            self.best_height = height;
                            self.best_hash = Some(h);
                        }
                    }
                    None => unknown = true,
                }
            }
        }
        if !txs.is_empty() {
            self.on_tx_inv(txs).await?;
        }
        if unknown {
            let loc = self.locator();
            self.send_getheaders(loc).await?;
        }
        self.request_blocks().await
    }

    pub(super) async fn on_headers(&mut self, headers: Vec<Header>) -> Result<(), Disconnect> {
        let n = headers.len();
        let Some(last) = headers.last().map(|h| h.block_hash()) else {
            // Nothing beyond our locator: the peer's chain is no better than
            // our best header, whatever its `version` claimed.
            let (best, _) = self.net.backend.best_header_tip();
            self.best_height = self.best_height.min(best);
            self.getheaders_at = None;
            self.end_header_sync();
            return Ok(());
        };
        // A short announcement extending our tip: its blocks (Core's direct
        // fetch, `HeadersDirectFetchBlocks`).
        let direct: Vec<BlockHash> = if n <= MAX_BLOCKS_TO_ANNOUNCE
            && headers.first().map(|h| h.prev_blockhash) == Some(self.net.backend.tip().1)
        {
            headers.iter().map(|h| h.block_hash()).collect()
        } else {
            Vec::new()
        };
        let b = self.backend();
        let res = blocking(move || b.accept_headers(&headers)).await;
        let Some(res) = res else { return Ok(()) };
        match res {
            Ok(out) => self.on_headers_stored(&out, last, n, &direct).await,
            Err(e) => self.on_headers_not_stored(e, n).await,
        }
    }

    /// `n` headers ending at `last` were stored (`out`): fetch the blocks
    /// of a short announcement (`direct`) from this peer, note how far it
    /// is, and go on with the header sync (a full message asks for more)
    /// and the block download.
    async fn on_headers_stored(
        &mut self,
        out: &HeadersOutcome,
        last: BlockHash,
        n: usize,
        direct: &[BlockHash],
    ) -> Result<(), Disconnect> {
        self.unconnecting = 0;
        self.getheaders_at = None;
        self.peer_has = Some(last);
        // Fetched from this peer even when the global plan follows another
        // header of equal or more work whose body nobody serves (say one
        // that arrived mutated): the peer announced these, so it has them.
        if !direct.is_empty() && self.is_full_node() {
            let assigned = self
                .net
                .sched
                .lock()
                .assign(self.id, direct, |_| false, Instant::now());
            if !assigned.is_empty() {
                let inv = assigned.into_iter().map(Inventory::WitnessBlock).collect();
                self.send(NetworkMessage::GetData(inv)).await?;
            }
        }
        if out.last_height >= self.best_height || (n as u64) < MAX_HEADERS {
            // A message that is not full ends at the peer's tip, so this
            // also corrects a height claimed too high in `version` (else we
            // would ask again every tick).
            self.best_height = out.last_height;
            self.best_hash = Some(last);
        }
        if n as u64 == MAX_HEADERS {
            self.note_header_progress();
            let mut loc = vec![last];
            loc.extend(self.locator());
            loc.truncate(101);
            self.send_getheaders(loc).await?;
        } else {
            self.end_header_sync();
        }
        self.request_blocks().await
    }

    /// A message of `n` headers was not stored, for `e`: count it if it
    /// does not connect, punish a broken or invalid chain, go on with a
    /// presync below the minimum chainwork.
    async fn on_headers_not_stored(&mut self, e: HeadersError, n: usize) -> Result<(), Disconnect> {
        match e {
            HeadersError::Unconnected { .. } => {
                // Every unconnecting message counts, also while our
                // `getheaders` is unanswered (Core's
                // `MAX_NUM_UNCONNECTING_HEADERS_MSGS`); any message that
                // connects, the answer included, resets the count. An
                // honest peer's announcements racing our request are a few
                // per round trip, far below the limit.
                self.unconnecting += 1;
                if self.unconnecting > MAX_UNCONNECTING_HEADERS {
                    return Err(misbehaving(Misbehaviour::Unconnecting {
                        count: self.unconnecting,
                    }));
                }
                // While our `getheaders` is unanswered, announcements racing
                // it are expected not to connect: wait for the answer rather
                // than ask again.
                if self
                    .getheaders_at
                    .is_some_and(|t| t.elapsed() < GETHEADERS_ANSWER_WAIT)
                {
                    return Ok(());
                }
                let loc = self.locator();
                self.send_getheaders(loc).await
            }
            e @ (HeadersError::NotContinuous { .. } | HeadersError::Invalid { .. }) => {
                Err(misbehaving(Misbehaviour::Headers(e)))
            }
            HeadersError::BelowMinimumWork { last: below } => {
                // Presync: the node keeps bounded state for this chain and
                // stores nothing yet; keep asking while the peer has more.
                if n as u64 == MAX_HEADERS {
                    self.note_header_progress();
                    self.send_getheaders(vec![below]).await
                } else {
                    debug!(peer = %self.addr, "peer's chain ends below the work threshold");
                    self.end_header_sync();
                    Ok(())
                }
            }
            HeadersError::PresyncPassed { from } => {
                // Enough work now: ask for the same chain again, from its
                // base; it is stored as it comes back.
                self.note_header_progress();
                self.send_getheaders(vec![from]).await
            }
            e => {
                warn!(peer = %self.addr, error = %e, "headers not stored");
                self.end_header_sync();
                Ok(())
            }
        }
    }

    /// Restarts the header-sync peer's progress timer (it answered).
    pub(super) fn note_header_progress(&self) {
        if let Some((_, since)) = self.net.header_sync.lock().as_mut() {
            *since = Instant::now();
        }
    }

    pub(super) fn end_header_sync(&self) {
        let mut hs = self.net.header_sync.lock();
        if matches!(*hs, Some((p, _)) if p == self.id) {
            *hs = None;
        }
    }

    /// Handles `block`, taking the reader's next message ahead when one
    /// is already there (into `peeked`, handled next): when it is a block
    /// whose parent is `block` and that was asked of this peer, the node
    /// gets it with `block` to validate it ahead (during initial sync,
    /// blocks asked in a window arrive one behind the other).
    pub(super) async fn block_with_next(
        &mut self,
        block: Arc<Block>,
        msg_rx: &mut mpsc::Receiver<Result<NetworkMessage, CodecError>>,
        peeked: &mut Option<Peeked>,
    ) -> Result<(), Disconnect> {
        let next = match msg_rx.try_recv() {
            Ok(Ok(NetworkMessage::Block(next))) => {
                let next = Arc::new(next);
                *peeked = Some(Peeked::Block(Arc::clone(&next)));
                Some(next)
            }
            Ok(other) => {
                *peeked = Some(Peeked::Other(other));
                None
            }
            Err(_) => None,
        };
        // Only a child this peer was asked for is worth validating ahead:
        // an unsolicited one waits for its own turn (its header is checked
        // first, in `on_block`).
        let next = next.filter(|n| {
            n.header.prev_blockhash == block.block_hash() && {
                let hash = n.block_hash();
                self.net.sched.lock().is_in_flight_from(self.id, &hash)
            }
        });
        self.on_block(block, next).await
    }

    /// Handles a received block (`next`: the block received right behind
    /// it, when it is its child).
    pub(super) async fn on_block(
        &mut self,
        block: Arc<Block>,
        next: Option<Arc<Block>>,
    ) -> Result<(), Disconnect> {
        let hash = block.block_hash();
        let requested = self.net.sched.lock().received(self.id, &hash);
        if !requested && self.net.backend.block_height(&hash).is_none() {
            // Unsolicited block with an unknown header: its header must link.
            let b = self.backend();
            let header = block.header;
            match blocking(move || b.accept_headers(&[header])).await {
                Some(Ok(_)) => {}
                Some(Err(HeadersError::Unconnected { .. })) | None => return Ok(()),
                Some(Err(
                    e @ (HeadersError::NotContinuous { .. } | HeadersError::Invalid { .. }),
                )) => return Err(misbehaving(Misbehaviour::Headers(e))),
                Some(Err(_)) => return Ok(()),
            }
        }
        if !requested {
            // Core processes an unrequested block only if it could extend
            // the best chain; by height here (work is the node's business).
            let (tip_height, _) = self.net.backend.tip();
            if !matches!(self.net.backend.block_height(&hash), Some(h) if h > tip_height) {
                debug!(peer = %self.addr, block_hash = %hash, "unrequested block below our tip; ignored");
                return Ok(());
            }
        }
        let b = self.backend();
        match blocking(move || b.submit_block_with_next(block, next)).await {
            Some(Ok(SubmitOutcome::NewTip { height, hash })) => {
                self.net.note_block(self.id);
                debug!(height, block_hash = %hash, "new tip");
                self.net.broadcast(|| PeerCmd::AnnounceTip);
            }
            Some(Ok(_)) => {}
            Some(Err(e @ SubmitError::Invalid { .. })) => {
                return Err(misbehaving(Misbehaviour::Block(e)))
            }
            // Core punishes a known-invalid block from an outbound peer
            // only (MaybePunishNodeForBlock, BLOCK_CACHED_INVALID).
            Some(Err(e @ SubmitError::KnownInvalid { .. })) if !self.inbound => {
                return Err(misbehaving(Misbehaviour::Block(e)))
            }
            Some(Err(SubmitError::KnownInvalid { hash })) => {
                debug!(peer = %self.addr, block_hash = %hash, "known-invalid block from an inbound peer; ignored");
            }
            Some(Err(e)) => {
                warn!(peer = %self.addr, block_hash = %hash, error = %e, "block not stored")
            }
            None => {}
        }
        self.request_blocks().await
    }
}
