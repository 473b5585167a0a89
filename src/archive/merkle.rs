//! The epoch Merkle tree: SHA-256 with RFC 6962 domain separation, and
//! batched (multi-leaf) proofs that send each sibling node once (Stellar CAP-57).
//!
//! Tree shape: level 0 holds the leaf hashes `SHA256(0x00 || entry)`; each
//! next level pairs nodes left to right as `SHA256(0x01 || left || right)`,
//! and a last node without a right sibling is promoted unchanged. This is
//! exactly RFC 6962's `MTH` (split at the largest power of two below n), the
//! tree Certificate Transparency uses, written level by level so a batch
//! proof can address nodes by `(level, index)`.

use bitcoin::hashes::{sha256, Hash, HashEngine};

/// A 32-byte node hash.
pub type NodeHash = [u8; 32];

/// RFC 6962 leaf prefix.
pub const LEAF_PREFIX: u8 = 0x00;
/// RFC 6962 inner-node prefix.
pub const NODE_PREFIX: u8 = 0x01;

/// `SHA256(0x00 || data)`.
pub fn leaf_hash(data: &[u8]) -> NodeHash {
    let mut e = sha256::Hash::engine();
    e.input(&[LEAF_PREFIX]);
    e.input(data);
    sha256::Hash::from_engine(e).to_byte_array()
}

/// `SHA256(0x01 || left || right)`.
pub fn node_hash(left: &NodeHash, right: &NodeHash) -> NodeHash {
    let mut e = sha256::Hash::engine();
    e.input(&[NODE_PREFIX]);
    e.input(left);
    e.input(right);
    sha256::Hash::from_engine(e).to_byte_array()
}

/// Number of nodes on each level of a tree with `n` ≥ 1 leaves, level 0
/// first, root level (1 node) last.
pub fn level_sizes(n: u32) -> Vec<u32> {
    let mut v = vec![n.max(1)];
    while let Some(&last) = v.last() {
        if last <= 1 {
            break;
        }
        v.push(last / 2 + last % 2);
    }
    v
}

/// Builds every level from the leaf hashes (level 0 = `leaves`), the last
/// level holding the root. `leaves` must not be empty.
pub fn build_levels(leaves: Vec<NodeHash>) -> Vec<Vec<NodeHash>> {
    let mut levels = vec![leaves];
    loop {
        let cur = &levels[levels.len() - 1];
        if cur.len() <= 1 {
            break;
        }
        let next: Vec<NodeHash> = cur
            .chunks(2)
            .map(|c| {
                if c.len() == 2 {
                    node_hash(&c[0], &c[1])
                } else {
                    c[0]
                }
            })
            .collect();
        levels.push(next);
    }
    levels
}

/// Why a batch of paths does not lead to a root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MultiproofError {
    /// A proven leaf index is outside the tree.
    LeafOutOfRange {
        /// The index.
        index: u32,
    },
    /// Proven leaf indices are not strictly increasing.
    LeavesNotSorted,
    /// A sibling the walk needs is not the next supplied node.
    MissingNode {
        /// Level of the needed node.
        level: u8,
        /// Index of the needed node.
        index: u32,
    },
    /// Supplied nodes left over after the walk (or out of order).
    UnusedNode {
        /// Level of the first unused node.
        level: u8,
        /// Index of the first unused node.
        index: u32,
    },
}

/// Walks a batch proof upward. `leaves` are `(index, hash)` of the proven
/// leaves, strictly increasing; `take(level, index)` must return the
/// supplied sibling at that position or `None`. Returns the root.
fn walk(
    n: u32,
    leaves: &[(u32, NodeHash)],
    mut take: impl FnMut(u8, u32) -> Option<NodeHash>,
    hash: bool,
) -> Result<NodeHash, MultiproofError> {
    let sizes = level_sizes(n);
    let mut cur: Vec<(u32, NodeHash)> = Vec::with_capacity(leaves.len());
    for (i, &(idx, h)) in leaves.iter().enumerate() {
        if idx >= n {
            return Err(MultiproofError::LeafOutOfRange { index: idx });
        }
        if i > 0 && leaves[i - 1].0 >= idx {
            return Err(MultiproofError::LeavesNotSorted);
        }
        cur.push((idx, h));
    }
    for (level, &m) in sizes.iter().enumerate() {
        if m == 1 {
            break;
        }
        let level = level as u8;
        let mut next = Vec::with_capacity(cur.len());
        let mut k = 0;
        while k < cur.len() {
            let (idx, h) = cur[k];
            if idx % 2 == 0 {
                if idx + 1 < m {
                    let r = if k + 1 < cur.len() && cur[k + 1].0 == idx + 1 {
                        k += 1;
                        cur[k].1
                    } else {
                        take(level, idx + 1).ok_or(MultiproofError::MissingNode {
                            level,
                            index: idx + 1,
                        })?
                    };
                    next.push((idx / 2, if hash { node_hash(&h, &r) } else { h }));
                } else {
                    next.push((idx / 2, h));
                }
            } else {
                let l = take(level, idx - 1).ok_or(MultiproofError::MissingNode {
                    level,
                    index: idx - 1,
                })?;
                next.push((idx / 2, if hash { node_hash(&l, &h) } else { h }));
            }
            k += 1;
        }
        cur = next;
    }
    cur.first()
        .map(|&(_, h)| h)
        .ok_or(MultiproofError::LeavesNotSorted)
}

