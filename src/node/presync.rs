//! Headers whose chain has too little work to be stored yet: Bitcoin Core's
//! headers presync (`headerssync.cpp`, v24+), simplified.
//!
//! A header chain is stored only once its cumulative work reaches the
//! anti-DoS threshold, `max(minimum chainwork, tip work − 144 × the tip's
//! block proof)` (Core's `GetAntiDoSWorkThreshold`). Below it, a chain is
//! followed without keeping its headers (**presync**): per chain the node
//! keeps its base (the stored header it builds on), its last hash, height
//! and work, and the hash of every [`CHECKPOINT_EVERY`]th header: 32 bytes
//! per 2,000 headers (16 KB for a million). When the chain passes the
//! threshold, the peer is asked for it again from its base
//! (**redownload**); each re-sent header is compared with the checkpoints
//! and with the presync's last hash, and headers are stored as soon as the
//! next checkpoint confirms them, so at most 2,000 unconfirmed headers
//! (160 KB) wait per chain. A peer that re-sends a different chain is caught
//! at the next checkpoint (a full hash, where Core keeps salted 1-bit
//! commitments: more memory, no false match).
//!
//! What Core checks in presync that this does not: the difficulty
//! transitions between headers (only each header's own proof of work and
//! `nBits` ≤ the network's limit are checked, by the caller); the full
//! header checks run when the headers are stored.
//!
//! Memory: at most [`PRESYNC_MAX_CHAINS`] chains (presync and redownload
//! together, the oldest dropped first), each ≤ 32 bytes per 2,000 headers
//! plus ≤ 2,000 buffered headers.

use std::collections::HashMap;

use bitcoin::block::Header;
use bitcoin::pow::Work;
use bitcoin::BlockHash;

/// One checkpoint hash is kept per this many headers (a full `headers`
/// message, Core's `MAX_HEADERS_RESULTS`).
pub const CHECKPOINT_EVERY: u32 = 2_000;
/// Most chains followed at once (one per peer in practice), presync and
/// redownload together; the oldest is dropped beyond this.
pub const PRESYNC_MAX_CHAINS: usize = 8;
/// Blocks of the tip's proof of work a chain may lack and still be stored
/// (Core's 144-block buffer in `GetAntiDoSWorkThreshold`).
pub const ANTI_DOS_BLOCKS: u32 = 144;

/// A chain followed below the threshold.
struct Chain {
    /// The stored header it builds on: hash and height.
    base: (BlockHash, u32),
    /// Hash of the header at `base.1 + CHECKPOINT_EVERY × (i + 1)`.
    checkpoints: Vec<BlockHash>,
    /// Its last header: hash, height, cumulative work.
    last: (BlockHash, u32, Work),
    /// Insertion order (the oldest is dropped first).
    seq: u64,
}

/// A chain being downloaded again, after its presync passed the threshold.
struct Redownload {
    chain: Chain,
    /// Height of the last header received again.
    height: u32,
    /// Headers received again but not confirmed by a checkpoint yet.
    buffer: Vec<Header>,
}

/// What to do with a `headers` message, as [`Presync::offer`] decides.
#[derive(Debug, PartialEq, Eq)]
pub enum Offer {
    /// Not presync's: store the message as usual (it attaches to a stored
    /// header with enough work, or to nothing presync follows).
    NotOurs,
    /// Headers received again and confirmed: store them (may be empty when
    /// all wait for the next checkpoint). `height` is the message's last
    /// header's.
    Store {
        /// The confirmed headers, in chain order.
        headers: Vec<Header>,
        /// Height of the message's last header.
        height: u32,
    },
    /// Followed below the threshold, nothing stored; the chain continues
    /// after `last`.
    Held {
        /// The message's last header.
        last: BlockHash,
    },
    /// The chain just passed the threshold: ask for it again from `from`.
    Passed {
        /// The base of the chain (a stored header).
        from: BlockHash,
    },
    /// A re-sent header differs from the chain followed in presync.
    Mismatch {
        /// Its height.
        height: u32,
    },
}

/// The chains followed below the threshold (see the module docs).
#[derive(Default)]
pub struct Presync {
    /// Presync chains by the hash of their last header.
    chains: HashMap<BlockHash, Chain>,
    /// Redownloads by the hash of the last header received again (the
    /// base, before the first).
    redownloads: HashMap<BlockHash, Redownload>,
    seq: u64,
}

/// Core's `GetAntiDoSWorkThreshold`: `max(min_work, tip_work − 144 ×
/// tip_proof)` (0 when the tip has less work than the buffer).
pub fn anti_dos_threshold(min_work: Work, tip_work: Work, tip_proof: Work) -> Work {
    let mut buffer = Work::from_be_bytes([0; 32]);
    for _ in 0..ANTI_DOS_BLOCKS {
        buffer = buffer + tip_proof;
    }
    let near_tip = if tip_work > buffer {
        tip_work - buffer
    } else {
        Work::from_be_bytes([0; 32])
    };
    near_tip.max(min_work)
}

