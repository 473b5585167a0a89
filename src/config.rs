//! Node configuration: a TOML file, `KAKEHI_*` environment variables and
//! command-line flags, merged into one effective [`Config`].
//!
//! Precedence, highest first: command line > environment > file given with
//! `--config FILE` > built-in defaults (the same order as electrs and
//! Floresta). Each source is read into a [`Layer`] (every field optional);
//! [`Config::resolve`] takes the first value set for each option. Defaults
//! that depend on the network (datadir, HTTP port) are computed after the
//! network is known.
//!
//! The file format (all keys optional; `config/<network>.toml` documents each
//! with its default and unit):
//!
//! ```toml
//! network = "regtest"            # bitcoin | testnet | testnet4 | signet | regtest
//! datadir = "/var/lib/kakehi"    # default ~/.kakehi/<network>
//!
//! [http]
//! address = "127.0.0.1:3002"     # ADDR:PORT of the HTTP API
//! max_connections_per_ip = 0     # open connections per client IP (IPv6: /64); 0 = no cap
//! rate_limit_per_second = 0.0    # sustained requests/s per client IP (429 beyond); 0 = off
//! rate_limit_burst = 20          # requests an idle client IP may send at once
//!
//! [rpc]
//! address = "127.0.0.1:18443"    # ADDR:PORT of the JSON-RPC server, or "off"
//! user = "alice"                 # rpcuser (with password); the cookie always works
//! password = "secret"            # rpcpassword
//! auth = ["bob:salt$hmac"]       # rpcauth entries (share/rpcauth/rpcauth.py)
//!
//! [p2p]
//! listen = "0.0.0.0:18444"       # ADDR:PORT for inbound peers; unset = no inbound
//! connect = ["10.0.0.2:18444"]   # only these peers (like bitcoind -connect)
//! addnode = ["10.0.0.3:18444"]   # these peers in addition to discovered ones
//!
//! [log]
//! format = "human"               # human | json
//! filter = "info,sled=warn"      # tracing EnvFilter directives (RUST_LOG syntax)
//!
//! [sozu]
//! shards = 2                     # UTXO table shards: 1, 2, 4 or 8, fixed at creation
//! ram_mib = 512                  # UTXO table memory budget, MiB (16..=1048576)
//!
//! [validation]
//! assumevalid = "0"              # 0 (verify every script) or a block hash; default: the network's
//! [index]
//! address = true                 # address/scripthash index (Esplora's /address routes)
//! cache_mib = 128                # index database page cache, MiB (8..=1048576)
//! rows_memory_mib = 16           # index rows held in memory before run files, MiB (1..=65536)
//! filter_cache_mib = 256         # cache of the run files' filters and block indexes, MiB (0..=1048576)
//!
//! [archive]
//! filter_cache_mib = 256         # cache of the archive's epoch filters, MiB (0..=1048576)
//!
//! [mempool]
//! max_mib = 300                  # mempool memory limit, MiB (5..=1048576), as -maxmempool
//! expiry_hours = 336             # entries older than this leave, hours (1..=1000000), as -mempoolexpiry
//! persist = true                 # save mempool.dat at a clean stop, reload at start, as -persistmempool
//! min_relay_feerate = 100        # sats per 1,000 vbytes (0..=100000000), as -minrelaytxfee
//! ```
//!
//! Unknown keys are refused (`deny_unknown_fields`): a typo must not be
//! silently ignored. A file error names the file, the line and the key.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use bitcoin::Network;
use serde::{Deserialize, Serialize};

use crate::chain::assumevalid::AssumeValid;
use crate::chain::ChainParams;

/// Environment variable prefix of every option.
pub const ENV_PREFIX: &str = "KAKEHI_";

/// Default tracing filter when neither `RUST_LOG`, `KAKEHI_LOG_FILTER`, the
/// file nor the command line sets one.
pub const DEFAULT_LOG_FILTER: &str = "info,sled=warn";

/// Default number of UTXO-table shards (two shards use both cores of a small
/// machine; see [`crate::sozu::SozuConfig::shards`]).
pub const DEFAULT_SOZU_SHARDS: u8 = 2;

/// Smallest and largest `sozu.ram_mib`, MiB.
pub const SOZU_RAM_MIB_RANGE: std::ops::RangeInclusive<usize> = 16..=1 << 20;
/// Smallest and largest `index.cache_mib`, MiB.
pub const INDEX_CACHE_MIB_RANGE: std::ops::RangeInclusive<usize> = 8..=1 << 20;
/// Smallest and largest `mempool.max_mib`, MiB (Core refuses a
/// `-maxmempool` under about 5 MB: 40 times the descendant size limit).
pub const MEMPOOL_MAX_MIB_RANGE: std::ops::RangeInclusive<usize> = 5..=1 << 20;
/// Smallest and largest `mempool.expiry_hours`.
pub const MEMPOOL_EXPIRY_HOURS_RANGE: std::ops::RangeInclusive<u64> = 1..=1_000_000;
/// Smallest and largest `mempool.min_relay_feerate`, sats per 1,000
/// vbytes (1 BTC/kvB at most).
pub const MIN_RELAY_FEERATE_RANGE: std::ops::RangeInclusive<u64> = 0..=100_000_000;
/// Smallest and largest `index.rows_memory_mib`, MiB.
pub const ROWS_MEMORY_MIB_RANGE: std::ops::RangeInclusive<usize> = 1..=1 << 16;
/// Smallest and largest `index.filter_cache_mib` and
/// `archive.filter_cache_mib`, MiB (0: no cache, every lookup reads the
/// files).
pub const FILTER_CACHE_MIB_RANGE: std::ops::RangeInclusive<usize> = 0..=1 << 20;
/// Default `index.rows_memory_mib`, MiB
/// ([`crate::store::runs::MEMORY_BOUND`]).
pub const DEFAULT_ROWS_MEMORY_MIB: usize = crate::store::runs::MEMORY_BOUND >> 20;
/// Default `index.filter_cache_mib`, MiB
/// ([`crate::store::runs::DEFAULT_FILTER_CACHE`]).
pub const DEFAULT_INDEX_FILTER_CACHE_MIB: usize = crate::store::runs::DEFAULT_FILTER_CACHE >> 20;
/// Default `archive.filter_cache_mib`, MiB
/// ([`crate::archive::DEFAULT_FILTER_CACHE`]).
pub const DEFAULT_ARCHIVE_FILTER_CACHE_MIB: usize = crate::archive::DEFAULT_FILTER_CACHE >> 20;

/// Largest configuration file read, bytes (1 MiB; the documented file with
/// every key is under 2 KiB): a larger one (`--config /dev/zero`) is
/// refused before it fills the memory.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Largest `http.max_connections_per_ip`.
pub const MAX_CONNECTIONS_PER_IP: usize = 1_000_000;
/// Largest `http.rate_limit_per_second` and `http.rate_limit_burst`.
pub const MAX_RATE_LIMIT: u32 = 1_000_000;
/// Default `http.rate_limit_burst`: requests an idle client may send at
/// once when the rate limit is on.
pub const DEFAULT_RATE_LIMIT_BURST: u32 = 20;

