use super::*;
use crate::sozu::types::outpoint_key;
use bitcoin::OutPoint;

fn slot(i: u8, script_len: usize) -> Slot {
    Slot {
        entry: Entry {
            outpoint: OutPoint {
                txid: Txid::from_byte_array([i; 32]),
                vout: i as u32,
            },
            coin: Coin {
                value: bitcoin::Amount::from_sat(5000),
                script_pubkey: vec![0x51; script_len],
                height: 7,
                coinbase: i.is_multiple_of(2),
            },
            produced: vec![Production {
                block: BlockId(3),
                height: 7,
            }],
            consumed: vec![Consumption {
                block: BlockId(9),
                txid: Txid::from_byte_array([0xee; 32]),
                vin: 1,
            }],
        },
        external: None,
    }
}

fn decoded(slots: Vec<Slot>) -> Decoded {
    Decoded {
        head: PageHead {
            count: slots.len() as u16,
            max_child_height: 0x0102_0304,
            purge_hint: 777,
            children: 5,
            child_mask: 0b1010,
        },
        slots,
    }
}

#[test]
fn round_trip_and_exact_header_bytes() {
    let d = decoded(vec![slot(1, 22), slot(2, 0)]);
    let mem = encode(&d).unwrap();
    let disk = seal(&mem, 4096).unwrap();
    assert_eq!(&disk[4..8], b"SZBK");
    assert_eq!(disk[8], 4);
    assert_eq!(&disk[10..12], &[2, 0]);
    assert_eq!(&disk[12..16], &[0; 4]);
    assert_eq!(&disk[16..20], &[4, 3, 2, 1]);
    assert_eq!(&disk[20..24], &777u32.to_le_bytes());
    assert_eq!(&disk[24..32], &[5, 0, 0, 0, 0, 0, 0b1010, 0]);
    // entry: key txid bytes then vout big-endian
    assert_eq!(&disk[32..64], &[1u8; 32]);
    assert_eq!(&disk[64..68], &[0, 0, 0, 1]);
    assert_eq!(mem.len(), 32 + (53 + 22 + 8 + 40) + (53 + 8 + 40));
    assert_eq!(decode_disk(&disk, 4096).unwrap(), d);
}

#[test]
fn flipped_bit_is_a_checksum_error() {
    let disk = seal(&encode(&decoded(vec![slot(1, 30)])).unwrap(), 4096).unwrap();
    let mut bad = disk.clone();
    bad[100] ^= 0x10;
    assert!(matches!(
        open_disk(&bad, 4096),
        Err(PageError::Checksum { .. })
    ));
    assert!(matches!(
        open_disk(&disk[..2048], 4096),
        Err(PageError::WrongSize { .. })
    ));
}

#[test]
fn too_large_is_refused() {
    let d = decoded((0..60).map(|i| slot(i, 30)).collect());
    let mem = encode(&d).unwrap();
    assert!(matches!(
        seal(&mem, 4096),
        Err(EncodeError::TooLarge { .. })
    ));
    let mut out = vec![9u8; 5];
    assert!(seal_into(&mem, 4096, &mut out).is_err());
    assert_eq!(out, vec![9u8; 5], "a refused seal appends nothing");
}

/// Pages sealed one after another into one buffer (a checkpoint's run of
/// pages) are each the page's own sealed image.
#[test]
fn seal_into_appends_each_image() {
    let a = encode(&decoded(vec![slot(1, 30)])).unwrap();
    let b = encode(&decoded(vec![slot(2, 22), slot(3, 0)])).unwrap();
    let mut out = Vec::new();
    seal_into(&a, 4096, &mut out).unwrap();
    seal_into(&b, 4096, &mut out).unwrap();
    assert_eq!(out.len(), 2 * 4096);
    assert_eq!(out[..4096], seal(&a, 4096).unwrap()[..]);
    assert_eq!(out[4096..], seal(&b, 4096).unwrap()[..]);
    assert_eq!(open_disk(&out[4096..], 4096).unwrap(), b);
}

