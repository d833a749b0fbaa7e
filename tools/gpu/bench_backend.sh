#!/usr/bin/env bash
# On the GPU machine: builds selfserve with its CUDA plugin (tools/gpu/build_on_device.sh), runs the
# backend's GPU tests, writes random-weights models of real shapes with `selfserve synth` (bf16
# safetensors, seed 1) and benchmarks the CUDA backend on them: `bench decode` (batch 1/16/64 at
# context 512, graphs and --enforce-eager) and `bench offline` (pp512 / tg128).
# usage: tools/gpu/bench_backend.sh [shape ...] (default: smollm2-135m llama32-1b llama3-8b)
set -uo pipefail
cd "$(dirname "$0")/../.."
tools/gpu/build_on_device.sh selfserve selfserve_cuda test_gpu_backend || exit 1
source build-gpu/env.sh
S=build-gpu/selfserve
M=${MODELS:-/tmp/ssmodels}
mkdir -p "$M"
build-gpu/test_gpu_backend --gtest_brief=1 || echo "=== test_gpu_backend FAILED"
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(smollm2-135m llama32-1b llama3-8b)
for shape in "${shapes[@]}"; do
  echo "=== $shape"
  [ -f "$M/$shape/config.json" ] || /usr/bin/time -f "synth: %e s, %M KB" "$S" synth --shape "$shape" \
    --format safetensors --dtype bf16 --seed 1 --out "$M/$shape" --quiet
  /usr/bin/time -f "bench decode: %e s" "$S" bench decode --model "$M/$shape" --device cuda --batch 1,16,64 \
    --context 512 --steps 64 --reps 3
  "$S" bench decode --model "$M/$shape" --device cuda --enforce-eager --batch 1 --context 512 --steps 32 --reps 3 |
    sed 's/^/eager: /'
  "$S" bench offline --model "$M/$shape" --device cuda --threads 16 --prompt-tokens 512 --gen-tokens 128 --reps 3
done
# QUANT=1: the same decode bench on GGUF Q4_0 / Q4_1 / Q8_0 files (seed 1) kept quantized on the GPU
# (--gpu-native-quant) beside the bf16 conversion of the same file.
if [ "${QUANT:-0}" = 1 ]; then
  for shape in "${shapes[@]}"; do
    for dt in q4_0 q4_1 q8_0; do
      f="$M/$shape-$dt.gguf"
      [ -f "$f" ] || "$S" synth --shape "$shape" --format gguf --dtype "$dt" --seed 1 --out "$f" --quiet
      echo "=== $shape $dt native"
      "$S" bench decode --model "$f" --device cuda --gpu-native-quant --batch 1,8 --context 512 --steps 64 --reps 3
      echo "=== $shape $dt as bf16"
      "$S" bench decode --model "$f" --device cuda --batch 1 --context 512 --steps 64 --reps 3
    done
  done
fi
