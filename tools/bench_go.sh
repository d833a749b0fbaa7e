#!/usr/bin/env bash
# Decode throughput through the Go SDK against the C++ engine driven directly, interleaved A/B
# (cpp, go, cpp, go, ...) so that a shared, noisy machine's drift falls on both alike; prints each
# run and the medians per concurrency. Numbers go to docs/perf/go.md.
#   tools/bench_go.sh [ROUNDS=5] [MAX_TOKENS=128] [THREADS=2]   (after cmake --build build and
#   cmake --install build --prefix build/install; the default model in the cache)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
max_tokens=${2:-128}
threads=${3:-2}
model=${SELFSERVE_TEST_MODEL:-${SELFSERVE_HOME:-$HOME/.cache/selfserve}/models/SmolLM2-135M-Instruct.Q4_1.gguf}
export PKG_CONFIG_PATH="$PWD/build/install/lib/pkgconfig"
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
(cd go && go build -o "$bin/benchdecode" ./tools/benchdecode)
log="$bin/runs.jsonl"
for r in $(seq "$rounds"); do
  for n in 1 16; do
    # Alternate which side goes first from round to round.
    if [ $((r % 2)) = 1 ]; then order="cpp go"; else order="go cpp"; fi
    for impl in $order; do
      if [ "$impl" = cpp ]; then
        build/bench_engine_decode "$model" "$n" "$max_tokens" "$threads"
      else
        "$bin/benchdecode" -model "$model" -n "$n" -max-tokens "$max_tokens" -threads "$threads"
      fi | tee -a "$log"
    done
  done
done
python3 - "$log" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
for n in (1, 16):
    cpp = [r["decode_tok_s"] for r in runs if r["n"] == n and r["impl"] == "cpp"]
    go = [r for r in runs if r["n"] == n and r["impl"] == "go"]
    g = [r["decode_tok_s"] for r in go]
    # Paired: each Go run against the C++ run of the same round.
    ratios = [b / a for a, b in zip(cpp, g)]
    print(f"n={n}: cpp median {statistics.median(cpp):.1f} tok/s, go median {statistics.median(g):.1f} tok/s, "
          f"go/cpp medians {statistics.median(g) / statistics.median(cpp):.3f}, paired ratios "
          f"{' '.join(f'{x:.3f}' for x in ratios)} (median {statistics.median(ratios):.3f}); "
          f"cgo call {statistics.median(r['cgo_call_ns'] for r in go):.0f} ns, Go dispatch "
          f"{statistics.median(r['go_dispatch_us_poll'] for r in go):.1f} us/poll, "
          f"{statistics.median(r['go_dispatch_ns_tok'] for r in go):.0f} ns/token, "
          f"events per poll with events {statistics.median(r['events'] / r['polls_with_events'] for r in go):.1f}")
PY