/// In-place edits agree with editing the decoded entries: records land in
/// sorted order, duplicates are refused, removal keeps the others' order.
#[test]
fn edits_in_place() {
    let mut p = encode(&decoded(vec![slot(1, 22), slot(2, 0), slot(3, 5)])).unwrap();
    let c = Consumption {
        block: BlockId(4),
        txid: Txid::from_byte_array([1; 32]),
        vin: 0,
    };
    assert!(insert_consumption(&mut p, (1, None), &consumption_bytes(&c)).unwrap());
    assert!(!insert_consumption(&mut p, (1, None), &consumption_bytes(&c)).unwrap());
    let prod = Production {
        block: BlockId(3),
        height: 6,
    };
    assert!(insert_production(&mut p, (2, None), &encode_production(&prod)).unwrap());
    assert!(insert_consumption(&mut p, (9, None), &consumption_bytes(&c)).is_err());
    validate(&p).unwrap();
    let d = decode(&p);
    assert_eq!(d.slots[1].entry.consumed[0], c);
    assert_eq!(
        d.slots[2].entry.produced,
        vec![prod, slot(3, 0).entry.produced[0]]
    );
    let gone = remove(&mut p, &[0, 2]).unwrap();
    assert_eq!(
        EntryRef::parse(&gone).unwrap().key(),
        &outpoint_key(&slot(1, 0).entry.outpoint)
    );
    assert_eq!(head(&p).count, 1);
    assert_eq!(
        decode(&p).slots[0].entry.outpoint,
        slot(2, 0).entry.outpoint
    );
    assert!(remove(&mut p, &[1]).is_err());
    assert!(remove(&mut p, &[0, 0]).is_err());
    validate(&p).unwrap();
}

/// A page with one key twice is refused; keys that share their first 8
/// bytes (one transaction's outputs) are not duplicates.
#[test]
fn duplicate_keys_refused_shared_prefixes_not() {
    let same_tx = |vout: u32| {
        let mut s = slot(7, 22);
        s.entry.outpoint.vout = vout;
        s
    };
    let ok = encode(&decoded(vec![
        same_tx(1),
        slot(2, 0),
        same_tx(0),
        same_tx(2),
    ]))
    .unwrap();
    validate(&ok).unwrap();
    let dup = encode(&decoded(vec![
        same_tx(1),
        slot(2, 0),
        same_tx(0),
        same_tx(1),
    ]))
    .unwrap();
    assert_eq!(
        validate(&dup).unwrap_err(),
        PageError::Malformed {
            at: PAGE_HEADER_LEN,
            what: "duplicate key in bucket"
        }
    );
}

/// Spend markers: encoded as the format says, checked, and merged when a
/// spill brings a marker to its entry (or an entry to its marker).
#[test]
fn spend_markers_merge_on_arrival() {
    let c = |b: u32| Consumption {
        block: BlockId(b),
        txid: Txid::from_byte_array([b as u8; 32]),
        vin: b,
    };
    let e = slot(3, 22);
    let key = outpoint_key(&e.entry.outpoint);
    let marker = |cs: &[Consumption]| {
        let mut m = Vec::new();
        encode_marker(&key, cs, &mut m).unwrap();
        m
    };
    let m = marker(&[c(8), c(7), c(8)]);
    assert_eq!(m.len(), ENTRY_FIXED_LEN + 2 * CONSUMPTION_LEN);
    let r = EntryRef::parse(&m).unwrap();
    assert!(r.is_marker());
    assert_eq!(r.np(), 0);
    assert_eq!(r.consumptions().collect::<Vec<_>>(), vec![c(7), c(8)]);
    r.validate().unwrap();
    assert!(encode_marker(&key, &[], &mut Vec::new()).is_err());
    // A marker with a coin or a production is malformed.
    let mut bad = m.clone();
    bad[36] = 1;
    assert!(EntryRef::parse(&bad).unwrap().validate().is_err());
    let other = encode(&decoded(vec![slot(1, 0)])).unwrap();
    // Marker onto its entry: the entry gains the consumptions.
    let mut p = encode(&decoded(vec![slot(1, 0), e.clone()])).unwrap();
    arrive(&mut p, &m).unwrap();
    validate(&p).unwrap();
    let d = decode(&p);
    assert_eq!(d.slots.len(), 2);
    let mut want = e.entry.clone();
    want.merge_records(&[], &[c(7), c(8)]);
    assert_eq!(d.slots[1].entry, want);
    // Marker onto a marker: one marker with both lists.
    let mut p = other.clone();
    append(&mut p, &marker(&[c(9)])).unwrap();
    arrive(&mut p, &m).unwrap();
    validate(&p).unwrap();
    let (_, r) = entries(&p).nth(1).unwrap();
    assert!(r.is_marker());
    assert_eq!(r.consumptions().collect::<Vec<_>>(), vec![c(7), c(8), c(9)]);
    // Entry onto its marker: the entry takes its place and consumptions.
    let mut p = other.clone();
    append(&mut p, &m).unwrap();
    let bytes = encode(&decoded(vec![e.clone()])).unwrap();
    arrive(&mut p, &bytes[PAGE_HEADER_LEN..]).unwrap();
    validate(&p).unwrap();
    let d = decode(&p);
    assert_eq!(d.slots.len(), 2);
    assert_eq!(d.slots[1].entry, want);
    // One spill's entries at once: the marker merged, the other appended.
    let mut p = encode(&decoded(vec![e.clone()])).unwrap();
    let mut moved = m.clone();
    moved.extend_from_slice(&other[PAGE_HEADER_LEN..]);
    arrive_all(&mut p, &moved).unwrap();
    validate(&p).unwrap();
    let d = decode(&p);
    assert_eq!(d.slots.len(), 2);
    assert_eq!(d.slots[0].entry, want);
    // A production into a marker is refused, the page unchanged (found by
    // the `bucket_page` fuzz target on 2026-11-28).
    let mut p = other.clone();
    append(&mut p, &m).unwrap();
    let before = p.clone();
    let record = encode_production(&Production {
        block: BlockId(4),
        height: 8,
    });
    assert!(insert_production(&mut p, (1, None), &record).is_err());
    assert_eq!(p, before);
    assert!(insert_production(&mut p, (0, None), &record).unwrap());
    validate(&p).unwrap();
    // An entry onto its own key is refused, the page unchanged.
    let mut p = encode(&decoded(vec![e.clone()])).unwrap();
    let before = p.clone();
    assert!(arrive(&mut p, &bytes[PAGE_HEADER_LEN..]).is_err());
    assert_eq!(p, before);
}

