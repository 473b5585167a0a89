//! Address book (fed by DNS seeds and addr/addrv2 gossip, persisted as JSON
//! by write-to-temp-and-rename) and the in-memory ban list.
//!
//! File format (`peers.json`, UTF-8 JSON):
//! `{"version": 1, "addrs": [{"addr": "203.0.113.5:18333", "services": 1033,
//! "last_seen": 1700000000, "failures": 0}, …]}`; `services` is the u64
//! service bit field, `last_seen` unix seconds. At most [`MAX_ADDRS`]
//! entries. A missing or unreadable file starts an empty book (logged).

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::store::durable;

/// Maximum entries kept in the address book.
pub const MAX_ADDRS: usize = 20_000;
/// Entries that failed this many times in a row are dropped.
pub const MAX_FAILURES: u32 = 10;

/// One known address.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct AddrEntry {
    /// The peer's address.
    pub addr: SocketAddr,
    /// Service bits it advertised (or that the source claimed).
    pub services: u64,
    /// Last time it was seen or advertised, unix seconds.
    pub last_seen: u32,
    /// Failed connection attempts in a row.
    pub failures: u32,
    /// When we last tried it (not persisted).
    #[serde(skip)]
    pub last_try: Option<Instant>,
}

#[derive(Serialize, Deserialize)]
struct AddrFile {
    version: u32,
    addrs: Vec<AddrEntry>,
}

/// Errors of the address book's file. The book is not consensus data: the
/// node logs them and goes on with the book it has in memory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AddrBookError {
    /// The file, its temporary copy or its directory cannot be read,
    /// written or synced.
    #[error("address book {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not JSON of the book's format (or the book cannot be
    /// encoded).
    #[error("address book {path}: not a book of format version 1: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The decoder's error.
        #[source]
        source: serde_json::Error,
    },
}

impl AddrBookError {
    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| AddrBookError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The address book. Not thread-safe on its own; the network keeps it in a
/// mutex.
#[derive(Debug)]
pub struct AddrBook {
    entries: HashMap<SocketAddr, AddrEntry>,
    rng: u64,
}

fn now_unix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as u32)
        .unwrap_or(0)
}

impl AddrBook {
    /// An empty book whose selection draws from `seed` (the P2P layer
    /// passes a value drawn from the OS, so peers cannot predict which
    /// addresses are dialed).
    pub fn new(seed: u64) -> Self {
        AddrBook {
            entries: HashMap::new(),
            rng: seed | 1,
        }
    }

