//! kakehi's integration tests, one test binary (`cargo test --test it`):
//! one module per subject, each documented in its own file. Linking one
//! binary instead of one per file is most of what the suite's build saves.
//!
//! All tests share one process and run on libtest's threads, so a test
//! must not rely on being alone: process-wide state (the storage fault
//! seam, sled's log watch, the process's memory) is taken in turns
//! ([`common::faults::SEAM`]) or in a child process of this binary
//! ([`common::alone`]).
//!
//! Tests that need what not every machine has (root, `/dev/fuse`) are
//! `#[ignore]`d with the reason; README.md's "Tests" gives the command that
//! runs them where the machine allows, and `.ci/run` runs it there.
//!
//! Filter by module: `cargo test --locked --test it -- regtest_a::`.

// The helpers shared with the benchmarks (`benches/*.rs` include these
// files by path).
#[path = "../common/mod.rs"]
mod common;
mod lazyfs;
mod sozu_common;

mod archive;
mod archive_node;
mod archive_p2p;
mod assumevalid;
mod backbone;
mod bip158_vectors;
mod chaingen;
mod cli;
mod corruption;
mod crash_import;
mod crash_loop;
mod disk_full;
mod group_overlap;
mod headers_file;
mod http_api;
mod http_ui;
mod invalid_blocks;
mod io_faults;
mod load_faults;
mod lookahead;
mod memory_budgets;
mod mempool;
mod mempool_core;
mod mempool_model;
mod mempool_relay;
mod muhash;
mod p2p_core;
mod p2p_kill;
mod p2p_low_work;
mod p2p_nodes;
mod power_loss;
mod regtest_a;
mod reindex;
mod rpc;
mod script_vectors;
mod scripts_core;
mod sled_watch;
mod snapshot_reads;
mod sozu_crash;
mod sozu_model;
mod style;
mod validation_regtest;
mod wallet_bdk;
