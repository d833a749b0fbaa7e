#!/usr/bin/env bash
# On the GPU machine, through tools/gpu/detached.sh (it outlasts one call):
#   tools/gpu/detached.sh 570 tools/gpu/pending_checks.sh   (then again within 30 s to keep waiting)
# carrying .gpu-deps (tools/gpu/fetch_device_deps.sh), .lcp (tools/gpu/fetch_llamacpp.sh) and .gobench
# (tools/bench_go.sh says how to make it). The steps are in order of importance; each is skipped (and
# says so) once it would end past BUDGET_S, so a short device budget still brings back the results of
# the steps before it:
#   1. build (llama.cpp 0c1e570's CUDA build starts beside it when .lcp/llama.cpp.tgz is carried);
#      test_gpu (the attention tiles with and without split keys among them) and test_gpu_backend in
#      full at the defaults (the device-loop tests one at a time), then test_gpu_backend with
#      SS_CUDA_SPLIT_KEYS=0 (split keys are the default since 2026-12-06);
#   2. issue 17's persistent decode kernel (SS_CUDA_MEGA=1): its test and the step A/B at 135M, 1B, 8B;
#      tests/e2e against the GPU build (e2e_on_device.sh; the default model in pieces, carried by two
#      calls before this one: tools/gpu/fetch_e2e_deps.sh); the KV tiers' returning-turn TTFT at 8B
#      (the arena registered: copies in place);
#   3. the 8B bf16 decode step with and without split keys at contexts 512 and
#      4096; at context 8160 rows, tiles and split keys, beside llama-batched-bench; selfserve serve
#      beside llama-server on the 8B file (bench_serve_vs_llamaserver.sh);
#   4. with AB=1 only (measured 2026-12-05, docs/perf/gpu.md): the row kernel's tests, tiles vs rows
#      at contexts 512 and 4096, serving at 1B, the row kernel's L2 prefetch, ncu on the row kernel,
#      the host's CUDA calls per token, the 8B stage profile and llama.cpp at context 512, experiment
#      C, bench_go, the row prefill kernel, host vs device sampling, native
#      K-quants, compute-sanitizer, nsys.
# Results under $RES (detached.sh sets it): progress, logs, the benches' outputs.
set -uo pipefail
cd "$(dirname "$0")/../.."
RES=${RES:-$PWD/out-gpu/pending}
mkdir -p "$RES"
T0=$(date +%s)
stage() { echo "$(date +%T) [+$(($(date +%s) - T0))s] $*" | tee -a "$RES/progress"; }
# BUDGET_S (default 1380 s): want EST NAME skips a step whose estimate would end past it.
BUDGET_S=${BUDGET_S:-1380}
want() { if [ $(($(date +%s) - T0 + $1)) -le "$BUDGET_S" ]; then return 0; fi; stage "skipped (budget): $2"; return 1; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv; git log -1 --oneline; command -v nsys ncu; } > "$RES/env.txt" 2>&1
# llama.cpp's CUDA build (12 jobs, niced) runs beside everything up to its benchmarks.
LW=/tmp/sslcp LB=/tmp/sslcp/build LPID=
if [ -f .lcp/llama.cpp.tgz ]; then
  mkdir -p $LW && tar xzf .lcp/llama.cpp.tgz -C $LW
  (cmake -S $LW/llama.cpp -B $LB -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \
     -DLLAMA_OPENSSL=OFF -DGGML_CUDA_NCCL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
     -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DCMAKE_BUILD_TYPE=Release \
     -DLLAMA_BUILD_COMMIT=0c1e57098 &&
   nice cmake --build $LB -j 12 --target llama-server llama-bench llama-batched-bench) > "$RES/lcp-build.log" 2>&1 &
  LPID=$!
fi
lcp_wait() {  # lcp_wait SECONDS: until llama.cpp's build ends (or SECONDS pass); true when llama-server is there
  [ -n "$LPID" ] || return 1
  for _ in $(seq $(($1 / 2))); do kill -0 $LPID 2> /dev/null || break; sleep 2; done
  kill -0 $LPID 2> /dev/null && { stage "llama.cpp still building after $1 s"; return 1; }
  stage "llama.cpp build done $(tail -1 "$RES/lcp-build.log" | cut -c1-120)"
  [ -x $LB/bin/llama-server ]
}

