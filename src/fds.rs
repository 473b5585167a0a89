//! File descriptors: the process's limit, how it is shared between the
//! stores and the servers, and running out of them as back-pressure.
//!
//! As Bitcoin Core's `init.cpp` does (`RaiseFileDescriptorLimit`, then
//! `nMaxConnections` trimmed to what is left after
//! `MIN_CORE_FILEDESCRIPTORS`): at start the soft `RLIMIT_NOFILE` is raised
//! towards the hard limit ([`raise_limit`]), descriptors are reserved for
//! the stores (those open once the chain state is open, plus
//! [`STORAGE_FD_HEADROOM`]) and for servers still to come
//! ([`SERVERS_FD_RESERVE`]), and the HTTP connection cap and the P2P peer
//! caps are derived from what is left, never above their configured
//! maxima ([`FdBudget::plan`]). A client holding idle connections then
//! runs into the HTTP cap (further connections wait in the kernel's accept
//! queue) long before the stores run out of descriptors.
//!
//! `EMFILE`/`ENFILE` is not a disk failure: a store that still meets one
//! (an estimate exceeded, another process using the system's table)
//! retries the `open` for a while ([`retry_exhausted`]) instead of
//! stopping the chain state, and the accept loops pause and log at most
//! once per [`LogThrottle`] period.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

/// The soft limit the node asks for at start (capped by the hard limit):
/// 1,024 HTTP connections + 134 P2P descriptors (125 peers, 8 manual
/// peers, a listener) + [`STORAGE_FD_HEADROOM`] + [`SERVERS_FD_RESERVE`]
/// is about 1,300, and the stores of a mainnet datadir hold about 600 at
/// start (about 460 sealed archive epochs, the index rows' run files, the
/// Sozu table's page files, sled): 8,192 covers it with room for the
/// chain's growth. Core asks for just what it needs; asking for more costs
/// nothing with epoll.
pub const WANTED_FD_LIMIT: u64 = 8192;

/// Descriptors the stores may open while the node runs, beyond those open
/// when the chain state has just been opened (counted then):
/// - flat files: 4 directories (`blocks`, `filters`, `spent`, `headers`) ×
///   (1 writer + 4 kept read handles) = 20;
/// - the Sozu table: its reader keeps 16 idle storage handles and a
///   template, the writer clones one per checkpoint; each opens the page
///   files its reads reach, about 4 in steady state (2 shards, the deeper
///   layers): 18 × 4 = 72;
/// - the index rows: a flush's new run file, a compaction's output and its
///   inputs: 16;
/// - the archive: a new epoch file and its temporary file: 2; sled: its
///   blob and snapshot files: 4; directory fsyncs and the address book's
///   temporary file: 4.
///
/// 118 in all, rounded up to 128 (Core reserves 150,
/// `MIN_CORE_FILEDESCRIPTORS`). An estimate: a store that goes past it
/// waits for a descriptor ([`retry_exhausted`]) rather than failing.
pub const STORAGE_FD_HEADROOM: usize = 128;

/// Descriptors kept for the servers that are not written yet (a JSON-RPC
/// server, an Electrum server): their listeners and first clients, so that
/// they do not come out of HTTP's or P2P's share when they land.
pub const SERVERS_FD_RESERVE: usize = 16;

/// P2P descriptors beside the peer cap: Core's `MAX_ADDNODE_CONNECTIONS`
/// (8) manual peers and the listener.
pub const P2P_EXTRA_FDS: usize = 8 + 1;

/// Fewest HTTP connections and P2P peers the node starts with: below, the
/// limit is refused at start (Core: "Not enough file descriptors
/// available").
pub const MIN_CONNECTIONS: usize = 8;

/// How long a store waits in all for a descriptor ([`retry_exhausted`]):
/// about 10 s.
const EXHAUSTED_WAIT: Duration = Duration::from_secs(10);

/// Errors of the descriptor budget.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FdError {
    /// The limit leaves too little beside the stores.
    #[error(
        "not enough file descriptors: the limit is {limit}, the stores need {reserved} and at \
         least {needed} more are needed for HTTP and P2P (raise `ulimit -n`)"
    )]
    TooFew {
        /// The process's limit (`RLIMIT_NOFILE`, soft).
        limit: u64,
        /// Descriptors reserved for the stores and future servers.
        reserved: usize,
        /// The least the servers need beside them.
        needed: usize,
    },
}

/// The soft `RLIMIT_NOFILE` before and after [`raise_limit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdLimit {
    /// The soft limit found at start.
    pub before: u64,
    /// The soft limit now.
    pub now: u64,
}

