//! A block's BIP-158 basic filter and MuHash delta, built on the script
//! threads in their idle time (`ScriptPool::run`), from the moment the
//! block passed its economic checks (at its connect, or when it was
//! validated ahead, `pipeline/ahead.rs`) until its connect needs them,
//! after its scripts' verdict. Both are functions of the block, its height
//! and its spent outputs only, and stay in memory until then: nothing of
//! them is written before the verdict, and a block rejected (or a block
//! validated ahead and dropped) drops them. The writer takes them with
//! [`PendingTask::join`], which builds them on the writer itself when no
//! worker has taken them yet (every time when the pool has no workers).

use std::sync::Arc;
use std::time::Instant;

use bitcoin::bip158::BlockFilter;
use bitcoin::Block;

use crate::filters::{self, FilterError};
use crate::muhash::{block_delta, BlockDelta};
use crate::validation::script::PendingTask;
use crate::validation::SpentOutput;

use super::Chainstate;

/// A block's filter and MuHash delta, as built by [`Chainstate::start_digests`].
pub(super) struct Digests {
    /// The block's BIP-158 basic filter (outputs and spent scripts).
    pub filter: Result<BlockFilter, FilterError>,
    /// The UTXO set's MuHash change ([`block_delta`]).
    pub delta: BlockDelta,
    /// Time spent computing `delta`, microseconds.
    pub delta_micros: u64,
}

impl Digests {
    /// Builds `block`'s (at `height`, spending `spent`).
    fn build(block: &Block, height: u32, spent: &[SpentOutput]) -> Self {
        let scripts = spent.iter().map(|s| s.coin.script_pubkey.as_slice());
        let filter = filters::basic_filter(block, scripts);
        let (delta, delta_micros) = timed_block_delta(block, height, spent);
        Digests {
            filter,
            delta,
            delta_micros,
        }
    }
}

/// [`block_delta`] and the microseconds it took.
pub(super) fn timed_block_delta(
    block: &Block,
    height: u32,
    spent: &[SpentOutput],
) -> (BlockDelta, u64) {
    let started = Instant::now();
    let delta = block_delta(block, height, spent);
    (delta, started.elapsed().as_micros() as u64)
}

impl Chainstate {
    /// Hands the building of `block`'s filter and MuHash delta (at
    /// `height`, spending `spent`, which passed the economic checks) to
    /// the script threads.
    pub(super) fn start_digests(
        &mut self,
        block: &Arc<Block>,
        height: u32,
        spent: &Arc<[SpentOutput]>,
    ) -> PendingTask<Digests> {
        let (block, spent) = (Arc::clone(block), Arc::clone(spent));
        self.script_pool()
            .run(move || Digests::build(&block, height, &spent))
    }

    /// Takes the digests started by [`Chainstate::start_digests`] (built
    /// here when no worker took them), adding their MuHash time to the
    /// pipeline's `muhash_micros`.
    pub(super) fn join_digests(&mut self, pending: PendingTask<Digests>) -> Digests {
        let digests = pending.join();
        self.stats.muhash_micros = self
            .stats
            .muhash_micros
            .saturating_add(digests.delta_micros);
        digests
    }
}
