//! Headers accepted without their block live in the `headers/` flat files
//! (`store::headers`), not as index-database rows: after a restart the
//! block index is the same (ids, hashes, heights, chainwork, statuses, tip),
//! blocks whose data arrived in between keep their full records, the sync
//! goes on to regtest-a's reference state, and a damaged headers file is
//! refused at open with an error naming it.

use crate::common;

use bitcoin::Network;
use common::data;
use kakehi::chain::index::ChainIndex;
use kakehi::chain::ChainParams;
use kakehi::import::read_file;
use kakehi::node::{open_chainstate, DataDir};
use kakehi::pipeline::{Chainstate, SubmitOutcome};

fn open(dir: &std::path::Path) -> (DataDir, Chainstate) {
    let datadir = DataDir::open(dir).unwrap();
    let cs = open_chainstate(ChainParams::new(Network::Regtest), &datadir).unwrap();
    (datadir, cs)
}

/// Every entry of the index as comparable values.
fn entries(index: &ChainIndex) -> Vec<String> {
    index
        .entries()
        .map(|e| {
            format!(
                "{} {} {} {:?} {:?} {}",
                e.id.0,
                e.hash,
                e.height,
                e.status,
                e.prev.map(|p| p.0),
                e.chainwork
            )
        })
        .collect()
}

#[test]
fn headers_only_blocks_survive_a_restart_from_the_headers_files() {
    let records = read_file(
        &data("regtest-a/blocks.dat"),
        &ChainParams::new(Network::Regtest),
    )
    .unwrap();
    let blocks: Vec<_> = records.into_iter().map(|r| r.block).collect();
    let dir = common::tempdir();
    let before = {
        let (_d, mut cs) = open(dir.path());
        // Headers of the first 400 records (a stale branch among them from
        // record 238), as a P2P headers sync stores them: batches of 150,
        // each header after its parent.
        let headers: Vec<_> = blocks[..400].iter().map(|b| b.header).collect();
        for chunk in headers.chunks(150) {
            let out = cs.accept_headers(chunk).unwrap();
            assert!(out.refused.is_none(), "{:?}", out.refused);
        }
        // The first 200 bodies: their records go to the index database.
        for b in &blocks[..200] {
            let out = cs.submit_block(b).unwrap();
            assert!(matches!(out, SubmitOutcome::Accepted { .. }), "{out:?}");
        }
        // And more headers after that.
        let more: Vec<_> = blocks[400..700].iter().map(|b| b.header).collect();
        cs.accept_headers(&more).unwrap();
        assert!(
            dir.path().join("headers/hdr00000.dat").exists(),
            "headers-only blocks went to the headers files"
        );
        (entries(cs.index()), cs.index().tip().hash)
    };
    let (_d, mut cs) = open(dir.path());
    assert_eq!(entries(cs.index()), before.0, "index after a restart");
    assert_eq!(cs.index().tip().hash, before.1);
    for b in &blocks[200..] {
        cs.submit_block(b).unwrap();
    }
    cs.flush().unwrap();
    let mut dump = Vec::new();
    cs.dump_utxos(&mut dump).unwrap();
    assert!(
        dump == std::fs::read(data("regtest-a/utxos.txt")).unwrap(),
        "UTXO set differs from regtest-a's"
    );
}

#[test]
fn a_damaged_headers_file_is_refused_naming_it() {
    let records = read_file(
        &data("regtest-a/blocks.dat"),
        &ChainParams::new(Network::Regtest),
    )
    .unwrap();
    let dir = common::tempdir();
    {
        let (_d, mut cs) = open(dir.path());
        let headers: Vec<_> = records[..100].iter().map(|r| r.block.header).collect();
        cs.accept_headers(&headers).unwrap();
    }
    let path = dir.path().join("headers/hdr00000.dat");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[100] ^= 0x01;
    std::fs::write(&path, bytes).unwrap();
    let datadir = DataDir::open(dir.path()).unwrap();
    let err = open_chainstate(ChainParams::new(Network::Regtest), &datadir)
        .err()
        .expect("a damaged headers file is refused")
        .to_string();
    assert!(err.contains("headers files"), "{err}");
}
