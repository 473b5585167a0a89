"""Verifies signed inputs with Bitcoin Core's own script interpreter in
libbitcoinkernel (PyPI py-bitcoinkernel, module `pbk`: the library Core
31.99 builds), for the verify-rate table of `cargo bench --bench scripts`.

Usage: kernel_verify.py RUNS FILE

FILE holds, one per line, a transaction to verify: its consensus
serialization in hex, then for each input the spent output's amount (sats)
and scriptPubKey (hex), space-separated. Every input of every transaction
is verified with all consensus flags (`ScriptVerificationFlags.ALL`) and
the transaction's `PrecomputedTransactionData`, made once per transaction
outside the timed loop (as Core's `CheckInputScripts` shares it between a
transaction's inputs), on one thread; best of RUNS.

The same loop over as many inputs spending a bare `OP_TRUE` output (no
signature, the interpreter's shortest path) gives the cost of the Python
call itself (ctypes), printed apart so the reader can take it off.

Prints one JSON line: {"inputs", "inputs_per_second", "call_overhead_us"}.
A failed verification exits 1 naming the transaction and input.
"""

import json
import sys
import time

import pbk
from pbk.script import PrecomputedTransactionData

FLAGS = pbk.ScriptVerificationFlags.ALL


def load(path: str) -> list:
    """The (tx, precomputed, [(amount, scriptPubKey)]) of each line."""
    items = []
    with open(path) as f:
        for line in f:
            fields = line.split()
            if not fields:
                continue
            tx = pbk.Transaction(bytes.fromhex(fields[0]))
            spent = [
                (int(fields[i]), pbk.ScriptPubkey(bytes.fromhex(fields[i + 1])))
                for i in range(1, len(fields), 2)
            ]
            outputs = [pbk.TransactionOutput(spk, amount) for amount, spk in spent]
            items.append((tx, PrecomputedTransactionData(tx, outputs), spent))
    return items


def best_rate(items: list, runs: int) -> tuple[int, float]:
    """(inputs, best inputs/s) verifying every input of `items`."""
    inputs = sum(len(spent) for _, _, spent in items)
    best = 0.0
    for _ in range(runs):
        start = time.perf_counter()
        for n, (tx, pre, spent) in enumerate(items):
            for i, (amount, spk) in enumerate(spent):
                if not spk.verify(amount, tx, pre, i, FLAGS):
                    sys.exit(f"transaction {n}, input {i}: verification failed")
        best = max(best, inputs / (time.perf_counter() - start))
    return inputs, best


def op_true_items(inputs: int) -> list:
    """`inputs` inputs spending a bare OP_TRUE output, 10 per transaction."""
    items = []
    spk = pbk.ScriptPubkey(bytes([0x51]))
    per_tx = 10
    for t in range(0, inputs, per_tx):
        n = min(per_tx, inputs - t)
        # version 2, n inputs (distinct prevouts, empty scriptSig), one
        # OP_TRUE output, locktime 0.
        raw = bytes.fromhex("02000000") + bytes([n])
        for i in range(n):
            raw += (t + i + 1).to_bytes(32, "little") + bytes(4) + b"\x00" + b"\xff" * 4
        raw += b"\x01" + (1000).to_bytes(8, "little") + b"\x01\x51" + bytes(4)
        tx = pbk.Transaction(raw)
        outputs = [pbk.TransactionOutput(spk, 1000) for _ in range(n)]
        items.append((tx, PrecomputedTransactionData(tx, outputs), [(1000, spk)] * n))
    return items


def main() -> int:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    runs, path = int(sys.argv[1]), sys.argv[2]
    # Core's kernel context selects the SHA-256 implementation for the CPU
    # (SHA256AutoDetect) when it is created, as bitcoind does at start.
    _context = pbk.make_context(pbk.ChainType.REGTEST)
    items = load(path)
    inputs, rate = best_rate(items, runs)
    _, trivial = best_rate(op_true_items(inputs), runs)
    print(
        json.dumps(
            {
                "inputs": inputs,
                "inputs_per_second": rate,
                "call_overhead_us": 1e6 / trivial,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
