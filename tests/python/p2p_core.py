#!/usr/bin/env python3
"""Bitcoin Core's P2P test framework (verystable.core.p2p / .messages)
against a running kakehi node on regtest.

Run by tests/it/p2p_core.rs:

    python p2p_core.py --port PORT --data testnet-data/regtest-a CHECK

CHECK is one of
  handshake  version/verack, service bits, protocol version, wtxidrelay,
             sendaddrv2, sendheaders, feefilter, ping, unknown messages;
             getheaders and getdata against chain.json;
  filters    getcfcheckpt / getcfheaders / getcfilters as Core's
             test/functional/p2p_blockfilters.py checks them, against bcoin's
             filters.json and stale_filters.json (not against kakehi), then
             500 blocks mined here on top and sent over P2P so that a
             getcfheaders range above 2,000 can be asked (their filters
             checked with a BIP158 encoder here); tip announcements; requests
             stopping at header-only blocks ignored; over-limit and
             start > stop requests disconnect;
  malformed  a block whose only fault is a bad signature; Core's
             p2p_invalid_messages.py cases: bad magic (first, and
             mid-stream after a valid message), bad checksum, oversized and
             undersized payloads, bad command bytes, > 2,000 headers,
             > 50,000 inv / getdata entries, > 1,000 addr / addrv2 entries,
             80 junk 4 MB messages: each disconnects its sender; an unknown
             command, a message split over three writes and a second
             version keep it; a second peer's pings keep being answered
             within 2 s throughout (measured);
  lowwork    a peer feeds N headers (--headers, default 1,000,000) of a
             chain below the node's minimum chainwork, each answering the
             node's getheaders: the node follows the whole chain (its last
             getheaders starts at the last header) and keeps the peer,
             while a second peer's pings are answered within 2 s; what the
             node stored and held is checked by tests/it/p2p_core.rs.

Exit status 0 when every check passes; an AssertionError (exit 1) names the
failing check otherwise.
"""

import argparse
import io
import json
import os
import random
import socket
import struct
import sys
import threading
import time

from verystable.core.blockfilter import bip158_basic_element_hash
from verystable.core.blocktools import add_witness_commitment, create_block, create_coinbase
from verystable.core.messages import (
    CBlock,
    CBlockLocator,
    CInv,
    MSG_TYPE_MASK,
    MSG_WITNESS_FLAG,
    msg_addr,
    msg_getaddr,
    msg_getblocks,
    msg_mempool,
    msg_filterclear,
    msg_notfound,
    msg_sendcmpct,
    msg_tx,
    msg_inv,
    CAddress,
    MSG_CMPCT_BLOCK,
    MSG_TX,
    MSG_WTX,
    MSG_WITNESS_TX,
    msg_getdata,
    msg_getheaders,
    CBlockHeader,
    FILTER_TYPE_BASIC,
    MAGIC_BYTES,
    MSG_BLOCK,
    NODE_COMPACT_FILTERS,
    NODE_NETWORK,
    NODE_WITNESS,
    hash256,
    msg_feefilter,
    msg_getcfcheckpt,
    msg_getcfheaders,
    msg_block,
    msg_getcfilters,
    msg_headers,
    msg_ping,
    msg_sendheaders,
    ser_uint256,
    sha256,
    uint256_from_compact,
    uint256_from_str,
)
from verystable.core.p2p import NetworkThread, P2PDataStore, P2PInterface, p2p_lock

REGTEST = MAGIC_BYTES["regtest"]
# Core's limits (net.h, net_processing.cpp, blockfilterindex / BIP157).
MAX_PROTOCOL_MESSAGE_LENGTH = 4_000_000
MAX_HEADERS_RESULTS = 2_000
MAX_INV_SZ = 50_000
MAX_ADDR_TO_SEND = 1_000
MAX_GETCFILTERS_SIZE = 1_000
MAX_GETCFHEADERS_SIZE = 2_000
CFCHECKPT_INTERVAL = 1_000
# The well-behaved peer must get each pong within this (seconds).
PING_DEADLINE = 2.0
WAIT = 30  # seconds, upper bound of any single wait


def log(*a):
    print(*a, flush=True)


def h2i(display_hex):
    """Display-order hash hex -> the framework's uint256 int."""
    return int(display_hex, 16)


def i2h(n):
    return "%064x" % n


def connect(port, cls=P2PInterface, **kwargs):
    """An outbound (from us) connection that completed version/verack."""
    p = cls(**kwargs)
    p.p2p_connected_to_node = True
    p.peer_connect(
        dstaddr="127.0.0.1",
        dstport=port,
        net="regtest",
        timeout_factor=1,
        supports_v2_p2p=False,
        send_version=True,
    )()
    p.wait_for_connect(timeout=WAIT)
    p.wait_for_verack(timeout=WAIT)
    p.sync_with_ping(timeout=WAIT)
    return p


def frame(command, payload, magic=REGTEST, checksum=None, length=None):
    """Raw v1 message bytes, with optional wrong fields."""
    if checksum is None:
        checksum = sha256(sha256(payload))[:4]
    if length is None:
        length = len(payload)
    return (
        magic
        + command.ljust(12, b"\x00")
        + struct.pack("<I", length)
        + checksum
        + payload
    )


def compact_size(n):
    if n < 0xFD:
        return bytes([n])
    if n <= 0xFFFF:
        return b"\xfd" + struct.pack("<H", n)
    return b"\xfe" + struct.pack("<I", n)


def expect_disconnect(p, what, timeout=WAIT):
    try:
        p.wait_for_disconnect(timeout=timeout)
    except AssertionError:
        raise AssertionError(f"{what}: sender still connected after {timeout} s")
    log(f"  ok: {what} -> disconnected")


# --------------------------------------------------------------------------
# a. handshake


