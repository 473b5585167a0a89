//! `mempool.dat`: the pool saved at a clean stop and reloaded at start, in
//! Bitcoin Core's own format, so either node can read the other's file.
//!
//! # Format (Core's `node/mempool_persist.cpp`, little-endian)
//!
//! | field | size | meaning |
//! | --- | --- | --- |
//! | version | 8 | 1 (plain) or 2 (the rest XORed with the key below, by file offset: the byte at offset `p` with `key[p % 8]`); kakehi writes 1 |
//! | key | 1 + 8 | version 2 only: a compact-size length (8) and the XOR key |
//! | count | 8 | number of transactions |
//! | per transaction | var | the transaction with witness, then entry time (i64, seconds since the UNIX epoch), then fee delta (i64, sats: `prioritisetransaction`, written 0) |
//! | deltas | var | a compact-size count of (txid, i64) fee deltas; kakehi writes 0 and ignores them |
//! | unbroadcast | var | a compact-size count of txids; written 0, ignored |
//!
//! Written to `mempool.dat.new`, synced, then renamed over `mempool.dat`
//! (Core does the same), so a crash leaves the old file or the new one.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read};
use std::path::{Path, PathBuf};

use bitcoin::consensus::{Decodable, Encodable};
use bitcoin::Transaction;

/// The file's name in the network's datadir.
pub const FILE_NAME: &str = "mempool.dat";

/// Core's `MEMPOOL_DUMP_VERSION_NO_XOR_KEY`.
const VERSION_PLAIN: u64 = 1;
/// Core's `MEMPOOL_DUMP_VERSION` (XOR-obfuscated).
const VERSION_XOR: u64 = 2;

/// Largest `mempool.dat` read, bytes: three times the largest pool
/// kakehi accounts for by default would still be far below this.
const MAX_FILE_BYTES: u64 = 4 << 30;

/// Why `mempool.dat` could not be saved or loaded. Loading failures leave
/// the mempool empty; the node goes on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PersistError {
    /// Reading, writing, syncing or renaming failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The file does not decode.
    #[error("{path}: not a mempool.dat file: {detail}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
}

/// Writes `txs` (transaction, entry time in seconds) to `dir/mempool.dat`
/// in Core's version-1 format, atomically (temporary file, fsync, rename,
/// directory fsync).
///
/// # Errors
/// [`PersistError::Io`].
pub fn save<'a>(
    dir: &Path,
    txs: impl ExactSizeIterator<Item = (&'a Transaction, u64)>,
) -> Result<(), PersistError> {
    let path = dir.join(FILE_NAME);
    let tmp = dir.join(format!("{FILE_NAME}.new"));
    let io = |source| PersistError::Io {
        path: tmp.clone(),
        source,
    };
    let file = File::create(&tmp).map_err(io)?;
    let mut w = bitcoin::io::FromStd::new(BufWriter::new(file));
    let body = || -> Result<(), bitcoin::io::Error> {
        VERSION_PLAIN.consensus_encode(&mut w)?;
        (txs.len() as u64).consensus_encode(&mut w)?;
        for (tx, time) in txs {
            tx.consensus_encode(&mut w)?;
            (time as i64).consensus_encode(&mut w)?;
            0i64.consensus_encode(&mut w)?;
        }
        bitcoin::VarInt(0).consensus_encode(&mut w)?;
        bitcoin::VarInt(0).consensus_encode(&mut w)?;
        let w = w.into_inner();
        let file = w.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok(())
    };
    body().map_err(|e| io(e.into()))?;
    std::fs::rename(&tmp, &path).map_err(|source| PersistError::Io {
        path: path.clone(),
        source,
    })?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| PersistError::Io {
            path: dir.to_path_buf(),
            source,
        })
}

/// Bytes before the obfuscated part of a version-2 file: the version (8)
/// and the key as a vector (a compact-size 8, then 8 bytes).
const XOR_HEADER_LEN: usize = 8 + 1 + 8;

/// A reader that XORs what it reads with a repeating key (Core's
/// `AutoFile` obfuscation of version 2). The key is applied by file
/// position, as `AutoFile` does: the byte at offset `p` is XORed with
/// `key[p % 8]`, so `pos` starts at the offset of the first byte read.
struct Xor<R> {
    inner: R,
    key: [u8; 8],
    pos: usize,
}

impl<R: Read> Read for Xor<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        for b in &mut buf[..n] {
            *b ^= self.key[self.pos % 8];
            self.pos += 1;
        }
        Ok(n)
    }
}

