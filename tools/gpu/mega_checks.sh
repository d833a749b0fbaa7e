#!/usr/bin/env bash
# On the GPU machine, one device call (~5 minutes): issue 17's persistent decode kernel
# (kernels/mega.cu, SS_CUDA_MEGA=1). Builds selfserve and test_gpu_backend, runs the kernel's test
# in each of MODES (default: a barrier after every operation, and its readiness counters,
# SS_CUDA_MEGA_SYNC=counters; SS_CUDA_MEGA_DEAL=rr deals tiles round-robin), the decode step of
# each against the PDL-chained kernels (interleaved, batch 1/2/8, context 512) at the SHAPES
# (default 135M, 1B and 8B), the kernel's per-part trace (SS_CUDA_MEGA_TRACE=1, eager) in each
# mode, and ncu on one launch at 8B (NCU=0: none). Results in $OUT (progress, logs).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
OUT=${OUT:-$PWD/out-gpu}
# LIMIT_S (default 300): want EST skips a step that would end past it (says so).
ss_limits "$OUT" "${LIMIT_S:-300}"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv; } > "$OUT/env.txt" 2>&1
tools/gpu/build_on_device.sh selfserve test_gpu_backend > "$OUT/build.log" 2>&1 || { stage "build failed"; tail -30 "$OUT/build.log"; exit 1; }
stage build
source build-gpu/env.sh
B=build-gpu M=/tmp/ssm
mkdir -p $M
SHAPES=${SHAPES:-"smollm2-135m llama32-1b llama3-8b"}
for s in $SHAPES; do
  [ -s $M/$s-bf16.gguf ] || $B/selfserve synth --shape $s --format gguf --dtype bf16 --seed 1 --out $M/$s-bf16.gguf --quiet
done
stage synth
# MODES: the persistent kernel's variants (name:ENV=V[,ENV2=V2]), each tested and timed beside the chain.
MODES=${MODES:-"bar:SS_CUDA_MEGA_SYNC=barriers cnt:SS_CUDA_MEGA_SYNC=counters"}
for v in $MODES; do
  n=${v%%:*}
  env $(ss_envof "$v") timeout 200 $B/test_gpu_backend --gtest_filter='CudaMegakernel.*' > "$OUT/t-mega-$n.txt" 2>&1
  stage "CudaMegakernel [$n] rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/t-mega-$n.txt" | tr '\n' ' ') $(grep -E 'Failure|error:' "$OUT/t-mega-$n.txt" | head -4 | cut -c1-160 | tr '\n' ';')"
done
rowsof() { grep -E '^ +[0-9]+ ' "$1" | awk '{print $1 ":" $2}' | tr '\n' ' '; }
# In order of importance (a call that runs out of time still brings back what $OUT holds).
# chain: the PDL-chained kernels; then the persistent kernel in each of MODES.
for s in $SHAPES; do
  est=12
  [ $s = llama3-8b ] && est=40
  for v in chain:SS_CUDA_MEGA=0 $MODES; do
    n=${v%%:*}
    want $est "decode $s $n" || continue
    f="$OUT/dec-$s-$n.txt"
    mg=SS_CUDA_MEGA=1
    [ $n = chain ] && mg=
    env $mg $(ss_envof "$v") timeout 120 $B/selfserve bench decode --model $M/$s-bf16.gguf --device cuda --batch 1,2,8 \
      --context 512 --steps 64 --reps 3 > "$f" 2>&1
    stage "decode $s $n rc=$? $(rowsof "$f") $(grep -iE 'error|ignored|failed' "$f" | head -2 | tr '\n' ';')"
  done
  [ $s = llama32-1b ] && continue
  for v in $MODES; do
    n=${v%%:*}
    want $((est + 5)) "trace $s $n" || continue
    env SS_CUDA_MEGA=1 $(ss_envof "$v") SS_CUDA_MEGA_TRACE=1 timeout 120 $B/selfserve bench decode --model $M/$s-bf16.gguf \
      --device cuda --enforce-eager --batch 1 --context 512 --steps 16 --reps 2 > "$OUT/trace-$s-$n.txt" 2>&1
    stage "trace $s $n rc=$? $(grep -E 'mega (trace|barriers)' "$OUT/trace-$s-$n.txt" | tr '\n' ' ')"
  done
done
if [ "${NCU:-1}" = 1 ] && [[ " $SHAPES " == *" llama3-8b "* ]] && want 60 "ncu 8B"; then
  SS_CUDA_MEGA=1 timeout 150 ncu --kernel-name regex:mega_k --launch-skip 3 --launch-count 1 --section SpeedOfLight \
  --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats $B/selfserve bench decode \
  --model $M/llama3-8b-bf16.gguf --device cuda --enforce-eager --batch 1 --context 512 --steps 8 --reps 1 \
  > "$OUT/ncu-mega-8b.txt" 2>&1
  stage "ncu 8B rc=$? $(grep -E 'Duration|DRAM Throughput|Warp Cycles Per Issued' "$OUT/ncu-mega-8b.txt" | tr -s ' ' | tr '\n' ';')"
fi
stage done
