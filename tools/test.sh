#!/usr/bin/env bash
# The whole test suite on a fresh machine: install, build, fetch the default model, run CTest
# (unit tests, GPU tests report themselves skipped without a GPU) and the end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."
SELFSERVE_PY_DEPS=1 tools/bootstrap.sh
./build/selfserve fetch >/dev/null
ctest --test-dir build --output-on-failure -j "$(nproc)"
if [ -d tests/e2e ] && ls tests/e2e/test_*.py >/dev/null 2>&1; then
  SELFSERVE_BIN="$PWD/build/selfserve" python3 -m pytest -q tests/e2e
fi
