//! The calls: each takes its parameters as Core names them (positional or
//! named) and answers Core's result shape (Bitcoin Core 30.0
//! `src/rpc/blockchain.cpp`, `rawtransaction.cpp`, `mempool.cpp`,
//! `net.cpp`, `server.cpp`).

use bitcoin::consensus::encode::{deserialize, serialize_hex};
use bitcoin::hex::FromHex;
use bitcoin::{BlockHash, Transaction, Txid};
use serde_json::{json, Value};

use super::{
    RpcError, RpcState, RPC_CLIENT_P2P_DISABLED, RPC_DESERIALIZATION_ERROR,
    RPC_INVALID_ADDRESS_OR_KEY, RPC_INVALID_PARAMETER, RPC_METHOD_NOT_FOUND, RPC_MISC_ERROR,
    RPC_TYPE_ERROR,
};
use crate::chain::index::{BlockStatus, IndexEntry};
use crate::http::core_rest::{block_json, block_raw, chaininfo_json, header_json};
use crate::http::core_tx::tx_json;
use crate::mempool::{AcceptError, TxRejectClass};
use crate::snapshot::ChainSnapshot;

type RpcResult = Result<Value, RpcError>;

/// Every call with its parameter names in Core's order and its help
/// category, as `help` lists them.
pub const METHODS: &[(&str, &[&str], &str)] = &[
    ("getbestblockhash", &[], "Blockchain"),
    ("getblock", &["blockhash", "verbosity"], "Blockchain"),
    ("getblockchaininfo", &[], "Blockchain"),
    ("getblockcount", &[], "Blockchain"),
    ("getblockhash", &["height"], "Blockchain"),
    ("getblockheader", &["blockhash", "verbose"], "Blockchain"),
    ("getchaintips", &[], "Blockchain"),
    ("getdifficulty", &[], "Blockchain"),
    ("getmempoolentry", &["txid"], "Blockchain"),
    ("getmempoolinfo", &[], "Blockchain"),
    (
        "getrawmempool",
        &["verbose", "mempool_sequence"],
        "Blockchain",
    ),
    ("help", &["command"], "Control"),
    ("uptime", &[], "Control"),
    ("getconnectioncount", &[], "Network"),
    (
        "getrawtransaction",
        &["txid", "verbosity", "blockhash"],
        "Rawtransactions",
    ),
    (
        "sendrawtransaction",
        &["hexstring", "maxfeerate", "maxburnamount"],
        "Rawtransactions",
    ),
];

