//! The mempool: unconfirmed transactions accepted by Bitcoin Core's rules
//! (`MemPoolAccept` in `validation.cpp`, `policy/`), kept beside the chain
//! state and never inside its writer.
//!
//! - [`reject`]: why a transaction is refused, with Core's reject reasons.
//! - [`policy`]: Core 30.0's relay policy that needs no mempool:
//!   standardness of a transaction, its outputs, inputs and witnesses,
//!   dust, sigop limits, the lone-transaction TRUC limit.

pub mod policy;
pub mod reject;

pub use reject::{TxReject, TxRejectClass};
