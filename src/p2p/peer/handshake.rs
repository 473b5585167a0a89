//! The version handshake: our `version`, the checks of theirs (user agent length, minimum protocol version, self-connection), BIP-339 `wtxidrelay` and BIP-155 `sendaddrv2` before `verack`, and the messages sent once connected.

use super::*;

impl Peer {
    pub(super) fn version_message(&mut self) -> VersionMessage {
        let mut services = ServiceFlags::NETWORK | ServiceFlags::WITNESS;
        if self.net.backend.filter_index_synced() {
            services |= ServiceFlags::COMPACT_FILTERS;
        }
        if self.net.backend.archive_ready() {
            services |= archive_service();
        }
        self.our_services = services;
        let nonce = self.net.nonces.next();
        self.our_nonce = Some(nonce);
        self.net.our_nonces.lock().insert(nonce);
        let (height, _) = self.net.backend.tip();
        let timestamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
        VersionMessage {
            version: PROTOCOL_VERSION,
            services,
            timestamp,
            receiver: Address::new(&self.addr, ServiceFlags::NONE),
            sender: Address::new(&unspecified, services),
            nonce,
            user_agent: self.net.config.user_agent.clone(),
            start_height: height as i32,
            // Without a mempool, ask peers not to send transactions.
            relay: self.net.backend.mempool_min_feerate().is_some(),
        }
    }

    pub(super) async fn handshake(
        &mut self,
        msg_rx: &mut mpsc::Receiver<Result<NetworkMessage, CodecError>>,
        cmd_rx: &mut mpsc::Receiver<PeerCmd>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), Disconnect> {
        let deadline = tokio::time::Instant::now() + self.net.config.timeouts.handshake;
        if !self.inbound {
            let v = self.version_message();
            self.send(NetworkMessage::Version(v)).await?;
        }
        while self.version.is_none() || !self.verack {
            let msg = tokio::select! {
                m = msg_rx.recv() => match m {
                    Some(Ok(m)) => m,
                    Some(Err(CodecError::BadMagic { got, .. })) if self.version.is_none() => {
                        return Err(Disconnect::NotV1 { got })
                    }
                    Some(Err(e)) => return Err(codec_disconnect(e)),
                    None => return Err(Disconnect::Io(std::io::ErrorKind::UnexpectedEof.into())),
                },
                c = cmd_rx.recv() => match c {
                    Some(PeerCmd::Disconnect(d)) => return Err(d),
                    Some(PeerCmd::Shutdown) | None => return Err(Disconnect::Shutdown),
                    Some(_) => continue,
                },
                _ = tokio::time::sleep_until(deadline) => return Err(Disconnect::HandshakeTimeout),
                _ = shutdown.changed() => return Err(Disconnect::Shutdown),
            };
            match msg {
                NetworkMessage::Version(v) => self.on_version(v).await?,
                NetworkMessage::Verack => {
                    if self.version.is_none() {
                        return Err(misbehaving(Misbehaviour::BeforeVersion {
                            command: "verack",
                        }));
                    }
                    self.verack = true;
                }
                NetworkMessage::WtxidRelay if self.version.is_some() => self.wtxid_relay = true,
                NetworkMessage::SendAddrV2 if self.version.is_some() => self.addrv2 = true,
                NetworkMessage::Unknown { .. } => {}
                other => {
                    if self.version.is_none() {
                        return Err(misbehaving(Misbehaviour::BeforeVersion {
                            command: other.cmd(),
                        }));
                    }
                    // Core ignores other messages before verack.
                }
            }
        }
        Ok(())
    }

    /// Their `version`: ignored when redundant (Core: "redundant version
    /// message"); else checked (user agent length, minimum protocol
    /// version, not our own nonce), recorded, and answered with ours
    /// (inbound), BIP-339 `wtxidrelay`, BIP-155 `sendaddrv2` and `verack`.
    ///
    /// # Errors
    /// The [`Disconnect`] a failed check or a write gives.
    async fn on_version(&mut self, v: VersionMessage) -> Result<(), Disconnect> {
        if self.version.is_some() {
            debug!(peer = %self.addr, "redundant version message ignored");
            return Ok(());
        }
        if v.user_agent.len() > MAX_SUBVERSION_LENGTH {
            return Err(misbehaving(Misbehaviour::UserAgentTooLong {
                len: v.user_agent.len(),
                max: MAX_SUBVERSION_LENGTH,
            }));
        }
        if v.version < crate::p2p::MIN_PEER_PROTOCOL_VERSION {
            return Err(Disconnect::ObsoleteVersion(v.version));
        }
        if self.inbound && self.net.our_nonces.lock().contains(&v.nonce) {
            return Err(Disconnect::SelfConnection);
        }
        self.best_height = v.start_height.max(0) as u32;
        if let Some(info) = self.net.shared.peers.lock().get_mut(&self.id) {
            info.services = v.services.to_u64();
            info.user_agent.clone_from(&v.user_agent);
            info.start_height = v.start_height;
        }
        let their_version = v.version;
        self.version = Some(v);
        if self.inbound {
            let ours = self.version_message();
            self.send(NetworkMessage::Version(ours)).await?;
        }
        let mut msgs = Vec::new();
        if their_version >= WTXID_RELAY_VERSION {
            msgs.push(NetworkMessage::WtxidRelay);
        }
        msgs.push(NetworkMessage::SendAddrV2);
        msgs.push(NetworkMessage::Verack);
        self.send_all(msgs).await
    }

    pub(super) async fn after_handshake(&mut self) -> Result<(), Disconnect> {
        let their_version = self.version.as_ref().map(|v| v.version).unwrap_or(0);
        info!(peer = %self.addr, id = self.id, inbound = self.inbound, version = their_version,
              height = self.best_height, "peer connected");
        let services = self
            .version
            .as_ref()
            .map(|v| v.services.to_u64())
            .unwrap_or(0);
        self.net.addrs.lock().mark_good(self.addr, services);
        let mut msgs = Vec::new();
        if their_version >= SENDHEADERS_VERSION {
            msgs.push(NetworkMessage::SendHeaders);
        }
        if !self.inbound && self.net.config.connect.is_empty() {
            msgs.push(NetworkMessage::GetAddr);
        }
        msgs.push(NetworkMessage::Ping(self.new_ping_nonce()));
        self.send_all(msgs).await?;
        self.start_relay();
        self.maybe_start_header_sync().await?;
        Ok(())
    }
}