tools/gpu/build_on_device.sh selfserve test_gpu test_gpu_backend > "$RES/build.log" 2>&1
rc=$?
stage "build rc=$rc"
grep -E "error|Error|FAILED:|undefined reference" "$RES/build.log" | grep -v -e '-Werror' | cut -c1-300 | head -20 >> "$RES/progress"
[ "$rc" -eq 0 ] || { stage "build failed: nothing else runs (rm /tmp/ss-detached/pid to start again)"; exit 1; }
source build-gpu/env.sh
B=build-gpu
summary() {  # gtest's totals and lists; after a crash or a timeout, the test that was running
  grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$1" | grep -v ' ms)$' | tr '\n' ' '
  grep -q '^\[==========\] .* ran\.' "$1" || echo "no gtest summary; last: $(grep -E '^\[ RUN +\]' "$1" | tail -1)"
}
timeout 300 $B/test_gpu > "$RES/t-gpu.txt" 2>&1; stage "test_gpu rc=$? $(summary "$RES/t-gpu.txt")"
timeout 180 $B/test_gpu_backend --gtest_filter='-*DeviceLoop*' > "$RES/t-backend.txt" 2>&1
stage "test_gpu_backend but the device loop rc=$? $(summary "$RES/t-backend.txt")"
# The device-loop tests one at a time (the control test hung once, 2026-12-05): a hang costs 90 s and
# names itself, and the others still run.
for t in DeviceLoopControl.CancelDeadlineAndHostFallback DeviceLoopControl.ServesAGreedyRequestAfterEachKindOfEnd \
  DeviceLoopControl.TeardownAfterAChainThatDoesNotStopLeaksInsteadOfHanging 'TinyModels/DeviceLoop.Greedy*' \
  'TinyModels/DeviceLoop.Sampled*'; do
  f="$RES/t-loop-$(echo "$t" | tr -c 'A-Za-z0-9\n' '_').txt"
  timeout 90 $B/test_gpu_backend --gtest_filter="$t" > "$f" 2>&1
  stage "test_gpu_backend $t rc=$? $(summary "$f")"
done

# Split keys (tiles of at most 16 rows, a decode row's packed group, split every key tile over the
# CTA's four warps) are the default since 2026-12-06; the path without them (SS_CUDA_SPLIT_KEYS=0)
# through every backend test: the forward tests against their references, graphs vs eager, the
# device loop vs host.
SS_CUDA_SPLIT_KEYS=0 timeout 240 $B/test_gpu_backend > "$RES/t-backend-split.txt" 2>&1
stage "test_gpu_backend with SS_CUDA_SPLIT_KEYS=0 rc=$? $(summary "$RES/t-backend-split.txt")"

M=/tmp/ssm
mkdir -p $M
synth() {  # synth SHAPE DTYPE
  [ -s $M/$1-$2.gguf ] || $B/selfserve synth --shape $1 --format gguf --dtype $2 --seed 1 --out $M/$1-$2.gguf --quiet
  stage "synth $1 $2 rc=$?"
}
rowsof() { grep -E '^ +[0-9]+ ' "$1" | tr -s ' ' | tr '\n' ';'; }
synth llama32-1b bf16
# Issue 17, experiment B: the decode step as one persistent kernel (kernels/mega.cu, SS_CUDA_MEGA=1):
# tools/gpu/mega_checks.sh (its test, the step against the PDL-chained kernels at 135M / 1B / 8B, the
# per-part trace, ncu), its files under $RES/mega. Measured on an H100 (2026-12-06, batch 1): 1.65 /
# 2.01 / 8.04 ms against the chain's 0.78 / 1.39 / 5.91 (docs/perf/gpu-scheduling.md, experiment B).
if want 240 "persistent decode kernel"; then
  OUT=$RES/mega LIMIT_S=240 timeout 300 tools/gpu/mega_checks.sh > "$RES/mega.log" 2>&1
  stage "persistent decode kernel rc=$? $(cut -d' ' -f3- "$RES/mega/progress" 2> /dev/null | tr '\n' ';' | cut -c1-900)"
