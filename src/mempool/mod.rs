//! The mempool: unconfirmed transactions accepted by Bitcoin Core's rules
//! (`MemPoolAccept` in `validation.cpp`, `policy/`), kept beside the chain
//! state and never inside its writer.
//!
//! - [`reject`]: why a transaction is refused, with Core's reject reasons.

pub mod reject;

pub use reject::{TxReject, TxRejectClass};
