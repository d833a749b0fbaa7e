"""`selfserve serve` on the default model, driven over real HTTP: the official `openai` client for
the happy paths, raw `requests` / sockets for the bad inputs, cancellation, overload and shutdown.

Three servers: the main one (API key, 16 seats), one with a tiny KV cache (forces preemption) and
one with a one-seat queue (429s, then a graceful SIGTERM while streaming)."""
import concurrent.futures as cf
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import threading
import time

import pytest
import requests

openai = pytest.importorskip("openai")
prom_parser = pytest.importorskip("prometheus_client.parser")

ROOT = pathlib.Path(__file__).resolve().parents[2]
API_KEY = "e2e-test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _exe():
    exe = os.environ.get("SELFSERVE_BIN", str(ROOT / "build" / "selfserve"))
    if not os.path.exists(exe):
        pytest.fail(f"{exe} not built; run tools/test.sh or set SELFSERVE_BIN")
    return exe


class Server:
    def __init__(self, tmp_path, name, *args):
        self.log_path = tmp_path / f"{name}.log"
        self.log = open(self.log_path, "wb")
        # On a GPU machine several servers of one test share the card: SELFSERVE_E2E_GPU_MEMORY gives
        # each that share of its memory (tools/gpu/e2e_on_device.sh) instead of the default 0.9.
        if os.environ.get("SELFSERVE_E2E_GPU_MEMORY") and "--gpu-memory-utilization" not in args:
            args = (*args, "--gpu-memory-utilization", os.environ["SELFSERVE_E2E_GPU_MEMORY"])
        self.proc = subprocess.Popen([_exe(), "serve", "--port", "0", "--host", "127.0.0.1", "--quiet", *args],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.url = None
        deadline = time.time() + 180
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}:\n{self.log_text()}")
            if self.url is None:
                m = re.search(rb"listening on (http://[0-9.]+:\d+)", self.log_path.read_bytes())
                if m:
                    self.url = m.group(1).decode()
            if self.url:
                try:
                    if requests.get(self.url + "/health", timeout=2).status_code == 200:
                        break
                except requests.RequestException:
                    pass
            time.sleep(0.1)
        else:
            raise AssertionError(f"server not healthy in time:\n{self.log_text()}")
        self.model = requests.get(self.url + "/v1/models", headers=AUTH, timeout=10).json()["data"][0]["id"]

    def log_text(self):
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def on_gpu(self):
        """Whether the server chose the CUDA backend (its start-up line names the device)."""
        return re.search(r"; device cuda \(", self.log_text()) is not None

    def client(self, **kw):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120, **kw)

    def metrics(self):
        """/metrics as {sample: value}, read by prometheus_client's parser (an independent check of
        the exposition format); a sample is its name, plus {k="v",...} with the labels sorted."""
        text = requests.get(self.url + "/metrics", timeout=10).text
        out = {}
        for fam in prom_parser.text_string_to_metric_families(text):
            for smp in fam.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(smp.labels.items()))
                out[smp.name + ("{" + labels + "}" if labels else "")] = smp.value
        return out

    def metric(self, name):
        values = self.metrics()
        assert name in values, f"{name} not in /metrics"
        return values[name]

    def wait_metric(self, name, want, timeout=10):
        """The metric once it equals `want` (its last value after `timeout` s otherwise): the stats
        snapshot behind /metrics is refreshed just after a step's tokens go out, so a read right after
        a response can still show that step."""
        deadline = time.time() + timeout
        while (v := self.metric(name)) != want and time.time() < deadline:
            time.sleep(0.02)
        return v

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"server did not stop on SIGTERM:\n{self.log_text()}")
        self.log.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def srv(tmp_path_factory, default_model):
    s = Server(tmp_path_factory.mktemp("srv"), "main", "--model", default_model, "--api-key", API_KEY,
               "--max-num-seqs", "16", "--max-num-batched-tokens", "512", "--kv-cache-mib", "256")
    yield s
    assert s.stop() == 0, s.log_text()


def chat_msgs(user, system="You are a helpful assistant."):
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def greedy_completion(srv, prompt, max_tokens=16, client=None, **extra):
    r = (client or srv.client()).completions.create(model=srv.model, prompt=prompt, max_tokens=max_tokens,
                                                    temperature=0, extra_body={"ignore_eos": True, **extra})
    return r.choices[0].text


def concurrent_greedy(srv, prompts, max_tokens):
    """greedy_completion of every prompt at once, texts in order. The clients are made first and the
    requests leave together from a barrier: making a client takes tens of ms of CPU under the GIL,
    which on a loaded machine spread the arrivals of a plain thread pool out enough that requests
    meant to overlap ran one after another."""
    clients = [srv.client() for _ in prompts]
    start = threading.Barrier(len(prompts))

    def one(i):
        start.wait()
        return greedy_completion(srv, prompts[i], max_tokens, client=clients[i])

    with cf.ThreadPoolExecutor(len(prompts)) as ex:
        return list(ex.map(one, range(len(prompts))))


# --- the happy paths with the official client ------------------------------------------------

def test_health_and_models(srv):
    assert requests.get(srv.url + "/health").status_code == 200
    models = srv.client().models.list()
    assert [m.id for m in models.data] == [srv.model]


