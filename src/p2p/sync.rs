//! Block download scheduling shared by all peers: which block is in flight
//! from which peer since when, the per-peer cap, and stall detection with an
//! adaptive timeout (Core's `BLOCK_STALLING_TIMEOUT_DEFAULT` 2 s doubled on
//! each stall up to 64 s, decayed by 0.85 on each block received;
//! `net_processing.cpp`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bitcoin::BlockHash;

/// Blocks above the validated tip that may be requested (Core's
/// `BLOCK_DOWNLOAD_WINDOW`).
pub const DOWNLOAD_WINDOW: usize = 1_024;
/// Blocks in flight per peer (Core's `MAX_BLOCKS_IN_TRANSIT_PER_PEER`).
pub const MAX_IN_FLIGHT_PER_PEER: usize = 16;

/// A peer's id, unique for the life of the process.
pub type PeerId = u64;

/// In-flight block requests.
#[derive(Debug)]
pub struct Scheduler {
    in_flight: HashMap<BlockHash, (PeerId, Instant)>,
    per_peer: HashMap<PeerId, usize>,
    stall_timeout: Duration,
    stall_base: Duration,
    stall_max: Duration,
}

impl Scheduler {
    /// A scheduler whose stall timeout starts at `stall_base` and adapts up
    /// to `stall_max`.
    pub fn new(stall_base: Duration, stall_max: Duration) -> Self {
        Scheduler {
            in_flight: HashMap::new(),
            per_peer: HashMap::new(),
            stall_timeout: stall_base,
            stall_base,
            stall_max,
        }
    }

    /// Blocks in flight from `peer`.
    pub fn in_flight_of(&self, peer: PeerId) -> usize {
        self.per_peer.get(&peer).copied().unwrap_or(0)
    }

    /// Total blocks in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The current stall timeout.
    pub fn stall_timeout(&self) -> Duration {
        self.stall_timeout
    }

    /// Assigns to `peer` up to its free capacity the first blocks of
    /// `window` (chain order) that are not in flight and that `skip` does
    /// not exclude (blocks the peer said it does not have).
    pub fn assign(
        &mut self,
        peer: PeerId,
        window: &[BlockHash],
        skip: impl Fn(&BlockHash) -> bool,
        now: Instant,
    ) -> Vec<BlockHash> {
        let free = MAX_IN_FLIGHT_PER_PEER.saturating_sub(self.in_flight_of(peer));
        let picked: Vec<BlockHash> = window
            .iter()
            .filter(|h| !self.in_flight.contains_key(*h) && !skip(h))
            .take(free)
            .copied()
            .collect();
        for h in &picked {
            self.in_flight.insert(*h, (peer, now));
        }
        *self.per_peer.entry(peer).or_insert(0) += picked.len();
        picked
    }

    /// Whether `hash` is in flight from `peer` (asked of it, not yet
    /// received); unlike [`Scheduler::received`], changes nothing.
    pub fn is_in_flight_from(&self, peer: PeerId, hash: &BlockHash) -> bool {
        matches!(self.in_flight.get(hash), Some((p, _)) if *p == peer)
    }

    /// A block arrived from `peer`: returns whether it was requested from
    /// that peer, and frees the slot; the stall timeout decays.
    pub fn received(&mut self, peer: PeerId, hash: &BlockHash) -> bool {
        let freed = self.free_slot(peer, hash);
        if freed {
            self.stall_timeout = self.stall_timeout.mul_f64(0.85).max(self.stall_base);
        }
        freed
    }

    /// `peer` said it does not have `hash` (notfound): frees the slot.
    pub fn release(&mut self, peer: PeerId, hash: &BlockHash) {
        self.free_slot(peer, hash);
    }

    /// Frees `peer`'s slot for `hash`; whether it held one.
    fn free_slot(&mut self, peer: PeerId, hash: &BlockHash) -> bool {
        if !self.is_in_flight_from(peer, hash) {
            return false;
        }
        self.in_flight.remove(hash);
        if let Some(n) = self.per_peer.get_mut(&peer) {
            *n = n.saturating_sub(1);
        }
        true
    }