/// Errors reading the configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_CONFIG_BYTES`].
    #[error("config file {path} is over {MAX_CONFIG_BYTES} bytes: not a configuration file?")]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The file is not valid TOML, has an unknown key or a bad value.
    #[error("{path}:{line}: {key}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// 1-based line of the offending key or value (0 when unknown).
        line: usize,
        /// The dotted key (`http.address`), or `?` when the line has none.
        key: String,
        /// What is wrong (the TOML/serde message).
        message: String,
    },
    /// An environment variable has a bad value.
    #[error("environment variable {var}: {message}")]
    Env {
        /// The variable.
        var: String,
        /// What is wrong.
        message: String,
    },
    /// The effective configuration cannot be printed.
    #[error("cannot print the configuration: {0}")]
    Print(#[from] toml::ser::Error),
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (tracing's default formatter).
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "human" => Ok(LogFormat::Human),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("unknown log format {s:?} (expected human or json)")),
        }
    }
}

/// Parses a network name: `bitcoin` (also `mainnet`, `main`), `testnet`
/// (`testnet3`, `test`), `testnet4`, `signet`, `regtest`.
///
/// # Errors
/// A message listing the accepted names.
pub fn parse_network(s: &str) -> Result<Network, String> {
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

/// Parses a shard count: 1, 2, 4 or 8.
///
/// # Errors
/// A message naming the accepted values.
pub fn parse_shards(s: &str) -> Result<u8, String> {
    match s.trim().parse::<u8>() {
        Ok(n @ (1 | 2 | 4 | 8)) => Ok(n),
        _ => Err(format!("bad shard count {s:?} (expected 1, 2, 4 or 8)")),
    }
}

/// Parses a UTXO-table memory budget in MiB, within [`SOZU_RAM_MIB_RANGE`].
///
/// # Errors
/// A message naming the accepted range.
pub fn parse_ram_mib(s: &str) -> Result<usize, String> {
    parse_mib_in(s, &SOZU_RAM_MIB_RANGE)
}

/// Parses an index-database page cache in MiB, within
/// [`INDEX_CACHE_MIB_RANGE`].
///
/// # Errors
/// A message naming the accepted range.
pub fn parse_index_cache_mib(s: &str) -> Result<usize, String> {
    parse_mib_in(s, &INDEX_CACHE_MIB_RANGE)
}

/// Parses the index rows' memory bound in MiB, within
/// [`ROWS_MEMORY_MIB_RANGE`].
///
/// # Errors
/// A message naming the accepted range.
pub fn parse_rows_memory_mib(s: &str) -> Result<usize, String> {
    parse_mib_in(s, &ROWS_MEMORY_MIB_RANGE)
}

/// Parses a filter cache budget in MiB, within [`FILTER_CACHE_MIB_RANGE`].
///
/// # Errors
/// A message naming the accepted range.
pub fn parse_filter_cache_mib(s: &str) -> Result<usize, String> {
    parse_mib_in(s, &FILTER_CACHE_MIB_RANGE)
}

/// Parses `mempool.max_mib`, within [`MEMPOOL_MAX_MIB_RANGE`].
///
/// # Errors
/// A message naming the accepted range.
pub fn parse_mempool_max_mib(s: &str) -> Result<usize, String> {
    parse_mib_in(s, &MEMPOOL_MAX_MIB_RANGE)
}

/// Parses `mempool.expiry_hours`, within [`MEMPOOL_EXPIRY_HOURS_RANGE`].
///
/// # Errors
/// A message naming the accepted range.
pub fn parse_expiry_hours(s: &str) -> Result<u64, String> {
    parse_u64_in(s, "hours", &MEMPOOL_EXPIRY_HOURS_RANGE)
}

/// Parses `mempool.min_relay_feerate` (sats per 1,000 vbytes), within
/// [`MIN_RELAY_FEERATE_RANGE`].
///
/// # Errors
/// A message naming the accepted range.
pub fn parse_min_relay_feerate(s: &str) -> Result<u64, String> {
    parse_u64_in(s, "sats per 1,000 vbytes", &MIN_RELAY_FEERATE_RANGE)
}

/// Parses a whole number of `unit` within `range`.
fn parse_u64_in(s: &str, unit: &str, range: &std::ops::RangeInclusive<u64>) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(format!(
            "bad value {s:?} (expected {unit} from {} to {})",
            range.start(),
            range.end()
        )),
    }
}

/// Parses `http.max_connections_per_ip`: 0 (no cap) to
/// [`MAX_CONNECTIONS_PER_IP`].
///
/// # Errors
/// A message naming the accepted range.
pub fn parse_connections_per_ip(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n <= MAX_CONNECTIONS_PER_IP => Ok(n),
        _ => Err(format!(
            "bad connection count {s:?} (expected 0, no cap, to {MAX_CONNECTIONS_PER_IP})"
        )),
    }
}

/// Parses `true` or `false`.
fn parse_bool(s: &str) -> Result<bool, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("{s:?} is not true or false"))
}

/// Parses `http.rate_limit_per_second`: requests per second, 0 (off) to
/// [`MAX_RATE_LIMIT`], fractions allowed (0.5: one every 2 s).
///
/// # Errors
/// A message naming the accepted range.
pub fn parse_rate_limit(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if (0.0..=f64::from(MAX_RATE_LIMIT)).contains(&r) => Ok(r),
        _ => Err(format!(
            "bad rate {s:?} (expected requests per second, 0 (off) to {MAX_RATE_LIMIT})"
        )),
    }
}

/// Parses `http.rate_limit_burst`: 1 to [`MAX_RATE_LIMIT`].
///
/// # Errors
/// A message naming the accepted range.
pub fn parse_rate_burst(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(n) if (1..=MAX_RATE_LIMIT).contains(&n) => Ok(n),
        _ => Err(format!("bad burst {s:?} (expected 1 to {MAX_RATE_LIMIT})")),
    }
}

/// Parses a memory size in MiB within `range`.
fn parse_mib_in(s: &str, range: &std::ops::RangeInclusive<usize>) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(format!(
            "bad memory budget {s:?} (expected MiB from {} to {})",
            range.start(),
            range.end()
        )),
    }
}

/// A peer address, `HOST:PORT`: an IP literal (`10.0.0.2:18444`,
/// `[::1]:18444`) or a host name (`bitcoind:18444`, as bitcoind's `-connect`
/// accepts), resolved when the connection is made. Serialized as that string.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerAddress {
    /// Host name or IP literal (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl std::str::FromStr for PeerAddress {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Ok(a) = s.parse::<SocketAddr>() {
            return Ok(PeerAddress {
                host: a.ip().to_string(),
                port: a.port(),
            });
        }
        let bad = || format!("{s:?} is not HOST:PORT");
        let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let host_ok = !host.is_empty()
            && host.len() <= 253
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_');
        if !host_ok || port == 0 {
            return Err(bad());
        }
        Ok(PeerAddress {
            host: host.to_string(),
            port,
        })
    }
}

