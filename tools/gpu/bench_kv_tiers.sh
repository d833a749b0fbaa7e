#!/usr/bin/env bash
# On the GPU machine, after tools/gpu/build_on_device.sh: issue 18's returning-turn TTFT on the CUDA
# backend (the device KV pool the first tier, host RAM the second, disk the third). A conversation
# sends a ~4,000-token history, idles past the KV TTL (its blocks are demoted), then returns; the
# returning turn is sent with its cache_salt (history restored from the tier) and with a fresh salt
# (recomputed), back to back (`bench serve --multi-turn`, as docs/perf/memory.md on the CPU).
# Model: a random-weights GGUF of a real shape (`selfserve synth`, seed 1), default Llama-3-8B bf16.
# usage: tools/gpu/bench_kv_tiers.sh [shape]   (results in $OUT/tiers-*.txt; models in $MODELS;
#        BUILD=build DEVICE=cpu CONV=1 tools/gpu/bench_kv_tiers.sh smollm2-135m tries it on a CPU machine)
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${BUILD:-build-gpu}
[ -f "$B/env.sh" ] && source "$B/env.sh"
DEVICE=${DEVICE:-cuda}
CONV=${CONV:-6}
# --history-tokens: the history's length in tokens, as the server's /tokenize measures them (since
# commit cb88784 bench serve keeps the synth tokenizer's ~4.4 tokens a word; before, 1000 gave ~4,300).
HIST=${HIST:-4000}
OUT=${OUT:-$PWD/out-gpu}
MODELS=${MODELS:-/tmp/ssm}
mkdir -p "$OUT" "$MODELS"
S=$B/selfserve
shape=${1:-llama3-8b}
source tools/gpu/common.sh
f=$(ss_model "$S" "$MODELS" "$shape")
run_tier() {  # name port idle_s server flags...
  local name=$1 port=$2 idle=$3
  shift 3
  "$S" serve --model "$f" --device "$DEVICE" --port "$port" --kv-cache-ttl-ms 1000 --cpu-fallback off "$@" \
    > "$OUT/tiers-$name-server.log" 2>&1 &
  local pid=$!
  ss_wait_healthy "$port" "$pid"
  timeout 240 "$S" bench serve --url "http://127.0.0.1:$port" --multi-turn --conversations "$CONV" --history-tokens "$HIST" --idle "$idle" \
    > "$OUT/tiers-$name.txt" 2>&1
  echo "tier $name rc=$?"
  ss_get "http://127.0.0.1:$port/metrics" | grep -E '^selfserve_kv_(host|disk|restored|demoted)' > "$OUT/tiers-$name-metrics.txt"
  kill -TERM "$pid"
  wait "$pid"
}
run_tier host 18431 3 --kv-host-bytes 8589934592
rm -rf /tmp/ss_kvdisk_gpu
run_tier disk 18432 5 --kv-disk-dir /tmp/ss_kvdisk_gpu --kv-disk-bytes 8589934592
