"""Traces, logs and timelines of `selfserve serve`, checked from outside: an OTLP/HTTP collector
written here decodes what the server exports with the official `opentelemetry-proto` package, the
JSON logs are parsed line by line, and the timeline in `usage` is compared with the wall clock.

Servers: one traced by a healthy collector (JSON logs), one whose collector is dead (nothing
listens) and one whose collector hangs (accepts, never answers), side by side for latency; and one
sampling at ratio 0, stopped right after a request to see its spans flushed on shutdown."""
import http.server
import json
import os
import re
import secrets
import signal
import socket
import statistics
import threading
import time

import pytest
import requests

trace_pb = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
from opentelemetry.proto.trace.v1 import trace_pb2  # noqa: E402

from test_server import API_KEY, AUTH, Server  # noqa: E402


class Collector:
    """An OTLP/HTTP trace receiver on 127.0.0.1. mode "ok": decodes and answers 200; "hang": reads
    the request and never answers (until closed)."""

    def __init__(self, mode="ok"):
        self.mode = mode
        self.spans = []  # (resource attributes, span)
        self.posts = []  # (path, content type)
        self.lock = threading.Lock()
        self.release = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with outer.lock:
                    outer.posts.append((self.path, self.headers.get("Content-Type")))
                if outer.mode == "hang":
                    outer.release.wait(120)
                    return
                req = trace_pb.ExportTraceServiceRequest()
                req.ParseFromString(body)
                with outer.lock:
                    for rs in req.resource_spans:
                        res = attrs(rs.resource.attributes)
                        for ss in rs.scope_spans:
                            for sp in ss.spans:
                                outer.spans.append((res, sp))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/traces"

    def trace(self, trace_id_hex, want=4, timeout=15):
        """The spans of one trace, once at least `want` arrived."""
        deadline = time.time() + timeout
        while True:
            with self.lock:
                got = [sp for _, sp in self.spans if sp.trace_id.hex() == trace_id_hex]
            if len(got) >= want or time.time() > deadline:
                return got
            time.sleep(0.05)

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def any_value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attrs(kvs):
    return {kv.key: any_value(kv.value) for kv in kvs}


def dead_url():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens here now
    return f"http://127.0.0.1:{port}/v1/traces"


def model_args(default_model):
    return ["--model", default_model, "--api-key", API_KEY, "--max-num-seqs", "16", "--kv-cache-mib", "64"]


@pytest.fixture(scope="module")
def collector():
    c = Collector("ok")
    yield c
    c.close()


@pytest.fixture(scope="module")
def traced(tmp_path_factory, default_model, collector):
    s = Server(tmp_path_factory.mktemp("traced"), "traced", *model_args(default_model), "--log-format", "json",
               "--otlp-traces-endpoint", collector.url)
    yield s
    assert s.stop() == 0, s.log_text()


def post(srv, path, body, headers=None, stream=False):
    return requests.post(srv.url + path, json=body, headers={**AUTH, **(headers or {})}, timeout=120, stream=stream)


SECRET = "zebra-umbrella-7421 tell me a story"


# --- traces ------------------------------------------------------------------------------------

