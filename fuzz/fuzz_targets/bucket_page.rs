//! Decodes Sozu bucket pages from arbitrary bytes: must never panic, and
//! whatever decodes must re-encode to the same page.
#![no_main]

use kakehi::sozu::page::{decode_bucket, decode_bucket_unchecked, encode_bucket};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Past the checksum: the field parser sees arbitrary bytes.
    if let Ok(bucket) = decode_bucket_unchecked(data) {
        if let Ok(page) = encode_bucket(&bucket, data.len()) {
            assert_eq!(&page[4..], &data[4..], "decode/encode round trip");
        }
    }
    // With the checksum, as the table reads pages.
    let _ = decode_bucket(data, 4096);
});
