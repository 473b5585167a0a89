//! The `kakehi` command line.
//!
//! Every option can come from a flag, a `KAKEHI_*` environment variable or
//! the `--config` TOML file (precedence in that order, then the built-in
//! default; see `kakehi::config`). Exit status: 0 on success and on a
//! requested shutdown, 1 on an error (the message names the file, key or
//! datadir involved), 2 on a usage error.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use bitcoin::Network;
use clap::{Args, Parser, Subcommand};
use parking_lot::Mutex;

use kakehi::chain::assumevalid::AssumeValid;
use kakehi::chain::index::IndexLoadError;
use kakehi::chain::ChainParams;
use kakehi::config::{self, Config, Layer, LogFormat, PeerAddress};
use kakehi::mempool::Mempool;
use kakehi::node::DataDir;
use kakehi::pipeline::{Chainstate, GroupLimits, PipelineError};
use kakehi::sozu::{SozuConfig, SozuTable};

/// mimalloc: the Sozu table's block writes decode and re-encode thousands
/// of pages per block; under glibc's allocator `malloc`/`free` were ~22 % of
/// its samples, and blocks connect ~20 % faster with mimalloc
/// (`docs/benchmarks-history.md`, Sozu round 4).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// kakehi: a Bitcoin P2P indexing node. Validates every block against its
/// own UTXO store (the Sozu table), follows reorgs without undo data, and
/// serves BIP-158 compact filters over HTTP.
///
/// Every consensus rule is checked; scripts and signatures by Bitcoin Core's
/// own interpreter, skipped only below the assumevalid block as Core skips
/// them (--assumevalid; regtest verifies every script).
///
/// Options come from flags, then KAKEHI_* environment variables, then the
/// --config file, then built-in defaults (first set wins). `kakehi config
/// show` prints the result. SIGINT/SIGTERM stop at the next block boundary.
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
struct Cli {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    command: Command,
}

/// Options of every subcommand.
#[derive(Args, Debug, Default)]
#[command(next_help_heading = "Common options (every subcommand)")]
struct Common {
    /// Network: bitcoin (also mainnet), testnet (testnet3), testnet4, signet
    /// or regtest. [default: regtest] [env: KAKEHI_NETWORK]
    #[arg(long, global = true, value_parser = config::parse_network)]
    network: Option<Network>,
    /// Data directory (block files, index, UTXO table, lock file).
    /// [default: ~/.kakehi/<network>] [env: KAKEHI_DATADIR]
    #[arg(long, global = true, value_name = "DIR")]
    datadir: Option<PathBuf>,
    /// TOML configuration file (examples: config/<network>.toml). Unknown
    /// keys and bad values are errors. [default: none]
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Log format on standard error: human or json (one object per line).
    /// [default: human] [env: KAKEHI_LOG_FORMAT]
    #[arg(long, global = true, value_name = "FORMAT")]
    log_format: Option<LogFormat>,
    /// Log filter, tracing/RUST_LOG directives (e.g. "debug",
    /// "info,kakehi::pipeline=debug"). [default: info,sled=warn]
    /// [env: RUST_LOG, KAKEHI_LOG_FILTER]
    #[arg(long, global = true, value_name = "DIRECTIVES")]
    log_filter: Option<String>,
    /// Block hash whose ancestors' scripts need not be verified, under
    /// Bitcoin Core's conditions (in the best header chain, which has the
    /// minimum chainwork, two weeks of work below it), or 0 to verify every
    /// script. [default: the network's, from Bitcoin Core 31.99; 0 on
    /// regtest] [env: KAKEHI_ASSUMEVALID]
    #[arg(long, global = true, value_name = "HASH|0")]
    assumevalid: Option<AssumeValid>,
    /// Do not keep the address index (Esplora's /address and /scripthash
    /// routes then answer 503; saves its disk, see docs/operations.md).
    /// Turned on again later, it is rebuilt from the block files.
    /// [default: on] [env: KAKEHI_ADDRESS_INDEX=false]
    #[arg(long, global = true)]
    no_address_index: bool,
}

