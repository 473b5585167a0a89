//! The archival-proof P2P messages (`getarchepochs`, `archepochs`,
//! `getarchproof`, `archproof`) and the proof verifier, from arbitrary
//! bytes: must never panic, and a proof that decodes is checked against
//! both kinds of anchor without panicking (it will not verify).
#![no_main]

use kakehi::archive::{verify_bytes, Anchor};
use kakehi::p2p::archive::{ArchEpochs, ArchProof, GetArchEpochs, GetArchProof};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = GetArchEpochs::decode(data);
    let _ = ArchEpochs::decode(data);
    let _ = GetArchProof::decode(data);
    let _ = ArchProof::decode(data);
    let _ = verify_bytes(data, Anchor::Commitment([0x5a; 32]));
    let _ = verify_bytes(data, Anchor::EpochRoot([0xa5; 32]));
});
