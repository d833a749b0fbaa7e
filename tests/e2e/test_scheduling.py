"""--scheduling persistent on the real server and the default model (the CPU backend here; on a GPU
machine the CUDA backend and its device loop): the resident loop runs what it can and a host
executor beside it the rest; greedy text equals --scheduling host for concurrent requests, a request
with a repetition penalty (routed to the host executor) included, and a streamed request can be
cancelled mid-stream with the server still serving."""
import concurrent.futures as cf
import re
import time

import requests

from test_server import API_KEY, Server, greedy_completion

PROMPTS = [f"Note {i}: the clockmaker of street {i * 3 % 11} wound every clock in the shop and then"
           for i in range(6)]


def _run(srv):
    with cf.ThreadPoolExecutor(len(PROMPTS)) as ex:
        texts = list(ex.map(lambda p: greedy_completion(srv, p, 20), PROMPTS))
    texts.append(greedy_completion(srv, PROMPTS[0], 20, repetition_penalty=1.3))
    return texts


def test_persistent_scheduling_gives_the_host_schedulings_greedy_text(default_model, tmp_path):
    host = Server(tmp_path, "host", "--model", default_model, "--api-key", API_KEY, "--scheduling", "host")
    try:
        expect = _run(host)
    finally:
        assert host.stop() == 0, host.log_text()
    assert expect[-1] != expect[0]  # the penalty changes the text: the routed request is really penalised
    s = Server(tmp_path, "persistent", "--model", default_model, "--api-key", API_KEY, "--scheduling", "persistent")
    try:
        # The resident loop on the host (CPU backend) or on the GPU (the device loop, CUDA backend).
        assert re.search(r"scheduling: persistent \(resident \((host|device) loop", s.log_text()), s.log_text()
        assert _run(s) == expect
        # A stream closed after a few chunks: the request ends, the server goes on serving.
        with requests.post(s.url + "/v1/completions", stream=True, timeout=60,
                           headers={"Authorization": f"Bearer {API_KEY}"},
                           json={"model": s.model, "prompt": PROMPTS[1], "max_tokens": 400, "stream": True,
                                 "temperature": 0, "ignore_eos": True}) as r:
            assert r.status_code == 200
            for i, _ in enumerate(r.iter_lines()):
                if i >= 6:
                    break
        assert greedy_completion(s, PROMPTS[2], 20) == expect[2]
        assert s.wait_metric("selfserve_kv_cache_blocks_used", 0) == 0  # the cancelled one's blocks came back
    finally:
        assert s.stop() == 0, s.log_text()


def test_health_stays_ok_while_the_resident_loop_works(default_model, tmp_path):
    """The watchdog reads progress from the loop's steps: a request that only the resident loop runs
    keeps /health at 200 for 6 s against --watchdog 2 (no host-executor step happens meanwhile;
    before the loop's steps were counted, /health turned 503 after 2 s). The request is a long
    stream closed after the 6 s, so the time does not depend on the machine's speed."""
    s = Server(tmp_path, "watchdog", "--model", default_model, "--api-key", API_KEY, "--scheduling", "persistent",
               "--watchdog", "2")
    try:
        steps0 = s.metrics()["selfserve_engine_steps_total"]
        with requests.post(s.url + "/v1/completions", stream=True, timeout=60,
                           headers={"Authorization": f"Bearer {API_KEY}"},
                           json={"model": s.model, "prompt": PROMPTS[3], "max_tokens": 4000, "stream": True,
                                 "temperature": 0, "ignore_eos": True}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            next(lines)  # the first chunk: the loop is running the request
            seen = []
            t0 = time.monotonic()
            while time.monotonic() - t0 < 6:
                seen.append(requests.get(s.url + "/health", timeout=10).status_code)
                time.sleep(0.2)
            assert requests.get(s.url + "/health", timeout=10).status_code == 200
        assert set(seen) == {200}, "".join("." if x == 200 else "X" for x in seen)
        assert s.metrics()["selfserve_engine_steps_total"] > steps0
    finally:
        assert s.stop() == 0, s.log_text()


def test_resident_loop_reuses_a_cached_prefix(default_model, tmp_path):
    """The resident loop's prefix cache on the real model: a prompt sent again (and one extending it)
    starts from the first one's cached blocks, with the host scheduling's greedy text."""
    long_prompt = " ".join(PROMPTS)  # ~130 tokens: several full 16-token blocks
    prompts = [long_prompt, long_prompt, long_prompt + " And the last clock"]
    host = Server(tmp_path, "host-prefix", "--model", default_model, "--api-key", API_KEY, "--no-prefix-caching")
    try:
        expect = [greedy_completion(host, p, 12) for p in prompts]
    finally:
        assert host.stop() == 0, host.log_text()
    s = Server(tmp_path, "persistent-prefix", "--model", default_model, "--api-key", API_KEY,
               "--scheduling", "persistent")
    try:
        got = [greedy_completion(s, p, 12) for p in prompts]
        assert got == expect
        assert s.wait_metric("selfserve_kv_cache_blocks_used", 0) == 0
        m = s.metrics()
        assert m["selfserve_prefix_cache_hits_total"] >= 2 * 112, m["selfserve_prefix_cache_hits_total"]
        assert m["selfserve_kv_cache_blocks_cached"] > 0
    finally:
        assert s.stop() == 0, s.log_text()