/// Runs `method` with `params` (an array or an object of named
/// parameters).
pub(super) fn call(s: &RpcState, method: &str, params: &Value) -> RpcResult {
    let Some((_, names, _)) = METHODS.iter().find(|(m, _, _)| *m == method) else {
        return Err(RpcError::new(RPC_METHOD_NOT_FOUND, "Method not found"));
    };
    let args = positional(method, names, params)?;
    let p = Params { args: &args };
    match method {
        "getbestblockhash" => with_chain(s, |cs| Ok(cs.index().tip().hash.to_string().into())),
        "getblockcount" => with_chain(s, |cs| Ok(cs.index().tip().height.into())),
        "getdifficulty" => with_chain(s, |cs| {
            Ok(cs.index().tip().header.difficulty_float().into())
        }),
        "getblockchaininfo" => with_chain(s, |cs| Ok(chaininfo_json(cs))),
        "getblockhash" => {
            let h = p.int(0, "height")?;
            with_chain(s, |cs| {
                u32::try_from(h)
                    .ok()
                    .filter(|h| *h <= cs.index().tip_height())
                    .and_then(|h| cs.index().active_at(h))
                    .map(|e| e.hash.to_string().into())
                    .ok_or_else(|| {
                        RpcError::new(RPC_INVALID_PARAMETER, "Block height out of range")
                    })
            })
        }
        "getblockheader" => {
            let hash = p.hash(0, "blockhash")?;
            let verbose = p.opt_bool(1, "verbose")?.unwrap_or(true);
            with_chain(s, |cs| {
                let e = block_entry(cs, &hash)?;
                Ok(if verbose {
                    header_json(cs, e)
                } else {
                    serialize_hex(&e.header).into()
                })
            })
        }
        "getblock" => {
            let hash = p.hash(0, "blockhash")?;
            let verbosity = p.verbosity(1, "verbosity", 1)?;
            with_chain(s, |cs| getblock(cs, &hash, verbosity))
        }
        "getchaintips" => with_chain(s, |cs| Ok(chaintips(cs))),
        "getrawtransaction" => {
            let txid: Txid = p.hash(0, "txid")?;
            let verbosity = p.verbosity(1, "verbosity", 0)?;
            let blockhash = match p.get(2) {
                None => None,
                Some(_) => Some(p.hash::<BlockHash>(2, "blockhash")?),
            };
            getrawtransaction(s, txid, verbosity, blockhash)
        }
        "getmempoolinfo" => Ok(match &s.app.mempool {
            Some(m) => crate::http::mempool::info_json(m),
            None => json!({"loaded": false}),
        }),
        "getrawmempool" => {
            let verbose = p.opt_bool(0, "verbose")?.unwrap_or(false);
            let sequence = p.opt_bool(1, "mempool_sequence")?.unwrap_or(false);
            if verbose && sequence {
                return Err(RpcError::new(
                    RPC_INVALID_PARAMETER,
                    "Verbose results cannot contain mempool sequence values.",
                ));
            }
            let snap = s.app.mempool.as_ref().map(|m| m.snapshot());
            let entries = snap.iter().flat_map(|sn| sn.pool.iter_by_entry());
            if verbose {
                let mut out = serde_json::Map::new();
                if let Some(sn) = &snap {
                    for e in sn.pool.iter_by_entry() {
                        out.insert(e.txid.to_string(), crate::http::mempool::entry_json(sn, e));
                    }
                }
                return Ok(Value::Object(out));
            }
            let txids: Vec<Value> = entries.map(|e| e.txid.to_string().into()).collect();
            if sequence {
                // Core's mempool_sequence counts every addition and removal;
                // kakehi does not keep that counter: 0 stands for it.
                return Ok(json!({"txids": txids, "mempool_sequence": 0}));
            }
            Ok(Value::Array(txids))
        }
        "getmempoolentry" => {
            let txid: Txid = p.hash(0, "txid")?;
            let snap = s.app.mempool.as_ref().map(|m| m.snapshot());
            snap.as_ref()
                .and_then(|sn| {
                    sn.pool
                        .get(&txid)
                        .map(|e| crate::http::mempool::entry_json(sn, e))
                })
                .ok_or_else(|| {
                    RpcError::new(RPC_INVALID_ADDRESS_OR_KEY, "Transaction not in mempool")
                })
        }
        "uptime" => Ok(s.started.elapsed().as_secs().into()),
        "getconnectioncount" => match &s.app.p2p {
            Some(p2p) => Ok(p2p.peer_count().into()),
            None => Err(RpcError::new(
                RPC_CLIENT_P2P_DISABLED,
                "Error: Peer-to-peer functionality missing or disabled",
            )),
        },
        "help" => help(p.opt_str(0, "command")?),
        "sendrawtransaction" => sendrawtransaction(s, &p),
        _ => Err(RpcError::new(RPC_METHOD_NOT_FOUND, "Method not found")),
    }
}

/// `params` as a positional list: an array as it is (at most
/// `names.len()` long), an object by `names` (Core's `transformNamedArguments`).
fn positional(method: &str, names: &[&str], params: &Value) -> Result<Vec<Value>, RpcError> {
    match params {
        Value::Array(a) => {
            if a.len() > names.len() {
                return Err(RpcError::new(
                    RPC_MISC_ERROR,
                    format!(
                        "{method} takes at most {} arguments, {} given",
                        names.len(),
                        a.len()
                    ),
                ));
            }
            Ok(a.clone())
        }
        Value::Object(o) => {
            for k in o.keys() {
                if !names.contains(&k.as_str()) {
                    return Err(RpcError::new(
                        RPC_INVALID_PARAMETER,
                        format!("Unknown named parameter {k}"),
                    ));
                }
            }
            let mut out: Vec<Value> = names
                .iter()
                .map(|n| o.get(*n).cloned().unwrap_or(Value::Null))
                .collect();
            while out.last() == Some(&Value::Null) {
                out.pop();
            }
            Ok(out)
        }
        _ => Ok(Vec::new()),
    }
}

