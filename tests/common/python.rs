//! A Python virtual environment for the tests that drive kakehi with Python
//! clients (Bitcoin Core's P2P test framework from `verystable`, `schemathesis`).
//!
//! The venv lives in `target/tmp/py-venv` and holds exactly
//! `tests/python/requirements.txt`; it is created on first use (pip needs
//! PyPI) and reused while the requirements file is unchanged. A file lock
//! keeps concurrent test binaries from building it twice.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `tests/python/<rel>` in the repository.
pub fn script(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(rel)
}

/// Path to the venv's `python`, creating and filling the venv if needed.
///
/// Panics with the failing command's output if `python3 -m venv` or
/// `pip install` fails (no Python 3, or no route to PyPI).
pub fn venv_python() -> PathBuf {
    let requirements = script("requirements.txt");
    let wanted = fs::read_to_string(&requirements).expect("read tests/python/requirements.txt");
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    fs::create_dir_all(tmp).expect("create target/tmp");
    let lock = File::create(tmp.join("py-venv.lock")).expect("create venv lock file");
    lock.lock().expect("lock venv");
    let venv = tmp.join("py-venv");
    let python = venv.join("bin/python");
    let marker = venv.join("kakehi-requirements.txt");
    if python.exists() && fs::read_to_string(&marker).ok().as_deref() == Some(wanted.as_str()) {
        return python;
    }
    let _ = fs::remove_dir_all(&venv);
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv));
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
        ])
        .arg(&requirements));
    fs::write(&marker, wanted).expect("write venv marker");
    python
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
