//! Sozu bucket pages (format 4) from arbitrary bytes: opening one must never
//! panic; whatever opens must re-encode to the same bytes; the reader's
//! keyed lookup must agree with the whole decode; and the writer's in-place
//! edits on a page that opened must leave a page that still validates (or
//! refuse with an error), never panic; and a spill's batch applied in one
//! walk (`arrive_all`) must give the bytes of `arrive` on each entry.
#![no_main]

use kakehi::sozu::page::{
    self, decode, decode_disk, encode, find_in_disk_page, open_disk, open_unchecked, seal,
};
use kakehi::sozu::{outpoint_key, BlockId, Consumption};
use bitcoin::hashes::Hash;
use bitcoin::Txid;
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
    let before = mem.clone();
    let slots: Vec<u16> = (0..n).filter(|s| (pick(4) >> (s % 8)) & 1 == 1).collect();
    let removed = page::remove(&mut mem, &slots);
    page::validate(&mem).expect("a removal left an invalid page");
    if let Ok(moved) = removed {
        spill(&before, &moved, (pick(5), pick(6)));
    }
}

/// A spill's batch: the entries `moved` (removed from `page`) arrive in
/// `page` less another choice of its entries (`keep` bits), some entries
/// on either side turned into spend markers of their keys (`marks` bits),
/// so markers meet entries and markers of their keys and entries meet
/// markers. An entry arriving onto an entry of its key (invariant 1
/// excludes it) is left out of the batch. `arrive_all` must give exactly
/// the bytes of `arrive` on each entry in turn, and a valid page.
fn spill(page: &[u8], moved: &[u8], (keep, marks): (u8, u8)) {
    let n = page::head(page).count;
    let mut child = page::new_page();
    for (slot, (_, e)) in page::entries(page).enumerate().take(n as usize) {
        if (keep >> (slot % 8)) & 1 == 1
            && page::append(&mut child, &as_marker(e, marks, slot)).is_err()
        {
            return;
        }
    }
    let mut batch = Vec::new();
    let mut at = 0;
    while at < moved.len() {
        let Ok(e) = page::EntryRef::parse(&moved[at..]) else {
            return;
        };
        let arriving = as_marker(e, marks.rotate_left(4), at);
        at += e.len();
        let new = page::EntryRef::parse(&arriving).expect("one entry");
        let onto_entry = page::entries(&child)
            .any(|(_, c)| !c.is_marker() && !new.is_marker() && page::key_eq(c.key(), new.key()));
        if !onto_entry {
            batch.extend_from_slice(&arriving);
        }
    }
    let mut each = child.clone();
    let mut at = 0;
    let mut each_ok = true;
    while at < batch.len() && each_ok {
        let len = page::entry_len(&batch, at).expect("the batch is whole entries");
        each_ok = page::arrive(&mut each, &batch[at..at + len]).is_ok();
        at += len;
    }
    let all = page::arrive_all(&mut child, &batch);
    if each_ok {
        all.expect("arrive_all refused what arrive on each entry took");
        assert_eq!(child, each, "arrive_all and arrive on each entry differ");
        page::validate(&child).expect("a spill's batch left an invalid page");
    }
}

/// Entry `e`'s bytes, or, when bit `i % 8` of `marks` is set and it is an
/// entry, the spend marker of its key holding its consumptions and one
/// spend of block `marks` (so a merge onto its key adds bytes, and the
/// offsets after it move).
fn as_marker(e: page::EntryRef<'_>, marks: u8, i: usize) -> Vec<u8> {
    if (marks >> (i % 8)) & 1 == 0 || e.is_marker() {
        return e.bytes().to_vec();
    }
    let mut consumed: Vec<Consumption> = e.consumptions().collect();
    consumed.push(Consumption {
        block: BlockId(u32::from(marks)),
        txid: Txid::from_byte_array([marks; 32]),
        vin: i as u32,
    });
    let mut out = Vec::new();
    match page::encode_marker(&e.key_array(), &consumed, &mut out) {
        Ok(()) => out,
        Err(_) => e.bytes().to_vec(),
    }
}
