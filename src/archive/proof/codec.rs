//! The binary form of a proof batch (magic `KKAP`, version, headers, epoch
//! proofs, items, a 4-byte checksum; `docs/archive.md`): encoding, and
//! decoding bounded by caps checked before allocation.

use super::*;

pub(super) fn checksum(body: &[u8]) -> [u8; 4] {
    let h = sha256::Hash::hash(body).to_byte_array();
    [h[0], h[1], h[2], h[3]]
}

/// The names a length-prefixed field's errors use.
#[derive(Clone, Copy)]
struct Bounded {
    /// The field.
    name: &'static str,
    /// Its length prefix.
    length: &'static str,
    /// Its byte count, when over the cap.
    bytes: &'static str,
}

impl Bounded {
    const ENTRY: Bounded = Bounded {
        name: "entry",
        length: "entry length",
        bytes: "entry bytes",
    };
    const TXOUTPROOF: Bounded = Bounded {
        name: "txoutproof",
        length: "txoutproof length",
        bytes: "txoutproof bytes",
    };
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], VerifyError> {
        let rest = self.b.len() - self.pos;
        if rest < n {
            return Err(VerifyError::Truncated {
                at: self.pos,
                what,
                need: n - rest,
            });
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, VerifyError> {
        Ok(self.take(1, what)?[0])
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, VerifyError> {
        let s = self.take(4, what)?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn h32(&mut self, what: &'static str) -> Result<[u8; 32], VerifyError> {
        let mut a = [0u8; 32];
        a.copy_from_slice(self.take(32, what)?);
        Ok(a)
    }
    /// A count, capped, and checked against the bytes left (each element
    /// needs at least `min_each` bytes) before anything is allocated.
    fn count(
        &mut self,
        what: &'static str,
        max: usize,
        min_each: usize,
    ) -> Result<usize, VerifyError> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(VerifyError::CountTooLarge {
                what,
                count: n,
                max,
            });
        }
        let rest = self.b.len() - self.pos;
        if n.saturating_mul(min_each) > rest {
            return Err(VerifyError::Truncated {
                at: self.pos,
                what,
                need: n * min_each - rest,
            });
        }
        Ok(n)
    }

    /// A byte string of at most `max` bytes behind a 4-byte length, with
    /// the error names of `what`.
    fn bounded(&mut self, what: Bounded, max: usize) -> Result<&'a [u8], VerifyError> {
        let len = self.u32(what.length)? as usize;
        if len > max {
            return Err(VerifyError::CountTooLarge {
                what: what.bytes,
                count: len,
                max,
            });
        }
        self.take(len, what.name)
    }

    /// One epoch proof: its epoch, entries (each behind its length), and
    /// nodes (level, index, hash).
    fn epoch_proof(&mut self) -> Result<EpochProof, VerifyError> {
        let epoch = self.u32("epoch")?;
        let nent = self.count("entries", MAX_ENTRIES_PER_EPOCH, 9)?;
        let mut entries = Vec::with_capacity(nent);
        for _ in 0..nent {
            let eb = self.bounded(Bounded::ENTRY, MAX_ENTRY_LEN)?;
            entries.push(
                TreeEntry::decode(eb).map_err(|source| VerifyError::BadEntry { epoch, source })?,
            );
        }
        let nn = self.count("nodes", MAX_NODES_PER_EPOCH, 37)?;
        let mut nodes = Vec::with_capacity(nn);
        for _ in 0..nn {
            let level = self.u8("node level")?;
            let index = self.u32("node index")?;
            let hash = self.h32("node hash")?;
            nodes.push(ProofNode { level, index, hash });
        }
        Ok(EpochProof {
            epoch,
            entries,
            nodes,
        })
    }

    /// One item: tag 0, an existence item (epoch, index, an optional
    /// txoutproof), or tag 1, a non-existence item (its gaps).
    fn item(&mut self) -> Result<ProofItem, VerifyError> {
        let tag = self.u8("item tag")?;
        let mut k = [0u8; 36];
        k.copy_from_slice(self.take(36, "outpoint")?);
        let outpoint = crate::primitives::key_outpoint(&k);
        match tag {
            0 => {
                let epoch = self.u32("item epoch")?;
                let index = self.u32("item index")?;
                let txoutproof = match self.u8("txoutproof flag")? {
                    0 => None,
                    1 => {
                        let mb = self.bounded(Bounded::TXOUTPROOF, MAX_TXOUTPROOF_LEN)?;
                        let mb =
                            bitcoin::consensus::deserialize::<MerkleBlock>(mb).map_err(|_| {
                                VerifyError::BadTxOutProof {
                                    outpoint,
                                    reason: "does not decode as a MerkleBlock",
                                }
                            })?;
                        Some(mb)
                    }
                    _ => {
                        return Err(VerifyError::BadField {
                            what: "txoutproof flag",
                        })
                    }
                };
                Ok(ProofItem::Spent {
                    outpoint,
                    epoch,
                    index,
                    txoutproof,
                })
            }
            1 => {
                let ng = self.count("gaps", MAX_PROOF_EPOCHS, 8)?;
                let mut gaps = Vec::with_capacity(ng);
                for _ in 0..ng {
                    let epoch = self.u32("gap epoch")?;
                    let low = self.u32("gap low")?;
                    gaps.push(Gap { epoch, low });
                }
                Ok(ProofItem::Absent { outpoint, gaps })
            }
            _ => Err(VerifyError::BadField { what: "item tag" }),
        }
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_count(out: &mut Vec<u8>, n: usize) {
    put_u32(out, u32::try_from(n).unwrap_or(u32::MAX));
}

impl ProofBatch {
    /// Body (magic through items) and whether it fits the caps.
    pub(super) fn encode_body(&self) -> (Vec<u8>, bool) {
        let mut out = Vec::with_capacity(1024);
        out.extend_from_slice(&PROOF_MAGIC);
        out.push(PROOF_VERSION);
        put_count(&mut out, self.headers.len());
        for h in &self.headers {
            out.extend_from_slice(&h.encode());
        }
        put_count(&mut out, self.epochs.len());
        for e in &self.epochs {
            put_u32(&mut out, e.epoch);
            put_count(&mut out, e.entries.len());
            for entry in &e.entries {
                let b = entry.encode();
                put_count(&mut out, b.len());
                out.extend_from_slice(&b);
            }
            put_count(&mut out, e.nodes.len());
            for n in &e.nodes {
                out.push(n.level);
                put_u32(&mut out, n.index);
                out.extend_from_slice(&n.hash);
            }
        }
        put_count(&mut out, self.items.len());
        for item in &self.items {
            match item {
                ProofItem::Spent {
                    outpoint,
                    epoch,
                    index,
                    txoutproof,
                } => {
                    out.push(0);
                    out.extend_from_slice(&outpoint_key(outpoint));
                    put_u32(&mut out, *epoch);
                    put_u32(&mut out, *index);
                    match txoutproof {
                        None => out.push(0),
                        Some(mb) => {
                            out.push(1);
                            let b = bitcoin::consensus::serialize(mb);
                            put_count(&mut out, b.len());
                            out.extend_from_slice(&b);
                        }
                    }
                }
                ProofItem::Absent { outpoint, gaps } => {
                    out.push(1);
                    out.extend_from_slice(&outpoint_key(outpoint));
                    put_count(&mut out, gaps.len());
                    for g in gaps {
                        put_u32(&mut out, g.epoch);
                        put_u32(&mut out, g.low);
                    }
                }
            }
        }
        let fits = out.len() + 4 <= MAX_PROOF_BYTES;
        (out, fits)
    }

    /// The binary encoding: magic `KKAP`, version, headers, epoch proofs,
    /// items, then a 4-byte checksum (first 4 bytes of SHA-256 of all
    /// preceding bytes). Layout in `docs/archive.md`.
    pub fn to_bytes(&self) -> Vec<u8> {
        let (mut body, _) = self.encode_body();
        let c = checksum(&body);
        body.extend_from_slice(&c);
        body
    }

    /// Decodes the binary encoding, bounded: every count is capped and
    /// checked against the bytes present before allocation.
    ///
    /// # Errors
    /// [`VerifyError`] naming the malformed field.
    pub fn from_bytes(b: &[u8]) -> Result<ProofBatch, VerifyError> {
        if b.len() > MAX_PROOF_BYTES {
            return Err(VerifyError::TooLarge {
                len: b.len(),
                max: MAX_PROOF_BYTES,
            });
        }
        if b.len() < 9 {
            return Err(VerifyError::Truncated {
                at: 0,
                what: "magic",
                need: 9 - b.len(),
            });
        }
        let (body, sum) = b.split_at(b.len() - 4);
        let mut r = Reader { b: body, pos: 0 };
        if r.take(4, "magic")? != PROOF_MAGIC {
            return Err(VerifyError::BadMagic);
        }
        let version = r.u8("version")?;
        if version != PROOF_VERSION {
            return Err(VerifyError::UnsupportedVersion { version });
        }
        if checksum(body) != sum {
            return Err(VerifyError::BadChecksum);
        }
        let nh = r.count("headers", MAX_PROOF_EPOCHS, HEADER_LEN)?;
        let mut headers = Vec::with_capacity(nh);
        for _ in 0..nh {
            let hb = r.take(HEADER_LEN, "header")?;
            headers.push(EpochHeader::decode(hb).ok_or(VerifyError::BadField {
                what: "header version",
            })?);
        }
        let ne = r.count("epoch proofs", MAX_PROOF_EPOCHS, 12)?;
        let mut epochs = Vec::with_capacity(ne);
        for _ in 0..ne {
            epochs.push(r.epoch_proof()?);
        }
        let ni = r.count("items", MAX_ITEMS, 41)?;
        let mut items = Vec::with_capacity(ni);
        for _ in 0..ni {
            items.push(r.item()?);
        }
        if r.pos != body.len() {
            return Err(VerifyError::TrailingBytes {
                extra: body.len() - r.pos,
            });
        }
        Ok(ProofBatch {
            headers,
            epochs,
            items,
        })
    }
}