impl fmt::Display for PeerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl Serialize for PeerAddress {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PeerAddress {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl PeerAddress {
    /// Resolves the address (DNS for a host name; blocking).
    ///
    /// # Errors
    /// The resolver's error.
    pub fn resolve(&self) -> std::io::Result<Vec<SocketAddr>> {
        use std::net::ToSocketAddrs;
        Ok((self.host.as_str(), self.port).to_socket_addrs()?.collect())
    }
}

/// One source of configuration: every option optional.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Layer {
    /// Network.
    pub network: Option<Network>,
    /// Data directory.
    pub datadir: Option<PathBuf>,
    /// HTTP API address.
    pub http: Option<SocketAddr>,
    /// HTTP connections per client IP (0: no cap).
    pub http_max_connections_per_ip: Option<usize>,
    /// HTTP requests per second per client IP (0: off).
    pub http_rate_limit: Option<f64>,
    /// HTTP requests an idle client IP may send at once.
    pub http_rate_burst: Option<u32>,
    /// JSON-RPC address (`Some(None)`: off).
    pub rpc: Option<Option<SocketAddr>>,
    /// JSON-RPC user (`rpcuser`).
    pub rpc_user: Option<String>,
    /// JSON-RPC password (`rpcpassword`).
    pub rpc_password: Option<String>,
    /// JSON-RPC `rpcauth` entries.
    pub rpc_auth: Option<Vec<String>>,
    /// P2P listen address.
    pub listen: Option<SocketAddr>,
    /// Peers to connect to exclusively.
    pub connect: Option<Vec<PeerAddress>>,
    /// Peers to add.
    pub addnode: Option<Vec<PeerAddress>>,
    /// Log format.
    pub log_format: Option<LogFormat>,
    /// Tracing filter directives.
    pub log_filter: Option<String>,
    /// UTXO-table shards.
    pub sozu_shards: Option<u8>,
    /// The assumevalid block, or off.
    pub assumevalid: Option<AssumeValid>,
    /// Address index on or off.
    pub address_index: Option<bool>,
    /// UTXO-table memory budget, MiB.
    pub sozu_ram_mib: Option<usize>,
    /// Index-database page cache, MiB.
    pub index_cache_mib: Option<usize>,
    /// Index rows held in memory before run files, MiB.
    pub rows_memory_mib: Option<usize>,
    /// Cache of the run files' filters and block indexes, MiB.
    pub index_filter_cache_mib: Option<usize>,
    /// Cache of the archive's epoch filters, MiB.
    pub archive_filter_cache_mib: Option<usize>,
    /// Mempool memory limit, MiB.
    pub mempool_max_mib: Option<usize>,
    /// Mempool expiry, hours.
    pub mempool_expiry_hours: Option<u64>,
    /// Save and reload `mempool.dat`.
    pub mempool_persist: Option<bool>,
    /// Minimum relay feerate, sats per 1,000 vbytes.
    pub min_relay_feerate: Option<u64>,
    /// `KAKEHI_*` variables no option reads (e.g. `KAKEHI_LONG`, which the
    /// long test modes use): not an error, the binary logs a warning naming
    /// them so a typo is visible.
    pub unknown_env: Vec<String>,
}

/// The file's shape (`deny_unknown_fields` at every level).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default, deserialize_with = "de_network")]
    network: Option<Network>,
    datadir: Option<PathBuf>,
    #[serde(default)]
    http: FileHttp,
    #[serde(default)]
    rpc: FileRpc,
    #[serde(default)]
    p2p: FileP2p,
    #[serde(default)]
    log: FileLog,
    #[serde(default)]
    sozu: FileSozu,
    #[serde(default)]
    validation: FileValidation,
    #[serde(default)]
    index: FileIndex,
    #[serde(default)]
    archive: FileArchive,
    #[serde(default)]
    mempool: FileMempool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileMempool {
    #[serde(default, deserialize_with = "de_mempool_max_mib")]
    max_mib: Option<usize>,
    #[serde(default, deserialize_with = "de_expiry_hours")]
    expiry_hours: Option<u64>,
    persist: Option<bool>,
    #[serde(default, deserialize_with = "de_min_relay_feerate")]
    min_relay_feerate: Option<u64>,
}

fn de_mempool_max_mib<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    let n = i64::deserialize(d)?;
    parse_mempool_max_mib(&n.to_string())
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn de_expiry_hours<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let n = i64::deserialize(d)?;
    parse_expiry_hours(&n.to_string())
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn de_min_relay_feerate<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let n = i64::deserialize(d)?;
    parse_min_relay_feerate(&n.to_string())
        .map(Some)
        .map_err(serde::de::Error::custom)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileIndex {
    address: Option<bool>,
    #[serde(default, deserialize_with = "de_index_cache_mib")]
    cache_mib: Option<usize>,
    #[serde(default, deserialize_with = "de_rows_memory_mib")]
    rows_memory_mib: Option<usize>,
    #[serde(default, deserialize_with = "de_filter_cache_mib")]
    filter_cache_mib: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileArchive {
    #[serde(default, deserialize_with = "de_filter_cache_mib")]
    filter_cache_mib: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRpc {
    #[serde(default, deserialize_with = "de_rpc_address")]
    address: Option<Option<SocketAddr>>,
    user: Option<String>,
    password: Option<String>,
    auth: Option<Vec<String>>,
}

fn de_rpc_address<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Option<SocketAddr>>, D::Error> {
    let s = String::deserialize(d)?;
    parse_rpc_address(&s)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// Parses `rpc.address`: `ADDR:PORT`, or `off` (no JSON-RPC server:
/// `None`).
///
/// # Errors
/// Neither `off` nor an `ADDR:PORT`.
pub fn parse_rpc_address(s: &str) -> Result<Option<SocketAddr>, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|e| format!("{s:?} is neither \"off\" nor ADDR:PORT ({e})"))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileHttp {
    address: Option<SocketAddr>,
    #[serde(default, deserialize_with = "de_connections_per_ip")]
    max_connections_per_ip: Option<usize>,
    #[serde(default, deserialize_with = "de_rate_limit")]
    rate_limit_per_second: Option<f64>,
    #[serde(default, deserialize_with = "de_rate_burst")]
    rate_limit_burst: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileP2p {
    listen: Option<SocketAddr>,
    connect: Option<Vec<PeerAddress>>,
    addnode: Option<Vec<PeerAddress>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLog {
    format: Option<LogFormat>,
    filter: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSozu {
    #[serde(default, deserialize_with = "de_shards")]
    shards: Option<u8>,
    #[serde(default, deserialize_with = "de_ram_mib")]
    ram_mib: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileValidation {
    #[serde(default, deserialize_with = "de_assumevalid")]
    assumevalid: Option<AssumeValid>,
}

fn de_assumevalid<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<AssumeValid>, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map(Some).map_err(serde::de::Error::custom)
}

fn de_connections_per_ip<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<usize>, D::Error> {
    let n = i64::deserialize(d)?;
    parse_connections_per_ip(&n.to_string())
        .map(Some)
        .map_err(serde::de::Error::custom)
}
fn de_rate_limit<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    /// TOML keeps `5` and `5.0` apart; both are a rate.
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Number {
        Int(i64),
        Float(f64),
    }
    let r = match Number::deserialize(d)? {
        Number::Int(i) => i.to_string(),
        Number::Float(f) => f.to_string(),
    };
    parse_rate_limit(&r)
        .map(Some)
        .map_err(serde::de::Error::custom)
}
fn de_rate_burst<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    let n = i64::deserialize(d)?;
    parse_rate_burst(&n.to_string())
        .map(Some)
        .map_err(serde::de::Error::custom)
}
fn de_network<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Network>, D::Error> {
    let s = String::deserialize(d)?;
    parse_network(&s)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn de_shards<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u8>, D::Error> {
    let n = i64::deserialize(d)?;
    parse_shards(&n.to_string())
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn de_ram_mib<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    let n = i64::deserialize(d)?;
    parse_ram_mib(&n.to_string())
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn de_index_cache_mib<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    let n = i64::deserialize(d)?;
    parse_index_cache_mib(&n.to_string())
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn de_rows_memory_mib<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    let n = i64::deserialize(d)?;
    parse_rows_memory_mib(&n.to_string())
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn de_filter_cache_mib<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    let n = i64::deserialize(d)?;
    parse_filter_cache_mib(&n.to_string())
        .map(Some)
        .map_err(serde::de::Error::custom)
}

impl Layer {
    /// Reads a TOML configuration file.
    ///
    /// # Errors
    /// [`ConfigError::Read`] when it cannot be read (or is not UTF-8),
    /// [`ConfigError::TooLarge`] past [`MAX_CONFIG_BYTES`],
    /// [`ConfigError::File`] (file, line, key) when it is not valid TOML,
    /// has an unknown key or a bad value.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        use std::io::Read;
        let read_err = |source| ConfigError::Read {
            path: path.into(),
            source,
        };
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text))
            .map_err(read_err)?;
        if text.len() as u64 > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge { path: path.into() });
        }
        Self::from_toml_str(&text, path)
    }

