#!/usr/bin/env python3
"""Soak test of `selfserve serve`: many clients at once, for minutes, mixing every kind of request
the API takes (streamed and not, n > 1, logprobs, echo + logprobs, logit_bias, cache_salt, stop
strings, token prompts), clients that vanish mid-stream or mid-request, and bad input of every kind,
against a server with a tiny KV cache (preemption) and a short queue (429s).

It fails if any answer is a 5xx, a 2xx has the wrong shape, the server dies, the sanitizers report
anything (run it on a -DSELFSERVE_SANITIZE=ON build), or the server does not settle afterwards:
nothing running or waiting, no KV block held, /health 200, and SIGTERM exits 0.

    cmake -S . -B build-asan -G Ninja -DSELFSERVE_SANITIZE=ON -DSELFSERVE_CUDA=OFF && ninja -C build-asan selfserve
    ASAN_OPTIONS=detect_leaks=1 tools/soak_server.py --bin build-asan/selfserve --seconds 600 --clients 24

--model and --auto-tools soak tool_choice "auto" (which needs a template with a call format, e.g. the
tiny Qwen2 fixture with Qwen2.5's template, as tests/e2e builds it); --vocab bounds the token ids sent.
"""
import argparse
import http.client
import json
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter

WORDS = ("the a river mountain quick brown fox jumps over lazy dog server token cache block stream "
         "prime number seven capital France Paris small model fast slow light dark").split()


STRUCT_SCHEMA = {"type": "object", "properties": {"word": {"type": "string", "maxLength": 12},
                                                  "n": {"type": "integer", "minimum": 0, "maximum": 99},
                                                  "ok": {"type": "boolean"}},
                 "required": ["word", "n"], "additionalProperties": False}
SOAK_REGEX = r"[A-Z][a-z]{1,8}( [a-z]{1,8}){0,3}[.!?]"
SOAK_GBNF = 'root ::= item (", " item){0,3}\nitem ::= "red" | "green" | [0-9]{1,3}'
SOAK_GBNF_RE = r"(red|green|[0-9]{1,3})(, (red|green|[0-9]{1,3})){0,3}"
# "auto" made to call: a Qwen2.5-style call the answer must come back parsed from.
AUTO_CALL_REGEX = r'Ok\.\n<tool_call>\n\{"name": "lookup", "arguments": \{"q": "[a-z]{1,8}"\}\}\n</tool_call>'
SOAK_TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string", "maxLength": 12}, "k": {"type": "integer", "minimum": 1}},
    "required": ["q"], "additionalProperties": False}}}


