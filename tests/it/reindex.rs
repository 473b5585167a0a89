//! `kakehi reindex-chainstate` on a datadir written by the previous release
//! (Sozu table format 3): the node refuses it with a message naming the
//! command and changes nothing; the command rebuilds the chain state from
//! the block files (a torn append at the end of the last one cut) and
//! `dump-utxos` then equals the previous release's dump byte for byte. A
//! reindex stopped during its swap is refused until run again, which
//! finishes it.
//!
//! Data: testnet-data/format3-datadir (see its README.md: the first 250
//! blocks of regtest-a imported by the release at commit 1a242f1).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testnet-data")
        .join(rel)
}

/// The binary with a clean environment (HOME in the temp dir), on regtest.
fn kakehi(home: &Path, datadir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kakehi"));
    // No JSON-RPC server: tests run nodes side by side (its port is fixed).
    c.env("KAKEHI_RPC", "off");
    c.env_clear()
        .env("HOME", home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(["--network", "regtest", "--datadir"])
        .arg(datadir);
    c
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("spawn kakehi")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The format-3 datadir, extracted under `home` (as `<home>/<name>`).
fn extract(home: &Path, name: &str) -> PathBuf {
    let st = Command::new("tar")
        .arg("-xJf")
        .arg(data("format3-datadir/datadir.tar.xz"))
        .arg("-C")
        .arg(home)
        .status()
        .expect("tar");
    assert!(st.success(), "tar -xJf failed");
    let dir = home.join(name);
    std::fs::rename(home.join("datadir"), &dir).expect("rename");
    dir
}

/// The format-3 datadir extracted under `home` as `<home>/<name>` and
/// reindexed: a datadir of the current formats.
fn reindexed(home: &Path, name: &str) -> PathBuf {
    let dir = extract(home, name);
    let out = run(kakehi(home, &dir).arg("reindex-chainstate"));
    assert!(out.status.success(), "reindex: {}", text(&out.stderr));
    dir
}

/// The previous release's `dump-utxos` of the format-3 datadir.
fn expected_dump() -> Vec<u8> {
    std::fs::read(data("format3-datadir/utxos.txt")).expect("utxos.txt")
}

/// Every file under `dir` with its bytes, sorted by path.
fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name() != Some(".lock".as_ref()) {
                out.push((
                    p.strip_prefix(dir).expect("prefix").into(),
                    std::fs::read(&p).expect("read"),
                ));
            }
        }
    }
    out.sort();
    out
}

fn dump(home: &Path, datadir: &Path) -> Vec<u8> {
    let out = run(kakehi(home, datadir).arg("dump-utxos"));
    assert!(out.status.success(), "dump-utxos: {}", text(&out.stderr));
    out.stdout
}

#[test]
fn format3_datadir_refused_then_reindexed_byte_identical() {
    let home = common::tempdir();
    let datadir = extract(home.path(), "d");
    let expected = expected_dump();

    // A torn append after the last committed block (a crash mid-write):
    // the first 100 bytes of a record.
    let blk = datadir.join("blocks/blk00000.dat");
    let mut bytes = std::fs::read(&blk).expect("blk");
    let first_record = bytes[..100].to_vec();
    bytes.extend_from_slice(&first_record);
    std::fs::write(&blk, &bytes).expect("torn tail");

    let before = contents(&datadir);
    let out = run(kakehi(home.path(), &datadir).arg("dump-utxos"));
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success(),
        "a format-3 table was opened: {stderr}"
    );
    assert!(
        stderr.contains("format version 3.") && stderr.contains("kakehi reindex-chainstate"),
        "the refusal does not name the command: {stderr}"
    );
    assert!(
        contents(&datadir) == before,
        "the refusal changed the datadir"
    );

    let out = run(kakehi(home.path(), &datadir).arg("reindex-chainstate"));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "reindex: {}", text(&out.stderr));
    assert!(
        stdout.contains("250 accepted")
            && stdout.contains("1 reorgs")
            && stdout.contains(
                "tip: height 249 hash 26b27990181c0c4dbd4b0e8dfb389d83d53a4528599d8889501b8c182637714a"
            ),
        "{stdout}"
    );
    for left in ["reindex.new", "reindex.old"] {
        assert!(!datadir.join(left).exists(), "{left} left behind");
    }
    let got = dump(home.path(), &datadir);
    assert!(
        got == expected,
        "dump-utxos after the reindex differs from utxos.txt"
    );
}

