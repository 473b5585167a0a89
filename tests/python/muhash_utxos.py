#!/usr/bin/env python3
"""MuHash3072 of a UTXO list, with Bitcoin Core's own Python implementation
(verystable.core.crypto.muhash) and serialization (verystable.core.messages),
as Core's test/functional/feature_utxo_set_hash.py computes it.

    python muhash_utxos.py UTXOS_TXT

UTXOS_TXT has one line per unspent output,
`txid:vout value_sats scriptPubKey_hex height coinbase(0/1)`
(testnet-data/regtest-a/README.md). Prints the MuHash as Core's
`gettxoutsetinfo muhash` does (the digest's bytes reversed, hex), then the
number of coins.
"""

import struct
import sys

from verystable.core.crypto.muhash import MuHash3072
from verystable.core.messages import COutPoint, CTxOut


def main():
    muhash = MuHash3072()
    coins = 0
    with open(sys.argv[1]) as f:
        for line in f:
            outpoint, value, script, height, coinbase = line.split()
            txid, vout = outpoint.split(":")
            data = COutPoint(int(txid, 16), int(vout)).serialize()
            data += struct.pack("<i", int(height) * 2 + int(coinbase))
            data += CTxOut(int(value), bytes.fromhex(script)).serialize()
            muhash.insert(data)
            coins += 1
    print(muhash.digest()[::-1].hex())
    print(coins)


if __name__ == "__main__":
    main()
