#!/usr/bin/env bash
# On the GPU machine, after tools/gpu/build_on_device.sh: issue 17's experiment C in one call. The
# same server (CUDA backend, a random-weights GGUF of a real shape, seed 1) under --scheduling host
# and --scheduling persistent, interleaved, each driven by `selfserve bench serve` at open-loop
# Poisson rates with short prompts (TTFT, TPOT p50/p99, throughput), while nvidia-smi samples the
# GPU's busy share every 100 ms (its log beside each run). Requests are greedy (temperature 0): the
# device loop runs only greedy sequences, and the API's default temperature (1) would send every
# request to the host executor beside it.
# usage: tools/gpu/bench_serving.sh [shape] [rates]   (default llama32-1b, rates 4,16,64; N requests a rate;
#        BUILD=build DEVICE=cpu N=4 tools/gpu/bench_serving.sh smollm2-135m 2 tries it on a CPU machine)
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${BUILD:-build-gpu}
[ -f "$B/env.sh" ] && source "$B/env.sh"
OUT=${OUT:-$PWD/out-gpu}
MODELS=${MODELS:-/tmp/ssm}
mkdir -p "$OUT" "$MODELS"
S=$B/selfserve
shape=${1:-llama32-1b}
rates=${2:-4,16,64}
N=${N:-96}
source tools/gpu/common.sh
f=$(ss_model "$S" "$MODELS" "$shape")
port=18441
for round in 1 2; do
  for sch in host persistent; do
    tag=$shape-$sch-$round
    "$S" serve --model "$f" --device "${DEVICE:-cuda}" --port "$port" --scheduling "$sch" --cpu-fallback off \
      > "$OUT/serve-$tag-server.log" 2>&1 &
    pid=$!
    ss_wait_healthy "$port" "$pid"
    nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader -lms 100 > "$OUT/serve-$tag-util.csv" 2>/dev/null &
    smi=$!
    timeout 300 "$S" bench serve --url "http://127.0.0.1:$port" --rate "$rates" --num-requests "$N" --duration 60 \
      --mix 1,0,0 --output-tokens 64,128 --seed 7 \
      --extra-body '{"temperature": 0}' > "$OUT/serve-$tag.txt" 2>&1
    echo "$tag rc=$?"
    kill "$smi" 2>/dev/null
    ss_get "http://127.0.0.1:$port/metrics" | grep -E '^selfserve_(engine_|generation_tokens|prompt_tokens)' > "$OUT/serve-$tag-metrics.txt"
    kill -TERM "$pid"
    wait "$pid"
    port=$((port + 1))
  done
done
