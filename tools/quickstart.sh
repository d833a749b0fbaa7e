#!/usr/bin/env bash
# The main job on a fresh machine: install, build, fetch the default model, start the
# OpenAI-compatible server on it, wait until it is healthy, send one sample chat request, print
# the answer, and keep serving until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/bootstrap.sh
./build/selfserve fetch >/dev/null
PORT=${PORT:-8000}
./build/selfserve serve --host 127.0.0.1 --port "$PORT" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
trap 'exit 0' INT TERM
python3 - "$PORT" "${1:-In three sentences, why do GPUs run small language models faster when the CPU stays out of the per-token loop?}" <<'PY'
import json, sys, time, urllib.request, urllib.error
port, prompt = sys.argv[1], sys.argv[2]
base = f"http://127.0.0.1:{port}"
for _ in range(600):  # /health is 503 while the model loads and warms up
    try:
        if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
            break
    except (urllib.error.URLError, ConnectionError):
        pass
    time.sleep(0.2)
else:
    sys.exit("selfserve did not become healthy")
body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 128,
        "temperature": 0.7, "seed": 1}
req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
answer = json.load(urllib.request.urlopen(req, timeout=300))
print(f"\nQ: {prompt}\nA: {answer['choices'][0]['message']['content']}\n")
print(f"selfserve is serving an OpenAI-compatible API on {base}/v1 (Ctrl-C to stop)")
PY
wait $pid
