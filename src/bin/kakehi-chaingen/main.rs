//! `kakehi-chaingen`: writes a valid regtest chain, deterministic from a
//! seed, with its own answer (the tip, the UTXO set's digest, filter
//! headers) and invalid blocks on its tip: an oracle for kakehi that shares
//! no code with kakehi's validation, UTXO table, store or filters (it
//! imports nothing from the `kakehi` library). Bitcoin Core's engine judges
//! its chains in `tests/it/chaingen.rs`; docs/chaingen.md describes them.

mod assemble;
mod coins;
mod dist;
mod finish;
mod generate;
mod invalid;
mod keys;
mod manifest;
mod output;
mod plan;
mod profile;
mod reorg;
mod sign;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::{CommandFactory, Parser};

use generate::{Config, Run};
use keys::KeyPool;
use profile::Profile;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Writes a valid regtest chain (blk files), its manifest and invalid
/// blocks on its tip, deterministically from --seed.
#[derive(Parser, Debug)]
#[command(name = "kakehi-chaingen", version, long_about = None)]
struct Cli {
    /// Chain size: ci (5,000 blocks, 200,000 UTXOs), testnet4 (120,000
    /// blocks, 5M UTXOs, 10M transactions), large (200,000 blocks, 20M UTXOs).
    #[arg(long, value_enum)]
    profile: Profile,
    /// Seed of every random choice and key: the same seed and flags give
    /// the same bytes.
    #[arg(long)]
    seed: u64,
    /// Output directory: created if absent, must be empty if present.
    #[arg(long)]
    out: PathBuf,
    /// Blocks on the best chain (the tip's height), overriding the profile.
    #[arg(long, value_parser = clap::value_parser!(u32).range(400..=500_000))]
    blocks: Option<u32>,
    /// Mean transactions per block, overriding the profile.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    txs_per_block: Option<u32>,
    /// Unspent outputs to aim at for the tip, overriding the profile.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1_000..=200_000_000))]
    live_utxos: Option<u64>,
    /// Signing threads (default: the machine's cores). The bytes do not
    /// depend on it.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    threads: Option<u32>,
    /// Also write utxos.txt, the UTXO text whose SHA-256 the manifest holds.
    #[arg(long)]
    write_utxos: bool,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut parameters = cli.profile.parameters();
    parameters.blocks = cli.blocks.unwrap_or(parameters.blocks);
    parameters.txs_per_block = cli.txs_per_block.unwrap_or(parameters.txs_per_block);
    parameters.live_utxos_target = cli.live_utxos.unwrap_or(parameters.live_utxos_target);
    if let Err(e) = profile::check(&parameters) {
        Cli::command()
            .error(clap::error::ErrorKind::ArgumentConflict, e)
            .exit();
    }
    let threads = cli.threads.map_or_else(
        || std::thread::available_parallelism().map_or(1, usize::from),
        |t| t as usize,
    );
    let created = prepare_out(&cli.out)?;
    let cfg = Config {
        profile: cli.profile.name().into(),
        seed: cli.seed,
        parameters,
        threads,
        out: cli.out.clone(),
    };
    let result = run(&cfg, cli.write_utxos);
    if result.is_err() {
        remove_output(&cli.out, created);
    }
    result
}

fn run(cfg: &Config, write_utxos: bool) -> anyhow::Result<()> {
    let started = Instant::now();
    let keys = KeyPool::derive(cfg.seed, cfg.threads);
    let (written, finished) = Run::new(cfg, &keys).blocks()?;
    let chain_secs = started.elapsed().as_secs_f64();
    let m = finish::finish(cfg, &keys, written, finished, write_utxos)?;
    eprintln!(
        "wrote {}: {} blocks to height {} (tip {}), {} stale, {} reorgs; {} transactions, \
         {} inputs; {} UTXOs ({} sat); {} invalid cases; {:.1} MiB in {} files",
        cfg.out.display(),
        m.block_records,
        m.tip_height,
        m.tip_hash,
        m.stale_blocks,
        m.reorgs.len(),
        m.stats.transactions,
        m.stats.inputs,
        m.utxo_count,
        m.utxo_total_sats,
        m.invalid.count,
        m.blk_bytes as f64 / (1024.0 * 1024.0),
        m.files.len()
    );
    eprintln!(
        "time: {:.1} s for the chain ({:.0} inputs signed/s on {} threads), {:.1} s in all",
        chain_secs,
        m.stats.inputs as f64 / chain_secs,
        cfg.threads,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Creates `out` if absent; refuses it unless it is an empty directory.
/// Whether it was created.
fn prepare_out(out: &Path) -> anyhow::Result<bool> {
    match std::fs::read_dir(out) {
        Ok(mut entries) => {
            anyhow::ensure!(
                entries.next().is_none(),
                "--out {} is not empty: refusing to mix chains (remove it or pick another)",
                out.display()
            );
            Ok(false)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(out)
                .with_context(|| format!("creating --out {}", out.display()))?;
            Ok(true)
        }
        Err(e) => Err(e).with_context(|| format!("reading --out {}", out.display())),
    }
}

/// After a failure: removes what the run wrote (the directory itself if it
/// created it), so no half-written chain is left behind.
fn remove_output(out: &Path, created: bool) {
    if created {
        let _ = std::fs::remove_dir_all(out);
    } else if let Ok(entries) = std::fs::read_dir(out) {
        for e in entries.flatten() {
            let p = e.path();
            let _ = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
        }
    }
}
