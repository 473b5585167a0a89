//! [`PipelineStats`]: the writer's counters since start-up, published with
//! every [`ChainSnapshot`](super::ChainSnapshot) and every
//! [`Progress`](super::Progress), and read by the status page, the metrics
//! and the benches.

/// Counters since start-up.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PipelineStats {
    /// Blocks connected to the UTXO table.
    pub blocks_connected: u64,
    /// Blocks rejected (invalid, orphan, mutated).
    pub blocks_rejected: u64,
    /// Reorganisations (active tip moved to a block that does not extend it).
    pub reorgs: u64,
    /// Reorgs refused for being deeper than 100 blocks.
    pub reorgs_refused: u64,
    /// Wall time spent in `Chainstate::submit_block` (checks, storage,
    /// connection, commits), microseconds: against the elapsed time of a
    /// sync it tells how much of it the pipeline took.
    pub submit_micros: u64,
    /// Time spent computing the UTXO set's MuHash deltas (blocks
    /// connected, on the script threads or the writer, and blocks
    /// disconnected, on the writer), microseconds.
    pub muhash_micros: u64,
    /// Inputs whose scripts Core's interpreter verified (blocks rejected
    /// for a script included).
    pub inputs_verified: u64,
    /// Wall time of script verification, microseconds (it overlaps the
    /// writer's other work on the block and the next one).
    pub script_micros: u64,
    /// Blocks connected without script verification (assumevalid).
    pub blocks_assumed_valid: u64,
    /// Blocks whose connect used their validation ahead (lookups, UTXO
    /// checks and script checks made while their parent's scripts ran:
    /// `Chainstate::submit_block_with_next`).
    pub blocks_validated_ahead: u64,
}
