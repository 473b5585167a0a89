//! One mempool transaction with what acceptance learned about it: fee,
//! virtual size, the outputs it spends (Core's `CTxMemPoolEntry`).

use std::sync::Arc;

use bitcoin::{Transaction, TxOut, Txid, Wtxid};

/// A transaction in the mempool and its accounting.
///
/// Sizes: `vsize` is Core's sigop-adjusted virtual size
/// (`GetVirtualTransactionSize`: max(weight, sigop cost × bytes per
/// sigop) / 4, rounded up), in vbytes; `size` is the serialized size with
/// witness, in bytes. Source: Bitcoin Core 30.0 `src/kernel/mempool_entry.h`.
#[derive(Clone, Debug)]
pub struct MempoolEntry {
    /// The transaction.
    pub tx: Arc<Transaction>,
    /// Its txid.
    pub txid: Txid,
    /// Its wtxid (BIP-141).
    pub wtxid: Wtxid,
    /// Inputs minus outputs, sats.
    pub fee: u64,
    /// Sigop-adjusted virtual size, vbytes.
    pub vsize: u64,
    /// Weight, weight units.
    pub weight: u64,
    /// Serialized size with witness, bytes.
    pub size: u64,
    /// The sigop cost (BIP-141 units).
    pub sigop_cost: u64,
    /// When it entered, seconds since the UNIX epoch.
    pub time: u64,
    /// The chain tip's height when it entered.
    pub height: u32,
    /// Its entry sequence number: increases by one per transaction added
    /// (Core's `mempool_sequence`).
    pub sequence: u64,
    /// The outputs its inputs spend, in input order (confirmed coins or
    /// outputs of other mempool transactions).
    pub prevouts: Vec<TxOut>,
    /// Whether an input spends a coinbase output (re-checked for maturity
    /// after a reorg).
    pub spends_coinbase: bool,
}

/// Rough heap overhead of one entry in the pool's maps (entry, txid and
/// wtxid maps, one spender and script-index slot per input and output),
/// bytes. Core's `DynamicMemoryUsage` plays the same role for `-maxmempool`.
const ENTRY_OVERHEAD: u64 = 512;
/// Per input and per output map slots (spender map, script index), bytes.
const PER_TXIO_OVERHEAD: u64 = 96;

impl MempoolEntry {
    /// The fee rate, sats per 1,000 vbytes (Core's `CFeeRate` unit).
    pub fn feerate_sat_per_kvb(&self) -> u64 {
        feerate_sat_per_kvb(self.fee, self.vsize)
    }

    /// The memory this entry accounts for against `mempool.max_mib`,
    /// bytes: its transaction, its spent outputs and the maps' slots.
    pub fn usage(&self) -> u64 {
        let prevouts: u64 = self
            .prevouts
            .iter()
            .map(|o| 8 + 24 + o.script_pubkey.len() as u64)
            .sum();
        let txio = (self.tx.input.len() + self.tx.output.len()) as u64;
        // The decoded transaction takes about twice its serialized size
        // (vectors for every script and witness element).
        2 * self.size + prevouts + ENTRY_OVERHEAD + txio * PER_TXIO_OVERHEAD
    }
}

/// `fee` sats over `vsize` vbytes, in sats per 1,000 vbytes (rounded down;
/// 0 for an empty size).
pub fn feerate_sat_per_kvb(fee: u64, vsize: u64) -> u64 {
    if vsize == 0 {
        return 0;
    }
    ((u128::from(fee) * 1000) / u128::from(vsize)) as u64
}