def test_completion(srv):
    r = srv.client().completions.create(model=srv.model, prompt="The capital of France is", max_tokens=12,
                                        temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].text.strip()
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat(srv):
    r = srv.client().chat.completions.create(model=srv.model, messages=chat_msgs("What is 2 + 2?"),
                                             max_tokens=24, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content.strip()
    assert r.choices[0].finish_reason in ("stop", "length")


def test_streaming_equals_non_streaming(srv):
    c = srv.client()
    kw = dict(model=srv.model, messages=chat_msgs("Name three colors."), max_tokens=20, temperature=0)
    full = c.chat.completions.create(**kw).choices[0].message.content
    chunks = list(c.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0

    stream = c.completions.create(model=srv.model, prompt="Once upon a time", max_tokens=12, temperature=0,
                                  stream=True)
    assert "".join(ch.choices[0].text for ch in stream) == greedy_completion(srv, "Once upon a time", 12,
                                                                             ignore_eos=False)


def test_logprobs(srv):
    c = srv.client()
    r = c.chat.completions.create(model=srv.model, messages=chat_msgs("Say hi."), max_tokens=6, temperature=0,
                                  logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for t in content:
        assert len(t.top_logprobs) == 3
        assert t.logprob <= 0
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob, abs=1e-5)  # greedy: the top token
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob
    r = c.completions.create(model=srv.model, prompt="Hello", max_tokens=5, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert all(v <= 0 for v in lp.token_logprobs)


def test_continuous_usage_stats(srv):
    """vLLM's stream_options.continuous_usage_stats: every chunk carries the usage so far."""
    c = srv.client()
    for chat in (False, True):
        kw = dict(model=srv.model, max_tokens=8, temperature=0, stream=True,
                  stream_options={"include_usage": True, "continuous_usage_stats": True})
        stream = (c.chat.completions.create(messages=chat_msgs("Count to five."), **kw) if chat
                  else c.completions.create(prompt="One, two, three,", extra_body={"ignore_eos": True}, **kw))
        chunks = list(stream)
        final = chunks[-1]
        assert final.choices == [] and final.usage.completion_tokens > 0
        seen = [ch.usage for ch in chunks[:-1]]
        assert all(u is not None and u.prompt_tokens == final.usage.prompt_tokens for u in seen)
        counts = [u.completion_tokens for u in seen]
        assert counts == sorted(counts) and counts[-1] == final.usage.completion_tokens
        assert all(u.total_tokens == u.prompt_tokens + u.completion_tokens for u in seen)
    # Without it, chunks carry "usage": null as OpenAI's do.
    plain = list(c.completions.create(model=srv.model, prompt="Hi", max_tokens=3, stream=True,
                                      stream_options={"include_usage": True}))
    assert all(ch.usage is None for ch in plain[:-1]) and plain[-1].usage.completion_tokens > 0


def test_return_tokens_as_token_ids(srv):
    """vLLM's return_tokens_as_token_ids: the same logprobs, each token named "token_id:<id>", and
    the ids spell the text (checked with the tokenizer's own /detokenize)."""
    c = srv.client()
    plain = c.completions.create(model=srv.model, prompt="Hello", max_tokens=6, temperature=0, logprobs=2)
    ids = c.completions.create(model=srv.model, prompt="Hello", max_tokens=6, temperature=0, logprobs=2,
                               extra_body={"return_tokens_as_token_ids": True})
    a, b = plain.choices[0].logprobs, ids.choices[0].logprobs
    assert b.token_logprobs == a.token_logprobs and b.text_offset == a.text_offset
    assert all(re.fullmatch(r"token_id:\d+", t) for t in b.tokens), b.tokens
    assert all(all(re.fullmatch(r"token_id:\d+", k) for k in d) for d in b.top_logprobs)
    toks = [int(t.split(":")[1]) for t in b.tokens]
    text = requests.post(srv.url + "/detokenize", json={"tokens": toks}, headers=AUTH).json()["prompt"]
    assert text == ids.choices[0].text == plain.choices[0].text
    chat = c.chat.completions.create(model=srv.model, messages=chat_msgs("Say hi."), max_tokens=4, temperature=0,
                                     logprobs=True, top_logprobs=2, extra_body={"return_tokens_as_token_ids": True})
    for t in chat.choices[0].logprobs.content:
        assert re.fullmatch(r"token_id:\d+", t.token) and bytes(t.bytes) == t.token.encode()
        assert all(re.fullmatch(r"token_id:\d+", x.token) for x in t.top_logprobs)


def test_echo_logprobs_score_the_prompt_like_transformers(srv):
    """echo + logprobs (OpenAI's legacy completions, what lm-eval-harness scores prompts with) returns
    every prompt token's logprob after the first. Checked against Hugging Face transformers' logits of
    the same prompts (tests/data/reference, float32): where transformers' top-1 at position p beats its
    runner-up by > 1.0 (kQuantMargin of forward_test.cpp: the 8-bit rounding moves the gap by <= 0.65),
    the prompt token at p + 1 is the server's top-1 exactly when it is transformers' top-1; on the full
    reference rows the logprob agrees within 3.0 (kQuantTol there). An off-by-one fails both."""
    import numpy as np
    ref_dir = ROOT / "tests" / "data" / "reference"
    ref = json.loads((ref_dir / "smollm2-135m-instruct-q4_1.json").read_text())
    vocab = ref["vocab_size"]
    rows = np.frombuffer((ref_dir / ref["logits_file"]).read_bytes(), dtype=np.float16).astype(np.float64)
    rows = rows.reshape(len(ref["full_logits"]), vocab)
    full = {(f["prompt"], f["pos"]): rows[i] for i, f in enumerate(ref["full_logits"])}
    c = srv.client()
    checked = agree = full_checked = 0
    for pi, p in enumerate(ref["prompts"]):
        ids = p["ids"]
        r = c.completions.create(model=srv.model, prompt=ids, max_tokens=1, temperature=0, echo=True, logprobs=3)
        lp = r.choices[0].logprobs
        n = len(ids)
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert all(v is not None for v in lp.token_logprobs[1:n])
        for pos in range(n - 1):
            got = lp.token_logprobs[pos + 1]
            top_val = max(lp.top_logprobs[pos + 1].values())
            assert got <= 1e-6 and got <= top_val + 1e-6
            if p["margin"][pos] > 1.0:
                checked += 1
                agree += (abs(got - top_val) < 1e-6) == (ids[pos + 1] == p["argmax"][pos])
            if (pi, pos) in full:
                row = full[(pi, pos)]
                want = row[ids[pos + 1]] - (row.max() + np.log(np.exp(row - row.max()).sum()))
                assert abs(got - want) <= 3.0, (pi, pos, got, want)
                full_checked += 1
        # The generated token's logprob still follows the prompt's.
        assert len(lp.token_logprobs) == n + 1 and lp.token_logprobs[n] is not None
    assert checked > 50 and agree == checked, f"{agree}/{checked} positions agree with transformers"
    assert full_checked >= 5

    # lm-eval-harness's loglikelihood request (local-completions): a batch of token prompts, each
    # choice scoring its own prompt; its parse reads token_logprobs[ctxlen:-1] and top_logprobs.
    batch = [ref["prompts"][1]["ids"], ref["prompts"][0]["ids"]]
    r = requests.post(srv.url + "/v1/completions", headers=AUTH, json={
        "model": srv.model, "prompt": batch, "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234,
        "echo": True}).json()
    single = {len(ids): c.completions.create(model=srv.model, prompt=ids, max_tokens=1, temperature=0, echo=True,
                                             logprobs=1).choices[0].logprobs.token_logprobs for ids in batch}
    for ch in sorted(r["choices"], key=lambda ch: ch["index"]):
        ids = batch[ch["index"]]
        tl = ch["logprobs"]["token_logprobs"]
        assert len(tl) == len(ids) + 1 and tl == single[len(ids)]
        ctxlen = len(ids) // 2
        assert all(t <= 0 for t in tl[ctxlen:-1])
        # lm-eval's is_greedy: each continuation token is its position's top-1 (the listed maximum).
        for t, top in zip(tl[ctxlen:-1], ch["logprobs"]["top_logprobs"][ctxlen:-1]):
            assert t <= max(top.values()) + 1e-6 and len(top) in (1, 2)

    # Streamed: the echo chunk carries the same prompt logprobs, then the tokens follow.
    ids = ref["prompts"][0]["ids"]
    whole = c.completions.create(model=srv.model, prompt=ids, max_tokens=3, temperature=0, echo=True, logprobs=1)
    chunks = list(c.completions.create(model=srv.model, prompt=ids, max_tokens=3, temperature=0, echo=True,
                                       logprobs=1, stream=True))
    streamed = [v for ch in chunks for v in (ch.choices[0].logprobs.token_logprobs if ch.choices[0].logprobs else [])]
    assert streamed == whole.choices[0].logprobs.token_logprobs
    assert "".join(ch.choices[0].text for ch in chunks) == whole.choices[0].text


def test_stop_strings_and_seeded_n(srv):
    full = greedy_completion(srv, "List the days of the week:", 30)
    assert len(full) > 12
    stop = full[len(full) // 2: len(full) // 2 + 3]
    r = srv.client().completions.create(model=srv.model, prompt="List the days of the week:", max_tokens=30,
                                        temperature=0, stop=[stop], extra_body={"ignore_eos": True})
    assert r.choices[0].text == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    kept = srv.client().completions.create(model=srv.model, prompt="List the days of the week:", max_tokens=30,
                                           temperature=0, stop=[stop],
                                           extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
    assert kept.choices[0].text == full[: full.index(stop) + len(stop)]

    kw = dict(model=srv.model, prompt="My favourite animal is", max_tokens=8, temperature=1.0, seed=5, n=2)
    a = srv.client().completions.create(**kw)
    b = srv.client().completions.create(**kw)
    assert sorted(ch.index for ch in a.choices) == [0, 1]
    assert [ch.text for ch in a.choices] == [ch.text for ch in b.choices]


def test_logit_bias(srv):
    """OpenAI's logit_bias through the official client: +100 forces a token, -100 bans the greedy one
    (the next most likely token, by the unbiased request's own top_logprobs, takes its place)."""
    c = srv.client()
    tok = lambda text: requests.post(srv.url + "/tokenize", json={"prompt": text, "add_special_tokens": False},
                                     headers=AUTH).json()["tokens"]
    banana = tok(" banana")[0]
    forced = c.completions.create(model=srv.model, prompt="The capital of France is", max_tokens=4, temperature=0,
                                  logit_bias={str(banana): 100}, logprobs=1, extra_body={"ignore_eos": True})
    want = requests.post(srv.url + "/detokenize", json={"tokens": [banana] * 4}, headers=AUTH).json()["prompt"]
    assert forced.choices[0].text == want
    assert all(lp > -1e-3 for lp in forced.choices[0].logprobs.token_logprobs)  # logprobs after the bias

    base = c.completions.create(model=srv.model, prompt="The capital of France is", max_tokens=1, temperature=0,
                                logprobs=2)
    top = sorted(base.choices[0].logprobs.top_logprobs[0].items(), key=lambda kv: -kv[1])
    best, second = top[0][0], top[1][0]
    assert base.choices[0].text == best
    best_ids = tok(best)
    assert len(best_ids) == 1, f"{best!r} is not one token"
    banned = c.completions.create(model=srv.model, prompt="The capital of France is", max_tokens=1, temperature=0,
                                  logit_bias={str(best_ids[0]): -100})
    assert banned.choices[0].text == second

    for bias in ({"-1": 5}, {"1000000": 5}, {"5": 101}, {"5": "x"}, [5]):
        r = requests.post(srv.url + "/v1/completions", headers=AUTH,
                          json={"prompt": "hi", "max_tokens": 1, "logit_bias": bias})
        assert r.status_code == 400, (bias, r.text)
        assert r.json()["error"]["param"] == "logit_bias"


def test_min_tokens(srv):
    """vLLM's min_tokens: an answer that would end after a few tokens (end-of-generation) runs on."""
    c = srv.client()
    kw = dict(model=srv.model, messages=chat_msgs("Say hi."), max_tokens=80, temperature=0)
    short = c.chat.completions.create(**kw)
    n = short.usage.completion_tokens
    assert short.choices[0].finish_reason == "stop" and n < 60, short
    longer = c.chat.completions.create(**kw, extra_body={"min_tokens": n + 10})
    assert longer.usage.completion_tokens >= n + 10
    assert longer.choices[0].message.content.startswith(short.choices[0].message.content)
    r = requests.post(srv.url + "/v1/completions", headers=AUTH,
                      json={"prompt": "hi", "max_tokens": 3, "min_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"


PET_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "species": {"enum": ["cat", "dog", "parrot"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
        "weight_kg": {"type": "number", "minimum": 0},
        "toys": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
        "vaccinated": {"type": "boolean"},
        "owner": {"anyOf": [{"$ref": "#/$defs/person"}, {"type": "null"}]},
    },
    "required": ["name", "species", "age", "vaccinated", "owner"],
    "additionalProperties": False,
    "$defs": {"person": {"type": "object", "properties": {"first": {"type": "string", "maxLength": 20}},
                         "required": ["first"], "additionalProperties": False}},
}


def _sampled_pet_json(server):
    """A json_schema (PET_SCHEMA) chat answer sampled at temperature 1 with seed 11, n=6; and the
    text of the same request streamed, which is the first choice's where rows keep their bits."""
    rf = {"type": "json_schema", "json_schema": {"name": "pet", "strict": True, "schema": PET_SCHEMA}}
    c = server.client()
    msgs = chat_msgs("Describe a pet as JSON.")
    r = c.chat.completions.create(model=server.model, messages=msgs, max_tokens=300, temperature=1.0, n=6, seed=11,
                                  response_format=rf)
    stream = c.chat.completions.create(model=server.model, messages=msgs, max_tokens=300, temperature=1.0, seed=11,
                                       response_format=rf, stream=True)
    return r, "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)


def test_batch_invariant_flag_on_the_gpu(srv, tmp_path):
    """--batch-invariant on the CUDA backend: the startup line says so; greedy text of two prompts is
    the same alone and among 16 concurrent requests (steps past 8 rows, prefill of 16 prompts at
    once); and a json_schema answer sampled at temperature 1 with a seed streams the same text as
    the first of n=6 choices (other rows, another prompt chunking, prefix-cache hits)."""
    if not srv.on_gpu():
        pytest.skip("no GPU: --batch-invariant is the CUDA backend's; the CPU backend always is, as the "
                    "tests above hold")
    jsonschema = pytest.importorskip("jsonschema")
    s = Server(tmp_path, "inv", *_model_args(srv), "--api-key", API_KEY, "--batch-invariant", "--max-num-seqs", "16",
               "--max-num-batched-tokens", "512", "--kv-cache-mib", "256")
    try:
        assert re.search(r"; device cuda \(.*\), batch-invariant", s.log_text()), s.log_text()
        assert_batch_invariant(s)
        r, text = _sampled_pet_json(s)
        for ch in r.choices:
            jsonschema.validate(json.loads(ch.message.content), PET_SCHEMA)
        assert text == r.choices[0].message.content
    finally:
        assert s.stop() == 0, s.log_text()


def test_structured_output_json_schema(srv):
    """response_format json_schema: sampled at temperature 1 (where an unconstrained small model
    rarely writes valid JSON), every choice parses and validates with the jsonschema package, ends
    with "stop", and keeps the declared property order; streaming gives the same text."""
    jsonschema = pytest.importorskip("jsonschema")
    r, text = _sampled_pet_json(srv)
    for ch in r.choices:
        assert ch.finish_reason == "stop", ch.message.content
        doc = json.loads(ch.message.content)
        jsonschema.validate(doc, PET_SCHEMA)
        declared = [k for k in PET_SCHEMA["properties"] if k in doc]
        assert list(doc) == declared, "properties in the declared order"
    # Streaming the first choice's seed gives the same text. On the CPU backend only: on the GPU a
    # row's logits depend on how its prompt was chunked and which prefix blocks were cached unless
    # the server runs with --batch-invariant (test_batch_invariant_flag_on_the_gpu), so at temperature
    # 1 the two samples part; there the streamed answer must still be valid.
    if srv.on_gpu():
        jsonschema.validate(json.loads(text), PET_SCHEMA)
    else:
        assert text == r.choices[0].message.content
    # The same request unconstrained is not JSON most of the time (so the constraint did the work).
    free = srv.client().chat.completions.create(model=srv.model, messages=chat_msgs("Describe a pet as JSON."),
                                                max_tokens=60, temperature=1.0, n=6, seed=11)
    def valid(t):
        try:
            jsonschema.validate(json.loads(t), PET_SCHEMA)
            return True
        except Exception:
            return False
    assert sum(valid(ch.message.content) for ch in free.choices) < 6


def test_structured_output_with_the_clients_pydantic_helper(srv):
    """The openai client's own structured-output path: it turns a Pydantic model into a strict JSON
    Schema, sends it, and parses the answer back into the model."""
    pydantic = pytest.importorskip("pydantic")
    import datetime
    import uuid
    from typing import List, Literal, Optional

    class Step(pydantic.BaseModel):
        explanation: str = pydantic.Field(max_length=60)
        output: str = pydantic.Field(max_length=30)

    class Solution(pydantic.BaseModel):
        steps: List[Step] = pydantic.Field(max_length=3)
        final_answer: int = pydantic.Field(ge=-100, le=100)
        confidence: Literal["low", "medium", "high"]
        note: Optional[str] = pydantic.Field(max_length=40)
        solved_on: datetime.date          # format "date": Pydantic parses it, so it must be a real date
        checked_at: datetime.datetime     # format "date-time"
        ticket: uuid.UUID                 # format "uuid"

    c = srv.client()
    for seed in (1, 2):
        # The schema bounds the answer, but not within 400 tokens: on an H100 (2026-12-06) the GPU's
        # sample for one of these seeds was still inside it at 400.
        r = c.chat.completions.parse(model=srv.model, messages=chat_msgs("Solve 8x + 7 = -23."), max_tokens=1000,
                                     temperature=0.8, seed=seed, response_format=Solution)
        ch = r.choices[0]
        assert ch.finish_reason == "stop", ch.message.content
        assert isinstance(ch.message.parsed, Solution), ch.message.content
        assert -100 <= ch.message.parsed.final_answer <= 100


def test_structured_output_regex_grammar_and_schema_patterns(srv):
    """vLLM's structured_outputs (regex, json, choice, grammar) and guided_regex, llama.cpp's GBNF
    `grammar`, and JSON Schema's `pattern`:
    sampled at temperature 1, every answer matches by Python's `re` (and validates with the
    jsonschema package, which checks `pattern` with re.search)."""
    jsonschema = pytest.importorskip("jsonschema")
    c = srv.client()
    sentence = r"[A-Z][a-z]{2,8} (is|was) [0-9]{1,3}( years old)?\."
    r = c.completions.create(model=srv.model, prompt="Tell me about Anna:", max_tokens=40, temperature=1.0, n=4,
                             seed=3, extra_body={"structured_outputs": {"regex": sentence}})
    for ch in r.choices:
        assert ch.finish_reason == "stop" and re.fullmatch(sentence, ch.text), ch.text
    phone = r"\(\d{3}\) \d{3}-\d{4}"
    r = c.chat.completions.create(model=srv.model, messages=chat_msgs("Give me a phone number."), max_tokens=30,
                                  temperature=1.0, n=3, seed=8, extra_body={"guided_regex": phone})
    for ch in r.choices:
        assert ch.finish_reason == "stop" and re.fullmatch(phone, ch.message.content), ch.message.content
    # Streaming gives the same text as the non-streamed first choice's seed.
    stream = c.chat.completions.create(model=srv.model, messages=chat_msgs("Give me a phone number."), max_tokens=30,
                                       temperature=1.0, seed=8, extra_body={"guided_regex": phone}, stream=True)
    assert "".join(x.choices[0].delta.content or "" for x in stream if x.choices) == r.choices[0].message.content
    # JSON Schema `pattern`, with quotes and a backslash that must come out JSON-escaped. (Unanchored
    # patterns, where any text may surround the match, are checked against std::regex_search in the
    # unit tests: a sampled 135M model may write past max_tokens there.)
    schema = {"type": "object",
              "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                             "quoted": {"type": "string", "pattern": '^"[a-z]{1,8}\\\\[a-z]{1,8}"$'}},
              "required": ["code", "quoted"], "additionalProperties": False}
    for body in ({"structured_outputs": {"json": schema}},
                 {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}):
        r = c.completions.create(model=srv.model, prompt="A record:", max_tokens=120, temperature=1.0, n=3, seed=6,
                                 extra_body=body)
        for ch in r.choices:
            assert ch.finish_reason == "stop", ch.text
            doc = json.loads(ch.text)
            jsonschema.validate(doc, schema)
            assert doc["quoted"].startswith('"') and "\\" in doc["quoted"], doc
    r = c.completions.create(model=srv.model, prompt="Pick one:", max_tokens=8, temperature=1.0, n=4, seed=1,
                             extra_body={"structured_outputs": {"choice": ["left", "right"]}})
    assert all(ch.text in ("left", "right") for ch in r.choices)
    # GBNF grammars: vLLM's structured_outputs.grammar (its documentation's SQL example) and llama.cpp's
    # `grammar` field; each answer matches the same language written as a Python regex.
    sql = """
        root ::= select_statement
        select_statement ::= "SELECT " column " from " table " where " condition
        column ::= "col_1 " | "col_2 "
        table ::= "table_1 " | "table_2 "
        condition ::= column "= " number
        number ::= "1 " | "2 "
    """
    sql_re = r"SELECT col_[12]  from table_[12]  where col_[12] = [12] "
    r = c.completions.create(model=srv.model, prompt="A query:", max_tokens=40, temperature=1.0, n=3, seed=2,
                             extra_body={"structured_outputs": {"grammar": sql}})
    for ch in r.choices:
        assert ch.finish_reason == "stop" and re.fullmatch(sql_re, ch.text), ch.text
    lists = 'root ::= item ("," ws item){1,3}\nitem ::= [a-z]{2,6}\nws ::= " "?'
    r = c.chat.completions.create(model=srv.model, messages=chat_msgs("Name some fruits."), max_tokens=40,
                                  temperature=1.0, n=3, seed=4, extra_body={"grammar": lists})
    for ch in r.choices:
        assert ch.finish_reason == "stop" and re.fullmatch(r"[a-z]{2,6}(, ?[a-z]{2,6}){1,3}", ch.message.content), \
            ch.message.content
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=srv.model, prompt="x", max_tokens=8, extra_body={"grammar": "root ::= item"})
    assert "'item' is used but not defined" in str(e.value)
    # What a regex cannot say to a grammar is a 400 naming it.
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=srv.model, prompt="x", max_tokens=8,
                             extra_body={"structured_outputs": {"regex": "(a)\\1"}})
    assert "backreference" in str(e.value)


def test_structured_output_json_object_choice_and_errors(srv):
    c = srv.client()
    # json_object: greedy is deterministic, so this prompt's answer is a whole object every time.
    q = chat_msgs("Return a JSON object with a person's name and age.")
    r = c.chat.completions.create(model=srv.model, messages=q, max_tokens=200, temperature=0,
                                  response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    # Sampled: a 135M model may ramble until max_tokens, but never leaves JSON.
    r = c.chat.completions.create(model=srv.model, messages=q, max_tokens=120, temperature=1.0, n=4, seed=5,
                                  response_format={"type": "json_object"})
    for ch in r.choices:
        if ch.finish_reason == "stop":
            assert isinstance(json.loads(ch.message.content), dict)
        else:  # cut by max_tokens (the grammar's soundness is the unit tests' job)
            assert ch.finish_reason == "length" and ch.message.content.startswith("{")
    # vLLM's guided_choice, on completions too.
    r = c.completions.create(model=srv.model, prompt="Is the sky blue? Answer:", max_tokens=8, temperature=1.0, n=5,
                             seed=2, extra_body={"guided_choice": ["yes", "no", "it depends"]})
    for ch in r.choices:
        assert ch.text in ("yes", "no", "it depends") and ch.finish_reason == "stop"
    # guided_json with a schema given as a string.
    r = c.completions.create(model=srv.model, prompt="A small number:", max_tokens=8, temperature=1.0, seed=4,
                             extra_body={"guided_json": json.dumps({"type": "integer", "minimum": 1, "maximum": 9})})
    assert r.choices[0].text in [str(i) for i in range(1, 10)], r.choices[0].text
    # What the grammar cannot follow is a 400 naming it, never silently ignored.
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "number", "multipleOf": 3}}}
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=srv.model, messages=chat_msgs("hi"), max_tokens=8, response_format=bad)
    assert "multipleOf" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=srv.model, messages=chat_msgs("hi"), max_tokens=8,
                                  response_format={"type": "json_object"}, extra_body={"guided_choice": ["a"]})
    # A schema too ambiguous to follow (100 x 100 array alternatives alive after one "[") is found
    # while generating: a 400 naming it, streaming or not, and the engine goes on serving.
    inner = [{"type": "array", "minItems": 1, "items": {"type": "integer"}}] * 100
    amb = {"anyOf": [{"type": "array", "minItems": 1, "items": {"anyOf": inner}}] * 100}
    rf = {"type": "json_schema", "json_schema": {"name": "amb", "schema": amb}}
    for temperature, top_p in ((0, 1.0), (1.0, 0.9)):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=srv.model, messages=chat_msgs("hi"), max_tokens=8, response_format=rf,
                                      temperature=temperature, top_p=top_p)
        assert "too ambiguous" in str(e.value)
    stream = c.chat.completions.create(model=srv.model, messages=chat_msgs("hi"), max_tokens=8, response_format=rf,
                                       stream=True)
    with pytest.raises(openai.APIError) as e:
        for _ in stream:
            pass
    assert "too ambiguous" in str(e.value)
    assert c.completions.create(model=srv.model, prompt="Hello", max_tokens=2).choices[0].finish_reason


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "maxLength": 20},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 10}},
                   "required": ["zone"], "additionalProperties": False}}}


