//! The generator's own UTXO bookkeeping: every unspent output of the best
//! chain, filed by the height at which it is due to be spent.
//!
//! This is the generator's answer to "what is the UTXO set at the tip": it
//! shares nothing with kakehi's UTXO table. Each output gets a due height
//! when it is created (`dist::spend_delay`); outputs due at or before the
//! height being built are *ready*, and transactions draw their inputs from
//! them at random. When no output is ready, inputs come early from the
//! nearest future heights; outputs due after the last block (or never) stay
//! unspent and make the tip's UTXO set.

use bitcoin::OutPoint;
use rand::Rng;

use crate::keys::Kind;

/// Blocks a coinbase output waits before it can be spent (Core's
/// `COINBASE_MATURITY`, consensus/consensus.h).
pub const COINBASE_MATURITY: u32 = 100;

/// Ready outputs counted as "latest due" when picking inputs.
const RECENT: usize = 64;

/// One unspent output, as the generator knows it: enough to rebuild its
/// scriptPubKey (`KeyPool::script_pubkey(kind, key, lock)`) and to sign for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coin {
    /// Where it is.
    pub outpoint: OutPoint,
    /// Its value, sats.
    pub value: u64,
    /// Height of the block that created it.
    pub height: u32,
    /// Index of its key in the pool (the first of three for multisig).
    pub key: u32,
    /// For [`Kind::P2wshCltv`] the lock height, for [`Kind::P2wshCsv`] the
    /// relative lock in blocks; 0 otherwise.
    pub lock: u32,
    /// How it is locked.
    pub kind: Kind,
    /// Whether a coinbase created it.
    pub coinbase: bool,
}

impl Coin {
    /// Whether a transaction in a block at `height` may spend it: coinbase
    /// maturity, BIP-65 finality of the nLockTime the CLTV script needs
    /// (nLockTime = lock < height), and the BIP-68 relative lock the CSV
    /// script needs (creation height + lock - 1 < height).
    pub fn spendable_at(&self, height: u32) -> bool {
        if self.coinbase && height < self.height + COINBASE_MATURITY {
            return false;
        }
        match self.kind {
            Kind::P2wshCltv => self.lock < height,
            Kind::P2wshCsv => height >= self.height + self.lock,
            _ => true,
        }
    }
}

/// The best chain's unspent outputs, by due height.
pub struct Ledger {
    /// `due[h]`: outputs due to be spent at height `h`.
    due: Vec<Vec<Coin>>,
    /// Outputs due at or before the current height, not yet spent.
    ready: Vec<Coin>,
    /// Outputs due after the last block: spent early only when nothing
    /// else is spendable.
    late: Vec<Coin>,
    /// Outputs never to be spent.
    kept: Vec<Coin>,
    /// The last height of the chain.
    last: u32,
    /// Unspent outputs in all three places.
    live: u64,
}

impl Ledger {
    /// An empty ledger for a chain of `last` blocks.
    pub fn new(last: u32) -> Ledger {
        Ledger {
            due: (0..=last).map(|_| Vec::new()).collect(),
            ready: Vec::new(),
            late: Vec::new(),
            kept: Vec::new(),
            last,
            live: 0,
        }
    }

    /// Unspent outputs.
    pub fn live(&self) -> u64 {
        self.live
    }

    /// Files a new output, due at `due` (`None`: never spent).
    pub fn insert(&mut self, coin: Coin, due: Option<u32>) {
        self.live += 1;
        match due {
            Some(h) if h <= self.last => self.due[h as usize].push(coin),
            Some(_) => self.late.push(coin),
            None => self.kept.push(coin),
        }
    }

    /// Moves the outputs due at `height` to the ready ones.
    pub fn advance(&mut self, height: u32) {
        if let Some(bucket) = self.due.get_mut(height as usize) {
            let mut bucket = std::mem::take(bucket);
            self.ready.append(&mut bucket);
        }
    }

    /// Takes an output a transaction at `height` may spend: a random ready
    /// one (nine times in ten among the `RECENT` latest due), else the
    /// first spendable one due after `height` (after the last block at
    /// worst). `None` when nothing is spendable.
    pub fn take(&mut self, height: u32, rng: &mut impl Rng) -> Option<Coin> {
        let n = self.ready.len();
        let coin = if n == 0 {
            self.take_early(height)?
        } else {
            // Mostly one of the latest due (a spend close to its plan);
            // sometimes any of them, so the backlog makes a long tail.
            let i = if rng.gen_bool(0.9) {
                rng.gen_range(n.saturating_sub(RECENT)..n)
            } else {
                rng.gen_range(0..n)
            };
            self.ready.swap_remove(i)
        };
        self.live -= 1;
        Some(coin)
    }

    /// Returns outputs taken for a transaction that was not made.
    pub fn give_back(&mut self, coins: impl IntoIterator<Item = Coin>) {
        for coin in coins {
            self.live += 1;
            self.ready.push(coin);
        }
    }

    fn take_early(&mut self, height: u32) -> Option<Coin> {
        for h in height + 1..=self.last {
            let bucket = &mut self.due[h as usize];
            if let Some(i) = bucket.iter().rposition(|c| c.spendable_at(height)) {
                return Some(bucket.swap_remove(i));
            }
        }
        let i = self.late.iter().rposition(|c| c.spendable_at(height))?;
        Some(self.late.swap_remove(i))
    }

    /// Every unspent output, in no particular order.
    pub fn into_coins(self) -> Vec<Coin> {
        let mut all = self.kept;
        all.extend(self.late);
        all.extend(self.ready);
        all.extend(self.due.into_iter().flatten());
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::hashes::Hash;
    use rand::SeedableRng;

    fn coin(n: u8, height: u32, coinbase: bool) -> Coin {
        Coin {
            outpoint: OutPoint::new(bitcoin::Txid::from_byte_array([n; 32]), 0),
            value: 1_000,
            height,
            key: 0,
            lock: 0,
            kind: Kind::P2wpkh,
            coinbase,
        }
    }

    #[test]
    fn ready_first_then_early_then_nothing() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let mut l = Ledger::new(1_000);
        l.insert(coin(1, 5, false), Some(10));
        l.insert(coin(2, 5, false), Some(20));
        l.insert(coin(3, 5, true), Some(300)); // immature until 105
        l.insert(coin(4, 5, false), None);
        l.insert(coin(5, 5, false), Some(2_000)); // after the last block
        assert_eq!(l.live(), 5);
        l.advance(10);
        let mut two = [0, 0].map(|_| l.take(10, &mut rng).map_or(0, |c| c.outpoint.txid[0]));
        two.sort_unstable();
        assert_eq!(two, [1, 2], "the ready one, then the one due at 20");
        assert_eq!(l.take(10, &mut rng).map(|c| c.outpoint.txid[0]), Some(5));
        assert_eq!(
            l.take(10, &mut rng),
            None,
            "the coinbase is immature, 4 is kept"
        );
        assert_eq!(l.take(105, &mut rng).map(|c| c.outpoint.txid[0]), Some(3));
        assert_eq!(l.live(), 1);
        assert_eq!(l.into_coins().len(), 1);
    }

    #[test]
    fn lock_kinds_wait_for_their_locks() {
        let mut c = coin(1, 100, false);
        c.kind = Kind::P2wshCsv;
        c.lock = 10;
        assert!(!c.spendable_at(109));
        assert!(c.spendable_at(110));
        c.kind = Kind::P2wshCltv;
        c.lock = 150;
        assert!(!c.spendable_at(150));
        assert!(c.spendable_at(151));
    }
}