/// The positional arguments of one call; a missing or `null` argument is
/// absent (Core's default).
struct Params<'a> {
    args: &'a [Value],
}

/// Core's `RPCHelpMan` type check error for argument `name` holding `v`
/// where `expected` was wanted.
fn type_error(v: &Value, name: &str, expected: &str) -> RpcError {
    let got = match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    RpcError::new(
        RPC_TYPE_ERROR,
        format!("JSON value of type {got} for field {name} is not of expected type {expected}"),
    )
}

impl Params<'_> {
    fn get(&self, i: usize) -> Option<&Value> {
        self.args.get(i).filter(|v| !v.is_null())
    }

    fn required(&self, i: usize, name: &str) -> Result<&Value, RpcError> {
        // Core answers a missing argument with the call's help
        // (`RPC_MISC_ERROR`).
        self.get(i).ok_or_else(|| {
            RpcError::new(RPC_MISC_ERROR, format!("Missing required argument {name}"))
        })
    }

    fn int(&self, i: usize, name: &str) -> Result<i64, RpcError> {
        let v = self.required(i, name)?;
        v.as_i64().ok_or_else(|| type_error(v, name, "number"))
    }

    fn opt_bool(&self, i: usize, name: &str) -> Result<Option<bool>, RpcError> {
        match self.get(i) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(type_error(v, name, "bool")),
        }
    }

    fn opt_str(&self, i: usize, name: &str) -> Result<Option<&str>, RpcError> {
        match self.get(i) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(type_error(v, name, "string")),
        }
    }

    /// A verbosity: a number, or a bool (`false` 0, `true` 1), as Core's
    /// `ParseVerbosity`.
    fn verbosity(&self, i: usize, name: &str, default: i64) -> Result<i64, RpcError> {
        match self.get(i) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(i64::from(*b)),
            Some(v) => v.as_i64().ok_or_else(|| type_error(v, name, "number")),
        }
    }

    /// A 64-hex hash argument (Core's `ParseHashV`).
    fn hash<H: std::str::FromStr>(&self, i: usize, name: &str) -> Result<H, RpcError> {
        let v = self.required(i, name)?;
        let s = v.as_str().ok_or_else(|| type_error(v, name, "string"))?;
        if s.len() != 64 {
            return Err(RpcError::new(
                RPC_INVALID_PARAMETER,
                format!("{name} must be of length 64 (not {}, for '{s}')", s.len()),
            ));
        }
        s.parse().map_err(|_| {
            RpcError::new(
                RPC_INVALID_PARAMETER,
                format!("{name} must be hexadecimal string (not '{s}')"),
            )
        })
    }
}

/// Runs `f` on the latest chain snapshot.
fn with_chain(s: &RpcState, f: impl FnOnce(&ChainSnapshot) -> RpcResult) -> RpcResult {
    let cs = s.app.snapshots.load();
    f(&cs)
}

/// A stored-data failure as an RPC error (the log has the whole error).
fn internal(e: impl std::fmt::Display) -> RpcError {
    tracing::error!("RPC internal error: {e}");
    RpcError::new(RPC_MISC_ERROR, "internal error (see the node's log)")
}

fn block_entry<'a>(cs: &'a ChainSnapshot, hash: &BlockHash) -> Result<&'a IndexEntry, RpcError> {
    cs.index()
        .by_hash(hash)
        .ok_or_else(|| RpcError::new(RPC_INVALID_ADDRESS_OR_KEY, "Block not found"))
}

/// `getblock` at `verbosity` 0 (hex), 1 (txids) or 2 and 3 (transaction
/// objects with `fee`).
fn getblock(cs: &ChainSnapshot, hash: &BlockHash, verbosity: i64) -> RpcResult {
    let e = block_entry(cs, hash)?;
    let raw = block_raw(cs, e).map_err(internal)?.ok_or_else(|| {
        RpcError::new(RPC_MISC_ERROR, "Block not available (not fully downloaded)")
    })?;
    match verbosity {
        v if v <= 0 => Ok(crate::http::hex(&raw).into()),
        1 => block_json(cs, e, &raw, false).map_err(internal),
        _ => block_json(cs, e, &raw, true).map_err(internal),
    }
}

