#!/usr/bin/env bash
# The main job on a fresh machine: install, build, fetch the default model, chat with it.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/bootstrap.sh
./build/selfserve fetch >/dev/null
exec ./build/selfserve generate --chat --max-tokens 128 --temperature 0.7 --seed 1 \
  --prompt "${1:-In three sentences, why do GPUs run small language models faster when the CPU stays out of the per-token loop?}"
