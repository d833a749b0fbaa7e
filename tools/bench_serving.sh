#!/usr/bin/env bash
# The serving benchmarks of docs/perf/serving.md: starts `selfserve serve` on the default model and
# drives it with `selfserve bench serve` over loopback, then reads the engine's own counters from
# /metrics and the threads' CPU time from /proc.
#  1. decode scaling: 1 vs 16 concurrent streams, short prompts, 128 output tokens each, alternating
#     (ROUNDS, default 3), with the engine's decode-only throughput at each level;
#  2. the default request mix at concurrency 8: KV paging waste and scheduler/HTTP overhead
#     (skipped with SCALING_ONLY=1).
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${PORT:-18511}
OUT=${OUT:-/tmp/selfserve-bench}
mkdir -p "$OUT"
# SERVE_ARGS: extra `selfserve serve` options, e.g. SERVE_ARGS="--kv-cache-dtype q8_0".
# SERVER: the binary that serves (default build/selfserve; an A/B can pass another build's copy);
# the load generator is always build/selfserve.
SERVER=${SERVER:-build/selfserve}
# shellcheck disable=SC2086
"$SERVER" serve --port "$PORT" --quiet ${SERVE_ARGS:-} >"$OUT/server.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
until python3 -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:$PORT/health').status!=200)" 2>/dev/null; do
  kill -0 $pid || { cat "$OUT/server.log"; exit 1; }; sleep 0.3; done
URL=http://127.0.0.1:$PORT/v1

metrics() { python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())"; }
cpu() {  # utime+stime ticks of this server's threads, by thread name
  for t in /proc/$pid/task/*; do
    awk -v name="$(cat "$t/comm")" '{print name, $14+$15}' "$t/stat"; done | awk '{a[$1]+=$2} END {for (k in a) print k, a[k]}'
}
# Deltas of /metrics counters between two scrapes: python3 -c "$DELTA" "$before" "$after" NAME...
DELTA='
import sys
def parse(text):
    return {l.rsplit(" ", 1)[0]: float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l and not l.startswith("#")}
a, b = parse(sys.argv[1]), parse(sys.argv[2])
print(" ".join(str(b.get(k, 0) - a.get(k, 0)) for k in sys.argv[3:]))'

ROUNDS=${ROUNDS:-3}
echo "== 1. decode scaling (short prompts, 128 output tokens): c=1 and c=16 alternating, $ROUNDS rounds"
# Besides the client's view (TPOT includes the prompt work of requests arriving meanwhile), the
# engine's decode-only steps give the aggregate decode throughput itself: tokens / seconds of the
# steps that carried no prompt token. The levels alternate so that a slow spell of a shared machine
# hits both; the ratio is of the per-level medians.
rates1=(); rates16=()
for r in $(seq "$ROUNDS"); do
  for c in 1 16; do
    m0=$(metrics)
    build/selfserve bench serve --url "$URL" --mix 1,0,0 --output-tokens 128,128 --concurrency $c \
      --num-requests $((c == 1 ? 16 : 32)) --duration 120 --seed $((6 + r)) --json "$OUT/scaling_c${c}_r$r.json" |
      grep -E "^(load|c=)"
    m1=$(metrics)
    read -r steps secs toks < <(python3 -c "$DELTA" "$m0" "$m1" selfserve_engine_decode_steps_total \
      selfserve_engine_decode_step_seconds_total selfserve_engine_decode_step_tokens_total)
    rate=$(python3 -c "print(f'{$toks / $secs:.1f}')")
    if [ "$c" = 1 ]; then rates1+=("$rate"); else rates16+=("$rate"); fi
    python3 -c "print(f'   decode-only steps: {int($steps)}, {$toks / $steps:.2f} tokens/step, {1e3 * $secs / $steps:.2f} ms/step, {$toks / $secs:.1f} tok/s')"
  done
done
python3 - "${rates1[*]}" "${rates16[*]}" <<'PY'
import statistics, sys
r1, r16 = [float(x) for x in sys.argv[1].split()], [float(x) for x in sys.argv[2].split()]
m1, m16 = statistics.median(r1), statistics.median(r16)
print(f"decode-only tok/s, c=1: {r1} (median {m1:.1f}); c=16: {r16} (median {m16:.1f})")
print(f"aggregate decode throughput, 16 streams / 1 stream: {m16 / m1:.2f}x")
PY

[ -n "${SCALING_ONLY:-}" ] && exit 0  # SCALING_ONLY=1: part 1 only
m0=$(metrics); c0=$(cpu)
echo "== 2. default mix (30% short, 50% medium, 20% long), concurrency 8"
build/selfserve bench serve --url "$URL" --concurrency 8 --num-requests 24 --duration 240 --seed 11 \
  --output-tokens 16,256 --json "$OUT/mix.json"
m1=$(metrics); c1=$(cpu)
read -r held filled steps step fwd < <(python3 -c "$DELTA" "$m0" "$m1" selfserve_kv_slots_held_total \
  selfserve_kv_slots_filled_total selfserve_engine_steps_total selfserve_engine_step_seconds_total \
  selfserve_engine_forward_seconds_total)
python3 - "$held" "$filled" "$steps" "$step" "$fwd" "$c0" "$c1" <<'PY'
import sys
held, filled, steps, step, fwd = map(float, sys.argv[1:6])
def cpu(text):
    return {l.split()[0]: int(l.split()[1]) for l in text.splitlines() if l.strip()}
c0, c1 = cpu(sys.argv[6]), cpu(sys.argv[7])
print(f"KV paging waste (step-averaged): {100 * (1 - filled / held):.2f}% of held slots ({int(held)} held, {int(filled)} filled)")
print(f"engine steps: {int(steps)}, step time {step:.2f} s, forward {fwd:.2f} s, "
      f"engine overhead (plan + sample + emit) {100 * (step - fwd) / step:.2f}%")
dc = {k: c1.get(k, 0) - c0.get(k, 0) for k in set(c0) | set(c1)}
total = sum(dc.values())
http = sum(v for k, v in dc.items() if k not in ('ss-engine', 'ss-cpu'))
print("CPU ticks by thread:", dict(sorted(dc.items())))
print(f"HTTP + parsing threads: {100 * http / total:.2f}% of the server's CPU time")
PY
