//! A full disk during a large import: `kakehi import` into a datadir on a
//! small tmpfs stops with an error naming the file it could not write;
//! after the file system is grown (space freed), the same import resumes
//! and ends in regtest-a's reference state (tip, UTXO dump, MuHash): no
//! block lost, none half-written.
//!
//! Needs root (it mounts a tmpfs); elsewhere it prints why and passes
//! without checking anything.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use bitcoin::Network;
use common::{data, json};
use kakehi::chain::ChainParams;
use kakehi::node::{open_chainstate, DataDir};

/// A tmpfs mounted for the test, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (mount's syntax, e.g. "24m"); `None` when
    /// mounting is not allowed here.
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .ok()?
            .status
            .success();
        ok.then_some(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Grows the file system to `size` (the operator freeing space).
    fn resize(&self, size: &str) {
        let out = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

fn import(datadir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kakehi"))
        .args(["--network", "regtest", "--datadir"])
        .arg(datadir)
        .arg("import")
        .arg(data("regtest-a/blocks.dat"))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

/// Fills a tmpfs of `size` with an import, frees space, resumes; checks
/// the error and the end state.
fn fill_then_resume(size: &str) -> Option<String> {
    let fs = Tmpfs::mount(size)?;
    let datadir: PathBuf = fs.path().join("datadir");
    let out = import(&datadir);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "the import fit in {size}: {stderr}");
    assert!(
        stderr.contains("No space left on device"),
        "the error does not say the disk is full: {stderr}"
    );
    assert!(
        stderr.contains(&datadir.display().to_string()),
        "the error does not name the file: {stderr}"
    );

    fs.resize("512m");
    let out = import(&datadir);
    assert!(
        out.status.success(),
        "the import did not resume: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dump = Command::new(env!("CARGO_BIN_EXE_kakehi"))
        .args(["--network", "regtest", "--datadir"])
        .arg(&datadir)
        .arg("dump-utxos")
        .output()
        .unwrap();
    assert!(dump.status.success());
    assert!(
        dump.stdout == std::fs::read(data("regtest-a/utxos.txt")).unwrap(),
        "UTXO set after the full disk differs from regtest-a's"
    );
    let dir = DataDir::open(&datadir).unwrap();
    let cs = open_chainstate(ChainParams::new(Network::Regtest), &dir)
        .unwrap()
        .snapshot();
    assert_eq!(
        cs.index().tip().hash.to_string(),
        json("regtest-a/chain.json")["tip_hash"].as_str().unwrap()
    );
    assert_eq!(
        cs.utxo_stats().muhash,
        "7621cdc59b72640b7aa9d97d201aacf13027922448df03c13471c64abafe26d0"
    );
    Some(stderr)
}

#[test]
fn full_disk_stops_naming_the_path_and_resumes_after_space_is_freed() {
    // regtest-a's datadir takes ~100 MB: both sizes fill up mid-import.
    // Which store meets the full disk first (a block file, the spent
    // outputs, the index database, the UTXO table's journal) depends on
    // the timing of their writes; each names its file.
    for size in ["24m", "40m"] {
        match fill_then_resume(size) {
            Some(err) => eprintln!("{size}: {}", err.trim()),
            None => {
                eprintln!("skipped: cannot mount a tmpfs here (needs root)");
                return;
            }
        }
    }
}
