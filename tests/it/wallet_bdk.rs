//! A real wallet syncing from kakehi: BDK's descriptor wallet (`bdk_wallet`)
//! with its blocking Esplora sync (`bdk_esplora`), unchanged, against a node
//! imported from `testnet-data/regtest-a` (made by bcoin 2.2.0) and served
//! over HTTP on loopback.
//!
//! The wallet is watch-only: external keychain `wpkh(tpub…/0/*)` (BIP84
//! account), internal keychain `tr(tpub…/1/*)` (BIP86 account), from a
//! fixed seed. The test builds blocks on top of regtest-a with the
//! `bitcoin` crate (`common::blockgen`): a funder (`blockgen::Wallet`) pays
//! the wallet's addresses, and the wallet's own transactions are signed here
//! with the private keys of those accounts (rust-bitcoin's sighash code and
//! libsecp256k1). kakehi validates every script of them.
//!
//! After `full_scan`, after a `sync` on more blocks, and after a `sync` on a
//! reorg that removes a payment, the wallet's balance, transaction list
//! (with each confirmation's height, block hash and time) and UTXOs equal
//! the truth computed here from the blocks the test made, never from
//! kakehi. No output of regtest-a pays these keys (they come from a seed
//! made up here), so the test's own blocks are the whole truth.
//!
//! With the mempool: Alice pays
//! Bob through `POST /tx`; Bob's `sync` shows it unconfirmed with the right
//! `untrusted_pending`; Alice bumps the fee with BDK's `build_fee_bump` and
//! both wallets then see only the replacement; a block confirms it; a
//! longer branch without it returns it to the node's mempool, and the
//! wallets see it unconfirmed again.

use crate::common;

use std::collections::{BTreeMap, HashMap};

use bdk_esplora::esplora_client;
use bdk_esplora::EsploraExt;
use bdk_wallet::chain::ChainPosition;
use bdk_wallet::{KeychainKind, Wallet as BdkWallet};
use bitcoin::bip32::{ChildNumber, DerivationPath, Xpriv, Xpub};
use bitcoin::hashes::Hash;
use bitcoin::key::TapTweak;
use bitcoin::secp256k1::{All, Keypair, Message, Secp256k1, SecretKey};
use bitcoin::sighash::{EcdsaSighashType, Prevouts, SighashCache, TapSighashType};
use bitcoin::{
    absolute, transaction, Amount, Block, BlockHash, Network, OutPoint, ScriptBuf, Sequence,
    Transaction, TxIn, TxOut, Txid, Witness,
};
use common::blockgen::{coinbase, mine, subsidy, Kind, Wallet as Funder};
use common::{data, TestNode};
use kakehi::http::AppState;
use kakehi::pipeline::SubmitOutcome;

/// The wallet's keys: the BIP84 and BIP86 accounts of a fixed seed.
struct Keys {
    secp: Secp256k1<All>,
    wpkh: Xpriv,
    tr: Xpriv,
}

impl Keys {
    fn new() -> Self {
        Self::from_seed(0x5a)
    }

    /// The accounts of the seed `[byte; 32]`.
    fn from_seed(byte: u8) -> Self {
        let secp = Secp256k1::new();
        let master = Xpriv::new_master(bitcoin::NetworkKind::Test, &[byte; 32]).unwrap();
        let account = |p: &str| {
            let path: DerivationPath = p.parse().unwrap();
            master.derive_priv(&secp, &path).unwrap()
        };
        let (wpkh, tr) = (account("m/84'/1'/0'"), account("m/86'/1'/0'"));
        Keys { secp, wpkh, tr }
    }

    /// The watch-only descriptors BDK is given (external, internal).
    fn descriptors(&self) -> (String, String) {
        let xpub = |x: &Xpriv| Xpub::from_priv(&self.secp, x);
        (
            format!("wpkh({}/0/*)", xpub(&self.wpkh)),
            format!("tr({}/1/*)", xpub(&self.tr)),
        )
    }

    fn secret(&self, kc: KeychainKind, i: u32) -> SecretKey {
        let (account, branch) = match kc {
            KeychainKind::External => (&self.wpkh, 0),
            KeychainKind::Internal => (&self.tr, 1),
        };
        let path = [
            ChildNumber::Normal { index: branch },
            ChildNumber::Normal { index: i },
        ];
        account.derive_priv(&self.secp, &path).unwrap().private_key
    }

