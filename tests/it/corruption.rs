//! Corruption at rest, as an operator's disk does it: every file of a
//! datadir that imported regtest-a (1,529 blocks, made by bcoin) gets 8
//! bytes flipped in its middle, or is truncated to half its length, and
//! every store's directory but the blocks is removed in turn. Then
//! the node opens the datadir and answers every filter, 25 spends, 25
//! proofs, 25 outpoint statuses and the whole UTXO dump, each checked
//! against bcoin's own records (`filters.json`, `spent.txt`, `utxos.txt`).
//!
//! A case passes when the node refuses the datadir at open, or refuses a
//! read with an error, or answers exactly what bcoin says, and in every
//! case leaves the block files as they were (they are what
//! `kakehi reindex-chainstate` rebuilds the rest from). It fails when it
//! panics, serves a wrong answer (a light client would silently miss its
//! payments) or changes a block file.
//!
//! sled, which holds the index database, panics on some damaged files while
//! it recovers them instead of returning an error. 8 flipped bytes rarely
//! reach that code (sled's CRC-32s catch them), so a last case damages
//! sled's page-table snapshot past its checksum and checks that the
//! `kakehi` binary refuses the datadir cleanly: a non-zero exit, the error
//! naming the database and `kakehi reindex-chainstate`, no panic printed.

use crate::common;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use bitcoin::{Network, OutPoint, Txid};
use kakehi::archive::{Anchor, OutpointStatus, VerifiedStatus};
use kakehi::chain::ChainParams;
use kakehi::node::{open_chainstate, DataDir};
use kakehi::pipeline::Chainstate;

/// Outpoints of each kind the checks ask about.
const SAMPLE: usize = 25;

/// bcoin's records of regtest-a.
struct Truth {
    /// (height, filter hex, filter header hex) of the best chain.
    filters: Vec<(u32, String, String)>,
    /// `utxos.txt` as is.
    utxos: String,
    /// A sample of the outputs spent on the best chain: (outpoint,
    /// spending txid, vin).
    spent: Vec<(OutPoint, Txid, u32)>,
    /// Every output spent on the best chain, by spending height.
    spent_at: BTreeMap<u32, Vec<(OutPoint, Txid, u32)>>,
    /// Unspent outputs.
    unspent: Vec<OutPoint>,
    /// The best chain's tip hash (`chain.json`).
    tip: String,
    /// The archive commitment of the undamaged datadir, which proofs from
    /// a damaged one must verify against.
    commitment: [u8; 32],
}

fn truth() -> Truth {
    let filters = common::json("regtest-a/filters.json")
        .as_array()
        .expect("filters.json is a list")
        .iter()
        .map(|f| {
            (
                f["height"].as_u64().expect("height") as u32,
                f["basic_filter"].as_str().expect("filter").to_owned(),
                f["filter_header"].as_str().expect("header").to_owned(),
            )
        })
        .collect();
    let utxos = std::fs::read_to_string(common::data("regtest-a/utxos.txt")).expect("utxos.txt");
    let spent_txt =
        std::fs::read_to_string(common::data("regtest-a/spent.txt")).expect("spent.txt");
    let mut spent_at: BTreeMap<u32, Vec<(OutPoint, Txid, u32)>> = BTreeMap::new();
    let mut all = Vec::new();
    for line in spent_txt.lines() {
        let mut f = line.split_whitespace();
        let outpoint = OutPoint::from_str(f.next().expect("outpoint")).expect("outpoint");
        let (txid, vin) = f
            .next()
            .expect("spender")
            .split_once(':')
            .expect("txid:vin");
        let height: u32 = f.next().expect("height").parse().expect("height");
        let row = (
            outpoint,
            Txid::from_str(txid).expect("txid"),
            vin.parse().expect("vin"),
        );
        spent_at.entry(height).or_default().push(row);
        all.push(row);
    }
    let step = all.len() / SAMPLE;
    let spent = (0..SAMPLE).map(|i| all[i * step]).collect();
    let ulines: Vec<&str> = utxos.lines().collect();
    let ustep = ulines.len() / SAMPLE;
    let unspent = (0..SAMPLE)
        .map(|i| {
            let op = ulines[i * ustep]
                .split_whitespace()
                .next()
                .expect("outpoint");
            OutPoint::from_str(op).expect("outpoint")
        })
        .collect();
    let tip = common::json("regtest-a/chain.json")["tip_hash"]
        .as_str()
        .expect("tip_hash")
        .to_owned();
    Truth {
        filters,
        utxos,
        spent,
        spent_at,
        unspent,
        tip,
        commitment: [0; 32],
    }
}