    /// Parses the TOML text of the file `path` (the path only names the file
    /// in errors).
    ///
    /// # Errors
    /// [`ConfigError::File`].
    pub fn from_toml_str(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let file: FileConfig = toml::from_str(text).map_err(|e| {
            let (line, key) = match e.span() {
                Some(span) => locate(text, span.start),
                None => (0, "?".to_string()),
            };
            ConfigError::File {
                path: path.into(),
                line,
                key,
                message: e.message().trim().to_string(),
            }
        })?;
        Ok(Layer {
            network: file.network,
            datadir: file.datadir,
            http: file.http.address,
            http_max_connections_per_ip: file.http.max_connections_per_ip,
            http_rate_limit: file.http.rate_limit_per_second,
            http_rate_burst: file.http.rate_limit_burst,
            rpc: file.rpc.address,
            rpc_user: file.rpc.user,
            rpc_password: file.rpc.password,
            rpc_auth: file.rpc.auth,
            listen: file.p2p.listen,
            connect: file.p2p.connect,
            addnode: file.p2p.addnode,
            log_format: file.log.format,
            log_filter: file.log.filter,
            sozu_shards: file.sozu.shards,
            assumevalid: file.validation.assumevalid,
            address_index: file.index.address,
            sozu_ram_mib: file.sozu.ram_mib,
            index_cache_mib: file.index.cache_mib,
            rows_memory_mib: file.index.rows_memory_mib,
            index_filter_cache_mib: file.index.filter_cache_mib,
            archive_filter_cache_mib: file.archive.filter_cache_mib,
            mempool_max_mib: file.mempool.max_mib,
            mempool_expiry_hours: file.mempool.expiry_hours,
            mempool_persist: file.mempool.persist,
            min_relay_feerate: file.mempool.min_relay_feerate,
            unknown_env: Vec::new(),
        })
    }

    /// Reads the `KAKEHI_*` variables (and `RUST_LOG`, which wins over
    /// `KAKEHI_LOG_FILTER`) from `vars` (pass `std::env::vars_os()` mapped to
    /// strings). Lists (`KAKEHI_CONNECT`, `KAKEHI_ADDNODE`) are
    /// comma-separated; an empty value is an empty list.
    ///
    /// | variable | option |
    /// | --- | --- |
    /// | `KAKEHI_NETWORK` | `network` |
    /// | `KAKEHI_DATADIR` | `datadir` |
    /// | `KAKEHI_HTTP` | `http.address` |
    /// | `KAKEHI_HTTP_MAX_CONNECTIONS_PER_IP` | `http.max_connections_per_ip` |
    /// | `KAKEHI_HTTP_RATE_LIMIT_PER_SECOND` | `http.rate_limit_per_second` |
    /// | `KAKEHI_HTTP_RATE_LIMIT_BURST` | `http.rate_limit_burst` |
    /// | `KAKEHI_RPC` (`off` or ADDR:PORT) | `rpc.address` |
    /// | `KAKEHI_RPC_USER` | `rpc.user` |
    /// | `KAKEHI_RPC_PASSWORD` | `rpc.password` |
    /// | `KAKEHI_RPC_AUTH` | `rpc.auth` |
    /// | `KAKEHI_LISTEN` | `p2p.listen` |
    /// | `KAKEHI_CONNECT` | `p2p.connect` |
    /// | `KAKEHI_ADDNODE` | `p2p.addnode` |
    /// | `KAKEHI_LOG_FORMAT` | `log.format` |
    /// | `KAKEHI_LOG_FILTER`, `RUST_LOG` | `log.filter` |
    /// | `KAKEHI_SOZU_SHARDS` | `sozu.shards` |
    /// | `KAKEHI_ASSUMEVALID` | `validation.assumevalid` |
    /// | `KAKEHI_ADDRESS_INDEX` (`true`/`false`) | `index.address` |
    /// | `KAKEHI_SOZU_RAM_MIB` | `sozu.ram_mib` |
    /// | `KAKEHI_INDEX_CACHE_MIB` | `index.cache_mib` |
    /// | `KAKEHI_INDEX_ROWS_MEMORY_MIB` | `index.rows_memory_mib` |
    /// | `KAKEHI_INDEX_FILTER_CACHE_MIB` | `index.filter_cache_mib` |
    /// | `KAKEHI_ARCHIVE_FILTER_CACHE_MIB` | `archive.filter_cache_mib` |
    /// | `KAKEHI_MEMPOOL_MAX_MIB` | `mempool.max_mib` |
    /// | `KAKEHI_MEMPOOL_EXPIRY_HOURS` | `mempool.expiry_hours` |
    /// | `KAKEHI_MEMPOOL_PERSIST` (`true`/`false`) | `mempool.persist` |
    /// | `KAKEHI_MIN_RELAY_FEERATE` | `mempool.min_relay_feerate` |
    ///
    /// # Errors
    /// [`ConfigError::Env`] for a bad value. Unknown `KAKEHI_*` variables
    /// are listed in [`Layer::unknown_env`], not refused: other tools (the
    /// test suite's `KAKEHI_LONG`) share the prefix.
    pub fn from_env<I>(vars: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        let mut layer = Layer::default();
        let mut rust_log = None;
        for (var, value) in vars {
            if var == "RUST_LOG" {
                rust_log = Some(value);
                continue;
            }
            let Some(name) = var.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            let bad = |message: String| ConfigError::Env {
                var: var.clone(),
                message,
            };
            let addr = |v: &str| {
                v.trim()
                    .parse::<SocketAddr>()
                    .map_err(|e| bad(format!("{v:?} is not ADDR:PORT ({e})")))
            };
            let list = |v: &str| -> Result<Vec<PeerAddress>, ConfigError> {
                v.split(',')
                    .filter(|s| !s.trim().is_empty())
                    .map(|s| s.parse().map_err(&bad))
                    .collect()
            };
            match name {
                "NETWORK" => layer.network = Some(parse_network(&value).map_err(bad)?),
                "DATADIR" => layer.datadir = Some(PathBuf::from(&value)),
                "HTTP" => layer.http = Some(addr(&value)?),
                "HTTP_MAX_CONNECTIONS_PER_IP" => {
                    layer.http_max_connections_per_ip =
                        Some(parse_connections_per_ip(&value).map_err(bad)?)
                }
                "HTTP_RATE_LIMIT_PER_SECOND" => {
                    layer.http_rate_limit = Some(parse_rate_limit(&value).map_err(bad)?)
                }
                "HTTP_RATE_LIMIT_BURST" => {
                    layer.http_rate_burst = Some(parse_rate_burst(&value).map_err(bad)?)
                }
                "RPC" => layer.rpc = Some(parse_rpc_address(&value).map_err(bad)?),
                "RPC_USER" => layer.rpc_user = Some(value.clone()),
                "RPC_PASSWORD" => layer.rpc_password = Some(value.clone()),
                "RPC_AUTH" => {
                    layer.rpc_auth = Some(
                        value
                            .split(',')
                            .filter(|s| !s.trim().is_empty())
                            .map(|s| s.trim().to_string())
                            .collect(),
                    )
                }
                "LISTEN" => layer.listen = Some(addr(&value)?),
                "CONNECT" => layer.connect = Some(list(&value)?),
                "ADDNODE" => layer.addnode = Some(list(&value)?),
                "LOG_FORMAT" => layer.log_format = Some(value.parse().map_err(bad)?),
                "LOG_FILTER" => layer.log_filter = Some(value.clone()),
                "SOZU_SHARDS" => layer.sozu_shards = Some(parse_shards(&value).map_err(bad)?),
                "ASSUMEVALID" => {
                    layer.assumevalid = Some(value.parse().map_err(|e| bad(format!("{e}")))?)
                }
                "ADDRESS_INDEX" => {
                    layer.address_index = Some(
                        value
                            .trim()
                            .parse()
                            .map_err(|_| bad(format!("{value:?} is not true or false")))?,
                    )
                }
                "SOZU_RAM_MIB" => layer.sozu_ram_mib = Some(parse_ram_mib(&value).map_err(bad)?),
                "INDEX_CACHE_MIB" => {
                    layer.index_cache_mib = Some(parse_index_cache_mib(&value).map_err(bad)?)
                }
                "INDEX_ROWS_MEMORY_MIB" => {
                    layer.rows_memory_mib = Some(parse_rows_memory_mib(&value).map_err(bad)?)
                }
                "INDEX_FILTER_CACHE_MIB" => {
                    layer.index_filter_cache_mib =
                        Some(parse_filter_cache_mib(&value).map_err(bad)?)
                }
                "ARCHIVE_FILTER_CACHE_MIB" => {
                    layer.archive_filter_cache_mib =
                        Some(parse_filter_cache_mib(&value).map_err(bad)?)
                }
                "MEMPOOL_MAX_MIB" => {
                    layer.mempool_max_mib = Some(parse_mempool_max_mib(&value).map_err(bad)?)
                }
                "MEMPOOL_EXPIRY_HOURS" => {
                    layer.mempool_expiry_hours = Some(parse_expiry_hours(&value).map_err(bad)?)
                }
                "MEMPOOL_PERSIST" => layer.mempool_persist = Some(parse_bool(&value).map_err(bad)?),
                "MIN_RELAY_FEERATE" => {
                    layer.min_relay_feerate = Some(parse_min_relay_feerate(&value).map_err(bad)?)
                }
                _ => layer.unknown_env.push(var.clone()),
            }
        }
        if rust_log.is_some() {
            layer.log_filter = rust_log;
        }
        Ok(layer)
    }
}

