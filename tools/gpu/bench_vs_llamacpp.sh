#!/usr/bin/env bash
# On the GPU machine: selfserve's CUDA backend beside llama.cpp's (0c1e570, the PyPI sdist's, built
# here with CUDA for sm_90) on the SAME random-weights GGUF files (`selfserve synth --format gguf`,
# seed 1; llama.cpp reads them as they are), benchmarks interleaved model by model in one run:
#   llama-bench -ngl 99 -fa 1 -p 512 -n 128 -d 0,512  (pp512, tg128 at depth 0 and 512)
#   selfserve bench decode --context 512 (batch 1, 8; 8B bf16 also 16 and 64) and bench offline pp512/tg128
#   llama-batched-bench -npp 512 -ntg 128 -npl 1,16,64 on the 8B bf16 file
# The pipeline runs detached (it outlasts one 10-minute call): call this script again within 30 s of
# the previous call's end to keep waiting; results and logs are copied to $OUT each time.
# Needs .lcp/llama.cpp.tgz (tools/gpu/fetch_llamacpp.sh) and .gpu-deps/ carried.
# WHILE_LLAMACPP_BUILDS=<command> runs after selfserve's build and the synth, while llama.cpp still
# builds, with MODELS (the GGUF folder) and OUT (a folder in the results) set, e.g.
# WHILE_LLAMACPP_BUILDS='PARTS=tests tools/gpu/bench_scheduling.sh'; AFTER_LLAMACPP_BUILDS=<command> the same
# once llama.cpp is built (timings then share the machine with nothing), before its benchmarks.
# usage: tools/gpu/bench_vs_llamacpp.sh [WAIT_S=560] [model ...]  (model: shape:dtype, e.g. llama3-8b:q4_0)
set -uo pipefail
cd "$(dirname "$0")/../.."
W=/tmp/ssvs

if [ "${1:-}" = --pipeline ]; then
  shift
  R=$W/res L=$W/logs M=$W/models
  mkdir -p "$R" "$L" "$M"
  T0=$(date +%s)
  stage() { echo "$(date +%T) [+$(($(date +%s) - T0))s] $*" | tee -a "$L/progress"; }
  models=("$@")
  [ ${#models[@]} -gt 0 ] || models=(smollm2-135m:bf16 llama32-1b:bf16 llama3-8b:bf16 llama32-1b:q4_0 llama3-8b:q4_0 llama3-8b:q4_1)
  { nvidia-smi; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv; } > "$R/env.txt" 2>&1
  git log -1 --format='selfserve commit %H %cd' >> "$R/env.txt" 2>/dev/null
  tar xzf .lcp/llama.cpp.tgz -C "$W"
  LB=$W/lcp-build
  (cmake -S "$W/llama.cpp" -B "$LB" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \
     -DLLAMA_OPENSSL=OFF -DGGML_CUDA_NCCL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
     -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_COMMIT=0c1e57098 &&
   cmake --build "$LB" -j 12 --target llama-bench llama-batched-bench) > "$L/lcp_build.log" 2>&1 &
  LPID=$!
  tools/gpu/build_on_device.sh selfserve selfserve_cuda > "$L/ss_build.log" 2>&1
  stage "selfserve build rc=$?"
  source build-gpu/env.sh
  S=build-gpu/selfserve
  for m in "${models[@]}"; do
    shape=${m%%:*} dt=${m#*:}
    [ -s "$M/$shape-$dt.gguf" ] && continue
    "$S" synth --shape "$shape" --format gguf --dtype "$dt" --seed 1 --out "$M/$shape-$dt.gguf" --quiet >> "$L/synth.log" 2>&1
    stage "synth $m rc=$?"
  done
  if [ -n "${WHILE_LLAMACPP_BUILDS:-}" ]; then
    MODELS=$M OUT=$R/extra bash -c "$WHILE_LLAMACPP_BUILDS" > "$L/extra.log" 2>&1
    stage "WHILE_LLAMACPP_BUILDS rc=$?"
  fi
  wait $LPID
  stage "llama.cpp build rc=$?"
  if [ -n "${AFTER_LLAMACPP_BUILDS:-}" ]; then
    MODELS=$M OUT=$R/extra bash -c "$AFTER_LLAMACPP_BUILDS" > "$L/extra-after.log" 2>&1
    stage "AFTER_LLAMACPP_BUILDS rc=$?"
  fi
  BIN=$LB/bin
  for m in "${models[@]}"; do
    shape=${m%%:*} dt=${m#*:}
    f=$M/$shape-$dt.gguf
    [ -s "$f" ] || continue
    native=()
    [ "$dt" = bf16 ] || native=(--gpu-native-quant)
    batches=1,8
    [ "$m" = llama3-8b:bf16 ] && batches=1,8,16,64
    timeout 300 "$BIN/llama-bench" -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -d 0,512 -r 3 -o md > "$R/lb-$shape-$dt.md" 2> "$L/lb-$shape-$dt.log"
    stage "llama-bench $m rc=$?"
    timeout 300 "$S" bench decode --model "$f" --device cuda "${native[@]}" --batch "$batches" --context 512 --steps 64 \
      --reps 3 > "$R/ss-decode-$shape-$dt.txt" 2>&1
    stage "selfserve bench decode $m rc=$?"
    timeout 300 "$S" bench offline --model "$f" --device cuda "${native[@]}" --threads 16 --prompt-tokens 512 \
      --gen-tokens 128 --reps 3 > "$R/ss-offline-$shape-$dt.txt" 2>&1
    stage "selfserve bench offline $m rc=$?"
    if [ "$m" = llama3-8b:bf16 ]; then
      timeout 300 "$BIN/llama-batched-bench" -m "$f" -c 65536 -b 2048 -ub 512 -ngl 99 -fa on -npp 512 -ntg 128 \
        -npl 1,16,64 > "$R/bb-$shape-$dt.txt" 2>&1
      stage "llama-batched-bench $m rc=$?"
    fi
  done
  stage "done"
  touch "$W/done"
  exit 0
fi

WAIT=${1:-560}
[ $# -gt 0 ] && shift
OUT=${OUT:-$PWD/out-gpu}
mkdir -p "$OUT" "$W"
S0=$(date +%s)
if [ ! -f "$W/pid" ]; then
  [ -f .lcp/llama.cpp.tgz ] || { echo "no .lcp/llama.cpp.tgz: run tools/gpu/fetch_llamacpp.sh and carry .lcp"; exit 1; }
  setsid nohup bash "$0" --pipeline "$@" > "$W/pipeline.out" 2>&1 < /dev/null &
  echo $! > "$W/pid"
  echo "pipeline started (pid $(cat "$W/pid"))"
fi
while [ ! -f "$W/done" ] && [ $(($(date +%s) - S0)) -lt "$WAIT" ] && kill -0 "$(cat "$W/pid")" 2>/dev/null; do sleep 3; done
echo "=== waited $(($(date +%s) - S0)) s; done: $([ -f "$W/done" ] && echo yes || echo no)"
cat "$W/logs/progress" "$W/res/extra/progress" 2>/dev/null
grep -E "error|FAILED" "$W/logs/"*build.log 2>/dev/null | head -10
tail -n 3 "$W/pipeline.out"
for f in "$W"/res/*; do [ -f "$f" ] && { echo "=== $(basename "$f")"; cat "$f"; }; done
tar czf "$OUT/vs_llamacpp.tgz" -C "$W" res logs 2>/dev/null
true