/// What a corrupted datadir did.
#[derive(Debug)]
enum Outcome {
    /// Open refused it, with this message.
    Refused(String),
    /// It opened; a read failed with this message (nothing wrong served).
    ReadError(String),
    /// Every answer equals bcoin's.
    AllCorrect,
}

/// Opens `datadir` and checks every answer against `truth`.
///
/// # Panics
/// On a wrong answer (the test fails), or a panic inside the node.
fn check(datadir: &Path, truth: &Truth) -> Outcome {
    let params = ChainParams::new(Network::Regtest);
    let dd = match DataDir::open(datadir) {
        Ok(d) => d,
        Err(e) => return Outcome::Refused(e.to_string()),
    };
    let mut chain = match open_chainstate(params, &dd) {
        Ok(c) => c,
        Err(e) => return Outcome::Refused(format!("{e:#}")),
    };
    match answers(&mut chain, truth) {
        Ok(()) => Outcome::AllCorrect,
        Err(e) => Outcome::ReadError(e),
    }
}

/// Every answer; `Err` for the first read the node refused.
fn answers(chain: &mut Chainstate, truth: &Truth) -> Result<(), String> {
    let snap = chain.snapshots().load();
    let index = snap.index();
    let tip = index.tip();
    assert_eq!(
        (tip.height, tip.hash.to_string()),
        (1500, truth.tip.clone()),
        "the datadir opened at another tip"
    );
    for (height, filter, header) in &truth.filters {
        let id = index.active_at(*height).expect("active height").id;
        let (f, h) = snap
            .filter(id)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no filter at height {height}"))?;
        assert_eq!(
            &bitcoin::hex::DisplayHex::to_lower_hex_string(&f),
            filter,
            "filter at height {height}"
        );
        assert_eq!(&h.to_string(), header, "filter header at height {height}");
    }
    for (outpoint, txid, vin) in &truth.spent {
        match snap.active_spender(outpoint).map_err(|e| e.to_string())? {
            Some((_, rec)) => {
                assert_eq!((rec.txid, rec.vin), (*txid, *vin), "spender of {outpoint}")
            }
            None => return Err(format!("no spender row for {outpoint}")),
        }
        match snap.outpoint_status(outpoint).map_err(|e| e.to_string())? {
            OutpointStatus::Unspent => panic!("{outpoint} reported unspent; bcoin has it spent"),
            OutpointStatus::Unknown => return Err(format!("{outpoint} unknown")),
            _ => {}
        }
    }
    for outpoint in &truth.unspent {
        let status = snap.outpoint_status(outpoint).map_err(|e| e.to_string())?;
        assert!(
            matches!(status, OutpointStatus::Unspent),
            "{outpoint}: {status:?}, bcoin has it unspent"
        );
    }
    for height in 1..=tip.height {
        let e = index.active_at(height).expect("active height");
        let block = snap
            .read_block(e.id)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no block at height {height}"))?;
        assert_eq!(block.block_hash(), e.hash, "block at height {height}");
        let spent = snap
            .spent_outputs(e.id)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no spent outputs at height {height}"))?;
        let mut got: Vec<_> = spent.iter().map(|s| (s.outpoint, s.txid, s.vin)).collect();
        let mut want = truth.spent_at.get(&height).cloned().unwrap_or_default();
        got.sort();
        want.sort();
        assert_eq!(got, want, "spent outputs at height {height}");
    }
    let spent: Vec<OutPoint> = truth.spent.iter().map(|s| s.0).collect();
    let batch = snap.prove_outpoints(&spent).map_err(|e| e.to_string())?;
    let verified = kakehi::archive::verify(&batch, Anchor::Commitment(truth.commitment))
        .unwrap_or_else(|e| panic!("proof from the damaged datadir does not verify: {e}"));
    for (outpoint, txid, vin) in &truth.spent {
        if let Some(VerifiedStatus::Spent { leaf, .. }) = verified.status(outpoint) {
            assert_eq!(
                (leaf.spend.txid, leaf.spend.vin),
                (*txid, *vin),
                "proof of {outpoint}"
            );
        }
    }
    let mut dump = Vec::new();
    chain.dump_utxos(&mut dump).map_err(|e| e.to_string())?;
    assert!(
        String::from_utf8_lossy(&dump) == truth.utxos,
        "dump-utxos differs from bcoin's utxos.txt"
    );
    Ok(())
}