/// `getchaintips`: every block with no child, and the active tip, with the
/// length of its branch off the active chain and Core's status names.
fn chaintips(cs: &ChainSnapshot) -> Value {
    let index = cs.index();
    let mut has_child = std::collections::HashSet::new();
    for e in index.entries() {
        if let Some(p) = e.prev {
            has_child.insert(p);
        }
    }
    let tip = index.tip();
    let mut tips: Vec<&IndexEntry> = index
        .entries()
        .filter(|e| !has_child.contains(&e.id) || e.id == tip.id)
        .collect();
    tips.sort_by(|a, b| b.height.cmp(&a.height).then(a.hash.cmp(&b.hash)));
    tips.dedup_by_key(|e| e.id);
    let out: Vec<Value> = tips
        .iter()
        .map(|e| {
            // The fork point: the highest ancestor on the active chain.
            let mut fork = *e;
            while !index.is_active(fork.id) {
                match fork.prev.and_then(|p| index.get(p)) {
                    Some(p) => fork = p,
                    None => break,
                }
            }
            let status = if e.id == tip.id {
                "active"
            } else if e.status.is_invalid() {
                "invalid"
            } else {
                match e.status {
                    BlockStatus::HeadersOnly => "headers-only",
                    BlockStatus::HaveData => "valid-headers",
                    _ => "valid-fork",
                }
            };
            json!({
                "height": e.height,
                "hash": e.hash.to_string(),
                "branchlen": e.height - fork.height,
                "status": status,
            })
        })
        .collect();
    Value::Array(out)
}

/// `getrawtransaction`: from `blockhash` when given, else from the
/// mempool, else from the active chain through the txid index.
fn getrawtransaction(
    s: &RpcState,
    txid: Txid,
    verbosity: i64,
    blockhash: Option<BlockHash>,
) -> RpcResult {
    let cs = s.app.snapshots.load();
    let network = cs.params().network;
    let render = |tx: &Transaction, place: Option<(&IndexEntry, Option<u64>)>, in_block: bool| {
        if verbosity <= 0 {
            return Value::from(serialize_hex(tx));
        }
        let fee_input = if verbosity >= 2 {
            place.and_then(|p| p.1)
        } else {
            None
        };
        let mut v = tx_json(tx, network, fee_input);
        if in_block {
            if let Some((e, _)) = place {
                v["in_active_chain"] = cs.index().is_active(e.id).into();
            }
        }
        if let Some((e, _)) = place {
            v["blockhash"] = e.hash.to_string().into();
            if cs.index().is_active(e.id) {
                v["confirmations"] = (cs.index().tip_height() - e.height + 1).into();
                v["time"] = e.header.time.into();
                v["blocktime"] = e.header.time.into();
            } else {
                v["confirmations"] = 0.into();
            }
        }
        v
    };
    let not_found = || {
        RpcError::new(
            RPC_INVALID_ADDRESS_OR_KEY,
            "No such mempool or blockchain transaction. Use gettransaction for wallet transactions.",
        )
    };
    if let Some(bh) = blockhash {
        let e = cs
            .index()
            .by_hash(&bh)
            .ok_or_else(|| RpcError::new(RPC_INVALID_ADDRESS_OR_KEY, "Block hash not found"))?;
        let (tx, total) = tx_in_block(&cs, e, &txid, verbosity >= 2)?.ok_or_else(|| {
            RpcError::new(
                RPC_INVALID_ADDRESS_OR_KEY,
                "No such transaction found in the provided block. Use gettransaction for wallet transactions.",
            )
        })?;
        return Ok(render(&tx, Some((e, total)), true));
    }
    if let Some(m) = &s.app.mempool {
        if let Some(e) = m.snapshot().pool.get(&txid) {
            let mut v = render(&e.tx, None, false);
            if verbosity >= 2 {
                // Core renders a mempool transaction's fee from its coins.
                v["fee"] = crate::http::core_tx::btc(e.fee as i64);
            }
            return Ok(v);
        }
    }
    let blocks = cs.tx_blocks(&txid).map_err(internal)?;
    for (id, _) in blocks {
        if !cs.index().is_active(id) {
            continue;
        }
        let Some(e) = cs.index().get(id) else {
            continue;
        };
        if let Some((tx, total)) = tx_in_block(&cs, e, &txid, verbosity >= 2)? {
            return Ok(render(&tx, Some((e, total)), false));
        }
    }
    Err(not_found())
}

