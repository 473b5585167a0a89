//! The source is formatted as `cargo fmt` formats it (rustfmt's defaults;
//! no `rustfmt.toml`), so a change that lands unformatted fails CI instead
//! of reaching the next diff (a toolchain without rustfmt fails it, saying
//! how to add it). And the fuzz workspace's lock file (`fuzz/`, a
//! workspace of its own that depends on this crate) follows this crate's
//! dependencies, so `cargo fuzz run` works on a fresh clone.

use std::process::Command;

#[test]
fn sources_are_formatted_as_cargo_fmt_formats_them() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = env!("CARGO_MANIFEST_DIR");
    let has_rustfmt = Command::new(&cargo)
        .args(["fmt", "--version"])
        .current_dir(root)
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        has_rustfmt,
        "this toolchain has no rustfmt: `rustup component add rustfmt`"
    );
    let out = Command::new(&cargo)
        .args(["fmt", "--all", "--", "--check"])
        .current_dir(root)
        .output()
        .expect("run cargo fmt");
    assert!(
        out.status.success(),
        "`cargo fmt --all -- --check` found unformatted code; run `cargo fmt`:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `fuzz/Cargo.lock` names every dependency this crate now has: a new
/// dependency added here without `cd fuzz && cargo update -w` fails it
/// (cargo resolves the lock against crates.io's index: needs the network
/// CI has for the build itself).
#[test]
fn the_fuzz_workspace_lock_file_is_up_to_date() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let fuzz = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let out = Command::new(&cargo)
        .args(["metadata", "--locked", "--format-version", "1"])
        .current_dir(&fuzz)
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "fuzz/Cargo.lock is stale; run `cd fuzz && cargo update -w`:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
