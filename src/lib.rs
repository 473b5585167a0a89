//! kakehi: a Bitcoin P2P indexing node.
//!
//! Blocks (from files or peers) go through one writer, the
//! [`pipeline`]: header checks against the [`chain`] index, consensus checks
//! in [`validation`] against the [`sozu`] UTXO table under the block's
//! branch view, BIP-158 [`filters`], and one commit per block boundary across
//! the [`store`] and the table. Every input's script is evaluated by Bitcoin
//! Core's own interpreter ([`validation::script`]; blocks buried under the
//! assumevalid block skip their scripts, as in Core). The [`http`] API reads
//! committed state. Unconfirmed transactions go through the [`mempool`]
//! (Core's acceptance rules), which follows the published chain snapshots.

#![warn(missing_docs)]

pub mod archive;
pub mod chain;
pub mod config;
pub mod fds;
pub mod filters;
pub mod http;
pub mod import;
pub mod mempool;
pub mod muhash;
pub mod node;
pub mod p2p;
pub mod pipeline;
pub mod primitives;
pub mod reindex;
pub mod rpc;
pub mod snapshot;
pub mod sozu;
pub mod store;
pub mod validation;
