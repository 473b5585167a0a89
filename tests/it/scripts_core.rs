//! kakehi's verdict on blocks with mutated scripts equals Bitcoin Core's:
//! the judge is Core's own engine (libbitcoinkernel, PyPI py-bitcoinkernel,
//! module `pbk`, Core 31.99; `tests/python/core_judge.py`), run on the same
//! chain in the same run.
//!
//! Both import regtest-a (bcoin's chain), then judge regtest-a's case 16 (a
//! bad signature), then the blocks this test builds on top with
//! `common::blockgen`: a coinbase paying to the test's own keys (P2PKH,
//! P2WPKH, P2SH-P2WPKH, P2TR key path, P2SH 2-of-3, P2WSH 2-of-3), 99
//! blocks to mature it, then rounds of: a valid block spending the six
//! outputs in one signed transaction (to the same six kinds), and the same
//! block with one byte of one input's scriptSig or witness changed (merkle
//! root, witness commitment and proof of work made right again, so that
//! only the scripts can fail). Each mutated block goes to kakehi
//! (`Chainstate::submit_block`) and to Core (`process_block`); the mutated
//! input also goes through Core's script verification API
//! (`ScriptPubkey.verify`) and kakehi's ([`PreparedTx::verify`]).
//!
//! Every verdict must be the same: accepted or rejected; on rejection
//! Core's logged reason must start with kakehi's reject reason, followed by
//! the same input and txid (errors Core renamed after 26.0, kakehi's
//! engine, are translated by `common::core_versions` and counted). Then the
//! valid block goes to both (or, if the mutation was valid for both, the
//! chain goes on from it). 50 mutations in CI, 2,000 with `KAKEHI_LONG=1`.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use bitcoin::consensus::encode::serialize;
use bitcoin::hex::DisplayHex;
use bitcoin::{
    absolute, transaction, Amount, Block, BlockHash, OutPoint, Sequence, Transaction, TxIn, TxOut,
    Witness,
};
use common::blockgen::{coinbase, mine, subsidy, Kind, Wallet};
use common::{core_versions, data, Rng, TestNode};
use kakehi::pipeline::SubmitOutcome;
use kakehi::validation::script::{block_script_flags, PreparedTx, SpentTxOut};

/// Core's engine behind `core_judge.py`.
struct Judge {
    child: Child,
    /// Closed (`None`) by `Drop`, which ends the judge's command loop.
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

/// Core's verdict on a block.
#[derive(Debug)]
struct CoreVerdict {
    accepted: bool,
    /// "reason, debug message" from Core's log, when ConnectBlock failed.
    failure: Option<String>,
}

impl Judge {
    /// Starts the judge; it imports `files` while the caller goes on
    /// ([`Judge::ready`] waits for it).
    fn start(files: &[std::path::PathBuf]) -> Judge {
        let python = common::python::venv_python();
        let mut child = Command::new(python)
            .arg(common::python::script("core_judge.py"))
            .args(files)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start core_judge.py");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Judge {
            child,
            stdin: Some(stdin),
            stdout,
        }
    }

    /// Waits until the judge has imported its files.
    fn ready(&mut self) {
        let ready = self.read();
        assert_eq!(ready["ready"], true, "{ready}");
    }

    fn read(&mut self) -> serde_json::Value {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("judge output");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("judge said {line:?}: {e}"))
    }

    fn ask(&mut self, cmd: serde_json::Value) -> serde_json::Value {
        let stdin = self.stdin.as_mut().expect("the judge's input is open");
        writeln!(stdin, "{cmd}").expect("judge input");
        stdin.flush().expect("judge input");
        self.read()
    }

    fn block(&mut self, block: &Block) -> CoreVerdict {
        let v = self.ask(serde_json::json!({
            "cmd": "block",
            "hex": serialize(block).to_lower_hex_string(),
        }));
        assert_eq!(v["hash"], block.block_hash().to_string(), "{v}");
        CoreVerdict {
            accepted: v["accepted"] == true,
            failure: v["failure"].as_str().map(str::to_string),
        }
    }

    fn verify(&mut self, tx: &Transaction, spent: &[TxOut], input: usize, flags: u32) -> bool {
        let spent: Vec<serde_json::Value> = spent
            .iter()
            .map(|o| {
                serde_json::json!([
                    o.script_pubkey.as_bytes().to_lower_hex_string(),
                    o.value.to_sat()
                ])
            })
            .collect();
        let v = self.ask(serde_json::json!({
            "cmd": "verify",
            "tx": serialize(tx).to_lower_hex_string(),
            "spent": spent,
            "input": input,
            "flags": flags,
        }));
        v["ok"] == true
    }
}

