#!/usr/bin/env bash
# On the GPU machine, after tools/gpu/build_on_device.sh: the OpenAI server on the CUDA backend
# (tiny Qwen2 test model), asked for a completion, a streamed chat completion and /metrics; each
# answer checked; the server stopped with SIGTERM.
set -uo pipefail
cd "$(dirname "$0")/../.."
source build-gpu/env.sh
PORT=${PORT:-18093}
build-gpu/selfserve serve --model tests/data/models/qwen2-tiny --device cuda --port "$PORT" --quiet &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
python3 - "$PORT" <<'PY'
import json, sys, time, urllib.request
port = sys.argv[1]
base = f"http://127.0.0.1:{port}"
for _ in range(300):
    try:
        if urllib.request.urlopen(base + "/health").status == 200: break
    except Exception: time.sleep(0.2)
def post(path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return urllib.request.urlopen(req)
r = json.load(post("/v1/completions", {"model": "qwen2-tiny", "prompt": "hello world", "max_tokens": 16, "temperature": 0}))
assert r["choices"][0]["finish_reason"] in ("length", "stop"), r
assert r["usage"]["completion_tokens"] >= 1, r
print("completion ok:", r["usage"], repr(r["choices"][0]["text"][:40]))
r2 = json.load(post("/v1/completions", {"model": "qwen2-tiny", "prompt": "hello world", "max_tokens": 16, "temperature": 0}))
assert r2["choices"][0]["text"] == r["choices"][0]["text"], "greedy text differs between two runs"
print("greedy repeat ok")
chunks = 0
with post("/v1/chat/completions", {"model": "qwen2-tiny", "messages": [{"role": "user", "content": "hi"}],
                                   "max_tokens": 12, "stream": True, "temperature": 0.7, "seed": 3}) as s:
    for line in s:
        if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
            json.loads(line[6:]); chunks += 1
assert chunks >= 2, chunks
print("stream ok:", chunks, "chunks")
m = urllib.request.urlopen(base + "/metrics").read().decode()
assert "selfserve_generation_tokens_total" in m
print("metrics ok")
PY
