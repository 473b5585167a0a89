"""Imports blk-framed regtest block files with Bitcoin Core's own validation
engine (libbitcoinkernel via PyPI py-bitcoinkernel, module `pbk`), as the
anchor of `cargo bench --bench scale`.

Usage: core_import.py FILE...

Loads a fresh regtest chainstate in a temporary directory with pbk's
defaults (`load_chainman`: default caches, scripts checked; regtest has no
assumevalid), times `ChainstateManager.import_blocks(FILES)` (Core's
`-loadblock` path: every block checked and connected, stale branches
included), and prints one JSON line: {"seconds", "height", "tip"}.
"""

import json
import sys
import tempfile
import time

import pbk


def main() -> int:
    paths = sys.argv[1:]
    if not paths:
        print("usage: core_import.py FILE...", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="kakehi-core-import-") as datadir:
        chainman = pbk.load_chainman(datadir, pbk.ChainType.REGTEST)
        started = time.perf_counter()
        # The C API's status: 0 is success.
        status = chainman.import_blocks(paths)
        seconds = time.perf_counter() - started
        if status != 0:
            print(f"import_blocks failed (status {status})", file=sys.stderr)
            return 1
        chain = chainman.get_active_chain()
        tip = chain.block_tree_entries[chain.height]
        print(
            json.dumps(
                {
                    "seconds": seconds,
                    "height": tip.height,
                    # Display order (RPC's), as kakehi and block explorers print it.
                    "tip": bytes(tip.block_hash)[::-1].hex(),
                }
            )
        )
        del chainman
    return 0


if __name__ == "__main__":
    sys.exit(main())