/// A reindex stopped after moving some directories: `index` and `blocks`
/// already swapped in (old ones in reindex.old), the rest still waiting in
/// reindex.new.
#[test]
fn swap_interrupted_is_refused_then_finished() {
    let home = common::tempdir();
    let new = reindexed(home.path(), "old");
    let datadir = extract(home.path(), "d");
    let (pending, moved) = (datadir.join("reindex.new"), datadir.join("reindex.old"));
    std::fs::create_dir_all(&pending).expect("mkdir");
    std::fs::create_dir_all(&moved).expect("mkdir");
    for name in [
        "index", "blocks", "filters", "spent", "headers", "archive", "utxo",
    ] {
        let swapped = name == "index" || name == "blocks";
        if swapped {
            std::fs::rename(datadir.join(name), moved.join(name)).expect("move old");
        }
        let to = if swapped {
            datadir.join(name)
        } else {
            pending.join(name)
        };
        std::fs::rename(new.join(name), to).expect("move new");
    }
    std::fs::write(pending.join("COMPLETE"), b"").expect("marker");

    let out = run(kakehi(home.path(), &datadir).arg("dump-utxos"));
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "a half-swapped datadir was opened");
    assert!(
        stderr.contains("run `kakehi reindex-chainstate` to finish it"),
        "{stderr}"
    );

    let out = run(kakehi(home.path(), &datadir).arg("reindex-chainstate"));
    assert!(out.status.success(), "finish: {}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("finished the swap"),
        "{}",
        text(&out.stdout)
    );
    assert!(!pending.exists() && !moved.exists());
    let expected = expected_dump();
    assert!(
        dump(home.path(), &datadir) == expected,
        "dump-utxos after the finished swap differs"
    );
}

/// A damaged or lost index database: its `db` file cut to half (sled
/// then opens what it can of its log, an early prefix of the commits, or
/// nothing), or the whole `index` directory gone. The node refuses the
/// datadir with a message that names `kakehi reindex-chainstate` and leaves
/// the block files as they were (opening at the lost index's positions
/// used to cut them all away); the command rebuilds the index from them and
/// the dump equals the one before the damage.
#[test]
fn a_damaged_or_lost_index_is_refused_without_touching_the_blocks_then_rebuilt() {
    let home = common::tempdir();
    let datadir = reindexed(home.path(), "d");
    let expected = expected_dump();

    let index = datadir.join("index");
    let cut_db = |index: &Path| {
        let db = index.join("db");
        let bytes = std::fs::read(&db).expect("index/db");
        std::fs::write(&db, &bytes[..bytes.len() / 2]).expect("truncate");
    };
    let remove = |index: &Path| std::fs::remove_dir_all(index).expect("remove index");
    for (what, damage) in [
        ("db cut to half", &cut_db as &dyn Fn(&Path)),
        ("index removed", &remove),
    ] {
        damage(&index);
        let blocks = contents(&datadir.join("blocks"));
        let out = run(kakehi(home.path(), &datadir).arg("dump-utxos"));
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{what}: the datadir was opened");
        assert!(
            stderr.contains("kakehi reindex-chainstate"),
            "{what}: the refusal does not name the command: {stderr}"
        );
        assert!(
            contents(&datadir.join("blocks")) == blocks,
            "{what}: the refusal changed the block files"
        );

        let out = run(kakehi(home.path(), &datadir).arg("reindex-chainstate"));
        assert!(
            out.status.success(),
            "{what}: reindex: {}",
            text(&out.stderr)
        );
        assert!(
            dump(home.path(), &datadir) == expected,
            "{what}: dump-utxos after rebuilding the index differs from utxos.txt"
        );
    }
}
