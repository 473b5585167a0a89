//! The archive wired into the node , on `testnet-data/regtest-a`
//! (a real regtest chain made by an independent node, bcoin 2.2.0): the
//! epochs the node seals while importing equal those built by the
//! independent feed (`tests/common/feed.rs`, from blocks.dat and chain.json
//! alone); every final spend of `spent.txt` up to the last sealed height has
//! a proof from the node that verifies and names the spender; statuses
//! against `spent.txt` / `utxos.txt`; two nodes agree; a restart (and a
//! re-drive after losing the archive directory) keeps epochs and commitment;
//! the HTTP routes over a real listener; the `proof verify` CLI function.

use crate::common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bitcoin::{Network, OutPoint};
use common::data;
use common::feed::{self, Chain};
use kakehi::archive::cli::{verify_command, ProofCliError};
use kakehi::archive::{verify_json, Anchor, Archive, OutpointStatus, VerifiedStatus};
use kakehi::chain::ChainParams;
use kakehi::http::archive as archive_http;
use kakehi::http::AppState;
use kakehi::import::import_files;
use kakehi::node::{open_chainstate, DataDir};
use kakehi::pipeline::Chainstate;
use parking_lot::Mutex;

/// A node whose chain state can be shared with the HTTP server and reopened.
struct Node {
    dir: tempfile::TempDir,
    datadir: Option<DataDir>,
    chain: Option<Arc<Mutex<Chainstate>>>,
}

impl Node {
    fn empty() -> Node {
        let dir = common::tempdir();
        let mut n = Node {
            dir,
            datadir: None,
            chain: None,
        };
        n.reopen();
        n
    }

    fn imported() -> Node {
        let n = Node::empty();
        let summary = import_files(
            n.chain(),
            &[data("regtest-a/blocks.dat")],
            &std::sync::atomic::AtomicBool::new(false),
            false,
        )
        .expect("import");
        assert_eq!(summary.blocks_read, 1529);
        assert!(summary.rejected.is_empty(), "{:?}", summary.rejected);
        n
    }

    fn chain(&self) -> &Arc<Mutex<Chainstate>> {
        self.chain.as_ref().expect("open")
    }