/// 1-based line of byte `offset` in `text`, and the dotted key on that line
/// (the text before `=`, prefixed by the last `[table]` header above it).
fn locate(text: &str, offset: usize) -> (usize, String) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line_no = before.matches('\n').count() + 1;
    let line = text.lines().nth(line_no - 1).unwrap_or("");
    let mut table = None;
    for l in text.lines().take(line_no) {
        let t = l.trim();
        if t.starts_with('[') {
            table = Some(t.trim_matches(|c| c == '[' || c == ']').trim().to_string());
        }
    }
    let key = match line.split_once('=') {
        Some((k, _)) => {
            let k = k.trim().trim_matches('"').to_string();
            match table {
                Some(t) if !t.is_empty() => format!("{t}.{k}"),
                _ => k,
            }
        }
        None if line.trim().starts_with('[') => line.trim().to_string(),
        None => "?".to_string(),
    };
    (line_no, key)
}

/// The effective configuration, every option resolved. Serializes to the
/// file format (`kakehi config show`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    /// Network name (`bitcoin`, `testnet`, `testnet4`, `signet`, `regtest`).
    #[serde(serialize_with = "ser_network")]
    pub network: Network,
    /// Data directory. Default `~/.kakehi/<network>`.
    pub datadir: PathBuf,
    /// `[http]` section.
    pub http: HttpConfig,
    /// `[rpc]` section.
    pub rpc: RpcSection,
    /// `[p2p]` section.
    pub p2p: P2pConfig,
    /// `[log]` section.
    pub log: LogConfig,
    /// `[sozu]` section.
    pub sozu: SozuSection,
    /// `[validation]` section.
    pub validation: ValidationSection,
    /// `[index]` section.
    pub index: IndexSection,
    /// `[archive]` section.
    pub archive: ArchiveSection,
    /// `[mempool]` section.
    pub mempool: MempoolSection,
}

/// `[mempool]`: the knobs of [`crate::mempool::MempoolConfig`] an operator
/// sets (the rest keeps Core 30.0's defaults).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MempoolSection {
    /// Memory limit, MiB (as `-maxmempool`). Default 300.
    pub max_mib: usize,
    /// Entries older than this leave, hours (as `-mempoolexpiry`).
    /// Default 336.
    pub expiry_hours: u64,
    /// Save `mempool.dat` at a clean stop and reload it at start (as
    /// `-persistmempool`). Default true.
    pub persist: bool,
    /// Lowest feerate relayed, sats per 1,000 vbytes (as
    /// `-minrelaytxfee`). Default 100.
    pub min_relay_feerate: u64,
}

impl MempoolSection {
    /// The mempool's settings: these knobs over Core's defaults.
    pub fn mempool_config(&self) -> crate::mempool::MempoolConfig {
        let mut m = crate::mempool::MempoolConfig {
            max_mib: self.max_mib as u64,
            expiry_hours: self.expiry_hours,
            persist: self.persist,
            ..Default::default()
        };
        m.policy.min_relay_feerate = self.min_relay_feerate;
        m
    }
}

/// `[archive]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArchiveSection {
    /// Budget of the cache of the sealed epochs' filters, MiB (0: none,
    /// every lookup reads the filters from the epoch files). Applies at
    /// each start. Default [`DEFAULT_ARCHIVE_FILTER_CACHE_MIB`].
    pub filter_cache_mib: usize,
}

/// `[index]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IndexSection {
    /// The address index (script-hash prefix → the transactions funding or
    /// spending from the script; the HTTP `/address` and `/scripthash`
    /// routes). Default true. Its disk
    /// and time costs are in `docs/operations.md`. Turned on for a datadir
    /// without it, it is built from the block files at start-up.
    pub address: bool,
    /// Page cache of the index database (sled), MiB. Applies at each
    /// start. Default [`crate::store::DEFAULT_INDEX_CACHE_MIB`].
    pub cache_mib: usize,
    /// Index rows (transaction, spend and address rows) held in memory,
    /// and in the row log, before a commit writes them to run files, MiB.
    /// Applies at each start. Default [`DEFAULT_ROWS_MEMORY_MIB`].
    pub rows_memory_mib: usize,
    /// Budget of the cache of the run files' filter and block-index
    /// partitions, MiB (0: none, every lookup reads the files). Applies
    /// at each start. Default [`DEFAULT_INDEX_FILTER_CACHE_MIB`].
    pub filter_cache_mib: usize,
}