proptest::proptest! {
    /// The fuzz target's property, run on mutated valid pages in CI.
    #[test]
    fn mutated_pages_never_panic_and_round_trip(
        flips in proptest::collection::vec((0usize..4096, proptest::prelude::any::<u8>()), 1..8),
        n in 0u8..20,
    ) {
        let d = decoded((0..n).map(|i| slot(i, 22 + i as usize)).collect());
        let mut page = seal(&encode(&d).unwrap(), 4096).unwrap();
        for (at, x) in flips {
            page[at] ^= x;
        }
        if let Ok(mem) = open_unchecked(&page) {
            let again = seal(&encode(&decode(&mem)).unwrap(), 4096).unwrap();
            proptest::prop_assert_eq!(&again[4..], &page[4..]);
        }
        let _ = open_disk(&page, 4096);
        // The reader's keyed lookup, past the checksum: never panics, and
        // agrees with the whole decode wherever that succeeds.
        let crc = crc32fast::hash(&page[4..]);
        page[..4].copy_from_slice(&crc.to_le_bytes());
        let keys: Vec<OutPointKey> = (0..n).map(|i| outpoint_key(&slot(i, 0).entry.outpoint)).collect();
        let found = find_in_disk_page(&page, 4096, &keys);
        if let Ok(d) = decode_disk(&page, 4096) {
            proptest::prop_assert_eq!(found.unwrap(), expected_find(&d, &keys));
        }
    }

    /// `find_in_disk_page` returns what a whole decode finds, key by key,
    /// in the order asked, for keys present, absent and asked twice.
    #[test]
    fn find_agrees_with_decode(
        n in 0u8..30,
        asked in proptest::collection::vec(0u8..40, 0..12),
    ) {
        let d = decoded((0..n).map(|i| slot(i, 22 + i as usize % 9)).collect());
        let page = seal(&encode(&d).unwrap(), 4096).unwrap();
        let keys: Vec<OutPointKey> = asked.iter().map(|&i| outpoint_key(&slot(i, 0).entry.outpoint)).collect();
        let got = find_in_disk_page(&page, 4096, &keys).unwrap();
        proptest::prop_assert_eq!(got.found.iter().filter(|f| f.is_some()).count(), asked.iter().filter(|&&i| i < n).count());
        proptest::prop_assert_eq!(got, expected_find(&d, &keys));
    }

    /// Any sequence of in-place edits leaves a valid page equal to the
    /// same edits made on the decoded entries.
    #[test]
    fn edits_agree_with_decoded_model(
        n in 1u8..20,
        ops in proptest::collection::vec((0u8..3, 0usize..40, 0u8..200), 0..30),
    ) {
        let mut model = decoded((0..n).map(|i| slot(i, 22 + i as usize % 5)).collect());
        let mut p = encode(&model).unwrap();
        for (op, at, x) in ops {
            let len = model.slots.len();
            if len == 0 { break; }
            let i = at % len;
            match op {
                0 => {
                    let c = Consumption { block: BlockId(u32::from(x)), txid: Txid::from_byte_array([x; 32]), vin: u32::from(x) };
                    let e = &mut model.slots[i].entry;
                    if e.consumed.len() < 255 {
                        let added = insert_consumption(&mut p, (i as u16, None), &consumption_bytes(&c)).unwrap();
                        proptest::prop_assert_eq!(added, !e.consumed.contains(&c));
                        e.merge_records(&[], &[c]);
                    }
                }
                1 => {
                    let pr = Production { block: BlockId(u32::from(x) * 7), height: u32::from(x) };
                    insert_production(&mut p, (i as u16, None), &encode_production(&pr)).unwrap();
                    model.slots[i].entry.merge_records(&[pr], &[]);
                }
                _ => {
                    remove(&mut p, &[i as u16]).unwrap();
                    model.slots.remove(i);
                }
            }
        }
        model.head.count = model.slots.len() as u16;
        validate(&p).unwrap();
        proptest::prop_assert_eq!(decode(&p), model);
    }
}