    /// Drops the chain state and the datadir lock, then opens both again.
    fn reopen(&mut self) {
        self.chain = None;
        self.datadir = None;
        let datadir = DataDir::open(self.dir.path()).expect("datadir");
        let mut cs = open_chainstate(ChainParams::new(Network::Regtest), &datadir).expect("open");
        // The open re-drives any seal a crash (or a lost directory) left
        // undone, in the background: wait for it.
        cs.finish_seals().expect("seal");
        self.chain = Some(Arc::new(Mutex::new(cs)));
        self.datadir = Some(datadir);
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

fn node() -> &'static Node {
    static NODE: OnceLock<Node> = OnceLock::new();
    NODE.get_or_init(Node::imported)
}

fn chain() -> &'static Chain {
    static CHAIN: OnceLock<Chain> = OnceLock::new();
    CHAIN.get_or_init(Chain::load)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The epochs the independent feed gives, sealed in a fresh directory.
fn reference_archive() -> (tempfile::TempDir, Archive) {
    let dir = common::tempdir();
    let mut a = Archive::open(dir.path(), feed::EPOCH_LENGTH).expect("open");
    let c = chain();
    for n in 0..c.complete_epochs() {
        a.seal(n, c.epoch_leaves(n)).expect("seal");
    }
    (dir, a)
}

#[test]
fn sealed_epochs_and_commitment_equal_the_independent_feed() {
    let (_dir, reference) = reference_archive();
    let cs = node().chain().lock().snapshot();
    let tip = cs.index().tip().height;
    assert_eq!(tip, 1500);
    let a = cs.archive();
    assert_eq!(
        a.epoch_length(),
        ChainParams::new(Network::Regtest).archive_epoch_length
    );
    // Exactly the epochs whose last height is final (tip − 100).
    assert_eq!(a.epochs().len() as u32, chain().complete_epochs());
    assert!(a.next_sealable(tip - 100).is_none());
    assert_eq!(a.epochs(), reference.epochs());
    assert_eq!(a.commitment(), reference.commitment());
    assert_ne!(a.commitment(), [0u8; 32]);
    // The files are byte-identical too (same leaves → same tree and filter).
    for n in 0..a.next_epoch() {
        a.verify_epoch_file(n).expect("epoch file checks");
        assert_eq!(
            std::fs::read(a.epoch_path(n)).unwrap(),
            std::fs::read(reference.epoch_path(n)).unwrap(),
            "epoch file {n}"
        );
    }
}

#[test]
fn every_final_spend_has_a_node_proof_that_verifies_and_names_the_spender() {
    let cs = node().chain().lock().snapshot();
    let a = cs.archive();
    let sealed_through = a.epochs().last().expect("sealed").last_height;
    let anchor = Anchor::Commitment(a.commitment());
    let spends: Vec<_> = feed::spent_lines()
        .into_iter()
        .filter(|(_, _, _, h)| *h <= sealed_through)
        .collect();
    assert!(spends.len() > 50_000, "{} sealed spends", spends.len());
    let (mut prove_time, mut verify_time) = (Duration::ZERO, Duration::ZERO);
    for batch in spends.chunks(1000) {
        let ops: Vec<OutPoint> = batch.iter().map(|s| s.0).collect();
        let t = Instant::now();
        let proof = cs.prove_outpoints(&ops).expect("prove");
        prove_time += t.elapsed();
        let json = proof.to_json();
        let t = Instant::now();
        let v = verify_json(&json, anchor).expect("node proof verifies");
        verify_time += t.elapsed();
        for (op, spender, vin, height) in batch {
            match v.status(op) {
                Some(VerifiedStatus::Spent {
                    epoch,
                    leaf,
                    inclusion,
                }) => {
                    assert_eq!(leaf.spend.txid, *spender, "{op}");
                    assert_eq!(leaf.spend.vin, *vin, "{op}");
                    assert_eq!(leaf.spend.height, *height, "{op}");
                    assert_eq!(*epoch, height / feed::EPOCH_LENGTH, "{op}");
                    let inc = inclusion.as_ref().expect("txoutproof attached");
                    assert_eq!(inc.block_hash, leaf.spend.block_hash);
                    let block = &chain().blocks[*height as usize - 1];
                    assert_eq!(inc.block_hash, block.block_hash());
                    assert_eq!(inc.merkle_root, block.header.merkle_root);
                }
                other => panic!("{op}: {other:?}"),
            }
        }
    }
    eprintln!(
        "{} final spends in batches of 1,000: prove (with txoutproofs, self-checked) {:?}, verify_json {:?}",
        spends.len(),
        prove_time,
        verify_time
    );
    // A proof for one outpoint says nothing about another.
    let (a0, b0) = (spends[0].0, spends[1].0);
    let v = verify_json(&cs.prove_outpoints(&[a0]).unwrap().to_json(), anchor).unwrap();
    assert!(v.status(&b0).is_none());
}

#[test]
fn statuses_follow_spent_and_utxos_files() {
    let cs = node().chain().lock().snapshot();
    let a = cs.archive();
    let sealed_through = a.epochs().last().expect("sealed").last_height;
    let tip = cs.index().tip().height;
    let hash_at = |h: u32| chain().blocks[h as usize - 1].block_hash();
    let mut seen = HashMap::<&str, usize>::new();
    for (i, (op, _, _, h)) in feed::spent_lines().iter().enumerate() {
        let status = cs.outpoint_status(op).expect("status");
        let want = if *h <= sealed_through {
            // Sealed spends: all cheap (table miss or hit + one epoch search).
            if i % 5 != 0 {
                continue;
            }
            *seen.entry("archived").or_default() += 1;
            OutpointStatus::Archived {
                epoch: h / feed::EPOCH_LENGTH,
            }
        } else {
            // Above the sealed epochs: final ones (≤ tip − 100) may be purged
            // from the table and are found by scanning spent records.
            *seen
                .entry(if *h <= tip - 100 { "final" } else { "recent" })
                .or_default() += 1;
            OutpointStatus::SpentNotSealed {
                block: hash_at(*h),
                height: *h,
            }
        };
        assert_eq!(status, want, "{op} spent at {h}");
    }
    assert!(seen.get("final").copied().unwrap_or(0) > 100, "{seen:?}");
    assert!(seen.get("recent").copied().unwrap_or(0) > 100, "{seen:?}");
    let utxos = feed::utxo_lines();
    for (op, _) in utxos.iter().step_by(7) {
        assert_eq!(
            cs.outpoint_status(op).unwrap(),
            OutpointStatus::Unspent,
            "{op}"
        );
    }
    // Unspent outputs have absence proofs covering every sealed epoch.
    let ops: Vec<OutPoint> = utxos.iter().step_by(40).map(|u| u.0).collect();
    let v = verify_json(
        &cs.prove_outpoints(&ops).unwrap().to_json(),
        Anchor::Commitment(a.commitment()),
    )
    .unwrap();
    for op in &ops {
        match v.status(op) {
            Some(VerifiedStatus::Absent { epochs }) => {
                assert_eq!(epochs.len(), a.epochs().len(), "{op}")
            }
            other => panic!("{op}: {other:?}"),
        }
    }
    // An outpoint nobody created.
    let nobody = OutPoint {
        txid: chain().txids[0][0],
        vout: 77,
    };
    assert_eq!(
        cs.outpoint_status(&nobody).unwrap(),
        OutpointStatus::Unknown
    );
}

#[test]
fn two_nodes_agree_and_a_restart_or_lost_archive_changes_nothing() {
    let mut b = Node::imported();
    let (epochs, commitment) = {
        let a = node().chain().lock().snapshot();
        (a.archive().epochs().to_vec(), a.archive().commitment())
    };
    let snapshot = |n: &Node| {
        let cs = n.chain().lock().snapshot();
        (cs.archive().epochs().to_vec(), cs.archive().commitment())
    };
    assert_eq!(snapshot(&b), (epochs.clone(), commitment));
    b.reopen();
    assert_eq!(snapshot(&b), (epochs.clone(), commitment));
    // A crash that lost sealing work: the open re-drives it from the blocks.
    let dir = b.path().join("archive");
    b.chain = None;
    b.datadir = None;
    let last = epochs.len() as u32 - 1;
    // Drop the last epoch from the header list (as if its seal never
    // committed) by rebuilding the directory without it.
    std::fs::remove_dir_all(&dir).unwrap();
    {
        let c = chain();
        let mut partial = Archive::open(&dir, feed::EPOCH_LENGTH).unwrap();
        for n in 0..last {
            partial.seal(n, c.epoch_leaves(n)).unwrap();
        }
        assert_eq!(partial.next_epoch(), last);
    }
    b.reopen();
    assert_eq!(snapshot(&b), (epochs.clone(), commitment));
    // And with the whole directory gone.
    b.chain = None;
    b.datadir = None;
    std::fs::remove_dir_all(&dir).unwrap();
    b.reopen();
    assert_eq!(snapshot(&b), (epochs, commitment));
}

/// One HTTP/1.1 request over a fresh connection: (status, headers, body).
async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, HashMap<String, String>, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
        .collect();
    (status, headers, body.to_string())
}

