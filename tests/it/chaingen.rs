//! `kakehi-chaingen`'s `ci` profile (about 5,000 blocks, 200,000 UTXOs,
//! rival branches, invalid blocks on the tip), generated here and judged
//! three ways:
//!
//! - Bitcoin Core's own engine (`pbk`, tests/python/chaingen_judge.py)
//!   accepts every block, reaches the manifest's tip through the same
//!   reorganisations, derives the manifest's UTXO set from its own active
//!   chain, rejects every invalid case with its `core_reject_reason`, and
//!   accepts the control block;
//! - kakehi imports the chain and ends with the manifest's tip, UTXO dump
//!   (SHA-256 of `dump-utxos`' text) and filter headers, and gives Core's
//!   verdict on the invalid cases it can judge;
//! - the raw blocks hold what the generator promises (shapes, kinds, near-full
//!   blocks, spend ages), read with rust-bitcoin alone.
//!
//! Plus determinism (same seed, same bytes, whatever the thread count) and
//! the generator's bad flags. The chain is generated once per run into
//! `target/tmp/chaingen-ci-seed1` (left there for inspection).

use crate::common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use bitcoin::hashes::{sha256, Hash};
use bitcoin::{Block, Network, OutPoint};
use common::{python, TestNode};
use kakehi::import::read_file;
use kakehi::pipeline::SubmitOutcome;

/// The invalid cases only script evaluation can reject: Core names each
/// with `block-script-verify-flag-failed (…)` (`core_judges_the_ci_chain`),
/// and kakehi, which verifies scripts with Core's interpreter, must give
/// the same reason (`judge_invalid_cases`).
const SCRIPT_CASES: &[&str] = &[
    "05-bad-ecdsa-signature.blk",
    "06-bad-schnorr-signature.blk",
    "07-wrong-witness-program.blk",
    "08-failed-cltv.blk",
    "09-failed-csv.blk",
];

fn chaingen(args: &[&str], out: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kakehi-chaingen"))
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run kakehi-chaingen")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The `ci` chain of seed 1, generated once per test run.
fn ci_chain() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chaingen-ci-seed1");
        let _ = std::fs::remove_dir_all(&dir);
        let out = chaingen(&["--profile", "ci", "--seed", "1", "--write-utxos"], &dir);
        assert!(
            out.status.success(),
            "kakehi-chaingen: {}",
            text(&out.stderr)
        );
        eprintln!("{}", text(&out.stderr).lines().last().unwrap_or_default());
        dir
    })
}

fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).expect("manifest.json"))
        .expect("parse manifest.json")
}

fn cases(dir: &Path) -> Vec<serde_json::Value> {
    serde_json::from_slice(&std::fs::read(dir.join("invalid/cases.json")).expect("cases.json"))
        .expect("parse cases.json")
}

fn blk_files(dir: &Path, m: &serde_json::Value) -> Vec<PathBuf> {
    let files = m["files"].as_array().expect("files");
    files
        .iter()
        .map(|f| dir.join(f.as_str().expect("name")))
        .collect()
}