impl Presync {
    /// Decides what to do with `headers` (non-empty, continuous, each
    /// header's own proof of work checked by the caller). `parent` is the
    /// first header's parent when it is stored: (height, chainwork).
    /// `threshold` is [`anti_dos_threshold`] now.
    pub fn offer(
        &mut self,
        headers: &[Header],
        parent: Option<(u32, Work)>,
        threshold: Work,
    ) -> Offer {
        let Some(first) = headers.first() else {
            return Offer::NotOurs;
        };
        let prev = first.prev_blockhash;
        if let Some(r) = self.redownloads.remove(&prev) {
            return self.redownload(r, headers);
        }
        let chain = match (self.chains.remove(&prev), parent) {
            (Some(c), _) => c,
            (None, Some((height, work))) => {
                let end = headers.iter().fold(work, |w, h| w + h.work());
                if end >= threshold {
                    return Offer::NotOurs;
                }
                Chain {
                    base: (prev, height),
                    checkpoints: Vec::new(),
                    last: (prev, height, work),
                    seq: 0,
                }
            }
            (None, None) => return Offer::NotOurs,
        };
        self.follow(chain, headers, threshold)
    }

    /// Extends a presync chain by `headers`.
    fn follow(&mut self, mut chain: Chain, headers: &[Header], threshold: Work) -> Offer {
        let (mut hash, mut height, mut work) = chain.last;
        for h in headers {
            hash = h.block_hash();
            height += 1;
            work = work + h.work();
            if (height - chain.base.1).is_multiple_of(CHECKPOINT_EVERY) {
                chain.checkpoints.push(hash);
            }
        }
        chain.last = (hash, height, work);
        self.seq += 1;
        chain.seq = self.seq;
        if work >= threshold {
            let from = chain.base.0;
            let base_height = chain.base.1;
            self.redownloads.insert(
                from,
                Redownload {
                    chain,
                    height: base_height,
                    // Drained at every checkpoint: never more than this.
                    buffer: Vec::with_capacity(CHECKPOINT_EVERY as usize),
                },
            );
            self.bound();
            return Offer::Passed { from };
        }
        self.chains.insert(hash, chain);
        self.bound();
        Offer::Held { last: hash }
    }

    /// Checks re-sent `headers` against the presync's checkpoints; returns
    /// the confirmed ones (and those past the presync's end, which extend a
    /// chain already above the threshold).
    fn redownload(&mut self, mut r: Redownload, headers: &[Header]) -> Offer {
        let mut confirmed = Vec::new();
        let (last_hash, last_height, _) = r.chain.last;
        let mut cursor = r.chain.base.0;
        let mut beyond = 0u32;
        for h in headers {
            let hash = h.block_hash();
            cursor = hash;
            if r.height >= last_height {
                beyond += 1;
                confirmed.push(*h);
                continue;
            }
            r.height += 1;
            r.buffer.push(*h);
            let step = r.height - r.chain.base.1;
            let want = if r.height == last_height {
                Some(last_hash)
            } else if step.is_multiple_of(CHECKPOINT_EVERY) {
                r.chain
                    .checkpoints
                    .get((step / CHECKPOINT_EVERY - 1) as usize)
                    .copied()
            } else {
                None
            };
            match want {
                Some(w) if w != hash => return Offer::Mismatch { height: r.height },
                Some(_) => confirmed.append(&mut r.buffer),
                None => {}
            }
        }
        let height = r.height + beyond;
        if r.height < last_height {
            self.redownloads.insert(cursor, r);
        }
        Offer::Store {
            headers: confirmed,
            height,
        }
    }

    /// Drops the oldest chains beyond [`PRESYNC_MAX_CHAINS`].
    fn bound(&mut self) {
        while self.chains.len() + self.redownloads.len() > PRESYNC_MAX_CHAINS {
            let oldest_chain = self.chains.iter().min_by_key(|(_, c)| c.seq);
            let oldest_re = self.redownloads.iter().min_by_key(|(_, r)| r.chain.seq);
            match (oldest_chain, oldest_re) {
                (Some((k, c)), Some((_, r))) if c.seq <= r.chain.seq => {
                    let k = *k;
                    self.chains.remove(&k);
                }
                (_, Some((k, _))) => {
                    let k = *k;
                    self.redownloads.remove(&k);
                }
                (Some((k, _)), None) => {
                    let k = *k;
                    self.chains.remove(&k);
                }
                (None, None) => return,
            }
        }
    }