def check_handshake(port, data):
    p = connect(port, support_addrv2=True)
    with p2p_lock:
        v = p.last_message["version"]
        got = {k: p.message_count[k] for k in ("version", "verack", "wtxidrelay", "sendaddrv2")}
    assert v.nVersion == 70016, f"protocol version {v.nVersion}, want 70016"
    want = NODE_NETWORK | NODE_WITNESS | NODE_COMPACT_FILTERS
    assert v.nServices & want == want, f"services {v.nServices:#x} lack {want:#x}"
    assert v.nStartingHeight == data["tip_height"], (
        f"start height {v.nStartingHeight}, want {data['tip_height']}"
    )
    assert got == {"version": 1, "verack": 1, "wtxidrelay": 1, "sendaddrv2": 1}, got
    log(f"  ok: version {v.nVersion}, services {v.nServices:#x}, height {v.nStartingHeight}, "
        f"user agent {v.strSubVer!r}; wtxidrelay + sendaddrv2 before verack")
    # kakehi asks for header announcements (BIP130) after the handshake.
    p.wait_until(lambda: p.message_count["sendheaders"] == 1, timeout=WAIT)
    # Our own feature messages and an unknown one are accepted (still connected,
    # pings answered).
    p.send_and_ping(msg_sendheaders())
    p.send_and_ping(msg_feefilter(1000))
    p.send_raw_message(frame(b"kakehitest", b"\x01\x02\x03"))
    p.sync_with_ping()
    # Every ping answered with its own nonce.
    for nonce in (0, 1, 2**64 - 1, random.getrandbits(64)):
        p.send_message(msg_ping(nonce))
        p.wait_until(lambda: p.last_message.get("pong") and p.last_message["pong"].nonce == nonce,
                     timeout=WAIT)
    assert p.is_connected
    log("  ok: sendheaders, feefilter, unknown message accepted; pings answered by nonce")
    # Serving: getheaders from genesis gives the best chain of chain.json;
    # getdata gives blocks of chain.json's size and weight (witness and
    # stripped serializations).
    best = sorted((b for b in data["blocks"] if b["on_best_chain"]), key=lambda b: b["height"])
    loc = CBlockLocator()
    loc.vHave = [h2i(data["genesis"])]
    with p2p_lock:
        p.last_message.pop("headers", None)
    gh = msg_getheaders()
    gh.locator = loc
    p.send_message(gh)
    p.wait_until(lambda: "headers" in p.last_message, timeout=WAIT)
    with p2p_lock:
        hs = p.last_message["headers"].headers
    got = [i2h(h.rehash() or h.sha256) for h in hs]
    assert got == [b["hash"] for b in best], f"getheaders: {len(got)} headers, not chain.json's chain"
    picks = [best[0], best[len(best) // 2], best[-2]] + sorted(best, key=lambda b: -b["weight"])[:2]
    for b in picks:
        for witness in (True, False):
            with p2p_lock:
                p.last_message.pop("block", None)
            kind = MSG_BLOCK | (MSG_WITNESS_FLAG if witness else 0)
            p.send_message(msg_getdata([CInv(kind, h2i(b["hash"]))]))
            p.wait_until(lambda: "block" in p.last_message, timeout=WAIT)
            with p2p_lock:
                blk = p.last_message["block"].block
            blk.rehash()
            assert i2h(blk.sha256) == b["hash"], "getdata answered with another block"
            assert len(blk.vtx) == b["tx_count"]
            size = len(blk.serialize(with_witness=witness))
            stripped = (b["weight"] - b["size"]) // 3
            assert size == (b["size"] if witness else stripped), (
                f"block {b['height']} witness={witness}: {size} bytes")
    # An unknown block is answered with notfound.
    p.send_message(msg_getdata([CInv(MSG_BLOCK, 12345)]))
    p.wait_until(lambda: p.message_count["notfound"] == 1, timeout=WAIT)
    log(f"  ok: getheaders = chain.json's {len(best)} headers; getdata of {len(picks)} blocks "
        "(witness and stripped sizes = chain.json); notfound for an unknown block")
    # A second wtxidrelay after verack is a protocol violation in Core
    # (disconnect); kakehi does the same.
    from verystable.core.messages import msg_wtxidrelay
    p.send_message(msg_wtxidrelay())
    expect_disconnect(p, "wtxidrelay after verack")


# --------------------------------------------------------------------------
# getblocks: a peer that syncs as bcoin, btcd and pre-0.10 Core do


class GetBlocksSyncer(P2PInterface):
    """Downloads the chain by getblocks / inv / getdata only, never
    getheaders: on an inv of unknown blocks it asks for them; on an inv of a
    single unknown block while nothing is in flight (the continuation inv of
    the node's tip, Core's m_continuation_block) it sends the next getblocks
    from its own chain. Every block must extend the one before."""

    def __init__(self, genesis):
        super().__init__()
        self.chain = [genesis]
        self.have = {genesis}
        self.requested = set()
        self.continuations = 0
        self.getblocks_sent = 0
        self.reorgs = 0
        self.errors = []

    def locator(self):
        """Core's CChain::GetLocator shape: ten back one by one, then doubling
        steps, genesis last."""
        out, step, i = [], 1, len(self.chain) - 1
        while i > 0:
            out.append(self.chain[i])
            if len(out) >= 10:
                step *= 2
            i -= step
        out.append(self.chain[0])
        return out

    def send_getblocks(self):
        m = msg_getblocks()
        m.locator.vHave = self.locator()
        m.hashstop = 0
        self.getblocks_sent += 1
        self.send_message(m)

    def on_inv(self, message):
        blocks = [i.hash for i in message.inv if i.type & MSG_TYPE_MASK == MSG_BLOCK]
        unknown = [h for h in blocks if h not in self.have]
        if len(blocks) == 1 and unknown and not self.requested:
            self.continuations += 1
            self.send_getblocks()
            return
        new = [h for h in unknown if h not in self.requested]
        self.requested.update(new)
        if new:
            self.send_message(msg_getdata([CInv(MSG_BLOCK | MSG_WITNESS_FLAG, h) for h in new]))

    def on_block(self, message):
        b = message.block
        b.rehash()
        if b.sha256 not in self.requested:
            self.errors.append(f"unrequested block {i2h(b.sha256)}")
        self.requested.discard(b.sha256)
        if b.hashPrevBlock != self.chain[-1]:
            if b.hashPrevBlock not in self.chain:
                self.errors.append(f"block {i2h(b.sha256)} does not connect")
                return
            # A branch with more work from the node: reorganise onto it.
            del self.chain[self.chain.index(b.hashPrevBlock) + 1:]
            self.reorgs += 1
        self.chain.append(b.sha256)
        self.have.add(b.sha256)

    def on_getheaders(self, message):
        pass


def check_getblocks(port, data):
    best = [h2i(b["hash"]) for b in sorted(
        (b for b in data["blocks"] if b["on_best_chain"]), key=lambda b: b["height"])]
    tip = h2i(data["tip_hash"])
    genesis = h2i(data["genesis"])
    p = connect(port, GetBlocksSyncer, genesis=genesis)
    started = time.time()
    with p2p_lock:
        p.send_getblocks()
    p.wait_until(lambda: p.chain[-1] == tip or p.errors, timeout=240)
    p.sync_with_ping()
    took = time.time() - started
    with p2p_lock:
        chain, errors = list(p.chain), list(p.errors)
        sent, continuations = p.getblocks_sent, p.continuations
        got_headers = p.message_count["headers"]
    assert not errors, errors[:5]
    assert chain[1:] == best, f"synced {len(chain) - 1} blocks, not chain.json's best chain"
    # 1,500 blocks = three full batches of 500: two continuation invs lead to
    # new getblocks; the third batch ends at the tip (its continuation inv
    # names a block the peer has).
    assert (sent, continuations) == (3, 2), (sent, continuations)
    log(f"  ok: {len(chain) - 1} blocks by getblocks/inv/getdata in {took:.1f} s, "
        f"{sent} getblocks, {continuations} continuation invs, tip {i2h(chain[-1])}; "
        f"{got_headers} headers messages received, no getheaders sent")
    # A locator that starts on a stale branch (the old tip of the deepest
    # reorg): the answer starts after the fork point, on the active chain,
    # and the stop block is not listed.
    reorg = max(data["reorgs"], key=lambda r: r["depth"])
    q = connect(port, Observer)
    m = msg_getblocks()
    m.locator.vHave = [h2i(reorg["old_tip"]), h2i(reorg["fork_hash"]), genesis]
    stop_height = reorg["fork_height"] + 20
    m.hashstop = best[stop_height - 1]
    with p2p_lock:
        q.last_message.pop("inv", None)
    q.send_message(m)
    q.wait_until(lambda: "inv" in q.last_message, timeout=WAIT)
    with p2p_lock:
        inv = [i.hash for i in q.last_message["inv"].inv]
    want = best[reorg["fork_height"]:stop_height - 1]
    assert inv == want, f"stale locator: {len(inv)} hashes, want heights {reorg['fork_height'] + 1}.."
    log(f"  ok: locator from stale block {reorg['old_tip'][:16]}..: inv of heights "
        f"{reorg['fork_height'] + 1}..{stop_height - 1}, stop block excluded")
    p.peer_disconnect()
    q.peer_disconnect()
    # A peer that synced the stale branch of that reorg (up to its old tip)
    # and then syncs by getblocks: it is served the active chain from the
    # fork point, reorganises once, and ends at the tip.
    by_hash = {h2i(b["hash"]): b for b in data["blocks"]}
    stale = []
    cur = h2i(reorg["old_tip"])
    while cur != h2i(reorg["fork_hash"]):
        stale.append(cur)
        cur = h2i(by_hash[cur]["prev_hash"])
    r = connect(port, GetBlocksSyncer, genesis=genesis)
    with p2p_lock:
        r.chain = [genesis] + best[:reorg["fork_height"]] + stale[::-1]
        r.have = set(r.chain)
        r.send_getblocks()
    r.wait_until(lambda: r.chain[-1] == tip or r.errors, timeout=240)
    with p2p_lock:
        chain, errors, reorgs = list(r.chain), list(r.errors), r.reorgs
    assert not errors, errors[:5]
    assert chain[1:] == best and reorgs == 1, (len(chain), reorgs)
    r.peer_disconnect()
    log(f"  ok: a peer on the stale branch ({len(stale)} blocks above the fork at "
        f"{reorg['fork_height']}) reorganised once and synced to the tip by getblocks")


# --------------------------------------------------------------------------
# b. filters, as test/functional/p2p_blockfilters.py


class FilterClient(P2PDataStore):
    def __init__(self):
        super().__init__()
        self.cfilters = []

    def on_cfilter(self, message):
        self.cfilters.append(message)

    def pop_cfilters(self):
        with p2p_lock:
            out, self.cfilters = self.cfilters, []
        return out


class Observer(P2PInterface):
    """Records the block hashes announced to it, by `headers` and by `inv`."""

    def __init__(self):
        super().__init__()
        self.by_headers = set()
        self.by_inv = set()

    def on_headers(self, message):
        for h in message.headers:
            h.rehash()
            self.by_headers.add(h.sha256)

    def on_inv(self, message):
        for i in message.inv:
            if i.type & MSG_TYPE_MASK == MSG_BLOCK:
                self.by_inv.add(i.hash)


# --------------------------------------------------------------------------
# messages: what Core, btcd and bcoin peers send to a node without a mempool
# (docs/p2p.md lists kakehi's answer to each)


class MsgPeer(Observer):
    """An Observer that negotiated addrv2 and keeps the addrv2 it got."""

    def __init__(self):
        super().__init__()
        self.support_addrv2 = True
        self.addrv2_entries = []

    def on_addrv2(self, message):
        self.addrv2_entries += message.addrs


def active_tip_header(port, data):
    """The node's active tip header and height, by getheaders from
    regtest-a's tip (the chain may have been extended by `filters`)."""
    q = connect(port, Observer)
    loc = CBlockLocator()
    loc.vHave = [h2i(data["tip_hash"])]
    gh = msg_getheaders()
    gh.locator = loc
    with p2p_lock:
        q.last_message.pop("headers", None)
    q.send_message(gh)
    q.wait_until(lambda: "headers" in q.last_message, timeout=WAIT)
    with p2p_lock:
        hs = q.last_message["headers"].headers
    q.peer_disconnect()
    if not hs:
        return None, data["tip_height"]
    hs[-1].rehash()
    return hs[-1], data["tip_height"] + len(hs)


def expect_refused(port, msg, what):
    """`msg` after the handshake: disconnected (Core does the same)."""
    r = connect(port)
    r.send_message(msg)
    expect_disconnect(r, what)


def check_messages(port, data):
    best = sorted((b for b in data["blocks"] if b["on_best_chain"]), key=lambda b: b["height"])
    p = connect(port, MsgPeer)
    # connect() sent wtxidrelay and sendaddrv2 between version and verack.
    assert p.is_connected
    log("  ok: wtxidrelay and sendaddrv2 before verack accepted (BIP339/BIP155)")
    for rate in (1000, 0, 21_000_000 * 10**8 + 1):
        p.send_and_ping(msg_feefilter(rate))
    p.send_raw_message(frame(b"feefilter", struct.pack("<q", -1)))
    p.sync_with_ping()
    log("  ok: feefilter (also negative and above MAX_MONEY) accepted and ignored")
    p.send_and_ping(msg_notfound(vec=[CInv(MSG_BLOCK, random.getrandbits(256)),
                                      CInv(MSG_TX, random.getrandbits(256))]))
    log("  ok: unsolicited notfound ignored")
    # getheaders with an empty locator: the stop block's header alone (Core).
    stop = best[700]
    gh = msg_getheaders()
    gh.locator = CBlockLocator()
    gh.hashstop = h2i(stop["hash"])
    with p2p_lock:
        p.last_message.pop("headers", None)
    p.send_message(gh)
    p.wait_until(lambda: "headers" in p.last_message, timeout=WAIT)
    with p2p_lock:
        hs = p.last_message["headers"].headers
    assert len(hs) == 1 and i2h(hs[0].rehash() or hs[0].sha256) == stop["hash"], len(hs)
    log("  ok: getheaders with an empty locator -> the stop block's header alone")
    # getdata for transactions: no mempool, so notfound, as Core for a tx it
    # does not relay; a confirmed transaction too (Core serves no txindex).
    b = best[-2]
    with p2p_lock:
        p.last_message.pop("block", None)
    p.send_message(msg_getdata([CInv(MSG_BLOCK | MSG_WITNESS_FLAG, h2i(b["hash"]))]))
    p.wait_until(lambda: "block" in p.last_message, timeout=WAIT)
    with p2p_lock:
        blk = p.last_message["block"].block
    confirmed = blk.vtx[-1]
    confirmed.rehash()
    asked = [CInv(MSG_TX, random.getrandbits(256)), CInv(MSG_WTX, random.getrandbits(256)),
             CInv(MSG_WITNESS_TX, random.getrandbits(256)), CInv(MSG_TX, confirmed.sha256)]
    with p2p_lock:
        p.last_message.pop("notfound", None)
    p.send_message(msg_getdata(asked))
    p.wait_until(lambda: "notfound" in p.last_message, timeout=WAIT)
    with p2p_lock:
        nf = [(i.type, i.hash) for i in p.last_message["notfound"].vec]
        got_tx = p.message_count["tx"]
    assert nf == [(i.type, i.hash) for i in asked], nf
    assert got_tx == 0
    log("  ok: getdata for 4 transactions (MSG_TX, MSG_WTX, MSG_WITNESS_TX, a confirmed one) "
        "-> one notfound listing them")
    check_compact(port, data, p, best)
    # getaddr: answered once per connection (Core), here with what an addr
    # message just taught the node. (The framework's peers send a getaddr of
    # their own while connecting: for p it came before the gossip, so a new
    # peer asks.)
    now = int(time.time())
    addrs = []
    for i in range(1, 6):
        a = CAddress()
        a.time = now
        a.nServices = NODE_NETWORK | NODE_WITNESS
        a.ip = f"11.22.33.{i}"
        a.port = 18444
        addrs.append(a)
    p.send_and_ping(msg_addr_of(addrs))
    r = connect(port, MsgPeer)
    r.send_and_ping(msg_getaddr())
    r.wait_until(lambda: r.message_count["addrv2"] + r.message_count["addr"] >= 1, timeout=WAIT)
    r.send_and_ping(msg_getaddr())
    with p2p_lock:
        answers = r.message_count["addrv2"] + r.message_count["addr"]
        learned = {(a.ip, a.port) for a in r.addrv2_entries}
    assert answers == 1, f"{answers} answers to getaddr"
    assert {(a.ip, a.port) for a in addrs} <= learned, learned
    r.peer_disconnect()
    log(f"  ok: getaddr answered once per connection ({len(learned)} addrv2 entries, "
        "the gossiped ones included), later ones ignored")
    assert p.is_connected
    # Messages Core answers by a disconnect, without discouragement.
    expect_refused(port, msg_mempool(), "mempool (no NODE_BLOOM)")
    expect_refused(port, msg_filterclear(), "filterclear (no NODE_BLOOM)")
    # Transactions although our version said relay = 0: Core -blocksonly
    # disconnects, kakehi ignores them (light clients such as kyoto send to
    # a random peer whatever the flag); nothing is fetched.
    t = connect(port)
    t.send_and_ping(msg_inv([CInv(MSG_WTX, random.getrandbits(256))]))
    t.send_and_ping(msg_tx(confirmed))
    with p2p_lock:
        fetched = t.message_count["getdata"]
    assert t.is_connected and fetched == 0
    t.peer_disconnect()
    log("  ok: tx inv and tx after version relay=0 ignored, the peer kept, nothing fetched")
    check_v2(port)
    p.sync_with_ping()
    log("  ok: the first peer is still served")


def msg_addr_of(addrs):
    m = msg_addr()
    m.addrs = addrs
    return m


def check_compact(port, data, p, best):
    """sendcmpct: kakehi sends no sendcmpct, so it offers no compact blocks;
    a peer that asks for MSG_CMPCT_BLOCK gets the full block, as Core answers
    for blocks too deep for a compact one. Also for a block mined now and
    announced to the peer."""
    p.send_and_ping(msg_sendcmpct(announce=True, version=2))
    b = best[-2]
    with p2p_lock:
        p.last_message.pop("block", None)
    p.send_message(msg_getdata([CInv(MSG_CMPCT_BLOCK, h2i(b["hash"]))]))
    p.wait_until(lambda: "block" in p.last_message, timeout=WAIT)
    with p2p_lock:
        blk = p.last_message["block"].block
    blk.rehash()
    assert i2h(blk.sha256) == b["hash"]
    assert len(blk.serialize(with_witness=True)) == b["size"], "not the full witness block"
    tip, height = active_tip_header(port, data)
    prev = tip.sha256 if tip else h2i(data["tip_hash"])
    ntime = (tip.nTime if tip else best[-1]["time"]) + 1
    new = create_block(prev, create_coinbase(height + 1), ntime)
    new.solve()
    miner = connect(port)
    miner.send_and_ping(msg_block(new))
    p.wait_until(lambda: new.sha256 in p.by_headers or new.sha256 in p.by_inv, timeout=WAIT)
    with p2p_lock:
        p.last_message.pop("block", None)
    p.send_message(msg_getdata([CInv(MSG_CMPCT_BLOCK, new.sha256)]))
    p.wait_until(lambda: "block" in p.last_message, timeout=WAIT)
    with p2p_lock:
        got = p.last_message["block"].block
        compact = p.message_count["cmpctblock"]
    got.rehash()
    assert got.sha256 == new.sha256 and compact == 0
    miner.peer_disconnect()
    log(f"  ok: sendcmpct(1, 2) accepted; MSG_CMPCT_BLOCK answered with full blocks "
        f"(block {b['height']}, and {height + 1} mined now and announced), no cmpctblock")


def check_v2(port):
    """A BIP324 v2 initiator's first bytes (64 bytes of ElligatorSwift key,
    then up to 4095 of garbage; random to us): kakehi speaks v1 only, so it
    closes the connection without answering, at once; the v1 retry from the
    same address is served."""
    for extra in (0, 100):
        r = RawPeer(port, handshake=False)
        started = time.time()
        first = os.urandom(64)
        while first[:4] == REGTEST:
            first = os.urandom(64)
        r.send_quietly(first + os.urandom(extra))
        r.wait_closed(f"v2 handshake ({64 + extra} bytes)", timeout=10)
        took = time.time() - started
        log(f"  ok: v2 initiator bytes ({64 + extra}) closed in {took * 1000:.0f} ms")
    again = connect(port)
    again.sync_with_ping()
    again.peer_disconnect()
    log("  ok: a v1 connection from the same address is served afterwards")


def request_cfcheckpt(p, stop_hash):
    with p2p_lock:
        p.last_message.pop("cfcheckpt", None)
    p.send_and_ping(msg_getcfcheckpt(filter_type=FILTER_TYPE_BASIC, stop_hash=stop_hash))
    p.wait_until(lambda: "cfcheckpt" in p.last_message, timeout=WAIT)
    with p2p_lock:
        return p.last_message["cfcheckpt"]


def request_cfheaders(p, start_height, stop_hash):
    with p2p_lock:
        p.last_message.pop("cfheaders", None)
    p.send_and_ping(msg_getcfheaders(filter_type=FILTER_TYPE_BASIC, start_height=start_height,
                                     stop_hash=stop_hash))
    p.wait_until(lambda: "cfheaders" in p.last_message, timeout=WAIT)
    with p2p_lock:
        return p.last_message["cfheaders"]


def request_cfilters(p, start_height, stop_hash, count):
    p.pop_cfilters()
    p.send_message(msg_getcfilters(filter_type=FILTER_TYPE_BASIC, start_height=start_height,
                                   stop_hash=stop_hash))
    p.wait_until(lambda: len(p.cfilters) >= count, timeout=WAIT)
    p.sync_with_ping()
    return p.pop_cfilters()


def chain_headers(prev_header, filter_hashes):
    """Filter headers from the previous header and the filter hashes (BIP157),
    as uint256 ints."""
    out = []
    prev = ser_uint256(prev_header)
    for fh in filter_hashes:
        prev = hash256(ser_uint256(fh) + prev)
        out.append(uint256_from_str(prev))
    return out


def check_range(p, entries, start, stop_entry, what):
    """getcfheaders + getcfilters for heights start..stop against the reference
    entries (dicts with hash, basic_filter, filter_header), where
    entries[i] is the block at height start + i and stop_entry the last."""
    stop_hash = h2i(stop_entry["hash"])
    cfh = request_cfheaders(p, start, stop_hash)
    assert cfh.filter_type == FILTER_TYPE_BASIC
    assert cfh.stop_hash == stop_hash, f"{what}: cfheaders stop hash"
    assert len(cfh.hashes) == len(entries), f"{what}: {len(cfh.hashes)} hashes, want {len(entries)}"
    headers = chain_headers(cfh.prev_header, cfh.hashes)
    for e, fh, hd in zip(entries, cfh.hashes, headers):
        want_fh = uint256_from_str(hash256(bytes.fromhex(e["basic_filter"])))
        assert fh == want_fh, f"{what}: filter hash at {e['hash']}"
        assert hd == h2i(e["filter_header"]), f"{what}: filter header at {e['hash']}"
    filters = []
    for chunk in range(0, len(entries), MAX_GETCFILTERS_SIZE):
        part = entries[chunk:chunk + MAX_GETCFILTERS_SIZE]
        filters += request_cfilters(p, start + chunk, h2i(part[-1]["hash"]), len(part))
    assert len(filters) == len(entries), f"{what}: {len(filters)} cfilters, want {len(entries)}"
    for e, f, fh in zip(entries, filters, cfh.hashes):
        assert f.filter_type == FILTER_TYPE_BASIC
        assert f.block_hash == h2i(e["hash"]), f"{what}: cfilter order/block hash"
        assert f.filter_data.hex() == e["basic_filter"], f"{what}: filter bytes of {e['hash']}"
        # Core: the filter's hash matches the one in cfheaders.
        assert uint256_from_str(hash256(f.filter_data)) == fh
    return cfh, headers


def gcs_basic_filter(block_hash_hex, scripts):
    """BIP158 basic filter (P = 19, M = 784,931) of a set of scripts, with
    Core's element hash from verystable.core.blockfilter: CompactSize N, then
    the Golomb-Rice coded sorted deltas, zero-padded to a byte."""
    scripts = sorted(set(scripts))
    values = sorted(bip158_basic_element_hash(spk, len(scripts), block_hash_hex) for spk in scripts)
    bits = []
    last = 0
    for v in values:
        delta, last = v - last, v
        bits += [1] * (delta >> 19) + [0]
        bits += [(delta >> i) & 1 for i in range(18, -1, -1)]
    bits += [0] * (-len(bits) % 8)
    coded = bytes(int("".join(map(str, bits[i:i + 8])), 2) for i in range(0, len(bits), 8))
    return compact_size(len(scripts)) + coded


def check_filters(port, data):
    filters = json.load(open(os.path.join(data, "filters.json")))
    stale = json.load(open(os.path.join(data, "stale_filters.json")))
    tip = filters[-1]
    tip_height = tip["height"]
    by_height = {f["height"]: f for f in filters}
    p = connect(port, FilterClient)
    with p2p_lock:
        services = p.last_message["version"].nServices
    assert services & NODE_COMPACT_FILTERS, "NODE_COMPACT_FILTERS not advertised"

    # getcfcheckpt by the tip: every 1,000th filter header.
    cp = request_cfcheckpt(p, h2i(tip["hash"]))
    want = [h2i(by_height[h]["filter_header"])
            for h in range(CFCHECKPT_INTERVAL, tip_height + 1, CFCHECKPT_INTERVAL)]
    assert cp.filter_type == FILTER_TYPE_BASIC and cp.stop_hash == h2i(tip["hash"])
    assert cp.headers == want, f"cfcheckpt headers {list(map(i2h, cp.headers))}"
    log(f"  ok: cfcheckpt at tip {tip_height}: {len(cp.headers)} checkpoint(s) = filters.json")

    # getcfheaders from 1 to the first checkpoint: the headers chain to it
    # (Core: "Check that cfheaders chain to the checkpoint").
    cfh, headers = check_range(p, filters[1:CFCHECKPT_INTERVAL + 1], 1,
                               by_height[CFCHECKPT_INTERVAL], "1..1000")
    assert cfh.prev_header == h2i(filters[0]["filter_header"]), "prev header = genesis header"
    assert headers[-1] == cp.headers[0], "cfheaders do not chain to the checkpoint"
    # ... and from the checkpoint to the tip, starting at the checkpoint header.
    cfh2, headers2 = check_range(p, filters[CFCHECKPT_INTERVAL + 1:], CFCHECKPT_INTERVAL + 1, tip,
                                 "1001..tip")
    assert cfh2.prev_header == cp.headers[0], "second range does not start at the checkpoint"
    assert headers2[-1] == h2i(tip["filter_header"])
    # genesis alone (start 0).
    check_range(p, filters[:1], 0, filters[0], "genesis")
    log(f"  ok: getcfheaders/getcfilters 0..{tip_height}: filter hashes match cfheaders, "
        "headers chain to the checkpoint, every filter = filters.json")

    # Stale branches: queries by a stale stop hash follow that block's own
    # ancestors (bcoin's stale_filters.json), both headers and filters.
    stale_by_hash = {s["hash"]: s for s in stale}
    best_hashes = {f["hash"] for f in filters}
    checked = 0
    for s in stale:
        # The stale branch back to the fork, then the common chain.
        branch = [s]
        while branch[-1]["prev_hash"] in stale_by_hash:
            branch.append(stale_by_hash[branch[-1]["prev_hash"]])
        fork_parent = branch[-1]["prev_hash"]
        assert fork_parent in best_hashes, "stale branch forks off the best chain"
        fork_height = branch[-1]["height"] - 1
        start = max(0, fork_height - 5)
        entries = filters[start:fork_height + 1] + list(reversed(branch))
        assert [e["hash"] for e in entries][-1] == s["hash"]
        check_range(p, entries, start, s, f"stale {s['height']} {s['hash'][:16]}")
        cps = request_cfcheckpt(p, h2i(s["hash"]))
        want = [h2i(by_height[h]["filter_header"])
                for h in range(CFCHECKPT_INTERVAL, s["height"] + 1, CFCHECKPT_INTERVAL)]
        assert cps.headers == want, f"stale cfcheckpt at {s['hash']}"
        checked += 1
    log(f"  ok: {checked} stale stop hashes: cfheaders, cfilters, cfcheckpt follow the stale branch")

    # An unknown stop hash (a race at the tip) is ignored, not punished.
    p.send_and_ping(msg_getcfheaders(filter_type=FILTER_TYPE_BASIC, start_height=1,
                                     stop_hash=random.getrandbits(256)))
    assert p.is_connected
    log("  ok: unknown stop hash ignored, peer kept")

    # Extend the chain to 2,000 blocks so a getcfheaders range above 2,000
    # exists: coinbase-only blocks mined here (regtest PoW), announced with
    # `headers` and served on getdata.
    mine_to = MAX_GETCFHEADERS_SIZE
    prev = h2i(tip["hash"])
    # Deterministic (same blocks on every run): an hour after the last
    # possible time of the reference tip (block n: 1704067200 + 600 n + < 300).
    ntime = 1704067200 + 600 * tip_height + 3600
    blocks = []
    for height in range(tip_height + 1, mine_to + 1):
        b = create_block(prev, create_coinbase(height), ntime + height)
        b.solve()
        blocks.append(b)
        prev = b.sha256
    with p2p_lock:
        for b in blocks:
            p.block_store[b.sha256] = b
        p.last_block_hash = blocks[-1].sha256
    for i in range(0, len(blocks), MAX_HEADERS_RESULTS):
        p.send_message(msg_headers([CBlockHeader(b) for b in blocks[i:i + MAX_HEADERS_RESULTS]]))
    top = blocks[-1].sha256
    deadline = time.time() + 120
    while True:
        with p2p_lock:
            p.last_message.pop("cfcheckpt", None)
        p.send_and_ping(msg_getcfcheckpt(filter_type=FILTER_TYPE_BASIC, stop_hash=top))
        time.sleep(0.2)
        with p2p_lock:
            got = p.last_message.get("cfcheckpt")
        if got is not None:
            break
        assert time.time() < deadline, f"mined blocks up to {mine_to} not connected in 120 s"
    assert len(got.headers) == 2 and got.headers[0] == h2i(by_height[1000]["filter_header"])
    got_checkpoints = got.headers
    # The new checkpoint at 2,000 chains from the old ones over the mined
    # blocks (filters checked with their hashes as above).
    cfh = request_cfheaders(p, tip_height + 1, top)
    assert cfh.prev_header == h2i(tip["filter_header"])
    assert chain_headers(cfh.prev_header, cfh.hashes)[-1] == got.headers[1]
    # Their filters against this script's own BIP158 encoder, first checked
    # on the regtest genesis block (its one output script, Core's
    # chainparams) against bcoin's genesis filter.
    genesis_spk = bytes.fromhex(
        "4104678afdb0fe5548271967f1a67130b7105cd6a828e03909a67962e0ea1f61deb649f6bc3f4cef38c4f355"
        "04e51ec112de5c384df7ba0b8d578a4c702b6bf11d5fac")
    assert gcs_basic_filter(filters[0]["hash"], [genesis_spk]).hex() == filters[0]["basic_filter"]
    mined = request_cfilters(p, tip_height + 1, top, len(blocks))
    for b, f in zip(blocks, mined):
        spks = [bytes(o.scriptPubKey) for tx in b.vtx for o in tx.vout
                if not bytes(o.scriptPubKey).startswith(b"\x6a")]
        assert f.block_hash == b.sha256
        assert f.filter_data == gcs_basic_filter(i2h(b.sha256), spks), f"filter of mined {i2h(b.sha256)}"
    log(f"  ok: {len(blocks)} mined blocks accepted over P2P, their filters = BIP158 encoding "
        "here, checkpoint 2000 chains")
    # Boundaries: exactly 2,000 cfheaders and 1,000 cfilters are answered.
    cfh = request_cfheaders(p, 1, top)
    assert len(cfh.hashes) == MAX_GETCFHEADERS_SIZE
    fl = request_cfilters(p, mine_to - MAX_GETCFILTERS_SIZE + 1, top, MAX_GETCFILTERS_SIZE)
    assert len(fl) == MAX_GETCFILTERS_SIZE
    log("  ok: 2,000 cfheaders and 1,000 cfilters (the limits) answered")

    # New tips are announced (BIP130): by `headers` to a peer that sent
    # sendheaders (and has the parent header), by `inv` to one that did not.
    hdr_obs = connect(port, Observer)
    hdr_obs.send_and_ping(msg_sendheaders())
    loc = CBlockLocator()
    loc.vHave = [blocks[-2].sha256]
    gh = msg_getheaders()
    gh.locator = loc
    hdr_obs.send_and_ping(gh)
    inv_obs = connect(port, Observer)
    new = create_block(top, create_coinbase(mine_to + 1), ntime + mine_to + 1)
    new.solve()
    with p2p_lock:
        p.block_store[new.sha256] = new
        p.last_block_hash = new.sha256
    p.send_message(msg_headers([CBlockHeader(new)]))
    hdr_obs.wait_until(lambda: new.sha256 in hdr_obs.by_headers, timeout=WAIT)
    inv_obs.wait_until(lambda: new.sha256 in inv_obs.by_inv, timeout=WAIT)
    assert new.sha256 not in hdr_obs.by_inv and new.sha256 not in inv_obs.by_headers
    log(f"  ok: block {mine_to + 1} announced by headers (sendheaders peer) and by inv (other)")

    # Filter requests are answered only from complete data: block 2002's
    # header arrives from a peer that never sends the block, so its filter
    # does not exist yet; requests stopping there are ignored (the peer is
    # kept). Once another peer delivers the block they are answered.
    nxt = create_block(new.sha256, create_coinbase(mine_to + 2), ntime + mine_to + 2)
    nxt.solve()
    teaser = connect(port, Observer)
    teaser.send_message(msg_headers([CBlockHeader(nxt)]))
    teaser.sync_with_ping()
    asker = connect(port, FilterClient)
    for m in (msg_getcfheaders(filter_type=FILTER_TYPE_BASIC, start_height=mine_to + 1,
                               stop_hash=nxt.sha256),
              msg_getcfilters(filter_type=FILTER_TYPE_BASIC, start_height=mine_to + 1,
                              stop_hash=nxt.sha256),
              msg_getcfcheckpt(filter_type=FILTER_TYPE_BASIC, stop_hash=nxt.sha256)):
        asker.send_and_ping(m)
    # A header-only sibling of block 2,000 (a checkpoint height): its
    # checkpoint cannot exist either.
    sib = create_block(blocks[-2].sha256, create_coinbase(mine_to), ntime + mine_to + 7)
    sib.solve()
    teaser.send_message(msg_headers([CBlockHeader(sib)]))
    teaser.sync_with_ping()
    asker.send_and_ping(msg_getcfheaders(filter_type=FILTER_TYPE_BASIC, start_height=mine_to,
                                         stop_hash=sib.sha256))
    time.sleep(1)
    asker.sync_with_ping()
    with p2p_lock:
        early = [k for k in ("cfheaders", "cfilter") if asker.message_count[k]]
        cps = [asker.last_message["cfcheckpt"]] if asker.message_count["cfcheckpt"] else []
    assert not early, f"answered {early} for a block whose filter cannot exist yet"
    # The checkpoints up to 2,002 are all complete (1,000 and 2,000 are on the
    # active chain): answering them is right, if they are right.
    for c in cps:
        assert c.headers == [h2i(by_height[1000]["filter_header"]), got_checkpoints[1]], (
            f"cfcheckpt by a header-only stop: {list(map(i2h, c.headers))}")
    with p2p_lock:
        asker.last_message.pop("cfcheckpt", None)
        n_cp = asker.message_count["cfcheckpt"]
    asker.send_and_ping(msg_getcfcheckpt(filter_type=FILTER_TYPE_BASIC, stop_hash=sib.sha256))
    time.sleep(1)
    asker.sync_with_ping()
    with p2p_lock:
        sib_cp = asker.last_message.get("cfcheckpt")
    assert sib_cp is None, (
        f"cfcheckpt by a header-only block at a checkpoint height answered: "
        f"{list(map(i2h, sib_cp.headers))} (active 2000: {i2h(got_checkpoints[1])})")
    # The announcer leaves (its block request is released, as when Core's
    # block download times out); a peer that has the block announces it.
    teaser.peer_disconnect()
    teaser.wait_for_disconnect()
    with p2p_lock:
        p.block_store[nxt.sha256] = nxt
        p.last_block_hash = nxt.sha256
    p.send_message(msg_headers([CBlockHeader(nxt)]))
    deadline = time.time() + 60
    while True:
        with p2p_lock:
            asker.last_message.pop("cfheaders", None)
        asker.send_and_ping(msg_getcfheaders(filter_type=FILTER_TYPE_BASIC,
                                             start_height=mine_to + 1, stop_hash=nxt.sha256))
        time.sleep(0.2)
        with p2p_lock:
            got = asker.last_message.get("cfheaders")
        if got is not None:
            break
        assert time.time() < deadline, "block 2002 not connected within 60 s of its delivery"
    assert len(got.hashes) == 2 and got.prev_header == chain_headers(
        cfh.prev_header, cfh.hashes)[-1]
    log("  ok: cfheaders/cfilters stopping at a header-only block and cfcheckpt at a header-only "
        f"checkpoint-height sibling ignored (peer kept; cfcheckpt by the header-only 2002 "
        f"{'answered with the right checkpoints' if cps else 'ignored'}); answered once another "
        "peer delivered the block")

    # A peer sends block 2,003 with a bad merkle root (valid PoW): it is
    # disconnected; the header stays headers-only (a mutated body says
    # nothing about the header, as in Core). Another peer then announces a
    # valid block 2,003 of equal work: the node must fetch it from that peer
    # and connect it (Core's direct fetch of announced blocks), not wait for
    # the first header's body that nobody serves.
    bad = create_block(nxt.sha256, create_coinbase(mine_to + 3), ntime + mine_to + 3)
    bad.hashMerkleRoot ^= 1
    bad.solve()
    mutator = connect(port)
    mutator.send_message(msg_block(bad))
    expect_disconnect(mutator, "block with a bad merkle root")
    good = create_block(nxt.sha256, create_coinbase(mine_to + 3), ntime + mine_to + 4)
    good.solve()
    with p2p_lock:
        p.block_store[good.sha256] = good
        p.last_block_hash = good.sha256
    p.send_message(msg_headers([CBlockHeader(good)]))
    announced = time.time()
    deadline = announced + 30
    while True:
        with p2p_lock:
            asker.last_message.pop("cfheaders", None)
        asker.send_and_ping(msg_getcfheaders(filter_type=FILTER_TYPE_BASIC,
                                             start_height=mine_to + 3, stop_hash=good.sha256))
        with p2p_lock:
            got = asker.last_message.get("cfheaders")
        if got is not None:
            break
        assert time.time() < deadline, (
            "a valid block announced after a mutated one of equal work was not connected in 30 s")
        time.sleep(0.2)
    log("  ok: a mutated block disconnects its sender; a valid competing block announced by "
        f"another peer is then fetched and connected ({time.time() - announced:.1f} s)")
    # Nor is the honest peer asked for the mutated block's hash (it announced
    # another block at that height): such a request would never be answered
    # and would cost the peer its connection at the 10 min request timeout.
    time.sleep(1.5)
    with p2p_lock:
        assert bad.sha256 not in p.getdata_requests, "the honest peer was asked for the mutated block"
    for q in (p, hdr_obs, inv_obs, asker):
        q.peer_disconnect()
        q.wait_for_disconnect()

    # Over-limit and malformed requests disconnect (Core: "Check that invalid
    # requests result in disconnection").
    requests = [
        ("getcfilters > 1,000", msg_getcfilters(filter_type=FILTER_TYPE_BASIC,
                                                start_height=mine_to - MAX_GETCFILTERS_SIZE,
                                                stop_hash=top)),
        ("getcfheaders > 2,000", msg_getcfheaders(filter_type=FILTER_TYPE_BASIC, start_height=0,
                                                  stop_hash=top)),
        ("getcfilters start > stop", msg_getcfilters(filter_type=FILTER_TYPE_BASIC,
                                                     start_height=1000,
                                                     stop_hash=h2i(by_height[999]["hash"]))),
        ("getcfheaders start > stop", msg_getcfheaders(filter_type=FILTER_TYPE_BASIC,
                                                       start_height=1000,
                                                       stop_hash=h2i(by_height[999]["hash"]))),
        ("getcfcheckpt unknown filter type", msg_getcfcheckpt(filter_type=255,
                                                              stop_hash=h2i(tip["hash"]))),
        ("getcfilters unknown filter type", msg_getcfilters(filter_type=255, start_height=1,
                                                            stop_hash=h2i(tip["hash"]))),
    ]
    for what, msg in requests:
        q = connect(port, FilterClient)
        q.send_message(msg)
        expect_disconnect(q, what)


# --------------------------------------------------------------------------
# c. malformed traffic while a second peer pings


class Pinger:
    """A well-behaved peer pinging every 100 ms from its own thread and
    recording every round-trip time."""

    def __init__(self, port):
        self.p = connect(port)
        self.rtts = []
        self.failure = None
        self.stop = threading.Event()
        self.nonce = 1 << 40
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        try:
            while not self.stop.is_set():
                self.nonce += 1
                nonce = self.nonce
                sent = time.monotonic()
                self.p.send_message(msg_ping(nonce))
                while True:
                    with p2p_lock:
                        pong = self.p.last_message.get("pong")
                        ok = pong is not None and pong.nonce == nonce
                    if ok:
                        break
                    if not self.p.is_connected:
                        raise AssertionError("well-behaved peer was disconnected")
                    if time.monotonic() - sent > PING_DEADLINE:
                        raise AssertionError(f"ping {nonce} unanswered after {PING_DEADLINE} s")
                    time.sleep(0.002)
                self.rtts.append(time.monotonic() - sent)
                self.stop.wait(0.1)
        except Exception as e:  # reported by check()
            self.failure = e

    def check(self, what):
        if self.failure is not None:
            raise AssertionError(f"during {what}: {self.failure}")

    def finish(self):
        self.stop.set()
        self.thread.join(10)
        if self.failure is not None:
            raise AssertionError(f"well-behaved peer: {self.failure}")
        rtts = sorted(self.rtts)
        return rtts


class RawPeer:
    """A plain TCP socket that completes the handshake by hand, so any bytes
    can follow."""

    def __init__(self, port, handshake=True):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        if handshake:
            self.handshake(port)

    def handshake(self, port):
        from verystable.core.messages import msg_verack, msg_version
        v = msg_version()
        v.nVersion = 70016
        v.nServices = 0
        v.addrTo.ip = "127.0.0.1"
        v.addrTo.port = port
        v.strSubVer = "/p2p_core.py raw/"
        v.relay = 0
        self.send(frame(v.msgtype, v.serialize()))
        self.send(frame(b"verack", b""))
        # Read until their verack.
        buf = b""
        deadline = time.time() + WAIT
        while b"verack\x00" not in buf:
            assert time.time() < deadline, "no verack from kakehi"
            chunk = self.s.recv(65536)
            assert chunk, "closed during handshake"
            buf += chunk

    def send(self, b):
        self.s.sendall(b)

    def send_quietly(self, b):
        """Sends as much as the node reads; stops when it closes on us."""
        try:
            self.s.sendall(b)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            pass

    def expect_pong(self, nonce, what, split=False, timeout=WAIT):
        """Sends a ping (`split`: in three writes 0.1 s apart, cut inside its
        header and its payload) and reads frames until its pong: the peer
        was kept."""
        ping = frame(b"ping", struct.pack("<Q", nonce))
        for part in (ping[:3], ping[3:26], ping[26:]) if split else (ping,):
            self.send(part)
            if split:
                time.sleep(0.1)
        self.s.settimeout(timeout)
        deadline = time.time() + timeout
        buf = b""
        while time.time() < deadline:
            while len(buf) >= 24:
                length = struct.unpack("<I", buf[16:20])[0]
                if len(buf) < 24 + length:
                    break
                command = buf[4:16].rstrip(b"\x00")
                payload = buf[24:24 + length]
                buf = buf[24 + length:]
                if command == b"pong" and payload == struct.pack("<Q", nonce):
                    log(f"  ok: {what} -> peer kept (pong)")
                    return
            chunk = self.s.recv(1 << 20)
            if not chunk:
                raise AssertionError(f"{what}: disconnected, expected to be kept")
            buf += chunk
        raise AssertionError(f"{what}: no pong within {timeout} s")

    def wait_closed(self, what, timeout=WAIT):
        self.s.settimeout(timeout)
        started = time.time()
        deadline = started + timeout
        try:
            while time.time() < deadline:
                if not self.s.recv(1 << 20):
                    log(f"  ok: {what} -> disconnected in {time.time() - started:.2f} s")
                    self.s.close()
                    return
        except ConnectionResetError:
            log(f"  ok: {what} -> disconnected (reset) in {time.time() - started:.2f} s")
            self.s.close()
            return
        except socket.timeout:
            pass
        raise AssertionError(f"{what}: sender still connected after {timeout} s")


def header_on(prev_hex, salt, pow_ok=True):
    """A regtest header on `prev_hex` whose proof of work is met, or (not
    `pow_ok`) missed."""
    h = CBlockHeader()
    h.nVersion = 0x20000000
    h.hashPrevBlock = h2i(prev_hex)
    h.hashMerkleRoot = salt
    h.nTime = REGTEST_GENESIS_TIME + 1
    h.nBits = REGTEST_BITS
    h.nNonce = 0
    target = uint256_from_compact(REGTEST_BITS)
    while True:
        h.rehash()
        if (h.sha256 <= target) == pow_ok:
            return h
        h.nNonce += 1


def addrv2_entry(network, address):
    """One BIP155 addrv2 entry (time, services, network id, address, port)."""
    return (struct.pack("<I", 1_700_000_000) + compact_size(NODE_NETWORK) + bytes([network])
            + compact_size(len(address)) + address + struct.pack(">H", 18444))


def check_bad_signature_block(port, data, pinger):
    """A block valid in every way but one signature: regtest-a's case 16
    transaction (a P2WPKH input whose signature does not commit to the
    transaction), in a block mined here on the node's tip. Core rejects it
    in ConnectBlock (BLOCK_CONSENSUS, block-script-verify-flag-failed) and
    MaybePunishNodeForBlock disconnects the sender; so does kakehi."""
    chain = json.load(open(os.path.join(data, "chain.json")))
    tip, height = active_tip_header(port, chain)
    prev = tip.sha256 if tip else h2i(chain["tip_hash"])
    best = max((b for b in chain["blocks"] if b["on_best_chain"]), key=lambda b: b["height"])
    ntime = (tip.nTime if tip else best["time"]) + 1
    case = CBlock()
    with open(os.path.join(data, "invalid", "16-bad-signature.blk"), "rb") as f:
        case.deserialize(io.BytesIO(f.read()[8:]))
    bad = create_block(prev, create_coinbase(height + 1), ntime, txlist=[case.vtx[1]])
    add_witness_commitment(bad)
    bad.solve()
    sender = connect(port)
    sender.send_message(msg_block(bad))
    expect_disconnect(sender, "block with a bad signature (consensus-invalid)")
    pinger.check("block with a bad signature")
    after, _ = active_tip_header(port, chain)
    assert after is None or after.sha256 != bad.sha256, "the invalid block became the tip"


def check_malformed(port, data):
    pinger = Pinger(port)
    check_bad_signature_block(port, data, pinger)
    genesis_like = CBlockHeader()
    genesis_like.nBits = 0x207FFFFF
    # Core's test_invalid_pow_headers_msg and test_noncontinuous_headers_msg.
    bad_pow = header_on(REGTEST_GENESIS, 1, pow_ok=False)
    first, second = header_on(REGTEST_GENESIS, 2), header_on(REGTEST_GENESIS, 3)
    cases = [
        ("bad magic", frame(b"ping", b"\x00" * 8, magic=MAGIC_BYTES["mainnet"])),
        ("bad checksum", frame(b"ping", b"\x00" * 8, checksum=b"\x00\x01\x02\x03")),
        ("payload length 4,000,001", frame(b"block", b"", length=MAX_PROTOCOL_MESSAGE_LENGTH + 1)),
        ("headers with 2,001 entries",
         frame(b"headers", msg_headers([genesis_like] * (MAX_HEADERS_RESULTS + 1)).serialize())),
        ("inv with 50,001 entries",
         # The entries as msg_inv/CInv would serialize them (type u32 LE, 32-byte
         # hash), built directly: CInv.serialize takes ~1 ms each.
         frame(b"inv", compact_size(MAX_INV_SZ + 1) + b"".join(
             struct.pack("<I", MSG_BLOCK) + i.to_bytes(32, "little")
             for i in range(MAX_INV_SZ + 1)))),
        ("inv announcing 50,001, no entries", frame(b"inv", compact_size(MAX_INV_SZ + 1))),
        ("getdata with 50,001 entries", frame(b"getdata", compact_size(MAX_INV_SZ + 1) + b"".join(
            struct.pack("<I", MSG_BLOCK | MSG_WITNESS_FLAG) + i.to_bytes(32, "little")
            for i in range(MAX_INV_SZ + 1)))),
        # Entries as CAddress serializes them in addr (time, services, IPv6-mapped
        # IPv4, port BE) and addrv2 (BIP155: time, CompactSize services, network 1,
        # 4-byte address, port BE).
        ("addr with 1,001 entries", frame(b"addr", compact_size(MAX_ADDR_TO_SEND + 1) + b"".join(
            struct.pack("<IQ", 1_700_000_000, NODE_NETWORK) + b"\x00" * 10 + b"\xff\xff"
            + bytes([10, 0, i >> 8, i & 0xFF]) + struct.pack(">H", 18444)
            for i in range(MAX_ADDR_TO_SEND + 1)))),
        ("addrv2 with 1,001 entries", frame(b"addrv2", compact_size(MAX_ADDR_TO_SEND + 1) + b"".join(
            struct.pack("<I", 1_700_000_000) + compact_size(NODE_NETWORK) + b"\x01\x04"
            + bytes([10, 0, i >> 8, i & 0xFF]) + struct.pack(">H", 18444)
            for i in range(MAX_ADDR_TO_SEND + 1)))),
        ("payload length 0xffffffff", frame(b"tx", b"", length=0xFFFFFFFF)),
        ("headers with an invalid proof of work", frame(b"headers", msg_headers([bad_pow]).serialize())),
        ("non-continuous headers", frame(b"headers", msg_headers([first, second]).serialize())),
        # Core's test_addrv2_too_long_address: Core drops the message and keeps
        # the peer; a payload that does not decode disconnects here.
        ("addrv2 with a 5-byte IPv4 address", frame(b"addrv2", compact_size(1)
                                                   + addrv2_entry(1, b"\x0a\x00\x00\x01\x02"))),
        # Core's test_magic_bytes: a valid message, then a wrong network's magic.
        ("magic bytes mid-stream", frame(b"ping", struct.pack("<Q", 7))
         + frame(b"ping", struct.pack("<Q", 8), magic=MAGIC_BYTES["testnet3"])),
        # Core's test_msgtype: command bytes that are not printable ASCII then NULs.
        ("command with a non-printable byte", frame(b"pi\x01g", struct.pack("<Q", 9))),
        ("command with bytes after its NUL", frame(b"ping\x00\x00x", struct.pack("<Q", 9))),
        ("undersized ping (4 bytes)", frame(b"ping", b"\x00" * 4)),
    ]
    for what, raw in cases:
        r = RawPeer(port)
        r.send_quietly(raw)
        r.wait_closed(what)
        pinger.check(what)
    # The same before any version: junk as the very first bytes.
    for what, raw in [
        ("bad magic before version", frame(b"version", b"\x00" * 100, magic=MAGIC_BYTES["signet"])),
        ("4 MB junk block before version",
         frame(b"block", b"\xff" * 9 + os.urandom(MAX_PROTOCOL_MESSAGE_LENGTH - 9))),
        ("ping before version", frame(b"ping", b"\x00" * 8)),
    ]:
        r = RawPeer(port, handshake=False)
        r.send_quietly(raw)
        r.wait_closed(what)
        pinger.check(what)
    # Kept: an unknown command (Core: ignored), a ping split over three writes
    # (Core's test_buffer), a second version (Core: "redundant version").
    from verystable.core.messages import msg_version
    r = RawPeer(port)
    r.send(frame(b"foobar", os.urandom(100)))
    r.send(frame(b"f" * 12, b""))
    r.expect_pong(11, "unknown commands 'foobar' and 'ffffffffffff'")
    r.expect_pong(12, "a ping split over three writes", split=True)
    v = msg_version()
    v.nVersion = 70016
    r.send(frame(v.msgtype, v.serialize()))
    r.expect_pong(14, "a second version")
    # Core's test_addrv2_empty and test_addrv2_unrecognized_network: kept.
    r.send(frame(b"addrv2", compact_size(0)))
    r.expect_pong(15, "an empty addrv2")
    r.send(frame(b"addrv2", compact_size(1) + addrv2_entry(0x99, b"\x01" * 16)))
    r.expect_pong(16, "addrv2 of an unknown network (id 0x99)")
    pinger.check("kept peers")
    # Heavy but legal traffic from a third peer does not delay the pinger
    # either: 20 x getcfilters of 1,000 filters and getdata of 500 witness
    # blocks, all answered.
    heavy = connect(port, FilterClient)
    chain = json.load(open(os.path.join(data, "chain.json")))
    best = [b["hash"] for b in chain["blocks"] if b["on_best_chain"]]
    filters_json = json.load(open(os.path.join(data, "filters.json")))
    stop = h2i(filters_json[1000]["hash"])
    for _ in range(20):
        heavy.send_message(msg_getcfilters(filter_type=FILTER_TYPE_BASIC, start_height=1,
                                           stop_hash=stop))
    heavy.send_message(msg_getdata([CInv(MSG_BLOCK | MSG_WITNESS_FLAG, h2i(h)) for h in best[-500:]]))
    heavy.wait_until(lambda: len(heavy.cfilters) == 20 * 1000
                     and heavy.message_count["block"] == 500, timeout=120)
    pinger.check("heavy legal traffic")
    log("  ok: 20,000 cfilters and 500 blocks served to a third peer meanwhile")
    # 80 junk 4 MB messages, from 80 connections (each is dropped after its
    # first), four at a time: random payloads under known commands with a
    # correct checksum, so the node reads all 4,000,000 bytes before decoding.
    junk = os.urandom(MAX_PROTOCOL_MESSAGE_LENGTH)
    commands = [b"block", b"tx", b"headers", b"cfilter", b"addrv2", b"getdata", b"version",
                b"ping"]
    started = time.time()
    for batch in range(20):
        peers = []
        for k in range(4):
            i = batch * 4 + k
            cmd = commands[i % len(commands)]
            # Vary the bytes so no two messages are equal.
            payload = bytes([i]) + junk[1:]
            if cmd in (b"block", b"tx", b"headers", b"getdata", b"addrv2"):
                # A count/version that cannot parse as a full 4 MB object.
                payload = b"\xff" * 9 + payload[9:]
            r = RawPeer(port)
            peers.append((r, frame(cmd, payload)))
        threads = [threading.Thread(target=r.send_quietly, args=(m,)) for r, m in peers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        for j, (r, _) in enumerate(peers):
            r.wait_closed(f"junk 4 MB message {batch * 4 + j + 1}/80 ({commands[(batch * 4 + j) % len(commands)].decode()})")
        pinger.check("junk messages")
    log(f"  80 junk 4 MB messages handled in {time.time() - started:.1f} s")
    # The IP is discouraged now, but a new peer is still served (Core:
    # discouraged peers are accepted while inbound slots are free).
    late = connect(port)
    late.sync_with_ping()
    log("  ok: a new peer from the discouraged IP is still accepted and answered")
    rtts = pinger.finish()
    assert len(rtts) >= 10, f"only {len(rtts)} pings measured"
    p50 = rtts[len(rtts) // 2]
    p99 = rtts[min(len(rtts) - 1, int(len(rtts) * 0.99))]
    log(f"  ok: well-behaved peer: {len(rtts)} pings, rtt p50 {p50 * 1000:.1f} ms, "
        f"p99 {p99 * 1000:.1f} ms, max {rtts[-1] * 1000:.1f} ms (limit {PING_DEADLINE * 1000:.0f} ms)")
    assert rtts[-1] < PING_DEADLINE


# --------------------------------------------------------------------------
# f. a low-work header chain


REGTEST_GENESIS = "0f9188f13cb7b2c71f2a335e3a4fc328bf5beb436012afca590b1a11466e2206"
REGTEST_GENESIS_TIME = 1296688602
REGTEST_BITS = 0x207FFFFF


class LowWorkChain:
    """Regtest headers after genesis, each with its proof of work solved,
    made 2,000 at a time as the node asks for them."""

    def __init__(self):
        self.hashes = [bytes.fromhex(REGTEST_GENESIS)[::-1]]  # internal order
        self.target = uint256_from_compact(REGTEST_BITS)

    def next_message(self):
        """The next `headers` payload (2,000 headers, tx count 0 each)."""
        out = [compact_size(MAX_HEADERS_RESULTS)]
        prev = self.hashes[-1]
        height = len(self.hashes) - 1
        for _ in range(MAX_HEADERS_RESULTS):
            height += 1
            # Merkle root: any 32 bytes (no block body is ever asked for).
            head = (struct.pack("<i", 0x20000000) + prev + hash256(struct.pack("<I", height))
                    + struct.pack("<II", REGTEST_GENESIS_TIME + height, REGTEST_BITS))
            nonce = 0
            while True:
                raw = head + struct.pack("<I", nonce)
                h = hash256(raw)
                if int.from_bytes(h, "little") <= self.target:
                    break
                nonce += 1
            out.append(raw + b"\x00")
            prev = h
            self.hashes.append(h)
        return b"".join(out)


class LowWorkPeer(P2PInterface):
    """Answers each `getheaders` whose locator starts at its last header
    with the next 2,000, until `total` were sent."""

    def __init__(self, total):
        super().__init__()
        self.chain = LowWorkChain()
        self.total = total
        self.sent = 0
        self.asked_after_end = False
        self.other_getheaders = 0

    def send_next(self):
        payload = self.chain.next_message()
        self.sent += MAX_HEADERS_RESULTS
        self.send_raw_message(frame(b"headers", payload))

    def on_getheaders(self, message):
        first = message.locator.vHave[0] if message.locator.vHave else None
        if first != int.from_bytes(self.chain.hashes[-1], "little"):
            self.other_getheaders += 1
            return
        if self.sent >= self.total:
            self.asked_after_end = True
            return
        self.send_next()


def check_lowwork(port, total):
    pinger = Pinger(port)
    started = time.time()
    p = connect(port, LowWorkPeer, total=total)
    with p2p_lock:
        p.send_next()  # unsolicited: the node asks for the rest itself
    last_log = started
    while True:
        with p2p_lock:
            done = p.asked_after_end
            sent = p.sent
        if done:
            break
        assert p.is_connected, f"low-work peer disconnected after {sent:,} headers"
        pinger.check(f"low-work headers ({sent:,} sent)")
        if time.time() - last_log > 30:
            log(f"  {sent:,} headers sent, {time.time() - started:.0f} s")
            last_log = time.time()
        assert time.time() - started < 600, f"stalled at {sent:,} headers"
        time.sleep(0.05)
    elapsed = time.time() - started
    p.sync_with_ping(timeout=WAIT)
    assert p.is_connected, "low-work peer disconnected"
    rtts = pinger.finish()
    log(f"  ok: {total:,} low-work headers followed in {elapsed:.1f} s "
        f"({total / elapsed:,.0f}/s), the node asked for more after the last; "
        f"peer kept; {len(rtts)} pings meanwhile, max rtt {rtts[-1] * 1000:.1f} ms")
    log(f"  last header {p.chain.hashes[-1][::-1].hex()} at height {len(p.chain.hashes) - 1:,}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--data", required=True, help="testnet-data/regtest-a")
    ap.add_argument("--headers", type=int, default=1_000_000,
                    help="lowwork: how many headers (a multiple of 2,000)")
    ap.add_argument("check", choices=["handshake", "getblocks", "filters", "messages", "malformed",
                                      "lowwork"])
    args = ap.parse_args()
    chain = json.load(open(os.path.join(args.data, "chain.json")))
    thread = NetworkThread()
    thread.daemon = True
    thread.start()
    log(f"{args.check}: kakehi at 127.0.0.1:{args.port}")
    started = time.time()
    if args.check == "handshake":
        check_handshake(args.port, chain)
    elif args.check == "getblocks":
        check_getblocks(args.port, chain)
    elif args.check == "messages":
        check_messages(args.port, chain)
    elif args.check == "filters":
        check_filters(args.port, args.data)
    elif args.check == "lowwork":
        check_lowwork(args.port, args.headers)
    else:
        check_malformed(args.port, args.data)
    log(f"{args.check}: all checks passed in {time.time() - started:.1f} s")


if __name__ == "__main__":
    main()
