#!/usr/bin/env bash
# On the GPU machine, from a checkout (the device tool runs it in the repository root):
#   tools/gpu/run_queues.sh [reps]        (reps: timed runs per variant in exp_stages, default 200)
# Builds the device queues' tests and experiment A with the standalone tools/gpu project (the image
# lacks ICU and prometheus-cpp, which the full build needs), then runs, each under a time limit:
#   1. test_queues_host   the rings on std::threads (host compiler), also under ThreadSanitizer
#   2. test_gpu_queues    the rings on the GPU and across the bus, millions of checksummed items
#   3. exp_stages         experiment A; its table goes into docs/perf/gpu-scheduling.md
#   4. compute-sanitizer memcheck and racecheck on a reduced test_gpu_queues (SS_QUEUE_TEST_SCALE)
# Everything is logged to $OUT/queues.log; the exit status is non-zero if any step failed. GTest:
# the system's if present, else the Debian package carried in .gpu-deps/ (tools/gpu/fetch_device_deps.sh
# fetches it; carry .gpu-deps). Takes about 2-3 minutes on 16 cores; every step has a time limit and
# the whole run a budget of BUDGET_S (285 s), so it ends within 5 minutes whatever hangs.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/ssq-out}
mkdir -p "$OUT"
REPS=${1:-200}
BUILD=build-queues
BUDGET_S=${BUDGET_S:-285}  # the run must end within 5 minutes

run() {
  local fail=0
  step() {  # step NAME LIMIT_S CMD...: runs CMD under a time limit, records a failure, goes on
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET_S - SECONDS))  # the whole script stays under its budget
    if [ "$left" -le 5 ]; then
      echo "=== $name: NOT RUN (the ${BUDGET_S} s budget is spent)"
      fail=1
      return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "=== $name (limit ${limit} s)"
    local t0=$SECONDS
    # Line-buffered, so that a step cut short by its limit still leaves its output in the log.
    if timeout "$limit" stdbuf -oL -eL "$@"; then
      echo "=== $name: ok ($((SECONDS - t0)) s)"
    else
      echo "=== $name: FAILED (status $?, $((SECONDS - t0)) s)"
      fail=1
    fi
  }
  date -u
  git log -1 --format='commit %h %s' 2>/dev/null || true
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 || true
  nvcc --version | tail -1

  local prefix=""
  if [ ! -f /usr/include/gtest/gtest.h ] && ls .gpu-deps/libgtest-dev*.deb >/dev/null 2>&1; then
    local deps=/tmp/ssq-deps
    mkdir -p "$deps"
    for f in .gpu-deps/libgtest-dev*.deb; do dpkg -x "$f" "$deps"; done
    prefix="-DCMAKE_PREFIX_PATH=$deps/usr;$deps/usr/lib/x86_64-linux-gnu/cmake"
    echo "GTest from $(ls .gpu-deps/libgtest-dev*.deb)"
  fi
  # shellcheck disable=SC2086
  step configure 60 cmake -S tools/gpu -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 $prefix
  step build 180 ninja -C "$BUILD" -j16
  if [ ! -x "$BUILD/test_gpu_queues" ]; then
    echo "test_gpu_queues was not built (no GTest? see the configure output; carry .gpu-deps)"
    fail=1
  else
    step test_queues_host 120 "$BUILD/test_queues_host"
    if [ -x "$BUILD/test_queues_host_tsan" ]; then
      step "test_queues_host under ThreadSanitizer" 120 "$BUILD/test_queues_host_tsan"
    fi
    step test_gpu_queues 120 "$BUILD/test_gpu_queues"
  fi
  [ -x "$BUILD/exp_stages" ] && step exp_stages 150 "$BUILD/exp_stages" "$REPS"
  if [ -x "$BUILD/test_gpu_queues" ]; then
    local cs
    cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    # Reduced sizes: the sanitizers slow kernels by orders of magnitude.
    step "memcheck (reduced)" 120 env SS_QUEUE_TEST_SCALE=0.002 "$cs" --tool memcheck --error-exitcode 9 \
      "$BUILD/test_gpu_queues"
    # racecheck checks shared memory only: the ring that lives there (block scope) is the one to run.
    step "racecheck (reduced, shared-memory ring)" 120 env SS_QUEUE_TEST_SCALE=0.002 "$cs" --tool racecheck \
      --racecheck-report all --error-exitcode 9 "$BUILD/test_gpu_queues" --gtest_filter='GpuQueues.BlockScope*'
  fi
  echo "=== all steps: $([ $fail = 0 ] && echo ok || echo SOME FAILED)"
  return $fail
}

run 2>&1 | tee "$OUT/queues.log"
exit "${PIPESTATUS[0]}"