/// Closes the judge's input so that it leaves its command loop and
/// deletes its temporary datadir (a killed judge leaves it in the system's
/// temporary directory); kills it after 30 s.
impl Drop for Judge {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(std::time::Duration::from_millis(50)),
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The fee of each round's transaction per output, sats: six coins of
/// regtest-a's tip subsidy (50 BTC after 10 halvings, 813,802 sats each)
/// last the 2,000 rounds of the long mode (1,000 sats ran out at round 813).
const FEE_SATS: u64 = 100;

/// The chain both nodes follow, and the wallet's six outputs at its tip.
struct Extension {
    wallet: Wallet,
    tip: (BlockHash, u32),
    height: u32,
    coins: Vec<(Kind, OutPoint, TxOut)>,
}

/// A coinbase at `height` paying the subsidy to the wallet's P2WPKH.
fn reward(wallet: &Wallet, height: u32, tag: u32) -> Transaction {
    let pay = TxOut {
        value: Amount::from_sat(subsidy(height)),
        script_pubkey: wallet.script_pubkey(Kind::P2wpkh),
    };
    coinbase(height, tag, vec![pay])
}

impl Extension {
    fn next_coinbase(&self, tag: u32) -> Transaction {
        reward(&self.wallet, self.height + 1, tag)
    }

    /// The transaction spending the six coins into six new ones.
    fn spend_all(&self) -> (Transaction, Vec<TxOut>) {
        let input = self
            .coins
            .iter()
            .map(|(_, op, _)| TxIn {
                previous_output: *op,
                sequence: Sequence::MAX,
                ..TxIn::default()
            })
            .collect();
        let output = self
            .coins
            .iter()
            .map(|(kind, _, out)| TxOut {
                value: out.value - Amount::from_sat(FEE_SATS),
                script_pubkey: self.wallet.script_pubkey(*kind),
            })
            .collect();
        let mut tx = Transaction {
            version: transaction::Version::TWO,
            lock_time: absolute::LockTime::ZERO,
            input,
            output,
        };
        let prevouts: Vec<(Kind, TxOut)> =
            self.coins.iter().map(|(k, _, o)| (*k, o.clone())).collect();
        self.wallet.sign(&mut tx, &prevouts);
        let spent = self.coins.iter().map(|(_, _, o)| o.clone()).collect();
        (tx, spent)
    }

