#!/usr/bin/env bash
# On the GPU machine, one device call (~6 minutes): the fused decode kernels' tuning variants A/B.
# Builds selfserve, test_gpu and test_gpu_backend; runs the decode kernels' tests and the backend's
# forward tests under every variant; times the graph-replayed decode step of each variant,
# interleaved a shape at a time (135M, 1B, 8B bf16, context 512); ncu on the 8B batch-1 projections
# of each variant; the persistent kernel's barrier trace (SS_CUDA_MEGA_TRACE=1) when MEGA_TRACE=1.
#   VARIANTS: space-separated name:ENV=VALUE[,ENV=VALUE] ("base:" runs with no extra environment; a
#     value may hold commas, e.g. pipe:SS_CUDA_DEC=4,2,1);
#   TEST_FILTER: test_gpu's tests run under each variant (default GpuDecode*);
#   BE_FILTER: test_gpu_backend's tests run under each variant (default: the forward tests);
#   TESTS_FIRST_ONLY=1: the tests under the first variant only; TESTS=0: no tests;
#   SANITIZE_FILTER: test_gpu's tests also run under memcheck and racecheck;
#   CHAIN_TRACE=1: after the timings, the chain's phase trace (SS_CUDA_CHAIN_TRACE=1) of every variant
#     at batch 1 on TRACE_SHAPES (default 135M and 1B), one variant after another;
#   DTYPE (default bf16): the synth GGUF's block type (q4_0, q4_1, q4_k, ...); quantized types run with
#     --gpu-native-quant (the fused kernels over the packed blocks);
#   NCU_FULL=1: ncu's full set on the first variant's projections; SASS=<regex>: matching kernels' SASS;
#   NCU_STALLS=<op>: one 8B launch of that op under every variant (or STALL_VARIANTS) with PC sampling;
#   AB_REUSE=1: a baseline binary an earlier run on this machine built is used again;
#   LIMIT_S (default 330): a step that would end past it is skipped, and says so.
# With .ab-base/ carried (tools/gpu/ab_base.sh REV writes it), a copy of the tree with REV's files
# builds selfserve beside the main build, and variants named old* time that baseline binary.
# Results in $OUT (progress, logs; more than 6 files packed into results.tgz at exit, common.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
OUT=${OUT:-$PWD/out-gpu}
ss_limits "$OUT" "${LIMIT_S:-330}"
VARIANTS=${VARIANTS:-"base: pipe:SS_CUDA_DEC=4,2,1"}
SHAPES=${SHAPES:-"smollm2-135m llama32-1b llama3-8b"}
BATCHES=${BATCHES:-1,8}
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv; } > "$OUT/env.txt" 2>&1
AB=/tmp/ab-tree
if [ "${AB_REUSE:-0}" = 1 ] && [ -x $AB/build-gpu/selfserve ]; then
  stage "baseline build reused"
elif [ -d .ab-base ]; then
  rm -rf $AB && mkdir -p $AB
  tar --exclude=./build-gpu --exclude=./.ab-base --exclude=./out-gpu -cf - . | tar -xf - -C $AB
  cp -r .ab-base/. $AB/
  (cd $AB && tools/gpu/build_on_device.sh selfserve selfserve_cuda) > "$OUT/build-base.log" 2>&1 &
  ab_pid=$!
fi
tools/gpu/build_on_device.sh selfserve test_gpu test_gpu_backend > "$OUT/build.log" 2>&1 || { stage "build failed"; tail -30 "$OUT/build.log"; exit 1; }
stage build
if [ -n "${ab_pid:-}" ]; then
  wait $ab_pid || { stage "baseline build failed"; tail -30 "$OUT/build-base.log"; exit 1; }
  stage "baseline build ($(find .ab-base -type f | wc -l) files put back)"
fi
binof() { case $1 in old*) echo $AB/build-gpu ;; *) echo build-gpu ;; esac; }
# A variant named old* without a baseline build would time nothing (the binary is missing): say so
# once, up front, rather than a "failed to run command" a shape.
if [ ! -x $AB/build-gpu/selfserve ]; then
  for v in $VARIANTS; do
    case ${v%%:*} in old*) stage "variant ${v%%:*}: names that start with old time the baseline build (.ab-base or AB_REUSE=1), and there is none: rename it" ;; esac
  done