def test_trace_continues_the_callers_traceparent(traced, collector):
    tid, parent = secrets.token_hex(16), secrets.token_hex(8)
    t0 = time.time_ns()
    r = post(traced, "/v1/chat/completions",
             {"model": traced.model, "messages": [{"role": "user", "content": SECRET}], "max_tokens": 8,
              "temperature": 0.5, "top_p": 0.9, "seed": 3, "ignore_eos": True},
             {"traceparent": f"00-{tid}-{parent}-01", "tracestate": "vendor=abc"})
    assert r.status_code == 200, r.text
    body = r.json()
    m = re.fullmatch(r"00-([0-9a-f]{32})-([0-9a-f]{16})-01", r.headers["traceresponse"])
    assert m and m.group(1) == tid and m.group(2) != parent

    spans = collector.trace(tid)
    # The server ends the span after the last byte is written (so possibly after the client has its
    # answer), and always before exporting it: the bound is when the collector holds it.
    t1 = time.time_ns()
    roots = [s for s in spans if s.name == "llm_request"]
    assert len(roots) == 1, [s.name for s in spans]
    root = roots[0]
    assert root.span_id.hex() == m.group(2)
    assert root.parent_span_id.hex() == parent  # the caller's span
    assert root.trace_state == "vendor=abc"
    assert root.kind == trace_pb2.Span.SPAN_KIND_SERVER
    # The server stamps spans with its start-up wall time plus a monotonic offset: 50 ms of slack for
    # the two clocks (a freshly booted machine may still step its wall clock).
    slack = 50_000_000
    assert t0 - slack <= root.start_time_unix_nano <= root.end_time_unix_nano <= t1 + slack
    a = attrs(root.attributes)
    assert a["gen_ai.request.model"] == traced.model
    assert a["gen_ai.response.model"] == traced.model
    assert a["gen_ai.request.id"] == body["id"]
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.max_tokens"] == 8
    assert a["gen_ai.request.temperature"] == pytest.approx(0.5)
    assert a["gen_ai.request.top_p"] == pytest.approx(0.9)
    assert a["gen_ai.request.seed"] == 3
    assert a["gen_ai.usage.prompt_tokens"] == body["usage"]["prompt_tokens"]
    assert a["gen_ai.usage.completion_tokens"] == body["usage"]["completion_tokens"] == 8
    assert a["gen_ai.response.finish_reasons"] == [body["choices"][0]["finish_reason"]] == ["length"]
    e2e = (root.end_time_unix_nano - root.start_time_unix_nano) / 1e9
    assert 0 <= a["gen_ai.latency.time_in_queue"] <= a["gen_ai.latency.time_to_first_token"] <= a["gen_ai.latency.e2e"]
    assert a["gen_ai.latency.e2e"] == pytest.approx(e2e, abs=1e-6)

    children = {s.name: s for s in spans if s.parent_span_id == root.span_id}
    assert set(children) == {"queue", "prefill", "decode"}
    for s in children.values():
        assert s.trace_id == root.trace_id
        assert root.start_time_unix_nano <= s.start_time_unix_nano <= s.end_time_unix_nano <= root.end_time_unix_nano
        for e in s.events:
            assert s.start_time_unix_nano <= e.time_unix_nano <= s.end_time_unix_nano, e.name
    q, p, d = children["queue"], children["prefill"], children["decode"]
    assert q.end_time_unix_nano == p.start_time_unix_nano and p.end_time_unix_nano == d.start_time_unix_nano
    chunks = [e for e in p.events if e.name == "prefill_chunk"]
    assert chunks and [e.name for e in p.events][-1] == "first_token"
    pa = attrs(p.attributes)
    # The chunks computed the prompt once, past what the prefix cache held.
    assert sum(attrs(e.attributes)["tokens"] for e in chunks) == a["gen_ai.usage.prompt_tokens"] - pa["gen_ai.usage.cached_tokens"]
    assert attrs(d.attributes)["gen_ai.usage.completion_tokens"] == 8
    res = [r for r, sp in collector.spans if sp.span_id == root.span_id][0]
    assert res["service.name"] == "selfserve"
    assert all(path == "/v1/traces" and ctype == "application/x-protobuf" for path, ctype in collector.posts)


def test_new_trace_and_the_timeline_in_the_streamed_usage(traced, collector):
    t0 = time.time()
    r = post(traced, "/v1/completions",
             {"model": traced.model, "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "ignore_eos": True,
              "stream": True, "stream_options": {"include_usage": True, "include_timeline": True}}, stream=True)
    assert r.status_code == 200
    tid = re.fullmatch(r"00-([0-9a-f]{32})-[0-9a-f]{16}-01", r.headers["traceresponse"]).group(1)
    events = [json.loads(line[6:]) for line in r.iter_lines(decode_unicode=True)
              if line.startswith("data: ") and line != "data: [DONE]"]
    t1 = time.time()
    usage = events[-1]["usage"]
    assert usage["completion_tokens"] == 6
    [tl] = usage["timeline"]
    assert tl["index"] == 0
    assert t0 - 0.01 <= tl["arrival_time"] <= t1
    stages = [tl[k] for k in ("queued", "scheduled", "first_token", "last_token", "finished")]
    assert all(v is not None for v in stages), tl
    assert 0 <= stages[0] <= stages[1] <= stages[2] <= stages[3] <= stages[4] <= t1 - tl["arrival_time"] + 0.01
    assert tl["preemptions"] == [] and tl["prefill_chunks"] >= 1

    spans = collector.trace(tid)
    root = [s for s in spans if s.name == "llm_request"][0]
    assert root.parent_span_id == b""  # a new trace
    assert attrs(root.attributes)["selfserve.stream"] is True
    # The timeline and the spans tell the same story (the same clock, microseconds apart at most).
    prefill = [s for s in spans if s.name == "prefill"][0]
    first = [e for e in prefill.events if e.name == "first_token"][0]
    assert first.time_unix_nano / 1e9 == pytest.approx(tl["arrival_time"] + tl["first_token"], abs=2e-3)