    /// `peer` disconnected: every block it had in flight becomes free.
    pub fn release_peer(&mut self, peer: PeerId) {
        self.in_flight.retain(|_, (p, _)| *p != peer);
        self.per_peer.remove(&peer);
    }

    /// The peer blocking the window: the one holding `window[0]` for longer
    /// than the stall timeout. The caller calls this only when the window
    /// is what keeps it from requesting more.
    pub fn staller(&self, window: &[BlockHash], now: Instant) -> Option<PeerId> {
        let first = window.first()?;
        let (peer, since) = self.in_flight.get(first)?;
        (now.duration_since(*since) > self.stall_timeout).then_some(*peer)
    }

    /// A staller was disconnected: double the timeout (up to the maximum).
    pub fn on_stall(&mut self) {
        self.stall_timeout = (self.stall_timeout * 2).min(self.stall_max);
    }

    /// How long `peer`'s oldest request has been waiting.
    pub fn oldest_wait(&self, peer: PeerId, now: Instant) -> Option<Duration> {
        self.in_flight
            .values()
            .filter(|(p, _)| *p == peer)
            .map(|(_, t)| now.duration_since(*t))
            .max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::hashes::Hash;

    fn h(i: u8) -> BlockHash {
        BlockHash::from_byte_array([i; 32])
    }

    #[test]
    fn assignment_caps_and_release() {
        let mut s = Scheduler::new(Duration::from_secs(2), Duration::from_secs(64));
        let window: Vec<BlockHash> = (0..40).map(h).collect();
        let now = Instant::now();
        let a = s.assign(1, &window, |_| false, now);
        assert_eq!(a, window[..16].to_vec());
        let b = s.assign(2, &window, |x| *x == h(16), now);
        assert_eq!(b[0], h(17));
        assert_eq!(b.len(), 16);
        assert!(s.assign(1, &window, |_| false, now).is_empty());
        // Asking changes nothing; only the peer asked has it in flight.
        assert!(s.is_in_flight_from(1, &h(0)));
        assert!(!s.is_in_flight_from(2, &h(0)));
        assert!(!s.is_in_flight_from(1, &h(16)), "never assigned");
        assert_eq!(s.in_flight_of(1), 16);
        assert!(s.received(1, &h(0)));
        assert!(!s.is_in_flight_from(1, &h(0)), "received");
        assert!(!s.received(2, &h(1)), "block 1 was requested from peer 1");
        assert_eq!(s.in_flight_of(1), 15);
        // notfound frees the slot of the peer asked, not another's.
        s.release(2, &h(1));
        assert!(s.is_in_flight_from(1, &h(1)));
        s.release(1, &h(1));
        assert!(!s.is_in_flight_from(1, &h(1)));
        assert_eq!(s.in_flight_of(1), 14);
        s.release_peer(1);
        assert_eq!(s.in_flight_of(1), 0);
        // The backend no longer lists block 0 (received); 1 is free again.
        assert_eq!(s.assign(3, &window[1..], |_| false, now)[0], h(1));
    }

    #[test]
    fn stall_timeout_adapts() {
        let mut s = Scheduler::new(Duration::from_secs(2), Duration::from_secs(64));
        let window = vec![h(0), h(1)];
        let t0 = Instant::now();
        s.assign(7, &window, |_| false, t0);
        assert_eq!(s.staller(&window, t0 + Duration::from_secs(1)), None);
        assert_eq!(s.staller(&window, t0 + Duration::from_secs(3)), Some(7));
        for _ in 0..10 {
            s.on_stall();
        }
        assert_eq!(s.stall_timeout(), Duration::from_secs(64));
        s.received(7, &h(0));
        assert!(s.stall_timeout() < Duration::from_secs(64));
        assert!(s.stall_timeout() >= Duration::from_secs(2));
    }
}