    /// The scriptPubKey at `i` of keychain `kc`, derived here.
    fn script(&self, kc: KeychainKind, i: u32) -> ScriptBuf {
        let pk = self.secret(kc, i).public_key(&self.secp);
        match kc {
            KeychainKind::External => {
                ScriptBuf::new_p2wpkh(&bitcoin::CompressedPublicKey(pk).wpubkey_hash())
            }
            KeychainKind::Internal => {
                ScriptBuf::new_p2tr(&self.secp, pk.x_only_public_key().0, None)
            }
        }
    }

    /// Signs every input of `tx`, spending `prevouts` (same order): P2WPKH
    /// with SIGHASH_ALL, P2TR key path (BIP86 tweak) with SIGHASH_DEFAULT.
    fn sign(&self, tx: &mut Transaction, prevouts: &[(KeychainKind, u32, TxOut)]) {
        let outs: Vec<TxOut> = prevouts.iter().map(|p| p.2.clone()).collect();
        let unsigned = tx.clone();
        let mut cache = SighashCache::new(&unsigned);
        for (n, (kc, i, out)) in prevouts.iter().enumerate() {
            let sk = self.secret(*kc, *i);
            tx.input[n].witness = match kc {
                KeychainKind::External => {
                    let all = EcdsaSighashType::All;
                    let h = cache
                        .p2wpkh_signature_hash(n, &out.script_pubkey, out.value, all)
                        .unwrap();
                    let msg = Message::from_digest(h.to_byte_array());
                    let signature = bitcoin::ecdsa::Signature {
                        signature: self.secp.sign_ecdsa(&msg, &sk),
                        sighash_type: all,
                    };
                    Witness::p2wpkh(&signature, &sk.public_key(&self.secp))
                }
                KeychainKind::Internal => {
                    let h = cache
                        .taproot_key_spend_signature_hash(
                            n,
                            &Prevouts::All(&outs),
                            TapSighashType::Default,
                        )
                        .unwrap();
                    let keypair = Keypair::from_secret_key(&self.secp, &sk);
                    let tweaked = keypair.tap_tweak(&self.secp, None).to_keypair();
                    let msg = Message::from_digest(h.to_byte_array());
                    let sig = self.secp.sign_schnorr_no_aux_rand(&msg, &tweaked);
                    Witness::from_slice(&[sig.serialize()])
                }
            };
        }
    }
}

/// The chain the test builds above regtest-a's tip, and the node serving it.
struct World {
    node: TestNode,
    /// The node's mempool, served over HTTP and kept on the tip by
    /// [`World::add_block`].
    mempool: std::sync::Arc<kakehi::mempool::Mempool>,
    _http: common::HttpServer,
    url: String,
    funder: Funder,
    /// Regtest-a's tip (height, hash, time).
    base: (u32, BlockHash, u32),
    /// The test's blocks on the active chain, from height `base.0 + 1`.
    blocks: Vec<Block>,
    /// Funder coins not yet spent: (outpoint, value).
    funder_coins: Vec<(OutPoint, TxOut)>,
}

impl World {
    fn new() -> Self {
        let node = TestNode::new(Network::Regtest);
        let summary = node.import(&[data("regtest-a/blocks.dat")]);
        assert!(summary.rejected.is_empty(), "{:?}", summary.rejected);
        let tip = node.chain.lock().index().tip().clone();
        let snapshots = node.chain.lock().snapshots();
        let mempool = std::sync::Arc::new(kakehi::mempool::Mempool::new(
            snapshots.clone(),
            kakehi::mempool::MempoolConfig::default(),
        ));
        let state = AppState {
            snapshots,
            p2p: None,
            mempool: Some(mempool.clone()),
        };
        let http = common::spawn_http(state, kakehi::http::HttpConfig::default());
        World {
            mempool,
            url: format!("http://{}", http.addr),
            _http: http,
            node,
            funder: Funder::new(),
            base: (tip.height, tip.hash, tip.header.time),
            blocks: Vec::new(),
            funder_coins: Vec::new(),
        }
    }