/// `txid` in block `e`, with the sum of its inputs' values (sats) when
/// `with_inputs` and the block's spent outputs are stored.
fn tx_in_block(
    cs: &ChainSnapshot,
    e: &IndexEntry,
    txid: &Txid,
    with_inputs: bool,
) -> Result<Option<(Transaction, Option<u64>)>, RpcError> {
    let Some(raw) = block_raw(cs, e).map_err(internal)? else {
        return Ok(None);
    };
    let block: bitcoin::Block = deserialize(&raw).map_err(internal)?;
    let Some(tx) = block.txdata.into_iter().find(|t| t.compute_txid() == *txid) else {
        return Ok(None);
    };
    let total = if with_inputs && !tx.is_coinbase() {
        cs.spent_outputs(e.id).map_err(internal)?.map(|spent| {
            spent
                .iter()
                .filter(|so| so.txid == *txid)
                .map(|so| so.coin.value.to_sat())
                .sum()
        })
    } else if with_inputs {
        Some(0)
    } else {
        None
    };
    Ok(Some((tx, total)))
}

/// `help`: the calls by category (Core's layout), or one call's
/// parameters.
fn help(command: Option<&str>) -> RpcResult {
    if let Some(c) = command {
        return match METHODS.iter().find(|(m, _, _)| *m == c) {
            Some((m, names, _)) => {
                let args: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
                Ok(format!("{m} {}", args.join(" "))
                    .trim_end()
                    .to_string()
                    .into())
            }
            None => Ok(format!("help: unknown command: {c}").into()),
        };
    }
    let mut out = String::new();
    let mut category = "";
    for (m, names, cat) in METHODS {
        if *cat != category {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&format!("== {cat} ==\n"));
            category = cat;
        }
        let args: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
        out.push_str(format!("{m} {}", args.join(" ")).trim_end());
        out.push('\n');
    }
    Ok(out.trim_end().to_string().into())
}

/// `sendrawtransaction hexstring ( maxfeerate )`: mempool acceptance with
/// the fee cap (BTC/kvB, default Core's 0.10; 0 for none), then relay;
/// the txid, also when the transaction is already in the mempool.
fn sendrawtransaction(s: &RpcState, p: &Params<'_>) -> RpcResult {
    let v = p.required(0, "hexstring")?;
    let hex = v
        .as_str()
        .ok_or_else(|| type_error(v, "hexstring", "string"))?;
    let decode_err = || {
        RpcError::new(
            RPC_DESERIALIZATION_ERROR,
            "TX decode failed. Make sure the tx has at least one input.",
        )
    };
    let bytes = Vec::<u8>::from_hex(hex).map_err(|_| decode_err())?;
    let tx: Transaction = deserialize(&bytes).map_err(|_| decode_err())?;
    let m = s
        .app
        .mempool
        .as_ref()
        .ok_or_else(|| RpcError::new(RPC_MISC_ERROR, "this node runs without a mempool"))?;
    let max = match p.get(1) {
        None => Some(m.config().max_feerate),
        Some(v) => {
            let btc_per_kvb = v
                .as_f64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                .ok_or_else(|| type_error(v, "maxfeerate", "number"))?;
            if !(0.0..=1.0).contains(&btc_per_kvb) {
                return Err(RpcError::new(
                    RPC_INVALID_PARAMETER,
                    "Fee rates larger than or equal to 1BTC/kvB are not accepted",
                ));
            }
            let sats = (btc_per_kvb * 1e8).round() as u64;
            (sats > 0).then_some(sats)
        }
    };
    let txid = tx.compute_txid();
    match m.submit(tx, max) {
        Ok(_) => Ok(txid.to_string().into()),
        Err(AcceptError::Rejected(r))
            if r.class == TxRejectClass::Duplicate && r.reason != "txn-already-known" =>
        {
            if let (Some(p2p), Some(e)) = (&s.app.p2p, m.snapshot().pool.get(&txid)) {
                let _ = p2p.relay_transaction((*e.tx).clone());
            }
            Ok(txid.to_string().into())
        }
        Err(AcceptError::Rejected(r)) => {
            let (code, message) = r.rpc_error();
            Err(RpcError::new(code, message))
        }
        Err(e @ AcceptError::Storage(_)) => Err(internal(e)),
    }
}
