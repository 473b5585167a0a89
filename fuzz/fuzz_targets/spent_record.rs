//! Spent-output records of the `spent/` flat files, from arbitrary bytes
//! (past the checksum too: the checksum is made right so the layout parser
//! sees the bytes): must never panic, and a record that decodes re-encodes
//! to the same bytes.
#![no_main]

use kakehi::store::spent::{decode_spent, encode_spent};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode_spent(data);
    let mut record = data.to_vec();
    record.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    if let Ok(spent) = decode_spent(&record) {
        assert_eq!(encode_spent(&spent), record, "decode/encode round trip");
    }
});
