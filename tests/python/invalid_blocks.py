#!/usr/bin/env python3
"""Bitcoin Core's feature_block.py families against kakehi over P2P, with
Bitcoin Core's own validation engine (py-bitcoinkernel, libbitcoinkernel) as
the judge.

Run by tests/it/invalid_blocks.rs against a fresh regtest node:

    python invalid_blocks.py --p2p PORT --http PORT

Blocks are built with verystable.core.blocktools / messages, as Core's
test/functional/feature_block.py builds them (coinbases pay to OP_TRUE, so
nothing needs a signature), and each case is sent as blocks that would
otherwise extend the tip: a `headers` message, then the blocks on kakehi's
`getdata` (P2PDataStore), or the block itself (`send="block"`). The same
blocks go, in the same order, to Core's engine (a regtest chainstate in a
temporary directory). After each case:

- kakehi's tip (`/utxo/stats` bestblock) must be Core's;
- if the tip did not move, kakehi's MuHash must not have moved either, and
  at every tip it must equal the MuHash of the UTXO set this script tracks
  itself (verystable.core.crypto.muhash, Core's coin serialization);
- the sending peer must be treated as Core treats it (net_processing.cpp
  MaybePunishNodeForBlock for an inbound peer): disconnected and discouraged
  for CONSENSUS, MUTATED, INVALID_HEADER, INVALID_PREV and MISSING_PREV
  verdicts, kept for TIME_FUTURE and valid blocks. Discouragement is read
  from `/node/status` (peers.discouraged); every peer connects from its own
  loopback address (127.0.0.N), so each case is judged on its own.

Where kakehi differs from Core by design, the case says so and checks
kakehi's documented behaviour instead: a reorg deeper than 100 blocks is
refused (Core takes it), and a block message that does not decode
(non-canonical CompactSize) disconnects its sender without discouraging it
(Core drops the message and keeps the peer).

Exit status 0 when every case passes; the failing case is named otherwise.
Prints one line per case and a summary of case counts per family.
"""

import argparse
import copy
import json
import os
import struct
import sys
import tempfile
import time
import urllib.request
from collections import OrderedDict

import pbk
from verystable.core.blocktools import (
    add_witness_commitment,
    create_block,
    create_coinbase,
    get_legacy_sigopcount_block,
    script_BIP34_coinbase_height,
)
from verystable.core.crypto.muhash import MuHash3072
from verystable.core.messages import (
    COIN,
    COutPoint,
    CBlockHeader,
    CInv,
    CTransaction,
    CTxIn,
    CTxInWitness,
    CTxOut,
    MAX_BLOCK_WEIGHT,
    SEQUENCE_FINAL,
    msg_block,
    msg_headers,
    ser_compact_size,
    sha256,
    uint256_from_compact,
)
from verystable.core.p2p import NetworkThread, P2PDataStore, P2P_SERVICES, p2p_lock
from verystable.core.key import compute_xonly_pubkey
from verystable.core.script import (
    CScript,
    MAX_SCRIPT_ELEMENT_SIZE,
    OP_0,
    OP_1,
    OP_2DUP,
    OP_CHECKLOCKTIMEVERIFY,
    OP_CHECKMULTISIG,
    OP_CHECKMULTISIGVERIFY,
    OP_CHECKSEQUENCEVERIFY,
    OP_CHECKSIG,
    OP_CHECKSIGVERIFY,
    OP_DROP,
    OP_ELSE,
    OP_ENDIF,
    OP_EQUAL,
    OP_FALSE,
    OP_HASH160,
    OP_IF,
    OP_INVALIDOPCODE,
    OP_RETURN,
    OP_TRUE,
    OP_VERIFY,
    hash160,
    taproot_construct,
)

WAIT = 30  # seconds, upper bound of any single wait
MAX_BLOCK_SIGOPS = 20_000
# Core's MaybePunishNodeForBlock (net_processing.cpp, v28) for an inbound
# peer: these verdicts discourage the sender; CACHED_INVALID only for
# outbound peers; TIME_FUTURE and HEADER_LOW_WORK never.
PUNISHED = {"CONSENSUS", "MUTATED", "INVALID_HEADER", "INVALID_PREV", "MISSING_PREV"}


def log(*a):
    stamp = time.strftime("%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}"
    print(stamp, *a, flush=True)


def hexhash(n):
    return "%064x" % n


# --------------------------------------------------------------------------
# Core's engine, the judge


class Judge:
    """A regtest chainstate of libbitcoinkernel fed the same blocks."""

    def __init__(self):
        self.dir = tempfile.TemporaryDirectory(prefix="kakehi-judge-")
        self.events = []
        cbs = pbk.ValidationInterfaceCallbacks(block_checked=self._checked)
        self.chainman = pbk.load_chainman(self.dir.name, pbk.ChainType.REGTEST,
                                          validation_callbacks=cbs)

    def _checked(self, _user_data, block, state):
        h = bytes(block.block_hash)[::-1].hex()
        self.events.append((h, state.validation_mode.name, state.block_validation_result.name))

    def process(self, block):
        """Every verdict Core reached while processing `block` (it may
        connect or fail its stored ancestors too): a list of (block hash,
        mode, result), e.g. (h, "VALID", "UNSET"), (h, "INVALID",
        "MUTATED"). A block Core only stores, without checking it yet, has
        none."""
        self.events = []
        try:
            self.chainman.process_block(pbk.Block(block.serialize()))
        except pbk.ProcessBlockException:
            pass
        return self.events

    def tip(self):
        chain = self.chainman.get_active_chain()
        return bytes(chain.block_tree_entries[chain.height].block_hash)[::-1].hex()

    def height(self):
        return self.chainman.get_active_chain().height


# --------------------------------------------------------------------------
# kakehi


class Kakehi:
    def __init__(self, p2p_port, http_port):
        self.p2p_port = p2p_port
        self.base = f"http://127.0.0.1:{http_port}"

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=WAIT) as r:
            return json.load(r)

    def stats(self):
        return self.get("/utxo/stats")

    def discouraged(self):
        return self.get("/node/status")["peers"]["discouraged"]


class Peer(P2PDataStore):
    """P2PDataStore connecting from its own loopback address, serving
    blocks from a store shared by all the script's peers."""

    def __init__(self, src, store):
        super().__init__()
        self.src = src
        self.block_store = store

    def peer_connect(self, *, services=P2P_SERVICES, send_version=True, **kwargs):
        self.peer_connect_helper(kwargs["dstaddr"], kwargs["dstport"], kwargs["net"],
                                 kwargs["timeout_factor"])
        loop = NetworkThread.network_event_loop
        coroutine = loop.create_connection(lambda: self, host=self.dstaddr,
                                           port=self.dstport, local_addr=(self.src, 0))
        if send_version:
            self.peer_connect_send_version(services)
        return lambda: loop.call_soon_threadsafe(loop.create_task, coroutine)


# --------------------------------------------------------------------------
# the UTXO set this script tracks, and its MuHash


def unspendable(script):
    return len(script) > 0 and script[0] == OP_RETURN or len(script) > 10_000


def coin_bytes(outpoint_n, txid, height, coinbase, txout):
    return (COutPoint(txid, outpoint_n).serialize() + struct.pack("<i", height * 2 + coinbase)
            + txout.serialize())


