"""Imports blk-framed regtest block files with Bitcoin Core's own validation
engine (libbitcoinkernel via PyPI py-bitcoinkernel, module `pbk`), as the
anchors of `cargo bench --bench import` and `--bench scale` (`benches/common/core.rs`).

Usage: core_import.py [--workers N] FILE...

Loads a fresh regtest chainstate in a temporary directory with pbk's
defaults (default caches, scripts checked; regtest has no assumevalid) and
N script-check worker threads besides the validation thread (default 0,
pbk's; bitcoind's `-par` default is one per core but one), times
`ChainstateManager.import_blocks(FILES)` (Core's `-loadblock` path: every
block checked and connected, stale branches included), and prints one JSON
line: {"seconds", "cpu_seconds", "height", "tip", "workers"} (`cpu_seconds`:
user + system time of this process over the import, every thread of the
engine included, from getrusage).
"""

import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import pbk


def load(datadir: str, workers: int) -> pbk.ChainstateManager:
    """pbk's `load_chainman` with `workers` script-check threads."""
    context = pbk.make_context(pbk.ChainType.REGTEST)
    options = pbk.ChainstateManagerOptions(
        context, str(Path(datadir).absolute()), str((Path(datadir) / "blocks").absolute())
    )
    options.set_worker_threads_num(workers)
    return pbk.ChainstateManager(options)


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    args = sys.argv[1:]
    workers = 0
    if args[:1] == ["--workers"] and len(args) >= 2:
        workers = int(args[1])
        args = args[2:]
    paths = args
    if not paths:
        print("usage: core_import.py [--workers N] FILE...", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="kakehi-core-import-") as datadir:
        chainman = load(datadir, workers)
        started, cpu_started = time.perf_counter(), cpu_seconds()
        # The C API's status: 0 is success.
        status = chainman.import_blocks(paths)
        seconds = time.perf_counter() - started
        cpu = cpu_seconds() - cpu_started
        if status != 0:
            print(f"import_blocks failed (status {status})", file=sys.stderr)
            return 1
        chain = chainman.get_active_chain()
        tip = chain.block_tree_entries[chain.height]
        print(
            json.dumps(
                {
                    "seconds": seconds,
                    "cpu_seconds": cpu,
                    "height": tip.height,
                    # Display order (RPC's), as kakehi and block explorers print it.
                    "tip": bytes(tip.block_hash)[::-1].hex(),
                    "workers": workers,
                }
            )
        )
        del chainman
    return 0


if __name__ == "__main__":
    sys.exit(main())
