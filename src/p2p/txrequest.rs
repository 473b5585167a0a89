//! Which peer to ask for which announced transaction, and when: Bitcoin
//! Core's `TxRequestTracker` (`txrequest.h`), simplified.
//!
//! Every announcement (peer, [`GenTxid`]) gets a request time: now for
//! an outbound ("preferred") peer, [`NONPREF_PEER_TX_DELAY`] later for an
//! inbound one, [`OVERLOADED_PEER_TX_DELAY`] more when the peer already
//! has [`MAX_PEER_TX_REQUEST_IN_FLIGHT`] requests outstanding. A hash is
//! in flight at one peer at a time; a request unanswered after
//! [`GETDATA_TX_INTERVAL`] expires and the hash may be asked of another
//! announcer (the expired peer is not asked again). A peer may have at
//! most [`MAX_PEER_TX_ANNOUNCEMENTS`] announcements tracked; more are
//! ignored. Where Core picks among ready announcers by preference then a
//! salted random priority, this asks the first ready one, skipping an
//! inbound peer while a preferred announcer is also ready.
//!
//! Memory: at most 5,000 announcements per peer (about 100 bytes each).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::backend::GenTxid;
use super::sync::PeerId;

/// Announcements tracked per peer (Core's `MAX_PEER_TX_ANNOUNCEMENTS`).
pub const MAX_PEER_TX_ANNOUNCEMENTS: usize = 5_000;
/// In-flight requests per peer above which its new announcements wait
/// [`OVERLOADED_PEER_TX_DELAY`] (Core's `MAX_PEER_TX_REQUEST_IN_FLIGHT`).
pub const MAX_PEER_TX_REQUEST_IN_FLIGHT: usize = 100;
/// Delay before asking an inbound peer (Core's `NONPREF_PEER_TX_DELAY`).
pub const NONPREF_PEER_TX_DELAY: Duration = Duration::from_secs(2);
/// Extra delay for an overloaded peer (Core's `OVERLOADED_PEER_TX_DELAY`).
pub const OVERLOADED_PEER_TX_DELAY: Duration = Duration::from_secs(2);
/// How long a transaction request may stay unanswered (Core's
/// `GETDATA_TX_INTERVAL`).
pub const GETDATA_TX_INTERVAL: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug)]
struct Announcement {
    /// When the peer may be asked.
    reqtime: Instant,
    preferred: bool,
}

/// The tracker. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct TxRequestTracker {
    /// Hash → announcers not yet asked (or being asked).
    announced: HashMap<GenTxid, HashMap<PeerId, Announcement>>,
    /// Peer → hashes it announced (the index of `announced`).
    by_peer: HashMap<PeerId, HashSet<GenTxid>>,
    /// Hash → the peer asked and when the request expires.
    in_flight: HashMap<GenTxid, (PeerId, Instant)>,
    /// Peer → number of its requests in flight.
    in_flight_count: HashMap<PeerId, usize>,
}

impl TxRequestTracker {
    /// Peer `peer` announced `id` (Core's `ReceivedInv` with the delays of
    /// `AddTxAnnouncement`). Ignored when already tracked or over the
    /// peer's cap.
    pub fn received_inv(&mut self, peer: PeerId, id: GenTxid, preferred: bool, now: Instant) {
        let overloaded = self.count_in_flight(peer) >= MAX_PEER_TX_REQUEST_IN_FLIGHT;
        let mine = self.by_peer.entry(peer).or_default();
        if mine.len() >= MAX_PEER_TX_ANNOUNCEMENTS || mine.contains(&id) {
            return;
        }
        let mut reqtime = now;
        if !preferred {
            reqtime += NONPREF_PEER_TX_DELAY;
        }
        if overloaded {
            reqtime += OVERLOADED_PEER_TX_DELAY;
        }
        mine.insert(id);
        self.announced
            .entry(id)
            .or_default()
            .insert(peer, Announcement { reqtime, preferred });
    }

    /// Requests of `peer` in flight.
    pub fn count_in_flight(&self, peer: PeerId) -> usize {
        self.in_flight_count.get(&peer).copied().unwrap_or(0)
    }

    /// Announcements tracked for `peer`.
    #[cfg(test)]
    pub fn count(&self, peer: PeerId) -> usize {
        self.by_peer.get(&peer).map_or(0, HashSet::len)
    }

    /// What to ask `peer` for now (Core's `GetRequestable` followed by
    /// `RequestedTx`): its announcements whose time has come, not in
    /// flight elsewhere, and not better asked of a ready preferred peer.
    /// They are marked in flight until `now + GETDATA_TX_INTERVAL`.
    /// Expired requests of every peer are dropped first.
    pub fn requestable(&mut self, peer: PeerId, now: Instant) -> Vec<GenTxid> {
        self.expire(now);
        let Some(mine) = self.by_peer.get(&peer) else {
            return Vec::new();
        };
        let mut out: Vec<GenTxid> = Vec::new();
        for id in mine {
            if self.in_flight.contains_key(id) {
                continue;
            }
            let Some(anns) = self.announced.get(id) else {
                continue;
            };
            let Some(a) = anns.get(&peer) else { continue };
            if a.reqtime > now {
                continue;
            }
            let better = !a.preferred
                && anns
                    .iter()
                    .any(|(p, b)| *p != peer && b.preferred && b.reqtime <= now);
            if !better {
                out.push(*id);
            }
        }
        out.sort();
        for id in &out {
            self.in_flight
                .insert(*id, (peer, now + GETDATA_TX_INTERVAL));
            *self.in_flight_count.entry(peer).or_default() += 1;
        }
        out
    }

