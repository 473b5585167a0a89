//! kakehi's P2P layer driven by Bitcoin Core's own P2P test framework
//! (`verystable.core.p2p` / `verystable.core.messages`, the PyPI packaging of
//! Core's `test/functional/test_framework`).
//!
//! A node imports `testnet-data/regtest-a/blocks.dat` (bcoin's chain) and
//! listens on a loopback port chosen by the OS; `tests/python/p2p_core.py`
//! then runs, in order:
//! - `handshake`: version/verack, services NODE_NETWORK | NODE_WITNESS |
//!   NODE_COMPACT_FILTERS, protocol 70016, wtxidrelay/sendaddrv2/sendheaders,
//!   pings; getheaders and getdata against `chain.json`;
//! - `getblocks`: a peer that syncs the whole chain by `getblocks` / `inv` /
//!   `getdata` only (as bcoin and btcd do), relying on the continuation
//!   `inv` of the tip after each batch of 500, ends at `chain.json`'s tip;
//!   a locator starting on a stale branch is answered from the fork point,
//!   and a peer that holds the 12-block stale branch reorganises onto the
//!   active chain and syncs to the tip the same way;
//! - `filters`: getcfcheckpt / getcfheaders / getcfilters checked as Core's
//!   `p2p_blockfilters.py` does, against bcoin's `filters.json` and
//!   `stale_filters.json`; then 500 coinbase-only blocks mined by the script
//!   and sent over P2P (to reach height 2,000; their filters checked with the
//!   script's own BIP158 encoder), tip announcements, over-limit requests;
//! - `messages`: what Core, btcd and bcoin peers send to a node without a
//!   mempool (docs/p2p.md): wtxidrelay before verack, feefilter, notfound,
//!   getdata for transactions (notfound), sendcmpct (full blocks for
//!   MSG_CMPCT_BLOCK, also for a block mined and announced now), getaddr
//!   (once), mempool / filterclear (disconnect), tx / tx inv (ignored), BIP324 v2
//!   handshake bytes (closed at once, v1 retry served);
//! - `malformed`: Core's `p2p_invalid_messages.py` cases (bad magic, also
//!   mid-stream; bad checksum; oversized and undersized payloads; bad
//!   command bytes; over-limit `headers`, `inv`, `getdata`, `addr`,
//!   `addrv2`), 80 junk 4 MB messages, each disconnecting its sender while a
//!   second peer's pings are answered within 2 s (and a third peer
//!   downloads 20,000 filters and 500 blocks); an unknown command, a
//!   message split over three writes and a second `version` keep the peer.
//!
//! A script's non-zero exit fails the test with its output. Each run is
//! bounded (`SCRIPT_TIMEOUT`). Needs Python 3 and, the first time, PyPI
//! (see `tests/common/python.rs`).

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use bitcoin::Network;
use common::data;
use kakehi::chain::ChainParams;
use kakehi::import::import_files;
use kakehi::node::{open_chainstate, DataDir};
use parking_lot::Mutex;

/// Upper bound of one script run (debug build, 2 shared cores).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(240);

/// Runs `p2p_core.py CHECK` against `addr`; `Err` with its output when it
/// fails or times out.
fn run_check(python: &Path, addr: SocketAddr, check: &str) -> Result<String, String> {
    let args: Vec<std::ffi::OsString> = vec![
        "--port".into(),
        addr.port().to_string().into(),
        "--data".into(),
        data("regtest-a").into(),
        check.into(),
    ];
    common::python::run_script(python, "p2p_core.py", &args, SCRIPT_TIMEOUT)
}

#[test]
fn core_test_framework_against_kakehi() {
    let python = common::python::venv_python();
    let dir = common::tempdir();
    let datadir = DataDir::open(dir.path()).expect("datadir");
    let chain = Arc::new(Mutex::new(
        open_chainstate(ChainParams::new(Network::Regtest), &datadir).expect("chainstate"),
    ));
    let summary = import_files(
        &chain,
        &[data("regtest-a/blocks.dat")],
        &AtomicBool::new(false),
        false,
    )
    .expect("import regtest-a");
    assert!(summary.rejected.is_empty(), "{:?}", summary.rejected);

    let p2p = common::ListeningP2p::start(chain.clone());
    let addr = p2p.addr;

    // In this order: `getblocks` needs regtest-a's tip, `filters` extends the chain
    // (from regtest-a's tip), `messages` mines one block on whatever tip, `malformed` gets
    // 127.0.0.1 discouraged.
    let mut failures = Vec::new();
    for check in ["handshake", "getblocks", "filters", "messages", "malformed"] {
        match run_check(&python, addr, check) {
            Ok(out) => eprintln!("{out}"),
            Err(e) => failures.push(e),
        }
    }
    // The node is still healthy and stops cleanly.
    let ended = p2p.stop();
    assert!(ended.is_ok(), "p2p task did not stop cleanly: {ended:?}");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
