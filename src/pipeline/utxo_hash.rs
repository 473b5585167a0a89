//! The MuHash3072 of the active chain's UTXO set ([`crate::muhash`]), kept
//! by the writer at every tip change and committed with the tip marker.
//!
//! The state is the fraction of the active tip, stored in the index
//! database's metadata under `muhash` as tip id (u32 BE) ‖ numerator (384
//! bytes LE) ‖ denominator (384 bytes LE), in the same batch as the tip
//! marker, so the two never disagree. Moving the tip walks the path the
//! block index gives: each block left (old tip down to the fork point) is
//! disconnected (its [`BlockDelta`] removed: created coins into the
//! denominator, spent coins back into the numerator), each block entered
//! is connected. The newly validated block's delta comes from memory (built
//! on the script threads, `pipeline/digests.rs`); the others' from their
//! stored block and spent-output records. The set is
//! never walked again, except once to build the state of a datadir made
//! before this existed.

use std::sync::Arc;

use crate::muhash::{BlockDelta, MuHash3072, STATE_BYTES};
use crate::primitives::BlockId;
use crate::store::{WriteBatch, META_MUHASH};

use super::digests::timed_block_delta;
use super::{Chainstate, PipelineError};

/// Coins between two progress lines of the one-time build.
const BUILD_PROGRESS_EVERY: u64 = 1_000_000;

/// Encodes the persisted row: tip id (u32 BE) ‖ state.
fn encode(tip: BlockId, state: &MuHash3072) -> Vec<u8> {
    let mut v = tip.0.to_be_bytes().to_vec();
    v.extend_from_slice(&state.to_bytes());
    v
}

/// Decodes [`encode`]'s row; `None` when malformed.
fn decode(bytes: &[u8]) -> Option<(BlockId, MuHash3072)> {
    if bytes.len() != 4 + STATE_BYTES {
        return None;
    }
    let tip = BlockId(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]));
    Some((tip, MuHash3072::from_bytes(&bytes[4..])?))
}

impl Chainstate {
    /// Loads the persisted MuHash of the active tip; builds it from the
    /// UTXO table (once, with progress lines) when it is missing or names
    /// another tip (a datadir from before it was kept), and commits it.
    ///
    /// # Errors
    /// Store or UTXO-table failure.
    pub(super) fn load_muhash(&mut self) -> Result<(), PipelineError> {
        let tip = self.index.tip().id;
        if let Some((at, state)) = self.store.meta(META_MUHASH)?.and_then(|b| decode(&b)) {
            if at == tip {
                self.muhash = Arc::new(state);
                return Ok(());
            }
        }
        let height = self.index.tip_height();
        tracing::info!(
            height,
            "building the UTXO set's MuHash (once for this datadir)"
        );
        let started = std::time::Instant::now();
        let mut state = MuHash3072::new();
        let mut coins = 0u64;
        self.for_each_utxo(&mut |op, coin, h| {
            let coin = crate::sozu::Coin {
                height: h,
                ..coin.clone()
            };
            state.insert(&crate::muhash::coin_bytes(op, &coin));
            coins += 1;
            if coins.is_multiple_of(BUILD_PROGRESS_EVERY) {
                tracing::info!(coins, "MuHash build progress");
            }
        })?;
        tracing::info!(coins, secs = started.elapsed().as_secs_f64(), muhash = %state.core_hex(), "MuHash built");
        let mut batch = WriteBatch::default();
        batch.put_meta(META_MUHASH, &encode(tip, &state));
        self.store.commit(batch)?;
        self.muhash = Arc::new(state);
        Ok(())
    }

    /// Moves the MuHash from the active tip to `target` (before the index
    /// switches to it) and records the new state in `batch`. `fresh` is the
    /// delta of a block being connected by this boundary (not yet
    /// readable from the stores).
    ///
    /// # Errors
    /// [`PipelineError::Inconsistent`] when a block on the way has no
    /// stored data or spent-output record; flat-file errors.
    pub(super) fn muhash_to(
        &mut self,
        batch: &mut WriteBatch,
        target: BlockId,
        fresh: Option<(BlockId, &BlockDelta)>,
    ) -> Result<(), PipelineError> {
        let old = self.index.tip().id;
        let fork =
            self.index
                .fork_point(old, target)
                .ok_or_else(|| PipelineError::Inconsistent {
                    reason: format!("no fork point between blocks {} and {}", old.0, target.0),
                })?;
        let mut state = (*self.muhash).clone();
        let mut cur = old;
        while cur != fork {
            state.remove_set(&self.stored_delta(cur)?);
            cur = self.index.get(cur).and_then(|e| e.prev).ok_or_else(|| {
                PipelineError::Inconsistent {
                    reason: format!("block {} has no parent below the fork", cur.0),
                }
            })?;
        }
        for id in self.index.path_from(fork, target) {
            match fresh {
                Some((f, delta)) if f == id => state.insert_set(delta),
                _ => state.insert_set(&self.stored_delta(id)?),
            }
        }
        batch.put_meta(META_MUHASH, &encode(target, &state));
        self.muhash = Arc::new(state);
        Ok(())
    }

    /// The delta of an already connected block, from its stored bytes and
    /// spent outputs.
    fn stored_delta(&mut self, id: BlockId) -> Result<BlockDelta, PipelineError> {
        let missing = |what: &str| PipelineError::Inconsistent {
            reason: format!("block {} has no stored {what}", id.0),
        };
        let height = self
            .index
            .get(id)
            .map(|e| e.height)
            .ok_or_else(|| missing("entry"))?;
        let current = self.current();
        let block = current.read_block(id)?.ok_or_else(|| missing("data"))?;
        let spent = current
            .spent_outputs(id)?
            .ok_or_else(|| missing("spent outputs"))?;
        let (delta, micros) = timed_block_delta(&block, height, &spent);
        self.stats.muhash_micros = self.stats.muhash_micros.saturating_add(micros);
        Ok(delta)
    }
}
