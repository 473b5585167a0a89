//! The transaction Merkle root with Bitcoin Core's mutation detection
//! (CVE-2012-2459).
//!
//! Bitcoin's Merkle tree duplicates the last hash of a level with an odd
//! count, so the lists `[a, b, c]` and `[a, b, c, c]` have the same root. A
//! block whose transaction list was padded that way carries a valid header
//! but invalid content; Core's `ComputeMerkleRoot` flags it as *mutated*
//! when two sibling hashes on any level are equal, and `CheckBlock` rejects
//! it as `bad-txns-duplicate`.
//!
//! Also the Merkle branch of one transaction (Electrum's
//! `blockchain.transaction.get_merkle`, Esplora's `/tx/:txid/merkle-proof`).
//!
//! Source: Bitcoin Core `src/consensus/merkle.cpp` (`ComputeMerkleRoot`,
//! `ComputeMerkleBranch` in older versions).

use bitcoin::hashes::{sha256d, Hash, HashEngine};
use bitcoin::Txid;

/// The Merkle root of `leaves` (32-byte hashes in internal byte order) and
/// whether the tree is mutated (two equal siblings on some level).
///
/// Returns `([0; 32], false)` for an empty list, as Core does.
pub fn merkle_root_mutated(leaves: &[[u8; 32]]) -> ([u8; 32], bool) {
    if leaves.is_empty() {
        return ([0u8; 32], false);
    }
    let mut level: Vec<[u8; 32]> = leaves.to_vec();
    let mut mutated = false;
    while level.len() > 1 {
        let mut pos = 0;
        while pos + 1 < level.len() {
            if level[pos] == level[pos + 1] {
                mutated = true;
            }
            pos += 2;
        }
        if level.len() % 2 == 1 {
            let last = level[level.len() - 1];
            level.push(last);
        }
        level = level
            .chunks_exact(2)
            .map(|pair| {
                let mut engine = sha256d::Hash::engine();
                engine.input(&pair[0]);
                engine.input(&pair[1]);
                sha256d::Hash::from_engine(engine).to_byte_array()
            })
            .collect();
    }
    (level[0], mutated)
}

/// The Merkle branch of leaf `pos` among `leaves` (txids), bottom to top:
/// the sibling hash at each level, with Bitcoin's duplicate-last-node rule
/// (a node without a sibling pairs with itself). Folding the leaf with the
/// branch (left or right by the bits of `pos`) gives the block's Merkle
/// root. Empty for a single leaf; at most ⌈log2 n⌉ hashes.
///
/// Callers pass the position of a transaction of the block; a `pos` past
/// the end does not panic but gives a branch that proves nothing.
pub fn merkle_branch(leaves: &[Txid], mut pos: usize) -> Vec<Txid> {
    let mut level: Vec<[u8; 32]> = leaves.iter().map(|t| t.to_byte_array()).collect();
    let mut branch = Vec::new();
    while level.len() > 1 {
        let sibling = if pos ^ 1 < level.len() { pos ^ 1 } else { pos };
        branch.push(Txid::from_byte_array(level[sibling.min(level.len() - 1)]));
        level = level
            .chunks(2)
            .map(|c| {
                let mut engine = sha256d::Hash::engine();
                engine.input(&c[0]);
                engine.input(c.get(1).unwrap_or(&c[0]));
                sha256d::Hash::from_engine(engine).to_byte_array()
            })
            .collect();
        pos /= 2;
    }
    branch
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::merkle_tree::calculate_root;

    fn leaf(n: u8) -> [u8; 32] {
        sha256d::Hash::hash(&[n]).to_byte_array()
    }

    #[test]
    fn root_matches_rust_bitcoin_for_all_sizes() {
        for n in 1..=17u8 {
            let leaves: Vec<[u8; 32]> = (0..n).map(leaf).collect();
            let (root, mutated) = merkle_root_mutated(&leaves);
            let theirs = calculate_root(leaves.iter().map(|l| sha256d::Hash::from_byte_array(*l)))
                .map(|h| h.to_byte_array());
            assert_eq!(Some(root), theirs, "n = {n}");
            assert!(!mutated, "n = {n}");
        }
    }

    #[test]
    fn merkle_branch_folds_to_the_root_for_odd_and_even_sizes() {
        for n in 1..=9usize {
            let leaves: Vec<Txid> = (0..n)
                .map(|i| Txid::from_byte_array([i as u8 + 1; 32]))
                .collect();
            let root = calculate_root(leaves.iter().map(|t| t.to_raw_hash()))
                .unwrap_or_else(|| leaves[0].to_raw_hash());
            for pos in 0..n {
                let mut h = leaves[pos].to_byte_array();
                let mut p = pos;
                for s in merkle_branch(&leaves, pos) {
                    let mut buf = [0u8; 64];
                    if p % 2 == 0 {
                        buf[..32].copy_from_slice(&h);
                        buf[32..].copy_from_slice(s.as_byte_array());
                    } else {
                        buf[..32].copy_from_slice(s.as_byte_array());
                        buf[32..].copy_from_slice(&h);
                    }
                    h = sha256d::Hash::hash(&buf).to_byte_array();
                    p /= 2;
                }
                assert_eq!(h, root.to_byte_array(), "n={n} pos={pos}");
            }
        }
    }

    #[test]
    fn duplicated_tail_is_mutated_with_the_same_root() {
        let honest: Vec<[u8; 32]> = (0..3).map(leaf).collect();
        let mut padded = honest.clone();
        padded.push(leaf(2));
        let (a, ma) = merkle_root_mutated(&honest);
        let (b, mb) = merkle_root_mutated(&padded);
        assert_eq!(a, b);
        assert!(!ma);
        assert!(mb);
        // Equal siblings one level up: [a b c d e f e f] hashes like [a b c d e f].
        let six: Vec<[u8; 32]> = (0..6).map(leaf).collect();
        let mut eight = six.clone();
        eight.push(leaf(4));
        eight.push(leaf(5));
        let (c, mc) = merkle_root_mutated(&six);
        let (d, md) = merkle_root_mutated(&eight);
        assert_eq!(c, d);
        assert!(!mc);
        assert!(md);
    }
}
