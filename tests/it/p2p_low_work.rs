//! A million headers of a low-work chain over P2P (the headers presync of
//! Bitcoin Core's `headerssync.cpp`): `tests/python/p2p_core.py lowwork`
//! (Core's test framework, PyPI `verystable`) feeds them to an empty
//! regtest node whose minimum chainwork no regtest chain of that length
//! reaches, answering each of the node's `getheaders`. The test runs in a
//! process of its own ([`common::alone`]), so that the process's memory is
//! this node's alone.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bitcoin::Network;
use common::data;
use kakehi::chain::ChainParams;
use kakehi::node::{open_chainstate, DataDir};
use parking_lot::Mutex;

/// Upper bound of the script run (debug build, 2 shared cores).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(240);

/// Headers of the low-work chain (500 full `headers` messages).
const LOW_WORK_HEADERS: u32 = 1_000_000;

/// The process's resident and peak resident memory, in KiB (Linux's
/// `/proc/self/status` VmRSS and VmHWM).
fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .expect("VmRSS / VmHWM")
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Bytes of every file under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let meta = entry.metadata().expect("metadata");
        total += if meta.is_dir() {
            dir_bytes(&entry.path())
        } else {
            meta.len()
        };
    }
    total
}

/// A million headers of a chain below the minimum chainwork, each
/// answering the node's `getheaders` (Core's headers presync case): the
/// node follows the whole chain and keeps the peer, stores none of it
/// (index, before and after a reopen; datadir size), its peak memory grows
/// by less than 10 MiB, and a second peer is answered within 2 s
/// throughout.
#[test]
fn low_work_headers_are_followed_not_stored() {
    if !common::alone(module_path!(), "low_work_headers_are_followed_not_stored") {
        return;
    }
    let python = common::python::venv_python();
    let dir = common::tempdir();
    let datadir = DataDir::open(dir.path()).expect("datadir");
    let mut params = ChainParams::new(Network::Regtest);
    // 2^40 of work: far above any regtest chain of a million headers (2 each).
    params.minimum_chain_work = [0; 32];
    params.minimum_chain_work[26] = 1;
    let chain = Arc::new(Mutex::new(
        open_chainstate(params.clone(), &datadir).expect("chainstate"),
    ));
    let p2p = common::ListeningP2p::start(chain.clone());
    let bytes_before = dir_bytes(dir.path());
    // Peak memory from now on (Linux: writing 5 to clear_refs resets VmHWM).
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let (rss_before, _) = rss_kib();
    let args: Vec<std::ffi::OsString> = vec![
        "--port".into(),
        p2p.addr.port().to_string().into(),
        "--data".into(),
        data("regtest-a").into(),
        "--headers".into(),
        LOW_WORK_HEADERS.to_string().into(),
        "lowwork".into(),
    ];
    let out = common::python::run_script(&python, "p2p_core.py", &args, SCRIPT_TIMEOUT);
    let (rss_after, peak) = rss_kib();
    let ended = p2p.stop();
    match out {
        Ok(text) => eprintln!("{text}"),
        Err(e) => panic!("{e}"),
    }
    assert!(ended.is_ok(), "p2p task did not stop cleanly: {ended:?}");
    eprintln!(
        "memory: rss {rss_before} KiB before, {rss_after} KiB after, peak {peak} KiB{}",
        if reset {
            ""
        } else {
            " (peak since start: clear_refs refused)"
        }
    );
    if reset {
        assert!(
            peak.saturating_sub(rss_before) < 10 * 1024,
            "peak memory grew by {} KiB following the low-work chain",
            peak - rss_before
        );
    }
    {
        let cs = chain.lock();
        assert_eq!(cs.index().len(), 1, "low-work headers stored in the index");
    }
    let grown = dir_bytes(dir.path()).saturating_sub(bytes_before);
    eprintln!("datadir: {bytes_before} bytes before, grew by {grown}");
    assert!(
        grown < 1 << 20,
        "the datadir grew by {grown} bytes for headers never stored"
    );
    drop(chain);
    drop(datadir);
    let datadir = DataDir::open(dir.path()).expect("datadir");
    let cs = open_chainstate(params, &datadir).expect("reopen");
    assert_eq!(cs.index().len(), 1, "low-work headers found at reopen");
}
