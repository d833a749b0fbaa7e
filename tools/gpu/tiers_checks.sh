#!/usr/bin/env bash
# On the GPU machine, one device call (under 8 minutes): issue 18's KV tiers with the batched restores
# (Backend::write_kv_blocks: a step's blocks issued together, one wait; written without a GPU,
# 2026-12-06). In order of importance; a step that would end past BUDGET_S is skipped and says so,
# so a short call still brings back the steps before it:
#   1. build selfserve, then (while the 8B model is synthesised beside it) the CUDA plugin,
#      bench_kv_tiers and test_gpu_backend;
#   2. the block copies' tests: CudaKvBlocks.* (batched copies exact, bad batches copy nothing) and
#      CudaKvTiers.* (histories restored through the engine give the pool hits' greedy tokens);
#   3. returning-turn TTFT from the host and disk tiers at Llama-3-8B bf16 (bench_kv_tiers.sh,
#      CONV=3, as measured on 2026-12-06 before the change: host 0.027 s, 5.4x the recompute);
#   4. running streams' decode during demotions and restores on the GPU (bench_kv_tiers --device
#      cuda, 8B, 8 streams, 4,000-token histories, 4 rounds of 96-step windows);
#   5. tests/e2e's test_level_three_serves_new_requests_on_the_cpu_fallback[gpu] (e2e_on_device.sh),
#      when the default model's pieces are here: .gpu-e2e-a and .gpu-e2e-b each carried by a call
#      before this one (tools/gpu/e2e_piece.sh; keep the machine warm between the calls), .gpu-e2e-c
#      carried with this one (tools/gpu/fetch_e2e_deps.sh makes all three);
#   6. step 4's null run (no clock jumps: the method's noise on this machine).
# usage (through the device tool, carrying .gpu-deps, and .gpu-e2e-c for step 5; or as
# `tools/gpu/detached.sh 570 tools/gpu/tiers_checks.sh` to outlast one call):
#   tools/gpu/tiers_checks.sh        results in $OUT: progress (one line a step) and tiers-results.tgz
#                                    (every step's log, and progress)
# BUDGET_S (default 450) bounds the whole run: every step's timeout ends inside it (a build cut
# short stops the run), and a step whose estimate would not fit is skipped.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out-gpu}
# Every step's log goes to R ($RES under tools/gpu/detached.sh); at the end R is tarred into
# $OUT/tiers-results.tgz, beside $OUT/progress (the device tool brings back 8 files at most).
R=${RES:-/tmp/ss-tiers}
[ -n "${RES:-}" ] || rm -rf "$R"  # an earlier call's logs on a warm machine
mkdir -p "$OUT" "$R"
trap 'tar czf "$OUT/tiers-results.tgz" -C "$R" . 2> /dev/null' EXIT
T0=$(date +%s)
note() { echo "$*" >> "$R/progress"; [ "$R" -ef "$OUT" ] || echo "$*" >> "$OUT/progress"; }
stage() { local l; l="$(date +%T) [+$(($(date +%s) - T0))s] $*"; echo "$l"; note "$l"; }
BUDGET_S=${BUDGET_S:-450}
# want EST NAME: true when a step estimated at EST seconds ends inside the budget; else says it is skipped.
want() { [ $(($(date +%s) - T0 + $1)) -le "$BUDGET_S" ] && return 0; stage "skipped (budget): $2"; return 1; }
# cap S: S, or what is left of the budget if less (a step's timeout never outlasts the budget).
cap() { local left=$((BUDGET_S - ($(date +%s) - T0))); [ "$left" -lt "$1" ] && echo $((left > 5 ? left : 5)) || echo "$1"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,pcie.link.gen.max,pcie.link.width.max \
    --format=csv; git log -1 --oneline; nproc; free -g; df -h /tmp; } > "$R/env.txt" 2>&1

# 1. Build: selfserve first (the CPU side, quick), so synth can write the 8B file while the CUDA
#    kernels compile.
timeout "$(cap 240)" tools/gpu/build_on_device.sh selfserve > "$R/build.log" 2>&1
rc=$?
stage "build selfserve rc=$rc"
[ "$rc" -eq 0 ] || { grep -E "error|FAILED:" "$R/build.log" | head -20 | while read -r l; do note "$l"; done; stage "build failed: nothing else runs"; exit 1; }
source build-gpu/env.sh
B=build-gpu M=/tmp/ssm
mkdir -p $M
SPID="" HAVE8B=0
if [ -s $M/llama3-8b-bf16.gguf ]; then
  HAVE8B=1  # left by an earlier call on this machine
else
  $B/selfserve synth --shape llama3-8b --format gguf --dtype bf16 --seed 1 --out $M/llama3-8b-bf16.gguf --quiet \
    > "$R/synth.log" 2>&1 &
  SPID=$!