#[test]
fn core_judges_the_ci_chain() {
    let dir = ci_chain();
    let out = Command::new(python::venv_python())
        .arg(python::script("chaingen_judge.py"))
        .arg(dir)
        .output()
        .expect("run chaingen_judge.py");
    assert!(
        out.status.success(),
        "Core's engine disagrees with the generator:\n{}\n{}",
        text(&out.stderr),
        text(&out.stdout)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("report");
    let m = manifest(dir);
    assert_eq!(report["tip"], m["tip_hash"]);
    assert_eq!(report["disconnected"], m["stale_blocks"]);
    // Every case was submitted and named by Core, the script cases too.
    let verdicts = report["cases"].as_object().expect("cases");
    assert_eq!(verdicts.len(), 9);
    for name in SCRIPT_CASES {
        let why = verdicts[*name].as_str().unwrap_or_default();
        assert!(
            why.starts_with("block-script-verify-flag-failed"),
            "{name}: {why}"
        );
    }
}

#[test]
fn kakehi_imports_the_ci_chain_to_the_manifests_state() {
    let dir = ci_chain();
    let m = manifest(dir);
    let node = TestNode::new(Network::Regtest);
    let summary = node.import(&blk_files(dir, &m));
    assert!(
        summary.rejected.is_empty(),
        "{:?}",
        summary.rejected.first()
    );
    assert_eq!(
        summary.reorgs as usize,
        m["reorgs"].as_array().expect("reorgs").len()
    );
    assert_eq!(
        summary.tip_hash.map(|h| h.to_string()),
        m["tip_hash"].as_str().map(String::from)
    );
    assert_eq!(
        u64::from(summary.tip_height),
        m["tip_height"].as_u64().expect("height")
    );

    let mut dump = Vec::new();
    node.chain.lock().dump_utxos(&mut dump).expect("dump-utxos");
    if sha256::Hash::hash(&dump).to_string() != m["utxos_sha256"].as_str().expect("sha") {
        let want = std::fs::read_to_string(dir.join("utxos.txt")).expect("utxos.txt");
        let got = text(&dump);
        let first = got.lines().zip(want.lines()).find(|(g, w)| g != w);
        panic!(
            "kakehi's UTXO dump ({} lines) differs from the generator's ({} lines); first difference: {first:?}",
            got.lines().count(),
            want.lines().count()
        );
    }
    let snapshot = node.chain.lock().snapshot();
    for fh in m["filter_headers"].as_array().expect("filter headers") {
        let height = fh["height"].as_u64().expect("height") as u32;
        let entry = snapshot.index().active_at(height).expect("active block");
        let (_, header) = snapshot.filter(entry.id).expect("read").expect("filter");
        assert_eq!(
            header.to_string(),
            fh["filter_header"].as_str().expect("hex"),
            "height {height}"
        );
    }
    judge_invalid_cases(&node, dir, &m);
}

/// kakehi's verdict on every case, the script ones included: Core's
/// reason, tip and UTXO set unmoved; then the control block is accepted.
fn judge_invalid_cases(node: &TestNode, dir: &Path, m: &serde_json::Value) {
    let params = node.chain.lock().params().clone();
    let submit = |file: &str| {
        let records = read_file(&dir.join("invalid").join(file), &params).expect("case file");
        node.chain
            .lock()
            .submit_block(&records[0].block)
            .expect("storage")
    };
    let before = node.chain.lock().snapshot().utxo_stats();
    for case in cases(dir) {
        let file = case["file"].as_str().expect("file");
        let want = case["core_reject_reason"].as_str().expect("reason");
        match submit(file) {
            SubmitOutcome::Rejected { reason, .. } => assert_eq!(reason, want, "{file}"),
            other => panic!("{file}: expected {want}, got {other:?}"),
        }
        let cs = node.chain.lock();
        assert_eq!(
            cs.index().tip().hash.to_string(),
            m["tip_hash"].as_str().expect("tip")
        );
        assert_eq!(
            cs.snapshot().utxo_stats(),
            before,
            "{file} changed the UTXO set"
        );
    }
    let height = m["tip_height"].as_u64().expect("height") as u32 + 1;
    match submit("control.blk") {
        SubmitOutcome::Accepted { height: h, tip } => {
            assert_eq!(
                (h, tip.to_string()),
                (
                    height,
                    m["invalid"]["control_hash"].as_str().expect("hash").into()
                )
            )
        }
        other => panic!("control.blk: {other:?}"),
    }
}

/// What the raw blocks of the best chain hold, counted with rust-bitcoin.
#[derive(Default)]
struct Shapes {
    full_blocks: u64,
    consolidations: u64,
    payouts: u64,
    spends: HashMap<&'static str, u64>,
    op_returns: u64,
    bare_multisig: u64,
    ages: Vec<u32>,
}

fn spend_kind(txin: &bitcoin::TxIn) -> &'static str {
    use bitcoin::opcodes::all::{OP_CLTV, OP_CSV};
    use bitcoin::script::Instruction;
    let w: Vec<&[u8]> = txin.witness.iter().collect();
    let last_op = |op| {
        w.last().is_some_and(|s| {
            bitcoin::Script::from_bytes(s)
                .instructions()
                .any(|i| i == Ok(Instruction::Op(op)))
        })
    };
    match (txin.script_sig.len(), w.len()) {
        (0, 1) if w[0].len() == 64 => "p2tr-key-path",
        (0, 2) if w[1].len() == 33 => "p2wpkh",
        (23, 2) => "p2sh-p2wpkh",
        (0, 4) => "p2wsh-2of3",
        (0, 2) if last_op(OP_CLTV) => "p2wsh-cltv",
        (0, 2) if last_op(OP_CSV) => "p2wsh-csv",
        (n, 0) if n > 100 => "p2pkh",
        (n, 0) if n > 70 => "bare-multisig",
        _ => "other",
    }
}

