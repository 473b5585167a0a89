//! One timed import of testnet-data/regtest-a's blocks.dat (1,529 blocks,
//! tip at height 1,500) into a fresh datadir, shared by the import and
//! address-index benches (included with `#[path]`).

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use kakehi::chain::ChainParams;
use kakehi::import::import_files;
use kakehi::node::{open_chainstate, DataDir};
use kakehi::pipeline::Chainstate;
use parking_lot::Mutex;

/// Imports `file` with `params` into a fresh temporary datadir, after
/// `configure` has set up the chain state (group limits, assumevalid,
/// address index...). Returns the import's seconds, the chain state and
/// the datadir (deleted when dropped). Panics (it is a bench) on any error
/// or if the tip is not regtest-a's height 1,500.
pub fn timed_import(
    file: &Path,
    params: ChainParams,
    configure: impl FnOnce(&mut Chainstate),
) -> (f64, Mutex<Chainstate>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let datadir = DataDir::open(dir.path()).expect("datadir");
    let mut cs = open_chainstate(params, &datadir).expect("open");
    configure(&mut cs);
    let chain = Mutex::new(cs);
    let t = Instant::now();
    let s = import_files(
        &chain,
        &[file.to_path_buf()],
        &AtomicBool::new(false),
        false,
    )
    .expect("import");
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(s.tip_height, 1500);
    (secs, chain, dir)
}