fi
# Issue 16: the whole OpenAI server on the GPU through the same e2e tests (build-gpu/selfserve
# defaults to the GPU there). Needs the default model's pieces from two earlier calls and
# .gpu-e2e-c carried now (tools/gpu/fetch_e2e_deps.sh).
if [ -d .gpu-e2e-c ] && want 420 "e2e on the GPU"; then
  timeout 600 tools/gpu/e2e_on_device.sh > "$RES/e2e.txt" 2>&1
  stage "e2e on the GPU rc=$? $(tail -1 "$RES/e2e.txt") $(grep -E '^(FAILED|ERROR) ' "$RES/e2e.txt" | cut -c1-150 | head -12 | tr '\n' ';')"
fi
# Issue 18: returning-turn TTFT from the host and disk tiers at 8B, the tiers' arena now registered
# with the CUDA backend (copies by DMA in place). Measured since (H100, 2026-12-06, docs/perf/memory.md):
# host 0.027 s, 5.4x the recompute; disk 0.123 s, 1.3x.
if want 400 "KV tiers"; then
  synth llama3-8b bf16
  OUT=$RES/tiers MODELS=$M CONV=3 timeout 600 tools/gpu/bench_kv_tiers.sh llama3-8b > "$RES/tiers.log" 2>&1
  stage "KV tiers rc=$? $(grep -hE 'reused|ratio|page-lock' "$RES/tiers.log" "$RES"/tiers/*.txt 2> /dev/null | tr -s ' ' | head -6 | tr '\n' ';' | cut -c1-600)"
fi
# Split keys against one warp a decode tile, 8B decode, interleaved: context 512 (twice) and 4096.
# Predicted on the H200: batch-64 attention ~2.0 -> ~1.2 ms, the step 7.02 -> ~6.2 ms at context 512;
# at 4096 on the H100, batch 64 19.4 -> ~16 ms.
if want 300 "split keys A/B"; then
  synth llama3-8b bf16
  i=0
  for run in 512:0 512:1 512:0 512:1 4096:0 4096:1; do
    ctx=${run%:*} sk=${run#*:} i=$((i + 1)) f="$RES/split-$i-$ctx-$sk.txt"
    want 80 "split keys $run" || continue
    SS_CUDA_SPLIT_KEYS=$sk timeout 200 $B/selfserve bench decode --model $M/llama3-8b-bf16.gguf --device cuda \
      --batch 16,64 --context $ctx --steps 32 --reps 2 > "$f" 2>&1
    stage "8B decode context $ctx split_keys=$sk rc=$? $(rowsof "$f")"
  done
fi
# The split-keys merge passes data between warps through shared memory: racecheck on the tile test
# (every (pack, split) pair), memcheck on it too.
if want 300 "racecheck split keys"; then
  timeout 300 compute-sanitizer --tool racecheck --error-exitcode 1 $B/test_gpu \
    --gtest_filter='GpuAttention.PrefillTilesOnTensorCoresMatchHost' > "$RES/racecheck-split.txt" 2>&1
  stage "racecheck prefill tiles rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$RES/racecheck-split.txt" | tail -1)"
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 1 $B/test_gpu \
    --gtest_filter='GpuAttention.PrefillTiles*:GpuAttention.DeviceTiles*' > "$RES/memcheck-split.txt" 2>&1
  stage "memcheck prefill tiles rc=$? $(grep -E 'ERROR SUMMARY' "$RES/memcheck-split.txt" | tail -1)"
fi
# Where the 8B batch-1 step (5.03 ms, H200; target 4.3, floor 3.74 at 4.3 TB/s) loses to the weight
# reads: one layer's fused kernels (dec_k: QKV, o_proj, gate/up, down) under ncu, each alone.
if want 150 "ncu dec_k b1"; then
  timeout 150 ncu --kernel-name regex:dec_k --launch-skip 400 --launch-count 4 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats $B/selfserve bench decode \
    --model $M/llama3-8b-bf16.gguf --device cuda --enforce-eager --batch 1 --context 512 --steps 8 --reps 1 \
    > "$RES/ncu-dec-b1.txt" 2>&1
  stage "ncu dec_k b1 rc=$? $(grep -E 'Duration|DRAM Throughput|Achieved Occupancy' "$RES/ncu-dec-b1.txt" | tr -s ' ' | head -12 | tr '\n' ';')"