fn shapes(dir: &Path, m: &serde_json::Value) -> Shapes {
    let params = kakehi::chain::ChainParams::new(Network::Regtest);
    let mut blocks: HashMap<bitcoin::BlockHash, Block> = HashMap::new();
    for file in blk_files(dir, m) {
        for rec in read_file(&file, &params).expect("blk file") {
            blocks.insert(rec.block.block_hash(), rec.block);
        }
    }
    // The best chain, walked back from the manifest's tip.
    let mut chain = Vec::new();
    let mut at: bitcoin::BlockHash = m["tip_hash"].as_str().expect("tip").parse().expect("hash");
    while let Some(b) = blocks.remove(&at) {
        at = b.header.prev_blockhash;
        chain.push(b);
    }
    chain.reverse();
    let mut born: HashMap<OutPoint, u32> = HashMap::new();
    let mut s = Shapes::default();
    for (i, block) in chain.iter().enumerate() {
        let height = i as u32 + 1;
        // BIP-34: the coinbase's scriptSig starts with the height as Core
        // pushes it (`CScript() << height`: OP_1..OP_16, else a number).
        let bip34 = bitcoin::script::Builder::new()
            .push_int(i64::from(height))
            .into_script();
        assert!(block.txdata[0].input[0]
            .script_sig
            .as_bytes()
            .starts_with(bip34.as_bytes()));
        s.full_blocks += u64::from(block.weight().to_wu() >= 3_900_000);
        for tx in &block.txdata {
            let txid = tx.compute_txid();
            s.consolidations += u64::from(tx.input.len() >= 50);
            s.payouts += u64::from(tx.output.len() >= 100);
            for txin in tx.input.iter().filter(|_| !tx.is_coinbase()) {
                *s.spends.entry(spend_kind(txin)).or_default() += 1;
                s.ages.push(
                    height
                        - born
                            .remove(&txin.previous_output)
                            .expect("spent output exists"),
                );
            }
            for (vout, out) in tx.output.iter().enumerate() {
                s.op_returns += u64::from(out.script_pubkey.is_op_return() && !tx.is_coinbase());
                s.bare_multisig += u64::from(out.script_pubkey.is_multisig());
                born.insert(OutPoint::new(txid, vout as u32), height);
            }
        }
    }
    assert_eq!(
        chain.len() as u64,
        m["tip_height"].as_u64().expect("height")
    );
    s.ages.sort_unstable();
    s
}

#[test]
fn the_ci_chain_holds_what_the_generator_promises() {
    let dir = ci_chain();
    let m = manifest(dir);
    assert_eq!(m["tip_height"], 5_000);
    let utxos = m["utxo_count"].as_u64().expect("count");
    assert!(
        (180_000..=220_000).contains(&utxos),
        "{utxos} live UTXOs, about 200,000 promised"
    );
    let reorgs = m["reorgs"].as_array().expect("reorgs");
    assert!(reorgs.len() >= 3, "{} reorgs", reorgs.len());
    assert!(reorgs
        .iter()
        .all(|r| (1..=6).contains(&r["depth"].as_u64().unwrap_or(0))));
    let s = shapes(dir, &m);
    assert!(s.full_blocks >= 1, "a block near the weight limit");
    assert!(
        s.consolidations >= 10 && s.payouts >= 10,
        "{} / {}",
        s.consolidations,
        s.payouts
    );
    for kind in [
        "p2tr-key-path",
        "p2wpkh",
        "p2sh-p2wpkh",
        "p2wsh-2of3",
        "p2wsh-cltv",
        "p2wsh-csv",
        "p2pkh",
        "bare-multisig",
    ] {
        assert!(
            s.spends.get(kind).copied().unwrap_or(0) >= 100,
            "{kind}: {:?}",
            s.spends
        );
    }
    assert_eq!(s.spends.get("other"), None, "{:?}", s.spends);
    assert!(s.op_returns >= 100 && s.bare_multisig >= 100);
    // Heavy-tailed spend ages: most within 100 blocks, a tail past 1,000.
    let within_100 = s.ages.partition_point(|a| *a <= 100) as f64 / s.ages.len() as f64;
    assert!(within_100 > 0.6, "{within_100}");
    assert!(s.ages[s.ages.len() * 995 / 1000] >= 1_000);
    assert_eq!(
        s.ages.len() as u64,
        m["stats"]["inputs"].as_u64().expect("inputs")
    );
}