fn expected_find(d: &Decoded, keys: &[OutPointKey]) -> PageFind {
    PageFind {
        head: d.head,
        found: keys
            .iter()
            .map(|k| {
                d.slots
                    .iter()
                    .find(|s| outpoint_key(&s.entry.outpoint) == *k)
                    .cloned()
            })
            .collect(),
    }
}

/// [`arrive`] on each entry in turn: what [`arrive_all`] must equal.
fn arrive_each(page: &mut Vec<u8>, moved: &[u8]) -> Result<(), PageError> {
    let mut at = 0;
    while at < moved.len() {
        let len = entry_len(moved, at)?;
        arrive(page, &moved[at..at + len])?;
        at += len;
    }
    Ok(())
}

proptest::proptest! {
    /// One spill's entries at once give the bytes of one entry at a time:
    /// markers onto entries and onto markers, entries onto markers, and
    /// keys the page does not hold, in any order (keys distinct within the
    /// page and within the spill, as invariant 1 has them).
    #[test]
    fn arrive_all_equals_arrive_on_each(
        page_items in proptest::collection::btree_map(0u8..40, proptest::prelude::any::<bool>(), 0..20),
        moved_items in proptest::collection::btree_map(0u8..40, (proptest::prelude::any::<bool>(), 1u32..4), 0..16),
        order in proptest::prelude::any::<u64>(),
    ) {
        let c = |b: u32| Consumption {
            block: BlockId(b),
            txid: Txid::from_byte_array([b as u8; 32]),
            vin: b,
        };
        let key = |i: u8| outpoint_key(&slot(i, 0).entry.outpoint);
        let entry_bytes = |i: u8| encode(&decoded(vec![slot(i, 3 + i as usize % 5)])).unwrap()[PAGE_HEADER_LEN..].to_vec();
        let marker_bytes = |i: u8, n: u32| {
            let mut m = Vec::new();
            encode_marker(&key(i), &(0..n).map(|k| c(10 + k + i as u32)).collect::<Vec<_>>(), &mut m).unwrap();
            m
        };
        // Page: entries and markers.
        let mut page = new_page();
        for (&i, &is_marker) in &page_items {
            let bytes = if is_marker { marker_bytes(i, 1) } else { entry_bytes(i) };
            append(&mut page, &bytes).unwrap();
        }
        // Spill: a marker, or an entry unless the page holds that key as an entry.
        let mut items: Vec<Vec<u8>> = Vec::new();
        for (&i, &(is_marker, n)) in &moved_items {
            let page_entry = page_items.get(&i) == Some(&false);
            if is_marker || page_entry {
                items.push(marker_bytes(i, n));
            } else {
                items.push(entry_bytes(i));
            }
        }
        let len = items.len().max(1);
        items.rotate_left(order as usize % len);
        let moved: Vec<u8> = items.concat();
        let mut want = page.clone();
        arrive_each(&mut want, &moved).unwrap();
        let mut got = page;
        arrive_all(&mut got, &moved).unwrap();
        validate(&got).unwrap();
        proptest::prop_assert_eq!(got, want);
    }
}