// Parsed once at start: the size of the `Run` variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Run the node: import the files given with --import, then serve the
    /// HTTP API until SIGINT/SIGTERM.
    Run {
        /// HTTP API address, ADDR:PORT (TCP). [default: 127.0.0.1:<3000
        /// mainnet, 3001 testnet, 3002 regtest, 3003 signet, 3004 testnet4>]
        /// [env: KAKEHI_HTTP]
        #[arg(long, value_name = "ADDR:PORT")]
        http: Option<SocketAddr>,
        /// Open HTTP connections per client IP address (IPv6: per /64);
        /// more are closed at once. 0 for no cap (behind a reverse proxy
        /// every client has its address). [default: 0]
        /// [env: KAKEHI_HTTP_MAX_CONNECTIONS_PER_IP]
        #[arg(long, value_name = "N", value_parser = config::parse_connections_per_ip)]
        http_max_connections_per_ip: Option<usize>,
        /// HTTP requests per second per client IP address, sustained (429
        /// beyond); fractions allowed, 0 for no limit. [default: 0]
        /// [env: KAKEHI_HTTP_RATE_LIMIT_PER_SECOND]
        #[arg(long, value_name = "PER_SECOND", value_parser = config::parse_rate_limit)]
        http_rate_limit: Option<f64>,
        /// HTTP requests an idle client IP may send at once under the rate
        /// limit. [default: 20] [env: KAKEHI_HTTP_RATE_LIMIT_BURST]
        #[arg(long, value_name = "N", value_parser = config::parse_rate_burst)]
        http_rate_burst: Option<u32>,
        /// JSON-RPC address, ADDR:PORT (TCP), or `off`. [default:
        /// 127.0.0.1:<Core's RPC port: 8332 mainnet, 18332 testnet, 18443
        /// regtest, 38332 signet, 48332 testnet4>] [env: KAKEHI_RPC]
        #[arg(long, value_name = "ADDR:PORT|off", value_parser = parse_rpc_arg)]
        rpc: Option<RpcAddr>,
        /// JSON-RPC user, with --rpc-password (bitcoind's -rpcuser); the
        /// cookie file always works. [env: KAKEHI_RPC_USER]
        #[arg(long, value_name = "USER")]
        rpc_user: Option<String>,
        /// JSON-RPC password of --rpc-user (bitcoind's -rpcpassword).
        /// [env: KAKEHI_RPC_PASSWORD]
        #[arg(long, value_name = "PASSWORD")]
        rpc_password: Option<String>,
        /// JSON-RPC credential `user:salt$hmac` (bitcoind's -rpcauth, made by
        /// Core's share/rpcauth/rpcauth.py; repeatable).
        /// [env: KAKEHI_RPC_AUTH, comma-separated]
        #[arg(long, value_name = "USER:SALT$HMAC")]
        rpc_auth: Vec<String>,
        /// P2P address to accept inbound peers on, ADDR:PORT (TCP).
        /// [default: none, no inbound] [env: KAKEHI_LISTEN]
        #[arg(long, value_name = "ADDR:PORT")]
        listen: Option<SocketAddr>,
        /// Connect only to this peer, HOST:PORT, host an IP or a name
        /// (repeatable; like bitcoind -connect). [default: none]
        /// [env: KAKEHI_CONNECT, comma-separated]
        #[arg(long, value_name = "HOST:PORT")]
        connect: Vec<PeerAddress>,
        /// Also connect to this peer, HOST:PORT, host an IP or a name
        /// (repeatable; like bitcoind -addnode). [default: none]
        /// [env: KAKEHI_ADDNODE, comma-separated]
        #[arg(long, value_name = "HOST:PORT")]
        addnode: Vec<PeerAddress>,
        /// blk-framed block files (Bitcoin Core blk*.dat framing) to import
        /// before serving, in order (repeatable).
        #[arg(long, value_name = "FILE", num_args = 1..)]
        import: Vec<PathBuf>,
        #[command(flatten)]
        mempool: MempoolArgs,
    },
    /// Import blk-framed block files (Bitcoin Core blk*.dat framing) through
    /// the validation pipeline. A bad file (truncated, garbage, another
    /// network's magic) is refused whole, before any of its blocks is stored.
    Import {
        /// Files, imported in order.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Print the UTXO set of the active chain, one line per output:
    /// `txid:vout value_sats scriptPubKey_hex height coinbase(0/1)`, sorted
    /// by txid then vout. Sorts in runs of 64 MiB: a larger set uses
    /// temporary files in the datadir (about its text's size), removed at
    /// the end.
    DumpUtxos {
        /// Write to this file instead of standard output.
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Rebuild the chain state (block index, UTXO table, filters, spent
    /// outputs, archive) from the datadir's block files, as Bitcoin Core's
    /// -reindex-chainstate: the way forward for a datadir whose UTXO table
    /// has an older format. Needs the block files' size again in free disk
    /// until it ends; interrupted, it starts over (or finishes its swap)
    /// when run again.
    ReindexChainstate,
    /// Configuration commands.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Archival proof commands (docs/archive.md).
    #[command(subcommand)]
    Proof(ProofCommand),
}

/// The mempool's options of `kakehi run` (docs/mempool.md).
#[derive(Args, Debug, Default)]
#[command(next_help_heading = "Mempool options")]
struct MempoolArgs {
    /// Memory limit of the mempool, MiB; past it the lowest-feerate
    /// packages are evicted and the minimum feerate rises (as bitcoind
    /// -maxmempool). [default: 300] [env: KAKEHI_MEMPOOL_MAX_MIB]
    #[arg(long, value_name = "MIB", value_parser = config::parse_mempool_max_mib)]
    mempool_max_mib: Option<usize>,
    /// Unconfirmed transactions older than this leave the mempool, hours
    /// (as bitcoind -mempoolexpiry). [default: 336]
    /// [env: KAKEHI_MEMPOOL_EXPIRY_HOURS]
    #[arg(long, value_name = "HOURS", value_parser = config::parse_expiry_hours)]
    mempool_expiry_hours: Option<u64>,
    /// Do not save the mempool to <datadir>/mempool.dat at a clean stop
    /// nor reload it at start (as bitcoind -persistmempool=0).
    /// [default: saved] [env: KAKEHI_MEMPOOL_PERSIST=false]
    #[arg(long)]
    no_persist_mempool: bool,
    /// Lowest feerate a transaction must pay to enter the mempool and be
    /// relayed, sats per 1,000 vbytes (as bitcoind -minrelaytxfee, which
    /// is in BTC/kvB). [default: 100] [env: KAKEHI_MIN_RELAY_FEERATE]
    #[arg(long, value_name = "SAT_PER_KVB", value_parser = config::parse_min_relay_feerate)]
    min_relay_feerate: Option<u64>,
}

#[derive(Subcommand, Debug)]
enum ProofCommand {
    /// Verify a proof (the JSON the HTTP proof routes return, as is, or its
    /// binary form) with no database, against an epoch root or the archive
    /// commitment (64 hex characters each). Prints one SPENT or ABSENT line
    /// per outpoint; exits 1 with the reason if any byte was tampered with.
    Verify {
        /// Epoch Merkle root the proof must lead to.
        #[arg(
            long,
            value_name = "HEX",
            conflicts_with = "commitment",
            required_unless_present = "commitment"
        )]
        root: Option<String>,
        /// Archive commitment (GET /archive/commitment) the proof must lead to.
        #[arg(long, value_name = "HEX")]
        commitment: Option<String>,
        /// The proof file.
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Print the effective configuration (flags > environment > file >
    /// defaults) as TOML, in the --config file format.
    Show,
}

impl Cli {
    /// The command line as a configuration layer.
    fn layer(&self) -> Layer {
        let mut l = Layer {
            network: self.common.network,
            datadir: self.common.datadir.clone(),
            log_format: self.common.log_format,
            log_filter: self.common.log_filter.clone(),
            assumevalid: self.common.assumevalid,
            address_index: self.common.no_address_index.then_some(false),
            ..Layer::default()
        };
        if let Command::Run {
            http,
            http_max_connections_per_ip,
            http_rate_limit,
            http_rate_burst,
            rpc,
            rpc_user,
            rpc_password,
            rpc_auth,
            listen,
            connect,
            addnode,
            mempool,
            ..
        } = &self.command
        {
            l.mempool_max_mib = mempool.mempool_max_mib;
            l.mempool_expiry_hours = mempool.mempool_expiry_hours;
            l.mempool_persist = mempool.no_persist_mempool.then_some(false);
            l.min_relay_feerate = mempool.min_relay_feerate;
            l.http = *http;
            l.http_max_connections_per_ip = *http_max_connections_per_ip;
            l.http_rate_limit = *http_rate_limit;
            l.http_rate_burst = *http_rate_burst;
            l.rpc = rpc.as_ref().map(|r| r.0);
            l.rpc_user = rpc_user.clone();
            l.rpc_password = rpc_password.clone();
            l.rpc_auth = (!rpc_auth.is_empty()).then(|| rpc_auth.clone());
            l.listen = *listen;
            l.connect = (!connect.is_empty()).then(|| connect.clone());
            l.addnode = (!addnode.is_empty()).then(|| addnode.clone());
        }
        l
    }
}

/// `--rpc`: an address, or `off` (`None`).
#[derive(Clone, Copy, Debug)]
struct RpcAddr(Option<SocketAddr>);

fn parse_rpc_arg(s: &str) -> Result<RpcAddr, String> {
    config::parse_rpc_address(s).map(RpcAddr)
}

/// Resolves the configuration: CLI > environment > file > defaults. Also
/// returns the `KAKEHI_*` variables no option reads.
fn load_config(cli: &Cli) -> anyhow::Result<(Config, Vec<String>)> {
    let env = Layer::from_env(
        std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
    )?;
    let file = match &cli.common.config {
        Some(path) => Layer::from_file(path)?,
        None => Layer::default(),
    };
    Ok((
        Config::resolve(&[&cli.layer(), &env, &file]),
        env.unknown_env.clone(),
    ))
}

fn init_logging(config: &Config) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log.filter)
        .with_context(|| format!("bad log filter {:?}", config.log.filter))?;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let fmt = tracing_subscriber::fmt::layer()
        // Colours only on a terminal: a log file or journald gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let fmt = match config.log.format {
        LogFormat::Json => fmt.json().with_filter(filter).boxed(),
        LogFormat::Human => fmt.with_filter(filter).boxed(),
    };
    // sled's `log` records reach tracing through `tracing-log` (installed
    // by `init`); its background failures stop the node's writes.
    tracing_subscriber::registry()
        .with(fmt)
        .with(kakehi::store::sled_watch::layer())
        .init();
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (config, unknown_env) = match load_config(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {}", render(&e));
            return ExitCode::from(2);
        }
    };
    if let Command::Proof(ProofCommand::Verify {
        root,
        commitment,
        file,
    }) = &cli.command
    {
        // Needs no datadir and no configuration: a pure check.
        return match kakehi::archive::cli::verify_command(
            root.as_deref(),
            commitment.as_deref(),
            file,
        ) {
            Ok(report) => {
                print!("{report}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Command::Config(ConfigCommand::Show) = cli.command {
        return match config.to_toml() {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if let Err(e) = init_logging(&config) {
        eprintln!("error: {e:#}");
        return ExitCode::from(2);
    }
    for var in unknown_env {
        tracing::warn!(%var, "environment variable ignored: no option reads it (a typo?)");
    }
    let json = config.log.format == LogFormat::Json;
    match run(cli.command, config) {
        Ok(code) => code,
        Err(e) => {
            let msg = render(&e);
            if json {
                // Log collectors see the error as a log record too.
                tracing::error!("{msg}");
            }
            eprintln!("error: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// The UTXO table's configuration from `[sozu]`.
fn sozu_config(config: &Config) -> SozuConfig {
    SozuConfig {
        shards: config.sozu.shards,
        ram_mib: config.sozu.ram_mib,
        ..SozuConfig::default()
    }
}

/// Opens the chain state with the configured UTXO table.
fn open_chainstate(config: &Config, datadir: &DataDir) -> anyhow::Result<Chainstate> {
    let params = ChainParams::new(config.network);
    kakehi::reindex::check_no_swap_pending(datadir.path())?;
    let sozu = sozu_config(config);
    let utxo = datadir.path().join("utxo");
    let table = SozuTable::open(&utxo, sozu)
        .with_context(|| format!("opening the UTXO table in {}", utxo.display()))?;
    match Chainstate::open(params, datadir.path(), Box::new(table), &config.budgets()) {
        Ok(mut c) => {
            c.set_group_limits(GroupLimits::NODE_DEFAULT);
            c.set_address_index(config.index.address, &mut |p| {
                let percent = 100.0 * f64::from(p.height) / f64::from(p.tip_height.max(1));
                tracing::info!(
                    height = p.height,
                    tip_height = p.tip_height,
                    rows = p.rows,
                    "building the address index: {percent:.1}%"
                );
            })
            .context("building the address index from the block files")?;
            Ok(c)
        }
        Err(PipelineError::Index(IndexLoadError::WrongGenesis)) => anyhow::bail!(
            "datadir {} holds another network's chain, not {}: pass that network's \
             --network or another --datadir",
            datadir.path().display(),
            ChainParams::new(config.network).name()
        ),
        Err(e) => Err(anyhow::Error::new(e).context(format!(
            "opening the chain state in {} (see docs/operations.md, \"Corruption\")",
            datadir.path().display()
        ))),
    }
}

/// `error: a: b: c` from an error chain, leaving out a cause whose text the
/// previous message already ends with (`#[error("x: {0}")]` + `#[from]`).
fn render(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let msg = cause.to_string();
        if out.ends_with(&msg) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&msg);
    }
    out
}

fn run(command: Command, config: Config) -> anyhow::Result<ExitCode> {
    // Before any store opens, as Core's init.cpp does.
    let fd_limit = kakehi::fds::raise_limit(kakehi::fds::WANTED_FD_LIMIT);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting tokio")?;
    let stop = kakehi::node::shutdown_flag();
    {
        let _guard = runtime.enter();
        kakehi::node::install_signal_handlers(stop.clone());
    }
    if config.datadir.exists() && !config.datadir.is_dir() {
        anyhow::bail!(
            "datadir {} exists but is not a directory",
            config.datadir.display()
        );
    }
    if matches!(command, Command::DumpUtxos { .. }) && !config.datadir.exists() {
        // A dump reads a datadir; it must not create an empty one.
        anyhow::bail!(
            "datadir {} does not exist: nothing to dump (check --datadir and --network)",
            config.datadir.display()
        );
    }
    let datadir = DataDir::open(&config.datadir)?;
    if let Command::ReindexChainstate = command {
        return reindex(&config, &datadir, &stop);
    }
    let started = std::time::Instant::now();
    let mut chain = open_chainstate(&config, &datadir)?;
    chain.set_assume_valid(config.validation.assumevalid);
    let tip = chain.index().tip();
    tracing::info!(
        network = chain.params().name(),
        datadir = %config.datadir.display(),
        height = tip.height,
        block_hash = %tip.hash,
        ms = started.elapsed().as_millis() as u64,
        "chain state opened"
    );
    match config.validation.assumevalid {
        AssumeValid::Off => tracing::info!(
            assumevalid = "0",
            sha256 = kakehi::validation::script::sha256_implementation(),
            "script verification: every script, by Bitcoin Core's interpreter"
        ),
        AssumeValid::Block(hash) => tracing::info!(
            assumevalid = %hash,
            sha256 = kakehi::validation::script::sha256_implementation(),
            "script verification: by Bitcoin Core's interpreter, skipped for ancestors of the \
             assumevalid block more than two weeks of work below the best header"
        ),
    }
    let chain = Arc::new(Mutex::new(chain));
    match command {
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
        Command::Run { import, .. } => run_node(&runtime, chain, import, &config, stop, fd_limit),
        Command::DumpUtxos { output } => {
            let mut cs = chain.lock();
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
        // Handled in main() before the datadir is opened, and above.
        Command::Config(ConfigCommand::Show) | Command::Proof(_) | Command::ReindexChainstate => {
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `kakehi reindex-chainstate`.
fn reindex(config: &Config, datadir: &DataDir, stop: &AtomicBool) -> anyhow::Result<ExitCode> {
    let summary = kakehi::reindex::reindex_chainstate(
        datadir.path(),
        ChainParams::new(config.network),
        sozu_config(config),
        config.budgets(),
        stop,
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        &mut |cs| {
            cs.set_group_limits(GroupLimits::NODE_DEFAULT);
            cs.set_assume_valid(config.validation.assumevalid);
            cs.set_address_index(config.index.address, &mut |_| {})
        },
    )?;
    match summary {
        Some(s) => print_summary(&s),
        None => println!("finished the swap of an earlier reindex-chainstate"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `kakehi run`: imports, then P2P and HTTP until a shutdown request.
fn run_node(
    runtime: &tokio::runtime::Runtime,
    chain: Arc<Mutex<Chainstate>>,
    import: Vec<PathBuf>,
    config: &Config,
    stop: Arc<AtomicBool>,
    fd_limit: Option<kakehi::fds::FdLimit>,
) -> anyhow::Result<ExitCode> {
    if !import.is_empty() {
        let stop2 = stop.clone();
        let chain2 = chain.clone();
        let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let task = runtime.spawn_blocking(move || {
            kakehi::import::import_files(&chain2, &import, &stop2, progress)
        });
        let summary = runtime.block_on(task).context("import task")??;
        print_summary(&summary);
        if summary.interrupted {
            return Ok(ExitCode::SUCCESS);
        }
    }

    // P2P: inbound only with --listen; outbound to --connect peers only
    // (no DNS seeds then), else --addnode peers plus the network's DNS seeds.
    let resolve = |v: &[PeerAddress]| -> anyhow::Result<Vec<std::net::SocketAddr>> {
        let mut out = Vec::new();
        for p in v {
            out.extend(p.resolve().with_context(|| format!("resolving peer {p}"))?);
        }
        Ok(out)
    };
    let mut p2p_config = kakehi::p2p::P2pConfig::default();
    p2p_config.listen = config.p2p.listen;
    p2p_config.connect = resolve(&config.p2p.connect)?;
    p2p_config.addnode = resolve(&config.p2p.addnode)?;
    p2p_config.dns_seeds = config.p2p.connect.is_empty();
    p2p_config.addr_file = Some(config.datadir.join("peers.json"));
    let mut http_config = kakehi::http::HttpConfig {
        max_connections_per_ip: config.http.max_connections_per_ip,
        rate_limit_per_ip: (config.http.rate_limit_per_second > 0.0).then_some(
            kakehi::http::RateLimit {
                per_second: config.http.rate_limit_per_second,
                burst: config.http.rate_limit_burst,
            },
        ),
        ..kakehi::http::HttpConfig::default()
    };
    apply_fd_budget(fd_limit, &mut p2p_config, &mut http_config)?;
    let snapshots = chain.lock().snapshots();
    let mempool = Arc::new(Mempool::new(
        snapshots.clone(),
        config.mempool.mempool_config(),
    ));
    let (p2p_stop_tx, p2p_stop_rx) = tokio::sync::watch::channel(false);
    let listen = p2p_config.listen;
    let (p2p, mut p2p_task) = {
        let _guard = runtime.enter();
        kakehi::node::start_p2p_with_mempool(
            chain.clone(),
            Some(mempool.clone()),
            p2p_config,
            p2p_stop_rx,
        )
    };
    if let Some(addr) = listen {
        // A listen address that cannot be bound is an error at start, as
        // the HTTP address's is (not a node that runs without P2P).
        let bound = runtime.block_on(async {
            tokio::select! {
                a = p2p.local_addr() => Ok(a),
                ended = &mut p2p_task => Err(ended),
            }
        });
        match bound {
            Ok(_) => {}
            Err(Ok(Err(e))) => return Err(anyhow::Error::new(e).context(format!("P2P on {addr}"))),
            Err(ended) => anyhow::bail!("P2P on {addr}: the P2P task ended at start: {ended:?}"),
        }
    }

    spawn_group_flusher(runtime, chain.clone(), stop.clone());
    let addr = config.http.address;
    start_mempool(&mempool, config, &p2p, stop.clone())?;
    let state = kakehi::http::AppState {
        snapshots,
        p2p: Some(p2p),
        mempool: Some(mempool.clone()),
    };
    let (rpc_stop_tx, rpc_task, _cookie) = match start_rpc(runtime, config, &state)? {
        Some((tx, task, cookie)) => (Some(tx), Some(task), Some(cookie)),
        None => (None, None, None),
    };
    let stop2 = stop.clone();
    let chain2 = chain.clone();
    runtime
        .block_on(async move {
            // Until a shutdown request, or a storage failure that stopped
            // writes (then blocks would only be downloaded and dropped).
            let shutdown = async move {
                while !(stop2.load(Ordering::SeqCst)
                    || chain2
                        .try_lock()
                        .is_some_and(|cs| cs.write_failure().is_some()))
                {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            };
            kakehi::http::serve_with(addr, state, http_config, shutdown).await
        })
        .with_context(|| format!("HTTP API on {addr}"))?;
    if let (Some(tx), Some(task)) = (rpc_stop_tx, rpc_task) {
        let _ = tx.send(true);
        match runtime.block_on(task) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!("JSON-RPC server: {e}"),
            Err(e) => tracing::error!("JSON-RPC task: {e}"),
        }
    }
    let _ = p2p_stop_tx.send(true);
    match runtime.block_on(p2p_task) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!("P2P layer: {e}"),
        Err(e) => tracing::error!("P2P task: {e}"),
    }
    stop.store(true, Ordering::SeqCst);
    if config.mempool.persist {
        match mempool.save() {
            Ok(n) => tracing::info!(transactions = n, "mempool saved to mempool.dat"),
            Err(e) => tracing::error!("saving the mempool: {e}"),
        }
    }
    if let Some(e) = chain.lock().write_failure() {
        anyhow::bail!("stopped on a storage failure: {e}");
    }
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// The JSON-RPC server's stop signal, its task, and the cookie file
/// (removed when dropped).
type RpcRunning = (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<std::io::Result<()>>,
    kakehi::rpc::Cookie,
);

/// Starts the JSON-RPC server when `rpc.address` is not off: writes the
/// cookie file, binds (an address that cannot be bound is an error at
/// start) and serves until the returned sender says stop.
fn start_rpc(
    runtime: &tokio::runtime::Runtime,
    config: &Config,
    state: &kakehi::http::AppState,
) -> anyhow::Result<Option<RpcRunning>> {
    let Some(addr) = config.rpc.address else {
        return Ok(None);
    };
    let cookie = kakehi::rpc::Cookie::write(&config.datadir)?;
    let mut credentials = kakehi::rpc::Credentials::default();
    credentials.add_plain(kakehi::rpc::COOKIE_USER, cookie.password());
    match (&config.rpc.user, &config.rpc.password) {
        (Some(u), Some(p)) => credentials.add_plain(u, p),
        (None, None) => {}
        _ => anyhow::bail!("rpc.user and rpc.password go together"),
    }
    for entry in &config.rpc.auth {
        credentials.add_rpcauth(entry)?;
    }
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(addr))
        .with_context(|| format!("JSON-RPC on {addr}"))?;
    tracing::info!(%addr, cookie = %cookie.path().display(), "JSON-RPC listening");
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    let rpc_config = kakehi::rpc::RpcConfig {
        credentials,
        ..Default::default()
    };
    let task = runtime.spawn(kakehi::rpc::serve_listener(
        listener,
        state.clone(),
        rpc_config,
        async move {
            let _ = rx.wait_for(|s| *s).await;
        },
    ));
    Ok(Some((tx, task, cookie)))
}

/// Starts the mempool (the one the P2P layer relays through): announcing
/// every accepted transaction to peers, reloaded from `mempool.dat` when
/// `mempool.persist` is on, following the chain's tip on a thread of its
/// own.
fn start_mempool(
    mempool: &Arc<Mempool>,
    config: &Config,
    p2p: &kakehi::p2p::P2pHandle,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let relay = p2p.clone();
    mempool.on_accepted(Box::new(move |entry| {
        if let Err(e) = relay.relay_transaction((*entry.tx).clone()) {
            tracing::debug!(txid = %entry.txid, "not announced: {e}");
        }
    }));
    if config.mempool.persist {
        match mempool.load_saved() {
            Ok((0, 0)) => {}
            Ok((accepted, refused)) => {
                tracing::info!(accepted, refused, "mempool reloaded from mempool.dat")
            }
            Err(e) => tracing::warn!("mempool.dat not loaded, starting empty: {e}"),
        }
    }
    mempool
        .spawn_follower(stop)
        .context("starting the mempool's follower thread")?;
    Ok(())
}

/// Shares the process's file descriptors between the stores (those open
/// now, the chain state being open, and their headroom), P2P and HTTP
/// (`kakehi::fds`), trims the connection caps to their shares, and logs the
/// budget; warns when a cap was reduced, as Core does for
/// `-maxconnections`.
///
/// # Errors
/// The limit leaves too little beside the stores.
fn apply_fd_budget(
    limit: Option<kakehi::fds::FdLimit>,
    p2p: &mut kakehi::p2p::P2pConfig,
    http: &mut kakehi::http::HttpConfig,
) -> anyhow::Result<()> {
    use kakehi::fds::{FdBudget, FdWants};
    let held = kakehi::fds::open_count().unwrap_or(0);
    let wants = FdWants {
        http_connections: http.max_connections,
        p2p_total: p2p.max_total,
        p2p_inbound: p2p.max_inbound,
        p2p_outbound: p2p.max_outbound_full_relay,
    };
    let b = FdBudget::plan(limit.map(|l| l.now), held, wants)?;
    http.max_connections = b.http_connections;
    p2p.max_total = b.p2p_total;
    p2p.max_inbound = b.p2p_inbound;
    p2p.max_outbound_full_relay = b.p2p_outbound;
    match limit {
        Some(l) => tracing::info!(
            limit = l.now,
            raised_from = l.before,
            reserved = b.reserved,
            stores_open = held,
            http_connections = b.http_connections,
            p2p_peers = b.p2p_total,
            p2p_inbound = b.p2p_inbound,
            "file descriptors: limit {}, {} reserved for the stores and future servers, {} HTTP \
             connections, {} P2P peers",
            l.now,
            b.reserved,
            b.http_connections,
            b.p2p_total
        ),
        None => tracing::info!(
            http_connections = b.http_connections,
            p2p_peers = b.p2p_total,
            "file descriptors: limit unknown, the configured caps are kept"
        ),
    }
    for (what, wanted, got) in [
        (
            "HTTP connections",
            wants.http_connections,
            b.http_connections,
        ),
        ("P2P peers", wants.p2p_total, b.p2p_total),
    ] {
        if got < wanted {
            tracing::warn!(
                "reducing the {what} from {wanted} to {got}, because of the open-files limit \
                 (raise `ulimit -n`)"
            );
        }
    }
    Ok(())
}

/// The idle tick of group commit: a group of blocks connected while
/// catching up whose next block does not come (a stalled peer) is made
/// durable once it is older than its time limit. Skips a tick while the
/// writer is busy.
fn spawn_group_flusher(
    runtime: &tokio::runtime::Runtime,
    chain: Arc<Mutex<Chainstate>>,
    stop: Arc<AtomicBool>,
) {
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(250));
        while !stop.load(Ordering::SeqCst) {
            tick.tick().await;
            let chain = chain.clone();
            let flushed = tokio::task::spawn_blocking(move || match chain.try_lock() {
                Some(mut cs) => cs.flush_if_due(),
                None => Ok(false),
            })
            .await;
            if let Ok(Err(e)) = flushed {
                tracing::error!(error = %e, "making a group of blocks durable");
            }
        }
    });
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
    if s.interrupted {
        tracing::info!(
            height = s.tip_height,
            "stopped at a block boundary on a shutdown request"
        );
    }
}
