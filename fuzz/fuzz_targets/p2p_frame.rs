//! P2P framing and every payload decoder, from arbitrary bytes: as a raw
//! stream (magic, command, length, checksum all arbitrary), and with the
//! first byte choosing a command and the checksum made right so each
//! payload decoder sees the rest. Must never panic; what decodes must
//! re-encode to a frame that decodes to the same message.
#![no_main]

use bitcoin::p2p::Magic;
use kakehi::p2p::codec::{decode_frame, encode_message, encode_raw};
use libfuzzer_sys::fuzz_target;

/// Every command a peer may send that the codec decodes.
const COMMANDS: [&str; 26] = [
    "version", "verack", "addr", "addrv2", "inv", "getdata", "notfound", "getheaders",
    "getblocks", "headers", "block", "tx", "ping", "pong", "feefilter", "getcfilters",
    "cfilter", "getcfheaders", "cfheaders", "getcfcheckpt", "cfcheckpt", "sendcmpct",
    "reject", "wtxidrelay", "sendaddrv2", "mempool",
];

fuzz_target!(|data: &[u8]| {
    let _ = decode_frame(data, Magic::REGTEST);
    let Some((&selector, payload)) = data.split_first() else {
        return;
    };
    let command = COMMANDS[selector as usize % COMMANDS.len()];
    let frame = encode_raw(Magic::REGTEST, command, payload);
    if let Ok((msg, used)) = decode_frame(&frame, Magic::REGTEST) {
        assert_eq!(used, frame.len());
        let again = encode_message(Magic::REGTEST, msg.clone());
        let (back, _) = decode_frame(&again, Magic::REGTEST).expect("re-encoded frame decodes");
        assert_eq!(back, msg, "{command}: decode/encode round trip");
    }
});