/// The sibling positions `(level, index)` a batch proof of `indices`
/// (strictly increasing, < n) must supply, in the order the verifier
/// consumes them (level, then index ascending).
///
/// # Errors
/// [`MultiproofError`] if `indices` is empty, unsorted or out of range.
pub fn needed_nodes(n: u32, indices: &[u32]) -> Result<Vec<(u8, u32)>, MultiproofError> {
    let mut out = Vec::new();
    let leaves: Vec<(u32, NodeHash)> = indices.iter().map(|&i| (i, [0u8; 32])).collect();
    walk(
        n,
        &leaves,
        |l, i| {
            out.push((l, i));
            Some([0u8; 32])
        },
        false,
    )?;
    Ok(out)
}

/// Computes the root from proven leaves and supplied sibling nodes
/// `(level, index, hash)`, which must be exactly [`needed_nodes`] in order.
///
/// # Errors
/// [`MultiproofError`] on a missing, extra or misplaced node or leaf.
pub fn multiproof_root(
    n: u32,
    leaves: &[(u32, NodeHash)],
    nodes: &[(u8, u32, NodeHash)],
) -> Result<NodeHash, MultiproofError> {
    let mut pos = 0usize;
    let root = walk(
        n,
        leaves,
        |level, index| match nodes.get(pos) {
            Some(&(l, i, h)) if l == level && i == index => {
                pos += 1;
                Some(h)
            }
            _ => None,
        },
        true,
    )?;
    if let Some(&(level, index, _)) = nodes.get(pos) {
        return Err(MultiproofError::UnusedNode { level, index });
    }
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6962 MTH, recursive reference.
    fn mth(leaves: &[NodeHash]) -> NodeHash {
        if leaves.len() == 1 {
            return leaves[0];
        }
        let mut k = 1;
        while k * 2 < leaves.len() {
            k *= 2;
        }
        node_hash(&mth(&leaves[..k]), &mth(&leaves[k..]))
    }

    #[test]
    fn levels_equal_rfc6962_and_multiproofs_verify() {
        for n in 1u32..40 {
            let leaves: Vec<NodeHash> = (0..n).map(|i| leaf_hash(&i.to_be_bytes())).collect();
            let levels = build_levels(leaves.clone());
            let root = levels.last().unwrap()[0];
            assert_eq!(root, mth(&leaves), "n={n}");
            assert_eq!(
                levels.iter().map(|l| l.len() as u32).collect::<Vec<_>>(),
                level_sizes(n)
            );
            for a in 0..n {
                for b in [a, (a + 1).min(n - 1), n - 1] {
                    let mut idx = vec![a, b];
                    idx.sort();
                    idx.dedup();
                    let need = needed_nodes(n, &idx).unwrap();
                    let nodes: Vec<_> = need
                        .iter()
                        .map(|&(l, i)| (l, i, levels[l as usize][i as usize]))
                        .collect();
                    let ls: Vec<_> = idx.iter().map(|&i| (i, leaves[i as usize])).collect();
                    assert_eq!(multiproof_root(n, &ls, &nodes), Ok(root));
                    if !nodes.is_empty() {
                        let mut fewer = nodes.clone();
                        fewer.pop();
                        assert!(multiproof_root(n, &ls, &fewer).is_err());
                    }
                    let mut more = nodes.clone();
                    more.push((40, 0, [0; 32]));
                    assert!(multiproof_root(n, &ls, &more).is_err());
                }
            }
        }
    }

    #[test]
    fn rfc6962_empty_leaf_vector() {
        // RFC 6962 section 2.1: MTH({d(0)}) = SHA-256(0x00 || d(0)); for the
        // empty string: 6e340b9c ffb37a98 9ca544e6 bb780a2c 78901d3f b3373876
        // 8511a306 17afa01d.
        let h = leaf_hash(&[]);
        assert_eq!(h[..4], [0x6e, 0x34, 0x0b, 0x9c]);
    }
}
