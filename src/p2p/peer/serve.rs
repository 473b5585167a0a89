//! Serving a peer: headers (`getheaders`), block inventories (`getblocks` with Core's continuation `inv`), blocks and transactions (`getdata`, transactions from the mempool), addresses (`getaddr`), and announcing our new tip.

use super::*;

impl Peer {
    pub(super) async fn announce_tip(&mut self) -> Result<(), Disconnect> {
        let (height, tip) = self.net.backend.tip();
        let (best_height, _) = self.net.backend.best_header_tip();
        // Catching up (initial download): announce nothing, as Core. Like
        // Core's `IsInitialBlockDownload` this latches: once caught up, a
        // peer feeding us a higher header chain it never delivers cannot
        // silence our announcements.
        if height < best_height && !self.net.caught_up.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.net.caught_up.store(true, Ordering::Relaxed);
        if self.last_announced == Some(tip) || self.best_hash == Some(tip) {
            return Ok(());
        }
        self.last_announced = Some(tip);
        if self.send_headers {
            // Headers only if they connect to a header the peer has (an
            // `inv` we sent does not count: the peer may not have fetched
            // it yet, and unconnecting headers are penalised).
            if let Some(since) = self.peer_has {
                let b = self.backend();
                let headers =
                    blocking(move || b.headers_after(&[since], tip, MAX_BLOCKS_TO_ANNOUNCE + 1))
                        .await
                        .unwrap_or_default();
                if !headers.is_empty()
                    && headers.len() <= MAX_BLOCKS_TO_ANNOUNCE
                    && headers.last().map(|h| h.block_hash()) == Some(tip)
                {
                    self.peer_has = Some(tip);
                    return self.send(NetworkMessage::Headers(headers)).await;
                }
            }
        }
        self.send(NetworkMessage::Inv(vec![Inventory::Block(tip)]))
            .await
    }

    pub(super) async fn on_getheaders(&mut self, req: GetHeadersMessage) -> Result<(), Disconnect> {
        if req.locator_hashes.is_empty() {
            // The stop block's header alone, if it may be served (Core: a
            // way to fetch one header, used after an unconnecting
            // announcement); else nothing.
            let Some(header) = self.net.backend.header(&req.stop_hash) else {
                return Ok(());
            };
            return self.send(NetworkMessage::Headers(vec![header])).await;
        }
        let b = self.backend();
        let headers = blocking(move || {
            b.headers_after(&req.locator_hashes, req.stop_hash, MAX_HEADERS as usize)
        })
        .await
        .unwrap_or_default();
        if let Some(last) = headers.last() {
            self.last_announced = Some(last.block_hash());
            self.peer_has = Some(last.block_hash());
        }
        self.send(NetworkMessage::Headers(headers)).await
    }

    /// `getblocks`: an `inv` of up to [`MAX_GETBLOCKS`] active-chain blocks
    /// after the locator's fork point, the stop block excluded (Core's
    /// `ProcessMessage` for `GETBLOCKS`). A full batch remembers its last
    /// block as the continuation: when the peer asks for it, an `inv` of
    /// our tip follows ([`Peer::on_getdata`]), so a peer that syncs by
    /// `getblocks` (bcoin, btcd, old Core) asks for the next batch.
    pub(super) async fn on_getblocks(&mut self, req: GetBlocksMessage) -> Result<(), Disconnect> {
        let b = self.backend();
        let stop = req.stop_hash;
        let mut headers =
            blocking(move || b.headers_after(&req.locator_hashes, stop, MAX_GETBLOCKS))
                .await
                .unwrap_or_default();
        if headers.last().is_some_and(|h| h.block_hash() == stop) {
            headers.pop();
        }
        let Some(last) = headers.last().map(|h| h.block_hash()) else {
            return Ok(());
        };
        if headers.len() == MAX_GETBLOCKS {
            self.continuation_block = Some(last);
        }
        let inv = headers
            .iter()
            .map(|h| Inventory::Block(h.block_hash()))
            .collect();
        self.send(NetworkMessage::Inv(inv)).await
    }

    /// After a block was sent: if it was the continuation of a full
    /// `getblocks` batch, an `inv` of our tip, sent even when redundant
    /// (Core's `m_continuation_block` in `ProcessGetBlockData`).
    pub(super) async fn after_block_served(&mut self, hash: BlockHash) -> Result<(), Disconnect> {
        if self.continuation_block != Some(hash) {
            return Ok(());
        }
        self.continuation_block = None;
        let (_, tip) = self.net.backend.tip();
        self.send(NetworkMessage::Inv(vec![Inventory::Block(tip)]))
            .await
    }