/// `[rpc]`: the JSON-RPC server (`docs/rpc.md`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RpcSection {
    /// Address of the JSON-RPC server, `None` for off. Default
    /// `127.0.0.1:<Core's RPC port>` (8332 mainnet, 18332 testnet3, 48332
    /// testnet4, 38332 signet, 18443 regtest).
    #[serde(serialize_with = "ser_rpc_address")]
    pub address: Option<SocketAddr>,
    /// `rpcuser`: a user accepted with [`RpcSection::password`]. Default
    /// none (the cookie file only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// `rpcpassword` (shown as `"***"` by `kakehi config show`).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "ser_redacted"
    )]
    pub password: Option<String>,
    /// `rpcauth` entries, `user:salt$hmac`. Default none.
    pub auth: Vec<String>,
}

fn ser_rpc_address<S: serde::Serializer>(a: &Option<SocketAddr>, s: S) -> Result<S::Ok, S::Error> {
    match a {
        Some(a) => s.collect_str(a),
        None => s.serialize_str("off"),
    }
}

fn ser_redacted<S: serde::Serializer>(_: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("***")
}

/// `[http]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HttpConfig {
    /// Address of the HTTP API. Default `127.0.0.1:<network's HTTP port>`
    /// (3000 mainnet, 3001 testnet, 3002 regtest, 3003 signet, 3004 testnet4).
    pub address: SocketAddr,
    /// Open connections per client IP address (an IPv6 address counts by
    /// its /64); past it a connection is closed at once. Default 0: no cap
    /// (behind a reverse proxy every client has the proxy's address).
    pub max_connections_per_ip: usize,
    /// Sustained requests per second per client IP (tower_governor's
    /// GCRA; 429 beyond). Default 0: off.
    pub rate_limit_per_second: f64,
    /// Requests an idle client IP may send at once under the rate limit.
    /// Default [`DEFAULT_RATE_LIMIT_BURST`].
    pub rate_limit_burst: u32,
}

/// `[p2p]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct P2pConfig {
    /// Address to accept inbound peers on. Default: none (no inbound).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Connect only to these peers (like bitcoind `-connect`). Default empty.
    pub connect: Vec<PeerAddress>,
    /// Peers to connect to in addition to discovered ones (bitcoind
    /// `-addnode`). Default empty.
    pub addnode: Vec<PeerAddress>,
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogConfig {
    /// Output format. Default human.
    pub format: LogFormat,
    /// tracing `EnvFilter` directives. Default [`DEFAULT_LOG_FILTER`].
    pub filter: String,
}

/// `[sozu]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SozuSection {
    /// Shards of the UTXO table (1, 2, 4 or 8). Fixed when the table is
    /// created; later values are ignored. Default [`DEFAULT_SOZU_SHARDS`].
    pub shards: u8,
    /// Memory budget of the UTXO table's pages, MiB (pinned top layers,
    /// page cache, pages awaiting a checkpoint; [`crate::sozu::SozuConfig::ram_mib`]).
    /// Applies at each start. Default [`crate::sozu::DEFAULT_RAM_MIB`].
    pub ram_mib: usize,
}

/// `[validation]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ValidationSection {
    /// The assumevalid block (Core's `-assumevalid`): the scripts of its
    /// ancestors are not verified when Core's conditions hold
    /// (`crate::chain::assumevalid`); `0` verifies every script. Default:
    /// the network's (Core 31.99's `defaultAssumeValid`; `0` on regtest).
    #[serde(serialize_with = "ser_display")]
    pub assumevalid: AssumeValid,
}

fn ser_display<T: fmt::Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

fn ser_network<S: serde::Serializer>(n: &Network, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(ChainParams::new(*n).name())
}

