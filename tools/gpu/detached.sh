#!/usr/bin/env bash
# On the GPU machine: runs a pipeline script detached, so it outlasts one 10-minute device call.
# The first call starts SCRIPT (bash, from the repository root, with RES set to a results folder);
# every call waits up to WAIT_S seconds for it to finish, then prints its progress file ($RES/progress,
# which the script appends to) and the tail of its output, and copies $RES to $OUT/results.tgz.
# Call it again within 30 s of the previous call's end (the machine is kept while calls come) to keep
# waiting; the script is started only once per machine.
# usage: tools/gpu/detached.sh WAIT_S [SCRIPT]
set -uo pipefail
cd "$(dirname "$0")/../.."
W=/tmp/ss-detached
RES=$W/res
WAIT=${1:?usage: tools/gpu/detached.sh WAIT_S [SCRIPT]}
OUT=${OUT:-$PWD/out-gpu}
mkdir -p "$OUT" "$RES"
S0=$(date +%s)
if [ ! -f "$W/pid" ]; then
  [ -n "${2:-}" ] || { echo "no pipeline is running here and no SCRIPT was given"; exit 1; }
  RES=$RES setsid nohup bash "$2" > "$RES/pipeline.out" 2>&1 < /dev/null &
  echo $! > "$W/pid"
  echo "started $2 (pid $(cat "$W/pid"))"
fi
pid=$(cat "$W/pid")
while kill -0 "$pid" 2>/dev/null && [ $(($(date +%s) - S0)) -lt "$WAIT" ]; do sleep 2; done
running=no
kill -0 "$pid" 2>/dev/null && running=yes
echo "=== waited $(($(date +%s) - S0)) s; still running: $running"
cat "$RES/progress" 2>/dev/null
echo "=== pipeline output (tail)"
tail -n 40 "$RES/pipeline.out"
tar czf "$OUT/results.tgz" -C "$W" res 2>/dev/null
true
