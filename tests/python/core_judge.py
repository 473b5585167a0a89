"""Bitcoin Core's engine (libbitcoinkernel via PyPI py-bitcoinkernel, module
`pbk`, Core 31.99) as a judge for tests/it/scripts_core.rs.

Usage: core_judge.py FILE...

Loads a fresh regtest chainstate in a temporary directory (pbk's defaults:
scripts checked, no assumevalid on regtest), imports the blk-framed FILEs
(Core's -loadblock path), prints one JSON line {"ready": true, "height",
"tip"}, then answers one JSON command per line on standard input, one JSON
line each:

- {"cmd": "block", "hex": BLOCK_HEX}: ChainstateManager.process_block; the
  answer {"hash", "accepted": the block is now the active tip, "tip",
  "mode", "result" (Core's BlockValidationState of its block_checked
  callback, or null), "failure": the text after "ConnectBlock <hash>
  failed, " in Core's log (reject reason, then Core's debug message), or
  null}.
- {"cmd": "verify", "tx": TX_HEX, "spent": [[SCRIPT_PUBKEY_HEX, SATS]...],
  "input": N, "flags": BITS}: pbk's script verification API
  (ScriptPubkey.verify, Core's btck_script_pubkey_verify) on one input; the
  answer {"ok": bool}.

Hashes are in display order (RPC's), as kakehi prints them.
"""

import json
import sys
import tempfile

import pbk
import pbk.script


def display(raw: bytes) -> str:
    return bytes(raw)[::-1].hex()


class Judge:
    def __init__(self, datadir: str):
        self.logs: list[str] = []
        # Kept alive for the whole run: Core logs through it.
        self.conn = pbk.LoggingConnection(self.logs.append)
        self.checked: dict[str, tuple[int, int]] = {}
        callbacks = pbk.ValidationInterfaceCallbacks(block_checked=self.on_checked)
        self.chainman = pbk.load_chainman(
            datadir, pbk.ChainType.REGTEST, validation_callbacks=callbacks
        )

    def on_checked(self, _user_data, block, state) -> None:
        self.checked[display(bytes(block.block_hash))] = (
            int(state.validation_mode),
            int(state.block_validation_result),
        )

    def tip(self) -> tuple[int, str]:
        chain = self.chainman.get_active_chain()
        entry = chain.block_tree_entries[chain.height]
        return entry.height, display(bytes(entry.block_hash))

    def block(self, hex_block: str) -> dict:
        block = pbk.Block(bytes.fromhex(hex_block))
        block_hash = display(bytes(block.block_hash))
        self.logs.clear()
        error = None
        try:
            self.chainman.process_block(block)
        except pbk.ProcessBlockException as e:
            error = str(e)
        marker = f"ConnectBlock {block_hash} failed, "
        failure = None
        for line in self.logs:
            at = line.find(marker)
            if at >= 0:
                failure = line[at + len(marker) :].strip()
                break
        _, tip = self.tip()
        state = self.checked.get(block_hash)
        return {
            "hash": block_hash,
            "accepted": tip == block_hash,
            "tip": tip,
            "mode": state[0] if state else None,
            "result": state[1] if state else None,
            "failure": failure,
            "error": error,
        }

    def verify(self, cmd: dict) -> dict:
        tx = pbk.Transaction(bytes.fromhex(cmd["tx"]))
        spent = [
            pbk.TransactionOutput(pbk.ScriptPubkey(bytes.fromhex(spk)), amount)
            for spk, amount in cmd["spent"]
        ]
        data = pbk.script.PrecomputedTransactionData(tx, spent)
        index = cmd["input"]
        script_pubkey = pbk.ScriptPubkey(bytes.fromhex(cmd["spent"][index][0]))
        try:
            ok = script_pubkey.verify(
                cmd["spent"][index][1],
                tx,
                data,
                index,
                pbk.ScriptVerificationFlags(cmd["flags"]),
            )
        except pbk.ScriptVerifyException:
            ok = False
        return {"ok": bool(ok)}


def main() -> int:
    paths = sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="kakehi-core-judge-") as datadir:
        judge = Judge(datadir)
        # The C API's status: 0 is success.
        status = judge.chainman.import_blocks(paths) if paths else 0
        if status != 0:
            print(f"import_blocks failed (status {status})", file=sys.stderr)
            return 1
        height, tip = judge.tip()
        print(json.dumps({"ready": True, "height": height, "tip": tip}), flush=True)
        for line in sys.stdin:
            if not line.strip():
                continue
            cmd = json.loads(line)
            if cmd["cmd"] == "block":
                answer = judge.block(cmd["hex"])
            elif cmd["cmd"] == "verify":
                answer = judge.verify(cmd)
            else:
                answer = {"error": f"unknown command {cmd['cmd']!r}"}
            print(json.dumps(answer), flush=True)
        del judge
    return 0


if __name__ == "__main__":
    sys.exit(main())