/// Reads `dir/mempool.dat` (Core's version 1 or 2): the transactions with
/// their entry times, in file order. `Ok(None)` when there is no file.
///
/// # Errors
/// [`PersistError::Io`]; [`PersistError::Format`] for an unknown
/// version, a file over 4 GiB, or bytes that do not decode.
pub fn load(dir: &Path) -> Result<Option<Vec<(Transaction, u64)>>, PersistError> {
    let path = dir.join(FILE_NAME);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(PersistError::Io { path, source }),
    };
    let format = |detail: String| PersistError::Format {
        path: path.clone(),
        detail,
    };
    let len = file
        .metadata()
        .map_err(|source| PersistError::Io {
            path: path.clone(),
            source,
        })?
        .len();
    if len > MAX_FILE_BYTES {
        return Err(format(format!(
            "{len} bytes, over the {MAX_FILE_BYTES}-byte limit"
        )));
    }
    let mut r = bitcoin::io::FromStd::new(BufReader::new(file).take(len));
    let version = u64::consensus_decode(&mut r).map_err(|e| format(e.to_string()))?;
    let txs = match version {
        VERSION_PLAIN => read_entries(&mut r),
        VERSION_XOR => {
            let key: Vec<u8> = Vec::consensus_decode(&mut r).map_err(|e| format(e.to_string()))?;
            let key: [u8; 8] = key
                .try_into()
                .map_err(|_| format("an XOR key that is not 8 bytes".into()))?;
            let mut x = bitcoin::io::FromStd::new(Xor {
                inner: r.into_inner(),
                key,
                pos: XOR_HEADER_LEN,
            });
            read_entries(&mut x)
        }
        v => return Err(format(format!("version {v}, not 1 or 2"))),
    };
    txs.map(Some).map_err(|e| format(e.to_string()))
}

/// The entries after the version (and key).
fn read_entries(
    r: &mut impl bitcoin::io::Read,
) -> Result<Vec<(Transaction, u64)>, bitcoin::consensus::encode::Error> {
    let count = u64::consensus_decode(r)?;
    let mut txs = Vec::new();
    for _ in 0..count {
        let tx = Transaction::consensus_decode(r)?;
        let time = i64::consensus_decode(r)?;
        let _fee_delta = i64::consensus_decode(r)?;
        txs.push((tx, time.max(0) as u64));
    }
    Ok(txs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::absolute::LockTime;
    use bitcoin::transaction::Version;
    use bitcoin::{Amount, OutPoint, ScriptBuf, Sequence, TxIn, TxOut, Witness};

    fn tx(n: u8) -> Transaction {
        Transaction {
            version: Version::TWO,
            lock_time: LockTime::ZERO,
            input: vec![TxIn {
                previous_output: OutPoint {
                    txid: bitcoin::hashes::Hash::from_byte_array([n; 32]),
                    vout: 1,
                },
                script_sig: ScriptBuf::new(),
                sequence: Sequence::MAX,
                witness: Witness::from_slice(&[vec![n; 72], vec![2; 33]]),
            }],
            output: vec![TxOut {
                value: Amount::from_sat(1000 + u64::from(n)),
                script_pubkey: ScriptBuf::from_bytes(vec![0x51]),
            }],
        }
    }

    #[test]
    fn saves_and_loads_core_version_1_and_reads_version_2() {
        let dir = tempfile::tempdir().expect("tempdir");
        let txs = [tx(1), tx(2), tx(3)];
        save(dir.path(), txs.iter().zip([10, 20, 30])).expect("save");
        let back = load(dir.path()).expect("load").expect("file");
        assert_eq!(
            back,
            vec![
                (txs[0].clone(), 10),
                (txs[1].clone(), 20),
                (txs[2].clone(), 30)
            ]
        );
        // The same content as Core's version 2: the key, then every byte
        // after it XORed with the key by file offset (`AutoFile`: the
        // first obfuscated byte, at offset 17, with key[1]).
        let plain = std::fs::read(dir.path().join(FILE_NAME)).expect("read");
        let key = [0x5a, 1, 2, 3, 4, 5, 6, 0xff];
        let mut v2 = VERSION_XOR.to_le_bytes().to_vec();
        v2.push(8);
        v2.extend_from_slice(&key);
        v2.extend(
            plain[8..]
                .iter()
                .enumerate()
                .map(|(i, b)| b ^ key[(XOR_HEADER_LEN + i) % 8]),
        );
        std::fs::write(dir.path().join(FILE_NAME), v2).expect("write");
        assert_eq!(load(dir.path()).expect("load v2").expect("file"), back);
    }

    #[test]
    fn refuses_garbage_and_truncation_without_panic() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(load(dir.path()).expect("no file").is_none());
        std::fs::write(dir.path().join(FILE_NAME), [9u8; 40]).expect("write");
        assert!(matches!(load(dir.path()), Err(PersistError::Format { .. })));
        let txs = [tx(1), tx(2)];
        save(dir.path(), txs.iter().zip([1, 2])).expect("save");
        let bytes = std::fs::read(dir.path().join(FILE_NAME)).expect("read");
        for cut in [9, 20, bytes.len() - 3] {
            std::fs::write(dir.path().join(FILE_NAME), &bytes[..cut]).expect("write");
            assert!(
                matches!(load(dir.path()), Err(PersistError::Format { .. })),
                "cut at {cut}"
            );
        }
        // A count far larger than the file allocates nothing up front.
        let mut huge = VERSION_PLAIN.to_le_bytes().to_vec();
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        std::fs::write(dir.path().join(FILE_NAME), huge).expect("write");
        assert!(matches!(load(dir.path()), Err(PersistError::Format { .. })));
    }
}
