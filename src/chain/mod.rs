//! Chain state: network parameters, the block index (headers, heights,
//! chainwork, status, tips), proof-of-work and difficulty rules, and chain
//! views for the Sozu table.

pub mod assumevalid;
pub mod index;
pub mod params;

pub use params::ChainParams;
