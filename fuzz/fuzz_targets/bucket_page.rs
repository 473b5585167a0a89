//! Sozu bucket pages (format 4) from arbitrary bytes: opening one must never
//! panic; whatever opens must re-encode to the same bytes; the reader's
//! keyed lookup must agree with the whole decode; and the writer's in-place
//! edits on a page that opened must leave a page that still validates (or
//! refuse with an error), never panic.
#![no_main]

use kakehi::sozu::page::{
    self, decode, decode_disk, encode, find_in_disk_page, open_disk, open_unchecked, seal,
};
use kakehi::sozu::outpoint_key;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Past the checksum: the field parser sees arbitrary bytes.
    if let Ok(mem) = open_unchecked(data) {
        if let Ok(again) = encode(&decode(&mem)).and_then(|p| seal(&p, data.len())) {
            assert_eq!(&again[4..], &data[4..], "decode/encode round trip");
        }
        edit(mem, data);
    }
    // With the checksum, as the table reads pages.
    let _ = open_disk(data, 4096);
    // The keyed lookup, with the checksum made right so the parser runs;
    // it asks for the keys the whole decode finds, and one more.
    if data.len() >= 4 {
        let mut disk = data.to_vec();
        let crc = crc32fast::hash(&disk[4..]);
        disk[..4].copy_from_slice(&crc.to_le_bytes());
        let whole = decode_disk(&disk, disk.len());
        let mut keys = vec![[0xa5u8; 36]];
        if let Ok(d) = &whole {
            keys.extend(d.slots.iter().map(|s| outpoint_key(&s.entry.outpoint)));
        }
        let found = find_in_disk_page(&disk, disk.len(), &keys);
        if let Ok(d) = whole {
            let found = found.expect("a page that decodes whole is searchable");
            for (k, got) in keys.iter().zip(&found.found) {
                let want = d
                    .slots
                    .iter()
                    .find(|s| outpoint_key(&s.entry.outpoint) == *k);
                assert_eq!(got.as_ref(), want);
            }
        }
    }
});

/// In-place edits driven by the input's last bytes: each must succeed on a
/// valid page and leave it valid, or fail with an error.
fn edit(mut mem: Vec<u8>, data: &[u8]) {
    let n = page::head(&mem).count;
    let pick = |i: usize| data.get(data.len().wrapping_sub(1 + i)).copied().unwrap_or(0);
    let slot = if n == 0 { 0 } else { u16::from(pick(0)) % (n + 1) };
    let mut record = [0u8; page::CONSUMPTION_LEN];
    record[0] = pick(1);
    record[4] = pick(2);
    let _ = page::insert_consumption(&mut mem, (slot, None), &record);
    page::validate(&mem).expect("a consumption insert left an invalid page");
    let mut production = [0u8; page::PRODUCTION_LEN];
    production[0] = pick(3);
    let _ = page::insert_production(&mut mem, (slot, None), &production);
    page::validate(&mem).expect("a production insert left an invalid page");
    let slots: Vec<u16> = (0..n).filter(|s| (pick(4) >> (s % 8)) & 1 == 1).collect();
    let _ = page::remove(&mut mem, &slots);
    page::validate(&mem).expect("a removal left an invalid page");
}
