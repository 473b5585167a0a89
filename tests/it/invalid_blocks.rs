//! Invalid blocks over P2P, Bitcoin Core's `feature_block.py` families,
//! judged by Bitcoin Core's own validation engine: `tests/python/
//! invalid_blocks.py` builds the blocks with Core's test framework
//! (PyPI `verystable`), sends each case to a fresh regtest node as blocks
//! that would otherwise extend its tip, feeds the same blocks to
//! libbitcoinkernel (PyPI `py-bitcoinkernel`), and checks after each case
//! that kakehi's tip is Core's, that its MuHash did not move unless the
//! tip did (and equals the script's own UTXO set's), and that the sending
//! peer was discouraged exactly when Core discourages it. The script's
//! docstring lists the families; its output names every case. The script
//! families (`--scripts`: scriptSig, P2SH, P2WSH, CLTV and CSV spends, each
//! failing and passing) run too, since the pipeline runs Core's script
//! interpreter.
//!
//! Then the node is reopened from its datadir: the tip and MuHash it
//! served are what it kept. BIP30 runs on a second node whose BIP34 never
//! activates (Core's regtest activates it at height 1, which makes
//! duplicate transactions impossible).

use crate::common;

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use bitcoin::Network;
use kakehi::chain::ChainParams;
use kakehi::http::{AppState, HttpConfig};
use kakehi::node::{open_chainstate, DataDir};
use parking_lot::Mutex;

/// Upper bound of one script run (debug build, 2 shared cores).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(300);

/// A node on a fresh datadir with P2P and HTTP listening; runs `check` of
/// the script against it; returns the script's output and the node's
/// UTXO stats (tip, MuHash) at the end, and the datadir.
fn run(
    params: ChainParams,
    check: &str,
) -> (String, kakehi::snapshot::UtxoStats, tempfile::TempDir) {
    common::init_test_log();
    let python = common::python::venv_python();
    let dir = common::tempdir();
    let datadir = DataDir::open(dir.path()).expect("datadir");
    let chain = Arc::new(Mutex::new(
        open_chainstate(params, &datadir).expect("chainstate"),
    ));
    let p2p = common::ListeningP2p::start(chain.clone());
    let http = common::spawn_http(
        AppState {
            snapshots: chain.lock().snapshots(),
            p2p: Some(p2p.handle.clone()),
            mempool: None,
        },
        HttpConfig::default(),
    );
    let args: Vec<OsString> = vec![
        "--p2p".into(),
        p2p.addr.port().to_string().into(),
        "--http".into(),
        http.addr.port().to_string().into(),
        // The script families too: kakehi runs Core's script interpreter.
        "--scripts".into(),
        check.into(),
    ];
    let out = common::python::run_script(&python, "invalid_blocks.py", &args, SCRIPT_TIMEOUT);
    drop(http);
    let stopped = p2p.stop();
    let stats = chain.lock().snapshot().utxo_stats();
    drop(chain);
    drop(datadir);
    match out {
        Ok(text) => {
            assert!(
                stopped.is_ok(),
                "p2p task did not stop cleanly: {stopped:?}"
            );
            (text, stats, dir)
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn core_block_families_over_p2p() {
    let params = ChainParams::new(Network::Regtest);
    let (out, served, dir) = run(params.clone(), "families");
    eprintln!("{out}");
    // Reopened: the tip and UTXO set it served.
    let datadir = DataDir::open(dir.path()).expect("datadir");
    let cs = open_chainstate(params, &datadir).expect("reopen");
    let kept = cs.snapshot().utxo_stats();
    assert_eq!(
        (kept.bestblock, kept.height, &kept.muhash),
        (served.bestblock, served.height, &served.muhash),
        "reopened state differs from the state served"
    );
}

#[test]
fn bip30_duplicate_coinbase_over_p2p() {
    let mut params = ChainParams::new(Network::Regtest);
    params.bip34_height = u32::MAX;
    let (out, _, _) = run(params, "bip30");
    eprintln!("{out}");
}
