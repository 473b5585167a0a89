#!/usr/bin/env python3
"""Bitcoin Core's own validation engine (libbitcoinkernel, PyPI
py-bitcoinkernel, module `pbk`) judges a kakehi-chaingen chain.

    python chaingen_judge.py DIR

DIR is a kakehi-chaingen output directory (blk*.dat, manifest.json,
invalid/). On a fresh regtest chainstate, in a temporary directory:

1. every record of the blk files, in file order, goes through
   `ChainstateManager.process_block`; no `block_checked` state may be
   invalid, the active tip must be the manifest's, and Core must have
   disconnected exactly the stale blocks the manifest's reorgs name;
2. the UTXO set of Core's active chain (the outputs of its blocks, as Core
   parses them, minus what they spend; OP_RETURN outputs left out as Core
   does) must give the manifest's count, total and SHA-256 of the sorted
   `txid:vout value script height coinbase` text;
3. every case of invalid/cases.json must leave the tip where it is, with
   an invalid `block_checked` state and Core's log naming the case's
   `core_reject_reason`;
4. invalid/control.blk (every case's transaction without its fault) must
   be accepted and become the tip.

Prints one JSON line (what Core saw); exits 1 listing every mismatch.
"""

import hashlib
import json
import re
import struct
import sys
import tempfile
import time
from pathlib import Path

import pbk

# Core's regtest message start.
MAGIC = bytes.fromhex("fabfb5da")
# The log lines where Core states a block's reject reason (validation.cpp):
# ConnectBlock failures, and AcceptBlock / CheckBlock failures.
REJECT_LINE = re.compile(
    r"(?:Block validation error: |AcceptBlock FAILED \(|AcceptBlock: )(.*)$"
)


def records(path):
    """The blocks of a blk-framed file, as bytes."""
    data = Path(path).read_bytes()
    pos = 0
    while pos + 8 <= len(data):
        if data[pos : pos + 4] != MAGIC:
            raise ValueError(f"{path}: bad magic at offset {pos}")
        (length,) = struct.unpack_from("<I", data, pos + 4)
        yield data[pos + 8 : pos + 8 + length]
        pos += 8 + length


def display(raw_hash):
    """A hash in display (RPC) order."""
    return bytes(raw_hash)[::-1].hex()


class Judge:
    def __init__(self, datadir):
        self.states = []
        self.disconnected = 0
        self.logs = []
        self.log_conn = pbk.LoggingConnection(self.logs.append)
        callbacks = pbk.ValidationInterfaceCallbacks(
            block_checked=self._checked, block_disconnected=self._disconnected
        )
        self.chainman = pbk.load_chainman(datadir, pbk.ChainType.REGTEST, callbacks)

    def _checked(self, _user, block, state):
        self.states.append((display(block.block_hash), state.validation_mode))

    def _disconnected(self, _user, _block, _entry):
        self.disconnected += 1

    def submit(self, raw):
        """process_block; False if Core refused it outright."""
        try:
            self.chainman.process_block(pbk.Block(raw))
            return True
        except pbk.ProcessBlockException:
            return False

    def tip(self):
        chain = self.chainman.get_active_chain()
        entry = chain.block_tree_entries[chain.height]
        return chain.height, display(entry.block_hash)

    def utxos(self):
        """Count, total and SHA-256 of Core's active chain's UTXO text."""
        chain = self.chainman.get_active_chain()
        coins = {}
        for height in range(1, chain.height + 1):
            block = self.chainman.blocks[chain.block_tree_entries[height]]
            for n, tx in enumerate(block.transactions):
                if n > 0:
                    for txin in tx.inputs:
                        op = txin.out_point
                        del coins[(display(op.txid), op.index)]
                txid = display(tx.txid)
                for vout, out in enumerate(tx.outputs):
                    script = bytes(out.script_pubkey)
                    if script[:1] == b"\x6a" or len(script) > 10_000:
                        continue
                    coins[(txid, vout)] = (out.amount, script.hex(), height, int(n == 0))
        digest = hashlib.sha256()
        for (txid, vout), (value, script, height, cb) in sorted(coins.items()):
            digest.update(f"{txid}:{vout} {value} {script} {height} {cb}\n".encode())
        total = sum(c[0] for c in coins.values())
        return len(coins), total, digest.hexdigest()


def check_chain(judge, out, manifest, problems):
    refused = []
    for name in manifest["files"]:
        for raw in records(out / name):
            if not judge.submit(raw):
                refused.append(display(hashlib.sha256(hashlib.sha256(raw[:80]).digest()).digest()))
    if refused:
        problems.append(f"Core refused {len(refused)} blocks outright, first {refused[0]}")
    bad = [h for h, mode in judge.states if mode != pbk.ValidationMode.VALID]
    if bad:
        problems.append(f"Core found {len(bad)} invalid blocks, first {bad[0]}")
    height, tip = judge.tip()
    if (height, tip) != (manifest["tip_height"], manifest["tip_hash"]):
        problems.append(f"Core's tip {height} {tip} is not the manifest's")
    stale = sum(r["depth"] for r in manifest["reorgs"])
    if judge.disconnected != stale:
        problems.append(f"Core disconnected {judge.disconnected} blocks, the manifest's reorgs {stale}")
    started = time.perf_counter()
    count, total, sha = judge.utxos()
    utxo_seconds = round(time.perf_counter() - started, 1)
    want = (manifest["utxo_count"], manifest["utxo_total_sats"], manifest["utxos_sha256"])
    if (count, total, sha) != want:
        problems.append(f"Core's UTXO set {count} / {total} sat / {sha} is not the manifest's {want}")
    return {"height": height, "tip": tip, "blocks_checked": len(judge.states),
            "disconnected": judge.disconnected, "utxo_count": count, "utxo_total_sats": total,
            "utxo_seconds": utxo_seconds}


def check_cases(judge, out, problems):
    before = judge.tip()
    verdicts = {}
    for case in json.loads((out / "invalid" / "cases.json").read_text()):
        judge.states.clear()
        judge.logs.clear()
        [raw] = list(records(out / "invalid" / case["file"]))
        judge.submit(raw)
        reasons = [m.group(1).strip() for line in judge.logs if (m := REJECT_LINE.search(line))]
        want = case["core_reject_reason"]
        named = any(r == want or r.startswith(want + ",") for r in reasons)
        invalid = [m for h, m in judge.states if h == case["block_hash"]] == [pbk.ValidationMode.INVALID]
        # The reason alone, without Core's debug message after ", ".
        verdicts[case["file"]] = reasons[0].split(", ")[0] if reasons else None
        if not (named and invalid and judge.tip() == before):
            problems.append(f"{case['file']}: Core said {reasons} (state invalid: {invalid}), expected {want}")
    [raw] = list(records(out / "invalid" / "control.blk"))
    judge.states.clear()
    judge.submit(raw)
    height, tip = judge.tip()
    if height != before[0] + 1 or any(m != pbk.ValidationMode.VALID for _, m in judge.states):
        problems.append(f"control.blk not accepted: tip {height} {tip}")
    return verdicts, tip


def main():
    if len(sys.argv) != 2:
        print("usage: chaingen_judge.py DIR", file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    manifest = json.loads((out / "manifest.json").read_text())
    problems = []
    with tempfile.TemporaryDirectory(prefix="kakehi-chaingen-judge-") as datadir:
        started = time.perf_counter()
        judge = Judge(datadir)
        report = check_chain(judge, out, manifest, problems)
        report["cases"], report["control_tip"] = check_cases(judge, out, problems)
        report["seconds"] = round(time.perf_counter() - started, 1)
        del judge
    print(json.dumps(report))
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