class UtxoModel:
    """The UTXO set at every block this script built (a copy per block: the
    chains here are small), and its MuHash as Core's gettxoutsetinfo."""

    def __init__(self, genesis):
        self.state = {genesis: ({}, MuHash3072())}

    def add(self, block, height):
        if block.hashPrevBlock not in self.state:
            return  # its parent is invalid: no state
        utxos, mh = self.state[block.hashPrevBlock]
        utxos, mh = dict(utxos), copy.copy(mh)
        for i, tx in enumerate(block.vtx):
            tx.calc_sha256()
            if i > 0:
                for txin in tx.vin:
                    key = (txin.prevout.hash, txin.prevout.n)
                    data = utxos.pop(key, None)
                    if data is None:
                        return  # an invalid block: no state
                    mh.remove(data)
            for n, out in enumerate(tx.vout):
                if unspendable(out.scriptPubKey):
                    continue
                data = coin_bytes(n, tx.sha256, height, int(i == 0), out)
                utxos[(tx.sha256, n)] = data
                mh.insert(data)
        self.state[block.sha256] = (utxos, mh)

    def muhash(self, tip_hex):
        return self.state[int(tip_hex, 16)][1].digest()[::-1].hex()


# --------------------------------------------------------------------------
# blocks, as feature_block.py builds them


class Builder:
    def __init__(self, genesis):
        self.genesis = genesis
        self.heights = {genesis: 0}
        self.times = {genesis: 1296688602}
        self.blocks = {}
        self.tip = None
        self.base_time = int(time.time()) - 3_000

    def height_of(self, block):
        return self.heights[block.sha256]

    def create_tx(self, spend_tx, n, value, script=CScript([OP_TRUE])):
        tx = CTransaction()
        tx.vin.append(CTxIn(COutPoint(spend_tx.sha256, n), b"", SEQUENCE_FINAL))
        tx.vout.append(CTxOut(value, script))
        tx.rehash()
        return tx

    def next_block(self, name, spend=None, coinbase_extra=0, script=None,
                   solve=True, version=4, tag=b""):
        parent = self.genesis if self.tip is None else self.tip.sha256
        height = self.heights[parent] + 1
        block_time = max(self.times[parent] + 1, self.base_time + height)
        coinbase = create_coinbase(height)
        # The block's name in its coinbase: no two cases build the same block
        # by accident (feature_block.py's b10 equals its b6).
        tag = tag or str(name).encode()
        coinbase.vin[0].scriptSig = CScript(bytes(coinbase.vin[0].scriptSig)
                                            + bytes(CScript([tag])))
        coinbase.vout[0].nValue += coinbase_extra
        if spend is not None:
            coinbase.vout[0].nValue += spend.vout[0].nValue - 1  # all but 1 sat as fees
        coinbase.rehash()
        block = create_block(parent, coinbase, block_time, version=version)
        if spend is not None:
            # The block's name in the output too: two cases spending the same
            # coin make two different transactions.
            script = script if script is not None else CScript([tag, OP_DROP, OP_TRUE])
            block.vtx.append(self.create_tx(spend, 0, 1, script))
            block.hashMerkleRoot = block.calc_merkle_root()
        if solve:
            block.solve()
        self._record(name, block, height)
        return block

    def seal(self, name, block, solve=True):
        """Records `block` under `name` after its header was changed by
        hand (solved again unless `solve` is False)."""
        if solve:
            block.solve()
        self._record(name, block, self.heights[block.hashPrevBlock] + 1)
        return block

    def _record(self, name, block, height):
        self.tip = block
        self.heights[block.sha256] = height
        self.times[block.sha256] = block.nTime
        self.blocks[name] = block

    def update_block(self, name, new_txs, witness=False):
        block = self.blocks[name]
        height = self.heights[block.hashPrevBlock] + 1
        block.vtx.extend(new_txs)
        for tx in block.vtx:
            tx.rehash()
        if witness:
            add_witness_commitment(block)
        block.hashMerkleRoot = block.calc_merkle_root()
        block.solve()
        self._record(name, block, height)
        return block

    def move_tip(self, name):
        self.tip = self.blocks[name]


# --------------------------------------------------------------------------
# the cases


