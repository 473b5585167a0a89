//! The `kakehi` command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

use anyhow::Context;
use bitcoin::Network;
use clap::{Parser, Subcommand};

use kakehi::chain::ChainParams;
use kakehi::node::{self, DataDir};

/// kakehi: a Bitcoin P2P indexing node. Validates every transaction
/// economically against its own UTXO store (the Sozu table), follows reorgs
/// without undo data, and serves BIP-158 compact filters over HTTP.
///
/// Signatures and scripts are NOT evaluated: kakehi checks every consensus
/// rule except script evaluation.
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
struct Cli {
    /// Network: bitcoin (mainnet), testnet (testnet3), testnet4, signet or regtest.
    #[arg(long, global = true, default_value = "regtest", value_parser = parse_network)]
    network: Network,
    /// Data directory [default: ~/.kakehi/<network>].
    #[arg(long, global = true)]
    datadir: Option<PathBuf>,
    /// Log format: human or json. Filter with RUST_LOG (default: info).
    #[arg(long, global = true, default_value = "human")]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the node: import files given with --import, then serve HTTP until Ctrl-C.
    Run {
        /// HTTP API address [default: 127.0.0.1:<3000 mainnet, 3001 testnet, 3002 regtest, 3003 signet, 3004 testnet4>].
        #[arg(long)]
        http: Option<SocketAddr>,
        /// blk-framed block files to import before serving (repeatable).
        #[arg(long)]
        import: Vec<PathBuf>,
    },
    /// Import blk-framed block files (Bitcoin Core blk*.dat framing) through the validation pipeline.
    Import {
        /// Files, imported in order.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print the UTXO set of the active chain, one line per output:
    /// `txid:vout value_sats scriptPubKey_hex height coinbase(0/1)`, sorted by txid then vout.
    DumpUtxos {
        /// Write to this file instead of standard output.
        #[arg(long)]
        output: Option<PathBuf>,
    },
}

fn parse_network(s: &str) -> Result<Network, String> {
    match s {
        "bitcoin" | "mainnet" | "main" => Ok(Network::Bitcoin),
        "testnet" | "testnet3" | "test" => Ok(Network::Testnet),
        "testnet4" => Ok(Network::Testnet4),
        "signet" => Ok(Network::Signet),
        "regtest" => Ok(Network::Regtest),
        _ => Err(format!(
            "unknown network {s:?} (expected bitcoin, testnet, testnet4, signet or regtest)"
        )),
    }
}

fn init_logging(format: &str) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sled=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        "json" => builder.json().init(),
        "human" => builder.init(),
        other => anyhow::bail!("unknown --log-format {other:?} (expected human or json)"),
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = init_logging(&cli.log_format) {
        eprintln!("error: {e:#}");
        return ExitCode::from(2);
    }
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let params = ChainParams::new(cli.network);
    let datadir_path = cli
        .datadir
        .clone()
        .unwrap_or_else(|| node::default_datadir(&params));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting tokio")?;
    let stop = node::shutdown_flag();
    {
        let _guard = runtime.enter();
        node::install_signal_handlers(stop.clone());
    }
    let datadir = DataDir::open(&datadir_path)?;
    let started = std::time::Instant::now();
    let chain = node::open_chainstate(params.clone(), &datadir)?;
    let tip = chain.index().tip();
    tracing::info!(network = params.name(), datadir = %datadir_path.display(), height = tip.height, block_hash = %tip.hash, ms = started.elapsed().as_millis() as u64, "chain state opened");
    let chain = Arc::new(RwLock::new(chain));
    match cli.command {
        Command::Import { files } => {
            let summary = kakehi::import::import_files(
                &chain,
                &files,
                &stop,
                std::io::IsTerminal::is_terminal(&std::io::stderr()),
            )?;
            print_summary(&summary);
            Ok(ExitCode::SUCCESS)
        }
        Command::Run { http, import } => {
            if !import.is_empty() {
                let stop2 = stop.clone();
                let chain2 = chain.clone();
                let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
                let summary = runtime
                    .block_on(tokio::task::spawn_blocking(move || {
                        kakehi::import::import_files(&chain2, &import, &stop2, progress)
                    }))
                    .context("import task")??;
                print_summary(&summary);
                if summary.interrupted {
                    return Ok(ExitCode::SUCCESS);
                }
            }
            let addr = http.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], params.http_port)));
            let state = kakehi::http::AppState { chain };
            let stop2 = stop.clone();
            runtime
                .block_on(async move {
                    let shutdown = async move {
                        while !stop2.load(Ordering::SeqCst) {
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        }
                    };
                    kakehi::http::serve(addr, state, shutdown).await
                })
                .with_context(|| format!("HTTP API on {addr}"))?;
            tracing::info!("stopped");
            Ok(ExitCode::SUCCESS)
        }
        Command::DumpUtxos { output } => {
            let mut cs = chain
                .write()
                .map_err(|_| anyhow::anyhow!("lock poisoned"))?;
            match output {
                Some(p) => {
                    let mut f = std::fs::File::create(&p)
                        .with_context(|| format!("creating {}", p.display()))?;
                    cs.dump_utxos(&mut f)?;
                }
                None => cs.dump_utxos(&mut std::io::stdout().lock())?,
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn print_summary(s: &kakehi::import::ImportSummary) {
    println!(
        "imported {} blocks in {:.1} s: {} accepted, {} already known, {} rejected, {} reorgs{}",
        s.blocks_read,
        s.seconds,
        s.accepted,
        s.duplicates,
        s.rejected.len(),
        s.reorgs,
        if s.interrupted { " (interrupted)" } else { "" }
    );
    for (hash, reason, detail) in &s.rejected {
        println!("  rejected {hash}: {reason} ({detail})");
    }
    if let Some(tip) = s.tip_hash {
        println!("tip: height {} hash {tip}", s.tip_height);
    }
}
