#!/usr/bin/env bash
# Decode throughput through the Go SDK against the C++ engine driven directly (and the C ABI from C,
# to tell the library's cost from the Go runtime's), interleaved: every round runs each side once
# per concurrency, the order rotating from round to round, so a shared machine's drift falls on all
# alike. Prints each run (JSON) and a summary: medians, and each side over the C++ run of the same
# round. Numbers go to docs/perf/go.md.
#   [DEVICE=cuda] tools/bench_go.sh [ROUNDS=7] [MAX_TOKENS=128] [THREADS=2] [LINGER=5ms]
# after cmake --build build && cmake --install build --prefix build/install; the default model cached.
# BUILD=<dir> takes the C++ sides and the install from another build (e.g. build-gpu on the GPU
# machine); GO_BENCH=<file> runs that benchdecode binary instead of building one (a machine without
# Go: build it where Go is, `(cd go && PKG_CONFIG_PATH=$PWD/../build/install/lib/pkgconfig go build
# -o ../.gobench/benchdecode ./tools/benchdecode)`, carry .gobench, and point LD_LIBRARY_PATH at the
# other build's install/lib: the binary links libselfserve.so by its C ABI, not by its build).
# ctx_switches: the process's context switches (voluntary + involuntary) over the whole run;
# caller_cpu_us_tok: CPU time of every thread but the engine's (ss-engine, ss-cpu) while decoding,
# per token: the caller's side of the boundary (the Go runtime included), robust to a busy machine;
# caller_switches_tok (Go): those threads' context switches per token, how often they slept and woke.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-7}
max_tokens=${2:-128}
threads=${3:-2}
linger=${4:-5ms}
device=${DEVICE:-cpu}
gpu_flag=()
if [ "$device" = cuda ]; then gpu_flag=(-cuda); fi
model=${SELFSERVE_TEST_MODEL:-${SELFSERVE_HOME:-$HOME/.cache/selfserve}/models/SmolLM2-135M-Instruct.Q4_1.gguf}
B=${BUILD:-build}
export PKG_CONFIG_PATH="$PWD/$B/install/lib/pkgconfig"
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
if [ -n "${GO_BENCH:-}" ]; then
  cp "$GO_BENCH" "$bin/benchdecode"
else
  (cd go && go build -o "$bin/benchdecode" ./tools/benchdecode)
fi
log=${LOG:-$bin/runs.jsonl}
run() {  # side n
  case $1 in
    cpp) "$B/bench_engine_decode" "$model" "$2" "$max_tokens" "$threads" "$device" ;;
    c) "$B/bench_capi_decode" "$model" "$2" "$max_tokens" "$threads" 1 0 "$device" ;;
    go) "$bin/benchdecode" -model "$model" -n "$2" -max-tokens "$max_tokens" -threads "$threads" "${gpu_flag[@]}" ;;
    go-linger) "$bin/benchdecode" -model "$model" -n "$2" -max-tokens "$max_tokens" -threads "$threads" \
      -linger "$linger" "${gpu_flag[@]}" ;;
  esac
}
sides=(cpp c go go-linger)
for r in $(seq "$rounds"); do
  for n in 1 16; do
    for k in 0 1 2 3; do
      side=${sides[$(((k + r) % 4))]}
      run "$side" "$n" | sed "s/^{/{\"round\":$r,\"side\":\"$side\",/" | tee -a "$log"
    done
  done
done
python3 - "$log" <<'PY'
import json, statistics as st, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
med = st.median
for n in (1, 16):
    by = lambda side: {r["round"]: r for r in runs if r["n"] == n and r["side"] == side}
    cpp = by("cpp")
    print(f"n={n}: C++ median {med(r['decode_tok_s'] for r in cpp.values()):.1f} tok/s, "
          f"{med(r['ctx_switches'] for r in cpp.values()):.0f} context switches")
    for side in ("c", "go", "go-linger"):
        s = by(side)
        ratios = [s[k]["decode_tok_s"] / cpp[k]["decode_tok_s"] for k in s if k in cpp]
        line = (f"  {side:9s} median {med(r['decode_tok_s'] for r in s.values()):.1f} tok/s, over C++ per round: "
                f"median {med(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}), "
                f"{med(r['ctx_switches'] for r in s.values()):.0f} context switches, caller's CPU "
                f"{med(r['caller_cpu_us_tok'] for r in s.values()):.1f} us/token")
        if all('caller_switches_tok' in r for r in s.values()):
            line += f" and {med(r['caller_switches_tok'] for r in s.values()):.2f} switches/token" 
        if side.startswith("go"):
            g = list(s.values())
            line += (f"; {med(r['events'] / r['polls_with_events'] for r in g):.1f} events per poll, Go dispatch "
                     f"{med(r['go_dispatch_us_poll'] for r in g):.1f} us/poll = {med(r['go_dispatch_ns_tok'] for r in g):.0f} "
                     f"ns/token, cgo call {med(r['cgo_call_ns'] for r in g):.0f} ns")
        print(line)
PY
