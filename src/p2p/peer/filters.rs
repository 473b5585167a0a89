//! BIP-157 filter serving: `getcfilters`, `getcfheaders` and `getcfcheckpt`, with Core's limits and disconnects for bad requests.

use super::*;

impl Peer {
    /// Checks a filter request: basic type, known stop, range within
    /// `max`. `Ok(None)`: ignore (unknown stop hash: a race at the tip).
    pub(super) fn check_filter_request(
        &self,
        command: &'static str,
        filter_type: u8,
        start_height: u32,
        stop: &BlockHash,
        max: u32,
    ) -> Result<Option<u32>, Disconnect> {
        if filter_type != 0 {
            return Err(misbehaving(Misbehaviour::FilterType {
                command,
                filter_type,
            }));
        }
        let Some(stop_height) = self.net.backend.block_height(stop) else {
            debug!(peer = %self.addr, command, stop = %stop, "unknown stop hash; ignored");
            return Ok(None);
        };
        if start_height > stop_height || stop_height - start_height >= max {
            return Err(misbehaving(Misbehaviour::FilterRange {
                command,
                start_height,
                stop_height,
                max,
            }));
        }
        Ok(Some(stop_height))
    }

    pub(super) fn filters_advertised(&self, command: &'static str) -> bool {
        let ok = self.our_services.has(ServiceFlags::COMPACT_FILTERS);
        if !ok {
            debug!(peer = %self.addr, command, "filter request while NODE_COMPACT_FILTERS not advertised; ignored");
        }
        ok
    }

    pub(super) async fn on_getcfilters(&mut self, req: GetCFilters) -> Result<(), Disconnect> {
        if !self.filters_advertised("getcfilters") {
            return Ok(());
        }
        let stop = req.stop_hash;
        if self
            .check_filter_request(
                "getcfilters",
                req.filter_type,
                req.start_height,
                &stop,
                MAX_GETCFILTERS,
            )?
            .is_none()
        {
            return Ok(());
        }
        let b = self.backend();
        let start = req.start_height;
        match blocking(move || b.cfilters(start, stop)).await {
            Some(Ok(filters)) => {
                let msgs = filters
                    .into_iter()
                    .map(|(block_hash, filter)| {
                        NetworkMessage::CFilter(CFilter {
                            filter_type: 0,
                            block_hash,
                            filter,
                        })
                    })
                    .collect();
                self.send_all(msgs).await
            }
            Some(Err(e)) => self.filter_error("getcfilters", e),
            None => Ok(()),
        }
    }

    pub(super) async fn on_getcfheaders(&mut self, req: GetCFHeaders) -> Result<(), Disconnect> {
        if !self.filters_advertised("getcfheaders") {
            return Ok(());
        }
        let stop = req.stop_hash;
        if self
            .check_filter_request(
                "getcfheaders",
                req.filter_type,
                req.start_height,
                &stop,
                MAX_GETCFHEADERS,
            )?
            .is_none()
        {
            return Ok(());
        }
        let b = self.backend();
        let start = req.start_height;
        match blocking(move || b.cfheaders(start, stop)).await {
            Some(Ok((previous_filter_header, filter_hashes))) => {
                self.send(NetworkMessage::CFHeaders(CFHeaders {
                    filter_type: 0,
                    stop_hash: stop,
                    previous_filter_header,
                    filter_hashes,
                }))
                .await
            }
            Some(Err(e)) => self.filter_error("getcfheaders", e),
            None => Ok(()),
        }
    }

    pub(super) async fn on_getcfcheckpt(&mut self, req: GetCFCheckpt) -> Result<(), Disconnect> {
        if !self.filters_advertised("getcfcheckpt") {
            return Ok(());
        }
        if req.filter_type != 0 {
            return Err(misbehaving(Misbehaviour::FilterType {
                command: "getcfcheckpt",
                filter_type: req.filter_type,
            }));
        }
        let stop = req.stop_hash;
        if self.net.backend.block_height(&stop).is_none() {
            debug!(peer = %self.addr, stop = %stop, "getcfcheckpt: unknown stop hash; ignored");
            return Ok(());
        }
        let b = self.backend();
        match blocking(move || b.cfcheckpt(stop)).await {
            Some(Ok(filter_headers)) => {
                self.send(NetworkMessage::CFCheckpt(CFCheckpt {
                    filter_type: 0,
                    stop_hash: stop,
                    filter_headers,
                }))
                .await
            }
            Some(Err(e)) => self.filter_error("getcfcheckpt", e),
            None => Ok(()),
        }
    }

    pub(super) fn filter_error(
        &self,
        command: &'static str,
        e: FilterQueryError,
    ) -> Result<(), Disconnect> {
        match e {
            FilterQueryError::StartAboveStop {
                start_height,
                stop_height,
            } => Err(misbehaving(Misbehaviour::FilterRange {
                command,
                start_height,
                stop_height,
                max: 0,
            })),
            other => {
                debug!(peer = %self.addr, command, error = %other, "filter request not answered");
                Ok(())
            }
        }
    }
}
