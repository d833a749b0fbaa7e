#!/usr/bin/env bash
# On the GPU machine: tests/e2e against build-gpu/selfserve, whose default device there is the GPU
# (issue 16: the whole OpenAI server on the GPU, the same e2e tests). Needs the model pieces
# (tools/gpu/e2e_piece.sh in earlier calls, .gpu-e2e-c carried now) and the wheels of .gpu-e2e-c.
# usage: tools/gpu/e2e_on_device.sh [pytest args]; the log is on stdout.
set -uo pipefail
cd "$(dirname "$0")/../.."
export SELFSERVE_HOME=/tmp/ss-e2e/home
m=$SELFSERVE_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$(dirname "$m")"
if [ ! -f "$m" ]; then
  cp .gpu-e2e-c/model.part-c /tmp/ss-e2e/ 2> /dev/null
  cat /tmp/ss-e2e/model.part-a /tmp/ss-e2e/model.part-b /tmp/ss-e2e/model.part-c > "$m.tmp" 2> /dev/null
  if [ "$(sha256sum < "$m.tmp" | cut -d' ' -f1)" != "$(cat .gpu-e2e-c/model.sha256 2> /dev/null)" ]; then
    echo "e2e: the default model's pieces are missing or do not add up (tools/gpu/fetch_e2e_deps.sh says how)"
    rm -f "$m.tmp"
    exit 2
  fi
  mv "$m.tmp" "$m"
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ss-e2e/site \
  .gpu-e2e-c/wheels/*.whl || exit 2
[ -f build-gpu/env.sh ] && source build-gpu/env.sh
# Some tests run two or three servers at once: each takes 12% of the card, not 90%.
SELFSERVE_E2E_GPU_MEMORY=${SELFSERVE_E2E_GPU_MEMORY:-0.12} PYTHONPATH=/tmp/ss-e2e/site SELFSERVE_BIN=${SELFSERVE_BIN:-$PWD/build-gpu/selfserve} python3 -m pytest -q -p no:cacheprovider \
  --timeout 300 tests/e2e "$@"