impl Config {
    /// Merges `layers` (highest precedence first: CLI, environment, file)
    /// over the defaults.
    pub fn resolve(layers: &[&Layer]) -> Config {
        fn pick<T: Clone>(layers: &[&Layer], f: impl Fn(&Layer) -> Option<&T>) -> Option<T> {
            layers.iter().find_map(|l| f(l).cloned())
        }
        let network = pick(layers, |l| l.network.as_ref()).unwrap_or(Network::Regtest);
        let params = ChainParams::new(network);
        Config {
            network,
            datadir: pick(layers, |l| l.datadir.as_ref())
                .unwrap_or_else(|| crate::node::default_datadir(&params)),
            http: HttpConfig {
                address: pick(layers, |l| l.http.as_ref())
                    .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], params.http_port))),
                max_connections_per_ip: pick(layers, |l| l.http_max_connections_per_ip.as_ref())
                    .unwrap_or(0),
                rate_limit_per_second: pick(layers, |l| l.http_rate_limit.as_ref()).unwrap_or(0.0),
                rate_limit_burst: pick(layers, |l| l.http_rate_burst.as_ref())
                    .unwrap_or(DEFAULT_RATE_LIMIT_BURST),
            },
            rpc: RpcSection {
                address: pick(layers, |l| l.rpc.as_ref())
                    .unwrap_or_else(|| Some(SocketAddr::from(([127, 0, 0, 1], params.rpc_port)))),
                user: pick(layers, |l| l.rpc_user.as_ref()),
                password: pick(layers, |l| l.rpc_password.as_ref()),
                auth: pick(layers, |l| l.rpc_auth.as_ref()).unwrap_or_default(),
            },
            p2p: P2pConfig {
                listen: pick(layers, |l| l.listen.as_ref()),
                connect: pick(layers, |l| l.connect.as_ref()).unwrap_or_default(),
                addnode: pick(layers, |l| l.addnode.as_ref()).unwrap_or_default(),
            },
            log: LogConfig {
                format: pick(layers, |l| l.log_format.as_ref()).unwrap_or_default(),
                filter: pick(layers, |l| l.log_filter.as_ref())
                    .unwrap_or_else(|| DEFAULT_LOG_FILTER.to_string()),
            },
            sozu: SozuSection {
                shards: pick(layers, |l| l.sozu_shards.as_ref()).unwrap_or(DEFAULT_SOZU_SHARDS),
                ram_mib: pick(layers, |l| l.sozu_ram_mib.as_ref())
                    .unwrap_or(crate::sozu::DEFAULT_RAM_MIB),
            },
            validation: ValidationSection {
                assumevalid: pick(layers, |l| l.assumevalid.as_ref())
                    .unwrap_or_else(|| AssumeValid::default_for(&params)),
            },
            index: IndexSection {
                address: pick(layers, |l| l.address_index.as_ref()).unwrap_or(true),
                cache_mib: pick(layers, |l| l.index_cache_mib.as_ref())
                    .unwrap_or(crate::store::DEFAULT_INDEX_CACHE_MIB),
                rows_memory_mib: pick(layers, |l| l.rows_memory_mib.as_ref())
                    .unwrap_or(DEFAULT_ROWS_MEMORY_MIB),
                filter_cache_mib: pick(layers, |l| l.index_filter_cache_mib.as_ref())
                    .unwrap_or(DEFAULT_INDEX_FILTER_CACHE_MIB),
            },
            archive: ArchiveSection {
                filter_cache_mib: pick(layers, |l| l.archive_filter_cache_mib.as_ref())
                    .unwrap_or(DEFAULT_ARCHIVE_FILTER_CACHE_MIB),
            },
            mempool: Self::mempool_section(layers),
        }
    }

    /// The `[mempool]` section: Core's defaults, overridden by the layers.
    fn mempool_section(layers: &[&Layer]) -> MempoolSection {
        fn pick<T: Copy>(layers: &[&Layer], f: impl Fn(&Layer) -> Option<T>) -> Option<T> {
            layers.iter().find_map(|l| f(l))
        }
        let d = crate::mempool::MempoolConfig::default();
        MempoolSection {
            max_mib: pick(layers, |l| l.mempool_max_mib).unwrap_or(d.max_mib as usize),
            expiry_hours: pick(layers, |l| l.mempool_expiry_hours).unwrap_or(d.expiry_hours),
            persist: pick(layers, |l| l.mempool_persist).unwrap_or(d.persist),
            min_relay_feerate: pick(layers, |l| l.min_relay_feerate)
                .unwrap_or(d.policy.min_relay_feerate),
        }
    }

    /// The memory knobs of the stores, in bytes (`[index]` and
    /// `[archive]`).
    pub fn budgets(&self) -> crate::store::Budgets {
        crate::store::Budgets {
            index_cache_mib: self.index.cache_mib,
            rows: crate::store::runs::RowOptions {
                memory_bound: self.index.rows_memory_mib << 20,
                filter_cache: self.index.filter_cache_mib << 20,
            },
            archive_filter_cache: self.archive.filter_cache_mib << 20,
        }
    }

    /// The configuration as TOML, in the file format.
    ///
    /// # Errors
    /// [`ConfigError::Print`] (not expected: every field is representable).
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        Ok(toml::to_string(self)?)
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogFormat::Human => "human",
            LogFormat::Json => "json",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(rel: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
    }

    fn file_err(text: &str) -> (usize, String, String) {
        match Layer::from_toml_str(text, Path::new("x.toml")) {
            Err(ConfigError::File {
                line, key, message, ..
            }) => (line, key, message),
            other => panic!("expected a file error, got {other:?}"),
        }
    }

    #[test]
    fn shipped_files_parse_and_name_their_network() {
        for (name, net) in [
            ("regtest", Network::Regtest),
            ("signet", Network::Signet),
            ("testnet", Network::Testnet),
            ("testnet4", Network::Testnet4),
        ] {
            let path = repo(&format!("config/{name}.toml"));
            let layer = Layer::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(layer.network, Some(net), "{}", path.display());
            // Every documented value equals the built-in default, so the file
            // documents the defaults truthfully (datadir aside: it is $HOME's).
            let from_file = Config::resolve(&[&layer]);
            let defaults = Config::resolve(&[&Layer {
                network: Some(net),
                ..Layer::default()
            }]);
            assert_eq!(
                Config {
                    datadir: defaults.datadir.clone(),
                    ..from_file
                },
                defaults,
                "{}",
                path.display()
            );
        }
    }

    #[test]
    fn rpc_address_defaults_to_cores_port_and_takes_off() {
        let regtest = Config::resolve(&[]);
        assert_eq!(
            regtest.rpc.address,
            Some("127.0.0.1:18443".parse().expect("addr"))
        );
        let file = Layer::from_toml_str(
            "network = \"testnet4\"\n[rpc]\naddress = \"off\"\nuser = \"u\"\npassword = \"p\"\nauth = [\"a:s$00\"]\n",
            Path::new("c.toml"),
        )
        .expect("file");
        let c = Config::resolve(&[&file]);
        assert_eq!(c.rpc.address, None);
        assert_eq!(c.rpc.user.as_deref(), Some("u"));
        assert_eq!(c.rpc.auth, vec!["a:s$00".to_string()]);
        assert_eq!(
            Config::resolve(&[&Layer {
                network: Some(Network::Testnet4),
                ..Layer::default()
            }])
            .rpc
            .address,
            Some("127.0.0.1:48332".parse().expect("addr"))
        );
        let env =
            Layer::from_env([("KAKEHI_RPC".to_string(), "0.0.0.0:1".to_string())]).expect("env");
        assert_eq!(
            Config::resolve(&[&env, &file]).rpc.address,
            Some("0.0.0.0:1".parse().expect("addr"))
        );
        let off = Layer::from_env([("KAKEHI_RPC".to_string(), "OFF".to_string())]).expect("env");
        assert_eq!(Config::resolve(&[&off]).rpc.address, None);
        assert!(Layer::from_env([("KAKEHI_RPC".to_string(), "nope".to_string())]).is_err());
        let shown = toml::to_string(&c).expect("toml");
        assert!(shown.contains("address = \"off\""), "{shown}");
        assert!(shown.contains("password = \"***\""), "{shown}");
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let (line, key, msg) =
            file_err("network = \"regtest\"\n\n[http]\nadress = \"1.2.3.4:5\"\n");
        assert_eq!(line, 4);
        assert_eq!(key, "http.adress");
        assert!(msg.contains("unknown field"), "{msg}");
        let (line, key, _) = file_err("netwrk = \"regtest\"\n");
        assert_eq!((line, key.as_str()), (1, "netwrk"));
        let (line, key, _) = file_err("[p2pp]\nlisten = \"1.2.3.4:5\"\n");
        assert_eq!(line, 1);
        assert!(key.contains("p2pp"), "{key}");
    }

    #[test]
    fn bad_values_name_key_and_line() {
        let (line, key, msg) = file_err("network = \"mainnett\"\n");
        assert_eq!((line, key.as_str()), (1, "network"));
        assert!(msg.contains("unknown network"), "{msg}");
        let (line, key, _) = file_err("[p2p]\nconnect = [\"1.2.3.4:5\", \"nohost\"]\n");
        assert_eq!((line, key.as_str()), (2, "p2p.connect"));
        let (line, key, _) = file_err("[sozu]\n# comment\nshards = 3\n");
        assert_eq!((line, key.as_str()), (3, "sozu.shards"));
        let (line, key, msg) = file_err("[sozu]\nram_mib = 8\n");
        assert_eq!((line, key.as_str()), (2, "sozu.ram_mib"));
        assert!(msg.contains("memory budget"), "{msg}");
        let (line, key, msg) = file_err("[index]\ncache_mib = 4\n");
        assert_eq!((line, key.as_str()), (2, "index.cache_mib"));
        assert!(msg.contains("from 8 to"), "{msg}");
        let (line, key, msg) = file_err("[index]\nrows_memory_mib = 0\n");
        assert_eq!((line, key.as_str()), (2, "index.rows_memory_mib"));
        assert!(msg.contains("from 1 to"), "{msg}");
        let (line, key, msg) = file_err("[index]\nfilter_cache_mib = -1\n");
        assert_eq!((line, key.as_str()), (2, "index.filter_cache_mib"));
        assert!(msg.contains("from 0 to"), "{msg}");
        let (line, key, _) = file_err("[archive]\n\nfilter_cache_mib = 2000000\n");
        assert_eq!((line, key.as_str()), (3, "archive.filter_cache_mib"));
        let (line, key, _) = file_err("[archive]\nfilter_cache = 2\n");
        assert_eq!((line, key.as_str()), (2, "archive.filter_cache"));
        let (line, key, _) = file_err("[log]\nformat = \"xml\"\n");
        assert_eq!((line, key.as_str()), (2, "log.format"));
        let (line, key, msg) = file_err("[validation]\nassumevalid = \"yes\"\n");
        assert_eq!((line, key.as_str()), (2, "validation.assumevalid"));
        assert!(msg.contains("0 or a block hash"), "{msg}");
        let (line, _, _) = file_err("[http]\naddress = \n");
        assert_eq!(line, 2);
        // The Display form carries all three.
        let e = Layer::from_toml_str("[http]\naddress = 5\n", Path::new("c.toml"))
            .expect_err("bad value");
        let s = e.to_string();
        assert!(s.starts_with("c.toml:2: http.address:"), "{s}");
    }

    #[test]
    fn env_layer_parses_and_lists_unknown() {
        let env = |v: &[(&str, &str)]| {
            Layer::from_env(v.iter().map(|(a, b)| (a.to_string(), b.to_string())))
        };
        let l = env(&[
            ("KAKEHI_NETWORK", "signet"),
            ("KAKEHI_CONNECT", "1.2.3.4:38333, [::1]:38333"),
            ("KAKEHI_ADDNODE", ""),
            ("KAKEHI_LOG_FILTER", "debug"),
            ("RUST_LOG", "warn"),
            ("KAKEHI_SOZU_SHARDS", "4"),
            ("KAKEHI_SOZU_RAM_MIB", "2048"),
            ("KAKEHI_INDEX_CACHE_MIB", "64"),
            ("KAKEHI_INDEX_ROWS_MEMORY_MIB", "2"),
            ("KAKEHI_INDEX_FILTER_CACHE_MIB", "0"),
            ("KAKEHI_ARCHIVE_FILTER_CACHE_MIB", "3"),
            ("PATH", "/bin"),
            ("KAKEHI_NETWROK", "regtest"),
        ])
        .expect("valid env");
        assert_eq!(l.network, Some(Network::Signet));
        assert_eq!(l.connect.as_ref().map(Vec::len), Some(2));
        assert_eq!(l.addnode, Some(vec![]));
        assert_eq!(l.log_filter.as_deref(), Some("warn"));
        assert_eq!(l.sozu_shards, Some(4));
        assert_eq!(l.sozu_ram_mib, Some(2048));
        assert_eq!(l.index_cache_mib, Some(64));
        assert_eq!(l.rows_memory_mib, Some(2));
        assert_eq!(l.index_filter_cache_mib, Some(0));
        assert_eq!(l.archive_filter_cache_mib, Some(3));
        let budgets = Config::resolve(&[&l]).budgets();
        assert_eq!(budgets.rows.memory_bound, 2 << 20);
        assert_eq!(budgets.rows.filter_cache, 0);
        assert_eq!(budgets.archive_filter_cache, 3 << 20);
        assert_eq!(l.unknown_env, vec!["KAKEHI_NETWROK".to_string()]);
        for bad in [
            ("KAKEHI_HTTP", "localhost"),
            ("KAKEHI_SOZU_SHARDS", "0"),
            ("KAKEHI_SOZU_RAM_MIB", "lots"),
            ("KAKEHI_SOZU_RAM_MIB", "2097152"),
            ("KAKEHI_INDEX_CACHE_MIB", "7"),
            ("KAKEHI_INDEX_ROWS_MEMORY_MIB", "0"),
            ("KAKEHI_INDEX_FILTER_CACHE_MIB", "1048577"),
            ("KAKEHI_ARCHIVE_FILTER_CACHE_MIB", "x"),
            ("KAKEHI_LOG_FORMAT", "xml"),
            ("KAKEHI_ASSUMEVALID", "1"),
            ("KAKEHI_ASSUMEVALID", "00ff"),
        ] {
            match env(&[bad]) {
                Err(ConfigError::Env { var, .. }) => assert_eq!(var, bad.0),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn precedence_cli_env_file_default() {
        let file = Layer::from_toml_str(
            "network = \"testnet\"\n[http]\naddress = \"0.0.0.0:1\"\n[p2p]\nconnect = [\"1.1.1.1:1\"]\n[log]\nformat = \"json\"\n",
            Path::new("f.toml"),
        )
        .expect("file");
        let env = Layer::from_env([
            ("KAKEHI_NETWORK".to_string(), "signet".to_string()),
            ("KAKEHI_HTTP".to_string(), "0.0.0.0:2".to_string()),
        ])
        .expect("env");
        let cli = Layer {
            network: Some(Network::Regtest),
            ..Layer::default()
        };
        let c = Config::resolve(&[&cli, &env, &file]);
        assert_eq!(c.network, Network::Regtest); // CLI over env and file
        assert_eq!(c.http.address, "0.0.0.0:2".parse().expect("addr")); // env over file
        assert_eq!(
            c.p2p.connect,
            vec!["1.1.1.1:1".parse::<PeerAddress>().expect("addr")]
        ); // file
        assert_eq!(c.log.format, LogFormat::Json); // file over default
        assert_eq!(c.log.filter, DEFAULT_LOG_FILTER); // default
        assert_eq!(c.sozu.shards, DEFAULT_SOZU_SHARDS);
        // Regtest verifies every script by default; an explicit hash wins.
        assert_eq!(c.validation.assumevalid, AssumeValid::Off);
        let hash = "00000008414aab61092ef93f1aacc54cf9e9f16af29ddad493b908a01ff5c329";
        let signet = Layer {
            network: Some(Network::Signet),
            ..Layer::default()
        };
        let s = Config::resolve(&[&signet]);
        assert_eq!(
            s.validation.assumevalid.to_string(),
            hash,
            "signet's default"
        );
        let off =
            Layer::from_env([("KAKEHI_ASSUMEVALID".to_string(), "0".to_string())]).expect("env");
        let s = Config::resolve(&[&off, &signet]);
        assert_eq!(s.validation.assumevalid, AssumeValid::Off);
        assert_eq!(c.sozu.ram_mib, crate::sozu::DEFAULT_RAM_MIB);
        // Network-dependent defaults follow the resolved network.
        assert!(
            c.datadir.ends_with(".kakehi/regtest"),
            "{}",
            c.datadir.display()
        );
        let c = Config::resolve(&[&env]);
        assert_eq!(c.network, Network::Signet);
        assert!(c.datadir.ends_with(".kakehi/signet"));
        let c = Config::resolve(&[&Layer {
            network: Some(Network::Testnet4),
            ..Layer::default()
        }]);
        assert_eq!(
            c.http.address.port(),
            ChainParams::new(Network::Testnet4).http_port
        );
    }

    #[test]
    fn peer_addresses_take_ips_and_host_names() {
        for (s, host, port) in [
            ("10.0.0.2:18444", "10.0.0.2", 18444),
            ("[::1]:8333", "::1", 8333),
            ("bitcoind:18444", "bitcoind", 18444),
            ("seed.example.org:38333", "seed.example.org", 38333),
        ] {
            let p: PeerAddress = s.parse().unwrap_or_else(|e| panic!("{e}"));
            assert_eq!((p.host.as_str(), p.port), (host, port));
            assert_eq!(p.to_string().parse::<PeerAddress>(), Ok(p.clone()));
        }
        for bad in [
            "bitcoind",
            ":18444",
            "host:",
            "host:70000",
            "ho st:1",
            "host:0",
        ] {
            assert!(bad.parse::<PeerAddress>().is_err(), "{bad}");
        }
        let p: PeerAddress = "127.0.0.1:18444".parse().expect("addr");
        assert_eq!(
            p.resolve().expect("resolve"),
            vec![SocketAddr::from(([127, 0, 0, 1], 18444))]
        );
    }

    #[test]
    fn show_round_trips_through_the_file_parser() {
        let c = Config::resolve(&[&Layer {
            network: Some(Network::Signet),
            listen: Some("0.0.0.0:38333".parse().expect("addr")),
            connect: Some(vec!["10.0.0.1:38333".parse().expect("addr")]),
            addnode: Some(vec!["bitcoind:38333".parse().expect("addr")]),
            ..Layer::default()
        }]);
        let text = c.to_toml().expect("toml");
        let back = Layer::from_toml_str(&text, Path::new("shown.toml")).expect("parse shown");
        assert_eq!(Config::resolve(&[&back]), c);
    }
}