def test_timeline_in_a_whole_response_and_not_unless_asked(traced, collector):
    body = {"model": traced.model, "prompt": "Hello", "max_tokens": 3, "n": 2, "temperature": 1, "seed": 5}
    tid = secrets.token_hex(16)
    r = post(traced, "/v1/completions", {**body, "include_timeline": True},
             {"traceparent": f"00-{tid}-{secrets.token_hex(8)}-01"}).json()
    assert [t["index"] for t in r["usage"]["timeline"]] == [0, 1]
    for t in r["usage"]["timeline"]:
        assert t["scheduled"] <= t["first_token"] <= t["finished"]
    # Two choices: one queue/prefill/decode triple each, under one server span that sums them.
    spans = collector.trace(tid, want=7)
    [root] = [s for s in spans if s.name == "llm_request"]
    a = attrs(root.attributes)
    assert a["gen_ai.usage.prompt_tokens"] == r["usage"]["prompt_tokens"]
    assert a["gen_ai.usage.completion_tokens"] == r["usage"]["completion_tokens"] == 6
    assert a["gen_ai.usage.num_sequences"] == 2 and a["gen_ai.request.n"] == 2
    assert a["gen_ai.response.finish_reasons"] == [c["finish_reason"] for c in r["choices"]]
    kids = sorted((attrs(s.attributes)["gen_ai.choice.index"], s.name) for s in spans if s.parent_span_id == root.span_id)
    assert kids == [(0, "decode"), (0, "prefill"), (0, "queue"), (1, "decode"), (1, "prefill"), (1, "queue")]
    assert "timeline" not in post(traced, "/v1/completions", body).json()["usage"]
    bad = post(traced, "/v1/completions", {**body, "include_timeline": "yes"})
    assert bad.status_code == 400 and "include_timeline" in bad.json()["error"]["message"]


def test_stage_histograms_under_vllm_names(traced):
    post(traced, "/v1/completions", {"model": traced.model, "prompt": "Hi", "max_tokens": 4, "ignore_eos": True})
    m = traced.metrics()
    label = f'model_name="{traced.model}"'
    for name in ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                 "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds",
                 "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds"):
        assert m[f"{name}_count{{{label}}}"] >= 1, name
    # Every finished request went through each stage once; the stages nest inside end-to-end.
    n = m[f"vllm:e2e_request_latency_seconds_count{{{label}}}"]
    assert m[f"vllm:request_queue_time_seconds_count{{{label}}}"] == n
    assert (m[f"vllm:request_prefill_time_seconds_sum{{{label}}}"] + m[f"vllm:request_decode_time_seconds_sum{{{label}}}"]
            <= m[f"vllm:e2e_request_latency_seconds_sum{{{label}}}"])
    assert m["selfserve_otlp_spans_exported_total"] > 0
    assert m["selfserve_otlp_spans_dropped_total"] == 0


def test_a_refused_request_is_an_error_span(traced, collector):
    tid = secrets.token_hex(16)
    r = post(traced, "/v1/completions", {"model": traced.model, "prompt": "x", "max_tokens": -1},
             {"traceparent": f"00-{tid}-{secrets.token_hex(8)}-01"})
    assert r.status_code == 400
    assert r.headers["traceresponse"].startswith(f"00-{tid}-")
    [root] = collector.trace(tid, want=1)
    assert root.name == "llm_request"
    assert root.status.code == trace_pb2.Status.STATUS_CODE_ERROR
    assert root.status.message == r.json()["error"]["message"]
    assert attrs(root.attributes)["http.response.status_code"] == 400


