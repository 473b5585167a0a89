//! `dump-utxos` in bounded memory: the UTXO set in the text form of Core's
//! `dumptxoutset`, sorted by txid (display hex) then vout, whatever its
//! size.
//!
//! The table walks its entries in hash order, so the lines are sorted
//! outside it: formatted lines are gathered into runs of at most
//! [`RUN_BYTES`], each sorted in memory; a set that fits one run is written
//! at once, a larger one goes through temporary run files in the datadir
//! (`dump-utxos-*/`, removed when the dump ends) and a k-way merge. Memory:
//! one run and a 64 KiB reader per run file (the whole testnet4-sized set,
//! 4.9M outputs, is ~11 runs; mainnet's ~180M outputs ~400), against the
//! whole set's lines before (~150 bytes per output).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use bitcoin::hashes::Hash as _;
use bitcoin::hex::DisplayHex;

use super::{Chainstate, DumpError};

/// Bytes of lines sorted in memory at once: 64 MiB.
pub(crate) const RUN_BYTES: usize = 64 << 20;

/// The sort key of a line: the txid's bytes in display order (so byte
/// order is the display hex's order), then vout.
type Key = ([u8; 32], u32);

/// Lines gathered for one run, with their keys.
#[derive(Default)]
struct Run {
    lines: Vec<(Key, Vec<u8>)>,
    bytes: usize,
}

impl Run {
    fn push(&mut self, key: Key, line: Vec<u8>) {
        self.bytes += line.len() + std::mem::size_of::<(Key, Vec<u8>)>();
        self.lines.push((key, line));
    }

    fn sorted(&mut self) -> Vec<(Key, Vec<u8>)> {
        self.bytes = 0;
        let mut lines = std::mem::take(&mut self.lines);
        lines.sort_unstable_by_key(|a| a.0);
        lines
    }
}

/// Writes sorted runs to files in a temporary directory of the datadir.
struct RunFiles {
    dir: tempfile::TempDir,
    files: Vec<std::path::PathBuf>,
}

impl RunFiles {
    fn new(datadir: &Path) -> Result<Self, DumpError> {
        let dir = tempfile::Builder::new()
            .prefix("dump-utxos-")
            .tempdir_in(datadir)
            .map_err(temp_error(datadir))?;
        Ok(RunFiles {
            dir,
            files: Vec::new(),
        })
    }

    /// Writes one sorted run ([`write_record`] per line).
    fn write(&mut self, lines: Vec<(Key, Vec<u8>)>) -> Result<(), DumpError> {
        let path = self.dir.path().join(format!("run-{:05}", self.files.len()));
        let written = File::create(&path).and_then(|f| {
            let mut w = BufWriter::new(f);
            for (key, line) in &lines {
                write_record(&mut w, key, line)?;
            }
            w.flush()
        });
        written.map_err(temp_error(&path))?;
        self.files.push(path);
        Ok(())
    }

    /// Merges the run files, in key order, into `out`.
    fn merge(&self, out: &mut dyn Write) -> Result<(), DumpError> {
        let mut readers = Vec::with_capacity(self.files.len());
        let mut heap = BinaryHeap::with_capacity(self.files.len());
        let mut lines = vec![Vec::new(); self.files.len()];
        for (i, path) in self.files.iter().enumerate() {
            let temp = temp_error(path);
            let mut r = BufReader::with_capacity(64 << 10, File::open(path).map_err(&temp)?);
            if let Some(key) = read_record(&mut r, &mut lines[i]).map_err(temp)? {
                heap.push(Reverse((key, i)));
            }
            readers.push(r);
        }
        while let Some(Reverse((_, i))) = heap.pop() {
            out.write_all(&lines[i])?;
            let next = read_record(&mut readers[i], &mut lines[i]);
            if let Some(key) = next.map_err(temp_error(&self.files[i]))? {
                heap.push(Reverse((key, i)));
            }
        }
        Ok(())
    }
}

/// The [`DumpError::Temp`] of an I/O error on `path`.
fn temp_error(path: &Path) -> impl Fn(std::io::Error) -> DumpError + '_ {
    move |source| DumpError::Temp {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes one record of a run file: the line's key (txid 32 bytes, vout
/// u32 LE), its length (u32 LE) and its bytes.
fn write_record(w: &mut impl Write, (txid, vout): &Key, line: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(line.len()).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, "a dump line over 4 GiB")
    })?;
    w.write_all(txid)?;
    w.write_all(&vout.to_le_bytes())?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(line)
}