def text(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


class Soak:
    def __init__(self, args):
        self.args = args
        self.stats = Counter()
        self.failures = []
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def fail(self, what):
        with self.lock:
            if len(self.failures) < 50:
                self.failures.append(what)
            self.stats["FAIL"] += 1

    def count(self, key):
        with self.lock:
            self.stats[key] += 1

    # --- requests -----------------------------------------------------------------------------
    def post(self, path, body, timeout=300):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        c.request("POST", path, data, {"Content-Type": "application/json"})
        r = c.getresponse()
        payload = r.read()
        c.close()
        return r.status, payload

    def generation_body(self, rng):
        chat = rng.random() < 0.5
        body = {"max_tokens": rng.randint(1, 24), "temperature": rng.choice([0, 0, 0.7, 1.0]), "seed": rng.randint(0, 99)}
        if chat:
            body["messages"] = [{"role": "system", "content": "Be brief. " * rng.randint(1, 30)},
                                {"role": "user", "content": text(rng, 1, 20)}]
            if rng.random() < 0.3:
                body["logprobs"] = True
                body["top_logprobs"] = rng.randint(0, 3)
        else:
            body["prompt"] = (text(rng, 1, 60) if rng.random() < 0.7
                              else [rng.randint(0, min(40000, self.args.vocab - 1)) for _ in range(rng.randint(1, 80))])
            if rng.random() < 0.3:
                body["logprobs"] = rng.randint(0, 3)
                body["echo"] = rng.random() < 0.5
        if rng.random() < 0.3:
            body["n"] = rng.randint(1, 3)
        if rng.random() < 0.2:
            body["logit_bias"] = {str(rng.randint(0, self.args.vocab - 1)): rng.uniform(-100, 100)
                                  for _ in range(rng.randint(1, 4))}
        if rng.random() < 0.2:
            body["cache_salt"] = rng.choice(["a", "b", "tenant-c"])
        if rng.random() < 0.2:
            body["stop"] = [rng.choice(WORDS), "\n"]
        if rng.random() < 0.1:
            body["top_k"], body["top_p"], body["min_p"] = rng.randint(0, 50), rng.uniform(0.1, 1.0), rng.uniform(0, 0.2)
        if rng.random() < 0.1:
            body["presence_penalty"], body["frequency_penalty"] = rng.uniform(-2, 2), rng.uniform(-2, 2)
        if rng.random() < 0.1:
            body["min_tokens"] = rng.randint(0, body["max_tokens"])
        tools_heavy = self.args.auto_tools and chat and rng.random() < 0.3  # --auto-tools: tools often
        if tools_heavy or rng.random() < 0.15:  # structured outputs: a few schemas shared by many requests, one rare
            kind = "tools" if tools_heavy else rng.choice(["object", "schema", "schema", "rare", "choice", "regex", "grammar",
                                                            "tools"])
            if kind == "object":
                body["response_format"] = {"type": "json_object"}
            elif kind == "choice":
                body["guided_choice"] = ["yes", "no", rng.choice(WORDS)]
            elif kind == "regex":
                body["structured_outputs"] = {"regex": SOAK_REGEX}
            elif kind == "grammar":
                body["grammar"] = SOAK_GBNF
            elif kind == "tools" and chat:
                body["tools"] = [SOAK_TOOL, {"type": "function", "function": {"name": "noop"}}]
                choices = ["required", {"type": "function", "function": {"name": "lookup"}}]
                if self.args.auto_tools:
                    choices += ["auto", None]
                body["tool_choice"] = rng.choice(choices)
                if body["tool_choice"] is None:
                    del body["tool_choice"]  # OpenAI's default with tools: "auto"
                    if rng.random() < 0.5:
                        body["structured_outputs"] = {"regex": AUTO_CALL_REGEX}
            else:
                schema = STRUCT_SCHEMA if kind == "schema" else {"type": "array", "items": {"enum": WORDS[:rng.randint(1, 40)]},
                                                                 "maxItems": rng.randint(1, 5)}
                body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
            body["max_tokens"] = rng.randint(8, 64)
            if body.get("structured_outputs", {}).get("regex") == AUTO_CALL_REGEX:
                body["max_tokens"] = 160  # the whole call, in a small vocabulary's tokens
            if "min_tokens" in body:
                body["min_tokens"] = min(body["min_tokens"], body["max_tokens"])
        return chat, body

    def check_body(self, chat, body, status, payload):
        if status == 429:
            self.count("429")
            return
        if status != 200:
            self.fail(f"{status} for a valid request {json.dumps(body)[:300]}: {payload[:300]!r}")
            return
        j = json.loads(payload)
        n_prompts = 1 if chat or isinstance(body["prompt"], str) or not isinstance(body["prompt"][0], list) else len(body["prompt"])
        want = body.get("n", 1) * n_prompts
        if len(j["choices"]) != want or sorted(c["index"] for c in j["choices"]) != list(range(want)):
            self.fail(f"choices {len(j['choices'])} != {want}")
        for c in j["choices"]:
            if c["finish_reason"] not in ("stop", "length", "tool_calls"):
                self.fail(f"finish_reason {c['finish_reason']}")
            forced_call = body.get("structured_outputs", {}).get("regex") == AUTO_CALL_REGEX
            if forced_call and c["finish_reason"] == "stop" and not body.get("stop"):
                self.fail(f"an auto answer that is a whole call came back without it: {c['message']!r}")
            if chat and c["message"].get("tool_calls"):
                if body.get("tool_choice", "auto") == "auto":
                    self.count("auto_calls")
                for call in c["message"]["tool_calls"]:
                    if call["function"]["name"] not in ("lookup", "noop"):
                        self.fail(f"tool call to {call['function']['name']!r}")
                    json.loads(call["function"]["arguments"])
                continue
            out = c["message"]["content"] if chat else c["text"]
            whole = c["finish_reason"] == "stop" and not body.get("stop") and not body.get("echo")
            if whole and "structured_outputs" in body and not forced_call and not re.fullmatch(SOAK_REGEX, out):
                self.fail(f"regex output that does not match: {out!r}")
            if whole and "grammar" in body and not re.fullmatch(SOAK_GBNF_RE, out):
                self.fail(f"grammar output that does not match: {out!r}")
            if whole and "response_format" in body:
                try:
                    json.loads(out)
                except ValueError:
                    self.fail(f"structured output that is not JSON: {out[:200]!r}")
            if whole and "guided_choice" in body:
                if out not in body["guided_choice"]:
                    self.fail(f"guided_choice answered {out!r}")
            if not chat and body.get("logprobs") is not None and body.get("echo"):
                lp = c["logprobs"]["token_logprobs"]
                if lp[0] is not None or any(v is None for v in lp[1:]):
                    self.fail("echo + logprobs left a prompt token unscored")
        self.count("200")

    def generation(self, rng):
        chat, body = self.generation_body(rng)
        status, payload = self.post("/v1/chat/completions" if chat else "/v1/completions", body)
        self.check_body(chat, body, status, payload)

    def stream(self, rng):
        chat, body = self.generation_body(rng)
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        path = "/v1/chat/completions" if chat else "/v1/completions"
        s = socket.create_connection(("127.0.0.1", self.port), timeout=300)
        data = json.dumps(body).encode()
        s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
        vanish_after = rng.randint(1, 2000) if rng.random() < 0.4 else None
        got = b""
        try:
            while b"data: [DONE]" not in got:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
                if vanish_after is not None and len(got) > vanish_after:
                    s.close()  # the client goes away mid-stream
                    self.count("vanished")
                    return
        finally:
            s.close()
        head = got.split(b"\r\n", 1)[0]
        if b" 429 " in head:
            self.count("429")
        elif b" 200 " not in head:
            self.fail(f"stream answered {head!r}: {got[:300]!r}")
        elif b"data: [DONE]" not in got:
            self.fail(f"stream ended without [DONE]: {got[-300:]!r}")
        elif b'"server_error"' in got:
            self.fail(f"stream carried a server error: {got[-300:]!r}")
        else:
            self.count("stream")

    BAD = [
        b"{not json", b"[]", b'{"prompt": ""}', b'{"prompt": "hi", "top_k": 2.5}', b'{"prompt": "hi", "max_tokens": 0}',
        b'{"prompt": "hi", "max_tokens": 99999999}', b'{"prompt": "hi", "model": "nope"}',
        b'{"prompt": "hi", "logit_bias": {"99999999999999999999999": 1}}', b'{"prompt": "hi", "logit_bias": {"5": 1000}}',
        b'{"prompt": "hi", "cache_salt": ""}', b'{"prompt": [99999999]}', b'{"prompt": "hi", "n": 0}',
        b'{"messages": [{"role": "wizard", "content": "x"}]}', b'{"prompt": "hi", "temperature": -1}',
        b'{"prompt": "hi", "stop": [1, 2]}', b'{"prompt": "hi", "timeout": "soon"}',
        b'{"prompt": "hi", "structured_outputs": {"regex": "a(?=b)"}}', b'{"prompt": "hi", "grammar": "root ::= x"}',
        b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}]}',
    ]

    def bad(self, rng):
        # With --auto-tools, tools without a tool_choice are a valid "auto" request, not bad input.
        body = rng.choice(self.BAD[:-1] if self.args.auto_tools else self.BAD)
        r = rng.random()
        if r < 0.05:
            body = b'{"prompt": "' + b"x" * (rng.randint(5, 12) << 20) + b'"}'  # over --max-body-mib 4: 413
        elif r < 0.08:
            body = b'{"prompt": "' + b"x" * (rng.randint(1, 3) << 20) + b'"}'  # one 1-3 MiB word: 400, context
        status, payload = self.post(rng.choice(["/v1/completions", "/v1/chat/completions"]), body)
        if 400 <= status < 500:
            self.count(f"{status}")
            j = json.loads(payload)
            if "error" not in j or "message" not in j["error"]:
                self.fail(f"{status} without an OpenAI error body: {payload[:200]!r}")
        else:
            self.fail(f"{status} for bad input {body[:120]!r}: {payload[:200]!r}")

    def rude(self, rng):
        """A client that sends half a request, or garbage, and leaves."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        try:
            if rng.random() < 0.5:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"prompt\":")
            else:
                s.sendall(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300))))
                s.settimeout(5)
                try:
                    s.recv(4096)
                except OSError:
                    pass
        finally:
            s.close()
        self.count("rude")

    def misc(self, rng):
        status, payload = self.post("/tokenize", {"prompt": text(rng, 1, 30)})
        if status != 200:
            self.fail(f"/tokenize {status}")
            return
        toks = json.loads(payload)["tokens"]
        status, _ = self.post("/detokenize", {"tokens": toks})
        if status != 200:
            self.fail(f"/detokenize {status}")
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request("GET", "/metrics")
        if c.getresponse().status != 200:
            self.fail("/metrics")
        c.close()
        self.count("misc")

    def client(self, seed):
        rng = random.Random(seed)
        actions = [(self.generation, 35), (self.stream, 35), (self.bad, 15), (self.rude, 5), (self.misc, 10)]
        while not self.stop.is_set():
            f = rng.choices([a for a, _ in actions], [w for _, w in actions])[0]
            try:
                f(rng)
            except (ConnectionError, socket.timeout, http.client.HTTPException, OSError) as e:
                if self.server.poll() is not None:
                    self.fail(f"server died: exit {self.server.returncode}")
                    return
                self.fail(f"{f.__name__}: {type(e).__name__}: {e}")

    # --- the run ------------------------------------------------------------------------------
    def metrics(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request("GET", "/metrics")
        text_ = c.getresponse().read().decode()
        c.close()
        return {l.rsplit(" ", 1)[0]: float(l.rsplit(" ", 1)[1]) for l in text_.splitlines() if l and l[0] != "#"}

    def run(self):
        a = self.args
        log = open(a.log, "wb")
        self.server = subprocess.Popen([a.bin, "serve", "--port", "0", "--host", "127.0.0.1", "--max-num-seqs", "8",
                                        "--max-waiting", "12", "--kv-cache-mib", str(a.kv_mib)] +
                                       (["--model", a.model] if a.model else []),
                                       stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while time.time() < deadline:
            m = re.search(rb"listening on http://[0-9.]+:(\d+)", open(a.log, "rb").read())
            if m:
                self.port = int(m.group(1))
                try:
                    c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                    c.request("GET", "/health")
                    if c.getresponse().status == 200:
                        break
                except OSError:
                    pass
            if self.server.poll() is not None:
                sys.exit(f"server exited {self.server.returncode}; see {a.log}")
            time.sleep(0.3)
        else:
            sys.exit("server not healthy in time")
        print(f"serving on port {self.port}; {a.clients} clients for {a.seconds} s", flush=True)
        threads = [threading.Thread(target=self.client, args=(a.seed * 1000 + i,)) for i in range(a.clients)]
        for t in threads:
            t.start()
        t0 = time.time()
        while time.time() - t0 < a.seconds and self.server.poll() is None:
            time.sleep(5)
            with self.lock:
                print(f"{time.time() - t0:6.0f} s {dict(self.stats)}", flush=True)
        self.stop.set()
        for t in threads:
            t.join()
        ok = self.server.poll() is None
        if ok:  # settles: nothing running or waiting, no KV block held, healthy
            for _ in range(60):
                m = self.metrics()
                if m.get("selfserve_requests_running", 1) == 0 and m.get("selfserve_requests_waiting", 1) == 0:
                    break
                time.sleep(0.5)
            m = self.metrics()
            print("engine: " + ", ".join(f"{k} {m.get(k, 0):.0f}" for k in (
                "selfserve_preemptions_total", "selfserve_prefix_cache_hits_total", "selfserve_generation_tokens_total",
                "selfserve_prompt_tokens_total")), flush=True)
            for k in ("selfserve_requests_running", "selfserve_requests_waiting", "selfserve_kv_cache_blocks_used"):
                if m.get(k) != 0:
                    self.fail(f"after the soak {k} = {m.get(k)}")
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            c.request("GET", "/health")
            if c.getresponse().status != 200:
                self.fail("/health not 200 after the soak")
            self.server.send_signal(signal.SIGTERM)
            try:
                rc = self.server.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.server.kill()
                rc = "timeout"
            if rc != 0:
                self.fail(f"SIGTERM exit {rc}")
        else:
            self.fail(f"server died: exit {self.server.returncode}")
        log.close()
        sanitizer = [l for l in open(a.log, errors="replace") if "Sanitizer" in l or "runtime error" in l]
        for l in sanitizer[:10]:
            self.fail("sanitizer: " + l.strip())
        print(f"done in {time.time() - t0:.0f} s: {dict(self.stats)}")
        for f in self.failures:
            print("FAIL", f)
        return 1 if self.failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default="build/selfserve")
    p.add_argument("--seconds", type=float, default=300)
    p.add_argument("--clients", type=int, default=24)
    p.add_argument("--kv-mib", type=int, default=12, help="small: forces preemption (12: 34 blocks of 16)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log", default="/tmp/selfserve-soak.log")
    p.add_argument("--model", help="a model other than the default one")
    p.add_argument("--vocab", type=int, default=49152, help="token ids sent stay below this (the model's vocabulary)")
    p.add_argument("--auto-tools", action="store_true",
                   help='also tool_choice "auto" (the model\'s template must have a call format)')
    sys.exit(Soak(p.parse_args()).run())


if __name__ == "__main__":
    main()
