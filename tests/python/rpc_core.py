#!/usr/bin/env python3
"""kakehi's JSON-RPC driven by Bitcoin Core's own RPC client.

`AuthServiceProxy` (Bitcoin Core's `test_framework/authproxy.py`, packaged
by verystable) is the client of Core's functional tests: it speaks
JSON-RPC 2.0, checks the HTTP status and the Content-Type, and parses
numbers as Decimal. The checks follow Core's `rpc_blockchain.py` and
`rpc_users.py` where kakehi has the calls, with results checked against
`testnet-data/regtest-a/chain.json`.

Usage: rpc_core.py --port N --cookie PATH --data DIR --user USER:PASSWORD
Exit 0 and "ok" when every check holds; an assertion error otherwise.
"""

import argparse
import json
import os
import sys
from decimal import Decimal

from verystable.core.authproxy import AuthServiceProxy, JSONRPCException


def expect_error(fn, code, status=None):
    try:
        fn()
    except JSONRPCException as e:
        assert e.error["code"] == code, (e.error, code)
        if status is not None:
            assert e.http_status == status, (e.http_status, status)
        return e
    raise AssertionError(f"expected RPC error {code}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--cookie", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--user", required=True)
    args = ap.parse_args()

    with open(args.cookie) as f:
        cookie = f.read().strip()
    with open(os.path.join(args.data, "chain.json")) as f:
        chain = json.load(f)
    best = {b["height"]: b for b in chain["blocks"] if b["on_best_chain"]}

    node = AuthServiceProxy(f"http://{cookie}@127.0.0.1:{args.port}")
    checks = 0

    # rpc_blockchain.py: getblockchaininfo, getblockcount, getbestblockhash.
    info = node.getblockchaininfo()
    assert info["chain"] == "regtest", info
    assert info["blocks"] == chain["tip_height"], info
    assert info["bestblockhash"] == chain["tip_hash"], info
    assert isinstance(info["difficulty"], Decimal), info
    assert node.getblockcount() == chain["tip_height"]
    assert node.getbestblockhash() == chain["tip_hash"]
    checks += 3

    # getblockhash / getblockheader / getblock for every 100th height.
    for h in range(1, chain["tip_height"] + 1, 100):
        b = best[h]
        assert node.getblockhash(h) == b["hash"]
        assert node.getblockhash(height=h) == b["hash"]
        hdr = node.getblockheader(b["hash"])
        assert hdr["height"] == h and hdr["time"] == b["time"], hdr
        assert hdr["previousblockhash"] == b["prev_hash"], hdr
        assert hdr["confirmations"] == chain["tip_height"] - h + 1, hdr
        assert len(node.getblockheader(b["hash"], False)) == 160
        blk = node.getblock(b["hash"])
        assert blk["size"] == b["size"] and blk["weight"] == b["weight"], blk
        assert blk["nTx"] == b["tx_count"] == len(blk["tx"]), blk
        raw = node.getblock(blockhash=b["hash"], verbosity=0)
        assert len(raw) == 2 * b["size"]
        full = node.getblock(b["hash"], 2)
        assert [t["txid"] for t in full["tx"]] == blk["tx"]
        # getrawtransaction through the txid index, as Core with -txindex.
        tx = node.getrawtransaction(blk["tx"][-1], True)
        assert tx["blockhash"] == b["hash"], tx
        assert tx["hex"] == full["tx"][-1]["hex"]
        checks += 1

    # rpc_blockchain.py's _test_getchaintips: the active tip is listed.
    tips = node.getchaintips()
    active = [t for t in tips if t["status"] == "active"]
    assert active == [{"height": chain["tip_height"], "hash": chain["tip_hash"], "branchlen": 0, "status": "active"}], tips
    stale = {b["hash"] for b in chain["blocks"] if not b["on_best_chain"]}
    assert all(t["hash"] in stale for t in tips if t["status"] != "active"), tips
    checks += 1

    # Errors, as Core's functional tests expect them.
    expect_error(lambda: node.getblockhash(-1), -8)
    expect_error(lambda: node.getblockhash(chain["tip_height"] + 1), -8)
    expect_error(lambda: node.getblockheader("00" * 32), -5)
    expect_error(lambda: node.getblock("zz" * 32), -8)
    expect_error(lambda: node.getrawtransaction("00" * 32), -5)
    expect_error(lambda: node.getmempoolentry("00" * 32), -5)
    # 2.0 errors come with 200; a missing method too.
    expect_error(lambda: node.nosuchmethod(), -32601, 200)
    checks += 7

    # Mempool and control calls.
    assert node.getmempoolinfo()["size"] == 0
    assert node.getrawmempool() == []
    assert node.getrawmempool(True) == {}
    assert node.uptime() >= 0
    assert "getblockchaininfo" in node.help()
    checks += 5

    # Batches through the client's own batch().
    replies = node.batch([
        node.getblockcount.get_request(),
        node.getblockhash.get_request(1),
        node.nosuchmethod.get_request(),
    ])
    assert replies[0]["result"] == chain["tip_height"], replies
    assert replies[1]["result"] == best[1]["hash"], replies
    assert replies[2]["error"]["code"] == -32601, replies
    checks += 1

    # rpc_users.py: rpcauth credentials work, a wrong password gets 401.
    good = AuthServiceProxy(f"http://{args.user}@127.0.0.1:{args.port}")
    assert good.getblockcount() == chain["tip_height"]
    user = args.user.split(":")[0]
    bad = AuthServiceProxy(f"http://{user}:wrong@127.0.0.1:{args.port}")
    try:
        bad.getblockcount()
        raise AssertionError("wrong password accepted")
    except JSONRPCException as e:
        assert e.http_status == 401, e.http_status
    checks += 2

    print(f"ok: {checks} checks with AuthServiceProxy")


if __name__ == "__main__":
    main()