    /// The node's mempool, txids in entry order.
    fn mempool_txids(&self) -> Vec<Txid> {
        let snapshot = self.mempool.snapshot();
        snapshot.pool.iter_by_entry().map(|e| e.txid).collect()
    }

    fn height(&self) -> u32 {
        self.base.0 + self.blocks.len() as u32
    }

    /// Mines `txs` on the active tip (the coinbase pays the funder, tagged
    /// `tag`), submits the block to kakehi and expects it connected.
    fn add_block(&mut self, txs: Vec<Transaction>, tag: u32) -> Block {
        let prev = self.blocks.last().map_or((self.base.1, self.base.2), |b| {
            (b.block_hash(), b.header.time)
        });
        let height = self.height() + 1;
        let pay = TxOut {
            value: Amount::from_sat(subsidy(height)),
            script_pubkey: self.funder.script_pubkey(Kind::P2wpkh),
        };
        let block = mine(prev, coinbase(height, tag, vec![pay]), txs);
        let outcome = self
            .node
            .chain
            .lock()
            .submit_block(&block)
            .expect("storage");
        assert!(
            matches!(outcome, SubmitOutcome::Accepted { .. }),
            "block {height}: {outcome:?}"
        );
        self.mempool.sync_with_chain();
        let cb = &block.txdata[0];
        let op = OutPoint {
            txid: cb.compute_txid(),
            vout: 0,
        };
        self.funder_coins.push((op, cb.output[0].clone()));
        self.blocks.push(block.clone());
        block
    }

    /// Drops the test's blocks above `height` from the model (the node
    /// switches when a longer branch arrives) and the funder coins they made.
    fn rewind_to(&mut self, height: u32) {
        let keep = (height - self.base.0) as usize;
        for b in self.blocks.drain(keep..) {
            let txid = b.txdata[0].compute_txid();
            self.funder_coins.retain(|(op, _)| op.txid != txid);
        }
    }

    /// A funder transaction paying `pays` (script, sats) from its oldest
    /// mature coin (100 confirmations), the rest back to the funder less
    /// 2,000 sats of fee.
    fn fund(&mut self, pays: &[(ScriptBuf, u64)]) -> Transaction {
        let next = self.height() + 1;
        let mature = |op: &OutPoint| {
            self.blocks
                .iter()
                .position(|b| b.txdata[0].compute_txid() == op.txid)
                .is_some_and(|i| next >= self.base.0 + 1 + i as u32 + 100)
        };
        let at = self.funder_coins.iter().position(|(op, _)| mature(op));
        let (op, coin) = self.funder_coins.remove(at.expect("a mature funder coin"));
        let paid: u64 = pays.iter().map(|p| p.1).sum();
        let mut output: Vec<TxOut> = pays
            .iter()
            .map(|(s, v)| TxOut {
                value: Amount::from_sat(*v),
                script_pubkey: s.clone(),
            })
            .collect();
        output.push(TxOut {
            value: coin.value - Amount::from_sat(paid + 2_000),
            script_pubkey: self.funder.script_pubkey(Kind::P2wpkh),
        });
        let mut tx = unsigned(vec![op], output);
        self.funder.sign(&mut tx, &[(Kind::P2wpkh, coin)]);
        tx
    }

    /// A funder transaction spending the funder coin `tx` spends (its first
    /// input) back to the funder: a conflict of `tx`.
    fn respend(&self, tx: &Transaction) -> Transaction {
        let op = tx.input[0].previous_output;
        let coin = self.output(&op);
        let mut out = unsigned(
            vec![op],
            vec![TxOut {
                value: coin.value - Amount::from_sat(3_000),
                script_pubkey: self.funder.script_pubkey(Kind::P2wpkh),
            }],
        );
        self.funder.sign(&mut out, &[(Kind::P2wpkh, coin)]);
        out
    }

