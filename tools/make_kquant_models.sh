#!/usr/bin/env bash
# The default model requantized by llama.cpp's llama-quantize into the GGUF types people download
# (Q4_K_M, Q5_K_M, Q6_K, Q3_K_M, IQ4_XS, ...), beside it in the models folder, for the whole-model
# test (tests/unit/backend/kquant_model_test.cpp, RequantizedDefaultModel) and
# tools/bench_cpu_vs_llamacpp.sh. llama.cpp is built from the source the PyPI sdist of
# llama-cpp-python vendors (a tool, never part of the product); docs/perf/cpu.md names the version.
#
#   tools/make_kquant_models.sh [TYPE...]      prints the files, one a line
#
# LLAMA_DIR: an existing llama.cpp build folder (bin/llama-quantize); else one is built under WORK
# (default /tmp/selfserve-llamacpp; ~15 min on 2 cores). MODEL: the source GGUF (default: the
# default model). The source is Q4_1, hence --allow-requantize: fine for speed and kernel checks,
# not for judging quality.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${MODEL:-$(build/selfserve fetch)}
OUT=${OUT:-$(dirname "$SRC")}
WORK=${WORK:-/tmp/selfserve-llamacpp}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
if [ -z "${LLAMA_DIR:-}" ]; then
  LLAMA_DIR=$WORK/build
  if [ ! -x "$LLAMA_DIR/bin/llama-quantize" ]; then
    mkdir -p "$WORK"
    [ -f "$WORK/llama_cpp_python-$VERSION.tar.gz" ] ||
      python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK" >&2
    tar xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
    # The flags of docs/perf/cpu.md's baseline: every ISA the CPU has except AMX.
    cmake -S "$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp" -B "$LLAMA_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
      -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
      -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_OPENMP=ON \
      -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >&2
    cmake --build "$LLAMA_DIR" -j "${JOBS:-2}" --target llama-quantize llama-bench llama-batched-bench >&2
  fi
fi
base=$(basename "$SRC" .gguf)
base=${base%.*}  # SmolLM2-135M-Instruct.Q4_1 -> SmolLM2-135M-Instruct
for t in ${*:-Q4_K_M Q5_K_M Q6_K Q3_K_M IQ4_XS Q4_0 Q8_0}; do
  dst=$OUT/$base.$t.gguf
  if [ ! -s "$dst" ]; then
    "$LLAMA_DIR/bin/llama-quantize" --allow-requantize "$SRC" "$dst.part" "$t" >&2
    mv "$dst.part" "$dst"
  fi
  echo "$dst"
done