/// Reads the next record of a run file ([`write_record`]) into `line`: its
/// key, or `None` at the file's end.
fn read_record(r: &mut impl Read, line: &mut Vec<u8>) -> std::io::Result<Option<Key>> {
    let mut head = [0u8; 40];
    match r.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut txid = [0u8; 32];
    txid.copy_from_slice(&head[..32]);
    let vout = u32::from_le_bytes([head[32], head[33], head[34], head[35]]);
    let len = u32::from_le_bytes([head[36], head[37], head[38], head[39]]) as usize;
    line.resize(len, 0);
    r.read_exact(line)?;
    Ok(Some((txid, vout)))
}

impl Chainstate {
    /// Writes the UTXO set of the active chain in the text form of Core's
    /// `dumptxoutset` as `testnet-data/regtest-a/utxos.txt` has it: one line
    /// per output, `txid:vout value_sats scriptPubKey_hex height coinbase`,
    /// sorted by txid (display hex) then vout. Memory is bounded by
    /// runs of 64 MiB of lines whatever the set's size.
    ///
    /// # Errors
    /// UTXO-table failure, a write error, or a temporary run file that
    /// cannot be written or read ([`DumpError::Temp`]).
    pub fn dump_utxos(&mut self, out: &mut dyn Write) -> Result<(), DumpError> {
        self.dump_utxos_in_runs(out, RUN_BYTES)
    }

    /// [`Chainstate::dump_utxos`] with runs of `run_bytes` bytes of lines
    /// (tests give a small one to send a small set through the run files
    /// and the merge).
    ///
    /// # Errors
    /// As [`Chainstate::dump_utxos`].
    pub fn dump_utxos_in_runs(
        &mut self,
        out: &mut dyn Write,
        run_bytes: usize,
    ) -> Result<(), DumpError> {
        let datadir = self.datadir.clone();
        let mut run = Run::default();
        let mut files: Option<RunFiles> = None;
        let mut failed: Option<DumpError> = None;
        self.for_each_utxo(&mut |op, coin, height| {
            if failed.is_some() {
                return;
            }
            let mut txid = op.txid.to_byte_array();
            txid.reverse();
            let line = format!(
                "{}:{} {} {} {height} {}\n",
                op.txid,
                op.vout,
                coin.value.to_sat(),
                coin.script_pubkey.to_lower_hex_string(),
                u8::from(coin.coinbase)
            );
            run.push((txid, op.vout), line.into_bytes());
            if run.bytes >= run_bytes {
                if files.is_none() {
                    match RunFiles::new(&datadir) {
                        Ok(f) => files = Some(f),
                        Err(e) => {
                            failed = Some(e);
                            return;
                        }
                    }
                }
                if let Some(f) = files.as_mut() {
                    failed = f.write(run.sorted()).err();
                }
            }
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        let mut buf = BufWriter::new(out);
        match files {
            None => {
                for (_, line) in run.sorted() {
                    buf.write_all(&line)?;
                }
            }
            Some(mut f) => {
                if !run.lines.is_empty() {
                    f.write(run.sorted())?;
                }
                f.merge(&mut buf)?;
            }
        }
        buf.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs written and merged give the lines in key order, each once,
    /// whatever the runs' split (vout in numeric order: 2 before 10).
    #[test]
    fn runs_merge_in_key_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = RunFiles::new(dir.path()).unwrap();
        let key = |b: u8, vout: u32| ([b; 32], vout);
        let line = |b: u8, vout: u32| format!("{b:02x}:{vout}\n").into_bytes();
        let mut all = Vec::new();
        for chunk in [
            vec![(3, 10), (1, 2), (7, 0)],
            vec![(3, 2), (2, 5)],
            vec![(9, 1), (1, 10), (5, 4), (0, 0)],
        ] {
            let mut run = Run::default();
            for (b, v) in chunk {
                run.push(key(b, v), line(b, v));
                all.push((key(b, v), line(b, v)));
            }
            files.write(run.sorted()).unwrap();
        }
        let mut out = Vec::new();
        files.merge(&mut out).unwrap();
        all.sort();
        let want: Vec<u8> = all.into_iter().flat_map(|(_, l)| l).collect();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            String::from_utf8(want).unwrap()
        );
        // The run files live in the datadir until the dump ends.
        let tmp = files.dir.path().to_path_buf();
        assert!(tmp.starts_with(dir.path()) && tmp.exists());
        drop(files);
        assert!(!tmp.exists());
    }
}