    /// A wallet transaction spending `coins` (keychain, index, outpoint):
    /// `pay` sats to the funder and the rest, less 1,500 sats of fee, to
    /// `change`.
    fn spend(
        &self,
        keys: &Keys,
        coins: &[(KeychainKind, u32, Txid, u32)],
        pay: u64,
        change: &ScriptBuf,
    ) -> Transaction {
        let prevouts: Vec<(KeychainKind, u32, TxOut)> = coins
            .iter()
            .map(|&(kc, i, txid, vout)| (kc, i, self.output(&OutPoint { txid, vout })))
            .collect();
        let total: u64 = prevouts.iter().map(|p| p.2.value.to_sat()).sum();
        let output = vec![
            TxOut {
                value: Amount::from_sat(pay),
                script_pubkey: self.funder.script_pubkey(Kind::P2tr),
            },
            TxOut {
                value: Amount::from_sat(total - pay - 1_500),
                script_pubkey: change.clone(),
            },
        ];
        let mut tx = unsigned(
            coins
                .iter()
                .map(|&(_, _, txid, vout)| OutPoint { txid, vout })
                .collect(),
            output,
        );
        keys.sign(&mut tx, &prevouts);
        tx
    }

    /// The output at `op`, from the test's active blocks.
    fn output(&self, op: &OutPoint) -> TxOut {
        self.blocks
            .iter()
            .flat_map(|b| &b.txdata)
            .find(|t| t.compute_txid() == op.txid)
            .map(|t| t.output[op.vout as usize].clone())
            .expect("an output of the test's blocks")
    }

    fn client(&self) -> esplora_client::BlockingClient {
        esplora_client::Builder::new(&self.url).build_blocking()
    }
}

fn unsigned(inputs: Vec<OutPoint>, output: Vec<TxOut>) -> Transaction {
    Transaction {
        version: transaction::Version::TWO,
        lock_time: absolute::LockTime::ZERO,
        input: inputs
            .into_iter()
            .map(|previous_output| TxIn {
                previous_output,
                sequence: Sequence::MAX,
                ..TxIn::default()
            })
            .collect(),
        output,
    }
}

/// What the wallet must show, computed from the test's active blocks.
#[derive(Debug, PartialEq, Eq)]
struct Truth {
    /// Every transaction paying or spending the wallet: (height, block
    /// hash, block time).
    txs: BTreeMap<Txid, (u32, BlockHash, u64)>,
    /// The wallet's unspent outputs: value in sats.
    utxos: BTreeMap<OutPoint, u64>,
}

/// Walks the test's blocks (from `first_height`) with the wallet's scripts.
fn truth(blocks: &[Block], first_height: u32, mine: &HashMap<ScriptBuf, ()>) -> Truth {
    let mut t = Truth {
        txs: BTreeMap::new(),
        utxos: BTreeMap::new(),
    };
    for (k, b) in blocks.iter().enumerate() {
        let at = (
            first_height + k as u32,
            b.block_hash(),
            u64::from(b.header.time),
        );
        for tx in &b.txdata {
            let txid = tx.compute_txid();
            let mut touches = false;
            for i in &tx.input {
                touches |= t.utxos.remove(&i.previous_output).is_some();
            }
            for (vout, o) in tx.output.iter().enumerate() {
                if mine.contains_key(&o.script_pubkey) {
                    t.utxos.insert(
                        OutPoint {
                            txid,
                            vout: vout as u32,
                        },
                        o.value.to_sat(),
                    );
                    touches = true;
                }
            }
            if touches {
                t.txs.insert(txid, at);
            }
        }
    }
    t
}

/// The wallet's view in the same shape; nothing may be pending or immature.
fn seen(wallet: &BdkWallet) -> Truth {
    let balance = wallet.balance();
    assert_eq!(balance.total(), balance.confirmed, "{balance:?}");
    let txs = wallet
        .transactions()
        .map(|c| match c.chain_position {
            ChainPosition::Confirmed { anchor, .. } => (
                c.tx_node.txid,
                (
                    anchor.block_id.height,
                    anchor.block_id.hash,
                    anchor.confirmation_time,
                ),
            ),
            other => panic!("{} is {other:?}", c.tx_node.txid),
        })
        .collect();
    let utxos: BTreeMap<OutPoint, u64> = wallet
        .list_unspent()
        .map(|u| (u.outpoint, u.txout.value.to_sat()))
        .collect();
    assert_eq!(balance.confirmed.to_sat(), utxos.values().sum::<u64>());
    Truth { txs, utxos }
}

