#!/usr/bin/env bash
# HTTP load numbers for BENCHMARKS.md "HTTP", loopback only.
#
# Starts a release `kakehi run` imported from testnet-data/regtest-a, then
# runs wrk (Debian package `wrk`) against the filter, header, outspend and
# proof routes, a trivial route as the same-run baseline, and /health while a
# slow-client attack (connections that dribble a request head one byte per
# second, reopened when the header-read timeout closes them) runs.
#
#   cargo build --release --bin kakehi
#   benches/http_load.sh                 # DURATION=10 CONNS=64 THREADS=2 SLOW=200
#
# Prints one Markdown table row per route: req/s, p50, p99 (wrk --latency).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
SLOW=${SLOW:-200}
PORT=${PORT:-39281}
BIN=${BIN:-target/release/kakehi}
command -v wrk >/dev/null || apt-get install -y wrk >/dev/null
[ -x "$BIN" ] || { echo "build first: cargo build --release --bin kakehi" >&2; exit 1; }

DATA=$(mktemp -d)
cleanup() {
  [ -n "${ATTACK:-}" ] && kill "$ATTACK" 2>/dev/null || true
  [ -n "${NODE:-}" ] && kill "$NODE" 2>/dev/null && wait "$NODE" 2>/dev/null || true
  rm -rf "$DATA"
}
trap cleanup EXIT

"$BIN" --network regtest --datadir "$DATA/node" --log-filter warn \
  run --http "127.0.0.1:$PORT" --import testnet-data/regtest-a/blocks.dat &
NODE=$!
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  sleep 0.5
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null

# Parameters from the test data (not from kakehi).
read -r H1000 < <(python3 -c '
import json; c = json.load(open("testnet-data/regtest-a/chain.json"))
print(next(b["hash"] for b in c["blocks"] if b["on_best_chain"] and b["height"] == 1000))')
read -r OP < <(sed -n 1001p testnet-data/regtest-a/spent.txt | cut -d" " -f1)
TXID=${OP%%:*}; VOUT=${OP##*:}
BASE="http://127.0.0.1:$PORT"

run() { # name url
  local out rps p50 p99
  out=$(wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --latency "$2")
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '/^ +50%/ {print $2}' <<<"$out")
  p99=$(awk '/^ +99%/ {print $2}' <<<"$out")
  if grep -q "Non-2xx" <<<"$out"; then echo "non-2xx answers for $1:" >&2; echo "$out" >&2; fi
  printf '| %s | %s | %s | %s |\n' "$1" "$rps" "$p50" "$p99"
}

echo "wrk -t$THREADS -c$CONNS -d${DURATION}s --latency, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| route | req/s | p50 | p99 |"
echo "| --- | --- | --- | --- |"
run '`/blocks/tip/height` (baseline)' "$BASE/blocks/tip/height"
run '`/rest/blockfilter/basic/{h}.bin` (cached filter)' "$BASE/rest/blockfilter/basic/$H1000.bin"
run '`/rest/headers/{h}.bin?count=100`' "$BASE/rest/headers/$H1000.bin?count=100"
run '`/filters/basic?start_height=1000&count=100`' "$BASE/filters/basic?start_height=1000&count=100"
run '`/tx/{txid}/outspend/{vout}`' "$BASE/tx/$TXID/outspend/$VOUT"
run '`/proof/outpoint/{txid}/{vout}`' "$BASE/proof/outpoint/$TXID/$VOUT"
run '`/health`' "$BASE/health"

# Slow-client attack: SLOW connections each sending one byte of a request
# head per second; the server's header-read timeout (5 s) closes them and
# they reconnect at once.
python3 - "$PORT" "$SLOW" <<'EOF' &
import socket, sys, time, selectors
port, n = int(sys.argv[1]), int(sys.argv[2])
head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10000
conns = {}
def open_one():
    s = socket.socket(); s.setblocking(False)
    try: s.connect(("127.0.0.1", port))
    except BlockingIOError: pass
    conns[s] = 0
for _ in range(n): open_one()
opened = n
while True:
    time.sleep(1)
    for s in list(conns):
        try:
            s.send(head[conns[s]:conns[s] + 1]); conns[s] += 1
        except OSError:
            s.close(); del conns[s]; open_one(); opened += 1
EOF
ATTACK=$!
sleep 3
run "\`/health\` under a slow-client attack ($SLOW connections)" "$BASE/health"
