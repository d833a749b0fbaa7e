#!/usr/bin/env bash
# Here: what the e2e tests (tests/e2e) need on the GPU machine, which has pytest, requests and numpy
# but neither the default model (no network there) nor the openai client, jsonschema, gguf or
# opentelemetry-proto. The device tool carries at most 64 MiB a call with the working tree, and the
# model is 98 MB, so it travels in three pieces:
#   .gpu-e2e-a/  the model's first 46 MiB      (carried alone, first call: tools/gpu/e2e_piece.sh)
#   .gpu-e2e-b/  the next 46 MiB               (carried alone, second call: tools/gpu/e2e_piece.sh)
#   .gpu-e2e-c/  the rest, its sha256 and the wheels (carried with the pending pipeline, which puts
#                the pieces together, checks them and runs tests/e2e on the GPU: e2e_on_device.sh)
# Keep the machine warm between the calls (each within 30 s of the last): the pieces wait in /tmp.
set -euo pipefail
cd "$(dirname "$0")/../.."
M=${SELFSERVE_HOME:-$HOME/.cache/selfserve}/models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$M" ] || build/selfserve fetch > /dev/null
rm -rf .gpu-e2e-a .gpu-e2e-b .gpu-e2e-c
mkdir -p .gpu-e2e-a .gpu-e2e-b .gpu-e2e-c/wheels
dd if="$M" of=.gpu-e2e-a/model.part-a bs=1M count=46 status=none
dd if="$M" of=.gpu-e2e-b/model.part-b bs=1M skip=46 count=46 status=none
dd if="$M" of=.gpu-e2e-c/model.part-c bs=1M skip=92 status=none
sha256sum < "$M" | cut -d' ' -f1 > .gpu-e2e-c/model.sha256
# Python 3.12 on the GPU machine (/opt/torch/.venv): the test packages it lacks with every dependency
# (the versions openai wants, e.g. httpx2, may be newer than its own), but numpy (16 MB; it has 2.x).
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .gpu-e2e-c/wheels openai jsonschema gguf opentelemetry-proto
rm -f .gpu-e2e-c/wheels/numpy-*.whl
du -sh .gpu-e2e-a .gpu-e2e-b .gpu-e2e-c