async fn serve(chain: Arc<Mutex<Chainstate>>) -> std::net::SocketAddr {
    let app = axum::Router::new()
        .merge(archive_http::routes())
        .with_state(AppState {
            snapshots: chain.lock().snapshots(),
            p2p: None,
            mempool: None,
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("{e}: {s}"))
}

#[test]
fn http_routes_serve_epochs_statuses_and_proofs_that_verify() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (commitment, epochs) = {
            let cs = node().chain().lock().snapshot();
            (
                hex(&cs.archive().commitment()),
                cs.archive().epochs().to_vec(),
            )
        };
        let addr = serve(node().chain().clone()).await;

        let (st, _, body) = http(addr, "GET", "/archive/commitment", "").await;
        assert_eq!(st, 200);
        let c = json(&body);
        assert_eq!(c["commitment"], commitment.as_str());
        assert_eq!(c["count"], epochs.len());
        assert_eq!(c["last_height"], epochs.last().unwrap().last_height);

        let (st, _, body) = http(addr, "GET", "/archive/epochs", "").await;
        assert_eq!(st, 200);
        let e = json(&body);
        assert_eq!(e["epoch_length"], feed::EPOCH_LENGTH);
        assert_eq!(e["epochs"].as_array().unwrap().len(), epochs.len());
        assert_eq!(e["epochs"][3]["root"], hex(&epochs[3].root).as_str());

        let (st, _, body) = http(addr, "GET", "/archive/epoch/2", "").await;
        assert_eq!(st, 200);
        let e2 = json(&body);
        assert_eq!(e2["root"], hex(&epochs[2].root).as_str());
        assert_eq!(e2["leaf_count"], epochs[2].leaf_count);
        assert_eq!(e2["hash"], hex(&epochs[2].hash()).as_str());
        let filter = e2["filter"].as_str().unwrap();
        let fb: Vec<u8> = (0..filter.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&filter[i..i + 2], 16).unwrap())
            .collect();
        let f = kakehi::archive::EpochFilter::from_bytes(&fb).expect("filter parses");
        // Every spend of epoch 2 (from the independent feed) is in its filter.
        for leaf in chain().epoch_leaves(2) {
            let key = kakehi::archive::filter::filter_key(&leaf.key());
            assert!(f.may_contain(key));
        }

        let (st, _, body) = http(addr, "GET", "/archive/epoch/99", "").await;
        assert_eq!(st, 404);
        assert_eq!(json(&body)["code"], 404);
        let (st, _, _) = http(addr, "GET", "/archive/epoch/x", "").await;
        assert_eq!(st, 400);

        // One final spend: status header + proof body, verified as is.
        let spends = feed::spent_lines();
        let (op, spender, vin, height) = spends
            .iter()
            .find(|s| s.3 <= epochs.last().unwrap().last_height)
            .copied()
            .unwrap();
        let path = format!("/proof/outpoint/{}/{}", op.txid, op.vout);
        let (st, headers, body) = http(addr, "GET", &path, "").await;
        assert_eq!(st, 200, "{body}");
        let status = json(&headers[archive_http::STATUS_HEADER]);
        assert_eq!(status["status"], "archived");
        assert_eq!(status["epoch"], height / feed::EPOCH_LENGTH);
        let anchor = Anchor::commitment_from_hex(&commitment).unwrap();
        let v = verify_json(&body, anchor).expect("HTTP proof verifies as is");
        match v.status(&op) {
            Some(VerifiedStatus::Spent { leaf, .. }) => {
                assert_eq!((leaf.spend.txid, leaf.spend.vin), (spender, vin))
            }
            other => panic!("{other:?}"),
        }
        let (st, _, body) = http(
            addr,
            "GET",
            &format!("/archive/status/{}/{}", op.txid, op.vout),
            "",
        )
        .await;
        assert_eq!(st, 200);
        assert_eq!(json(&body)["status"]["status"], "archived");

        // The CLI function reads the body as served.
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &body_of(addr, &path).await).unwrap();
        let report = verify_command(None, Some(&commitment), file.path()).expect("verifies");
        assert!(
            report.contains(&format!("{op} SPENT at height {height}"))
                && report.contains(&format!("by {spender}:{vin}")),
            "{report}"
        );
        let wrong_root = hex(&epochs[0].root);
        assert!(matches!(
            verify_command(Some(&wrong_root), None, file.path()),
            Err(ProofCliError::Rejected { .. })
        ));
        assert!(matches!(
            verify_command(None, None, file.path()),
            Err(ProofCliError::Usage)
        ));
        let mut tampered = std::fs::read_to_string(file.path()).unwrap();
        let at = tampered.find(&spender.to_string()).unwrap();
        let c = if &tampered[at..at + 1] == "0" {
            "1"
        } else {
            "0"
        };
        tampered.replace_range(at..at + 1, c);
        std::fs::write(file.path(), tampered).unwrap();
        assert!(matches!(
            verify_command(None, Some(&commitment), file.path()),
            Err(ProofCliError::Rejected { .. })
        ));

        // An unspent output: status header says so, the proof shows absence.
        let (uop, _) = feed::utxo_lines()[0];
        let (st, headers, body) = http(
            addr,
            "GET",
            &format!("/proof/outpoint/{}/{}", uop.txid, uop.vout),
            "",
        )
        .await;
        assert_eq!(st, 200);
        assert_eq!(
            json(&headers[archive_http::STATUS_HEADER])["status"],
            "unspent"
        );
        assert!(matches!(
            verify_json(&body, anchor).unwrap().status(&uop),
            Some(VerifiedStatus::Absent { .. })
        ));

        // Batch.
        let req = serde_json::json!({ "outpoints": [op.to_string(), uop.to_string()] });
        let (st, _, body) = http(addr, "POST", "/proof/outpoints", &req.to_string()).await;
        assert_eq!(st, 200, "{body}");
        let v = verify_json(&body, anchor).unwrap();
        assert_eq!(v.outpoints.len(), 2);
        let many: Vec<String> = spends.iter().take(1001).map(|s| s.0.to_string()).collect();
        let req = serde_json::json!({ "outpoints": many });
        let (st, _, body) = http(addr, "POST", "/proof/outpoints", &req.to_string()).await;
        assert_eq!(st, 413, "{body}");
        assert_eq!(json(&body)["code"], 413);
        for bad in [
            r#"{"outpoints": []}"#.to_string(),
            r#"{"outpoints": ["nope"]}"#.to_string(),
            "not json".to_string(),
            serde_json::json!({ "outpoints": [op.to_string(), op.to_string()] }).to_string(),
        ] {
            let (st, _, body) = http(addr, "POST", "/proof/outpoints", &bad).await;
            assert_eq!(st, 400, "{bad} → {body}");
            assert_eq!(json(&body)["code"], 400);
        }
        let (st, _, _) = http(addr, "GET", "/proof/outpoint/abcd/0", "").await;
        assert_eq!(st, 400);

        // A node with nothing sealed cannot prove: 503.
        let empty = Node::empty();
        let addr2 = serve(empty.chain().clone()).await;
        let (st, _, body) = http(addr2, "GET", &path, "").await;
        assert_eq!(st, 503, "{body}");
        assert_eq!(json(&body)["code"], 503);
        let (st, _, body) = http(addr2, "GET", "/archive/commitment", "").await;
        assert_eq!(st, 200);
        assert_eq!(json(&body)["commitment"], hex(&[0u8; 32]).as_str());
    });
}

async fn body_of(addr: std::net::SocketAddr, path: &str) -> String {
    http(addr, "GET", path, "").await.2
}
