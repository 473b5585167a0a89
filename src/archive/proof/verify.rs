//! Verification of a proof batch against an anchor, with no database.

use super::*;

/// A txoutproof that checked: the spending transaction is committed by the
/// merkle root of this block header. Compare `block_hash` with the header
/// your own chain holds at the spend height.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize)]
pub struct TxInclusion {
    /// Hash of the header in the txoutproof (equals the leaf's spend block).
    pub block_hash: BlockHash,
    /// Its merkle root, which commits to the spending txid.
    pub merkle_root: TxMerkleNode,
}

/// What a verified proof establishes about one outpoint.
#[derive(Clone, PartialEq, Eq, Debug, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum VerifiedStatus {
    /// Archived as spent in `epoch`: the leaf (value, script, creation
    /// height, spend) is committed by the anchor.
    Spent {
        /// Epoch.
        epoch: u32,
        /// The archived leaf.
        leaf: Leaf,
        /// The checked txoutproof, when the proof carried one.
        inclusion: Option<TxInclusion>,
    },
    /// Absent from each listed epoch (all sealed epochs under a commitment
    /// anchor; the one epoch under a root anchor).
    Absent {
        /// The epochs.
        epochs: Vec<u32>,
    },
}

/// The result of a successful verification.
#[derive(Clone, PartialEq, Eq, Debug, Serialize)]
pub struct Verified {
    /// The anchor checked against.
    pub anchor: Anchor,
    /// The headers, now known to be committed by the anchor.
    pub headers: Vec<EpochHeader>,
    /// One result per item, in proof order.
    pub outpoints: Vec<(OutPoint, VerifiedStatus)>,
}

impl Verified {
    /// The result for `outpoint`, or `None` if the proof does not speak of
    /// it (a proof for one outpoint says nothing about another).
    pub fn status(&self, outpoint: &OutPoint) -> Option<&VerifiedStatus> {
        self.outpoints
            .iter()
            .find(|(o, _)| o == outpoint)
            .map(|(_, s)| s)
    }
}

fn check_txoutproof(
    outpoint: OutPoint,
    leaf: &Leaf,
    mb: &MerkleBlock,
) -> Result<TxInclusion, VerifyError> {
    let mut matches = Vec::new();
    let mut indexes = Vec::new();
    let root = mb
        .txn
        .extract_matches(&mut matches, &mut indexes)
        .map_err(|_| VerifyError::BadTxOutProof {
            outpoint,
            reason: "partial merkle tree malformed",
        })?;
    if root != mb.header.merkle_root {
        return Err(VerifyError::BadTxOutProof {
            outpoint,
            reason: "partial merkle tree root differs from the header's",
        });
    }
    if !matches.contains(&leaf.spend.txid) {
        return Err(VerifyError::TxNotInProof {
            outpoint,
            txid: leaf.spend.txid,
        });
    }
    let got = mb.header.block_hash();
    if got != leaf.spend.block_hash {
        return Err(VerifyError::TxOutProofBlockMismatch {
            outpoint,
            expected: leaf.spend.block_hash,
            got,
        });
    }
    Ok(TxInclusion {
        block_hash: got,
        merkle_root: root,
    })
}

/// Verifies a proof batch against an anchor, with no database.
///
/// Checks, in order: caps; header shapes and their hash chain; the anchor
/// (commitment = hash of the last header, or the root of the single
/// header); per epoch, entry placement and order and that the paths lead to
/// the header's root with every supplied node used exactly once; per item,
/// that the named leaf is the outpoint (existence, plus the optional
/// txoutproof) or that each gap's two adjacent leaves bracket it in every
/// anchored epoch (non-existence); and that every entry is used.
///
/// # Errors
/// The first [`VerifyError`] found.
pub fn verify(proof: &ProofBatch, anchor: Anchor) -> Result<Verified, VerifyError> {
    proof.check_caps()?;
    let hs = &proof.headers;
    check_header_chain(hs)?;
    check_anchor(proof, anchor)?;
    for (i, ep) in proof.epochs.iter().enumerate() {
        if i > 0 && proof.epochs[i - 1].epoch >= ep.epoch {
            return Err(VerifyError::UnexpectedEpoch {
                epoch: ep.epoch,
                reason: "not in ascending order",
            });
        }
        let h = header_of(hs, ep.epoch).ok_or(VerifyError::UnexpectedEpoch {
            epoch: ep.epoch,
            reason: "no header for it",
        })?;
        verify_epoch(ep, h)?;
    }
    let mut entries = EntryUse {
        epochs: &proof.epochs,
        used: proof
            .epochs
            .iter()
            .map(|ep| vec![false; ep.entries.len()])
            .collect(),
    };
    let mut seen = HashSet::with_capacity(proof.items.len());
    let mut out = Vec::with_capacity(proof.items.len());
    for item in &proof.items {
        let outpoint = *item.outpoint();
        if !seen.insert(outpoint) {
            return Err(VerifyError::DuplicateItem { outpoint });
        }
        let status = match item {
            ProofItem::Spent {
                epoch,
                index,
                txoutproof,
                ..
            } => verify_spent(&mut entries, outpoint, *epoch, *index, txoutproof.as_ref())?,
            ProofItem::Absent { gaps, .. } => verify_absent(&mut entries, outpoint, gaps, hs)?,
        };
        out.push((outpoint, status));
    }
    entries.check_all_used()?;
    Ok(Verified {
        anchor,
        headers: hs.clone(),
        outpoints: out,
    })
}