    /// Drops requests unanswered past their expiry, with the asked peer's
    /// announcement (Core: the announcement is `COMPLETED`).
    fn expire(&mut self, now: Instant) {
        let expired: Vec<(GenTxid, PeerId)> = self
            .in_flight
            .iter()
            .filter(|(_, (_, exp))| *exp <= now)
            .map(|(id, (p, _))| (*id, *p))
            .collect();
        for (id, peer) in expired {
            self.received_response(peer, id);
        }
    }

    /// `peer` answered for `id` (a `tx` or a `notfound`): its announcement
    /// is done; another announcer may be asked if the hash is still
    /// wanted (Core's `ReceivedResponse`).
    pub fn received_response(&mut self, peer: PeerId, id: GenTxid) {
        if matches!(self.in_flight.get(&id), Some((p, _)) if *p == peer) {
            self.in_flight.remove(&id);
            if let Some(c) = self.in_flight_count.get_mut(&peer) {
                *c = c.saturating_sub(1);
            }
        }
        if let Some(anns) = self.announced.get_mut(&id) {
            anns.remove(&peer);
            if anns.is_empty() {
                self.announced.remove(&id);
            }
        }
        if let Some(mine) = self.by_peer.get_mut(&peer) {
            mine.remove(&id);
        }
    }

    /// `id` is no longer wanted (accepted, rejected, or already had):
    /// every announcement of it goes (Core's `ForgetTxHash`).
    pub fn forget(&mut self, id: GenTxid) {
        let peers: Vec<PeerId> = self
            .announced
            .get(&id)
            .map(|a| a.keys().copied().collect())
            .unwrap_or_default();
        if let Some((p, _)) = self.in_flight.get(&id).copied() {
            self.received_response(p, id);
        }
        for p in peers {
            self.received_response(p, id);
        }
    }

    /// `peer` is gone: its announcements and requests go (Core's
    /// `DisconnectedPeer`).
    pub fn disconnected(&mut self, peer: PeerId) {
        let ids: Vec<GenTxid> = self
            .by_peer
            .get(&peer)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        for id in ids {
            self.received_response(peer, id);
        }
        self.by_peer.remove(&peer);
        self.in_flight_count.remove(&peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::hashes::Hash;

    fn id(n: u8) -> GenTxid {
        GenTxid::Wtxid(bitcoin::Wtxid::from_byte_array([n; 32]))
    }

    #[test]
    fn one_request_per_hash_and_outbound_first() {
        let mut t = TxRequestTracker::default();
        let now = Instant::now();
        t.received_inv(1, id(1), false, now);
        t.received_inv(2, id(1), true, now);
        // The inbound peer waits 2 s; the outbound one is asked at once.
        assert!(t.requestable(1, now).is_empty());
        assert_eq!(t.requestable(2, now), vec![id(1)]);
        // In flight at peer 2: not asked of peer 1 even once ready.
        assert!(t.requestable(1, now + NONPREF_PEER_TX_DELAY).is_empty());
        // Peer 2 says notfound: peer 1 is asked.
        t.received_response(2, id(1));
        assert_eq!(t.requestable(1, now + NONPREF_PEER_TX_DELAY), vec![id(1)]);
    }

    #[test]
    fn requests_expire_and_go_to_another_announcer() {
        let mut t = TxRequestTracker::default();
        let now = Instant::now();
        t.received_inv(1, id(7), true, now);
        t.received_inv(2, id(7), true, now);
        let first = if t.requestable(1, now).is_empty() {
            2
        } else {
            1
        };
        let other = 3 - first;
        assert!(t.requestable(other, now).is_empty());
        let later = now + GETDATA_TX_INTERVAL;
        assert_eq!(t.requestable(other, later), vec![id(7)]);
        assert!(t.requestable(first, later).is_empty());
    }

    #[test]
    fn caps_and_forgetting() {
        let mut t = TxRequestTracker::default();
        let now = Instant::now();
        for i in 0..MAX_PEER_TX_ANNOUNCEMENTS + 10 {
            let mut b = [0u8; 32];
            b[..8].copy_from_slice(&(i as u64).to_le_bytes());
            t.received_inv(
                1,
                GenTxid::Wtxid(bitcoin::Wtxid::from_byte_array(b)),
                true,
                now,
            );
        }
        assert_eq!(t.count(1), MAX_PEER_TX_ANNOUNCEMENTS);
        t.received_inv(2, id(9), true, now);
        t.forget(id(9));
        assert!(t.requestable(2, now).is_empty());
        t.disconnected(1);
        assert_eq!(t.count(1), 0);
        assert_eq!(t.count_in_flight(1), 0);
    }
}
