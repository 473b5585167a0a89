//! Bitcoin P2P layer: codec, handshake, peers, sync, serving.

pub mod codec;
