#!/usr/bin/env bash
# On the GPU machine: keeps a carried piece of the default model (tools/gpu/fetch_e2e_deps.sh) in
# /tmp/ss-e2e for tools/gpu/e2e_on_device.sh. usage: tools/gpu/e2e_piece.sh .gpu-e2e-a|.gpu-e2e-b
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p /tmp/ss-e2e
cp "${1:?usage: e2e_piece.sh DIR}"/model.part-* /tmp/ss-e2e/
ls -l /tmp/ss-e2e
