#!/usr/bin/env bash
# Issue 16's serving comparison: `selfserve serve` and llama.cpp's `llama-server` on the same GGUF file
# and the same card, each driven by `selfserve bench serve` with the same requests (the default mix of
# short, medium and long prompts, seed 7, greedy, ignore_eos, a closed-loop concurrency sweep), the
# two servers interleaved round by round. Throughput and TTFT / TPOT p50 / p99 per level.
# Both servers get the same seats and context: selfserve --max-num-seqs SLOTS (host scheduling, or
# SCHEDULING=persistent), llama-server -np SLOTS -c SLOTS*CTX with flash attention and every layer on
# the GPU. The first selfserve run measures tokens per word with its /tokenize; every later run (and
# llama-server) gets that number (--tokens-per-word), so both see the very same text. (Sized without
# /tokenize at 1.3 tokens a word, a quarter of the prompts of the synthetic models passed 8192 tokens.)
# usage: tools/gpu/bench_serve_vs_llamaserver.sh LLAMA_SERVER MODEL.gguf [concurrency]
#   (default concurrency 1,8,32; N requests a level (64), ROUNDS (2), SLOTS (32), CTX (8192),
#    DEVICE (cuda; cpu with NGL=0 tries it on a machine without a GPU), BUILD (build-gpu), OUT)
set -uo pipefail
cd "$(dirname "$0")/../.."
LS=${1:?usage: bench_serve_vs_llamaserver.sh LLAMA_SERVER MODEL.gguf [concurrency]}
F=${2:?model file}
CONC=${3:-1,8,32}
B=${BUILD:-build-gpu}
[ -f "$B/env.sh" ] && source "$B/env.sh"
OUT=${OUT:-$PWD/out-gpu/serve-vs}
N=${N:-64} ROUNDS=${ROUNDS:-2} SLOTS=${SLOTS:-32} CTX=${CTX:-8192}
DEVICE=${DEVICE:-cuda} NGL=${NGL:-99} SCHEDULING=${SCHEDULING:-host}
mkdir -p "$OUT"
source tools/gpu/common.sh
S=$B/selfserve
port=18461
TPW=
for round in $(seq "$ROUNDS"); do
  for side in selfserve llama-server; do
    tag=$side-$round
    if [ "$side" = selfserve ]; then
      "$S" serve --model "$F" --device "$DEVICE" --port "$port" --max-num-seqs "$SLOTS" --max-model-len "$CTX" \
        --scheduling "$SCHEDULING" --cpu-fallback off > "$OUT/$tag-server.log" 2>&1 &
    else
      "$LS" -m "$F" -ngl "$NGL" -fa on -np "$SLOTS" -c $((SLOTS * CTX)) --host 127.0.0.1 --port "$port" \
        > "$OUT/$tag-server.log" 2>&1 &
    fi
    pid=$!
    if ! ss_wait_healthy "$port" "$pid"; then
      echo "$tag: the server did not become healthy (log: $OUT/$tag-server.log)"
      kill "$pid" 2> /dev/null
      port=$((port + 1))
      continue
    fi
    timeout 900 "$S" bench serve --url "http://127.0.0.1:$port" --concurrency "$CONC" --num-requests "$N" --duration 120 \
      --seed 7 ${TPW:+--tokens-per-word "$TPW"} --max-context "$CTX" --extra-body '{"temperature": 0}' \
      --json "$OUT/$tag.json" > "$OUT/$tag.txt" 2>&1
    echo "$tag rc=$?"
    [ -n "$TPW" ] || TPW=$(python3 -c 'import json, sys; print(repr(json.load(open(sys.argv[1]))["mix"]["tokens_per_word"]))' \
      "$OUT/$tag.json" 2> /dev/null)
    [ -n "$TPW" ] || { echo "$tag: no tokens_per_word in $OUT/$tag.json; the comparison stops"; kill "$pid"; exit 1; }
    grep -E '^c=' "$OUT/$tag.txt"
    kill -TERM "$pid"
    wait "$pid" 2> /dev/null
    port=$((port + 1))
  done
done