/// `/address` of `script` through esplora-client (the one BDK uses):
/// funded minus spent sums equal the truth's UTXOs of that script.
fn assert_balance_route(w: &World, script: &ScriptBuf, t: &Truth) {
    let stats = w.client().get_scripthash_stats(script).unwrap().chain_stats;
    let want: u64 = t
        .utxos
        .iter()
        .filter(|(op, _)| &w.output(op).script_pubkey == script)
        .map(|(_, v)| v)
        .sum();
    let have = stats.funded_txo_sum - stats.spent_txo_sum;
    assert_eq!(have, want, "{script}");
}

/// BDK's watch-only wallet of `keys`, and the wallet's first 40 scripts
/// of each keychain as derived here (BDK must derive the same).
fn wallet_of(keys: &Keys) -> (BdkWallet, HashMap<ScriptBuf, ()>) {
    let (ext_desc, int_desc) = keys.descriptors();
    let wallet = BdkWallet::create(ext_desc, int_desc)
        .network(Network::Regtest)
        .create_wallet_no_persist()
        .expect("wallet");
    let mine: HashMap<ScriptBuf, ()> = [KeychainKind::External, KeychainKind::Internal]
        .into_iter()
        .flat_map(|kc| (0..40).map(move |i| (kc, i)))
        .map(|(kc, i)| (keys.script(kc, i), ()))
        .collect();
    for kc in [KeychainKind::External, KeychainKind::Internal] {
        for i in 0..5 {
            assert_eq!(
                wallet.peek_address(kc, i).script_pubkey(),
                keys.script(kc, i)
            );
        }
    }
    (wallet, mine)
}

/// BDK's `sync` of the revealed scripts, applied.
fn sync(wallet: &mut BdkWallet, client: &esplora_client::BlockingClient) {
    let update = client
        .sync(wallet.start_sync_with_revealed_spks().build(), 2)
        .expect("sync");
    wallet.apply_update(update).expect("apply sync");
}

#[test]
fn bdk_wallet_full_scan_sync_and_reorg_equal_the_blocks() {
    let mut w = World::new();
    let keys = Keys::new();
    let (mut wallet, mine) = wallet_of(&keys);
    let (ext, int) = (KeychainKind::External, KeychainKind::Internal);
    let s = |kc, i| keys.script(kc, i);
    let first = w.base.0 + 1;

    // Three funder coinbases (1501..1503), matured by 100 more blocks.
    for tag in 0..103 {
        w.add_block(vec![], tag);
    }
    // Receives (external 0, 1, 3 — a gap at 2 — and internal 0), then the
    // wallet spends external 0 and internal 0 to the funder with change
    // to internal 1, and external 1 receives again.
    let f1 = w.fund(&[
        (s(ext, 0), 1_000_000),
        (s(ext, 1), 300_000),
        (s(int, 0), 500_000),
        (s(ext, 3), 200_000),
    ]);
    let f1_id = f1.compute_txid();
    w.add_block(vec![f1], 0);
    let w1 = w.spend(
        &keys,
        &[(ext, 0, f1_id, 0), (int, 0, f1_id, 2)],
        700_000,
        &s(int, 1),
    );
    let w1_id = w1.compute_txid();
    let f2 = w.fund(&[(s(ext, 1), 120_000)]);
    w.add_block(vec![w1, f2], 0);

    let client = w.client();
    let request = wallet.start_full_scan().build();
    let update = client.full_scan(request, 10, 2).expect("full_scan");
    wallet.apply_update(update).expect("apply full_scan");
    let t = truth(&w.blocks, first, &mine);
    assert_eq!(t.txs.len(), 3);
    assert_eq!(seen(&wallet), t, "after full_scan");
    assert_eq!(wallet.latest_checkpoint().height(), w.height());
    assert_balance_route(&w, &s(ext, 1), &t);

    // More blocks: the funder pays the next revealed addresses, the wallet
    // spends internal 1 and external 3 with change to the next internal.
    let next_ext = wallet.reveal_next_address(ext);
    assert_eq!(next_ext.index, 4);
    let next_int = wallet.reveal_next_address(int);
    assert_eq!(next_int.index, 2);
    let f3 = w.fund(&[(s(ext, 4), 400_000), (s(ext, 1), 50_000)]);
    let f3_id = f3.compute_txid();
    let fork = w.height();
    w.add_block(vec![f3.clone()], 0);
    let w2 = w.spend(
        &keys,
        &[(int, 1, w1_id, 1), (ext, 3, f1_id, 3)],
        250_000,
        &s(int, 2),
    );
    w.add_block(vec![w2.clone()], 0);
    w.add_block(vec![], 0);
    sync(&mut wallet, &client);
    let t = truth(&w.blocks, first, &mine);
    assert!(t.txs.contains_key(&f3_id));
    assert_eq!(seen(&wallet), t, "after sync");

    // A reorg from the fork point: a longer branch without the payment to
    // external 4 (f3), whose coin the funder spends elsewhere there (else
    // f3 would return to the mempool), the wallet's spend re-included.
    let conflict = w.respend(&f3);
    w.rewind_to(fork);
    w.add_block(vec![conflict], 7);
    w.add_block(vec![w2], 7);
    w.add_block(vec![], 7);
    w.add_block(vec![], 7);
    assert_eq!(
        w.node.chain.lock().index().tip().hash,
        w.blocks.last().unwrap().block_hash()
    );
    sync(&mut wallet, &client);
    let t = truth(&w.blocks, first, &mine);
    assert!(!t.txs.contains_key(&f3_id));
    assert_eq!(seen(&wallet), t, "after the reorg");
    assert_eq!(
        wallet.latest_checkpoint().hash(),
        w.blocks.last().unwrap().block_hash()
    );
    assert_balance_route(&w, &s(ext, 1), &t);
}