fi
source build-gpu/env.sh
B=build-gpu M=/tmp/ssm
mkdir -p $M
DTYPE=${DTYPE:-bf16}
NQ=
[ "$DTYPE" = bf16 ] || NQ=--gpu-native-quant
for s in $SHAPES; do ss_model $B/selfserve $M $s $DTYPE > /dev/null; done
stage synth
summary() { grep -E '^\[  (PASSED|FAILED)' "$1" | tr '\n' ' '; grep -E '^\[  FAILED  \]' "$1" | head -4 | tr '\n' ';'; }
for v in $VARIANTS; do
  [ "${TESTS:-1}" = 0 ] && break
  n=${v%%:*}
  case $n in old*) continue ;; esac  # the baseline build has no test binaries
  want 40 "tests $n" || continue
  env $(ss_envof "$v") timeout 120 $B/test_gpu --gtest_filter="${TEST_FILTER:-GpuDecode*}" > "$OUT/t-dec-$n.txt" 2>&1
  stage "test_gpu ${TEST_FILTER:-GpuDecode*} [$n] rc=$? $(summary "$OUT/t-dec-$n.txt")"
  env $(ss_envof "$v") timeout 200 $B/test_gpu_backend --gtest_filter="${BE_FILTER:-CudaForward*:CudaGraphs*:TinyModels*:CudaNativeQuant*}" \
    > "$OUT/t-be-$n.txt" 2>&1
  stage "test_gpu_backend ${BE_FILTER:-forward} [$n] rc=$? $(summary "$OUT/t-be-$n.txt")"
  [ "${TESTS_FIRST_ONLY:-0}" = 1 ] && break
done
# SANITIZE_FILTER: test_gpu's tests under compute-sanitizer memcheck and racecheck (default variant).
if [ -n "${SANITIZE_FILTER:-}" ]; then
  for tool in memcheck racecheck; do
    want 90 "$tool" || continue
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 1 $B/test_gpu --gtest_filter="$SANITIZE_FILTER" \
      > "$OUT/san-$tool.txt" 2>&1
    stage "$tool $SANITIZE_FILTER rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san-$tool.txt" | tr '\n' ' ') $(summary "$OUT/san-$tool.txt")"
  done
fi
rowsof() { grep -E '^ +[0-9]+ ' "$1" | awk '{print $1 ":" $2}' | tr '\n' ' '; }
for s in $SHAPES; do
  est=12
  [ $s = llama3-8b ] && est=45
  for v in $VARIANTS; do
    n=${v%%:*}
    want $est "decode $s [$n]" || continue
    f="$OUT/dec-$s-$n.txt"
    env $(ss_envof "$v") timeout 150 $(binof $n)/selfserve bench decode --model $M/$s-$DTYPE.gguf $NQ --device cuda --batch $BATCHES \
      --context 512 --steps 64 --reps 3 > "$f" 2>&1
    stage "decode $s [$n] rc=$? $(rowsof "$f") $(grep -iE 'error|ignored|failed' "$f" | head -2 | tr '\n' ';')"
  done
done
if [ "${CHAIN_TRACE:-0}" = 1 ]; then
  for s in ${TRACE_SHAPES:-smollm2-135m llama32-1b}; do
    for v in $VARIANTS; do
      n=${v%%:*}
      want 20 "chain trace $s [$n]" || continue
      f="$OUT/chain-$s-$n.txt"
      env $(ss_envof "$v") SS_CUDA_CHAIN_TRACE=1 timeout 120 $(binof $n)/selfserve bench decode --model $M/$s-$DTYPE.gguf $NQ \
        --device cuda --batch 1 --context 512 --steps 64 --reps 3 > "$f" 2>&1
      stage "chain trace $s [$n] rc=$? $(rowsof "$f")"
      grep -A5 '^chain trace' "$f" | tail -5 | sed 's/^/    /' | tee -a "$SS_OUT/progress"
    done
  done
fi
if [ "${MEGA_TRACE:-1}" = 1 ]; then
  for s in smollm2-135m llama3-8b; do
    want 50 "mega trace $s" || continue
    SS_CUDA_MEGA=1 SS_CUDA_MEGA_TRACE=1 timeout 120 $B/selfserve bench decode --model $M/$s-$DTYPE.gguf $NQ --device cuda \
      --enforce-eager --batch 1 --context 512 --steps 16 --reps 2 > "$OUT/trace-$s.txt" 2>&1
    stage "mega trace $s rc=$? $(grep -E 'mega (trace|barriers)' "$OUT/trace-$s.txt" | tr '\n' ' ')"
  done