    /// Moves the tip to `block`, whose last transaction (if not the
    /// coinbase) now holds the six coins.
    fn advance(&mut self, block: &Block) {
        self.tip = (block.block_hash(), block.header.time);
        self.height += 1;
        if let Some(tx) = block.txdata.get(1) {
            let txid = tx.compute_txid();
            for (i, coin) in self.coins.iter_mut().enumerate() {
                coin.1 = OutPoint {
                    txid,
                    vout: i as u32,
                };
                coin.2 = tx.output[i].clone();
            }
        }
    }
}

/// Where a mutation lands: input, field (`None`: scriptSig, else witness
/// item), byte.
fn mutate(tx: &Transaction, rng: &mut Rng) -> (Transaction, usize, String) {
    let mut places = Vec::new();
    for (i, input) in tx.input.iter().enumerate() {
        for b in 0..input.script_sig.len() {
            places.push((i, None, b));
        }
        for (w, item) in input.witness.iter().enumerate() {
            for b in 0..item.len() {
                places.push((i, Some(w), b));
            }
        }
    }
    let (i, field, b) = places[rng.below(places.len())];
    let flip = 1 + rng.below(255) as u8;
    let mut out = tx.clone();
    let what = match field {
        None => {
            let mut bytes = out.input[i].script_sig.to_bytes();
            bytes[b] ^= flip;
            out.input[i].script_sig = bytes.into();
            format!("input {i} scriptSig byte {b} ^ {flip:#04x}")
        }
        Some(w) => {
            let mut items: Vec<Vec<u8>> = out.input[i].witness.iter().map(<[u8]>::to_vec).collect();
            items[w][b] ^= flip;
            out.input[i].witness = Witness::from_slice(&items);
            format!("input {i} witness item {w} byte {b} ^ {flip:#04x}")
        }
    };
    (out, i, what)
}

fn kakehi_submit(node: &TestNode, block: &Block) -> SubmitOutcome {
    node.chain.lock().submit_block(block).expect("storage")
}

/// Compares a rejection: Core's "reason, debug" against kakehi's reason and
/// detail ("input N of TXID: message"). Returns whether the script error
/// needed a translation between Core versions.
fn same_rejection(core: &str, reason: &str, detail: &str, has_if: bool) -> Result<bool, String> {
    let (core_reason, core_debug) = core.split_once("), ").map_or((core, ""), |(r, d)| (r, d));
    let core_reason = if core_debug.is_empty() {
        core_reason.to_string()
    } else {
        format!("{core_reason})")
    };
    let translated = if core_reason == reason {
        false
    } else {
        let inner = |r: &str| {
            r.strip_prefix("block-script-verify-flag-failed (")
                .and_then(|m| m.strip_suffix(')'))
                .map(str::to_string)
        };
        match (inner(&core_reason), inner(reason)) {
            (Some(c), Some(k)) if core_versions::is_version_change(&c, &k, has_if) => true,
            _ => return Err(format!("Core: {core}; kakehi: {reason} ({detail})")),
        }
    };
    // kakehi's detail starts "input N of TXID"; Core's debug message too.
    let place = detail.split(':').next().unwrap_or(detail);
    if !core_debug.starts_with(place) {
        return Err(format!(
            "Core: {core}; kakehi: {reason} ({detail}): another input"
        ));
    }
    Ok(translated)
}

#[test]
fn mutated_scripts_get_cores_verdict() {
    let long = std::env::var_os("KAKEHI_LONG").is_some_and(|v| v == "1");
    let rounds = if long { 2_000 } else { 50 };
    let blocks = data("regtest-a/blocks.dat");
    // Both import regtest-a at the same time.
    let mut core = Judge::start(std::slice::from_ref(&blocks));
    let node = TestNode::new(bitcoin::Network::Regtest);
    let imported = node.import(std::slice::from_ref(&blocks));
    assert!(imported.rejected.is_empty(), "{:?}", imported.rejected);
    core.ready();
    let params = node.chain.lock().params().clone();

    // regtest-a's case 16: the same rejection from both, same input.
    let case16 =
        kakehi::import::read_file(&data("regtest-a/invalid/16-bad-signature.blk"), &params)
            .expect("case 16")
            .remove(0)
            .block;
    let c = core.block(&case16);
    match kakehi_submit(&node, &case16) {
        SubmitOutcome::Rejected { reason, detail } => {
            let failure = c.failure.expect("Core rejects case 16");
            same_rejection(&failure, &reason, &detail, false).expect("case 16");
        }
        other => panic!("case 16: {other:?}"),
    }

    let tip = node.chain.lock().index().tip().clone();
    let wallet = Wallet::new();
    let mut ext = Extension {
        coins: Vec::new(),
        wallet,
        tip: (tip.hash, tip.header.time),
        height: tip.height,
    };
    // The funding coinbase, then 99 blocks to mature it.
    let share = subsidy(ext.height + 1) / Kind::ALL.len() as u64;
    assert!(
        share > FEE_SATS * (u64::from(rounds) + 1),
        "{share} sats per coin do not pay {rounds} rounds of {FEE_SATS} sats"
    );
    let outputs: Vec<TxOut> = Kind::ALL
        .iter()
        .map(|k| TxOut {
            value: Amount::from_sat(share),
            script_pubkey: ext.wallet.script_pubkey(*k),
        })
        .collect();
    let funding = mine(
        ext.tip,
        coinbase(ext.height + 1, 0, outputs.clone()),
        vec![],
    );
    let funding_txid = funding.txdata[0].compute_txid();
    ext.coins = Kind::ALL
        .iter()
        .zip(outputs)
        .enumerate()
        .map(|(i, (k, o))| {
            (
                *k,
                OutPoint {
                    txid: funding_txid,
                    vout: i as u32,
                },
                o,
            )
        })
        .collect();
    let mut pending = vec![funding];
    for _ in 0..99 {
        let prev = pending.last().expect("a block");
        let height = ext.height + 1 + pending.len() as u32;
        let empty = mine(
            (prev.block_hash(), prev.header.time),
            reward(&ext.wallet, height, 0),
            vec![],
        );
        pending.push(empty);
    }
    for b in &pending {
        assert!(core.block(b).accepted, "Core accepts the funding chain");
        assert!(
            matches!(kakehi_submit(&node, b), SubmitOutcome::Accepted { .. }),
            "kakehi accepts the funding chain"
        );
        ext.tip = (b.block_hash(), b.header.time);
        ext.height += 1;
    }

    // A fixed seed: the mutations are the same on every run.
    let mut rng = Rng::new(0x6b61_6b65_6869);
    let mut mismatches = Vec::new();
    let (mut rejected, mut accepted, mut translated) = (0, 0, 0);
    let mut errors = std::collections::BTreeMap::new();
    for round in 0..rounds {
        let (tx, spent) = ext.spend_all();
        let valid = mine(ext.tip, ext.next_coinbase(0), vec![tx.clone()]);
        let (bad_tx, input, what) = mutate(&tx, &mut rng);
        let bad = mine(ext.tip, ext.next_coinbase(round + 1), vec![bad_tx.clone()]);
        let has_if = {
            let i = &bad_tx.input[input];
            i.script_sig
                .as_bytes()
                .iter()
                .chain(i.witness.iter().flatten())
                .any(|b| *b == 0x63 || *b == 0x64)
        };

        // The script verification APIs on the mutated input.
        let flags = block_script_flags(&params, ext.height + 1, &bad.block_hash());
        let core_script = core.verify(&bad_tx, &spent, input, flags.bits());
        let spent_refs: Vec<SpentTxOut<'_>> = spent
            .iter()
            .map(|o| SpentTxOut {
                value: o.value,
                script_pubkey: o.script_pubkey.as_bytes(),
            })
            .collect();
        let ours = PreparedTx::new(&serialize(&bad_tx), &spent_refs)
            .expect("prepare")
            .verify(input, flags);
        if core_script != ours.is_ok() {
            mismatches.push(format!(
                "round {round}, {what}: script API Core {core_script}, kakehi {ours:?}"
            ));
        }

        // The block verdicts.
        let c = core.block(&bad);
        let k = kakehi_submit(&node, &bad);
        match (&k, c.accepted) {
            (SubmitOutcome::Accepted { tip, .. }, true) if *tip == bad.block_hash() => {
                accepted += 1;
                ext.advance(&bad);
                continue;
            }
            (SubmitOutcome::Rejected { reason, detail }, false) => {
                rejected += 1;
                *errors.entry(reason.clone()).or_insert(0) += 1;
                match c
                    .failure
                    .as_deref()
                    .map(|f| same_rejection(f, reason, detail, has_if))
                {
                    Some(Ok(t)) => translated += usize::from(t),
                    Some(Err(e)) => mismatches.push(format!("round {round}, {what}: {e}")),
                    None => {
                        mismatches.push(format!("round {round}, {what}: Core logged no reason"))
                    }
                }
            }
            _ => {
                mismatches.push(format!(
                    "round {round}, {what}: kakehi {k:?}, Core accepted={}",
                    c.accepted
                ));
                break;
            }
        }
        assert!(
            core.block(&valid).accepted,
            "round {round}: Core accepts the valid block"
        );
        assert!(
            matches!(kakehi_submit(&node, &valid), SubmitOutcome::Accepted { .. }),
            "round {round}: kakehi accepts the valid block"
        );
        ext.advance(&valid);
    }
    eprintln!(
        "{rounds} mutations: {rejected} rejected, {accepted} accepted by both, \
         {translated} errors translated between Core versions, {} mismatches; errors: {errors:#?}",
        mismatches.len()
    );
    assert!(mismatches.is_empty(), "{mismatches:#?}");
    assert!(
        rejected > rounds as usize / 2,
        "most single-byte mutations break a script"
    );
}
