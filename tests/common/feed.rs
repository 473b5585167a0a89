//! Builds the archive feed from the real regtest-a chain
//! (testnet-data/regtest-a, see its README.md): blk-framed blocks.dat,
//! best-chain flags from chain.json, outputs tracked to know each spent
//! output's value, script and creation height.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use bitcoin::merkle_tree::MerkleBlock;
use bitcoin::{Block, BlockHash, OutPoint, Txid};
use kakehi::archive::{Leaf, Spend};

/// Blocks at or below this height are final (tip 1500, 100 deep).
pub const FINAL_HEIGHT: u32 = 1500 - 100;
/// Regtest epoch length (ChainParams::archive_epoch_length).
pub const EPOCH_LENGTH: u32 = 144;

pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testnet-data/regtest-a")
}

/// The best chain, genesis excluded: `blocks[h - 1]` is height h.
pub struct Chain {
    pub blocks: Vec<Block>,
    pub txids: Vec<Vec<Txid>>,
    pub by_hash: HashMap<BlockHash, usize>,
    /// Leaves per spend height (index = height).
    pub leaves_by_height: Vec<Vec<Leaf>>,
}

impl Chain {
    pub fn load() -> Chain {
        let dir = data_dir();
        let raw = std::fs::read(dir.join("blocks.dat")).expect("blocks.dat");
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("chain.json")).expect("chain.json"))
                .expect("json");
        let metas = meta["blocks"].as_array().expect("blocks");
        let mut best: Vec<Option<Block>> = vec![None; 1501];
        let mut pos = 0usize;
        let mut order = 0usize;
        while pos + 8 <= raw.len() {
            assert_eq!(
                &raw[pos..pos + 4],
                &[0xfa, 0xbf, 0xb5, 0xda],
                "blk magic at {pos}"
            );
            let len = u32::from_le_bytes(raw[pos + 4..pos + 8].try_into().unwrap()) as usize;
            let block: Block =
                bitcoin::consensus::deserialize(&raw[pos + 8..pos + 8 + len]).expect("block");
            pos += 8 + len;
            let m = &metas[order];
            assert_eq!(m["order_index"].as_u64(), Some(order as u64));
            assert_eq!(m["hash"].as_str().unwrap(), block.block_hash().to_string());
            if m["on_best_chain"].as_bool() == Some(true) {
                let h = m["height"].as_u64().unwrap() as usize;
                best[h] = Some(block);
            }
            order += 1;
        }
        assert_eq!(order, metas.len());
        let blocks: Vec<Block> = best
            .into_iter()
            .skip(1)
            .map(|b| b.expect("best chain complete"))
            .collect();
        let mut by_hash = HashMap::new();
        let mut txids = Vec::with_capacity(blocks.len());
        let mut outputs: HashMap<OutPoint, (u64, bitcoin::ScriptBuf, u32)> = HashMap::new();
        let mut leaves_by_height = vec![Vec::new(); blocks.len() + 1];
        for (i, b) in blocks.iter().enumerate() {
            let height = i as u32 + 1;
            let hash = b.block_hash();
            if i > 0 {
                assert_eq!(b.header.prev_blockhash, blocks[i - 1].block_hash());
            }
            by_hash.insert(hash, i);
            let mut ids = Vec::with_capacity(b.txdata.len());
            for tx in &b.txdata {
                let txid = tx.compute_txid();
                if !tx.is_coinbase() {
                    for (vin, input) in tx.input.iter().enumerate() {
                        let (value, script, created) = outputs
                            .remove(&input.previous_output)
                            .expect("spent output known");
                        leaves_by_height[height as usize].push(Leaf {
                            outpoint: input.previous_output,
                            value,
                            script_pubkey: script,
                            creation_height: created,
                            spend: Spend {
                                block_hash: hash,
                                height,
                                txid,
                                vin: vin as u32,
                            },
                        });
                    }
                }
                for (vout, o) in tx.output.iter().enumerate() {
                    outputs.insert(
                        OutPoint {
                            txid,
                            vout: vout as u32,
                        },
                        (o.value.to_sat(), o.script_pubkey.clone(), height),
                    );
                }
                ids.push(txid);
            }
            txids.push(ids);
        }
        Chain {
            blocks,
            txids,
            by_hash,
            leaves_by_height,
        }
    }

    /// Leaves of epoch n (spends in final blocks of its height range).
    pub fn epoch_leaves(&self, n: u32) -> Vec<Leaf> {
        let (first, last) = (n * EPOCH_LENGTH, (n + 1) * EPOCH_LENGTH - 1);
        assert!(last <= FINAL_HEIGHT, "epoch {n} not complete");
        (first..=last)
            .filter_map(|h| self.leaves_by_height.get(h as usize))
            .flat_map(|v| v.iter().cloned())
            .collect()
    }

    /// Number of complete epochs of final blocks.
    pub fn complete_epochs(&self) -> u32 {
        (FINAL_HEIGHT + 1) / EPOCH_LENGTH
    }

    /// The txoutproof of `txid` in block `hash`, as Core's gettxoutproof.
    pub fn txoutproof(&self, hash: &BlockHash, txid: &Txid) -> Option<MerkleBlock> {
        let i = *self.by_hash.get(hash)?;
        let ids = &self.txids[i];
        if !ids.contains(txid) {
            return None;
        }
        Some(MerkleBlock::from_header_txids_with_predicate(
            &self.blocks[i].header,
            ids,
            |t| t == txid,
        ))
    }
}

/// spent.txt: (outpoint, spending txid, input index, spend height).
pub fn spent_lines() -> Vec<(OutPoint, Txid, u32, u32)> {
    let s = std::fs::read_to_string(data_dir().join("spent.txt")).expect("spent.txt");
    s.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let op: OutPoint = f[0].parse().expect("outpoint");
            let (t, v) = f[1].split_once(':').expect("spender");
            (
                op,
                t.parse().expect("txid"),
                v.parse().expect("vin"),
                f[2].parse().expect("height"),
            )
        })
        .collect()
}

/// utxos.txt: (outpoint, creation height).
pub fn utxo_lines() -> Vec<(OutPoint, u32)> {
    let s = std::fs::read_to_string(data_dir().join("utxos.txt")).expect("utxos.txt");
    s.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].parse().expect("outpoint"),
                f[3].parse().expect("height"),
            )
        })
        .collect()
}