/// The header of `epoch` among consecutive headers `hs`.
fn header_of(hs: &[EpochHeader], epoch: u32) -> Option<&EpochHeader> {
    let first = hs.first()?.epoch;
    hs.get(epoch.checked_sub(first)? as usize)
}

/// Each header is well formed, and each follows the one before it:
/// consecutive epoch numbers, contiguous height ranges, `prev` linking.
fn check_header_chain(hs: &[EpochHeader]) -> Result<(), VerifyError> {
    for h in hs {
        h.check_shape().map_err(|reason| VerifyError::BadHeader {
            epoch: h.epoch,
            reason,
        })?;
    }
    for w in hs.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        let broken = |reason| VerifyError::BrokenChain {
            epoch: b.epoch,
            reason,
        };
        if a.epoch.checked_add(1) != Some(b.epoch) {
            return Err(broken("epoch numbers not consecutive"));
        }
        if a.last_height.checked_add(1) != Some(b.first_height) {
            return Err(broken("height ranges not contiguous"));
        }
        if b.prev != a.hash() {
            return Err(broken("prev is not the previous header's hash"));
        }
    }
    Ok(())
}

/// The headers are the ones `anchor` names: a commitment over them all,
/// starting at the canonical epoch (0 if any item is claimed absent, else
/// the lowest epoch an existence item uses), or the one epoch of a root.
fn check_anchor(proof: &ProofBatch, anchor: Anchor) -> Result<(), VerifyError> {
    let hs = &proof.headers;
    match anchor {
        Anchor::Commitment(c) => {
            let computed = super::super::header::commitment(hs);
            if computed != c {
                return Err(VerifyError::CommitmentMismatch {
                    expected: c.to_lower_hex_string(),
                    computed: computed.to_lower_hex_string(),
                });
            }
            let Some(first) = hs.first() else {
                return Ok(());
            };
            let any_absent = proof
                .items
                .iter()
                .any(|i| matches!(i, ProofItem::Absent { .. }));
            let want = if any_absent {
                Some(0)
            } else {
                proof
                    .items
                    .iter()
                    .filter_map(|i| match i {
                        ProofItem::Spent { epoch, .. } => Some(*epoch),
                        ProofItem::Absent { .. } => None,
                    })
                    .min()
            };
            if want != Some(first.epoch) {
                return Err(VerifyError::HeadersNotCanonical {
                    reason: "do not start at the first epoch the items need",
                });
            }
            Ok(())
        }
        Anchor::EpochRoot(r) => {
            if hs.len() != 1 || hs[0].root != r {
                return Err(VerifyError::RootNotAnchored {
                    expected: r.to_lower_hex_string(),
                });
            }
            Ok(())
        }
    }
}

/// Epoch proof `ep` is sound against its header `h`: every entry at a
/// place it may hold (boundaries at the ends, spent leaves between them),
/// in ascending index and outpoint order, and the entries with the nodes
/// give the header's root.
fn verify_epoch(ep: &EpochProof, h: &EpochHeader) -> Result<(), VerifyError> {
    let n = h.leaf_count;
    let mut leaves = Vec::with_capacity(ep.entries.len());
    for (k, e) in ep.entries.iter().enumerate() {
        let idx = e.index();
        let place = |reason| VerifyError::BadEntryPlace {
            epoch: ep.epoch,
            index: idx,
            reason,
        };
        match e {
            TreeEntry::LowerBound { .. } if idx != 0 => {
                return Err(place("lower boundary not at index 0"))
            }
            TreeEntry::UpperBound { .. } if idx.checked_add(1) != Some(n) => {
                return Err(place("upper boundary not at the last index"))
            }
            TreeEntry::Spent { .. } if idx == 0 || idx.checked_add(1) >= Some(n) => {
                return Err(place("spent leaf at a boundary index"))
            }
            _ => {}
        }
        if k > 0 {
            let prev = &ep.entries[k - 1];
            if prev.index() >= idx {
                return Err(place("entries not in ascending index order"));
            }
            if let TreeEntry::Spent { leaf, .. } = e {
                if prev.cmp_key(&leaf.key()) != std::cmp::Ordering::Less {
                    return Err(place("entries not in outpoint order"));
                }
            }
        }
        leaves.push((idx, leaf_hash(&e.encode())));
    }
    let nodes: Vec<(u8, u32, NodeHash)> = ep
        .nodes
        .iter()
        .map(|n| (n.level, n.index, n.hash))
        .collect();
    let root = multiproof_root(n, &leaves, &nodes).map_err(|detail| VerifyError::BadPaths {
        epoch: ep.epoch,
        detail,
    })?;
    if root != h.root {
        return Err(VerifyError::RootMismatch {
            epoch: ep.epoch,
            computed: root.to_lower_hex_string(),
        });
    }
    Ok(())
}