    /// Bytes held for all chains (checkpoints and buffered headers, without
    /// the maps' own overhead): what a peer feeding low-work headers costs.
    pub fn held_bytes(&self) -> usize {
        let chain = |c: &Chain| std::mem::size_of::<Chain>() + 32 * c.checkpoints.capacity();
        self.chains.values().map(chain).sum::<usize>()
            + self
                .redownloads
                .values()
                .map(|r| chain(&r.chain) + 80 * r.buffer.capacity())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::block::Version;
    use bitcoin::hashes::Hash;
    use bitcoin::{CompactTarget, TxMerkleNode};

    /// A chain of `n` regtest-difficulty headers after `prev` (proof of
    /// work not solved: presync does not check it, the caller does).
    fn chain(prev: BlockHash, n: usize, tag: u32) -> Vec<Header> {
        let mut out = Vec::with_capacity(n);
        let mut prev = prev;
        for i in 0..n {
            let h = Header {
                version: Version::from_consensus(4),
                prev_blockhash: prev,
                merkle_root: TxMerkleNode::all_zeros(),
                time: 1_700_000_000 + i as u32,
                bits: CompactTarget::from_consensus(0x207f_ffff),
                nonce: tag,
            };
            prev = h.block_hash();
            out.push(h);
        }
        out
    }

    fn work_of(n: usize) -> Work {
        let one = chain(BlockHash::all_zeros(), 1, 0)[0].work();
        (0..n).fold(Work::from_be_bytes([0; 32]), |w, _| w + one)
    }

    #[test]
    fn threshold_is_core_s() {
        let proof = work_of(1);
        let zero = Work::from_be_bytes([0; 32]);
        assert_eq!(anti_dos_threshold(zero, work_of(1000), proof), work_of(856));
        assert_eq!(
            anti_dos_threshold(work_of(900), work_of(1000), proof),
            work_of(900)
        );
        assert_eq!(anti_dos_threshold(zero, work_of(100), proof), zero);
    }

    #[test]
    fn a_low_work_chain_is_followed_in_constant_memory_then_verified() {
        let base = BlockHash::all_zeros();
        let headers = chain(base, 10_500, 1);
        let threshold = work_of(10_400);
        let mut p = Presync::default();
        let zero = Work::from_be_bytes([0; 32]);
        // Enough work at once: not presync's business.
        assert_eq!(
            p.offer(&headers, Some((0, zero)), work_of(2_000)),
            Offer::NotOurs
        );
        // 2,000 at a time: held until the chain passes 10,400 headers' work.
        let mut from = None;
        for (i, msg) in headers.chunks(2_000).enumerate() {
            let parent = (i == 0).then_some((0, zero));
            match p.offer(msg, parent, threshold) {
                Offer::Held { last } => {
                    assert_eq!(last, msg[msg.len() - 1].block_hash());
                    // Base, last, one hash per 2,000 headers: no headers.
                    assert!(p.held_bytes() < 1_000, "{}", p.held_bytes());
                }
                Offer::Passed { from: f } => from = Some(f),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(from, Some(base));
        // Re-sent in messages of 1,500: confirmed at each checkpoint
        // (every 2,000) and at the end.
        let (mut stored, mut sent) = (Vec::new(), 0);
        for msg in headers.chunks(1_500) {
            sent += msg.len();
            match p.offer(msg, None, threshold) {
                Offer::Store { headers: h, height } => {
                    stored.extend(h);
                    assert_eq!(height as usize, sent);
                    // Confirmed up to the last checkpoint (or the end).
                    let want = if sent == headers.len() {
                        sent
                    } else {
                        sent / 2_000 * 2_000
                    };
                    assert_eq!(stored.len(), want);
                }
                other => panic!("{other:?}"),
            }
            assert!(p.held_bytes() <= 1_000 + 80 * 2_000);
        }
        assert_eq!(stored, headers);
        assert_eq!(p.held_bytes(), 0);
    }

    #[test]
    fn a_different_chain_sent_again_is_caught() {
        let base = BlockHash::all_zeros();
        let zero = Work::from_be_bytes([0; 32]);
        let honest = chain(base, 4_100, 1);
        let mut p = Presync::default();
        assert!(matches!(
            p.offer(&honest[..2_000], Some((0, zero)), work_of(4_000)),
            Offer::Held { .. }
        ));
        assert!(matches!(
            p.offer(&honest[2_000..], None, work_of(4_000)),
            Offer::Passed { .. }
        ));
        let liar = chain(base, 2_000, 2);
        assert_eq!(
            p.offer(&liar, None, work_of(4_000)),
            Offer::Mismatch { height: 2_000 }
        );
    }

    #[test]
    fn chains_are_bounded() {
        let zero = Work::from_be_bytes([0; 32]);
        let mut p = Presync::default();
        for tag in 0..20 {
            let c = chain(BlockHash::all_zeros(), 10, tag);
            assert!(matches!(
                p.offer(&c, Some((0, zero)), work_of(100)),
                Offer::Held { .. }
            ));
        }
        assert_eq!(p.chains.len(), PRESYNC_MAX_CHAINS);
    }
}