    /// Loads the book from `path`; an absent file gives an empty book.
    /// `seed` as in [`AddrBook::new`].
    ///
    /// # Errors
    /// [`AddrBookError`] naming `path`: it exists but cannot be read, or is
    /// not a book of this format.
    pub fn load(path: &Path, seed: u64) -> Result<Self, AddrBookError> {
        let mut book = Self::new(seed);
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(book),
            Err(source) => return Err(AddrBookError::io(path)(source)),
        };
        let file: AddrFile =
            serde_json::from_slice(&bytes).map_err(|source| AddrBookError::Json {
                path: path.to_path_buf(),
                source,
            })?;
        for e in file.addrs.into_iter().take(MAX_ADDRS) {
            book.entries.insert(e.addr, e);
        }
        Ok(book)
    }

    /// Writes the book to `path` atomically: `path` with the extension
    /// `tmp` written and fsynced, renamed over `path`, the directory
    /// fsynced. Every step passes the I/O fault seam
    /// ([`crate::store::durable`]).
    ///
    /// # Errors
    /// [`AddrBookError::Io`] naming the file or directory that failed.
    /// Before the rename (the temporary file's write or fsync, the rename)
    /// nothing changed: `path` holds the previous book and the temporary
    /// file is removed. A failed directory fsync comes after the rename:
    /// `path` holds this book, which a power cut may turn back into the
    /// previous one (either is a whole book).
    pub fn save(&self, path: &Path) -> Result<(), AddrBookError> {
        let file = AddrFile {
            version: 1,
            addrs: self.entries.values().cloned().collect(),
        };
        let bytes = serde_json::to_vec(&file).map_err(|source| AddrBookError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        let tmp: PathBuf = path.with_extension("tmp");
        let replaced = durable::write_synced(&tmp, &bytes)
            .map_err(AddrBookError::io(&tmp))
            .and_then(|()| durable::rename(&tmp, path).map_err(AddrBookError::io(path)));
        if let Err(e) = replaced {
            let _ = durable::remove_file(&tmp);
            return Err(e);
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        durable::sync_dir(dir).map_err(AddrBookError::io(dir))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the book is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds or refreshes an address (from a DNS seed or gossip). Ignored
    /// when the book is full and the address is new, or the port is 0.
    pub fn add(&mut self, addr: SocketAddr, services: u64, last_seen: Option<u32>) {
        if addr.port() == 0 || addr.ip().is_unspecified() {
            return;
        }
        let seen = last_seen
            .unwrap_or_else(now_unix)
            .min(now_unix().saturating_add(600));
        if let Some(e) = self.entries.get_mut(&addr) {
            e.last_seen = e.last_seen.max(seen);
            e.services |= services;
            return;
        }
        if self.entries.len() >= MAX_ADDRS {
            return;
        }
        self.entries.insert(
            addr,
            AddrEntry {
                addr,
                services,
                last_seen: seen,
                failures: 0,
                last_try: None,
            },
        );
    }

    /// Records a successful connection.
    pub fn mark_good(&mut self, addr: SocketAddr, services: u64) {
        if let Some(e) = self.entries.get_mut(&addr) {
            e.failures = 0;
            e.services = services;
            e.last_seen = now_unix();
        }
    }

    /// Records a failed attempt; drops the entry after [`MAX_FAILURES`].
    pub fn mark_failed(&mut self, addr: SocketAddr) {
        let drop = match self.entries.get_mut(&addr) {
            Some(e) => {
                e.failures += 1;
                e.failures >= MAX_FAILURES
            }
            None => false,
        };
        if drop {
            self.entries.remove(&addr);
        }
    }

    fn next_rand(&mut self) -> u64 {
        // xorshift64*: selection only needs to be unpredictable enough to
        // spread connections, not cryptographic.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Picks an address to dial: not in `exclude`, not rejected by `banned`,
    /// and not tried within 60 s × 2^failures. Marks it tried.
    pub fn select(
        &mut self,
        exclude: &HashSet<SocketAddr>,
        banned: impl Fn(IpAddr) -> bool,
    ) -> Option<SocketAddr> {
        let now = Instant::now();
        let candidates: Vec<SocketAddr> = self
            .entries
            .values()
            .filter(|e| !exclude.contains(&e.addr) && !banned(e.addr.ip()))
            .filter(|e| match e.last_try {
                Some(t) => now.duration_since(t) >= Duration::from_secs(60 << e.failures.min(6)),
                None => true,
            })
            .map(|e| e.addr)
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let pick = candidates[(self.next_rand() % candidates.len() as u64) as usize];
        if let Some(e) = self.entries.get_mut(&pick) {
            e.last_try = Some(now);
        }
        Some(pick)
    }

    /// Up to `max` entries for a `getaddr` answer, most recently seen first.
    pub fn sample(&self, max: usize) -> Vec<AddrEntry> {
        let mut all: Vec<AddrEntry> = self.entries.values().cloned().collect();
        all.sort_by_key(|e| std::cmp::Reverse(e.last_seen));
        all.truncate(max);
        all
    }
}

/// Discouraged IP addresses with their expiry.
#[derive(Debug, Default)]
pub struct BanList {
    until: HashMap<IpAddr, Instant>,
}

impl BanList {
    /// Discourages `ip` for `duration`.
    pub fn ban(&mut self, ip: IpAddr, duration: Duration) {
        let until = Instant::now() + duration;
        let e = self.until.entry(ip).or_insert(until);
        *e = (*e).max(until);
    }

    /// Whether `ip` is currently discouraged.
    pub fn is_banned(&self, ip: IpAddr) -> bool {
        self.until.get(&ip).is_some_and(|t| *t > Instant::now())
    }

    /// Drops expired entries.
    pub fn purge_expired(&mut self) {
        let now = Instant::now();
        self.until.retain(|_, t| *t > now);
    }

    /// The addresses discouraged now, in order.
    pub fn discouraged(&self) -> Vec<IpAddr> {
        let now = Instant::now();
        let mut v: Vec<IpAddr> = self
            .until
            .iter()
            .filter(|(_, t)| **t > now)
            .map(|(ip, _)| *ip)
            .collect();
        v.sort();
        v
    }

    /// Number of entries (expired ones included until next looked up).
    pub fn len(&self) -> usize {
        self.until.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.until.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_load_round_trip_and_select() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peers.json");
        let mut book = AddrBook::new(0x5eed);
        let a: SocketAddr = "192.0.2.1:18444".parse().unwrap();
        let b: SocketAddr = "[2001:db8::1]:18444".parse().unwrap();
        book.add(a, 9, Some(1_700_000_000));
        book.add(b, 1, None);
        book.add("192.0.2.2:0".parse().unwrap(), 1, None); // port 0: ignored
        book.save(&path).unwrap();
        assert!(!path.with_extension("tmp").exists());
        let mut loaded = AddrBook::load(&path, 1).unwrap();
        assert_eq!(loaded.len(), 2);
        let mut seen = HashSet::new();
        while let Some(x) = loaded.select(&HashSet::new(), |_| false) {
            seen.insert(x);
        }
        // Both picked once, then both are in their retry back-off.
        assert_eq!(seen, [a, b].into_iter().collect());
        assert!(AddrBook::load(&dir.path().join("absent.json"), 1)
            .unwrap()
            .is_empty());
        std::fs::write(&path, b"{not json").unwrap();
        assert!(AddrBook::load(&path, 1).is_err());
    }

    #[test]
    fn failures_drop_entries_and_bans_expire() {
        let mut book = AddrBook::new(0x5eed);
        let a: SocketAddr = "192.0.2.1:18444".parse().unwrap();
        book.add(a, 1, None);
        for _ in 0..MAX_FAILURES {
            book.mark_failed(a);
        }
        assert!(book.is_empty());
        let mut bans = BanList::default();
        bans.ban(a.ip(), Duration::from_millis(30));
        assert!(bans.is_banned(a.ip()));
        std::thread::sleep(Duration::from_millis(40));
        assert!(!bans.is_banned(a.ip()));
    }
}
