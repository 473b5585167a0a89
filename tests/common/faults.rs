//! Helpers of the storage-fault tests (`io_faults`, `power_loss`): a
//! regtest-a import in process, in groups of 100 blocks, and the state it
//! ends with.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use bitcoin::hex::DisplayHex;
use bitcoin::Network;
use kakehi::chain::ChainParams;
use kakehi::import::import_files;
use kakehi::muhash::{coin_bytes, MuHash3072};
use kakehi::node::{open_chainstate_with, DataDir};
use kakehi::pipeline::{Chainstate, GroupLimits};
use kakehi::store::fault::{self, FaultPlan, FaultReport, IoOp};
use kakehi::store::runs::RowOptions;
use kakehi::store::Budgets;
use parking_lot::Mutex;
use tempfile::TempDir;

/// The storage fault seam ([`kakehi::store::fault`]) is one per process,
/// and all the integration tests share one: a test that arms it holds
/// this lock from before its first [`fault::arm`] (its [`Suite::new`]
/// included) until its last [`fault::disarm`], so the tests of
/// `io_faults` and `power_loss` take turns.
pub static SEAM: Mutex<()> = Mutex::new(());

/// Groups of 100 blocks, whatever the time (the node's default also ends
/// a group after 1 s, which would make the number of syncs vary).
pub const LIMITS: GroupLimits = GroupLimits {
    max_blocks: 100,
    max_bytes: 32 * 1024 * 1024,
    max_age: std::time::Duration::from_secs(3600),
};

/// The index rows' memory bound (`index.rows_memory_mib`): 1 MiB, not the
/// default 16, so the 400-block import both appends to the row log (3
/// records) and writes run files and the row manifest (2 flushes): faults
/// and power cuts land in each. With the default every commit goes to the
/// log and no run file is ever written.
pub const ROWS_MEMORY: usize = 1 << 20;

pub fn open(dir: &Path) -> (DataDir, Chainstate) {
    let datadir = DataDir::open(dir).unwrap();
    let budgets = Budgets {
        rows: RowOptions {
            memory_bound: ROWS_MEMORY,
            ..RowOptions::default()
        },
        ..Budgets::default()
    };
    let mut cs =
        open_chainstate_with(ChainParams::new(Network::Regtest), &datadir, &budgets).unwrap();
    cs.set_group_limits(LIMITS);
    (datadir, cs)
}

/// Blocks of regtest-a imported: enough for 2 sealed archive epochs (144
/// blocks each, final 100 blocks below the tip) and 4 groups.
pub const BLOCKS: usize = 400;

pub fn import(chain: &Mutex<Chainstate>, blocks: &Path) -> Result<(), String> {
    import_files(
        chain,
        &[blocks.to_path_buf()],
        &AtomicBool::new(false),
        false,
    )
    .map(|_| ())
    .map_err(|e| error_chain(&e))
}

/// An error and all its sources, one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(" / ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// What an uninterrupted import ends with: tip hash, MuHash, filter header
/// at the tip, archive commitment, and a digest of the index rows' answers
/// (the address index of sample scripts: the rows of every committed
/// block must survive a fault or a power cut).
#[derive(Debug, PartialEq, Eq)]
pub struct EndState {
    pub tip: String,
    pub muhash: String,
    pub filter_header: String,
    pub commitment: String,
    pub address_index: String,
}

pub fn end_state(cs: &Chainstate) -> EndState {
    let snap = cs.snapshot();
    let tip = snap.index().tip();
    let (_, filter_header) = snap.filter(tip.id).unwrap().unwrap();
    EndState {
        tip: tip.hash.to_string(),
        muhash: snap.utxo_stats().muhash,
        filter_header: filter_header.to_string(),
        commitment: snap.archive().commitment().to_lower_hex_string(),
        address_index: address_digest(&snap),
    }
}

/// SHA-256 of what the address index answers (summary and whole history)
/// for the scripts of every 40th line of regtest-a's final UTXO list.
fn address_digest(snap: &kakehi::snapshot::ChainSnapshot) -> String {
    use bitcoin::hashes::{sha256, Hash};
    let text = std::fs::read_to_string(super::data("regtest-a/utxos.txt")).unwrap();
    let mut answers = String::new();
    for line in text.lines().step_by(40) {
        let script = line.split_whitespace().nth(2).unwrap();
        let script = bitcoin::ScriptBuf::from_hex(script).unwrap();
        let sh = sha256::Hash::hash(script.as_bytes()).to_byte_array();
        let summary = snap.script_summary(&sh).unwrap();
        let txs = snap.script_txs(&sh, None, usize::MAX).unwrap();
        answers.push_str(&format!("{summary:?} {txs:?}\n"));
    }
    assert!(answers.contains("HistoryTx"), "no address history");
    sha256::Hash::hash(answers.as_bytes()).to_string()
}

/// The MuHash of the UTXO table's coins at the tip, from scratch.
pub fn rebuilt_muhash(cs: &mut Chainstate) -> String {
    let mut state = MuHash3072::new();
    cs.for_each_utxo(&mut |op, coin, h| {
        let coin = kakehi::sozu::Coin {
            height: h,
            ..coin.clone()
        };
        state.insert(&coin_bytes(op, &coin));
    })
    .unwrap();
    state.core_hex()
}

