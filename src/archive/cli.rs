//! `kakehi proof verify --root HEX | --commitment HEX FILE`: verifies a proof
//! file (the JSON the HTTP proof routes return, as is, or the binary form of
//! `docs/archive.md` §6) with no database, and reports what it proves.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use bitcoin::hex::DisplayHex;

use super::proof::MAX_PROOF_JSON_BYTES;
use super::{verify_bytes, verify_json, Anchor, Verified, VerifiedStatus, VerifyError};

/// Errors of [`verify_command`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProofCliError {
    /// Neither or both of `--root` and `--commitment` were given.
    #[error("give exactly one of --root HEX and --commitment HEX")]
    Usage,
    /// The anchor is not 64 lowercase hex characters.
    #[error("bad anchor: {source}")]
    Anchor {
        /// Why.
        #[source]
        source: Box<VerifyError>,
    },
    /// The proof file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The proof file is larger than any valid proof.
    #[error("{path} is {len} bytes, larger than any proof ({max})")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size, bytes.
        len: u64,
        /// The cap, bytes.
        max: usize,
    },
    /// The proof does not verify: the reason names what failed.
    #[error("proof {path} REJECTED: {source}")]
    Rejected {
        /// The file.
        path: PathBuf,
        /// The verification failure.
        #[source]
        source: Box<VerifyError>,
    },
}

/// Verifies the proof in `file` against exactly one anchor: an epoch root
/// (`anchor_root`, 64 hex, as `GET /archive/epoch/{n}` shows it) or the
/// archive commitment (`anchor_commitment`, 64 hex, as `GET
/// /archive/commitment` shows it). The file holds the JSON form (what the
/// HTTP proof routes return, byte for byte) or, if it does not start with
/// `{` after whitespace, the binary form.
///
/// Returns a human-readable report, one line per outpoint, e.g.
/// `<txid>:<vout> SPENT at height 133 in block <hash> by <txid>:<vin> …`
/// or `<txid>:<vout> ABSENT from epochs 0..=9 …`.
///
/// # Errors
/// [`ProofCliError::Usage`] unless exactly one anchor is given,
/// [`ProofCliError::Anchor`] for malformed hex, [`ProofCliError::Read`] /
/// [`ProofCliError::TooLarge`] for the file, [`ProofCliError::Rejected`]
/// with the reason when verification fails (the CLI should exit non-zero).
pub fn verify_command(
    anchor_root: Option<&str>,
    anchor_commitment: Option<&str>,
    file: &Path,
) -> Result<String, ProofCliError> {
    let anchor = match (anchor_root, anchor_commitment) {
        (Some(r), None) => Anchor::root_from_hex(r),
        (None, Some(c)) => Anchor::commitment_from_hex(c),
        _ => return Err(ProofCliError::Usage),
    }
    .map_err(|source| ProofCliError::Anchor {
        source: Box::new(source),
    })?;
    let bytes = read_proof_file(file)?;
    let is_json = bytes
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'{');
    let rejected = |source| ProofCliError::Rejected {
        path: file.into(),
        source: Box::new(source),
    };
    let verified = if is_json {
        let text = std::str::from_utf8(&bytes).map_err(|_| {
            rejected(VerifyError::Json {
                source: serde::de::Error::custom("proof file is not UTF-8"),
            })
        })?;
        verify_json(text, anchor)
    } else {
        verify_bytes(&bytes, anchor)
    }
    .map_err(rejected)?;
    Ok(report(&verified))
}

/// The bytes of proof file `file`, refused above
/// [`MAX_PROOF_JSON_BYTES`] before it is read.
///
/// # Errors
/// [`ProofCliError::Read`], [`ProofCliError::TooLarge`].
fn read_proof_file(file: &Path) -> Result<Vec<u8>, ProofCliError> {
    let read_err = |source| ProofCliError::Read {
        path: file.into(),
        source,
    };
    let len = std::fs::metadata(file).map_err(read_err)?.len();
    if len > MAX_PROOF_JSON_BYTES as u64 {
        return Err(ProofCliError::TooLarge {
            path: file.into(),
            len,
            max: MAX_PROOF_JSON_BYTES,
        });
    }
    std::fs::read(file).map_err(read_err)
}

/// The report of a verified proof: the anchor, the epochs' height range,
/// then one line per outpoint.
fn report(verified: &Verified) -> String {
    let mut out = String::new();
    let (kind, value) = match verified.anchor {
        Anchor::Commitment(c) => ("archive commitment", c),
        Anchor::EpochRoot(r) => ("epoch root", r),
    };
    let _ = writeln!(
        out,
        "proof OK against {kind} {}",
        value.to_lower_hex_string()
    );
    if let (Some(first), Some(last)) = (verified.headers.first(), verified.headers.last()) {
        let _ = writeln!(
            out,
            "epochs {}..={} (block heights {}..={})",
            first.epoch, last.epoch, first.first_height, last.last_height
        );
    }
    for (op, status) in &verified.outpoints {
        match status {
            VerifiedStatus::Spent {
                epoch,
                leaf,
                inclusion,
            } => {
                let _ = write!(
                    out,
                    "{op} SPENT at height {} in block {} by {}:{} (epoch {epoch}; value {} sats, script {}, created at height {})",
                    leaf.spend.height,
                    leaf.spend.block_hash,
                    leaf.spend.txid,
                    leaf.spend.vin,
                    leaf.value,
                    leaf.script_pubkey.as_bytes().to_lower_hex_string(),
                    leaf.creation_height
                );
                match inclusion {
                    Some(i) => {
                        let _ = writeln!(
                            out,
                            "; txoutproof OK: {} is in block {} (merkle root {}): compare that hash with your header chain at height {}",
                            leaf.spend.txid, i.block_hash, i.merkle_root, leaf.spend.height
                        );
                    }
                    None => {
                        let _ = writeln!(out, "; no txoutproof");
                    }
                }
            }
            VerifiedStatus::Absent { epochs } => {
                let range = match (epochs.first(), epochs.last()) {
                    (Some(a), Some(b)) => format!("{a}..={b}"),
                    _ => "(none)".into(),
                };
                let _ = writeln!(
                    out,
                    "{op} ABSENT from epochs {range}: not spent by any block those epochs cover (says nothing about later blocks, nor that the output exists)"
                );
            }
        }
    }
    out
}
