//! Decodes Sozu bucket pages from arbitrary bytes: must never panic, and
//! whatever decodes must re-encode to the same page; the reader's keyed
//! lookup must never panic and must agree with the whole decode.
#![no_main]

use kakehi::sozu::{key_outpoint, outpoint_key};
use kakehi::sozu::page::{decode_bucket, decode_bucket_unchecked, encode_bucket, find_in_page};
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
    // The keyed lookup, with the checksum made right so the parser runs;
    // it asks for the keys the whole decode finds, and one more.
    if data.len() >= 4 {
        let mut page = data.to_vec();
        let crc = crc32fast::hash(&page[4..]);
        page[..4].copy_from_slice(&crc.to_le_bytes());
        let mut keys = vec![[0xa5u8; 36]];
        let whole = decode_bucket(&page, page.len());
        if let Ok(b) = &whole {
            keys.extend(b.slots.iter().map(|s| outpoint_key(&s.entry.outpoint)));
        }
        let found = find_in_page(&page, page.len(), &keys);
        if let Ok(b) = whole {
            let found = found.expect("a page that decodes whole is searchable");
            for (k, got) in keys.iter().zip(&found.found) {
                let want = b.find(&key_outpoint(k)).map(|i| &b.slots[i]);
                assert_eq!(got.as_ref(), want);
            }
        }
    }
});
