#!/usr/bin/env bash
# On the GPU machine: issue 17's device loop checked and measured in one call (carry .gpu-deps).
#   1. builds selfserve, the CUDA plugin and the GPU tests (tools/gpu/build_on_device.sh);
#   2. runs the device loop's tests (tests/gpu/device_loop_test.cpp), the rest of test_gpu_backend and
#      the kernel tests (test_gpu);
#   3. decode through the engine, batch 1, pp512/tg256, `bench offline --scheduling host` (the host
#      plans each step and replays a graph) beside `--scheduling persistent` (the GPU schedules
#      itself), interleaved twice per model, on random-weights models of real shapes (seed 1).
# Results go to $OUT (log, one file per bench); models in $MODELS (default /tmp/ssm, an existing file is
# reused); PARTS=tests or PARTS=bench runs only steps 1-2 or 1 and 3.
# usage: tools/gpu/bench_scheduling.sh [shape ...]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out-gpu}
MODELS=${MODELS:-/tmp/ssm}
PARTS=${PARTS:-all}  # tests | bench | all
mkdir -p "$OUT" "$MODELS"
T0=$(date +%s)
say() { echo "$(date +%T) [+$(($(date +%s) - T0))s] $*" | tee -a "$OUT/progress"; }
tools/gpu/build_on_device.sh selfserve selfserve_cuda test_gpu test_gpu_backend >> "$OUT/build.log" 2>&1
say "build rc=$?"
source build-gpu/env.sh
S=build-gpu/selfserve
source tools/gpu/common.sh
git log -1 --format='commit %H %cd' > "$OUT/env.txt" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv >> "$OUT/env.txt" 2>&1
if [ "$PARTS" != bench ]; then
  timeout 180 build-gpu/test_gpu_backend --gtest_filter='*DeviceLoop*' > "$OUT/test_device_loop.log" 2>&1
  say "device loop tests rc=$?"
  timeout 180 build-gpu/test_gpu_backend --gtest_filter='-*DeviceLoop*' --gtest_brief=1 > "$OUT/test_gpu_backend.log" 2>&1
  say "other backend tests rc=$?"
  timeout 180 build-gpu/test_gpu --gtest_brief=1 > "$OUT/test_gpu.log" 2>&1
  say "kernel tests rc=$?"
fi
[ "$PARTS" = tests ] && { say done; exit 0; }
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(smollm2-135m llama32-1b llama3-8b)
for shape in "${shapes[@]}"; do
  f=$(ss_model "$S" "$MODELS" "$shape")
  for round in 1 2; do
    for sch in host persistent; do
      timeout 120 "$S" bench offline --model "$f" --device cuda --threads 16 --prompt-tokens 512 --gen-tokens 256 \
        --reps 3 --scheduling "$sch" > "$OUT/offline-$shape-$sch-$round.txt" 2>&1
      say "$shape $sch round $round rc=$?: $(grep -E '^ +16 ' "$OUT/offline-$shape-$sch-$round.txt" | tr -s ' ')"
    done
  done
done
say done