def test_preemptions_in_the_timeline_and_the_spans(default_model, tmp_path, collector):
    # A KV cache too small for the load (as test_server.py's tiny server): requests are preempted.
    # Each request needs 7 blocks of 16 by its end, the pool holds 16: any three that overlap run out;
    # they leave together from a barrier, so a slow machine cannot run them one after another.
    s = Server(tmp_path, "tiny", "--model", default_model, "--api-key", API_KEY, "--num-kv-blocks", "16",
               "--max-num-seqs", "8", "--max-num-batched-tokens", "256", "--otlp-traces-endpoint", collector.url)
    try:
        start = threading.Barrier(6)

        def one(i):
            tid = secrets.token_hex(16)
            start.wait()
            r = post(s, "/v1/completions",
                     {"model": s.model, "prompt": f"Story {i}: the little robot walked into the forest and",
                      "max_tokens": 96, "temperature": 0, "ignore_eos": True, "include_timeline": True},
                     {"traceparent": f"00-{tid}-{secrets.token_hex(8)}-01"})
            assert r.status_code == 200, r.text
            return tid, r.json()["usage"]["timeline"][0]

        import concurrent.futures as cf
        with cf.ThreadPoolExecutor(6) as ex:
            got = list(ex.map(one, range(6)))
        total = s.metric("selfserve_preemptions_total")
        assert total > 0
        assert sum(len(tl["preemptions"]) for _, tl in got) == total  # each one reported to its request
        for tid, tl in got:
            spans = collector.trace(tid)
            events = [e for sp in spans if sp.name in ("prefill", "decode") for e in sp.events]
            assert sum(e.name == "preempted" for e in events) == len(tl["preemptions"])
            assert sum(e.name == "resumed" for e in events) == len(tl["preemptions"])  # all completed
            for p in tl["preemptions"]:
                assert tl["scheduled"] <= p <= tl["finished"]
    finally:
        assert s.stop() == 0


# --- logs ----------------------------------------------------------------------------------------

def test_json_logs_parse_and_carry_the_trace_id_and_no_prompt(traced):
    tid = secrets.token_hex(16)
    r = post(traced, "/v1/completions", {"model": traced.model, "prompt": SECRET, "max_tokens": 2},
             {"traceparent": f"00-{tid}-{secrets.token_hex(8)}-01"})
    assert r.status_code == 200
    rid = r.json()["id"]
    deadline = time.time() + 5
    while rid not in traced.log_text() and time.time() < deadline:
        time.sleep(0.05)
    lines = [json.loads(line) for line in traced.log_text().splitlines()]  # every line parses
    for j in lines:
        assert {"timestamp", "level", "component", "message"} <= j.keys(), j
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", j["timestamp"])
    [acc] = [j for j in lines if j.get("request_id") == rid]
    assert acc["component"] == "access" and acc["trace_id"] == tid
    assert (acc["method"], acc["path"], acc["status"]) == ("POST", "/v1/completions", 200)
    assert acc["prompt_tokens"] == r.json()["usage"]["prompt_tokens"] and acc["completion_tokens"] == 2
    assert acc["latency_s"] > 0 and acc["client"].startswith("127.0.0.1:")
    assert "zebra-umbrella" not in traced.log_text()  # nor from the chat test's prompt
    # Refused requests are logged too: a bad body (routed), and a missing key (refused on the headers).
    assert post(traced, "/v1/completions", {"model": traced.model, "prompt": 5}).status_code == 400
    assert requests.post(traced.url + "/v1/completions?x=1", json={}, timeout=10).status_code == 401
    time.sleep(0.2)
    lines = [json.loads(line) for line in traced.log_text().splitlines()]
    assert any(j.get("status") == 400 and j.get("path") == "/v1/completions" for j in lines)
    assert any(j.get("status") == 401 and j.get("path") == "/v1/completions" and j["method"] == "POST" for j in lines)


# --- collectors that fail, side by side with the healthy one ----------------------------------------

