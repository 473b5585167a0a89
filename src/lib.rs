//! kakehi: a Bitcoin P2P indexing node.
//!
//! See `docs/architecture.md` for the data flow and `../shared/DESIGN.md` for
//! the design this crate follows.

pub mod chain;
pub mod p2p;
pub mod sozu;
