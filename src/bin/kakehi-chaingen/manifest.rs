//! The generator's answer, `manifest.json`: what any node that imports the
//! chain must end with, and what the chain is made of.
//!
//! The UTXO answer comes from the generator's own ledger, in the text form
//! of `kakehi dump-utxos` (and of testnet-data/regtest-a/utxos.txt): one
//! line per unspent output, `txid:vout value_sats scriptPubKey_hex height
//! coinbase(0/1)`, sorted by txid (display hex) then vout (numeric), each
//! line ending in `\n`; OP_RETURN outputs are not in the set (as in Core).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use bitcoin::hashes::{sha256, Hash, HashEngine};
use bitcoin::hex::DisplayHex;
use serde::Serialize;

use crate::coins::Coin;
use crate::keys::KeyPool;
use crate::output::OutputError;

/// The whole manifest (`manifest.json`).
#[derive(Debug, Serialize)]
pub struct Manifest {
    /// `kakehi-chaingen <version>`.
    pub generator: String,
    /// Always `regtest`.
    pub network: &'static str,
    /// The profile named on the command line.
    pub profile: String,
    /// The seed.
    pub seed: u64,
    /// The sizes the chain was generated with (profile and overrides).
    pub parameters: Parameters,
    /// Regtest's genesis block hash (display order, as every hash here).
    pub genesis_hash: String,
    /// The best chain's tip.
    pub tip_hash: String,
    /// Its height.
    pub tip_height: u32,
    /// Unspent outputs at the tip.
    pub utxo_count: u64,
    /// Their total value, sats.
    pub utxo_total_sats: u64,
    /// SHA-256 of the sorted UTXO text (module docs), hex.
    pub utxos_sha256: String,
    /// The BIP-158 basic filter header at every 1,000th height from 0.
    pub filter_headers: Vec<FilterHeaderAt>,
    /// The blk files, in import order.
    pub files: Vec<String>,
    /// Records (blocks) in them: best chain and stale blocks.
    pub block_records: u64,
    /// Their total size, bytes (framing included).
    pub blk_bytes: u64,
    /// Blocks that end up on stale branches.
    pub stale_blocks: u64,
    /// Every reorganisation the files cause, in file order.
    pub reorgs: Vec<Reorg>,
    /// What the best chain is made of.
    pub stats: Stats,
    /// The invalid blocks on top of the tip.
    pub invalid: Invalid,
}

/// The sizes a chain was generated with.
#[derive(Debug, Clone, Serialize)]
pub struct Parameters {
    /// Blocks on the best chain (its tip height).
    pub blocks: u32,
    /// Mean transactions per ordinary block.
    pub txs_per_block: u32,
    /// Unspent outputs aimed at for the tip.
    pub live_utxos_target: u64,
    /// One reorganisation per this many blocks, on average.
    pub reorg_every: u32,
    /// One block near the weight limit per this many blocks, on average.
    pub full_block_every: u32,
}

/// A filter header at a height.
#[derive(Debug, Serialize)]
pub struct FilterHeaderAt {
    /// The height.
    pub height: u32,
    /// The basic filter header (display order).
    pub filter_header: String,
}

/// One reorganisation: a stale branch of `depth` blocks after the block at
/// `fork_height`, written first, then the best branch of `depth + 1`.
#[derive(Debug, Serialize)]
pub struct Reorg {
    /// Height of the last common block.
    pub fork_height: u32,
    /// Blocks disconnected.
    pub depth: u32,
    /// The stale branch's tip.
    pub stale_tip: String,
    /// The best branch's block whose arrival triggers the switch.
    pub new_tip: String,
}

/// The invalid cases (`invalid/cases.json`) and the control block.
#[derive(Debug, Serialize)]
pub struct Invalid {
    /// `invalid/cases.json`.
    pub cases: String,
    /// How many cases.
    pub count: usize,
    /// `invalid/control.blk`: one valid block on the tip holding every
    /// case's transaction without its defect.
    pub control: String,
    /// The control block's hash.
    pub control_hash: String,
}

/// What the best chain is made of (coinbases included unless said).
#[derive(Debug, Default, Serialize)]
pub struct Stats {
    /// Transactions.
    pub transactions: u64,
    /// Inputs of non-coinbase transactions.
    pub inputs: u64,
    /// Outputs: OP_RETURN included, the coinbases' witness commitments not.
    pub outputs: u64,
    /// Fees paid, sats.
    pub fees_sats: u64,
    /// Inputs spent, by the kind of output they spend.
    pub spent_by_kind: BTreeMap<&'static str, u64>,
    /// Outputs created, by kind (`op_return` too; the coinbases' witness
    /// commitments excluded).
    pub created_by_kind: BTreeMap<&'static str, u64>,
    /// Transactions with 50 inputs or more.
    pub txs_with_50_plus_inputs: u64,
    /// Transactions with 100 outputs or more.
    pub txs_with_100_plus_outputs: u64,
    /// Most inputs in one transaction.
    pub max_inputs: u64,
    /// Most outputs in one transaction.
    pub max_outputs: u64,
    /// Blocks weighing 3,900,000 WU or more.
    pub blocks_over_3_9m_wu: u64,
    /// Heaviest block, weight units.
    pub max_block_weight: u64,
    /// Blocks between an output's creation and its spend.
    pub spend_age: SpendAge,
    /// Spend ages, one count per age in blocks (not serialized).
    #[serde(skip)]
    pub ages: Vec<u64>,
}