    /// `getdata`: blocks from the block files (`MSG_CMPCT_BLOCK` answered
    /// with the full witness block, as Core does for blocks too deep for a
    /// compact one: kakehi offers no compact blocks), transactions from the
    /// few we relayed (`MSG_TX` without witness, `MSG_WITNESS_TX` and
    /// `MSG_WTX` with, as Core). Everything else, and what we do not have,
    /// is listed in one `notfound`.
    pub(super) async fn on_getdata(&mut self, inv: Vec<Inventory>) -> Result<(), Disconnect> {
        let mut not_found = Vec::new();
        for item in inv {
            let served = match item {
                Inventory::Block(h) => self.serve_block(h, false).await?,
                Inventory::WitnessBlock(h) | Inventory::CompactBlock(h) => {
                    self.serve_block(h, true).await?
                }
                Inventory::Transaction(txid) => self.serve_tx(GenTxid::Txid(txid), false).await?,
                Inventory::WitnessTransaction(txid) => {
                    self.serve_tx(GenTxid::Txid(txid), true).await?
                }
                Inventory::WTx(wtxid) => self.serve_tx(GenTxid::Wtxid(wtxid), true).await?,
                _ => false,
            };
            if !served {
                not_found.push(item);
            }
        }
        if !not_found.is_empty() {
            self.send(NetworkMessage::NotFound(not_found)).await?;
        }
        Ok(())
    }

    /// Sends block `hash` (with or without witness); false when we do not
    /// have it (or its stored bytes do not parse).
    pub(super) async fn serve_block(
        &mut self,
        hash: BlockHash,
        witness: bool,
    ) -> Result<bool, Disconnect> {
        let b = self.backend();
        let Some(bytes) = blocking(move || b.block_bytes(&hash)).await.flatten() else {
            return Ok(false);
        };
        let payload = if witness {
            bytes
        } else {
            match strip_witness(&bytes) {
                Some(p) => p,
                None => return Ok(false),
            }
        };
        let frame = codec::encode_raw(self.net.magic, "block", &payload);
        self.write(&frame).await?;
        self.after_block_served(hash).await?;
        Ok(true)
    }

    /// Sends transaction `id`: from the mempool when the node keeps one
    /// (only what may be served to this peer: [`Peer::tx_for_getdata`]),
    /// else from the recent relays; false when there is none (Core answers
    /// `notfound` likewise).
    pub(super) async fn serve_tx(
        &mut self,
        id: GenTxid,
        witness: bool,
    ) -> Result<bool, Disconnect> {
        let tx = if self.net.backend.mempool_min_feerate().is_some() {
            self.tx_for_getdata(id)
        } else {
            let pick = |t: &Transaction| match id {
                GenTxid::Txid(txid) => t.compute_txid() == txid,
                GenTxid::Wtxid(wtxid) => t.compute_wtxid() == wtxid,
            };
            self.net.recent_txs.lock().iter().find(|t| pick(t)).cloned()
        };
        let Some(tx) = tx else { return Ok(false) };
        let mut tx = (*tx).clone();
        if !witness {
            for input in &mut tx.input {
                input.witness.clear();
            }
        }
        self.send(NetworkMessage::Tx(tx)).await?;
        Ok(true)
    }

    pub(super) async fn on_getaddr(&mut self) -> Result<(), Disconnect> {
        // Answered once per connection, to inbound peers only (Core).
        if !self.inbound || self.sent_getaddr_answer {
            return Ok(());
        }
        self.sent_getaddr_answer = true;
        let entries = self.net.addrs.lock().sample(codec::MAX_ADDR as usize);
        if entries.is_empty() {
            return Ok(());
        }
        if self.addrv2 {
            let list = entries
                .into_iter()
                .map(|e| AddrV2Message {
                    time: e.last_seen,
                    services: ServiceFlags::from(e.services),
                    addr: match e.addr.ip() {
                        std::net::IpAddr::V4(ip) => AddrV2::Ipv4(ip),
                        std::net::IpAddr::V6(ip) => AddrV2::Ipv6(ip),
                    },
                    port: e.addr.port(),
                })
                .collect();
            self.send(NetworkMessage::AddrV2(list)).await
        } else {
            let list = entries
                .into_iter()
                .map(|e| {
                    (
                        e.last_seen,
                        Address::new(&e.addr, ServiceFlags::from(e.services)),
                    )
                })
                .collect();
            self.send(NetworkMessage::Addr(list)).await
        }
    }
}

/// Serialization of a block without witness data (for `MSG_BLOCK`
/// requests). `None` when the stored bytes do not parse.
fn strip_witness(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut block: Block = deserialize(bytes).ok()?;
    for tx in &mut block.txdata {
        for input in &mut tx.input {
            input.witness.clear();
        }
    }
    Some(serialize(&block))
}