fi
if [ "${NCU:-1}" = 1 ]; then
  for v in $VARIANTS; do
    n=${v%%:*}
    case $n in old*) continue ;; esac
    want 70 "ncu 8B [$n]" || continue
    env $(ss_envof "$v") SS_CUDA_MEGA=0 timeout 150 ncu --kernel-name regex:dec_k --launch-skip 200 --launch-count 5 \
      --section SpeedOfLight $B/selfserve bench decode --model $M/llama3-8b-$DTYPE.gguf $NQ --device cuda --enforce-eager \
      --batch 1 --context 512 --steps 4 --reps 1 > "$OUT/ncu-8b-$n.txt" 2>&1
    stage "ncu 8B [$n] rc=$? $(grep -E '^  [a-z_:]*dec_k|Duration|DRAM Throughput' "$OUT/ncu-8b-$n.txt" | sed -E 's/ +/ /g; s/void ss::cuda::kern::[^ ]*dec_k<ss::cuda::kern::dec::Op::([A-Za-z]+).*/\1/; s/void ss::cuda::kern::[^ ]*dec_k<[(]ss::cuda::kern::dec::Op[)]([0-9]).*/op\1/' | tr '\n' ';')"
  done
fi
# NCU_FULL=1: the first variant's four projections of one layer under ncu's full set (stall reasons,
# issue slots, memory chart), in ncu-full.txt.
if [ "${NCU_FULL:-0}" = 1 ]; then
  v=${VARIANTS%% *}
  n=${v%%:*}
  want 120 "ncu full 8B [$n]" && {
    env $(ss_envof "$v") SS_CUDA_MEGA=0 timeout 200 ncu --kernel-name regex:dec_k --launch-skip 200 --launch-count 4 \
      --set full $B/selfserve bench decode --model $M/llama3-8b-$DTYPE.gguf $NQ --device cuda --enforce-eager \
      --batch 1 --context 512 --steps 4 --reps 1 > "$OUT/ncu-full.txt" 2>&1
    stage "ncu full 8B [$n] rc=$?"
  }
fi
# NCU_STALLS=<op> (Qkv, Add, GateUp or Logits): that op's kernel (one 8B launch at batch 1) under
# every variant with ncu's PC sampling: where the warps stall, by reason for the kernel
# (stalls-<variant>.txt) and by SASS instruction (stalls-<variant>-sass.csv).
if [ -n "${NCU_STALLS:-}" ]; then
  for v in ${STALL_VARIANTS:-$VARIANTS}; do
    n=${v%%:*}
    case $n in old*) continue ;; esac
    want 60 "ncu stalls 8B $NCU_STALLS [$n]" || continue
    # ncu prints the enum either as Op::GateUp or as (ss::cuda::kern::dec::Op)2, by version.
    case $NCU_STALLS in Qkv) oi=0 ;; Add) oi=1 ;; GateUp) oi=2 ;; Logits) oi=3 ;;
      *) stage "NCU_STALLS=$NCU_STALLS: want Qkv, Add, GateUp or Logits"; break ;; esac
    env $(ss_envof "$v") SS_CUDA_MEGA=0 timeout 150 ncu --kernel-name-base demangled --kernel-name "regex:Op(::$NCU_STALLS|[)]$oi,)" \
      --launch-skip 40 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SourceCounters \
      --section SchedulerStats --section Occupancy --metrics "regex:smsp__pcsamp_warps_issue_stalled_.*" -f -o /tmp/stalls-$n \
      $B/selfserve bench decode --model $M/llama3-8b-$DTYPE.gguf $NQ --device cuda --enforce-eager \
      --batch 1 --context 512 --steps 4 --reps 1 > "$OUT/stalls-$n-run.txt" 2>&1
    rc=$?
    { ncu -i /tmp/stalls-$n.ncu-rep --page details --print-details all
      ncu -i /tmp/stalls-$n.ncu-rep --page raw --csv | python3 -c '
import csv, sys
rows = list(csv.reader(sys.stdin))
if len(rows) >= 3:
    for name, unit, val in zip(rows[0], rows[1], rows[2]):
        if "pcsamp_warps_issue_stalled" in name and not name.endswith("_not_issued"):
            try: v = float(val.replace(",", ""))
            except ValueError: continue
            if v > 0: print(f"{v:12.0f}  {name}")
' | sort -rn; } > "$OUT/stalls-$n.txt" 2>&1
    ncu -i /tmp/stalls-$n.ncu-rep --page source --csv --print-source sass > "$OUT/stalls-$n-sass.csv" 2>&1
    stage "ncu stalls $NCU_STALLS [$n] rc=$rc: $(grep -E 'pcsamp' "$OUT/stalls-$n.txt" | head -6 | awk '{sub(/smsp__pcsamp_warps_issue_stalled_/, "", $2); printf "%s %s; ", $2, $1}')"
  done
fi
# SASS=<regex>: the SASS of the kernels whose mangled names match, in sass.txt (cuobjdump).
if [ -n "${SASS:-}" ]; then
  cuobjdump -sass $B/libselfserve_cuda.so 2>/dev/null | awk -v re="$SASS" '/Function : /{p = ($0 ~ re)} p' > "$OUT/sass.txt"
  stage "sass: $(grep -c 'Function : ' "$OUT/sass.txt") functions"
fi
stage done