fi
# Context 8160 + 32 steps (the model's 8192): rows, tiles, tiles with split keys; llama.cpp below.
if want 260 "8B context 8160"; then
  for cfg in rows tiles split; do
    gt=1 sk=0
    [ $cfg = rows ] && gt=0
    [ $cfg = split ] && sk=1
    SS_CUDA_GROUP_TILES=$gt SS_CUDA_SPLIT_KEYS=$sk timeout 200 $B/selfserve bench decode --model $M/llama3-8b-bf16.gguf \
      --device cuda --batch 16,32 --context 8160 --steps 32 --reps 2 > "$RES/long-8160-$cfg.txt" 2>&1
    stage "8B decode context 8160 $cfg rc=$? $(rowsof "$RES/long-8160-$cfg.txt")"
  done
fi
# Issue 16's serving comparison at 8B: selfserve serve beside llama-server (no web UI) on the same
# file, the default prompt mix, one round of a closed-loop sweep (1B measured 2026-12-05).
if lcp_wait 420 && want 300 "serve vs llama-server 8B"; then
  OUT=$RES/serve-vs-8b N=48 ROUNDS=1 timeout 600 tools/gpu/bench_serve_vs_llamaserver.sh $LB/bin/llama-server \
    $M/llama3-8b-bf16.gguf 1,8,32 > "$RES/serve-vs-8b.log" 2>&1
  stage "serve vs llama-server 8B rc=$? $(grep -hE '^c=|rc=|tokens/word' "$RES/serve-vs-8b.log" "$RES"/serve-vs-8b/*-1.txt | tr -s ' ' | tr '\n' ';' | cut -c1-900)"
fi
# llama.cpp's decode at context 8160 on the same 8B file.
if [ -x $LB/bin/llama-batched-bench ] && want 150 "llama-batched-bench 8B context 8160"; then
  timeout 240 $LB/bin/llama-batched-bench -m $M/llama3-8b-bf16.gguf -c $((32 * 8192)) -b 2048 -ub 512 -ngl 99 -fa on \
    -npp 8160 -ntg 32 -npl 16,32 > "$RES/bb-8b-8160.txt" 2>&1
  stage "llama-batched-bench 8B bf16 context 8160 rc=$? $(grep -E '^\| +8160' "$RES/bb-8b-8160.txt" | tr -s ' ' | tr '\n' ';')"
fi
[ "${AB:-0}" = 1 ] || { stage done; exit 0; }

# --- AB=1: the checks and A/B timings of 2026-12-05 (docs/perf/gpu.md)
# The row kernel (SS_CUDA_GROUP_TILES=0) through every backend test: the forward tests against their
# references, graphs vs eager, and the device loop vs host.
SS_CUDA_GROUP_TILES=0 timeout 240 $B/test_gpu_backend > "$RES/t-backend-rows-attn.txt" 2>&1
stage "test_gpu_backend with SS_CUDA_GROUP_TILES=0 rc=$? $(summary "$RES/t-backend-rows-attn.txt")"

# The tiles do not split a sequence's keys over CTAs (the row kernel does): tiles vs rows where that
# could matter, the 8B step at context 4096 (batch 16/32/64).
if want 160 "tiles vs rows at context 4096"; then
  synth llama3-8b bf16
  for gt in 0 1; do
    SS_CUDA_GROUP_TILES=$gt timeout 200 $B/selfserve bench decode --model $M/llama3-8b-bf16.gguf --device cuda \
      --batch 16,32,64 --context 4096 --steps 32 --reps 2 > "$RES/long-4096-$gt.txt" 2>&1
    stage "8B decode context 4096 tiles=$gt rc=$? $(rowsof "$RES/long-4096-$gt.txt")"
  done
fi
if lcp_wait 420 && want 200 "serve vs llama-server 1B"; then
  OUT=$RES/serve-vs N=48 ROUNDS=1 timeout 600 tools/gpu/bench_serve_vs_llamaserver.sh $LB/bin/llama-server \
    $M/llama32-1b-bf16.gguf 1,8,32 > "$RES/serve-vs.log" 2>&1
  stage "serve vs llama-server 1B rc=$? $(grep -hE '^c=|rc=' "$RES/serve-vs.log" | tr -s ' ' | tr '\n' ';' | cut -c1-900)"
