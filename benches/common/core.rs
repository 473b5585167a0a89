//! Bitcoin Core's own engine as a benchmark anchor (included with
//! `#[path]`): `benches/core_import.py` imports blk files with `pbk`
//! `ChainstateManager.import_blocks` (default caches, scripts checked) in
//! the Python venv of the tests.

#[path = "../../tests/common/python.rs"]
#[allow(dead_code)]
mod python;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Imports `files` with Core's engine and `workers` script-check threads
/// besides the validation thread (0: pbk's default); returns its JSON line
/// (`seconds`, `cpu_seconds`, `height`, `tip`, `workers`). Panics when the script fails.
pub fn import(files: &[PathBuf], workers: usize) -> serde_json::Value {
    let out = Command::new(python::venv_python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/core_import.py"))
        .args(["--workers", &workers.to_string()])
        .args(files)
        .output()
        .expect("run benches/core_import.py");
    assert!(
        out.status.success(),
        "core_import.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("core_import.py prints JSON")
}
