//! The distributions every random choice of the generator is drawn from:
//! transaction shapes (input and output counts), output kinds, fee rates and
//! spend delays. All draws come from the one seeded stream, in a fixed order,
//! so a seed names one chain.

use rand::Rng;

use crate::keys::Kind;

/// A transaction's shape: how many inputs and outputs it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// A payment: 1–2 inputs, 1–3 outputs (mostly payee + change).
    Simple,
    /// A payment gathering 3–12 inputs into 1–2 outputs.
    MultiInput,
    /// One input split into 5–20 outputs.
    FanOut,
    /// A batch payout: 1–3 inputs, 100–400 outputs.
    Batch,
    /// A consolidation: 50–250 inputs into one output.
    Consolidation,
}

impl Shape {
    /// Mean outputs minus mean inputs of the shape (what one transaction of
    /// it adds to the UTXO count, on average).
    fn growth(self) -> f64 {
        match self {
            Shape::Simple => (0.20 + 0.75 * 2.0 + 0.05 * 3.0) - 1.35,
            Shape::MultiInput => 1.5 - 7.5,
            Shape::FanOut => 12.5 - 1.0,
            Shape::Batch => 250.0 - 2.0,
            Shape::Consolidation => 1.0 - 150.0,
        }
    }

    /// Draws (inputs, outputs) for this shape.
    pub fn counts(self, rng: &mut impl Rng) -> (usize, usize) {
        match self {
            Shape::Simple => {
                let inputs = if rng.gen_bool(0.65) { 1 } else { 2 };
                let outputs = match rng.gen_range(0..100) {
                    0..20 => 1,
                    20..95 => 2,
                    _ => 3,
                };
                (inputs, outputs)
            }
            Shape::MultiInput => (rng.gen_range(3..=12), rng.gen_range(1..=2)),
            Shape::FanOut => (1, rng.gen_range(5..=20)),
            Shape::Batch => (rng.gen_range(1..=3), rng.gen_range(100..=400)),
            Shape::Consolidation => (rng.gen_range(50..=250), 1),
        }
    }
}

/// The share of each shape, steered block by block towards the live-UTXO
/// target: batch payouts when the UTXO set must grow faster than plain
/// payments make it, consolidations when it must shrink.
#[derive(Clone, Copy, Debug)]
pub struct Mix {
    batch: f64,
    consolidation: f64,
}

/// Shares of the shapes that do not steer.
const MULTI_INPUT: f64 = 0.05;
const FAN_OUT: f64 = 0.04;
/// Every block keeps at least this share of batch payouts and of
/// consolidations, so both exist whatever the target.
const FLOOR: f64 = 0.002;
/// And at most this share.
const CAP: f64 = 0.30;

impl Mix {
    /// The mix whose mean growth per transaction is `growth` as nearly as
    /// the floors and caps allow.
    pub fn for_growth(growth: f64) -> Mix {
        let simple = 1.0 - MULTI_INPUT - FAN_OUT - 2.0 * FLOOR;
        let base = simple * Shape::Simple.growth()
            + MULTI_INPUT * Shape::MultiInput.growth()
            + FAN_OUT * Shape::FanOut.growth()
            + FLOOR * (Shape::Batch.growth() + Shape::Consolidation.growth());
        let excess = growth - base;
        let (batch, consolidation) = if excess >= 0.0 {
            (FLOOR + excess / Shape::Batch.growth(), FLOOR)
        } else {
            (FLOOR, FLOOR + excess / Shape::Consolidation.growth())
        };
        Mix {
            batch: batch.min(CAP),
            consolidation: consolidation.min(CAP),
        }
    }

    /// Draws a shape.
    pub fn shape(&self, rng: &mut impl Rng) -> Shape {
        let u: f64 = rng.gen();
        if u < self.batch {
            Shape::Batch
        } else if u < self.batch + self.consolidation {
            Shape::Consolidation
        } else if u < self.batch + self.consolidation + MULTI_INPUT {
            Shape::MultiInput
        } else if u < self.batch + self.consolidation + MULTI_INPUT + FAN_OUT {
            Shape::FanOut
        } else {
            Shape::Simple
        }
    }
}

/// The kind of a payment output, weighted roughly as on today's networks
/// (P2WPKH first; the lock-time kinds are rare).
pub fn output_kind(rng: &mut impl Rng) -> Kind {
    match rng.gen_range(0..1000) {
        0..380 => Kind::P2wpkh,
        380..540 => Kind::P2tr,
        540..690 => Kind::P2pkh,
        690..830 => Kind::P2shP2wpkh,
        830..965 => Kind::P2wshMultisig,
        965..975 => Kind::BareMultisig,
        975..988 => Kind::P2wshCltv,
        _ => Kind::P2wshCsv,
    }
}

/// The kind of a coinbase payout.
pub fn coinbase_kind(rng: &mut impl Rng) -> Kind {
    match rng.gen_range(0..10) {
        0..6 => Kind::P2wpkh,
        6..8 => Kind::P2tr,
        _ => Kind::P2pkh,
    }
}

/// A fee rate, sat/vB: mostly 1–5, a quarter 5–50, a few up to 300.
pub fn fee_rate(rng: &mut impl Rng) -> u64 {
    match rng.gen_range(0..100) {
        0..70 => rng.gen_range(1..=5),
        70..95 => rng.gen_range(5..=50),
        _ => rng.gen_range(50..=300),
    }
}

/// Blocks between an output's creation and its planned spend, heavy-tailed:
/// 55% within 20 blocks, 80% within 100, 12% within 1,000, 5% within
/// 10,000, 3% beyond (up to 200,000); `None` (never spent) with
/// probability `never`. Log-uniform within each class.
pub fn spend_delay(rng: &mut impl Rng, never: f64) -> Option<u32> {
    if rng.gen_bool(never) {
        return None;
    }
    let (lo, hi): (f64, f64) = match rng.gen_range(0..100) {
        0..55 => (1.0, 20.0),
        55..80 => (20.0, 100.0),
        80..92 => (100.0, 1_000.0),
        92..97 => (1_000.0, 10_000.0),
        _ => (10_000.0, 200_000.0),
    };
    let x = (lo.ln() + rng.gen::<f64>() * (hi.ln() - lo.ln())).exp();
    Some(x as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn mean_growth(mix: Mix) -> f64 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let n = 200_000;
        let total: i64 = (0..n)
            .map(|_| {
                let (i, o) = mix.shape(&mut rng).counts(&mut rng);
                o as i64 - i as i64
            })
            .sum();
        total as f64 / n as f64
    }

    #[test]
    fn the_mix_reaches_the_growth_it_is_asked_for() {
        for want in [-2.0, 0.0, 0.5, 1.0, 3.0, 10.0] {
            let got = mean_growth(Mix::for_growth(want));
            assert!(
                (got - want).abs() < 0.15 * want.abs().max(1.0),
                "{want}: {got}"
            );
        }
    }

    #[test]
    fn spend_delays_are_heavy_tailed() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
        let mut d: Vec<u32> = (0..100_000)
            .filter_map(|_| spend_delay(&mut rng, 0.0))
            .collect();
        d.sort_unstable();
        assert!(d[50_000] < 30, "median {}", d[50_000]);
        assert!(d[79_000] <= 100 && d[81_000] >= 100);
        assert!(d[98_000] >= 10_000);
    }
}