/// Every file under `dir`, relative, in name order (the datadir lock
/// excepted: it holds nothing).
fn files(dir: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("read dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(root, &p, out);
            } else if e.file_name() != ".lock" && p.metadata().map_or(0, |m| m.len()) > 0 {
                out.push(p.strip_prefix(root).expect("under root").to_path_buf());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Every file of `datadir/blocks` with its bytes, by path.
fn block_files(datadir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let dir = datadir.join("blocks");
    files(&dir)
        .into_iter()
        .map(|rel| {
            let bytes = std::fs::read(dir.join(&rel)).expect("read block file");
            (rel, bytes)
        })
        .collect()
}

/// A fresh datadir that imported regtest-a.
fn regtest_a_datadir() -> tempfile::TempDir {
    let dir = common::tempdir();
    let datadir = DataDir::open(dir.path()).expect("datadir");
    let chain = parking_lot::Mutex::new(
        open_chainstate(ChainParams::new(Network::Regtest), &datadir).expect("open"),
    );
    let files = [common::data("regtest-a/blocks.dat")];
    kakehi::import::import_files(&chain, &files, &Default::default(), false).expect("import");
    dir
}

#[derive(Clone, Copy, Debug)]
enum Damage {
    /// 8 bytes inverted in the middle of the file.
    Flip8,
    /// Cut to half its length.
    TruncateHalf,
    /// A whole store's directory gone (a bad copy, a mistaken `rm`).
    RemoveDir,
}

fn damage(path: &Path, how: Damage) {
    if let Damage::RemoveDir = how {
        return std::fs::remove_dir_all(path).expect("remove dir");
    }
    let mut bytes = std::fs::read(path).expect("read");
    match how {
        Damage::Flip8 => {
            let mid = bytes.len() / 2;
            for b in bytes.iter_mut().skip(mid.saturating_sub(4)).take(8) {
                *b = !*b;
            }
        }
        Damage::TruncateHalf => bytes.truncate(bytes.len() / 2),
        Damage::RemoveDir => unreachable!("a directory is removed, not rewritten"),
    }
    std::fs::write(path, bytes).expect("write");
}

#[test]
fn every_datadir_file_flipped_or_truncated_is_refused_or_served_right() {
    let mut truth = truth();
    let template = regtest_a_datadir();
    truth.commitment = {
        let dd = DataDir::open(template.path()).expect("datadir");
        let chain = open_chainstate(ChainParams::new(Network::Regtest), &dd).expect("open");
        let commitment = chain.snapshots().load().archive().commitment();
        commitment
    };
    // The undamaged datadir answers everything right (so the checks can
    // pass, and a refusal below is the damage's doing).
    assert!(matches!(
        check(template.path(), &truth),
        Outcome::AllCorrect
    ));

    let mut report = BTreeMap::new();
    let mut bad = Vec::new();
    // Every store's directory removed but the blocks (they are the source
    // everything is rebuilt from) and the archive (re-sealed from the
    // blocks at open: checked below, once its rebuild ends).
    let stores = std::fs::read_dir(template.path())
        .expect("read datadir")
        .flatten()
        .filter(|e| e.path().is_dir() && e.file_name() != "blocks" && e.file_name() != "archive")
        .map(|e| (PathBuf::from(e.file_name()), vec![Damage::RemoveDir]));
    let cases: Vec<(PathBuf, Vec<Damage>)> = files(template.path())
        .into_iter()
        .map(|rel| (rel, vec![Damage::Flip8, Damage::TruncateHalf]))
        .chain(stores)
        .collect();
    for (rel, hows) in cases {
        for how in hows {
            let case = common::tempdir();
            common::copy_dir(template.path(), case.path());
            damage(&case.path().join(&rel), how);
            let blocks = block_files(case.path());
            let outcome = catch_unwind(AssertUnwindSafe(|| check(case.path(), &truth)));
            if block_files(case.path()) != blocks {
                bad.push(format!(
                    "{} {how:?}: opening changed the block files",
                    rel.display()
                ));
            }
            let case_dir = case.path().display().to_string();
            let line = match &outcome {
                Ok(Outcome::Refused(m) | Outcome::ReadError(m)) if !m.contains(&case_dir) => {
                    bad.push(format!(
                        "{} {how:?}: refused without naming a file: {m}",
                        rel.display()
                    ));
                    format!("FAILED: {m}")
                }
                Ok(o) => format!("{o:?}"),
                Err(p) => {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    bad.push(format!("{} {how:?}: {msg}", rel.display()));
                    format!("FAILED: {msg}")
                }
            };
            report.insert(format!("{} {how:?}", rel.display()), line);
        }
    }
    // A removed archive is sealed again from the stored blocks, epoch by
    // epoch, to the same commitment.
    {
        let case = common::tempdir();
        common::copy_dir(template.path(), case.path());
        damage(&case.path().join("archive"), Damage::RemoveDir);
        let dd = DataDir::open(case.path()).expect("datadir");
        let mut chain = open_chainstate(ChainParams::new(Network::Regtest), &dd).expect("open");
        chain.finish_seals().expect("seal the epochs again");
        let commitment = chain.snapshots().load().archive().commitment();
        if commitment != truth.commitment {
            bad.push("archive RemoveDir: sealed again to another commitment".into());
        }
        report.insert(
            "archive RemoveDir".into(),
            "sealed again to the same commitment".into(),
        );
    }
    for (case, line) in &report {
        eprintln!("{case}: {line}");
    }
    assert!(
        bad.is_empty(),
        "wrong answers or panics:\n{}",
        bad.join("\n")
    );
}

/// A damaged transaction in a block file (one byte of an output's value)
/// fails the address routes' reads of its script (totals, unspent outputs
/// and the history page) with an error naming the file, instead of
/// changing the totals: those reads decode only the row's transaction
/// and check its txid against the txid index, not its whole block.
#[test]
fn a_damaged_transaction_fails_its_address_summary_instead_of_changing_it() {
    use bitcoin::consensus::serialize;
    let dir = regtest_a_datadir();
    let open = || {
        let dd = DataDir::open(dir.path()).expect("datadir");
        open_chainstate(ChainParams::new(Network::Regtest), &dd).expect("open")
    };
    // The first non-coinbase transaction below the tip, and the script of
    // its first output.
    let (tx, script_hash, stats) = {
        let chain = open();
        let snap = chain.snapshots().load();
        let index = snap.index();
        let tx = (1..=index.tip_height())
            .rev()
            .find_map(|h| {
                let id = index.active_at(h).expect("active").id;
                snap.read_block(id)
                    .expect("read")
                    .expect("stored")
                    .txdata
                    .get(1)
                    .cloned()
            })
            .expect("a block with a non-coinbase transaction");
        let script_hash = kakehi::primitives::script_hash(tx.output[0].script_pubkey.as_bytes());
        let (stats, utxos) = snap.script_summary(&script_hash).expect("summary");
        assert!(utxos.iter().any(|u| u.outpoint.txid == tx.compute_txid()));
        (tx, script_hash, stats)
    };
    let whole = serialize(&tx);
    let (file, mut bytes, at) = std::fs::read_dir(dir.path().join("blocks"))
        .expect("blocks dir")
        .flatten()
        .find_map(|e| {
            let bytes = std::fs::read(e.path()).expect("read");
            let at = bytes.windows(whole.len()).position(|w| w == whole)?;
            Some((e.path(), bytes, at))
        })
        .expect("the block file holding the transaction");
    let value = serialize(&tx.output[0]);
    let in_tx = whole
        .windows(value.len())
        .position(|w| w == value)
        .expect("its first output");
    bytes[at + in_tx] ^= 0x01;
    std::fs::write(&file, bytes).expect("write");

    let chain = open();
    let snap = chain.snapshots().load();
    let named = |e: kakehi::snapshot::ReadError| {
        let m = e.to_string();
        assert!(m.contains(&file.display().to_string()), "{m}");
    };
    match snap.script_summary(&script_hash) {
        Ok((s, _)) => panic!("summary served from a damaged block: {s:?} (was {stats:?})"),
        Err(e) => named(e),
    }
    match snap.script_txs(&script_hash, None, 25) {
        Ok(page) => panic!("history served from a damaged block: {page:?}"),
        Err(e) => named(e),
    }
}

/// The newest page-table snapshot sled keeps in `index` (`snap.<lsn>`).
fn sled_snapshot(index: &Path) -> PathBuf {
    let mut snaps: Vec<PathBuf> = std::fs::read_dir(index)
        .expect("read index dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| n.starts_with("snap.") && !n.ends_with(".generating"))
        })
        .collect();
    snaps.sort();
    snaps
        .pop()
        .expect("sled wrote a snapshot when the datadir was opened")
}

/// Appends to sled's snapshot `path` one page-table record that is cut
/// inside a varint, and makes the file's length and CRC-32 right again, so
/// sled decodes it. sled 0.34's snapshot file is the serialized page table
/// ‖ its length (u64 LE) ‖ CRC-32 (IEEE) of the table (u32 LE); a record is
/// a page state, here `Free` (tag 0) ‖ lsn (i64 LE, 8 bytes) ‖ disk pointer
/// `Inline` (tag 0) ‖ offset (a varint whose first byte, 0xff, announces 8
/// more bytes that are not there). sled's decoder indexes past the end
/// (`serialization.rs`): a panic inside `sled::Config::open`.
fn cut_sled_snapshot_record(path: &Path) {
    let bytes = std::fs::read(path).expect("read snapshot");
    let mut table = bytes[..bytes.len() - 12].to_vec();
    table.push(0);
    table.extend_from_slice(&1i64.to_le_bytes());
    table.extend_from_slice(&[0, 0xff]);
    let crc = crc32fast::hash(&table);
    let len = table.len() as u64;
    table.extend_from_slice(&len.to_le_bytes());
    table.extend_from_slice(&crc.to_le_bytes());
    std::fs::write(path, table).expect("write snapshot");
}

/// A damaged index database that makes sled panic while it recovers it is
/// refused like any other damaged file: `kakehi dump-utxos` exits non-zero
/// with the error naming the database directory and
/// `kakehi reindex-chainstate`, without a panic message on stderr, and the
/// block files are left as they were.
#[test]
fn an_index_database_sled_panics_on_is_refused_cleanly() {
    let dir = regtest_a_datadir();
    {
        // Opened once, so sled writes its snapshot.
        let dd = DataDir::open(dir.path()).expect("datadir");
        open_chainstate(ChainParams::new(Network::Regtest), &dd).expect("open");
    }
    let index = dir.path().join("index");
    cut_sled_snapshot_record(&sled_snapshot(&index));
    let blocks = block_files(dir.path());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kakehi"))
        .env_clear()
        .env("HOME", dir.path())
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(["--network", "regtest", "--datadir"])
        .arg(dir.path())
        .arg("dump-utxos")
        .arg("--output")
        .arg(dir.path().join("utxos.txt"))
        .output()
        .expect("run kakehi");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "opened a damaged index: {stderr}");
    let named = format!("the index database at {}", index.display());
    assert!(stderr.contains(&named), "does not name {named}: {stderr}");
    assert!(
        stderr.contains("sled panicked while recovering its files"),
        "{stderr}"
    );
    assert!(stderr.contains("kakehi reindex-chainstate"), "{stderr}");
    assert!(
        !stderr.contains("panicked at"),
        "a panic was printed: {stderr}"
    );
    assert_eq!(block_files(dir.path()), blocks, "the block files changed");
}
