//! Helpers shared by the integration tests: paths to the real chain data and
//! a node imported from it.
#![allow(dead_code)]

pub mod feed;
pub mod python;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::RwLock;

use bitcoin::Network;
use kakehi::chain::ChainParams;
use kakehi::import::{import_files, ImportSummary};
use kakehi::node::{open_chainstate, DataDir};
use kakehi::pipeline::Chainstate;

/// `testnet-data/<rel>` in the repository.
pub fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testnet-data")
        .join(rel)
}

/// Parsed JSON of `testnet-data/<rel>`.
pub fn json(rel: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(data(rel)).expect("read test data"))
        .expect("parse test data")
}

/// A chain state in a temporary datadir.
pub struct TestNode {
    pub dir: tempfile::TempDir,
    pub datadir: DataDir,
    pub chain: RwLock<Chainstate>,
}

impl TestNode {
    pub fn new(network: Network) -> Self {
        Self::with_params(ChainParams::new(network))
    }

    pub fn with_params(params: ChainParams) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let datadir = DataDir::open(dir.path()).expect("datadir");
        let chain = open_chainstate(params, &datadir).expect("open chainstate");
        TestNode {
            dir,
            datadir,
            chain: RwLock::new(chain),
        }
    }

    pub fn import(&self, files: &[PathBuf]) -> ImportSummary {
        import_files(&self.chain, files, &AtomicBool::new(false), false).expect("import")
    }
}
