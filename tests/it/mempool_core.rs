//! Bitcoin Core 30.0's mempool functional tests, ported with Core's own
//! test framework (`verystable`: MiniWallet, blocktools, P2P) and run
//! against the `kakehi` binary: `tests/python/mempool_core.py` starts
//! regtest nodes on loopback ports, feeds them a 200-block chain over P2P,
//! and replays the cases of `mempool_accept.py`, `mempool_spend_coinbase.py`,
//! `mempool_reorg.py`, `mempool_updatefromblock.py`, `feature_rbf.py`,
//! `mempool_truc.py`, `mempool_package_onemore.py`, `mempool_limit.py`,
//! `mempool_persist.py` and `mempool_expiry.py`, each asserting Core's
//! verdict and reject reason as `POST /tx` returns it (bitcoind's
//! `sendrawtransaction` error). What Core's files test with RPCs kakehi
//! lacks (`submitpackage`, `prioritisetransaction`, `testmempoolaccept`'s
//! argument errors) is listed as skipped in the script's summary.
//!
//! The script's non-zero exit (a failed case) fails the test with its
//! output. Needs Python 3 and, the first time, PyPI
//! (`tests/common/python.rs`).

use crate::common;

use std::time::Duration;

/// Upper bound of the whole script (debug build, 2 shared cores; the
/// expiry cases wait about 15 s of wall time by design).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(300);

#[test]
fn core_mempool_tests_against_kakehi() {
    let python = common::python::venv_python();
    let dir = common::tempdir();
    let mut args: Vec<std::ffi::OsString> = vec![
        "--kakehi".into(),
        env!("CARGO_BIN_EXE_kakehi").into(),
        "--tmp".into(),
        dir.path().into(),
    ];
    // KAKEHI_MEMPOOL_CORE=rbf,truc runs some groups only.
    if let Ok(groups) = std::env::var("KAKEHI_MEMPOOL_CORE") {
        args.extend(groups.split(',').map(Into::into));
    }
    match common::python::run_script(&python, "mempool_core.py", &args, SCRIPT_TIMEOUT) {
        Ok(out) => eprintln!("{out}"),
        Err(e) => panic!("{e}"),
    }
}
