#!/usr/bin/env bash
# On the GPU machine, one device call (~5 minutes): the whole GPU test suites (test_gpu_backend,
# test_gpu), what --batch-invariant costs (bench decode with and without it, Llama-3.2-1B and
# Llama-3-8B shapes, batch 1/8/16/64, context 512; INV=0: not), and an A/B of variants (VARIANTS as
# in dec_checks.sh, ROUNDS rounds interleaved) on AB_SHAPES (default the 1B). Everything to stdout
# (the stages also to $OUT/progress).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
ss_limits "${OUT:-$PWD/out-gpu}" 600
VARIANTS=${VARIANTS:-"base: nosk:SS_CUDA_SPLITK=0"}
AB_SHAPES=${AB_SHAPES:-llama32-1b}
ROUNDS=${ROUNDS:-2}
tools/gpu/build_on_device.sh selfserve test_gpu test_gpu_backend > /tmp/inv-build.log 2>&1 || { tail -30 /tmp/inv-build.log; exit 1; }
source build-gpu/env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
stage build
timeout 300 build-gpu/test_gpu_backend > /tmp/inv-be.log 2>&1; stage "test_gpu_backend rc=$?"
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|Failure' /tmp/inv-be.log | head -20
timeout 200 build-gpu/test_gpu > /tmp/inv-k.log 2>&1; stage "test_gpu rc=$?"
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|Failure' /tmp/inv-k.log | head -20
M=/tmp/ssm; mkdir -p $M
for s in $([ "${INV:-1}" = 0 ] || echo llama32-1b llama3-8b) $AB_SHAPES; do ss_model build-gpu/selfserve $M $s > /dev/null; done
stage synth
for s in llama32-1b llama3-8b; do
  [ "${INV:-1}" = 0 ] && break
  for f in "" --batch-invariant; do
    stage "bench decode $s ${f:-(default)}"
    timeout 120 build-gpu/selfserve bench decode --model $M/$s-bf16.gguf --batch 1,8,16,64 --context 512 --steps 16 \
      --reps 3 $f 2>&1 | grep -E '^ +[0-9]+ |error'
  done
done
for r in $(seq "$ROUNDS"); do
  for s in $AB_SHAPES; do
    for v in $VARIANTS; do
      stage "round $r [${v%%:*}] $s"
      env $(ss_envof "$v") timeout 90 build-gpu/selfserve bench decode --model $M/$s-bf16.gguf --batch 1,8 --context 512 \
        --steps 64 --reps 3 2>&1 | grep -E '^ +[0-9]+ |error'
    done
  done
done
stage done
