//! All 9 official BIP-158 test vectors (bitcoin/bips `bip-0158.mediawiki`,
//! Appendix C; testnet3 blocks), from `testnet-data/bip158/testnet-19.json`:
//! the basic filter built from each block and its prevout scripts, and the
//! filter header from the vector's previous header, must equal the
//! vector's bytes.

use std::collections::HashMap;
use std::str::FromStr;

use bitcoin::bip158::FilterHeader;
use bitcoin::consensus::deserialize;
use bitcoin::hashes::Hash;
use bitcoin::hex::{DisplayHex, FromHex};
use bitcoin::{Block, BlockHash, OutPoint, ScriptBuf};
use kakehi::filters::{
    basic_filter, basic_filter_from_map, filter_hash, filter_header, genesis_previous_header,
    FilterError,
};

struct Vector {
    height: u64,
    hash: BlockHash,
    block: Block,
    prev_scripts: Vec<Vec<u8>>,
    prev_header: FilterHeader,
    filter: Vec<u8>,
    header: FilterHeader,
    notes: String,
}

fn vectors() -> Vec<Vector> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/testnet-data/bip158/testnet-19.json"
    );
    let text = std::fs::read_to_string(path).expect("read testnet-19.json");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&text).expect("parse json");
    rows.iter()
        .filter(|r| r.as_array().is_some_and(|a| a.len() == 8))
        .map(|r| {
            let s = |i: usize| r[i].as_str().expect("string field").to_string();
            Vector {
                height: r[0].as_u64().expect("height"),
                hash: BlockHash::from_str(&s(1)).expect("hash"),
                block: deserialize(&Vec::from_hex(&s(2)).expect("block hex")).expect("block"),
                prev_scripts: r[3]
                    .as_array()
                    .expect("scripts")
                    .iter()
                    .map(|v| Vec::from_hex(v.as_str().expect("script")).expect("script hex"))
                    .collect(),
                prev_header: FilterHeader::from_str(&s(4)).expect("prev header"),
                filter: Vec::from_hex(&s(5)).expect("filter hex"),
                header: FilterHeader::from_str(&s(6)).expect("header"),
                notes: s(7),
            }
        })
        .collect()
}

#[test]
fn all_nine_vectors_filter_and_header() {
    let vectors = vectors();
    assert_eq!(vectors.len(), 9, "BIP-158 has 9 test vectors");
    for v in &vectors {
        assert_eq!(
            v.block.block_hash(),
            v.hash,
            "vector at height {}",
            v.height
        );
        let filter = basic_filter(&v.block, v.prev_scripts.iter().map(Vec::as_slice))
            .unwrap_or_else(|e| panic!("height {} ({}): {e}", v.height, v.notes));
        assert_eq!(
            filter.content.to_lower_hex_string(),
            v.filter.to_lower_hex_string(),
            "filter of height {} ({})",
            v.height,
            v.notes
        );
        assert_eq!(
            filter_header(&filter, &v.prev_header),
            v.header,
            "header of {}",
            v.height
        );
        // The header is double-SHA256(filter hash || previous header).
        let mut preimage = filter_hash(&filter).to_byte_array().to_vec();
        preimage.extend_from_slice(&v.prev_header.to_byte_array());
        assert_eq!(FilterHeader::hash(&preimage), v.header);
        if v.height == 0 {
            assert_eq!(v.prev_header, genesis_previous_header());
        }
    }
}

#[test]
fn lookup_by_outpoint_gives_the_same_filters() {
    for v in vectors() {
        let spent: Vec<OutPoint> = v
            .block
            .txdata
            .iter()
            .skip(1)
            .flat_map(|tx| tx.input.iter().map(|i| i.previous_output))
            .collect();
        let map: HashMap<OutPoint, ScriptBuf> = spent
            .iter()
            .zip(&v.prev_scripts)
            .map(|(o, s)| (*o, ScriptBuf::from_bytes(s.clone())))
            .collect();
        let filter = basic_filter_from_map(&v.block, &map).expect("filter");
        assert_eq!(filter.content, v.filter, "height {}", v.height);
        if let Some(first) = spent.first() {
            let mut missing = map.clone();
            missing.remove(first);
            match basic_filter_from_map(&v.block, &missing) {
                Err(FilterError::MissingSpentScript { outpoint }) => assert_eq!(outpoint, *first),
                other => panic!("expected MissingSpentScript, got {other:?}"),
            }
        }
    }
}

#[test]
fn wrong_number_of_spent_scripts_is_an_error() {
    let v = vectors()
        .into_iter()
        .find(|v| v.prev_scripts.len() > 1)
        .expect("a vector with inputs");
    let short = &v.prev_scripts[1..];
    match basic_filter(&v.block, short.iter().map(Vec::as_slice)) {
        Err(FilterError::SpentScriptCount { expected, got }) => {
            assert_eq!(expected, v.prev_scripts.len());
            assert_eq!(got, v.prev_scripts.len() - 1);
        }
        other => panic!("expected SpentScriptCount, got {other:?}"),
    }
}