/// Raises the soft `RLIMIT_NOFILE` to `wanted`, or to the hard limit if
/// that is lower (never lowers it); returns the limits before and after.
/// `None` where the limit cannot be read (not Linux): the caller then
/// assumes its configured maxima fit. A refused raise keeps the old limit.
pub fn raise_limit(wanted: u64) -> Option<FdLimit> {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
        let old = getrlimit(Resource::Nofile);
        // `None` is RLIM_INFINITY.
        let before = old.current.unwrap_or(u64::MAX);
        let target = wanted.min(old.maximum.unwrap_or(u64::MAX));
        if target > before {
            let new = Rlimit {
                current: Some(target),
                maximum: old.maximum,
            };
            if let Err(e) = setrlimit(Resource::Nofile, new) {
                tracing::warn!(error = %e, wanted = target, "cannot raise the open-files limit");
            }
        }
        let now = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
        Some(FdLimit { before, now })
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = wanted;
        None
    }
}

/// Descriptors the process holds now (`/proc/self/fd`, Linux), or `None`
/// where it cannot tell.
pub fn open_count() -> Option<usize> {
    // The directory's own descriptor, open while it is read, is counted
    // too: one more than the rest, on the safe side.
    std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.filter(|e| e.is_ok()).count())
}

/// The configured maxima the budget trims.
#[derive(Clone, Copy, Debug)]
pub struct FdWants {
    /// HTTP connections (`HttpConfig::max_connections`).
    pub http_connections: usize,
    /// P2P peers in total (`P2pConfig::max_total`).
    pub p2p_total: usize,
    /// Inbound P2P peers (`P2pConfig::max_inbound`).
    pub p2p_inbound: usize,
    /// Outbound full-relay peers (`P2pConfig::max_outbound_full_relay`).
    pub p2p_outbound: usize,
}

/// How the process's descriptors are shared (logged at start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdBudget {
    /// The soft limit (`None`: unknown, the maxima are used as they are).
    pub limit: Option<u64>,
    /// Reserved for the stores (open at start + [`STORAGE_FD_HEADROOM`])
    /// and [`SERVERS_FD_RESERVE`].
    pub reserved: usize,
    /// HTTP connections at once.
    pub http_connections: usize,
    /// P2P peers in total.
    pub p2p_total: usize,
    /// Inbound P2P peers.
    pub p2p_inbound: usize,
    /// Outbound full-relay P2P peers.
    pub p2p_outbound: usize,
}

impl FdBudget {
    /// Shares `limit` descriptors: the stores' `held` (open now) plus
    /// [`STORAGE_FD_HEADROOM`] and [`SERVERS_FD_RESERVE`] first; of the
    /// rest, P2P gets what its peer cap needs ([`P2P_EXTRA_FDS`] more) but
    /// at most half, and HTTP what P2P leaves; neither above `wants`. Core
    /// trims its peer cap the same way (`init.cpp`). An unknown limit
    /// keeps `wants`.
    ///
    /// # Errors
    /// [`FdError::TooFew`] when the rest cannot give [`MIN_CONNECTIONS`]
    /// to HTTP and to P2P.
    pub fn plan(limit: Option<u64>, held: usize, wants: FdWants) -> Result<Self, FdError> {
        let reserved = held + STORAGE_FD_HEADROOM + SERVERS_FD_RESERVE;
        let Some(limit) = limit else {
            return Ok(FdBudget {
                limit: None,
                reserved,
                http_connections: wants.http_connections,
                p2p_total: wants.p2p_total,
                p2p_inbound: wants.p2p_inbound,
                p2p_outbound: wants.p2p_outbound,
            });
        };
        // Half of the rest each: P2P's half must hold its extras and
        // MIN_CONNECTIONS peers.
        let needed = 2 * (MIN_CONNECTIONS + P2P_EXTRA_FDS);
        let rest = usize::try_from(limit)
            .unwrap_or(usize::MAX)
            .saturating_sub(reserved);
        if rest < needed {
            return Err(FdError::TooFew {
                limit,
                reserved,
                needed,
            });
        }
        let p2p_fds = (wants.p2p_total + P2P_EXTRA_FDS).min(rest / 2);
        let p2p_total = wants.p2p_total.min(p2p_fds - P2P_EXTRA_FDS);
        let p2p_outbound = wants.p2p_outbound.min(p2p_total);
        let p2p_inbound = wants.p2p_inbound.min(p2p_total - p2p_outbound);
        Ok(FdBudget {
            limit: Some(limit),
            reserved,
            http_connections: wants.http_connections.min(rest - p2p_fds),
            p2p_total,
            p2p_inbound,
            p2p_outbound,
        })
    }
}

