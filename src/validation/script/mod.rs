//! Script and signature verification with Bitcoin Core's own interpreter.
//!
//! - [`engine`]: the boundary to Core's interpreter (Core 26.0, built by the
//!   `bitcoinconsensus` crate): [`PreparedTx`] verifies one transaction's
//!   inputs and returns Core's [`ScriptError`];
//! - [`flags`]: Core's `SCRIPT_VERIFY_*` [`ScriptFlags`] and the flags of a
//!   block ([`block_script_flags`], Core's `GetBlockScriptFlags`);
//! - [`block`]: every input of a block, spread over threads
//!   ([`verify_block_scripts`], [`BlockChecks`]), the first failure in
//!   block order;
//! - [`pool`]: script-check threads kept across blocks ([`ScriptPool`],
//!   Core's `CCheckQueue`), which verify a block while its caller goes on,
//!   and run tasks of the caller's in their idle time ([`PendingTask`]).
//!
//! kakehi has no interpreter of its own: every verdict on a script is
//! Core's. Why Core 26.0's libbitcoinconsensus and not libbitcoinkernel:
//! BENCHMARKS.md, "Scripts".
//!
//! # Differences from Bitcoin Core
//!
//! - The reject reason is Core 30's `block-script-verify-flag-failed
//!   (<error>)` (Core 26 to 29: `mandatory-script-verify-flag-failed`); the
//!   error text is the engine's, Core 26.0's `ScriptErrorString`. Core 30
//!   added two errors: where Core 30 says `Script number overflowed or is
//!   non-minimally encoded` (an out-of-range number in arithmetic), Core 26
//!   says `unknown error`; where Core 30 says `Empty public key in
//!   tapscript`, Core 26 says `Public key is neither compressed or
//!   uncompressed`. The verdicts are the same.
//! - When several inputs fail, kakehi reports the first in block order;
//!   Core with script threads reports whichever its workers hit first.
//! - No signature cache (Core's `CachingTransactionSignatureChecker`): it
//!   only saves work on transactions seen in the mempool, which kakehi has
//!   not.

pub mod block;
pub mod engine;
pub mod flags;
pub mod pool;
mod task;

pub use block::{verify_block_scripts, BlockChecks, BlockScriptError, OwnedBlockChecks};
pub use engine::{
    sha256_implementation, PreparedTx, ScriptError, SpentTxOut, VerifyError, BLOCK_SCRIPT_FAILURE,
};
pub use flags::{block_script_flags, ScriptFlags};
pub use pool::{PendingChecks, ScriptPool};
pub use task::PendingTask;