/// The wallet's transactions as (txid, confirmed height or `None` while
/// unconfirmed), in BDK's canonical view (replaced ones excluded).
fn positions(wallet: &BdkWallet) -> BTreeMap<Txid, Option<u32>> {
    wallet
        .transactions()
        .map(|c| {
            let height = match c.chain_position {
                ChainPosition::Confirmed { anchor, .. } => Some(anchor.block_id.height),
                ChainPosition::Unconfirmed { .. } => None,
            };
            (c.tx_node.txid, height)
        })
        .collect()
}

/// Signs a PSBT BDK built for the watch-only wallet of `keys`: each
/// input's keychain and index found by its spent script among the first
/// 40 of each keychain.
fn sign_psbt(keys: &Keys, psbt: bitcoin::Psbt) -> Transaction {
    let prevouts: Vec<(KeychainKind, u32, TxOut)> = psbt
        .inputs
        .iter()
        .map(|i| {
            let out = i.witness_utxo.clone().expect("BDK fills witness_utxo");
            let (kc, n) = [KeychainKind::External, KeychainKind::Internal]
                .into_iter()
                .flat_map(|kc| (0..40).map(move |n| (kc, n)))
                .find(|&(kc, n)| keys.script(kc, n) == out.script_pubkey)
                .expect("an input of the wallet");
            (kc, n, out)
        })
        .collect();
    let mut tx = psbt.unsigned_tx;
    keys.sign(&mut tx, &prevouts);
    tx
}

