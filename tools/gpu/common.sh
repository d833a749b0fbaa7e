# Sourced by the GPU scripts (bench_scheduling.sh, bench_kv_tiers.sh, bench_serving.sh, dec_checks.sh,
# inv_checks.sh, mega_checks.sh).
# ss_model BIN DIR SHAPE [DTYPE]: the path of DIR/SHAPE-DTYPE.gguf (DTYPE bf16 unless given: q4_0,
# q4_k, ...), written first by `selfserve synth` (random weights of that real shape, seed 1) when absent.
ss_model() {
  local t=${4:-bf16}
  local f=$2/$3-$t.gguf
  [ -s "$f" ] || "$1" synth --shape "$3" --format gguf --dtype "$t" --seed 1 --out "$f" --quiet >&2
  echo "$f"
}
# ss_src_hash: one hash over the sources a build reads (CMake files, src/, tests/, tools/), the same
# here and on the GPU machine's copy of the tree (which has no .git): prebuild.sh stamps .prebuilt
# with it and build_on_device.sh uses .prebuilt only when it matches.
ss_src_hash() {
  local d dirs=()
  for d in CMakeLists.txt cmake src tests tools; do [ -e "$d" ] && dirs+=("$d"); done
  find "${dirs[@]}" -type f \( -name '*.c' -o -name '*.cc' -o -name '*.cpp' -o -name '*.cu' -o -name '*.h' -o -name '*.hpp' \
    -o -name '*.cuh' -o -name '*.inc' -o -name '*.cmake' -o -name 'CMakeLists.txt' -o -name '*.in' \) |
    LC_ALL=C sort | xargs sha1sum | sha1sum | cut -c1-40
}
# ss_target_file TARGET: the file a CMake target builds (the CUDA plugin is a library).
ss_target_file() { [ "$1" = selfserve_cuda ] && echo libselfserve_cuda.so || echo "$1"; }
# ss_envof NAME:ENV=V,ENV2=V2 (a variant): "ENV=V ENV2=V2" for env(1). A comma separates assignments
# only where a NAME= follows it, so a value may hold commas (pipe:SS_CUDA_DEC=4,2,1).
ss_envof() { echo "${1#*:}" | sed -E 's/,([A-Za-z_][A-Za-z0-9_]*=)/ \1/g'; }
# ss_get URL: the body of a GET (nothing, and a failure, when it does not answer 2xx).
ss_get() {
  python3 -c 'import sys,urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' "$1" 2>/dev/null
}
# ss_wait_healthy PORT [PID]: until the server on PORT answers /health (at most 120 s; at once when PID has exited).
ss_wait_healthy() {
  for _ in $(seq 600); do
    ss_get "http://127.0.0.1:$1/health" > /dev/null && return 0
    [ -n "${2:-}" ] && ! kill -0 "$2" 2>/dev/null && return 1
    sleep 0.2
  done
  return 1
}
# ss_limits OUT LIMIT_S: a device script's progress file (OUT/progress) and time limit, from now.
# stage MSG: MSG stamped with the clock and the seconds since, printed and appended to the progress;
# want EST NAME: true when EST more seconds end inside the limit, else says NAME is skipped.
# At exit, a script's OUT with more than 6 files is packed into OUT/results.tgz (the device tool
# brings back at most 8 files; the progress file and a caller's `tee OUT/log` stay beside it).
ss_limits() { SS_OUT=$1 SS_LIMIT=$2 SS_T0=$(date +%s); mkdir -p "$SS_OUT"; trap ss_pack EXIT; }
ss_pack() {
  local n
  n=$(find "$SS_OUT" -maxdepth 1 -type f ! -name progress ! -name log ! -name results.tgz | wc -l)
  [ "$n" -gt 6 ] || return 0
  (cd "$SS_OUT" && find . -maxdepth 1 -type f ! -name progress ! -name log ! -name results.tgz -printf '%P\n' |
    tar czf results.tgz -T - && find . -maxdepth 1 -type f ! -name progress ! -name log ! -name results.tgz -delete)
}
stage() { echo "$(date +%T) [+$(($(date +%s) - SS_T0))s] $*" | tee -a "$SS_OUT/progress"; }
want() { [ $(($(date +%s) - SS_T0 + $1)) -le "$SS_LIMIT" ] && return 0; stage "skipped (time): $2"; return 1; }