fi
timeout "$(cap 300)" tools/gpu/build_on_device.sh selfserve_cuda bench_kv_tiers test_gpu_backend >> "$R/build.log" 2>&1
rc=$?
stage "build plugin, bench_kv_tiers, test_gpu_backend rc=$rc"
[ "$rc" -eq 0 ] || { grep -E "error|FAILED:" "$R/build.log" | head -20 | while read -r l; do note "$l"; done; stage "build failed: nothing else runs"; exit 1; }
if [ -n "$SPID" ]; then  # the 8B steps run only on a whole file
  for _ in $(seq "$(cap 120)"); do kill -0 $SPID 2> /dev/null || break; sleep 1; done
  if kill -0 $SPID 2> /dev/null; then
    kill $SPID
    rm -f $M/llama3-8b-bf16.gguf
    stage "synth llama3-8b bf16 not done inside the budget: the 8B steps are skipped"
  else
    wait $SPID
    rc=$?
    [ "$rc" -eq 0 ] && HAVE8B=1 || rm -f $M/llama3-8b-bf16.gguf
    stage "synth llama3-8b bf16 rc=$rc $(ls -l $M/llama3-8b-bf16.gguf 2> /dev/null | awk '{print $5}') bytes"
  fi
fi

# The link's floor on this machine: pinned host-to-device bandwidth (selfserve topology measures it).
timeout "$(cap 60)" $B/selfserve topology --json > "$R/topology.json" 2> "$R/topology.log"
stage "topology rc=$? $(grep -oE '"(h2d_pinned|d2h_pinned|name)": *("[^"]*"|[0-9.]+)' "$R/topology.json" | tr '\n' ' ' | cut -c1-300)"

# 2. The copies the restores now make, before anything is timed with them.
summary() { grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$1" | grep -v ' ms)$' | tr '\n' ' '; }
timeout "$(cap 90)" $B/test_gpu_backend --gtest_filter='CudaKvBlocks.*:CudaKvTiers.*' > "$R/t-kv-blocks.txt" 2>&1
stage "test_gpu_backend CudaKvBlocks.* CudaKvTiers.* rc=$? $(summary "$R/t-kv-blocks.txt") $(grep -E 'Failure|error' "$R/t-kv-blocks.txt" | head -3 | cut -c1-200 | tr '\n' ';')"

# 3. Returning-turn TTFT, host then disk tier (each: server start and 8B load, 3 conversations).
if [ "$HAVE8B" = 1 ] && want 170 "TTFT host and disk tiers"; then
  OUT=$R/ttft MODELS=$M CONV=3 timeout "$(cap 200)" tools/gpu/bench_kv_tiers.sh llama3-8b > "$R/ttft.log" 2>&1
  stage "TTFT rc=$? $(cat "$R/ttft.log" | tr '\n' ' ') $(grep -hE 'reused|recomputed|ratio|page-lock' "$R"/ttft/tiers-*.txt "$R"/ttft/*server.log 2> /dev/null | tr -s ' ' | head -8 | tr '\n' ';' | cut -c1-700)"
  note "$(grep -hE 'restored|demoted' "$R"/ttft/tiers-*-metrics.txt 2> /dev/null | tr '\n' ';' | cut -c1-600)"
fi

# 4. Running streams' decode with and without tier traffic, on the GPU: the tiers run, then the null
#    run (no clock jumps: the method's noise). Wall time is the measure here (the engine thread's CPU
#    time includes its waits on the device).
slow() {  # slow NAME ARGS...: one bench_kv_tiers run; its lines that carry the numbers into progress
  local name=$1
  shift
  timeout "$(cap 120)" $B/bench_kv_tiers --device cuda $M/llama3-8b-bf16.gguf 8 4000 4 96 16 "$@" > "$R/slow-$name.txt" 2>&1
  local rc=$?
  stage "decode slowdown $name rc=$rc $(grep -E '^(device|control|tiers|median|streams|restores)' "$R/slow-$name.txt" | cut -c1-260 | tr '\n' ';')$([ $rc -eq 0 ] || tail -2 "$R/slow-$name.txt" | cut -c1-300 | tr '\n' ';')"
}
[ "$HAVE8B" = 1 ] && want 60 "decode slowdown, host tier" && slow host

# 5. Level 3's CPU fallback below a GPU primary, the whole server (the default model, 2 servers).
if [ ! -d .gpu-e2e-c ]; then
  stage "skipped: e2e (.gpu-e2e-c not carried; tools/gpu/fetch_e2e_deps.sh)"
elif [ ! -f /tmp/ss-e2e/home/models/SmolLM2-135M-Instruct.Q4_1.gguf ] &&
  { [ ! -f /tmp/ss-e2e/model.part-a ] || [ ! -f /tmp/ss-e2e/model.part-b ]; }; then
  stage "skipped: e2e (the model's pieces a and b are not in /tmp/ss-e2e: tools/gpu/e2e_piece.sh in the calls before)"
elif want 90 "e2e level three on the CPU fallback [gpu]"; then
  timeout "$(cap 240)" tools/gpu/e2e_on_device.sh -k 'test_level_three_serves_new_requests_on_the_cpu_fallback and gpu' \
    > "$R/e2e.txt" 2>&1
  stage "e2e level three [gpu] rc=$? $(tail -1 "$R/e2e.txt") $(grep -E '^(FAILED|ERROR) ' "$R/e2e.txt" | cut -c1-200 | head -4 | tr '\n' ';')"
fi

# 6. The decode-slowdown null run (no clock jumps: both kinds of window are control windows), last:
#    it only says how far step 4's difference is noise.
[ "$HAVE8B" = 1 ] && want 60 "decode slowdown, null run" && slow null - null
stage done
