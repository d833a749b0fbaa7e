#!/usr/bin/env bash
# selfserve bench offline next to llama.cpp's llama-bench on the same GGUF files, same machine, same
# prompt/decode lengths, runs interleaved (per file: ours, then llama.cpp) so both see the same
# background load.
# LLAMA_BENCH: path to a llama-bench binary (built from the llama.cpp source that the PyPI sdist of
# llama-cpp-python vendors; see docs/perf/cpu.md for the exact build flags; tools/make_kquant_models.sh
# builds it). MODELS: the GGUF files, space-separated (default: the default model; the block-type table
# of docs/perf/cpu.md uses the files tools/make_kquant_models.sh writes). THREADS: default 1,2.
#
# BATCH=1 compares batched decode instead: selfserve bench decode --batch 1,16 (CONTEXT tokens already
# in each sequence's cache, default 128) beside llama.cpp's llama-batched-bench -npl 1,16 on the same
# file and prompt length (LLAMA_BATCHED_BENCH: its binary; S_TG is its aggregate decode rate), one
# thread count (THREADS, default 2). The load average is printed before each side: the 2-core
# machine is shared, and a loaded round says little.
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS=${MODELS:-${MODEL:-$(build/selfserve fetch)}}
ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-1,2}
if [ "${BATCH:-0}" = 1 ]; then
  T=${THREADS:-2}
  [ "$T" = 1,2 ] && T=2
  CONTEXT=${CONTEXT:-128}
  grep -m1 'model name' /proc/cpuinfo
  for r in $(seq "$ROUNDS"); do
    for m in $MODELS; do
      echo "== round $r: $(basename "$m"): selfserve (load average $(cut -d' ' -f1-3 /proc/loadavg))"
      build/selfserve bench decode --model "$m" --threads "$T" --batch 1,16 --context "$CONTEXT" --steps 64 --reps 3
      if [ -n "${LLAMA_BATCHED_BENCH:-}" ]; then
        echo "== round $r: $(basename "$m"): llama.cpp (load average $(cut -d' ' -f1-3 /proc/loadavg))"
        "$LLAMA_BATCHED_BENCH" -m "$m" -c $((16 * (CONTEXT + 64))) -b 2048 -ub 512 -npp "$CONTEXT" -ntg 64 \
          -npl 1,16 -t "$T" -tb "$T" 2>/dev/null
      fi
    done
  done
  exit 0
fi
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
