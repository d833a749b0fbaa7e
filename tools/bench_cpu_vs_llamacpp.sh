#!/usr/bin/env bash
# selfserve bench offline next to llama.cpp's llama-bench on the same GGUF files, same machine, same
# prompt/decode lengths, runs interleaved (per file: ours, then llama.cpp) so both see the same
# background load.
# LLAMA_BENCH: path to a llama-bench binary (built from the llama.cpp source that the PyPI sdist of
# llama-cpp-python vendors; see docs/perf/cpu.md for the exact build flags; tools/make_kquant_models.sh
# builds it). MODELS: the GGUF files, space-separated (default: the default model; the block-type table
# of docs/perf/cpu.md uses the files tools/make_kquant_models.sh writes). THREADS: default 1,2.
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS=${MODELS:-${MODEL:-$(build/selfserve fetch)}}
ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-1,2}
for r in $(seq "$ROUNDS"); do
  for m in $MODELS; do
    echo "== round $r: $(basename "$m"): selfserve"
    build/selfserve bench offline --model "$m" --threads "$THREADS" --prompt-tokens 512 --gen-tokens 128 --reps 3
    if [ -n "${LLAMA_BENCH:-}" ]; then
      echo "== round $r: $(basename "$m"): llama.cpp"
      "$LLAMA_BENCH" -m "$m" -p 512 -n 128 -t "$THREADS" -r 3 -o md 2>/dev/null
    fi
  done
done
