#!/usr/bin/env bash
# A/B of two builds of selfserve on the default model, interleaved so that a slow spell of a shared
# machine hits both: `bench offline` (pp512 / tg128, 2 threads), `bench decode` (batch 1 and 16 at
# context 130) and the decode-scaling part of tools/bench_serving.sh, ROUNDS times each, A then B.
# usage: A=path/to/old/selfserve B=build/selfserve [ROUNDS=3] tools/ab_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
A=${A:?old binary}; B=${B:-build/selfserve}; ROUNDS=${ROUNDS:-3}
OUT=${OUT:-/tmp/selfserve-ab}; mkdir -p "$OUT"
for r in $(seq "$ROUNDS"); do
  for side in A B; do
    bin=${!side}
    echo "== round $r $side ($bin)"
    "$bin" bench offline --threads 2 --prompt-tokens 512 --gen-tokens 128 --reps 3 --json "$OUT/offline_${side}_$r.json" | grep -E "^ +2 "
    "$bin" bench decode --batch 1,16 --context 130 --json "$OUT/decode_${side}_$r.json" | grep -E "^ +(1|16) "
    SERVER=$bin SCALING_ONLY=1 ROUNDS=1 OUT="$OUT/serve_${side}_$r" tools/bench_serving.sh 2>&1 | grep -E "c=|decode-only|ratio" || true
  done
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys, statistics as st
out, rounds = sys.argv[1], int(sys.argv[2])
for side in "AB":
    off = [json.load(open(f"{out}/offline_{side}_{r}.json"))["results"][0] for r in range(1, rounds + 1)]
    dec = [json.load(open(f"{out}/decode_{side}_{r}.json"))["results"] for r in range(1, rounds + 1)]
    pp = st.median(o["prefill_tok_s"] for o in off); tg = st.median(o["decode_tok_s"] for o in off)
    d1 = st.median(d[0]["step_ms"] for d in dec); d16 = st.median(d[1]["step_ms"] for d in dec)
    print(f"{side}: offline pp512 {pp:.1f} tok/s, tg128 {tg:.1f} tok/s | decode step b1 {d1:.3f} ms, b16 {d16:.3f} ms (medians of {rounds})")
PY