fi
# llama.cpp's decode at context 4096 on the same 8B file, beside the long-context step above.
if [ -x $LB/bin/llama-batched-bench ] && want 120 "llama-batched-bench 8B context 4096"; then
  timeout 200 $LB/bin/llama-batched-bench -m $M/llama3-8b-bf16.gguf -c $((64 * 4160)) -b 2048 -ub 512 -ngl 99 -fa on \
    -npp 4096 -ntg 32 -npl 16,32,64 > "$RES/bb-8b-4096.txt" 2>&1
  stage "llama-batched-bench 8B bf16 context 4096 rc=$? $(grep -E '^\| +4096' "$RES/bb-8b-4096.txt" | tr -s ' ' | tr '\n' ';')"
fi
# Packed-group tiles (SS_CUDA_GROUP_TILES=1) against the row kernel, interleaved: 8B decode at batch
# 16/64 (graphs) and prefill. Predicted: batch 64 attention from ~6 ms to ~1.5 ms a step (H200).
if want 420 "group tiles A/B"; then
  synth llama3-8b bf16
  # rows-l2: the row kernel prefetching to L2 at every batch (before 2026-12-05); rows: the default
  # (no prefetch once a step's K/V passes half of L2); tiles: packed-group tiles.
  for cfg in rows-l2 rows tiles rows-l2 rows tiles; do
    gt=0 pf=
    [ $cfg = tiles ] && gt=1
    [ $cfg = rows-l2 ] && pf=1000000
    SS_CUDA_GROUP_TILES=$gt SS_CUDA_ATTN_L2_PREFETCH_MB=$pf timeout 200 $B/selfserve bench decode \
      --model $M/llama3-8b-bf16.gguf --device cuda --batch 1,16,64 --context 512 --steps 32 --reps 3 \
      > "$RES/gt-decode-$cfg.txt" 2>&1
    stage "attention $cfg 8B decode rc=$? $(rowsof "$RES/gt-decode-$cfg.txt")"
  done
  for gt in 0 1; do
    for pp in 512 2048; do
      SS_CUDA_GROUP_TILES=$gt timeout 200 $B/selfserve bench offline --model $M/llama3-8b-bf16.gguf --device cuda \
        --threads 16 --prompt-tokens $pp --gen-tokens 16 --reps 3 > "$RES/gt-pp-$gt-$pp.txt" 2>&1
      stage "group tiles=$gt 8B pp$pp rc=$? $(rowsof "$RES/gt-pp-$gt-$pp.txt")"
    done
  done
fi
# Why the row kernel takes ~6 ms at 8B batch 64: one launch of it under ncu.
if want 150 "ncu attn_split_k"; then
  timeout 150 ncu --kernel-name regex:attn_split_k --launch-skip 200 --launch-count 1 --section SpeedOfLight \
    --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
    $B/selfserve bench decode --model $M/llama3-8b-bf16.gguf --device cuda --enforce-eager --batch 64 --context 512 \
    --steps 8 --reps 1 > "$RES/ncu-attn-b64.txt" 2>&1
  stage "ncu attn_split_k b64 rc=$? $(grep -E 'Duration|Memory Throughput|Achieved Occupancy' "$RES/ncu-attn-b64.txt" | tr -s ' ' | head -4 | tr '\n' ';')"
fi
# Host CUDA calls per decoded token (issue 17: zero launches and syncs per token in the device loop):
# the CUPTI counts at exit of two runs that differ by 128 generated tokens, host vs persistent.
for sch in host persistent; do
  for gen in 128 256; do
    want 40 "api counts $sch $gen" || continue
    SS_CUDA_API_COUNTS=1 timeout 200 $B/selfserve bench offline --model $M/llama32-1b-bf16.gguf --device cuda \
      --threads 16 --prompt-tokens 64 --gen-tokens $gen --reps 1 --scheduling $sch > "$RES/api-$sch-$gen.txt" 2>&1
    stage "api counts $sch gen $gen rc=$? $(grep 'cuda host calls' "$RES/api-$sch-$gen.txt" | tail -1)"
  done
