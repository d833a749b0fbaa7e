#!/usr/bin/env python3
"""Resident memory of `selfserve serve` while many clients each hold an unfinished request body.

Starts the server, waits for /health, warms it with a few requests, takes the baseline RSS, then
opens --connections sockets that each send the headers of a --body-mib POST and as much of its body
(all but the last byte) as the server will take within --send-seconds, holds them --hold seconds
and closes them. RSS is sampled every 20 ms from /proc/PID/status; the kernel's own peak (VmHWM,
reset after the baseline through /proc/PID/clear_refs) is read too. Prints one JSON line.

--mode key:   the server runs with --api-key and the clients send none: every body must go unread
              (401 on the headers), so RSS must stay within --max-growth of the baseline (exit 1 if
              not).
--mode nokey: no key; the server reads bodies up to its --max-buffered-body-mib cap and answers 503
              past it, so RSS may grow by about the cap and no more (reported, not judged).

  tools/http_memory_check.py --bin build/selfserve --mode key
"""
import argparse
import json
import os
import resource
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def http(port, method, path, body=None, key=None, timeout=60):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/selfserve")
    ap.add_argument("--mode", choices=["key", "nokey"], default="key")
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--body-mib", type=float, default=4)
    ap.add_argument("--send-seconds", type=float, default=20)
    ap.add_argument("--hold", type=float, default=5)
    ap.add_argument("--max-growth", type=float, default=0.05)
    ap.add_argument("server_args", nargs="*", help="more `serve` flags (after --)")
    a = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    key = "memcheck-key" if a.mode == "key" else None
    port = free_port()
    cmd = [a.bin, "serve", "--port", str(port), "--quiet"] + (["--api-key", key] if key else []) + a.server_args
    log = open(f"/tmp/http_memory_check.{os.getpid()}.log", "w")
    srv = subprocess.Popen(cmd, stdout=log, stderr=log)
    try:
        deadline = time.time() + 600
        while True:
            if srv.poll() is not None:
                sys.exit(f"server exited ({srv.returncode}); see {log.name}")
            try:
                if http(port, "GET", "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                sys.exit("server not ready")
            time.sleep(0.5)
        for _ in range(3):  # warm the request path (allocator arenas, the pool thread)
            http(port, "GET", "/v1/models", key=key)
            http(port, "POST", "/v1/completions", json.dumps({"prompt": "Hello", "max_tokens": 4}).encode(), key=key)
        time.sleep(1)
        base = 0
        for _ in range(10):
            base = max(base, rss_kib(srv.pid))
            time.sleep(0.05)
        with open(f"/proc/{srv.pid}/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS

        peak = [base]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], rss_kib(srv.pid))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()

        body_len = int(a.body_mib * 1048576)
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {body_len}\r\n\r\n").encode()
        chunk = b"x" * 65536
        socks, sent, replies = [], [], []
        t0 = time.time()
        for _ in range(a.connections):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(head)
            s.setblocking(False)
            socks.append(s)
            sent.append(0)
            replies.append(b"")
        # Push bodies round-robin (all but the last byte) while the server takes them.
        by_fd = {s.fileno(): i for i, s in enumerate(socks)}
        poller = select.poll()
        for s in socks:
            poller.register(s, select.POLLOUT)
        live = len(socks)
        end = time.time() + a.send_seconds
        while live and time.time() < end:
            for fd, ev in poller.poll(200):
                i = by_fd[fd]
                want = body_len - 1 - sent[i]
                done = False
                if ev & select.POLLOUT and want > 0:
                    try:
                        sent[i] += socks[i].send(chunk[:min(want, len(chunk))])
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        done = True
                else:
                    done = True  # error, hang-up, or all sent
                if done or sent[i] >= body_len - 1:
                    poller.unregister(fd)
                    live -= 1
        time.sleep(a.hold)
        for i, s in enumerate(socks):
            try:
                replies[i] = s.recv(4096)
            except OSError:
                pass
        statuses = {}
        for r in replies:
            st = r[9:12].decode() if r.startswith(b"HTTP/1.1 ") else "none"
            statuses[st] = statuses.get(st, 0) + 1
        for s in socks:
            s.close()
        stop.set()
        sampler.join()
        hwm = rss_kib(srv.pid, "VmHWM")
        worst = max(peak[0], hwm)
        out = {
            "mode": a.mode, "connections": a.connections, "body_mib": a.body_mib,
            "baseline_rss_mib": round(base / 1024, 1), "peak_rss_mib": round(worst / 1024, 1),
            "growth": round(worst / base - 1, 4), "statuses": statuses,
            "body_bytes_sent_mib": round(sum(sent) / 1048576, 1), "seconds": round(time.time() - t0, 1),
        }
        print(json.dumps(out))
        if a.mode == "key" and worst > base * (1 + a.max_growth):
            sys.exit(1)
    finally:
        srv.terminate()
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()


if __name__ == "__main__":
    main()