/// Every file under `dir`, relative path → bytes.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((
                    p.strip_prefix(dir).expect("inside").to_path_buf(),
                    std::fs::read(&p).expect("read"),
                ));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn same_seed_same_bytes_whatever_the_threads() {
    let tmp = common::tempdir();
    let small = [
        "--profile",
        "ci",
        "--blocks",
        "600",
        "--txs-per-block",
        "12",
        "--live-utxos",
        "6000",
    ];
    let run = |seed: &str, threads: &str, name: &str| {
        let out = tmp.path().join(name);
        let mut args = small.to_vec();
        args.extend(["--seed", seed, "--threads", threads]);
        let o = chaingen(&args, &out);
        assert!(o.status.success(), "{}", text(&o.stderr));
        tree(&out)
    };
    let a = run("7", "1", "a");
    let b = run("7", "3", "b");
    let c = run("8", "2", "c");
    assert!(a.len() >= 12, "blk, manifest, 9 cases, control, cases.json");
    assert!(a == b, "same seed, different bytes");
    let blk = |t: &[(PathBuf, Vec<u8>)]| {
        t.iter()
            .find(|(p, _)| p.ends_with("blk00000.dat"))
            .map(|f| f.1.clone())
    };
    assert_ne!(blk(&a), blk(&c), "another seed, the same chain");
}

/// `--help` describes the generator, not the node (clap's bare `about`
/// would take the crate's description from Cargo.toml).
#[test]
fn help_describes_the_generator() {
    let o = Command::new(env!("CARGO_BIN_EXE_kakehi-chaingen"))
        .arg("--help")
        .output()
        .expect("run kakehi-chaingen --help");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let help = text(&o.stdout);
    let first = help.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("Writes a valid regtest chain"),
        "first line of --help: {first:?}"
    );
    assert!(!help.contains(env!("CARGO_PKG_DESCRIPTION")), "{help}");
}

#[test]
fn bad_flags_are_refused_with_clear_errors() {
    let tmp = common::tempdir();
    let out = tmp.path().join("out");
    let refused = |args: &[&str], code: i32, says: &str| {
        let o = chaingen(args, &out);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains(says),
            "{args:?}: {}",
            text(&o.stderr)
        );
        assert!(!out.exists(), "{args:?} left {}", out.display());
    };
    refused(
        &["--profile", "ci", "--seed", "1", "--blocks", "10"],
        2,
        "10 is not in 400..=500000",
    );
    refused(
        &["--profile", "tiny", "--seed", "1"],
        2,
        "invalid value 'tiny'",
    );
    refused(&["--profile", "ci"], 2, "--seed <SEED>");
    refused(&["--profile", "ci", "--seed", "x"], 2, "invalid digit");
    refused(
        &["--profile", "ci", "--seed", "1", "--threads", "0"],
        2,
        "0 is not in 1..=256",
    );
    refused(
        &[
            "--profile",
            "ci",
            "--seed",
            "1",
            "--blocks",
            "400",
            "--txs-per-block",
            "1",
            "--live-utxos",
            "100000",
        ],
        2,
        "--live-utxos 100000 cannot be reached with 400 blocks of 1 transactions",
    );
    // A directory with something in it is left as it was.
    std::fs::create_dir(&out).expect("mkdir");
    std::fs::write(out.join("keep.txt"), b"mine").expect("write");
    let o = chaingen(&["--profile", "ci", "--seed", "1"], &out);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("is not empty"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(
        tree(&out),
        vec![(PathBuf::from("keep.txt"), b"mine".to_vec())]
    );
    // A file where the directory should be.
    let file = tmp.path().join("file");
    std::fs::write(&file, b"x").expect("write");
    let o = chaingen(&["--profile", "ci", "--seed", "1"], &file);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains(&file.display().to_string()),
        "{}",
        text(&o.stderr)
    );
}
