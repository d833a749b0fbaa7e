#!/usr/bin/env bash
# On the GPU machine, one device call (~6 minutes): weight loads as L2 evict-first
# (SELFSERVE_L2_EVICT_FIRST, the default) against a baseline build without the hint, decode at
# batch 1/2/8/16 (8B also 64), context 512, the PDL chain of both builds and the persistent kernel
# (SS_CUDA_MEGA=1) of the new one, interleaved a shape at a time. Kernel and backend tests on the
# new build first (TESTS= skips them; VARIANTS picks name:builddir:mega triples). Results in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out-gpu}
mkdir -p "$OUT"
T0=$(date +%s)
stage() { echo "$(date +%T) [+$(($(date +%s) - T0))s] $*" | tee -a "$OUT/progress"; }
LIMIT_S=${LIMIT_S:-420}
want() { [ $(($(date +%s) - T0 + $1)) -le "$LIMIT_S" ] && return 0; stage "skipped (time): $2"; return 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/env.txt" 2>&1
tools/gpu/build_on_device.sh selfserve selfserve_cuda ${TESTS-test_gpu test_gpu_backend} > "$OUT/build.log" 2>&1 || { stage "build failed"; tail -30 "$OUT/build.log"; exit 1; }
stage build
BUILD_DIR=build-gpu-base CMAKE_EXTRA=-DSELFSERVE_L2_EVICT_FIRST=OFF tools/gpu/build_on_device.sh selfserve selfserve_cuda > "$OUT/build-base.log" 2>&1 ||
  { stage "base build failed"; tail -30 "$OUT/build-base.log"; exit 1; }
stage "base build (base $(grep -o 'SS_L2_EVICT_FIRST=[01]' build-gpu-base/build.ninja | sort -u), new $(grep -o 'SS_L2_EVICT_FIRST=[01]' build-gpu/build.ninja | sort -u))"
source build-gpu/env.sh
M=/tmp/ssm
mkdir -p $M
for s in smollm2-135m llama32-1b llama3-8b; do
  [ -s $M/$s-bf16.gguf ] || build-gpu/selfserve synth --shape $s --format gguf --dtype bf16 --seed 1 --out $M/$s-bf16.gguf --quiet
done
stage synth
if [ -n "${TESTS-x}" ]; then
timeout 120 build-gpu/test_gpu > "$OUT/t-gpu.txt" 2>&1
stage "test_gpu rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/t-gpu.txt" | tr '\n' ' ')"
timeout 200 build-gpu/test_gpu_backend --gtest_filter='CudaMegakernel.*:CudaForwardRealHeads.*:CudaGraphs.*:CudaNativeQuant.*:TinyModels/CudaForward.*' > "$OUT/t-backend.txt" 2>&1
stage "test_gpu_backend rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/t-backend.txt" | tr '\n' ' ') $(grep -E 'Failure' -A3 "$OUT/t-backend.txt" | head -6 | cut -c1-160 | tr '\n' ';')"
fi
rowsof() { grep -E '^ +[0-9]+ ' "$1" | awk '{print $1 ":" $2}' | tr '\n' ' '; }
for s in smollm2-135m llama32-1b llama3-8b; do
  est=15 b=1,2,8,16
  [ $s = llama3-8b ] && est=55 b=1,2,8,16,64
  for v in ${VARIANTS:-base:build-gpu-base:0 hint:build-gpu:0 mega:build-gpu:1}; do
    IFS=: read -r n d mg <<< "$v"
    want $est "$s $n" || continue
    f="$OUT/dec-$s-$n.txt"
    SS_CUDA_MEGA=$mg timeout 150 $d/selfserve bench decode --model $M/$s-bf16.gguf --device cuda --batch $b --context 512 \
      --steps 64 --reps 3 > "$f" 2>&1
    stage "$s $n rc=$? $(rowsof "$f") $(grep -iE 'error|ignored|failed' "$f" | head -2 | tr '\n' ';')"
  done
done
# Time left: racecheck and memcheck on the split-keys merge (shared memory between warps), not yet run.
if want 150 "racecheck split keys"; then
  timeout 150 compute-sanitizer --tool racecheck --error-exitcode 1 build-gpu/test_gpu \
    --gtest_filter='GpuAttention.PrefillTilesOnTensorCoresMatchHost' > "$OUT/racecheck-split.txt" 2>&1
  stage "racecheck prefill tiles rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck-split.txt" | tail -1)"
fi
if want 100 "memcheck split keys"; then
  timeout 100 compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/test_gpu \
    --gtest_filter='GpuAttention.PrefillTiles*:GpuAttention.DeviceTiles*' > "$OUT/memcheck-split.txt" 2>&1
  stage "memcheck prefill tiles rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck-split.txt" | tail -1)"
fi
stage done
