//! A Python virtual environment for the tests that drive kakehi with Python
//! clients (Bitcoin Core's P2P test framework from `verystable`, `schemathesis`).
//!
//! The venv lives in `target/tmp/py-venv` and holds exactly
//! `tests/python/requirements.txt`; it is created on first use (pip needs
//! PyPI) and reused while the requirements file is unchanged. A file lock
//! keeps concurrent test binaries from building it twice.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

/// Runs `python tests/python/<script> ARGS…` for at most `limit`: its
/// output (stdout and stderr in order) followed by `(… s)` on success,
/// `Err` with the output when it fails or times out.
pub fn run_script(
    python: &Path,
    script_name: &str,
    args: &[std::ffi::OsString],
    limit: Duration,
) -> Result<String, String> {
    let out = tempfile::NamedTempFile::new().expect("temp file");
    let started = Instant::now();
    let mut child = Command::new(python)
        .arg(script(script_name))
        .args(args)
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        // One file description for both (a dup shares the offset), so
        // stderr does not overwrite what stdout wrote.
        .stdout(out.as_file().try_clone().expect("dup"))
        .stderr(out.as_file().try_clone().expect("dup"))
        .spawn()
        .expect("spawn python");
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait python") {
            break Some(s);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = fs::read_to_string(out.path()).unwrap_or_default();
    let took = started.elapsed().as_secs_f64();
    let what = format!("{script_name} {args:?}");
    match status {
        Some(s) if s.success() => Ok(format!("{text}({what}: {took:.1} s)")),
        Some(s) => Err(format!("{what} failed ({s}):\n{text}")),
        None => Err(format!("{what} timed out after {limit:?}:\n{text}")),
    }
}
