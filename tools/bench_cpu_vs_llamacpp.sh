#!/usr/bin/env bash
# selfserve bench offline next to llama.cpp's llama-bench on the same GGUF, same machine, same
# prompt/decode lengths, runs interleaved so both see the same background load.
# LLAMA_BENCH: path to a llama-bench binary (built from the llama.cpp source that the PyPI sdist of
# llama-cpp-python vendors; see docs/perf/cpu.md for the exact build flags).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-$(build/selfserve fetch)}
ROUNDS=${ROUNDS:-2}
for r in $(seq "$ROUNDS"); do
  echo "== round $r: selfserve"
  build/selfserve bench offline --model "$MODEL" --threads 1,2 --prompt-tokens 512 --gen-tokens 128 --reps 3
  if [ -n "${LLAMA_BENCH:-}" ]; then
    echo "== round $r: llama.cpp"
    "$LLAMA_BENCH" -m "$MODEL" -p 512 -n 128 -t 1,2 -r 3 -o md 2>/dev/null
  fi
done
