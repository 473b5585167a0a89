//! The source is formatted as `cargo fmt` formats it (rustfmt's defaults;
//! no `rustfmt.toml`), so a change that lands unformatted fails CI instead
//! of reaching the next diff (a toolchain without rustfmt fails it, saying
//! how to add it). And the fuzz workspace's lock file (`fuzz/`, a
//! workspace of its own that depends on this crate) follows this crate's
//! dependencies, so `cargo fuzz run` works on a fresh clone. And the read
//! side never names the writer: no module of the snapshot, the servers
//! (HTTP, P2P, RPC, Electrum), the store or the mempool mentions
//! `crate::pipeline`, and the store never mentions `crate::archive`, which
//! is built on it.

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

/// Where `path` reaches into the crate-root module `name` (`crate::name`,
/// `super::…::name`, or `name` in a `crate::{…}` / `super::{…}` group), as
/// 1-based line numbers. Comments and doc links count as code does: a doc
/// link is an arrow too. `super` chains are taken to reach the crate root,
/// which holds for the folders checked here (none has a submodule of that
/// name).
fn mentions(source: &str, name: &str) -> Vec<usize> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let line_of = |at: usize| source[..at].matches('\n').count() + 1;
    let rooted = |before: &str| {
        let seg: String = before
            .chars()
            .rev()
            .take_while(|c| ident(*c))
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let prior = before[..before.len() - seg.len()].chars().next_back();
        (seg == "crate" || seg == "super") && !prior.is_some_and(ident)
    };
    let mut hits = Vec::new();
    // `crate::name` and `super::name`, the name whole.
    let needle = format!("::{name}");
    for (at, _) in source.match_indices(&needle) {
        let after = source[at + needle.len()..].chars().next();
        if !after.is_some_and(ident) && rooted(&source[..at]) {
            hits.push(line_of(at));
        }
    }
    // Groups: `crate::{a, name::X, …}`, nested braces skipped.
    for (at, _) in source.match_indices("::{") {
        if !rooted(&source[..at]) {
            continue;
        }
        let body = &source[at + 3..];
        let (mut depth, mut start, mut items) = (0usize, 0usize, Vec::new());
        for (i, c) in body.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    items.push(&body[start..i]);
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(&body[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        let named = items.iter().any(|item| {
            let item = item.trim_start();
            item.strip_prefix(name)
                .is_some_and(|rest| !rest.chars().next().is_some_and(ident))
        });
        if named {
            hits.push(line_of(at));
        }
    }
    hits.sort_unstable();
    hits
}

/// Every `.rs` file under `dir` (or `dir` itself with `.rs` added, the
/// module's own file), walked recursively.
fn rust_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let file = dir.with_extension("rs");
    if file.is_file() {
        out.push(file);
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The read side and the lower floors never name the writer: a module of
/// the snapshot, the servers (HTTP, P2P, RPC, Electrum), the store or the
/// mempool that mentions `crate::pipeline` (an import, a path, a doc link)
/// fails, and so does a store module that mentions `crate::archive`. The
/// writer publishes snapshots and calls down; nothing below or beside it
/// calls up (kyoto's peers never import their manager; zebra-state's read
/// service never imports its write path).
#[test]
fn the_read_side_never_names_the_writer() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let rules: [(&str, &str); 8] = [
        ("snapshot", "pipeline"),
        ("http", "pipeline"),
        ("p2p", "pipeline"),
        ("store", "pipeline"),
        ("mempool", "pipeline"),
        ("rpc", "pipeline"),
        ("electrum", "pipeline"),
        ("store", "archive"),
    ];
    let mut checked = 0;
    let mut bad = Vec::new();
    for (folder, name) in rules {
        for file in rust_files(&src.join(folder)) {
            checked += 1;
            let source = std::fs::read_to_string(&file).expect("read source");
            for line in mentions(&source, name) {
                let shown = file.strip_prefix(&src).unwrap_or(&file).display();
                bad.push(format!("src/{shown}:{line} mentions crate::{name}"));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} files checked: the walk is broken"
    );
    assert!(
        bad.is_empty(),
        "modules below or beside the writer name it (move the shared type down):\n{}",
        bad.join("\n")
    );
}

/// [`mentions`] finds every form of the arrow and nothing else.
#[test]
fn mentions_finds_imports_paths_groups_and_doc_links() {
    let hit = |s: &str| mentions(s, "pipeline");
    assert_eq!(hit("use crate::pipeline::PipelineError;"), [1]);
    assert_eq!(hit("use crate::pipeline;"), [1]);
    assert_eq!(hit("\nlet x: crate::pipeline::Stats = y;"), [2]);
    assert_eq!(
        hit("/// [run](crate::pipeline::Chainstate::snapshots)"),
        [1]
    );
    assert_eq!(hit("use super::super::pipeline::X;"), [1]);
    assert_eq!(hit("use crate::{chain, pipeline::PipelineError};"), [1]);
    assert_eq!(
        hit("use crate::{\n    chain::{a, b},\n    pipeline,\n};"),
        [1]
    );
    assert!(hit("use crate::pipelines::X;").is_empty());
    assert!(hit("use crate::snapshot::pipeline_stats;").is_empty());
    assert!(hit("use crate::{chain::{pipeline}, store};").is_empty());
    assert!(hit("use mycrate::pipeline::X;").is_empty());
    assert!(hit("the pipeline writes `spent/` (see pipeline::spent)").is_empty());
}
