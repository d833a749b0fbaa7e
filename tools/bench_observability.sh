#!/usr/bin/env bash
# The cost of tracing (docs/perf/observability.md): two `selfserve serve` on the default model, one
# plain (A) and one exporting a trace of every request (B: --otlp-traces-endpoint, sample ratio 1.0)
# to a local collector that answers 200 (it reads the bytes and decodes nothing, as a remote
# collector costs this machine nothing). Both take the same load in turn, interleaved A B B A ...
# (ROUNDS rounds): 16 concurrent streams, short prompts, 128 output tokens each, 64 requests. Per
# run: the client's output tokens/s, the engine's decode-only tokens/s (from /metrics deltas), the
# server's CPU time per output token (all its threads, /proc) and its export thread's CPU time.
# usage: [ROUNDS=6] tools/bench_observability.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-6}
OUT=${OUT:-/tmp/selfserve-obs}; mkdir -p "$OUT"
PA=${PORT_A:-18611}; PB=${PORT_B:-18612}; PC=${PORT_C:-18613}
python3 - "$PC" >"$OUT/collector.log" 2>&1 <<'PY' &
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    posts = bytes_in = 0
    def do_POST(self):
        n = int(self.headers["Content-Length"]); self.rfile.read(n)
        H.posts += 1; H.bytes_in += n
        print(f"post {H.posts} bytes {H.bytes_in}", flush=True)
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
cpid=$!
build/selfserve serve --port "$PA" --quiet >"$OUT/a.log" 2>&1 &
apid=$!
# B_ARGS: what B adds (B_ARGS="" gives an A/A run: the noise floor of this measurement).
# shellcheck disable=SC2086
build/selfserve serve --port "$PB" --quiet ${B_ARGS---otlp-traces-endpoint http://127.0.0.1:$PC/v1/traces --otlp-sample-ratio 1.0} \
  >"$OUT/b.log" 2>&1 &
bpid=$!
trap 'kill -TERM $apid $bpid $cpid 2>/dev/null; wait $apid $bpid 2>/dev/null || true' EXIT
for p in "$PA" "$PB"; do
  until python3 -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:$p/health').status!=200)" 2>/dev/null; do
    kill -0 $apid && kill -0 $bpid || { cat "$OUT"/a.log "$OUT"/b.log; exit 1; }; sleep 0.3; done
done
metrics() { python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$1/metrics').read().decode())"; }
DELTA='
import sys
def parse(text):
    return {l.rsplit(" ", 1)[0]: float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l and not l.startswith("#")}
a, b = parse(sys.argv[1]), parse(sys.argv[2])
print(" ".join(str(b.get(k, 0) - a.get(k, 0)) for k in sys.argv[3:]))'
cpu() {  # utime+stime ticks of a process, and of its ss-otlp thread
  local all=0 otlp=0 t v
  for t in /proc/$1/task/*; do
    v=$(awk '{print $14+$15}' "$t/stat" 2>/dev/null || echo 0)
    all=$((all + v)); [ "$(cat "$t/comm" 2>/dev/null)" = ss-otlp ] && otlp=$((otlp + v))
  done
  echo "$all $otlp"
}
run() {  # side port round pid
  local m0 m1 secs toks c0 c1
  m0=$(metrics "$2"); c0=$(cpu "$4")
  build/selfserve bench serve --url "http://127.0.0.1:$2/v1" --mix 1,0,0 --output-tokens 128,128 --concurrency 16 \
    --num-requests 64 --duration 300 --seed $((20 + $3)) --warmup 1 --json "$OUT/$1_$3.json" >/dev/null
  m1=$(metrics "$2"); c1=$(cpu "$4")
  read -r secs toks < <(python3 -c "$DELTA" "$m0" "$m1" selfserve_engine_decode_step_seconds_total \
    selfserve_engine_decode_step_tokens_total)
  python3 - "$OUT/$1_$3.json" "$secs" "$toks" "$1" "$3" $c0 $c1 >>"$OUT/runs.txt" <<'PY'
import json, os, sys
j = json.load(open(sys.argv[1])); lv = j["levels"][0]
secs, toks = float(sys.argv[2]), float(sys.argv[3])
a0, o0, a1, o1 = map(int, sys.argv[6:10])
hz = os.sysconf("SC_CLK_TCK")
cpu_ms_tok = 1e3 * (a1 - a0) / hz / lv["output_tokens"]
print(sys.argv[4], sys.argv[5], f"{lv['output_tok_per_s']:.2f}", f"{toks / secs:.2f}", f"{cpu_ms_tok:.4f}",
      f"{1e3 * (o1 - o0) / hz:.0f}", lv["ok"], lv["errors"])
PY
  tail -1 "$OUT/runs.txt"
}
: >"$OUT/runs.txt"
echo "side round client_out_tok_s engine_decode_tok_s server_cpu_ms_per_token otlp_thread_cpu_ms ok errors"
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for side in $order; do
    if [ "$side" = A ]; then run A "$PA" "$r" "$apid"; else run B "$PB" "$r" "$bpid"; fi
  done
done
echo "collector CPU: $(awk '{printf "%.2f s", ($14+$15)/'"$(getconf CLK_TCK)"'}' /proc/$cpid/stat)"
m=$(metrics "$PB")
echo "B's exporter: $(echo "$m" | grep -E '^selfserve_otlp_spans_(exported|dropped)_total' | tr '\n' ' ')"
python3 - "$OUT/runs.txt" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
for col, name in ((2, "client output tok/s"), (3, "engine decode-only tok/s"), (4, "server CPU ms per output token")):
    a = [float(r[col]) for r in rows if r[0] == "A"]; b = [float(r[col]) for r in rows if r[0] == "B"]
    ma, mb = st.median(a), st.median(b)
    # Per round: B / A of the pair run back to back.
    ratios = [bb / aa for aa, bb in zip(a, b)]
    print(f"{name}: A median {ma:.1f} (min {min(a):.1f}, max {max(a):.1f}); B median {mb:.1f} "
          f"(min {min(b):.1f}, max {max(b):.1f}); B/A {mb / ma:.4f}; per-round B/A {[round(x, 3) for x in ratios]} "
          f"(median {st.median(ratios):.4f})")
PY