/// Whether `e` is the process (`EMFILE`) or the system (`ENFILE`) running
/// out of file descriptors.
pub fn is_exhausted(e: &io::Error) -> bool {
    // Linux's and the BSDs' numbers agree: ENFILE 23, EMFILE 24.
    matches!(e.raw_os_error(), Some(23 | 24))
}

/// Runs `open` (an `open(2)` or `socket(2)`: nothing changes when it
/// fails) and, while it fails for want of descriptors ([`is_exhausted`]),
/// again after a pause (10 ms doubling to 1 s, about 10 s in all): a
/// store waits for a descriptor to come back instead of taking a full
/// table for a disk failure. Logs a warning naming `path` once per call
/// that had to wait.
///
/// # Errors
/// `open`'s error: any other at once, the exhaustion once the wait is over.
pub fn retry_exhausted<T>(path: &Path, mut open: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(10);
    loop {
        match open() {
            Err(e) if is_exhausted(&e) && started.elapsed() < EXHAUSTED_WAIT => {
                if pause == Duration::from_millis(10) {
                    tracing::warn!(path = %path.display(), error = %e, "out of file descriptors: waiting for one");
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            r => return r,
        }
    }
}

/// At most one log line per `period` for a repeated event (an accept loop
/// failing): [`LogThrottle::hit`] says when to log, with how many events
/// were not logged since the last line.
#[derive(Debug)]
pub struct LogThrottle {
    period: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl LogThrottle {
    /// A throttle of one line per `period`.
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            last: None,
            suppressed: 0,
        }
    }

    /// Records one event: `Some(n)` if it should be logged, `n` events
    /// having gone unlogged before it; `None` to stay quiet.
    pub fn hit(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < self.period)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WANTS: FdWants = FdWants {
        http_connections: 1024,
        p2p_total: 125,
        p2p_inbound: 117,
        p2p_outbound: 8,
    };

    #[test]
    fn a_large_limit_keeps_the_configured_maxima() {
        let b = FdBudget::plan(Some(8192), 40, WANTS).expect("fits");
        assert_eq!(b.reserved, 40 + STORAGE_FD_HEADROOM + SERVERS_FD_RESERVE);
        assert_eq!(
            (
                b.http_connections,
                b.p2p_total,
                b.p2p_inbound,
                b.p2p_outbound
            ),
            (1024, 125, 117, 8)
        );
    }

    #[test]
    fn a_small_limit_is_shared_and_never_overcommitted() {
        for limit in [220u64, 256, 512, 1024, 1500] {
            let b = FdBudget::plan(Some(limit), 40, WANTS).expect("fits");
            let used = b.reserved + b.http_connections + b.p2p_total + P2P_EXTRA_FDS;
            assert!(used as u64 <= limit, "{limit}: {b:?}");
            assert!(b.http_connections >= MIN_CONNECTIONS && b.p2p_total >= MIN_CONNECTIONS);
            assert!(b.p2p_inbound + b.p2p_outbound <= b.p2p_total);
        }
        let b = FdBudget::plan(Some(256), 30, WANTS).expect("fits");
        // 256 - (30 + 128 + 16) = 82: P2P 41 descriptors (32 peers), HTTP 41.
        assert_eq!(
            (b.http_connections, b.p2p_total, b.p2p_outbound),
            (41, 32, 8)
        );
    }

    #[test]
    fn too_small_a_limit_is_refused() {
        assert!(matches!(
            FdBudget::plan(Some(150), 30, WANTS),
            Err(FdError::TooFew { limit: 150, .. })
        ));
        assert_eq!(
            FdBudget::plan(None, 30, WANTS)
                .expect("unknown")
                .http_connections,
            1024
        );
    }

    #[test]
    fn exhaustion_is_retried_and_other_errors_are_not() {
        let mut calls = 0;
        let r = retry_exhausted(Path::new("x"), || {
            calls += 1;
            if calls < 3 {
                Err(io::Error::from_raw_os_error(24))
            } else {
                Ok(calls)
            }
        });
        assert_eq!(r.expect("third try"), 3);
        let mut calls = 0;
        let r: io::Result<()> = retry_exhausted(Path::new("x"), || {
            calls += 1;
            Err(io::Error::from_raw_os_error(28))
        });
        assert!(r.is_err() && calls == 1);
    }

    #[test]
    fn the_throttle_logs_once_per_period_with_the_count() {
        let mut t = LogThrottle::new(Duration::from_secs(3600));
        assert_eq!(t.hit(), Some(0));
        assert_eq!(t.hit(), None);
        assert_eq!(t.hit(), None);
        t.last = Some(Instant::now() - Duration::from_secs(7200));
        assert_eq!(t.hit(), Some(2));
    }
}