/// The epoch proofs' entries, with which of them an item used (a proof
/// may carry no entry it does not need).
struct EntryUse<'p> {
    epochs: &'p [EpochProof],
    /// Per epoch proof, per entry: used by an item.
    used: Vec<Vec<bool>>,
}

impl<'p> EntryUse<'p> {
    /// The entry at `index` of epoch `epoch`, marked used; `None` when the
    /// proof does not carry it.
    fn find(&mut self, epoch: u32, index: u32) -> Option<&'p TreeEntry> {
        let e = self.epochs.binary_search_by_key(&epoch, |p| p.epoch).ok()?;
        let k = self.epochs[e]
            .entries
            .binary_search_by_key(&index, |x| x.index())
            .ok()?;
        self.used[e][k] = true;
        Some(&self.epochs[e].entries[k])
    }

    /// The entry at `index` of `epoch`, needed by `outpoint`'s item.
    fn need(
        &mut self,
        outpoint: OutPoint,
        epoch: u32,
        index: u32,
    ) -> Result<&'p TreeEntry, VerifyError> {
        self.find(epoch, index).ok_or(VerifyError::MissingEntry {
            outpoint,
            epoch,
            index,
        })
    }

    /// Every entry was used by some item.
    fn check_all_used(&self) -> Result<(), VerifyError> {
        for (e, u) in self.epochs.iter().zip(&self.used) {
            let count = u.iter().filter(|x| !**x).count();
            if count > 0 {
                return Err(VerifyError::UnusedEntries {
                    epoch: e.epoch,
                    count,
                });
            }
        }
        Ok(())
    }
}

/// An existence item: the leaf at (`epoch`, `index`) is `outpoint`'s, and
/// its txoutproof, when given, proves the spending transaction in its
/// block.
fn verify_spent(
    entries: &mut EntryUse,
    outpoint: OutPoint,
    epoch: u32,
    index: u32,
    txoutproof: Option<&MerkleBlock>,
) -> Result<VerifiedStatus, VerifyError> {
    let leaf = match entries.need(outpoint, epoch, index)? {
        TreeEntry::Spent { leaf, .. } if leaf.outpoint == outpoint => leaf,
        _ => {
            return Err(VerifyError::OutpointMismatch {
                outpoint,
                epoch,
                index,
            })
        }
    };
    let inclusion = match txoutproof {
        Some(mb) => Some(check_txoutproof(outpoint, leaf, mb)?),
        None => None,
    };
    Ok(VerifiedStatus::Spent {
        epoch,
        leaf: leaf.clone(),
        inclusion,
    })
}

/// A non-existence item: one gap per header, in the headers' epochs, and
/// each gap's two adjacent leaves bracket `outpoint`'s key.
fn verify_absent(
    entries: &mut EntryUse,
    outpoint: OutPoint,
    gaps: &[Gap],
    hs: &[EpochHeader],
) -> Result<VerifiedStatus, VerifyError> {
    if gaps.len() != hs.len() || gaps.iter().zip(hs).any(|(g, h)| g.epoch != h.epoch) {
        return Err(VerifyError::IncompleteAbsence { outpoint });
    }
    let key = outpoint_key(&outpoint);
    for g in gaps {
        let bad = || VerifyError::GapDoesNotBracket {
            outpoint,
            epoch: g.epoch,
            low: g.low,
        };
        let high_index = g.low.checked_add(1).ok_or_else(bad)?;
        let lo = entries.need(outpoint, g.epoch, g.low)?.cmp_key(&key);
        let hi = entries.need(outpoint, g.epoch, high_index)?.cmp_key(&key);
        if lo != std::cmp::Ordering::Less || hi != std::cmp::Ordering::Greater {
            return Err(bad());
        }
    }
    Ok(VerifiedStatus::Absent {
        epochs: gaps.iter().map(|g| g.epoch).collect(),
    })
}

/// Decodes the binary form and verifies it.
///
/// # Errors
/// A decoding or verification [`VerifyError`].
pub fn verify_bytes(bytes: &[u8], anchor: Anchor) -> Result<Verified, VerifyError> {
    verify(&ProofBatch::from_bytes(bytes)?, anchor)
}

/// Parses the JSON form (exactly as the HTTP proof routes return it) and
/// verifies it: `kakehi proof verify --root HEX | --commitment HEX FILE`.
///
/// # Errors
/// [`VerifyError::Json`] for malformed JSON or fields, [`VerifyError::BadChecksum`]
/// for edited content, else a verification error.
pub fn verify_json(json: &str, anchor: Anchor) -> Result<Verified, VerifyError> {
    if json.len() > MAX_PROOF_JSON_BYTES {
        return Err(VerifyError::TooLarge {
            len: json.len(),
            max: MAX_PROOF_JSON_BYTES,
        });
    }
    let doc: ProofJson =
        serde_json::from_str(json).map_err(|source| VerifyError::Json { source })?;
    let proof = ProofBatch::try_from(doc)?;
    verify(&proof, anchor)
}
