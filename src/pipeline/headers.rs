//! Header storage for the P2P layer: headers accepted without block data.

use crate::primitives::BlockId;
use crate::store::headers::encode_headers;
use crate::store::META_FLAT_HEADERS;

use super::open::flat_pos_bytes;
use super::{now_secs, Chainstate, HeadersAccepted, PipelineError, RefusedHeader};

/// Header storage for the P2P layer (`src/node/p2p_backend.rs`): headers
/// accepted without block data.
impl Chainstate {
    /// Checks `headers` (PoW, difficulty, timestamps, version, linkage; see
    /// [`crate::chain::index::BlockIndex::accept_header`]) one by one and stores the new ones with
    /// status [`BlockStatus::HeadersOnly`](crate::chain::index::BlockStatus::HeadersOnly) (like Core's
    /// `ProcessNewBlockHeaders`): one record appended to the `headers/`
    /// files (`store::headers`), then one index-database batch with its
    /// committed length. Headers already known are skipped.
    ///
    /// Returns the number of new headers and the first refused header, if
    /// any; the headers before it stay stored.
    ///
    /// # Errors
    /// [`PipelineError`] when the index database fails.
    pub fn accept_headers(
        &mut self,
        headers: &[bitcoin::block::Header],
    ) -> Result<HeadersAccepted, PipelineError> {
        self.check_not_failed()?;
        let now = now_secs();
        let mut new_ids = Vec::new();
        let mut refused = None;
        for (i, header) in headers.iter().enumerate() {
            let before = self.index.len();
            match self.index.accept_header(header, now) {
                Ok(id) => {
                    if self.index.len() > before {
                        new_ids.push(id);
                    }
                }
                Err(error) => {
                    refused = Some(RefusedHeader { index: i, error });
                    break;
                }
            }
        }
        if !new_ids.is_empty() {
            // One record in the headers files, not a row per header.
            let items: Vec<(BlockId, bitcoin::block::Header)> = new_ids
                .iter()
                .filter_map(|id| self.index.get(*id).map(|e| (*id, e.header)))
                .collect();
            let stored = self.store_headers(&items);
            self.guard_writes(stored)?;
            self.seal_final_epochs()?;
            self.publish();
        }
        Ok(HeadersAccepted {
            new: new_ids.len(),
            refused,
        })
    }

    /// Appends `items` to the headers files and commits their length in
    /// one boundary (which ends any open group).
    pub(super) fn store_headers(
        &mut self,
        items: &[(BlockId, bitcoin::block::Header)],
    ) -> Result<(), PipelineError> {
        self.headers.append(&encode_headers(items))?;
        let mut batch = self.take_batch();
        batch.put_meta(META_FLAT_HEADERS, &flat_pos_bytes(self.headers.position()));
        self.commit_boundary(batch)
    }

    /// Connects stored blocks that extend the best chain but are not
    /// connected yet (after a crash between storing a block's data and
    /// connecting it, nothing else would connect the last such block until
    /// another block arrives). A no-op when the tip is the best candidate.
    ///
    /// # Errors
    /// [`PipelineError`] when a store fails.
    pub fn activate_stored_blocks(&mut self) -> Result<(), PipelineError> {
        self.check_not_failed()?;
        let r = self.activate_best_chain();
        self.guard_writes(r)
    }
}