/// Spend-age percentiles, blocks.
#[derive(Debug, Default, Serialize)]
pub struct SpendAge {
    /// 10th percentile.
    pub p10: u32,
    /// Median.
    pub p50: u32,
    /// 90th percentile.
    pub p90: u32,
    /// 99th percentile.
    pub p99: u32,
    /// Oldest spend.
    pub max: u32,
    /// Share of spends within 100 blocks.
    pub within_100: f64,
    /// Spends at least 10,000 blocks after creation.
    pub after_10000: u64,
}

impl Stats {
    /// Counts a spend `age` blocks after creation.
    pub fn spend(&mut self, age: u32) {
        let age = age as usize;
        if self.ages.len() <= age {
            self.ages.resize(age + 1, 0);
        }
        self.ages[age] += 1;
    }

    /// Fills `spend_age` from the counts.
    pub fn summarize_ages(&mut self) {
        let total: u64 = self.ages.iter().sum();
        let pct = |p: f64| {
            let want = (total as f64 * p).ceil().max(1.0) as u64;
            let mut seen = 0;
            self.ages
                .iter()
                .position(|n| {
                    seen += n;
                    seen >= want
                })
                .unwrap_or(0) as u32
        };
        self.spend_age = SpendAge {
            p10: pct(0.10),
            p50: pct(0.50),
            p90: pct(0.90),
            p99: pct(0.99),
            max: self.ages.iter().rposition(|n| *n > 0).unwrap_or(0) as u32,
            within_100: self.ages.iter().take(101).sum::<u64>() as f64 / total.max(1) as f64,
            after_10000: self.ages.iter().skip(10_000).sum(),
        };
    }
}

/// Count, total and SHA-256 of a UTXO set's text.
pub struct UtxoDigest {
    /// Unspent outputs.
    pub count: u64,
    /// Their value, sats.
    pub total_sats: u64,
    /// SHA-256 of the text, hex.
    pub sha256: String,
}

/// Sorts `coins` and hashes their text (module docs); also writes the text
/// to `text_path` when given.
///
/// # Errors
/// [`OutputError::Io`] writing `text_path`.
pub fn utxo_digest(
    coins: &mut [Coin],
    keys: &KeyPool,
    text_path: Option<&Path>,
) -> Result<UtxoDigest, OutputError> {
    // Display hex order is the order of the reversed txid bytes.
    coins.sort_unstable_by_key(|c| {
        let mut k = c.outpoint.txid.to_byte_array();
        k.reverse();
        (k, c.outpoint.vout)
    });
    let mut text = match text_path {
        Some(p) => Some((
            p,
            BufWriter::new(File::create(p).map_err(|e| OutputError::io(p, e))?),
        )),
        None => None,
    };
    let mut engine = sha256::Hash::engine();
    let mut line = String::with_capacity(256);
    for c in coins.iter() {
        use std::fmt::Write as _;
        line.clear();
        let script = keys.script_pubkey(c.kind, c.key, c.lock);
        let _ = writeln!(
            line,
            "{}:{} {} {} {} {}",
            c.outpoint.txid,
            c.outpoint.vout,
            c.value,
            script.as_bytes().to_lower_hex_string(),
            c.height,
            u8::from(c.coinbase)
        );
        engine.input(line.as_bytes());
        if let Some((p, out)) = text.as_mut() {
            out.write_all(line.as_bytes())
                .map_err(|e| OutputError::io(p, e))?;
        }
    }
    if let Some((p, out)) = text {
        out.into_inner()
            .map_err(|e| OutputError::io(p, e.into_error()))?
            .sync_all()
            .map_err(|e| OutputError::io(p, e))?;
    }
    Ok(UtxoDigest {
        count: coins.len() as u64,
        total_sats: coins.iter().map(|c| c.value).sum(),
        sha256: sha256::Hash::from_engine(engine).to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Kind;

    #[test]
    fn utxo_text_is_sorted_by_display_txid_then_numeric_vout() {
        let keys = crate::keys::shared();
        let coin = |first: u8, last: u8, vout| {
            let mut b = [0u8; 32];
            b[0] = first;
            b[31] = last; // the display form's first byte
            Coin {
                outpoint: bitcoin::OutPoint::new(bitcoin::Txid::from_byte_array(b), vout),
                value: 5,
                height: 7,
                key: 0,
                lock: 0,
                kind: Kind::P2wpkh,
                coinbase: vout == 10,
            }
        };
        let mut coins = vec![coin(0, 2, 0), coin(9, 1, 10), coin(9, 1, 2)];
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("utxos.txt");
        let d = utxo_digest(&mut coins, keys, Some(&path)).expect("digest");
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("01") && lines[0].contains(":2 5 0014"));
        assert!(lines[0].ends_with(" 7 0"));
        assert!(lines[1].starts_with("01") && lines[1].contains(":10 5 0014"));
        assert!(lines[1].ends_with(" 7 1"));
        assert!(lines[2].starts_with("02"));
        assert_eq!(d.count, 3);
        assert_eq!(d.total_sats, 15);
        assert_eq!(d.sha256, sha256::Hash::hash(text.as_bytes()).to_string());
    }
}