class Suite:
    def __init__(self, p2p_port, http_port, with_scripts=False):
        self.with_scripts = with_scripts
        self.node = Kakehi(p2p_port, http_port)
        self.judge = Judge()
        genesis = int(self.judge.tip(), 16)
        self.b = Builder(genesis)
        self.utxo = UtxoModel(genesis)
        self.store = {}
        self.next_ip = 2
        self.peer = None
        self.reconnect()
        self.counts = OrderedDict()
        self.failures = 0
        self.ties = 0

    def reconnect(self):
        src = f"127.0.0.{self.next_ip}"
        self.next_ip += 1
        p = Peer(src, self.store)
        p.p2p_connected_to_node = True
        p.peer_connect(dstaddr="127.0.0.1", dstport=self.node.p2p_port, net="regtest",
                       timeout_factor=1, supports_v2_p2p=False, send_version=True)()
        p.wait_for_connect(timeout=WAIT)
        p.wait_for_verack(timeout=WAIT)
        p.sync_with_ping(timeout=WAIT)
        self.peer = p

    def send(self, blocks, how):
        with p2p_lock:
            for blk in blocks:
                self.store[blk.sha256] = blk
        if how == "headers":
            self.peer.send_message(msg_headers([CBlockHeader(blk) for blk in blocks]))
        elif how == "block":
            for blk in blocks:
                self.peer.send_message(msg_block(blk))
        else:  # raw bytes of a block message
            self.peer.send_raw_message(self.peer.build_message(how))

    def wait_tip(self, want):
        deadline = time.time() + WAIT
        while time.time() < deadline:
            s = self.node.stats()
            if s["bestblock"] == want:
                return s
            time.sleep(0.05)
        return self.node.stats()

    def case(self, family, what, blocks, send="headers", *, core=None, kakehi_tip=None,
             judge=True, punished=None, valid=False):
        """Sends `blocks` and checks kakehi against Core's verdicts.

        kakehi_tip: the tip kakehi must have when it differs from Core by
        design (None: Core's). judge=False: Core's engine is not asked (the
        bytes are not a block it can parse, or the rule cannot be reached
        on its regtest); then `valid` says whether the blocks are valid and
        `punished` and `kakehi_tip` give the expected outcome. punished:
        kakehi's documented treatment when it differs from Core's (None:
        Core's)."""
        before = self.node.stats()
        verdicts = []
        for blk in blocks:
            mine = (self.judge.process(blk) if judge
                    else [(hexhash(blk.sha256), "VALID" if valid else "INVALID", "-")])
            verdicts.extend((m, r) for _, m, r in mine)
            if all(m != "INVALID" for h, m, _ in mine if h == hexhash(blk.sha256)):
                self.utxo.add(blk, self.b.heights[blk.sha256])
        core_punishes = any(m == "INVALID" and r in PUNISHED for m, r in verdicts)
        # What the case is built to be, checked against Core: a case that
        # is not what it says would test nothing.
        results = {r for m, r in verdicts if m == "INVALID"}
        intent = {
            None: True,
            "valid": self.judge.tip() == hexhash(blocks[-1].sha256),
            "invalid": bool(results - {"TIME_FUTURE", "CACHED_INVALID"}),
            "side": not results and self.judge.tip() == before["bestblock"],
            "future": results == {"TIME_FUTURE"},
            "cached": results == {"CACHED_INVALID"},
        }[core if judge else None]
        punish = core_punishes if punished is None else punished
        want_tip = kakehi_tip if kakehi_tip is not None else self.judge.tip()
        src = self.peer.src
        self.send(blocks, send)
        if punish or send not in ("headers", "block"):
            # kakehi disconnects after the block's outcome is published:
            # the state read next is final.
            try:
                self.peer.wait_for_disconnect(timeout=WAIT)
            except AssertionError:
                pass
            after = self.node.stats()
        else:
            self.peer.sync_with_ping(timeout=WAIT)
            after = self.wait_tip(want_tip)
        if self.peer.is_connected:
            self.peer.sync_with_ping(timeout=WAIT)
            after = self.node.stats()
        problems = [] if intent else [f"not {core} for Core ({sorted(results) or 'no verdict'})"]
        # Equal work (equal height on regtest): consensus leaves the choice
        # open. Core keeps the block whose data arrived first; kakehi
        # downloads only the most-work header chain, so after a failed
        # reorg it may return to the other of two valid equal-work tips.
        tie = (after["bestblock"] != want_tip and kakehi_tip is None
               and after["height"] == self.judge.height()
               and int(after["bestblock"], 16) in self.utxo.state)
        if tie:
            self.ties += 1
        elif after["bestblock"] != want_tip:
            problems.append(f"tip {after['bestblock'][:16]}…, want {want_tip[:16]}…")
        if after["bestblock"] == before["bestblock"] and after["muhash"] != before["muhash"]:
            problems.append("tip unchanged but the MuHash moved")
        model = self.utxo.muhash(after["bestblock"]) if int(after["bestblock"], 16) in self.utxo.state else None
        if model is not None and after["muhash"] != model:
            problems.append(f"MuHash {after['muhash'][:16]}… is not the UTXO set's {model[:16]}…")
        discouraged = src in self.node.discouraged()
        if discouraged != punish:
            problems.append(f"peer discouraged: {discouraged}, want {punish}")
        disconnected = not self.peer.is_connected
        if disconnected != (punish or send not in ("headers", "block")):
            problems.append(f"peer disconnected: {disconnected}")
        verdict = ", ".join(sorted({r if m == "INVALID" else "valid" for m, r in verdicts})) or "-"
        status = ("ok" if not tie else "ok (an equal-work tip: a tie)") if not problems else (
            "FAIL: " + "; ".join(problems))
        log(f"  {status}: [{family}] {what} (Core: {verdict}; "
            f"{'discouraged' if discouraged else 'kept' if not disconnected else 'disconnected'})")
        self.counts[family] = self.counts.get(family, 0) + 1
        if problems:
            self.failures += 1
        if disconnected:
            self.reconnect()

    # ----------------------------------------------------------------------

    def run(self):
        b = self.b
        # 150 blocks: out[k] (height k + 1) is mature from height k + 101,
        # so every case can spend a fresh one without counting heights.
        log("setup: 150 blocks so that coinbases mature")
        blocks = [b.next_block(f"m{i}") for i in range(150)]
        self.case("setup", "150 blocks to mature the first coinbases", blocks)
        self.out = [blk.vtx[0] for blk in blocks]
        self.coinbase_and_forks()
        self.pow_and_time()
        self.limits()
        self.merkle_and_duplicates()
        self.spends()
        self.values()
        self.bip30_and_locks()
        self.witness()
        self.encoding()
        if self.with_scripts:
            self.scripts()
        self.reorgs()
        log("cases per family: " + ", ".join(f"{k} {v}" for k, v in self.counts.items()))
        total = sum(v for k, v in self.counts.items() if k != "setup")
        log(f"{total} cases, {self.failures} failed, {self.ties} equal-work ties")
        return self.failures == 0

    # ----------------------------------------------------------------------
    # families (block names follow feature_block.py where it has the case)

    def coinbase_and_forks(self):
        b, out, case = self.b, self.out, self.case
        b1 = b.next_block(1, spend=out[0])
        b2 = b.next_block(2, spend=out[1])
        case("forks", "two blocks extend the tip", [b1, b2], core="valid")
        b.move_tip(1)
        b3 = b.next_block(3, spend=out[1])
        self.txout_b3 = b3.vtx[1]
        case("forks", "a fork of equal work does not reorg", [b3], core="side")
        b4 = b.next_block(4, spend=out[2])
        case("forks", "a longer fork reorgs", [b4], core="valid")
        b.move_tip(2)
        b5 = b.next_block(5, spend=out[2])
        case("forks", "equal work again", [b5], core="side")
        b6 = b.next_block(6, spend=out[3])
        case("forks", "back to the first chain", [b6], core="valid")
        b.move_tip(5)
        b7 = b.next_block(7, spend=out[2])
        case("spends", "a fork block double-spending its own chain (not yet connected)", [b7], core="side")
        b8 = b.next_block(8, spend=out[4])
        case("spends", "the longer chain with that double spend is refused", [b8], core="invalid")
        b.move_tip(6)
        b9 = b.next_block(9, spend=out[4], coinbase_extra=1)
        case("coinbase", "coinbase 1 sat above subsidy + fees (bad-cb-amount)", [b9], core="invalid")
        case("coinbase", "the same invalid block announced again (Core: cached invalid, an inbound "
             "peer is not punished)", [b9], core="cached")
        case("coinbase", "the same invalid block sent again unrequested", [b9], "block", core="cached")
        b.move_tip(5)
        b10 = b.next_block(10, spend=out[3])
        case("forks", "a fork of equal work", [b10], core="side")
        b11 = b.next_block(11, spend=out[4], coinbase_extra=1)
        case("coinbase", "excess coinbase on a longer fork", [b11], core="invalid")
        b.move_tip(5)
        b12 = b.next_block(12, spend=out[3])
        b13 = b.next_block(13, spend=out[4])
        b14 = b.next_block(14, spend=out[5], coinbase_extra=1)
        case("coinbase", "excess coinbase ending a 3-block fork: tip stops at its parent",
             [b12, b13, b14], core="invalid")
        # BIP34 and the coinbase scriptSig.
        b.move_tip(13)
        bad_height = b.next_block("h1", spend=out[5])
        bad_height.vtx[0].vin[0].scriptSig = script_BIP34_coinbase_height(b.height_of(bad_height) + 1)
        bad_height = b.update_block("h1", [])
        case("coinbase", "BIP34: coinbase encodes the wrong height (bad-cb-height)", [bad_height], core="invalid")
        b.move_tip(13)
        no_height = b.next_block("h2", spend=out[5])
        no_height.vtx[0].vin[0].scriptSig = b"\x51\x51"
        no_height = b.update_block("h2", [])
        case("coinbase", "BIP34: coinbase without its height (bad-cb-height)", [no_height], core="invalid")
        for name, size in (("cb1", 1), ("cb101", 101)):
            b.move_tip(13)
            blk = b.next_block(name, spend=out[5])
            sig = bytes(blk.vtx[0].vin[0].scriptSig)
            blk.vtx[0].vin[0].scriptSig = (sig + b"\x00" * size)[:size]
            blk = b.update_block(name, [])
            case("coinbase", f"coinbase scriptSig of {size} bytes (bad-cb-length)", [blk], core="invalid")
        b.move_tip(13)
        cb100 = b.next_block("cb100", spend=out[5])
        sig = bytes(cb100.vtx[0].vin[0].scriptSig)
        cb100.vtx[0].vin[0].scriptSig = sig + b"\x00" * (100 - len(sig))
        cb100 = b.update_block("cb100", [])
        case("coinbase", "coinbase scriptSig of 100 bytes is accepted", [cb100], core="valid")
        # Missing, two, none.
        parent = b.tip
        nb = b.next_block("nocb", solve=False)
        nb.vtx = [b.create_tx(out[6], 0, 1)]
        nb.hashMerkleRoot = nb.calc_merkle_root()
        b.seal("nocb", nb)
        case("coinbase", "first transaction is not a coinbase (bad-cb-missing)", [nb], core="invalid")
        b.move_tip("cb100")
        two = b.next_block("twocb")
        two = b.update_block("twocb", [create_coinbase(b.height_of(two))])
        case("coinbase", "two coinbases (bad-cb-multiple)", [two], core="invalid")
        b.move_tip("cb100")
        empty = b.next_block("notx", solve=False)
        empty.vtx = []
        empty.hashMerkleRoot = 0
        b.seal("notx", empty)
        case("coinbase", "a block without transactions (bad-blk-length)", [empty], core="invalid")
        b.move_tip("cb100")

    def pow_and_time(self):
        b, out, case = self.b, self.out, self.case
        base = b.tip
        b47 = b.next_block(47, solve=False)
        target = uint256_from_compact(b47.nBits)
        while b47.sha256 < target:
            b47.nNonce += 1
            b47.rehash()
        b.seal(47, b47, solve=False)
        case("pow-time", "proof of work above the target (high-hash)", [b47], "block", core="invalid")
        b.tip = base
        b50 = b.next_block(50)
        b50.nBits -= 1
        b.seal(50, b50)
        case("pow-time", "nBits not the required difficulty (bad-diffbits)", [b50], "block", core="invalid")
        b.tip = base
        b48 = b.next_block(48, solve=False)
        b48.nTime = int(time.time()) + 2 * 3600 + 10
        b.seal(48, b48)
        case("pow-time", "timestamp more than 2 h ahead (time-too-new): refused, not punished",
             [b48], "block", core="future")
        wait = b48.nTime - 2 * 3600 - time.time() + 1.5
        log(f"  (waiting {wait:.1f} s for the clock to reach it)")
        time.sleep(max(0.0, wait))
        case("pow-time", "the same block once the clock has caught up is accepted", [b48], "block", core="valid")
        mtp = self.mtp_of(b48)
        for name, t, what in ((54, mtp, "timestamp equal to the median time past (time-too-old)"),
                              ("54b", mtp - 1, "timestamp below the median time past (time-too-old)")):
            b.move_tip(48)
            blk = b.next_block(name, solve=False)
            blk.nTime = t
            b.seal(name, blk)
            case("pow-time", what, [blk], "block", core="invalid")
        b.move_tip(48)
        b55 = b.next_block(55, spend=out[6], solve=False)
        b55.nTime = mtp + 1
        b.seal(55, b55)
        case("pow-time", "timestamp one second above the median time past is accepted", [b55], core="valid")

    def limits(self):
        b, out, case = self.b, self.out, self.case
        # (name, parent, spend, script, sigops, accepted); CHECKMULTISIG
        # counts 20.
        multisig = MAX_BLOCK_SIGOPS // 20
        for name, parent, spend, script, n, ok in (
            (15, 55, 7, [OP_CHECKSIG] * MAX_BLOCK_SIGOPS, MAX_BLOCK_SIGOPS, True),
            (16, 15, 8, [OP_CHECKSIG] * (MAX_BLOCK_SIGOPS + 1), MAX_BLOCK_SIGOPS + 1, False),
            (35, 15, 8, [OP_CHECKSIGVERIFY] * MAX_BLOCK_SIGOPS, MAX_BLOCK_SIGOPS, True),
            (36, 35, 9, [OP_CHECKSIGVERIFY] * (MAX_BLOCK_SIGOPS + 1), MAX_BLOCK_SIGOPS + 1, False),
            (31, 35, 9, [OP_CHECKMULTISIG] * multisig, MAX_BLOCK_SIGOPS, True),
            (32, 31, 10, [OP_CHECKMULTISIG] * multisig + [OP_CHECKSIG], MAX_BLOCK_SIGOPS + 1, False),
            (33, 31, 10, [OP_CHECKMULTISIGVERIFY] * multisig, MAX_BLOCK_SIGOPS, True),
            (34, 33, 11, [OP_CHECKMULTISIGVERIFY] * multisig + [OP_CHECKSIG], MAX_BLOCK_SIGOPS + 1,
             False),
        ):
            b.move_tip(parent)
            blk = b.next_block(name, spend=out[spend], script=CScript(script))
            assert get_legacy_sigopcount_block(blk) == n
            case("limits", f"{n:,} legacy sigops ({script[0]})"
                 + ("" if ok else " (bad-blk-sigops)"), [blk], core="valid" if ok else "invalid")
        # Sigops around a large script element (feature_block b73-b76).
        b.move_tip(33)
        # (feature_block's coinbase pays to a key: one sigop more than ours.)
        size = MAX_BLOCK_SIGOPS - 1 + MAX_SCRIPT_ELEMENT_SIZE + 1 + 5 + 2
        a = bytearray([OP_CHECKSIG] * size)
        a[MAX_BLOCK_SIGOPS - 1] = 0x4E
        element = MAX_SCRIPT_ELEMENT_SIZE + 1
        a[MAX_BLOCK_SIGOPS:MAX_BLOCK_SIGOPS + 4] = element.to_bytes(4, "little")
        blk = b.next_block(73, spend=out[11], script=CScript(bytes(a)))
        assert get_legacy_sigopcount_block(blk) == MAX_BLOCK_SIGOPS + 1
        case("limits", "a sigop after a 521-byte push is counted (bad-blk-sigops)", [blk], core="invalid")
        b.move_tip(33)
        size = MAX_BLOCK_SIGOPS - 1 + MAX_SCRIPT_ELEMENT_SIZE + 42
        a = bytearray([OP_CHECKSIG] * (size + 1))
        a[MAX_BLOCK_SIGOPS + 1] = 0x4E
        a[MAX_BLOCK_SIGOPS + 2:MAX_BLOCK_SIGOPS + 6] = b"\xfe\xff\xff\xff"
        blk = b.next_block(74, spend=out[11], script=CScript(bytes(a)))
        case("limits", "sigops before a truncated push are counted (bad-blk-sigops)", [blk], core="invalid")
        b.move_tip(33)
        a = bytearray([OP_CHECKSIG] * size)
        a[MAX_BLOCK_SIGOPS - 1] = 0x4E
        a[MAX_BLOCK_SIGOPS:MAX_BLOCK_SIGOPS + 4] = b"\xff\xff\xff\xff"
        blk = b.next_block(75, spend=out[11], script=CScript(bytes(a)))
        case("limits", "sigops inside a truncated push are not counted", [blk], core="valid")
        size = MAX_BLOCK_SIGOPS - 1 + MAX_SCRIPT_ELEMENT_SIZE + 1 + 5
        a = bytearray([OP_CHECKSIG] * size)
        a[MAX_BLOCK_SIGOPS - 1] = 0x4E
        blk = b.next_block(76, spend=out[12], script=CScript(bytes(a)))
        case("limits", "CHECKSIG bytes pushed as data are not counted", [blk], core="valid")
        self.p2sh_sigops()
        self.size_and_weight()

    def p2sh_sigops(self):
        """P2SH sigops: redeem scripts whose CHECKMULTISIG (20 sigops each,
        counted though never run) sits in a branch not taken, so that no
        signature is needed."""
        b, out, case = self.b, self.out, self.case
        redeem = CScript([OP_0, OP_IF, OP_CHECKMULTISIG, OP_ENDIF, OP_1])
        p2sh = CScript([OP_HASH160, hash160(redeem), OP_EQUAL])
        n = MAX_BLOCK_SIGOPS // 20
        b39 = b.next_block(39)
        fund = CTransaction()
        fund.vin.append(CTxIn(COutPoint(out[13].sha256, 0), b"", SEQUENCE_FINAL))
        fund.vout = [CTxOut(1000, p2sh) for _ in range(n)]
        b39 = b.update_block(39, [fund])
        case("limits", f"a block creating {n:,} P2SH outputs of 20 sigops each", [b39], core="valid")
        for name, extra, ok in ((40, 1, False), (41, 0, True)):
            b.move_tip(39)
            blk = b.next_block(name)
            tx = CTransaction()
            tx.vin = [CTxIn(COutPoint(fund.sha256, i), CScript([redeem]), SEQUENCE_FINAL)
                      for i in range(n)]
            tx.vout = [CTxOut(1000, CScript([OP_CHECKSIG] * extra + [OP_TRUE]))]
            blk = b.update_block(name, [tx])
            what = (f"{n:,} P2SH spends = 20,000 sigops" + (" + 1 legacy (bad-blk-sigops)" if extra
                                                           else ", at the limit"))
            case("limits", what, [blk], core="invalid" if extra else "valid")

    def size_and_weight(self):
        b, out, case = self.b, self.out, self.case
        for name, parent, spend, extra in ((23, 41, 14, 0), (24, 23, 15, 1)):
            b.move_tip(parent)
            blk = b.next_block(name, spend=out[spend])
            tx = CTransaction()
            script_length = 1_000_000 - len(blk.serialize()) - 69
            tx.vout.append(CTxOut(0, CScript([b"\x00" * (script_length + extra)])))
            tx.vin.append(CTxIn(COutPoint(blk.vtx[1].sha256, 0)))
            blk = b.update_block(name, [tx])
            assert len(blk.serialize()) == 1_000_000 + extra, len(blk.serialize())
            case("limits", f"a block of {1_000_000 + extra:,} bytes"
                 + (" (bad-blk-length)" if extra else ", the size limit"), [blk],
                 core="invalid" if extra else "valid")
        # Weight: witness bytes count once, base bytes four times. A
        # taproot script-path spend (tapscript OP_TRUE) carries the
        # padding in its annex, which consensus leaves unlimited.
        internal = compute_xonly_pubkey(b"\x01" * 32)[0]
        info = taproot_construct(internal, [("t", CScript([OP_TRUE]))])
        leaf = info.leaves["t"]
        control = bytes([leaf.version + info.negflag]) + info.internal_pubkey + leaf.merklebranch

        def padded(name, parent, spend, k):
            b.move_tip(parent)
            blk = b.next_block(name)
            fund = b.create_tx(out[spend], 0, 10_000, info.scriptPubKey)
            spend = CTransaction()
            spend.vin.append(CTxIn(COutPoint(fund.sha256, 0), b"", SEQUENCE_FINAL))
            spend.vout.append(CTxOut(9_000, CScript([OP_TRUE])))
            spend.wit.vtxinwit = [CTxInWitness()]
            spend.wit.vtxinwit[0].scriptWitness.stack = [bytes(leaf.script), control,
                                                         b"\x50" + b"\x00" * k]
            return b.update_block(name, [fund, spend], witness=True)

        for name, parent, spend, extra in (("w0", 23, 15, 0), ("w1", "w0", 16, 1)):
            want = MAX_BLOCK_WEIGHT + extra
            k = 0
            for _ in range(4):
                blk = padded(name, parent, spend, k)
                k += want - blk.get_weight()
            assert blk.get_weight() == want, blk.get_weight()
            case("limits", f"block weight {want:,}"
                 + (" (bad-blk-weight)" if extra else ", the weight limit"), [blk],
                 core="invalid" if extra else "valid")
        b.move_tip("w0")

    def merkle_and_duplicates(self):
        b, out, case = self.b, self.out, self.case
        b.move_tip("w0")
        b49 = b.next_block(49)
        b49.hashMerkleRoot += 1
        b.seal(49, b49)
        case("merkle", "merkle root does not match the transactions (bad-txnmrklroot)", [b49], core="invalid")
        # CVE-2012-2459: b57 has 3 transactions (the last one hashed twice
        # in the tree); b56 repeats it: same merkle root, same block hash.
        b.move_tip("w0")
        b57 = b.next_block(57)
        tx = b.create_tx(out[16], 0, out[16].vout[0].nValue - 1_000)
        tx1 = b.create_tx(tx, 0, 1)
        b57 = b.update_block(57, [tx, tx1])
        b56 = copy.deepcopy(b57)
        b56.vtx.append(tx1)
        assert b56.calc_merkle_root() == b57.hashMerkleRoot and b56.sha256 == b57.sha256
        case("merkle", "CVE-2012-2459: last transaction repeated, same merkle root (bad-txns-duplicate)",
             [b56], "block", core="invalid")
        # b57p2: 6 transactions; b56p2 repeats two non-adjacent ones.
        b.move_tip("w0")
        b57p2 = b.next_block("57p2")
        txs = [b.create_tx(out[16], 0, out[16].vout[0].nValue - 1_000)]
        for _ in range(4):
            txs.append(b.create_tx(txs[-1], 0, 1))
        b57p2 = b.update_block("57p2", txs)
        b56p2 = copy.deepcopy(b57p2)
        b56p2.vtx.extend(txs[3:5])
        assert b56p2.calc_merkle_root() == b57p2.hashMerkleRoot
        case("merkle", "CVE-2012-2459: two transactions repeated, same merkle root (bad-txns-duplicate)",
             [b56p2], "block", core="invalid")
        case("merkle", "the valid twin of the mutated block, same hash, is accepted", [b57p2],
             "block", core="valid")
        case("merkle", "the other valid twin (3 transactions) does not reorg: equal work", [b57],
             "block", core="side")
        # A transaction twice, not at a malleable position (bad-txns-duplicate).
        b.move_tip("57p2")
        b52 = b.next_block(52, spend=out[17])
        dup = b.create_tx(b52.vtx[1], 0, 1)
        b52 = b.update_block(52, [dup, dup])
        case("merkle", "the same transaction twice (bad-txns-duplicate)", [b52], core="invalid")
        # b71/b72: a valid block, and a copy with a transaction re-added.
        b.move_tip("57p2")
        b72 = b.next_block(72)
        t1 = b.create_tx(out[17], 0, 2)
        t2 = b.create_tx(t1, 0, 1)
        b72 = b.update_block(72, [t1, t2])
        b71 = copy.deepcopy(b72)
        b71.vtx.append(t2)
        assert b71.sha256 == b72.sha256
        case("merkle", "a copy with a transaction re-added, same hash (bad-txns-duplicate)", [b71],
             "block", core="invalid")
        case("merkle", "then the valid original is accepted", [b72], "block", core="valid")

    def spends(self):
        b, out, case = self.b, self.out, self.case
        b.move_tip(72)
        b17 = b.next_block(17, spend=self.txout_b3)
        case("spends", "spending a transaction of a reorged-out block (bad-txns-inputs-missingorspent)",
             [b17], core="invalid")
        b.move_tip(72)
        b18 = b.next_block(18, spend=self.txout_b3)
        b19 = b.next_block(19, spend=out[18])
        case("spends", "the same on a longer fork", [b18, b19], core="invalid")
        b.move_tip(72)
        tip_h = b.height_of(b.blocks[72])
        young = out[tip_h + 1 - 100]  # 99 confirmations at the next height
        b20 = b.next_block(20, spend=young)
        case("spends", "a coinbase spent after 99 blocks (bad-txns-premature-spend-of-coinbase)",
             [b20], core="invalid")
        b.move_tip(57)
        b21 = b.next_block(21, spend=out[18])
        b22 = b.next_block(22, spend=out[b.height_of(b.blocks[57]) + 2 - 100])
        case("spends", "an immature coinbase spent on a longer fork", [b21, b22], core="invalid")
        # A block whose connection fails, then a block spending its tx.
        b.move_tip(72)
        b37 = b.next_block(37, spend=out[18])
        txout_b37 = b37.vtx[1]
        b37 = b.update_block(37, [b.create_tx(out[18], 0, 0)])
        case("spends", "a block spending one output twice in two transactions", [b37], core="invalid")
        b.move_tip(72)
        b38 = b.next_block(38, spend=txout_b37)
        case("spends", "spending a transaction of the block that failed", [b38], core="invalid")
        # prevout.n out of range.
        b.move_tip(72)
        b58 = b.next_block(58, spend=out[18])
        tx = CTransaction()
        tx.vin.append(CTxIn(COutPoint(out[18].sha256, 42), CScript([OP_TRUE]), SEQUENCE_FINAL))
        tx.vout.append(CTxOut(0, b""))
        b58 = b.update_block(58, [tx])
        case("spends", "prevout.n out of range (bad-txns-inputs-missingorspent)", [b58])
        # Outputs of the same block: earlier is fine, later is not.
        b.move_tip(72)
        b65 = b.next_block(65)
        t1 = b.create_tx(out[18], 0, out[18].vout[0].nValue)
        t2 = b.create_tx(t1, 0, 0)
        b65 = b.update_block(65, [t1, t2])
        case("spends", "spending an output created earlier in the same block", [b65], core="valid")
        b66 = b.next_block(66)
        t1 = b.create_tx(out[19], 0, out[19].vout[0].nValue)
        t2 = b.create_tx(t1, 0, 1)
        b66 = b.update_block(66, [t2, t1])
        case("spends", "spending an output created later in the same block (a future transaction)",
             [b66], core="invalid")
        b.move_tip(65)
        b67 = b.next_block(67)
        t1 = b.create_tx(out[19], 0, out[19].vout[0].nValue)
        t2 = b.create_tx(t1, 0, 1)
        t3 = b.create_tx(t1, 0, 2)
        b67 = b.update_block(67, [t1, t2, t3])
        case("spends", "double spend inside one block", [b67], core="invalid")
        # Nonexistent input.
        b.move_tip(65)
        b70 = b.next_block(70, spend=out[19])
        tx = CTransaction()
        tx.vin.append(CTxIn(COutPoint(0x23C70ED7C0506E9178FC1A987F40A33946D4AD4C962B5AE3A52546DA53AF0C5C, 0),
                            b"", SEQUENCE_FINAL))
        tx.vout.append(CTxOut(1, b""))
        b70 = b.update_block(70, [tx])
        case("spends", "spending a transaction that never existed", [b70], core="invalid")
        # CVE-2018-17144: one outpoint twice in one transaction.
        for name, factor, what in (("dup", 1, "the same input twice in one transaction "
                                               "(CVE-2018-17144, bad-txns-inputs-duplicate)"),
                                   ("inflate", 2, "the same input twice paying out both "
                                                  "(CVE-2018-17144 inflation)")):
            b.move_tip(65)
            blk = b.next_block(name)
            coin = out[19]
            tx = CTransaction()
            tx.vin = [CTxIn(COutPoint(coin.sha256, 0), b"", SEQUENCE_FINAL)] * 2
            tx.vout = [CTxOut(coin.vout[0].nValue * factor - 1_000, CScript([OP_TRUE]))]
            blk = b.update_block(name, [tx])
            case("spends", what, [blk], core="invalid")
        # Spending an OP_RETURN output (never in the UTXO set).
        b.move_tip(65)
        b84 = b.next_block(84)
        t1 = b.create_tx(out[19], 0, 0, CScript([OP_RETURN]))
        t1.vout.append(CTxOut(1, CScript([OP_TRUE])))
        t1.rehash()
        b84 = b.update_block(84, [t1])
        case("spends", "a block with OP_RETURN outputs", [b84], core="valid")
        b89 = b.next_block("89a")
        b89 = b.update_block("89a", [b.create_tx(t1, 0, 0)])
        case("spends", "spending an OP_RETURN output (bad-txns-inputs-missingorspent)", [b89], core="invalid")
        b.move_tip(84)

    def values(self):
        b, out, case = self.b, self.out, self.case
        MAX_MONEY = 21_000_000 * COIN
        coin = out[20]
        for name, values, what in (
            (59, [coin.vout[0].nValue + 1], "outputs above the inputs (bad-txns-in-belowout)"),
            ("neg", [-1], "a negative output (bad-txns-vout-negative)"),
            ("big", [MAX_MONEY + 1], "an output above 21M BTC (bad-txns-vout-toolarge)"),
            ("sum", [MAX_MONEY, 1], "outputs summing above 21M BTC (bad-txns-txouttotal-toolarge)"),
        ):
            b.move_tip(84)
            blk = b.next_block(name)
            tx = CTransaction()
            tx.vin.append(CTxIn(COutPoint(coin.sha256, 0), b"", SEQUENCE_FINAL))
            tx.vout = [CTxOut(v, CScript([OP_TRUE])) for v in values]
            blk = b.update_block(name, [tx])
            case("values", what, [blk], core="invalid")
        # Subsidy: a coinbase may claim exactly the fees.
        b.move_tip(84)
        b68 = b.next_block(68, coinbase_extra=10)
        b68 = b.update_block(68, [b.create_tx(coin, 0, coin.vout[0].nValue - 9)])
        case("values", "coinbase claims 1 sat more than the fees (bad-cb-amount)", [b68], core="invalid")
        b.move_tip(84)
        b69 = b.next_block(69, coinbase_extra=10)
        b69 = b.update_block(69, [b.create_tx(coin, 0, coin.vout[0].nValue - 10)])
        case("values", "coinbase claims exactly the fees", [b69], core="valid")

    def mtp_of(self, block):
        times, h = [], block.sha256
        by_hash = {blk.sha256: blk for blk in self.b.blocks.values()}
        for _ in range(11):
            if h not in self.b.times:
                break
            times.append(self.b.times[h])
            h = by_hash[h].hashPrevBlock if h in by_hash else None
        return sorted(times)[len(times) // 2]

    def bip30_and_locks(self):
        """Finality (nLockTime, BIP113's median time past) and BIP68
        relative locks. BIP30 cannot be reached on regtest (BIP34 from
        height 1 makes every txid unique): tests/it/invalid_blocks.rs checks
        it on a node whose BIP34 never activates (check `bip30`)."""
        b, out, case = self.b, self.out, self.case
        b.move_tip(69)
        parent = b.blocks[69]
        height = b.height_of(parent) + 1
        mtp = self.mtp_of(parent)
        for name, locktime, what in (
            (62, 0xFFFFFFFF, "nLockTime 0xffffffff with a non-final sequence (bad-txns-nonfinal)"),
            ("lt-h", height, "nLockTime equal to the block height (bad-txns-nonfinal)"),
            ("lt-t", mtp, "BIP113: nLockTime equal to the median time past (bad-txns-nonfinal)"),
        ):
            b.move_tip(69)
            blk = b.next_block(name)
            tx = CTransaction()
            tx.nLockTime = locktime
            tx.vin.append(CTxIn(COutPoint(out[21].sha256, 0), b"", 0xFFFFFFFE))
            tx.vout.append(CTxOut(1, CScript([OP_TRUE])))
            blk = b.update_block(name, [tx])
            case("bip68-113", what, [blk], core="invalid")
        b.move_tip(69)
        b63 = b.next_block(63)
        b63.vtx[0].nLockTime = 0xFFFFFFFF
        b63.vtx[0].vin[0].nSequence = 0xDEADBEEF
        b63 = b.update_block(63, [])
        case("bip68-113", "a non-final coinbase (bad-txns-nonfinal)", [b63], core="invalid")
        b.move_tip(69)
        ok = b.next_block("lt-ok")
        tx = CTransaction()
        tx.nLockTime = mtp - 1
        tx.vin.append(CTxIn(COutPoint(out[21].sha256, 0), b"", 0xFFFFFFFE))
        tx.vout.append(CTxOut(1, CScript([OP_TRUE])))
        ok = b.update_block("lt-ok", [tx])
        case("bip68-113", "BIP113: nLockTime one second below the median time past is final", [ok], core="valid")
        # BIP68: a version-2 transaction's input sequence is a relative
        # lock (blocks, or 512-second units with bit 22).
        coin = out[22]
        conf = b.height_of(ok) + 1 - (22 + 1)
        for name, seq, final, what in (
            ("rl-h", conf + 1, False, f"BIP68: {conf + 1}-block relative lock after {conf} blocks"),
            ("rl-t", (1 << 22) | 0xFFFF, False, "BIP68: a time lock of 0xffff × 512 s"),
            ("rl-ok", conf, True, f"BIP68: {conf}-block relative lock after {conf} blocks"),
        ):
            b.move_tip("lt-ok")
            blk = b.next_block(name)
            tx = CTransaction()
            tx.version = 2
            tx.vin.append(CTxIn(COutPoint(coin.sha256, 0), b"", seq))
            tx.vout.append(CTxOut(1, CScript([OP_TRUE])))
            blk = b.update_block(name, [tx])
            case("bip68-113", what + ("" if final else " (bad-txns-nonfinal)"), [blk],
                 core="valid" if final else "invalid")

    def witness(self):
        b, out, case = self.b, self.out, self.case
        witness_script = CScript([OP_TRUE])
        program = CScript([OP_0, sha256(witness_script)])
        b.move_tip("rl-ok")
        fund_blk = b.next_block("wfund")
        fund = b.create_tx(out[23], 0, out[23].vout[0].nValue - 1_000, program)
        fund.vout.append(CTxOut(1_000, program))
        fund.rehash()
        fund_blk = b.update_block("wfund", [fund])
        case("witness", "a block creating P2WSH outputs (no witness yet, no commitment needed)",
             [fund_blk], core="valid")

        def spend(n):
            tx = CTransaction()
            tx.vin.append(CTxIn(COutPoint(fund.sha256, n), b"", SEQUENCE_FINAL))
            tx.vout.append(CTxOut(500, CScript([OP_TRUE])))
            tx.wit.vtxinwit = [CTxInWitness()]
            tx.wit.vtxinwit[0].scriptWitness.stack = [bytes(witness_script)]
            tx.rehash()
            return tx

        cases = []
        blk = b.next_block("nocommit")
        blk = b.update_block("nocommit", [spend(1)])
        cases.append((blk, "witness data without a commitment (unexpected-witness)"))
        b.move_tip("wfund")
        blk = b.next_block("badcommit")
        blk = b.update_block("badcommit", [spend(1)], witness=True)
        script = bytearray(blk.vtx[0].vout[-1].scriptPubKey)
        script[-1] ^= 1
        blk.vtx[0].vout[-1].scriptPubKey = CScript(bytes(script))
        blk.vtx[0].rehash()
        blk.hashMerkleRoot = blk.calc_merkle_root()
        b.seal("badcommit", blk)
        cases.append((blk, "a wrong witness commitment (bad-witness-merkle-match)"))
        for name, nonce, what in (("nononce", None, "a commitment without the coinbase's witness "
                                                    "nonce (bad-witness-nonce-size)"),
                                  ("longnonce", b"\x00" * 33, "a 33-byte witness nonce "
                                                              "(bad-witness-nonce-size)")):
            b.move_tip("wfund")
            blk = b.next_block(name)
            blk = b.update_block(name, [spend(1)], witness=True)
            blk.vtx[0].wit.vtxinwit[0].scriptWitness.stack = [] if nonce is None else [nonce]
            b.seal(name, blk)
            cases.append((blk, what))
        for blk, what in cases:
            case("witness", what, [blk], "block", core="invalid")
        b.move_tip("wfund")
        good = b.next_block("wgood")
        good = b.update_block("wgood", [spend(1)], witness=True)
        case("witness", "a P2WSH spend with its commitment is accepted", [good], core="valid")
        empty = b.next_block("wempty")
        empty = b.update_block("wempty", [], witness=True)
        case("witness", "a commitment with no witness data in the block is accepted", [empty], core="valid")

    def encoding(self):
        b, out, case = self.b, self.out, self.case
        b.move_tip("wempty")
        blk = b.next_block("64", spend=out[24])

        class BloatedBlock:
            msgtype = b"block"

            def serialize(self):
                # The transaction count as a 9-byte CompactSize (0xff + u64).
                return (CBlockHeader(blk).serialize() + b"\xff" + struct.pack("<Q", len(blk.vtx))
                        + b"".join(tx.serialize_with_witness() for tx in blk.vtx))

        case("encoding", "a block whose transaction count is a non-canonical CompactSize: "
             "disconnected, not discouraged (Core: message dropped, peer kept)", [blk],
             BloatedBlock(), judge=False, kakehi_tip=b.blocks["wempty"].hash, punished=False)
        case("encoding", "its canonical twin (same hash) is then accepted", [blk], "block", core="valid")

    def scripts(self):
        """Script families (kakehi runs Core's interpreter): outputs made
        in one block, then spent one way or another."""
        b, out, case = self.b, self.out, self.case
        b.move_tip("64")
        redeem_false = CScript([OP_0])
        redeem_true = CScript([OP_TRUE])
        wscript = CScript([OP_TRUE])
        tip_h = b.height_of(b.blocks["64"])
        cltv_h = tip_h + 3
        scripts = OrderedDict([
            ("eq2", CScript([2, OP_EQUAL])),
            ("dead", CScript([OP_IF, OP_INVALIDOPCODE, OP_ELSE, OP_TRUE, OP_ENDIF])),
            ("ret", CScript([OP_IF, OP_RETURN, OP_ENDIF, OP_TRUE])),
            ("p2sh-false", CScript([OP_HASH160, hash160(redeem_false), OP_EQUAL])),
            ("p2sh-true", CScript([OP_HASH160, hash160(redeem_true), OP_EQUAL])),
            ("p2wsh", CScript([OP_0, sha256(wscript)])),
            ("cltv", CScript([cltv_h, OP_CHECKLOCKTIMEVERIFY, OP_DROP, OP_TRUE])),
            ("csv", CScript([2, OP_CHECKSEQUENCEVERIFY, OP_DROP, OP_TRUE])),
        ])
        fund_blk = b.next_block("sfund")
        fund = CTransaction()
        fund.vin.append(CTxIn(COutPoint(out[25].sha256, 0), b"", SEQUENCE_FINAL))
        fund.vout = [CTxOut(10_000, s) for s in scripts.values()]
        fund_blk = b.update_block("sfund", [fund])
        case("scripts", "a block creating outputs for the script cases", [fund_blk], core="valid")
        index = {k: i for i, k in enumerate(scripts)}

        def spend(key, script_sig=b"", witness=None, locktime=0, seq=SEQUENCE_FINAL, version=2):
            tx = CTransaction()
            tx.version = version
            tx.nLockTime = locktime
            tx.vin.append(CTxIn(COutPoint(fund.sha256, index[key]), script_sig, seq))
            tx.vout.append(CTxOut(9_000, CScript([OP_TRUE])))
            if witness is not None:
                tx.wit.vtxinwit = [CTxInWitness()]
                tx.wit.vtxinwit[0].scriptWitness.stack = witness
            tx.rehash()
            return tx

        cases = [
            ("s-false", spend("eq2", CScript([3])), "a scriptSig leaving false "
             "(mandatory-script-verify-flag-failed)"),
            ("s-true", spend("eq2", CScript([2])), "the same output spent with the right scriptSig"),
            ("s-dead", spend("dead", CScript([OP_0])), "an invalid opcode in a branch not taken"),
            ("s-ret", spend("ret", CScript([OP_1])), "OP_RETURN executed (script fails)"),
            ("s-p2sh-false", spend("p2sh-false", CScript([bytes(redeem_false)])),
             "P2SH: the redeem script leaves false"),
            ("s-p2sh-nonpush", spend("p2sh-true", CScript([OP_1, OP_DROP, bytes(redeem_true)])),
             "P2SH: a scriptSig that is not push-only"),
            ("s-p2sh-ok", spend("p2sh-true", CScript([bytes(redeem_true)])), "P2SH: a valid spend"),
            ("s-wsh-bad", spend("p2wsh", witness=[bytes(CScript([OP_TRUE, OP_TRUE]))]),
             "P2WSH: a witness script that does not hash to the program"),
            ("s-wsh-sig", spend("p2wsh", CScript([OP_1]), witness=[bytes(wscript)]),
             "P2WSH: a non-empty scriptSig (witness malleated)"),
            ("s-wsh-ok", spend("p2wsh", witness=[bytes(wscript)]), "P2WSH: a valid spend"),
            ("s-cltv-bad", spend("cltv", locktime=cltv_h - 1, seq=0xFFFFFFFE),
             "BIP65: CHECKLOCKTIMEVERIFY above the transaction's nLockTime"),
            ("s-cltv-ok", spend("cltv", locktime=cltv_h, seq=0xFFFFFFFE),
             "BIP65: CHECKLOCKTIMEVERIFY satisfied"),
            ("s-csv-bad", spend("csv", seq=1), "BIP112: CHECKSEQUENCEVERIFY above the input's "
             "sequence"),
            ("s-csv-ok", spend("csv", seq=2), "BIP112: CHECKSEQUENCEVERIFY satisfied"),
        ]
        # Let the CLTV height and the CSV depth be reached first.
        filler = b.next_block("sfill1")
        filler2 = b.next_block("sfill2")
        case("scripts", "two empty blocks (heights for the lock cases)", [filler, filler2], core="valid")
        # Each case extends the tip; the valid ones move it.
        tip = "sfill2"
        for name, tx, what in cases:
            ok = name.endswith("-ok") or name in ("s-true", "s-dead")
            b.move_tip(tip)
            blk = b.next_block(name)
            blk = b.update_block(name, [tx], witness=bool(tx.wit.vtxinwit))
            case("scripts", what, [blk], core="valid" if ok else "invalid")
            if ok:
                tip = name
        b.move_tip(tip)

    def reorgs(self):
        """kakehi reorganises at most 100 blocks deep (the Sozu table's
        purge depth): a 100-deep reorg is taken, a 150-deep one refused
        (Core takes both). The refused one goes last: Core and kakehi part
        ways there."""
        b, case = self.b, self.case
        by_hash = {blk.sha256: blk for blk in b.blocks.values()}
        for depth, accepted in ((100, True), (150, False)):
            tip = self.node.stats()
            tip_h = tip["height"]
            fork = by_hash[int(tip["bestblock"], 16)]
            for _ in range(depth):
                fork = by_hash[fork.hashPrevBlock]
            b.tip = fork
            branch = [b.next_block(f"r{depth}-{i}") for i in range(depth + 1)]
            for blk in branch:
                by_hash[blk.sha256] = blk
            if accepted:
                case("reorgs", f"a {depth}-block reorg (fork {depth} below the tip, "
                     f"{depth + 1} new blocks) is taken", branch, core="valid")
            else:
                case("reorgs", f"a {depth}-block reorg is refused: kakehi keeps its tip "
                     f"(Core reorgs; kakehi's limit is 100)", branch, core="valid",
                     kakehi_tip=tip["bestblock"], punished=False)
            assert tip_h + 1 == b.height_of(branch[-1])

    # ----------------------------------------------------------------------
    # BIP30, on a node whose BIP34 never activates

    def run_bip30(self):
        """Duplicate transactions (BIP30): a coinbase repeating an earlier
        one while its outputs are unspent is invalid (Core's
        `bad-txns-BIP30`, a consensus failure: discouraged); once they are
        spent, the repeat is valid. Core's engine cannot judge this (its
        regtest activates BIP34 at height 1), so the expectations are
        Core's rule as written in validation.cpp ConnectBlock."""
        b, case = self.b, self.case
        b.tip = None
        first = b.next_block("c1")
        first.vtx[0].vin[0].scriptSig = b"\x51\x51"
        first = b.update_block("c1", [])
        blocks = [first] + [b.next_block(f"c{i}") for i in range(2, 102)]
        case("setup", "101 blocks (the first coinbase matures)", blocks, judge=False,
             valid=True, kakehi_tip=blocks[-1].hash, punished=False)
        tip = blocks[-1]
        dup = b.next_block("dup")
        dup.vtx[0] = copy.deepcopy(first.vtx[0])
        dup = b.update_block("dup", [])
        assert dup.vtx[0].sha256 == first.vtx[0].sha256
        case("bip30", "a coinbase repeating an unspent one (bad-txns-BIP30)", [dup], judge=False,
             kakehi_tip=tip.hash, punished=True)
        b.tip = tip
        spend = b.next_block("spend")
        spend = b.update_block("spend", [b.create_tx(first.vtx[0], 0,
                                                     first.vtx[0].vout[0].nValue)])
        case("bip30", "its outputs spent", [spend], judge=False, valid=True,
             kakehi_tip=spend.hash, punished=False)
        again = b.next_block("again")
        again.vtx[0] = copy.deepcopy(first.vtx[0])
        again = b.update_block("again", [])
        case("bip30", "then the same coinbase again is valid", [again], judge=False, valid=True,
             kakehi_tip=again.hash, punished=False)
        total = sum(v for k, v in self.counts.items() if k != "setup")
        log(f"{total} cases, {self.failures} failed")
        return self.failures == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--p2p", type=int, required=True)
    ap.add_argument("--http", type=int, required=True)
    ap.add_argument("--scripts", action="store_true",
                    help="also the script families (for a node that runs scripts)")
    ap.add_argument("check", choices=["families", "bip30"])
    args = ap.parse_args()
    thread = NetworkThread()
    thread.daemon = True
    thread.start()
    started = time.time()
    suite = Suite(args.p2p, args.http, args.scripts)
    ok = suite.run() if args.check == "families" else suite.run_bip30()
    log(f"{args.check}: {time.time() - started:.1f} s")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