done
if want 200 "8B"; then
  synth llama3-8b bf16
  # Where the 8B step goes at batch 16 and 64 (the cuBLAS path): eager with an event after every
  # stage (SS_CUDA_PROFILE=1), then the graph-replayed step at 1/16/64.
  if want 100 "8B profile"; then
    SS_CUDA_PROFILE=1 timeout 300 $B/selfserve bench decode --model $M/llama3-8b-bf16.gguf --device cuda --batch 1,16,64 \
      --context 512 --steps 16 --reps 2 > "$RES/b64-profile.txt" 2>&1
    stage "8B batch 1/16/64 profile rc=$? $(grep 'cuda profile' "$RES/b64-profile.txt" | tail -1 | cut -c1-250)"
  fi
  if want 100 "8B batch 1/16/64 graphs"; then
    timeout 300 $B/selfserve bench decode --model $M/llama3-8b-bf16.gguf --device cuda --batch 1,16,64 --context 512 \
      --steps 32 --reps 3 > "$RES/b64-graphs.txt" 2>&1
    stage "8B batch 1/16/64 graphs rc=$? $(rowsof "$RES/b64-graphs.txt")"
  fi
  if lcp_wait 300 && want 240 "llama.cpp 8B"; then
    if [ -x $LB/bin/llama-bench ]; then
      timeout 200 $LB/bin/llama-bench -m $M/llama3-8b-bf16.gguf -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o md \
        > "$RES/lb-8b.md" 2> "$RES/lb-8b.log"
      stage "llama-bench 8B bf16 rc=$? $(grep -E 'pp512|tg128' "$RES/lb-8b.md" | tr -s ' ' | cut -d'|' -f8,9 | tr '\n' ';')"
      timeout 200 $LB/bin/llama-batched-bench -m $M/llama3-8b-bf16.gguf -c 65536 -b 2048 -ub 512 -ngl 99 -fa on \
        -npp 512 -ntg 128 -npl 1,16,64 > "$RES/bb-8b.txt" 2>&1
      stage "llama-batched-bench 8B bf16 rc=$? $(grep -E '^\| +512' "$RES/bb-8b.txt" | tr -s ' ' | tr '\n' ';')"
      # selfserve again right after, so both sides share the machine's state
      timeout 300 $B/selfserve bench decode --model $M/llama3-8b-bf16.gguf --device cuda --batch 1,16,64 --context 512 \
        --steps 32 --reps 3 > "$RES/b64-graphs-2.txt" 2>&1
      stage "8B batch 1/16/64 graphs again rc=$? $(rowsof "$RES/b64-graphs-2.txt")"
    fi
  fi
fi
if want 300 "experiment C"; then
  OUT=$RES/serving MODELS=$M timeout 420 tools/gpu/bench_serving.sh llama32-1b 4,16,64 > "$RES/serving.log" 2>&1
  stage "experiment C rc=$?"
fi

# Issue 19 on a machine with idle cores: the Go SDK against the C++ engine and the C ABI, CUDA backend,
# with a benchdecode binary built where Go is (tools/bench_go.sh says how) and carried in .gobench.
if [ -x .gobench/benchdecode ] && want 300 "bench_go"; then
  tools/gpu/build_on_device.sh bench_engine_decode bench_capi_decode selfserve_capi selfserve_cuda > "$RES/build-go.log" 2>&1 &&
    cmake --install build-gpu --prefix build-gpu/install >> "$RES/build-go.log" 2>&1
  stage "build for bench_go rc=$?"
  BUILD=build-gpu GO_BENCH=.gobench/benchdecode DEVICE=cuda SELFSERVE_TEST_MODEL=$M/llama32-1b-bf16.gguf \
    LD_LIBRARY_PATH=$PWD/build-gpu/install/lib:${LD_LIBRARY_PATH:-} timeout 400 tools/bench_go.sh 3 128 2 \
    > "$RES/bench_go.txt" 2>&1
  stage "bench_go rc=$? $(grep -E 'median' "$RES/bench_go.txt" | tr -s ' ' | head -8 | tr '\n' ';')"
fi

# --- AB=1: the checks and A/B timings of 2026-12-05 (docs/perf/gpu.md "The pending pipeline's first run")
# The row prefill kernel (flash is the default) against the references only: CudaGraphs and DeviceLoop
# compare two runs' exact tokens, so they stay on the default.
SS_CUDA_PREFILL_ATTN=rows timeout 300 $B/test_gpu_backend \
  --gtest_filter='*CudaForward*:*CudaNativeQuant*' > "$RES/t-backend-rows.txt" 2>&1