/// The uninterrupted import of `blocks` into `root` with the seam armed to
/// count (nothing fails): its end state and every write and sync it made,
/// by path and kind.
pub fn reference_run(root: &Path, blocks: &Path) -> (EndState, SeenOps) {
    let (_datadir, cs) = open(root);
    let chain = Mutex::new(cs);
    fault::arm(FaultPlan {
        under: root.to_path_buf(),
        path_contains: String::new(),
        path_excludes: None,
        op: IoOp::Write,
        after: u64::MAX,
        errno: 5,
    });
    import(&chain, blocks).expect("uninterrupted import");
    let seen = fault::disarm().seen;
    let state = end_state(&chain.lock());
    assert_eq!(
        chain.lock().snapshot().archive().epochs().len(),
        2,
        "epochs sealed by the reference"
    );
    (state, seen)
}

/// Reopens the datadir at `root` after a failure (the start-up recovery
/// runs) and checks it: its tip at or above `published` (the last tip
/// published before the failure), its kept MuHash equal to one rebuilt
/// from the UTXO table; then resumes the import of `blocks` and checks it
/// ends at `reference`. Returns the reopened tip height.
pub fn check_recovery(
    root: &Path,
    blocks: &Path,
    published: u32,
    reference: &EndState,
    case: &str,
) -> u32 {
    let (datadir, mut cs) = open(root);
    let reopened = cs.index().tip_height();
    assert!(
        reopened >= published,
        "{case}: reopened at {reopened}, below the published {published}"
    );
    assert_eq!(
        cs.snapshot().utxo_stats().muhash,
        rebuilt_muhash(&mut cs),
        "{case}: the kept MuHash differs from the UTXO table's at {reopened}"
    );
    let chain = Mutex::new(cs);
    import(&chain, blocks).unwrap_or_else(|e| panic!("{case}: resume failed: {e}"));
    assert_eq!(&end_state(&chain.lock()), reference, "{case}");
    drop(chain);
    drop(datadir);
    reopened
}

/// Every write and sync of a whole import, by path and kind
/// ([`reference_run`]).
pub type SeenOps = std::collections::BTreeMap<(PathBuf, IoOp), u64>;

/// The shared start of a fault suite: a seeded RNG (replayed with
/// `KAKEHI_SEED`), regtest-a's first [`BLOCKS`] blocks in a file, and the
/// uninterrupted reference import with the writes and syncs it made.
pub struct Suite {
    /// The RNG of the suite's choices.
    pub rng: super::Rng,
    /// Its seed, for the log.
    pub seed: u64,
    /// The block file.
    pub blocks: PathBuf,
    /// The reference import's end state.
    pub reference: EndState,
    /// The reference import's writes and syncs.
    pub seen: SeenOps,
    _scratch: TempDir,
}

impl Suite {
    /// Sets the suite up; `what` names its seed in the log.
    pub fn new(what: &str) -> Self {
        let rng = super::Rng::from_env_or_clock(what);
        let seed = rng.seed();
        let scratch = super::tempdir();
        let blocks = super::regtest_a_prefix(scratch.path(), BLOCKS);
        let dir = super::tempdir();
        let (reference, seen) = reference_run(&dir.path().canonicalize().unwrap(), &blocks);
        Suite {
            rng,
            seed,
            blocks,
            reference,
            seen,
            _scratch: scratch,
        }
    }

    /// The reference import's operations of kind `op` on paths containing
    /// `contains` (empty: all).
    pub fn ops(&self, contains: &str, op: IoOp) -> u64 {
        self.seen
            .iter()
            .filter(|((p, o), _)| *o == op && p.to_string_lossy().contains(contains))
            .map(|(_, n)| n)
            .sum()
    }
}

/// An import into a fresh datadir with one fault planned, stopped where
/// the fault stopped it.
pub struct FaultedImport {
    /// The datadir's root (canonical).
    pub root: PathBuf,
    /// The open datadir (its lock held).
    pub datadir: DataDir,
    /// The chain state the import wrote.
    pub chain: Mutex<Chainstate>,
    /// The import's result.
    pub result: Result<(), String>,
    /// What the seam saw, disarmed right after the import.
    pub report: FaultReport,
    _dir: TempDir,
}

impl FaultedImport {
    /// Imports `blocks` into a fresh datadir with `fault(root)` armed.
    pub fn run(blocks: &Path, fault: impl FnOnce(PathBuf) -> FaultPlan) -> Self {
        Self::run_in(super::tempdir(), blocks, fault)
    }

    /// [`FaultedImport::run`] with the datadir in `dir` (empty).
    pub fn run_in(dir: TempDir, blocks: &Path, fault: impl FnOnce(PathBuf) -> FaultPlan) -> Self {
        let root = dir.path().canonicalize().unwrap();
        let (datadir, cs) = open(&root);
        let chain = Mutex::new(cs);
        fault::arm(fault(root.clone()));
        let result = import(&chain, blocks);
        let report = fault::disarm();
        FaultedImport {
            root,
            datadir,
            chain,
            result,
            report,
            _dir: dir,
        }
    }

    /// Closes the node (chain state, then the datadir's lock) and keeps the
    /// datadir: it lives as long as the returned directory.
    pub fn close(self) -> TempDir {
        drop(self.chain);
        drop(self.datadir);
        self._dir
    }

    /// `path` relative to the datadir, for the log.
    pub fn shown(&self, path: &Path) -> String {
        path.strip_prefix(&self.root)
            .unwrap_or(path)
            .display()
            .to_string()
    }
}