def _timed_completion(srv):
    t = time.perf_counter()
    r = post(srv, "/v1/completions", {"model": srv.model, "prompt": "The weather today", "max_tokens": 12,
                                      "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200
    return time.perf_counter() - t


def test_dead_and_hanging_collectors_do_not_slow_serving(traced, default_model, tmp_path):
    hang = Collector("hang")
    dead = Server(tmp_path, "dead", *model_args(default_model), "--otlp-traces-endpoint", dead_url(), "--log-prompts")
    hung = Server(tmp_path, "hung", *model_args(default_model), "--otlp-traces-endpoint", hang.url,
                  "--shutdown-timeout", "2")
    try:
        # Interleaved rounds: each server answers the same request in turn, so load and noise fall
        # on all three alike (this machine is shared: medians, and a generous bound).
        times = {"healthy": [], "dead": [], "hung": []}
        order = [("healthy", traced), ("dead", dead), ("hung", hung)]
        for i in range(12):
            for name, s in order[i % 3:] + order[:i % 3]:  # each server first in turn: no seat is favoured
                times[name].append(_timed_completion(s))
        med = {k: statistics.median(v) for k, v in times.items()}
        print("median latency (s):", {k: round(v, 4) for k, v in med.items()})
        assert med["dead"] <= 1.3 * med["healthy"] + 0.02, med
        assert med["hung"] <= 1.3 * med["healthy"] + 0.02, med

        # The spans that could not go are counted as dropped (the hung POST times out after 3 s).
        deadline = time.time() + 15
        while time.time() < deadline and (dead.metric("selfserve_otlp_spans_dropped_total") == 0 or
                                          hung.metric("selfserve_otlp_spans_dropped_total") == 0):
            time.sleep(0.2)
        assert dead.metric("selfserve_otlp_spans_dropped_total") > 0
        assert dead.metric("selfserve_otlp_spans_exported_total") == 0
        assert dead.metric("selfserve_otlp_export_failures_total") > 0
        assert hung.metric("selfserve_otlp_spans_dropped_total") > 0
        assert hang.posts, "the hanging collector saw no POST"

        # --log-prompts (text logs): the prompt is in the access line.
        assert "The weather today" in dead.log_text()
        assert "The weather today" not in hung.log_text()

        # Shutdown with spans queued and the collector hanging: the flush gives up at the drain
        # deadline (2 s), not the POST timeout.
        _timed_completion(hung)
        t = time.time()
        assert hung.stop() == 0, hung.log_text()
        assert time.time() - t < 8, hung.log_text()
    finally:
        for s in (dead, hung):
            if s.proc.poll() is None:
                s.stop()
        hang.close()


def test_sample_ratio_and_the_flush_on_shutdown(default_model, tmp_path, collector):
    s = Server(tmp_path, "sampled", *model_args(default_model), "--otlp-traces-endpoint", collector.url,
               "--otlp-sample-ratio", "0", "--no-access-log")
    try:
        body = {"model": s.model, "prompt": "Hi", "max_tokens": 2}
        unsampled = post(s, "/v1/completions", body)
        new_tid = re.fullmatch(r"00-([0-9a-f]{32})-[0-9a-f]{16}-00", unsampled.headers["traceresponse"]).group(1)
        tid = secrets.token_hex(16)
        sampled = post(s, "/v1/completions", body, {"traceparent": f"00-{tid}-{secrets.token_hex(8)}-01"})
        assert sampled.headers["traceresponse"].endswith("-01")
    finally:
        assert s.stop() == 0  # right away: the spans are still in the exporter's queue
    assert [sp.name for sp in collector.trace(tid, timeout=0.1) if sp.name == "llm_request"] == ["llm_request"]
    assert collector.trace(new_tid, timeout=0.5) == []
    log = s.log_path.read_text()
    assert "POST /v1/completions" not in log  # --no-access-log


def test_a_restore_from_the_kv_tiers_is_an_event_of_the_trace(tmp_path, default_model, collector):
    """A prompt whose blocks went idle past the TTL into the host tier comes back from it: the second
    request's trace carries a kv_restore event whose token count is the restored blocks'."""
    prompt = "The keepers of the northern lights wrote in their logs: " + " ".join(
        f"Night {i}: the lamp burned and the sea was calm." for i in range(10))
    s = Server(tmp_path, "traced-tiers", *model_args(default_model), "--otlp-traces-endpoint", collector.url,
               "--kv-host-bytes", str(64 << 20), "--kv-cache-ttl-ms", "200")
    try:
        body = {"model": s.model, "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
        assert post(s, "/v1/completions", body).status_code == 200
        deadline = time.time() + 10
        while s.metric("selfserve_kv_demoted_idle_blocks_total") == 0 and time.time() < deadline:
            time.sleep(0.1)
        assert s.metric("selfserve_kv_demoted_idle_blocks_total") > 0
        r = post(s, "/v1/completions", body)
        assert r.status_code == 200
        tid = re.fullmatch(r"00-([0-9a-f]{32})-[0-9a-f]{16}-01", r.headers["traceresponse"]).group(1)
        restored = s.metric("selfserve_kv_restored_host_blocks_total")
        assert restored > 0
        spans = collector.trace(tid)
        events = [e for sp in spans for e in sp.events if e.name == "kv_restore"]
        assert len(events) == 1, [(sp.name, [e.name for e in sp.events]) for sp in spans]
        a = attrs(events[0].attributes)
        assert a["tokens"] == 16 * restored and a["position"] == 0 and a["tokens_from_disk"] == 0
        assert a["seconds"] >= 0
    finally:
        assert s.stop() == 0, s.log_text()