stage "test_gpu_backend with the row prefill kernel rc=$? $(summary "$RES/t-backend-rows.txt")"
prefill_ab() {  # prefill_ab SHAPE PP...: rows vs flash prefill attention, interleaved per prompt length
  local shape=$1; shift
  for pp in "$@"; do
    for mode in rows flash; do
      want 60 "prefill $shape $mode pp$pp" || continue
      SS_CUDA_PREFILL_ATTN=$mode timeout 240 $B/selfserve bench offline --model $M/$shape-bf16.gguf --device cuda \
        --threads 16 --prompt-tokens $pp --gen-tokens 16 --reps 3 > "$RES/pp-$shape-$mode-$pp.txt" 2>&1
      stage "prefill $shape $mode pp$pp rc=$? $(rowsof "$RES/pp-$shape-$mode-$pp.txt")"
    done
  done
}
prefill_ab llama32-1b 512 2048 4096
for ds in 0 1; do  # host vs device sampling at temperature 1
  want 90 "sampled decode $ds" || continue
  SS_CUDA_DEVICE_SAMPLING=$ds timeout 240 $B/selfserve bench decode --model $M/llama32-1b-bf16.gguf --device cuda \
    --batch 1,16,64 --context 512 --steps 64 --reps 3 --temperature 1 > "$RES/sampled-$ds.txt" 2>&1
  stage "sampled decode device_sampling=$ds rc=$? $(rowsof "$RES/sampled-$ds.txt")"
done
# The new kernels under compute-sanitizer: memcheck on their tests, racecheck on the one with shared
# memory traffic between warps (the prefill tiles).
if want 400 "memcheck"; then
  timeout 400 compute-sanitizer --tool memcheck --error-exitcode 1 $B/test_gpu \
    --gtest_filter='*Prefill*:GpuDecodePacked.*:GpuSampling.*' > "$RES/memcheck.txt" 2>&1
  stage "memcheck new kernels rc=$? $(grep -E 'ERROR SUMMARY' "$RES/memcheck.txt" | tail -1)"
fi
if want 300 "racecheck"; then
  timeout 300 compute-sanitizer --tool racecheck --error-exitcode 1 $B/test_gpu \
    --gtest_filter='GpuAttention.PrefillTilesOnTensorCoresMatchHost' > "$RES/racecheck.txt" 2>&1
  stage "racecheck prefill rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$RES/racecheck.txt" | tail -1)"
fi
for dt in q4_k q6_k; do  # native K-quants (--gpu-native-quant) against the same file converted to bf16 at load
  want 150 "K-quant $dt" || continue
  synth llama32-1b $dt
  f=$M/llama32-1b-$dt.gguf
  for native in "" --gpu-native-quant; do
    timeout 240 $B/selfserve bench decode --model $f --device cuda $native --batch 1,8 --context 512 --steps 64 --reps 3 \
      > "$RES/kq-decode-$dt${native:+-native}.txt" 2>&1
    stage "K-quant $dt decode ${native:-bf16} rc=$? $(rowsof "$RES/kq-decode-$dt${native:+-native}.txt")"
    timeout 240 $B/selfserve bench offline --model $f --device cuda $native --threads 16 --prompt-tokens 512 \
      --gen-tokens 128 --reps 3 > "$RES/kq-offline-$dt${native:+-native}.txt" 2>&1
    stage "K-quant $dt offline ${native:-bf16} rc=$? $(rowsof "$RES/kq-offline-$dt${native:+-native}.txt")"
  done
done
if command -v nsys > /dev/null && want 90 "nsys"; then
  SS_CUDA_PREFILL_ATTN=flash timeout 200 nsys profile -o "$RES/prof1b" --force-overwrite true $B/selfserve bench offline \
    --model $M/llama32-1b-bf16.gguf --device cuda --prompt-tokens 512 --gen-tokens 4 --reps 2 > "$RES/nsys-1b.txt" 2>&1
  stage "nsys rc=$?"
  nsys stats -r cuda_gpu_kern_sum -f csv -o "$RES/k1b" "$RES/prof1b.nsys-rep" > /dev/null 2>&1
  stage "nsys stats rc=$?"
  rm -f "$RES/prof1b.nsys-rep" "$RES/prof1b.sqlite"
fi
stage done