def test_tool_calls_named_required_streaming_and_multi_turn(srv):
    """OpenAI tools through the official client: a named function and tool_choice "required" (as
    vLLM constrains them) give tool_calls whose arguments validate against the tool's parameters
    (jsonschema package); streaming gives the same calls; the tool's answer goes back as a "tool"
    message; "auto" is a clear 400 here (the default model's template has no call format), never
    silently ignored."""
    jsonschema = pytest.importorskip("jsonschema")
    c = srv.client()
    tools = [WEATHER_TOOL, TIME_TOOL]
    by_name = {t["function"]["name"]: t for t in tools}
    msgs = chat_msgs("What is the weather in Paris?")
    r = c.chat.completions.create(model=srv.model, messages=msgs, tools=tools, max_tokens=60, temperature=1.0, n=3,
                                  seed=5, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    for ch in r.choices:
        assert ch.finish_reason == "stop" and ch.message.content is None, ch.message
        (call,) = ch.message.tool_calls
        assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])
    assert len({ch.message.tool_calls[0].id for ch in r.choices}) == 3, "call ids are unique"
    r = c.chat.completions.create(model=srv.model, messages=msgs, tools=tools, tool_choice="required",
                                  parallel_tool_calls=False, max_tokens=80, temperature=1.0, n=4, seed=2)
    for ch in r.choices:
        assert ch.finish_reason == "tool_calls", ch.message
        (call,) = ch.message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), by_name[call.function.name]["function"]["parameters"])
    # Streaming the first choice's seed: the same calls, in the last chunk, with their index.
    stream = c.chat.completions.create(model=srv.model, messages=msgs, tools=tools, tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=80, temperature=1.0, seed=2, stream=True)
    chunks = [x for x in stream if x.choices]
    streamed = [tc for x in chunks if x.choices[0].delta.tool_calls for tc in x.choices[0].delta.tool_calls]
    want = r.choices[0].message.tool_calls
    assert [(t.index, t.function.name, t.function.arguments) for t in streamed] == \
        [(k, t.function.name, t.function.arguments) for k, t in enumerate(want)]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # The call and the tool's answer go back; with tool_choice "none" the model answers in text.
    call = r.choices[0].message.tool_calls[0]
    turn = msgs + [{"role": "assistant", "content": None,
                    "tool_calls": [{"id": call.id, "type": "function",
                                    "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
                   {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}]
    r = c.chat.completions.create(model=srv.model, messages=turn, tools=tools, tool_choice="none", max_tokens=16)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    # The prompt holds the call (as the "required" format) and the tool's answer.
    tok = requests.post(srv.url + "/tokenize", json={"messages": turn}, headers=AUTH).json()
    text = requests.post(srv.url + "/detokenize", json={"tokens": tok["tokens"]}, headers=AUTH).json()["prompt"]
    assert '"name":"' + call.function.name + '"' in text and "18 degrees and sunny" in text, text
    # What cannot be honoured is a 400 naming it.
    for kw, needle in (({"tool_choice": "auto"}, "auto"),
                       ({}, "auto"),  # "auto" is OpenAI's default when tools are given
                       ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
                       ({"tool_choice": "sometimes"}, "tool_choice")):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=srv.model, messages=msgs, tools=tools, max_tokens=8, **kw)
        assert needle in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=srv.model, messages=msgs, tool_choice="required", max_tokens=8)
    assert "needs 'tools'" in str(e.value)


@pytest.fixture(scope="module")
def qwen_tools_model(tmp_path_factory):
    """The tiny random-weight Qwen2 fixture with Qwen2.5's real chat template (the one with tools)."""
    d = tmp_path_factory.mktemp("qwen25-tools")
    src = ROOT / "tests" / "data" / "tiny-qwen2"
    for f in src.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    template = json.loads((ROOT / "tests" / "data" / "tokenizer" / "chat_tool_cases.json").read_text())["templates"]["qwen2.5"]
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    model = json.loads((src / "config.json").read_text())
    model["max_position_embeddings"] = 4096  # room for the tools section (random weights: any length is as good)
    (d / "config.json").write_text(json.dumps(model))
    return str(d)


def test_tool_choice_auto_in_the_models_own_format(qwen_tools_model, tmp_path):
    """tool_choice "auto" (OpenAI's default with tools) on a model whose template has a call format:
    the tools reach the prompt as the template's tojson (Python's json.dumps) writes them, the model
    answers in text or in <tool_call> blocks, and the calls come back as message.tool_calls, streamed
    or not. A regex makes the random-weight model write a call."""
    s = Server(tmp_path, "qwen-tools", "--model", qwen_tools_model, "--api-key", API_KEY)
    try:
        c = s.client()
        tools = [WEATHER_TOOL, TIME_TOOL]
        msgs = [{"role": "user", "content": "What is the weather in Oslo?"}]

        def prompt_text(body):
            tok = requests.post(s.url + "/tokenize", json=body, headers=AUTH).json()
            return requests.post(s.url + "/detokenize", json={"tokens": tok["tokens"]}, headers=AUTH).json()["prompt"]
        text = prompt_text({"messages": msgs, "tools": tools})
        for t in tools:
            assert "\n" + json.dumps(t, ensure_ascii=False) + "\n" in text, text
        assert "<tool_call></tool_call> XML tags" in text
        assert "<tools>" not in prompt_text({"messages": msgs})

        call_re = (r'Let me check\.\n<tool_call>\n\{"name": "get_weather", "arguments": '
                   r'\{"city": "(Oslo|Paris)", "unit": "celsius"\}\}\n</tool_call>')
        kw = dict(model=s.model, messages=msgs, tools=tools, max_tokens=200, temperature=1.0, seed=3,
                  extra_body={"structured_outputs": {"regex": call_re}})
        r = c.chat.completions.create(**kw)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", ch
        assert ch.message.content == "Let me check.\n"
        (call,) = ch.message.tool_calls
        assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
        args = json.loads(call.function.arguments)
        assert args["city"] in ("Oslo", "Paris") and args["unit"] == "celsius"
        assert call.function.arguments == json.dumps(args, ensure_ascii=False)  # as vLLM's hermes parser writes them
        # Streamed: the text goes out as it comes, the call (never a piece of it as text) at the end.
        chunks = [x for x in c.chat.completions.create(stream=True, **kw) if x.choices]
        content = "".join(x.choices[0].delta.content or "" for x in chunks)
        assert content == "Let me check.\n"
        assert sum(1 for x in chunks if x.choices[0].delta.content) > 1, "the text streamed in pieces"
        streamed = [tc for x in chunks if x.choices[0].delta.tool_calls for tc in x.choices[0].delta.tool_calls]
        assert [(t.index, t.function.name, t.function.arguments) for t in streamed] == \
            [(0, "get_weather", call.function.arguments)]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        # Free text (no call) is plain content, the same streamed or not.
        free = dict(model=s.model, messages=msgs, tools=tools, max_tokens=24, temperature=0)
        r = c.chat.completions.create(**free)
        chunks = [x for x in c.chat.completions.create(stream=True, **free) if x.choices]
        assert "".join(x.choices[0].delta.content or "" for x in chunks) == r.choices[0].message.content
        assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason in ("stop", "length")
        # The call and its result go back in the template's own form.
        turn = msgs + [{"role": "assistant", "content": None,
                        "tool_calls": [{"id": call.id, "type": "function",
                                        "function": {"name": "get_weather", "arguments": call.function.arguments}}]},
                       {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
        text = prompt_text({"messages": turn, "tools": tools})
        assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": ' +
                json.dumps(args, ensure_ascii=False) + '}\n</tool_call><|im_end|>') in text, text
        assert "<tool_response>\nsunny\n</tool_response>" in text
        r = c.chat.completions.create(model=s.model, messages=turn, tools=tools, max_tokens=8)
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    finally:
        assert s.stop() == 0, s.log_text()


def test_tool_calls_with_the_clients_pydantic_helper(srv):
    """openai.pydantic_function_tool turns a Pydantic model into a strict tool; a named choice gives
    arguments the model class parses."""
    pydantic = pytest.importorskip("pydantic")
    from typing import Literal

    class Booking(pydantic.BaseModel):
        guest: str = pydantic.Field(max_length=24)
        nights: int = pydantic.Field(ge=1, le=14)
        room: Literal["single", "double", "suite"]

    tool = openai.pydantic_function_tool(Booking)
    c = srv.client()
    for seed in (1, 2):
        r = c.chat.completions.create(model=srv.model, messages=chat_msgs("Book a room for Ana, 3 nights."),
                                      tools=[tool], tool_choice={"type": "function", "function": {"name": "Booking"}},
                                      max_tokens=60, temperature=0.8, seed=seed)
        (call,) = r.choices[0].message.tool_calls
        booking = Booking.model_validate_json(call.function.arguments)
        assert 1 <= booking.nights <= 14


def test_tokenize_detokenize(srv):
    t = requests.post(srv.url + "/tokenize", json={"prompt": "Hello world"}, headers=AUTH).json()
    assert t["count"] == len(t["tokens"]) > 0
    d = requests.post(srv.url + "/detokenize", json={"tokens": t["tokens"]}, headers=AUTH).json()
    assert d["prompt"] == "Hello world"


# --- concurrency, batch invariance, cancellation, prefix cache -------------------------------

def assert_batch_invariant(server):
    """Greedy text of two prompts alone equals their text among 16 concurrent requests."""
    prompts = [f"Write one sentence about the number {i}." for i in range(16)]
    alone = [greedy_completion(server, p, 16) for p in prompts[:2]]
    with cf.ThreadPoolExecutor(16) as ex:
        together = list(ex.map(lambda p: greedy_completion(server, p, 16), prompts))
    assert together[:2] == alone
    assert all(t for t in together)


def test_concurrency_and_batch_invariance(srv):
    assert_batch_invariant(srv)


def test_q8_kv_cache_server_is_batch_invariant_and_holds_more_blocks(srv, tmp_path, selfserve):
    # The 8-bit cache (the CPU backend's) stores a token in about half of fp16's bytes, so the same
    # --kv-cache-mib holds nearly twice the blocks; greedy text stays the same alone and among 16
    # concurrent requests.
    f16 = json.loads(selfserve("inspect", "--memory", "--json", *_model_args(srv)[1:], "--device", "cpu",
                               "--max-num-seqs", "16", "--kv-cache-mib", "256").stdout)
    q8 = Server(tmp_path, "q8", *_model_args(srv), "--api-key", API_KEY, "--kv-cache-dtype", "q8_0",
                "--max-num-seqs", "16", "--kv-cache-mib", "256", "--device", "cpu")
    try:
        assert q8.metric("selfserve_kv_cache_blocks_total") >= 1.8 * f16["kv_blocks"]
        assert_batch_invariant(q8)
    finally:
        assert q8.stop() == 0, q8.log_text()


def test_cancellation_frees_blocks(srv):
    body = {"model": srv.model, "prompt": "Tell me a very long story.", "max_tokens": 1000, "temperature": 0,
            "ignore_eos": True, "stream": True}
    aborted_before = _finished(srv, "abort")
    with requests.post(srv.url + "/v1/completions", json=body, headers=AUTH, stream=True, timeout=60) as r:
        assert r.status_code == 200
        # Hold the line iterator: a dropped one closes the connection, and the server would (rightly)
        # cancel the request before we look at its blocks.
        lines = r.iter_lines()
        for line in lines:
            if line.startswith(b"data: "):
                break
        deadline = time.time() + 5  # the stats snapshot is refreshed just after a step's tokens go out
        while srv.metric("selfserve_kv_cache_blocks_used") == 0 and time.time() < deadline:
            time.sleep(0.01)
        assert srv.metric("selfserve_kv_cache_blocks_used") > 0
    # Connection closed: the request stops within a step and gives its blocks back.
    deadline = time.time() + 10
    while time.time() < deadline:
        if srv.metric("selfserve_kv_cache_blocks_used") == 0 and srv.metric("selfserve_requests_running") == 0:
            break
        time.sleep(0.05)
    assert srv.metric("selfserve_kv_cache_blocks_used") == 0
    assert _finished(srv, "abort") == aborted_before + 1


def _finished(srv, reason):
    return srv.metrics().get(f'selfserve_requests_finished_total{{finish_reason="{reason}"}}', 0.0)


def test_metrics_exposition_and_vllm_series(srv):
    """/metrics parses with prometheus_client; the series Kubernetes gateways and vLLM dashboards read
    have vLLM's names, types and model_name label; histograms are cumulative and end at their count."""
    srv.client().completions.create(model=srv.model, prompt="The capital of France is", max_tokens=4, temperature=0)
    text = requests.get(srv.url + "/metrics", timeout=10).text
    fams = {f.name: f for f in prom_parser.text_string_to_metric_families(text)}  # counters lose "_total"
    vllm = {"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
            "vllm:kv_cache_usage_perc": "gauge", "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter",
            "vllm:num_preemptions": "counter", "vllm:request_success": "counter",
            "vllm:time_to_first_token_seconds": "histogram", "vllm:inter_token_latency_seconds": "histogram",
            "vllm:e2e_request_latency_seconds": "histogram"}
    ours = {"selfserve_requests_running": "gauge", "selfserve_kv_cache_usage_ratio": "gauge",
            "selfserve_generation_tokens": "counter", "selfserve_requests_rejected": "counter",
            "selfserve_time_to_first_token_seconds": "histogram", "selfserve_e2e_request_latency_seconds": "histogram"}
    for name, typ in {**vllm, **ours}.items():
        assert name in fams, f"{name} missing from /metrics"
        assert fams[name].type == typ, f"{name} is a {fams[name].type}, not a {typ}"
    for name in vllm:
        assert all(s.labels.get("model_name") == srv.model for s in fams[name].samples), name
    gen = {n: next(s.value for s in fams[n].samples) for n in ("vllm:generation_tokens", "selfserve_generation_tokens")}
    assert gen["vllm:generation_tokens"] == gen["selfserve_generation_tokens"] >= 4
    for name, fam in fams.items():
        if fam.type != "histogram":
            continue
        series = {}
        for s in fam.samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            series.setdefault(key, {"buckets": [], "count": None})
            if s.name.endswith("_bucket"):
                series[key]["buckets"].append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_count"):
                series[key]["count"] = s.value
        for key, h in series.items():
            b = sorted(h["buckets"])
            assert b and b[-1][0] == float("inf"), f"{name}{key}: no +Inf bucket"
            assert all(x[1] <= y[1] for x, y in zip(b, b[1:])), f"{name}{key}: buckets not cumulative"
            assert b[-1][1] == h["count"], f"{name}{key}: +Inf bucket {b[-1][1]} != count {h['count']}"
    assert next(s.value for s in fams["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_count")) >= 1


def test_prefix_cache_hits_on_shared_system_prompt(srv):
    system = "You are a meticulous assistant. " + " ".join(f"Rule {i}: be precise and kind." for i in range(20))
    c = srv.client()
    hits0 = srv.metric("selfserve_prefix_cache_hits_total")
    for q in ["What is the sun?", "What is the moon?", "What is a star?"]:
        c.chat.completions.create(model=srv.model, messages=chat_msgs(q, system), max_tokens=2, temperature=0)
    hits = srv.metric("selfserve_prefix_cache_hits_total") - hits0
    n_sys = len(requests.post(srv.url + "/tokenize", json={"prompt": system}, headers=AUTH).json()["tokens"])
    assert hits >= 2 * (n_sys // 16 - 1) * 16, f"{hits} hit tokens for a {n_sys}-token system prompt"
    assert srv.metric("selfserve_prefix_cache_hit_rate") > 0


def test_cache_salt_isolates_prefix_reuse(srv):
    """vLLM's cache_salt: a repeated system prompt hits the prefix cache only under the same salt."""
    system = "You are a careful archivist. " + " ".join(f"Entry {i}: keep the ledger exact." for i in range(20))
    c = srv.client()

    def hit_tokens(q, salt):
        h0 = srv.metric("selfserve_prefix_cache_hits_total")
        r = c.chat.completions.create(model=srv.model, messages=chat_msgs(q, system), max_tokens=4, temperature=0,
                                      extra_body={"cache_salt": salt})
        return srv.metric("selfserve_prefix_cache_hits_total") - h0, r.choices[0].message.content

    first, text = hit_tokens("Who keeps the ledger?", "tenant-a")
    assert first == 0
    same, text_same = hit_tokens("Who keeps the ledger?", "tenant-a")
    assert same >= 32 and text_same == text
    other, text_other = hit_tokens("Who keeps the ledger?", "tenant-b")
    assert other == 0 and text_other == text
    r = requests.post(srv.url + "/v1/chat/completions", headers=AUTH,
                      json={"messages": chat_msgs("x"), "max_tokens": 1, "cache_salt": ""})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"


def test_request_timeout(srv):
    t0 = time.time()
    r = requests.post(srv.url + "/v1/completions", headers=AUTH, timeout=60,
                      json={"model": srv.model, "prompt": "Count:", "max_tokens": 3000, "ignore_eos": True,
                            "temperature": 0, "timeout": 0.5}).json()
    assert time.time() - t0 < 10
    assert r["choices"][0]["finish_reason"] == "length"
    assert r["usage"]["completion_tokens"] < 3000


# --- every bad input: a 4xx with an OpenAI-style error, never a crash ------------------------

def _err(r, status):
    assert r.status_code == status, (r.status_code, r.text)
    e = r.json()["error"]
    assert set(e) >= {"message", "type", "param", "code"} and e["message"]
    return e


def test_bad_inputs(srv):
    u, m = srv.url, srv.model
    post = lambda path, body, **kw: requests.post(u + path, headers={**AUTH, **kw.pop("headers", {})}, timeout=30,
                                                  **({"data": body} if isinstance(body, (bytes, str)) else {"json": body}),
                                                  **kw)
    _err(post("/v1/completions", b"{not json"), 400)
    _err(post("/v1/completions", b""), 400)
    _err(post("/v1/completions", b"[1,2]"), 400)
    e = _err(post("/v1/completions", {"model": m, "prompt": "hi", "top_k": 2.5}), 400)
    assert e["param"] == "top_k"
    _err(post("/v1/completions", {"model": m, "prompt": "hi", "temperature": "hot"}), 400)
    _err(post("/v1/completions", {"model": m, "prompt": "hi", "stream": "yes"}), 400)
    _err(post("/v1/completions", {"model": m, "prompt": "hi", "n": 0}), 400)
    _err(post("/v1/completions", {"model": m, "prompt": ""}), 400)
    _err(post("/v1/completions", {"model": m, "prompt": []}), 400)
    _err(post("/v1/completions", {"model": m}), 400)
    _err(post("/v1/chat/completions", {"model": m, "messages": []}), 400)
    _err(post("/v1/chat/completions", {"model": m, "messages": "hi"}), 400)
    _err(post("/v1/chat/completions", {"model": m, "messages": [{"role": "wizard", "content": "x"}]}), 400)
    _err(post("/v1/completions", {"model": m, "prompt": "hi", "max_tokens": 0}), 400)
    _err(post("/v1/completions", {"model": m, "prompt": "hi", "max_tokens": -3}), 400)
    e = _err(post("/v1/completions", {"model": m, "prompt": "hi", "max_tokens": 10 ** 7}), 400)
    assert e["code"] == "context_length_exceeded"
    e = _err(post("/v1/completions", {"model": m, "prompt": "hello " * 10000}), 400)
    assert e["code"] == "context_length_exceeded", "never truncated silently"
    _err(post("/v1/completions", {"model": m, "prompt": [10 ** 9]}), 400)
    e = _err(post("/v1/completions", {"model": "gpt-4o", "prompt": "hi"}), 404)
    assert e["code"] == "model_not_found"
    _err(post("/v1/completions", b"x" * (5 << 20)), 413)
    _err(requests.post(u + "/v1/completions", json={"model": m, "prompt": "hi"}), 401)
    _err(requests.post(u + "/v1/completions", json={"model": m, "prompt": "hi"},
                       headers={"Authorization": "Bearer nope"}), 401)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=u + "/v1", api_key="wrong", max_retries=0).models.list()
    _err(requests.get(u + "/v1/nothing-here", headers=AUTH), 404)
    _err(requests.get(u + "/v1/completions", headers=AUTH), 405)
    _err(requests.put(u + "/v1/chat/completions", headers=AUTH, json={}), 405)
    # Unknown extra fields (as SDKs send) are accepted.
    r = post("/v1/chat/completions", {"model": m, "messages": chat_msgs("hi"), "max_tokens": 2,
                                      "user": "x", "metadata": {"a": 1}, "store": False, "some_future_field": [1]})
    assert r.status_code == 200, r.text
    # Raw garbage on the socket.
    host, port = u.split("//")[1].split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"\x00\x01GARBAGE\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400")
    # Nothing of the above hurt the engine.
    assert requests.get(u + "/health").status_code == 200
    assert greedy_completion(srv, "Still alive?", 4)


# --- the HTTP edge (issue 23): the reproductions over raw sockets against the real binary -------

def _raw(srv, data, half_close=False, timeout=30):
    """Sends bytes, reads until the server closes; returns everything it answered."""
    host, port = srv.url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_http_edge_reproductions(srv):
    auth = f"Authorization: Bearer {API_KEY}\r\n".encode()
    smuggled = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    # A Transfer-Encoding that is not a single final chunked: one 400, the body never read as a request.
    for te in (b"gzip", b"identity", b"chunked, chunked"):
        out = _raw(srv, b"POST /tokenize HTTP/1.1\r\nHost: x\r\n" + auth + b"Transfer-Encoding: " + te +
                   b"\r\n\r\n" + smuggled)
        assert out.startswith(b"HTTP/1.1 400") and out.count(b"HTTP/1.1 ") == 1, (te, out)
    out = _raw(srv, b"POST /tokenize HTTP/1.1\r\nHost: x\r\n" + auth + b"Transfer-Encoding: identity\r\n"
               b"Content-Length: 15\r\n\r\n{\"prompt\":\"hi\"}")
    assert out.startswith(b"HTTP/1.1 400"), out
    assert _raw(srv, b"GET /health HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400"), "no Host"
    # The key on the headers: a 401 without the declared 4 MB body, at once.
    t0 = time.time()
    out = _raw(srv, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4194304\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 401") and time.time() - t0 < 10, out
    assert _raw(srv, b"GET /nothing-here HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 401"), "401 before 404"
    ok = _raw(srv, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: bearer " + API_KEY.encode() +
              b"\r\nConnection: close\r\nContent-Length: 15\r\n\r\n{\"prompt\":\"hi\"}")
    assert ok.startswith(b"HTTP/1.1 200"), "the scheme is case-insensitive"
    # A client that half-closes after a complete POST gets its answer (after an interim 100).
    body = json.dumps({"model": srv.model, "prompt": "Hello", "max_tokens": 4, "temperature": 0}).encode()
    out = _raw(srv, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: " +
               str(len(body)).encode() + b"\r\n\r\n" + body, half_close=True)
    final = out[out.rfind(b"HTTP/1.1 "):]
    assert final.startswith(b"HTTP/1.1 200") and b"\"choices\"" in final, out


# --- a tiny KV cache: preemption, and every request still completes with the right text -------

def test_tiny_kv_budget_preempts_and_completes(srv, tmp_path):
    # Each request needs 7 blocks of 16 by its end (~14 prompt tokens + 96), the pool holds 16: any
    # three that overlap run out. The clients are made first and the requests leave together from
    # a barrier, so a slow machine staggering their starts cannot let them run one after another.
    # Both with rows that do not depend on what shares their step: on the GPU with --batch-invariant
    # (without it a preempted sequence's recompute runs the cuBLAS path, its decode the fused one), else
    # on the CPU backend, which always is.
    dev = ["--batch-invariant"] if srv.on_gpu() else ["--device", "cpu"]
    prompts = [f"Story {i}: the little robot walked into the forest and" for i in range(6)]
    ref = Server(tmp_path, "ref", *_model_args(srv), "--api-key", API_KEY, *dev)
    try:
        expect = [greedy_completion(ref, p, 96) for p in prompts]
    finally:
        assert ref.stop() == 0
    tiny = Server(tmp_path, "tiny", *_model_args(srv), "--api-key", API_KEY, "--num-kv-blocks", "16",
                  "--max-num-seqs", "8", "--max-num-batched-tokens", "256", *dev)
    try:
        assert concurrent_greedy(tiny, prompts, 96) == expect
        assert tiny.metric("selfserve_preemptions_total") > 0
        assert tiny.wait_metric("selfserve_kv_cache_blocks_used", 0) == 0
    finally:
        assert tiny.stop() == 0


def test_kv_tiers_host_ttl_disk_restart_and_rejected_files(srv, tmp_path):
    """Issue 18: a prompt's blocks idle past the TTL leave the pool for the host tier and come back
    from it; after a restart they come back from disk; a damaged file is deleted and counted. The
    greedy text is the tier-less server's every time."""
    prompt = "The history of the lighthouse keepers of the northern coast, told slowly: " + " ".join(
        f"In year {i} the lamp was tended by a new keeper who wrote in the log." for i in range(12))
    expect = greedy_completion(srv, prompt, 24)
    kv_dir = tmp_path / "kv"
    args = [*_model_args(srv), "--api-key", API_KEY, "--kv-host-bytes", str(256 << 20), "--kv-cache-ttl-ms", "300",
            "--kv-disk-dir", str(kv_dir), "--kv-disk-bytes", str(256 << 20)]
    s = Server(tmp_path, "tiers", *args)
    try:
        assert greedy_completion(s, prompt, 24) == expect
        deadline = time.time() + 10
        while s.metric("selfserve_kv_demoted_idle_blocks_total") == 0 and time.time() < deadline:
            time.sleep(0.2)
        assert s.metric("selfserve_kv_demoted_idle_blocks_total") > 0
        assert s.metric("selfserve_kv_cache_blocks_cached") == 0
        assert s.metric("selfserve_kv_host_blocks") > 0
        # The tier is an arena of whole blocks taken at start-up: --kv-host-bytes rounded down to them.
        per_block = s.metric("selfserve_kv_host_used_bytes") / s.metric("selfserve_kv_host_blocks")
        assert (256 << 20) - per_block < s.metric("selfserve_kv_host_capacity_bytes") <= 256 << 20
        assert greedy_completion(s, prompt, 24) == expect
        restored = s.metric("selfserve_kv_restored_host_blocks_total")
        assert restored > 0
        assert s.metric("selfserve_prefix_cache_hits_total") == 16 * restored
    finally:
        assert s.stop() == 0, s.log_text()
    files = sorted(kv_dir.glob("*.kvb"))
    assert files
    s = Server(tmp_path, "tiers2", *args)
    try:
        assert s.metric("selfserve_kv_disk_blocks") == len(files)
        assert greedy_completion(s, prompt, 24) == expect
        assert s.metric("selfserve_kv_restored_disk_blocks_total") > 0
        assert s.metric("selfserve_kv_disk_rejected_files_total") == 0
    finally:
        assert s.stop() == 0, s.log_text()
    data = bytearray(files[0].read_bytes())
    data[len(data) // 2] ^= 0x10
    files[0].write_bytes(bytes(data))
    s = Server(tmp_path, "tiers3", *args)
    try:
        assert s.metric("selfserve_kv_disk_rejected_files_total") == 1
        assert not files[0].exists()
        assert greedy_completion(s, prompt, 24) == expect
    finally:
        assert s.stop() == 0, s.log_text()


def test_kv_disk_tier_on_a_full_filesystem_stops_writing_and_keeps_serving(srv, tmp_path):
    """A 2 MiB tmpfs holds five blocks: the disk tier fills it, its writes stop (counted), and every
    request still gets the tier-less server's text. Needs mount (root); skipped otherwise."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        prompts = [f"Chapter {i}: the orchard keeper counted the trees, one by one, " + "and then again " * 40
                   for i in range(3)]
        expect = [greedy_completion(srv, p, 16) for p in prompts]
        s = Server(tmp_path, "full", *_model_args(srv), "--api-key", API_KEY, "--kv-cache-ttl-ms", "200",
                   "--kv-disk-dir", str(mnt), "--kv-disk-bytes", str(1 << 30))
        try:
            for p, e in zip(prompts, expect):
                assert greedy_completion(s, p, 16) == e
                time.sleep(1.5)  # past the TTL and the idle tick: the blocks go to disk
            deadline = time.time() + 10
            while s.metric("selfserve_kv_disk_writes_stopped") == 0 and time.time() < deadline:
                time.sleep(0.2)
            assert s.metric("selfserve_kv_disk_writes_stopped") == 1, s.log_text()
            assert s.metric("selfserve_kv_disk_write_errors_total") >= 1
            assert s.metric("selfserve_kv_disk_writes_total") >= 1
            for p, e in zip(prompts, expect):
                assert greedy_completion(s, p, 16) == e
            assert requests.get(s.url + "/health", timeout=5).status_code == 200
        finally:
            assert s.stop() == 0, s.log_text()
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def _model_args(srv):
    args = srv.proc.args
    i = args.index("--model")
    return ["--model", args[i + 1]]


# --- overload: 429 with Retry-After, then recovery; SIGTERM drains in-flight streams ---------

def test_overload_then_recovery_then_graceful_shutdown(srv, tmp_path):
    s = Server(tmp_path, "busy", *_model_args(srv), "--max-num-seqs", "1", "--max-num-batched-tokens", "128",
               "--max-waiting", "1", "--shutdown-timeout", "20")
    try:
        body = {"model": s.model, "prompt": "Count slowly:", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        # One seat and one waiting place: of 8 requests that leave together (a barrier, so a slow machine
        # cannot stagger them) and run 64 tokens each, the third must be refused.
        start = threading.Barrier(8)

        def one(_):
            start.wait()
            return requests.post(s.url + "/v1/completions", json={**body, "max_tokens": 64}, timeout=120)

        with cf.ThreadPoolExecutor(8) as ex:
            rs = list(ex.map(one, range(8)))
        codes = sorted(r.status_code for r in rs)
        assert 429 in codes and 200 in codes, codes
        for r in rs:
            if r.status_code == 429:
                assert r.headers["Retry-After"] == "1"
                assert r.json()["error"]["type"] == "rate_limit_error"
        assert s.metric('selfserve_requests_rejected_total{reason="overload"}') >= 1
        assert requests.post(s.url + "/v1/completions", json=body, timeout=120).status_code == 200  # recovered

        # SIGTERM while a stream is in flight: it finishes, new requests get 503, exit code 0.
        stream_body = {**body, "max_tokens": 300, "stream": True}
        with requests.post(s.url + "/v1/completions", json=stream_body, stream=True, timeout=120) as r:
            lines = r.iter_lines()
            for line in lines:
                if line.startswith(b"data: "):
                    break
            s.proc.send_signal(signal.SIGTERM)
            deadline = time.time() + 5  # the signal is handled by the server's own thread, soon
            while requests.get(s.url + "/health", timeout=5).status_code != 503 and time.time() < deadline:
                time.sleep(0.05)
            assert requests.get(s.url + "/health", timeout=5).status_code == 503
            assert requests.post(s.url + "/v1/completions", json=body, timeout=5).status_code == 503
            rest = [l for l in lines if l.startswith(b"data: ")]
        assert rest[-1] == b"data: [DONE]"
        assert json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "length"
        assert s.proc.wait(timeout=30) == 0
    finally:
        s.stop()


def test_bench_serve_sends_the_same_text_with_a_given_tokens_per_word(srv, selfserve, tmp_path):
    """`bench serve --tokens-per-word X` (X from an earlier run's JSON) sends the text that earlier run
    sent, so two servers can be measured on the same prompts: the server's own prompt token counts
    agree request by request; another X makes other prompts; a bad X is refused."""
    def bench(name, *extra):
        out = tmp_path / f"{name}.json"
        selfserve("bench", "serve", "--url", srv.url, "--api-key", API_KEY, "--concurrency", "1",
                  "--num-requests", "4", "--warmup", "0", "--seed", "5", "--mix", "1,0,0",
                  "--output-tokens", "2,3", "--max-context", "256", "--json", str(out), *extra, timeout=300)
        doc = json.loads(out.read_text())
        return doc["mix"], [q["prompt_tokens"] for q in doc["levels"][0]["requests"]]

    mix, measured = bench("calibrated")
    assert mix["tokens_per_word_source"] == "measured by /tokenize"
    given_mix, given = bench("given", "--tokens-per-word", repr(mix["tokens_per_word"]))
    assert given_mix["tokens_per_word_source"] == "given"
    assert len(measured) == 4 and all(n > 0 for n in measured)
    assert given == measured
    _, halved = bench("halved", "--tokens-per-word", repr(2 * mix["tokens_per_word"]))
    assert sum(halved) < sum(measured)  # twice the tokens a word: about half the words
    r = selfserve("bench", "serve", "--url", srv.url, "--tokens-per-word", "0", check=False)
    assert r.returncode != 0 and b"--tokens-per-word" in r.stderr