#[test]
fn bdk_wallets_see_a_payment_unconfirmed_then_only_its_replacement_then_confirmed_then_back_after_a_reorg(
) {
    let mut w = World::new();
    let (alice, bob) = (Keys::from_seed(0x5a), Keys::from_seed(0x6b));
    let (mut wa, _) = wallet_of(&alice);
    let (mut wb, _) = wallet_of(&bob);
    let (ext, int) = (KeychainKind::External, KeychainKind::Internal);
    // One funder coinbase matured, then 1,000,000 sats to Alice.
    for tag in 0..101 {
        w.add_block(vec![], tag);
    }
    let f = w.fund(&[(alice.script(ext, 0), 1_000_000)]);
    let f_id = f.compute_txid();
    w.add_block(vec![f], 0);
    let client = w.client();
    for wallet in [&mut wa, &mut wb] {
        let update = client
            .full_scan(wallet.start_full_scan().build(), 10, 2)
            .expect("full_scan");
        wallet.apply_update(update).expect("apply");
    }
    // Bob's receiving address and Alice's change address, handed out.
    assert_eq!(wb.reveal_next_address(ext).index, 0);
    assert_eq!(wa.reveal_next_address(int).index, 0);
    assert_eq!(wa.balance().confirmed.to_sat(), 1_000_000);

    // Alice pays Bob 300,000 sats (1,500 sats of fee), broadcast through
    // POST /tx: both wallets see it unconfirmed.
    let pay = unsigned(
        vec![OutPoint {
            txid: f_id,
            vout: 0,
        }],
        vec![
            TxOut {
                value: Amount::from_sat(300_000),
                script_pubkey: bob.script(ext, 0),
            },
            TxOut {
                value: Amount::from_sat(1_000_000 - 300_000 - 1_500),
                script_pubkey: alice.script(int, 0),
            },
        ],
    );
    let mut pay = pay;
    pay.input[0].sequence = Sequence::ENABLE_RBF_NO_LOCKTIME;
    alice.sign(
        &mut pay,
        &[(
            ext,
            0,
            w.output(&OutPoint {
                txid: f_id,
                vout: 0,
            }),
        )],
    );
    let pay_id = pay.compute_txid();
    client
        .broadcast(&pay)
        .expect("POST /tx accepts the payment");
    sync(&mut wb, &client);
    sync(&mut wa, &client);
    assert_eq!(positions(&wb), BTreeMap::from([(pay_id, None)]));
    let b = wb.balance();
    assert_eq!(
        (b.untrusted_pending.to_sat(), b.confirmed.to_sat()),
        (300_000, 0)
    );
    assert_eq!(
        positions(&wa),
        BTreeMap::from([(f_id, Some(w.height())), (pay_id, None)])
    );
    assert_eq!(wa.balance().trusted_pending.to_sat(), 698_500);
    // Its spent output is no longer Alice's to spend: /utxo excludes it.
    assert!(client.get_tx_status(&f_id).expect("status").confirmed);
    let outspend = client
        .get_output_status(&f_id, 0)
        .expect("outspend")
        .expect("known");
    assert!(
        outspend.spent
            && outspend.txid == Some(pay_id)
            && !outspend.status.expect("status").confirmed
    );

    // Alice bumps the fee with BDK's build_fee_bump: both wallets then see
    // only the replacement.
    let mut builder = wa.build_fee_bump(pay_id).expect("fee bump");
    builder.fee_rate(bitcoin::FeeRate::from_sat_per_vb(25).expect("rate"));
    let bump = sign_psbt(&alice, builder.finish().expect("psbt"));
    let bump_id = bump.compute_txid();
    client
        .broadcast(&bump)
        .expect("POST /tx accepts the replacement");
    assert_eq!(w.mempool_txids(), vec![bump_id]);
    sync(&mut wb, &client);
    sync(&mut wa, &client);
    assert_eq!(positions(&wb), BTreeMap::from([(bump_id, None)]));
    assert_eq!(wb.balance().untrusted_pending.to_sat(), 300_000);
    assert_eq!(
        positions(&wa),
        BTreeMap::from([(f_id, Some(w.height())), (bump_id, None)])
    );

    // A block confirms it.
    let fork = w.height();
    w.add_block(vec![bump.clone()], 0);
    sync(&mut wb, &client);
    assert_eq!(
        positions(&wb),
        BTreeMap::from([(bump_id, Some(w.height()))])
    );
    let b = wb.balance();
    assert_eq!(
        (b.untrusted_pending.to_sat(), b.confirmed.to_sat()),
        (0, 300_000)
    );
    assert!(w.mempool.snapshot().pool.is_empty());

    // A longer branch without it: the node's mempool takes it back and the
    // wallets see it unconfirmed again.
    w.rewind_to(fork);
    w.add_block(vec![], 9);
    w.add_block(vec![], 9);
    assert_eq!(w.mempool_txids(), vec![bump_id]);
    sync(&mut wb, &client);
    assert_eq!(positions(&wb), BTreeMap::from([(bump_id, None)]));
    let b = wb.balance();
    assert_eq!(
        (b.untrusted_pending.to_sat(), b.confirmed.to_sat()),
        (300_000, 0)
    );
}
