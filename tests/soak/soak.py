#!/usr/bin/python3
"""soak.py - soak and fault tests of `kiln serve` on loopback.

Each scenario starts the real server on the bundled digits classifier
(models/digits/1/model.onnx, copied into a temporary model folder), puts it
under load, does something to it, and checks what its clients saw:

  load       wrk POSTs :predict; no non-2xx answer and no socket error, and
             resident memory (VmRSS in /proc/PID/status) grows less than 5%
             from the end of the warm-up to the end of the run
  hotswap    a new version is copied into the model folder every N seconds
             (old ones removed) while client threads predict: no failed
             request, and the newest version ends up AVAILABLE
  overload   wrk with 16 times the connections a small batching queue
             admits: answers only 200 or 503, p99 under 1 s, none over 10 s, and
             throughput back to the baseline's (at least half) afterwards
  sigterm    SIGTERM while clients open a connection per request: every
             connection gets a whole answer (200, or 503 once draining began)
             or is refused once the server stops listening, and the server
             exits 0 within its drain time (connections reset in the moment the
             drain starts are counted, and fail the run with --strict); then
             kill -9 under load and a restart on the same folder and port: the
             same versions AVAILABLE again within seconds
  badversion an unreadable (chmod 000; as root, where permissions do not
             deny, a corrupt model file instead) version folder, a served
             version folder that vanishes, and the whole base path vanishing
             for a while: no failed request, the server keeps serving
  slowloris  many connections send request headers one byte at a time, and a
             few slow readers leave large answers unread, while a normal
             client predicts: every normal request answers 200 within a
             bound, and each slow reader gets its whole answer in the end

Answers are checked independently of Kiln: a 200 must carry 10 softmax
probabilities that sum to 1. The short variants (the default; what ctest
runs) take seconds; `--long` runs the durations of docs/RELIABILITY.md.
Each scenario prints one JSON line of figures (also appended to --out).
Exit status: 0 pass, 1 fail, 77 skipped (a tool such as wrk missing).

usage: soak.py KILN_BIN SCENARIO [--long] [--seconds N] [--out FILE.jsonl]
"""

import argparse
import errno
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "models" / "digits" / "1" / "model.onnx"
NAME = "digits"
PIXELS = [float((i * 7) % 17) for i in range(64)]
BODY = json.dumps({"instances": [PIXELS]}).encode()
PATH = f"/v1/models/{NAME}:predict"
SKIP = 77
SANITIZED = os.environ.get("KILN_SANITIZED") == "1"
STRICT = "--strict" in sys.argv
CONNS = 0  # slowloris: --connections


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def good_answer(status, body):
    """A 200 with one row of 10 probabilities summing to 1 (softmax)."""
    if status != 200:
        return False
    try:
        p = json.loads(body)["predictions"]
        return len(p) == 1 and len(p[0]) == 10 and abs(sum(p[0]) - 1.0) < 1e-3
    except (ValueError, KeyError, TypeError):
        return False


def add_version(base, v):
    """Copy the model in as version v the way a deploy does: into a hidden
    folder, then one rename (TF Serving's advice; half-copied versions are
    tests/python/test_serve_hotswap.py's subject)."""
    tmp = base / f".v{v}.tmp"
    tmp.mkdir()
    shutil.copy(MODEL, tmp / "model.onnx")
    os.rename(tmp, base / str(v))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Server:
    """kiln serve on a free loopback port (REST only)."""

    def __init__(self, kiln, base, log, port=None, *extra):
        self.kiln, self.base, self.log = kiln, base, log
        self.port = port or free_port()
        self.extra = extra
        self.start()

    def start(self):
        self.logf = open(self.log, "a")
        self.proc = subprocess.Popen(
            [self.kiln, "serve", f"--model_base_path={self.base}", f"--model_name={NAME}",
             f"--rest_api_port={self.port}", "--rest_api_address=127.0.0.1", "--port=0",
             "--rest_api_num_threads=4", "--file_system_poll_wait_seconds=1", *self.extra],
            stdout=self.logf, stderr=subprocess.STDOUT)
        self.started = time.time()

    def request(self, method, path, body=None, timeout=10):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request(method, path, body=body)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def wait_ready(self, limit=60):
        """Seconds until a predict answers 200; fails with the log after limit."""
        deadline = time.time() + limit
        while time.time() < deadline:
            check(self.proc.poll() is None, f"server exited: {self.logtext()}")
            try:
                if good_answer(*self.request("POST", PATH, BODY)):
                    return time.time() - self.started
            except OSError:
                pass
            time.sleep(0.05)
        raise Fail(f"not ready in {limit} s: {self.logtext()}")

    def versions(self):
        """{version: state} from TF Serving's model status."""
        status, body = self.request("GET", f"/v1/models/{NAME}")
        check(status == 200, f"model status answered {status}")
        return {int(v["version"]): v["state"] for v in json.loads(body)["model_version_status"]}

    def available(self):
        return sorted(v for v, s in self.versions().items() if s == "AVAILABLE")

    def wait_available(self, want, limit):
        deadline = time.time() + limit
        while time.time() < deadline:
            if self.available() == want:
                return
            time.sleep(0.1)
        raise Fail(f"versions {self.versions()} after {limit} s, want {want} AVAILABLE")

    def logtext(self):
        self.logf.flush()
        return Path(self.log).read_text()[-3000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.logf.close()


class Clients:
    """n threads predicting on keep-alive connections until stopped; any
    answer other than a good 200, and any connection error, is a failure."""

    def __init__(self, port, n=4):
        self.port = port
        self.ok = 0
        self.failures = []
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    def run(self):
        c = None
        while not self.halt.is_set():
            try:
                if c is None:
                    c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                c.request("POST", PATH, body=BODY)
                r = c.getresponse()
                body = r.read()
                good = good_answer(r.status, body)
                with self.lock:
                    if good:
                        self.ok += 1
                    else:
                        self.failures.append((time.time(), r.status, body[:200].decode(errors="replace")))
                if r.getheader("Connection", "").lower() == "close":
                    c.close()
                    c = None
            except (OSError, http.client.HTTPException) as e:
                with self.lock:
                    self.failures.append((time.time(), "error", repr(e)))
                if c is not None:
                    c.close()
                c = None
                time.sleep(0.01)

    def finish(self):
        self.halt.set()
        for t in self.threads:
            t.join(60)
        return self.ok, self.failures


# ------------------------------------------------------------------ scenarios

WRK_LUA = """
wrk.method = "POST"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRKJSON {"requests": %%d, "connect": %%d, "read": %%d, "write": %%d, ' ..
    '"status": %%d, "timeout": %%d, "p50_ms": %%.3f, "p99_ms": %%.3f, "max_ms": %%.3f}\\n',
    summary.requests, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000))
end
"""


WRK_STATUS_LUA = """
wrk.method = "POST"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) counts = {} end
function response(status, headers, body) counts[status] = (counts[status] or 0) + 1 end
done = function(summary, latency, requests)
  local e = summary.errors
  local parts = {}
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get("counts")) do parts[#parts + 1] = string.format('"%%d": %%d', k, v) end
  end
  io.write(string.format('WRKJSON {"requests": %%d, "connect": %%d, "read": %%d, "write": %%d, ' ..
    '"status": %%d, "timeout": %%d, "p50_ms": %%.3f, "p99_ms": %%.3f, "max_ms": %%.3f, "codes": [{%%s}]}\\n',
    summary.requests, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000,
    table.concat(parts, "}, {")))
end
"""


def wrk(port, seconds, work, threads=2, conns=16, codes=False):
    lua = work / "post.lua"
    lua.write_text((WRK_STATUS_LUA if codes else WRK_LUA) % BODY.decode())
    out = subprocess.run(["wrk", f"-t{threads}", f"-c{conns}", f"-d{seconds}s", "--timeout", "10s",
                          "-s", str(lua), f"http://127.0.0.1:{port}{PATH}"],
                         capture_output=True, text=True, timeout=seconds + 60)
    for line in out.stdout.splitlines():
        if line.startswith("WRKJSON "):
            res = json.loads(line[8:])
            if codes:  # one {status: n} per thread and status: sum them
                total = {}
                for d in res.pop("codes"):
                    for k, v in d.items():
                        total[k] = total.get(k, 0) + v
                res["codes"] = total
            return res
    raise Fail(f"wrk printed no summary: {out.stdout} {out.stderr}")


def scenario_load(kiln, work, long, seconds):
    if not shutil.which("wrk"):
        return None
    run_s = seconds or (1800 if long else 8)
    warm_s = 60 if long else 3
    base = work / NAME
    base.mkdir()
    add_version(base, 1)
    srv = Server(kiln, base, work / "server.log")
    try:
        srv.wait_ready()
        warm = wrk(srv.port, warm_s, work)
        rss_warm = rss_kib(srv.proc.pid)
        samples = []
        sampling = threading.Event()

        def sample():
            while not sampling.wait(0.5):
                samples.append(rss_kib(srv.proc.pid))
        t = threading.Thread(target=sample, daemon=True)
        t.start()
        res = wrk(srv.port, run_s, work)
        sampling.set()
        t.join()
        rss_end = rss_kib(srv.proc.pid)
        check(srv.proc.poll() is None, "server died under load")
        growth = (rss_end - rss_warm) / rss_warm
        fig = {"seconds": run_s, "requests": res["requests"], "rps": round(res["requests"] / run_s),
               "non_2xx": res["status"], "socket_errors": res["connect"] + res["read"] + res["write"]
               + res["timeout"], "p50_ms": res["p50_ms"], "p99_ms": res["p99_ms"], "max_ms": res["max_ms"],
               "rss_warm_kib": rss_warm, "rss_max_kib": max(samples + [rss_end]), "rss_end_kib": rss_end,
               "rss_growth_pct": round(100 * growth, 2), "warmup_requests": warm["requests"]}
        check(warm["status"] == 0 and res["status"] == 0, f"non-2xx answers: {fig}")
        check(fig["socket_errors"] == 0, f"socket errors: {fig}")
        # ASan's quarantine keeps freed memory (up to 256 MiB) by design: report, do not judge
        if not SANITIZED:
            check(growth < 0.05, f"resident memory grew {100 * growth:.1f}% after warm-up: {fig}")
        return fig
    finally:
        srv.stop()


def scenario_hotswap(kiln, work, long, seconds):
    run_s = seconds or (1800 if long else 12)
    every = 10 if long else 2
    base = work / NAME
    base.mkdir()
    add_version(base, 1)
    srv = Server(kiln, base, work / "server.log")
    try:
        srv.wait_ready()
        clients = Clients(srv.port)
        v = 1
        seen = set()
        t_end = time.time() + run_s
        while time.time() < t_end:
            nxt = time.time() + every
            while time.time() < nxt:
                seen.update(srv.available())
                time.sleep(0.2)
            v += 1
            add_version(base, v)
            if (base / str(v - 3)).exists():  # keep three on disk; older ones vanish
                shutil.rmtree(base / str(v - 3))
        srv.wait_available([v], 15)
        seen.update(srv.available())
        ok, failures = clients.finish()
        check(srv.proc.poll() is None, "server died")
        fig = {"seconds": run_s, "every_s": every, "versions_added": v - 1, "versions_seen_available":
               len(seen), "requests_ok": ok, "requests_failed": len(failures)}
        check(not failures, f"failed requests: {failures[:5]} {fig}")
        check(ok > 0, "no request answered")
        return fig
    finally:
        srv.stop()


def scenario_sigterm(kiln, work, long, seconds):
    rounds = 20 if long else 1
    base = work / NAME
    base.mkdir()
    add_version(base, 1)
    add_version(base, 2)
    fig = {"rounds": rounds, "sent_before": 0, "answered_before": 0, "sent_after": 0,
           "answered_after": 0, "refused_after": 0, "reset": 0, "exit_s_max": 0.0,
           "restarts": 0, "restart_ready_s_max": 0.0}
    port = free_port()
    for _ in range(rounds):
        srv = Server(kiln, base, work / "server.log", port)
        try:
            srv.wait_ready()
            before = srv.available()
            results = []
            lock = threading.Lock()
            halt = threading.Event()

            def client():
                while not halt.is_set():
                    t0 = time.time()
                    connected = False
                    try:
                        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                        c.connect()
                        connected = True
                        c.request("POST", PATH, body=BODY, headers={"Connection": "close"})
                        r = c.getresponse()
                        out = "ok" if good_answer(r.status, r.read()) else f"status {r.status}"
                        c.close()
                    except ConnectionRefusedError:
                        out = "refused"
                    except (OSError, http.client.HTTPException) as e:
                        out = "reset" if connected else f"connect error {e!r}"
                    with lock:
                        results.append((t0, out))
                    if out != "ok":
                        time.sleep(0.005)
            threads = [threading.Thread(target=client, daemon=True) for _ in range(8)]
            for t in threads:
                t.start()
            time.sleep(2)
            t_sig = time.time()
            srv.proc.send_signal(signal.SIGTERM)
            rc = srv.proc.wait(30)
            exit_s = time.time() - t_sig
            time.sleep(0.3)
            halt.set()
            for t in threads:
                t.join(60)
            pre = [o for t0, o in results if t0 < t_sig]
            post = [o for t0, o in results if t0 >= t_sig]
            fig["sent_before"] += len(pre)
            fig["answered_before"] += pre.count("ok")
            fig["sent_after"] += len(post)
            fig["answered_after"] += post.count("ok")
            fig["refused_after"] += post.count("refused")
            fig["reset"] += sum(1 for o in pre + post if o == "reset")
            fig["exit_s_max"] = max(fig["exit_s_max"], round(exit_s, 3))
            check(rc == 0, f"exit status {rc} after SIGTERM: {srv.logtext()}")
            check(exit_s < 11, f"exit took {exit_s:.1f} s, drain is 10 s")
            # Every connection must get a whole answer: 200, or 503 once draining
            # began (a request sent just before the signal may arrive after it),
            # or be refused once the listening socket is closed. Kiln today resets
            # a few connections caught in the moment the drain starts (see
            # docs/RELIABILITY.md, "Known defects"): counted always, a failure with
            # --strict.
            allowed = ("ok", "status 503", "refused", "reset")
            bad = [o for o in pre + post if o not in allowed]
            check(not bad, f"requests neither answered 200/503 nor refused: {bad[:5]} {fig}")
            fig["answered_503"] = fig.get("answered_503", 0) + (pre + post).count("status 503")
            resets = sum(1 for o in pre + post if o == "reset")
            check(not (resets and STRICT), f"{resets} connections reset during the drain: {fig}")
            check(pre.count("ok") > 0, "no request answered before SIGTERM")
            # kill -9 under load, then a restart on the same folder and port
            srv.start()
            srv.wait_ready()
            clients = Clients(port)
            time.sleep(1)
            t_kill = time.time()
            srv.proc.kill()
            srv.proc.wait(10)
            clients.finish()
            srv.start()
            srv.wait_ready(30)
            srv.wait_available(before, 30)
            ready_s = time.time() - t_kill
            fig["restarts"] += 1
            fig["restart_ready_s_max"] = max(fig["restart_ready_s_max"], round(ready_s, 3))
            check(ready_s < 10, f"serving {before} again took {ready_s:.1f} s")
        finally:
            srv.stop()
    return fig


def scenario_badversion(kiln, work, long, seconds):
    hold = 30 if long else 3
    base = work / NAME
    base.mkdir()
    add_version(base, 1)
    srv = Server(kiln, base, work / "server.log")
    try:
        srv.wait_ready()
        clients = Clients(srv.port)
        # 1. an unreadable version 2 (or, as root, a corrupt one): 1 stays served
        bad = base / "2"
        if os.geteuid() != 0:
            add_version(base, 2)
            os.chmod(bad / "model.onnx", 0)
            os.chmod(bad, 0)
            how = "chmod 000"
        else:
            bad.mkdir()
            (bad / "model.onnx").write_bytes(MODEL.read_bytes()[:1000] + b"\xff" * 64)
            how = "corrupt model.onnx (running as root: chmod does not deny)"
        time.sleep(hold)
        check(srv.available() == [1], f"after an unreadable version 2: {srv.versions()}")
        state2 = srv.versions().get(2, "absent")
        os.chmod(bad, 0o755)
        shutil.rmtree(bad)
        # 2. version 3 arrives and is served, then its folder vanishes
        add_version(base, 3)
        srv.wait_available([3], 15)
        shutil.rmtree(base / "3")
        time.sleep(hold)
        after_vanish = srv.available()
        check(after_vanish, f"nothing AVAILABLE after version 3 vanished: {srv.versions()}")
        # 3. the whole base path vanishes for a while, then comes back
        gone = work / "moved-away"
        os.rename(base, gone)
        time.sleep(hold)
        during_base_gone = srv.available()
        check(during_base_gone, f"nothing AVAILABLE while the base path was gone: {srv.versions()}")
        os.rename(gone, base)
        time.sleep(2)
        ok, failures = clients.finish()
        check(srv.proc.poll() is None, "server died")
        fig = {"unreadable": how, "version2_state": state2, "available_after_vanish": after_vanish,
               "available_while_base_gone": during_base_gone, "requests_ok": ok,
               "requests_failed": len(failures)}
        check(not failures, f"failed requests: {failures[:5]} {fig}")
        return fig
    finally:
        if (base / "2").exists():
            os.chmod(base / "2", 0o755)
        srv.stop()


BATCHING = """max_batch_size { value: 4 }
batch_timeout_micros { value: 2000 }
max_enqueued_batches { value: 2 }
num_batch_threads { value: 1 }
allowed_batch_sizes: 4
"""


def scenario_overload(kiln, work, long, seconds):
    """Far more concurrent clients than a small batching queue admits: only
    200 or 503, admitted requests' latency bounded, full recovery after."""
    if not shutil.which("wrk"):
        return None
    over_s = seconds or (300 if long else 5)
    base = work / NAME
    base.mkdir()
    add_version(base, 1)
    params = work / "batching.txt"
    params.write_text(BATCHING)
    srv = Server(kiln, base, work / "server.log", None, "--enable_batching", "--rest_api_num_threads=64",
                 f"--batching_parameters_file={params}")
    try:
        srv.wait_ready()
        before = wrk(srv.port, 3, work, threads=1, conns=4, codes=True)
        over = wrk(srv.port, over_s, work, threads=2, conns=64, codes=True)
        after = wrk(srv.port, 3, work, threads=1, conns=4, codes=True)
        check(srv.proc.poll() is None, "server died")
        fig = {"seconds": over_s, "baseline_rps": round(before["requests"] / 3),
               "overload_connections": 64, "overload_rps": round(over["requests"] / over_s),
               "overload_codes": over["codes"], "overload_p99_ms": over["p99_ms"],
               "overload_max_ms": over["max_ms"], "after_rps": round(after["requests"] / 3),
               "after_codes": after["codes"], "socket_errors": sum(
                   r[k] for r in (before, over, after) for k in ("connect", "read", "write", "timeout"))}
        check(set(before["codes"]) == {"200"}, f"baseline answered other than 200: {fig}")
        check(set(over["codes"]) <= {"200", "503"}, f"overload answered other than 200 or 503: {fig}")
        check(over["codes"].get("503", 0) > 0, f"no 503: the queue never filled, no overload: {fig}")
        check(fig["socket_errors"] == 0, f"socket errors: {fig}")
        bound_ms = 5000 if SANITIZED else 1000
        # p99 bounded; none over wrk's 10 s timeout (counted in socket_errors)
        check(over["p99_ms"] < bound_ms, f"p99 over {bound_ms} ms under overload: {fig}")
        check(set(after["codes"]) == {"200"}, f"after the overload, answers other than 200: {fig}")
        check(fig["after_rps"] >= 0.5 * fig["baseline_rps"], f"throughput did not recover: {fig}")
        return fig
    finally:
        srv.stop()


def scenario_slowloris(kiln, work, long, seconds):
    run_s = seconds or (600 if long else 8)
    nslow = CONNS or (900 if long else 200)
    gap = 0.5
    bound = 2.0
    base = work / NAME
    base.mkdir()
    add_version(base, 1)
    srv = Server(kiln, base, work / "server.log")
    try:
        srv.wait_ready()
        head = (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "X-Slow: " + "a" * 100000).encode()
        slow = []
        for _ in range(nslow):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", srv.port))
            except BlockingIOError:
                pass
            slow.append([s, 0])
        # slow readers: whole requests for 2000 rows whose ~400 KB answers are
        # not read until the end, through a 4 KiB receive buffer
        nread = 40 if long else 10
        big = json.dumps({"instances": [PIXELS] * 2000}).encode()
        readers = []
        for _ in range(nread):
            r = socket.socket()
            r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            r.connect(("127.0.0.1", srv.port))
            r.sendall(f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(big)}\r\n"
                      "Connection: close\r\n\r\n".encode() + big)
            readers.append(r)
        lat = []
        bad = []
        t_end = time.time() + run_s
        t_next_byte = 0.0
        dropped = 0
        while time.time() < t_end:
            if time.time() >= t_next_byte:
                t_next_byte = time.time() + gap
                for rec in slow:
                    if rec[0] is None:
                        continue
                    try:
                        rec[1] += rec[0].send(head[rec[1]:rec[1] + 1])
                    except BlockingIOError:
                        pass
                    except OSError as e:
                        if e.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                            rec[0].close()
                            rec[0] = None
                            dropped += 1
            t0 = time.time()
            try:
                status, body = srv.request("POST", PATH, BODY, timeout=bound + 5)
                good = good_answer(status, body)
            except OSError as e:
                good, status = False, repr(e)
            dt = time.time() - t0
            lat.append(dt)
            if not good or dt > bound:
                bad.append((round(dt, 3), status))
            time.sleep(0.05)
        # the slow readers' answers must be whole 200s once they read them
        readers_ok = 0
        for r in readers:
            r.settimeout(30)
            data = b""
            try:
                while True:
                    chunk = r.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            except OSError:
                pass
            r.close()
            head, _, body = data.partition(b"\r\n\r\n")
            try:
                p = json.loads(body)["predictions"]
                if head.startswith(b"HTTP/1.1 200") and len(p) == 2000 and abs(sum(p[-1]) - 1) < 1e-3:
                    readers_ok += 1
            except (ValueError, KeyError, TypeError):
                pass
        open_slow = sum(1 for rec in slow if rec[0] is not None)
        for rec in slow:
            if rec[0] is not None:
                rec[0].close()
        check(srv.proc.poll() is None, "server died")
        lat.sort()
        fig = {"seconds": run_s, "slow_connections": nslow, "byte_every_s": gap,
               "slow_still_open": open_slow, "slow_dropped_by_server": dropped,
               "normal_requests": len(lat), "normal_bad": len(bad),
               "normal_p50_ms": round(1000 * lat[len(lat) // 2], 2),
               "normal_max_ms": round(1000 * lat[-1], 2), "bound_ms": bound * 1000,
               "slow_readers": nread, "slow_readers_answered": readers_ok}
        check(not bad, f"normal requests failed or slower than {bound} s: {bad[:5]} {fig}")
        check(readers_ok == nread, f"slow readers without a whole answer: {fig}")
        return fig
    finally:
        srv.stop()


SCENARIOS = {"load": scenario_load, "hotswap": scenario_hotswap, "overload": scenario_overload,
             "sigterm": scenario_sigterm,
             "badversion": scenario_badversion, "slowloris": scenario_slowloris}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kiln")
    ap.add_argument("scenario", choices=[*SCENARIOS, "all"])
    ap.add_argument("--long", action="store_true", help="the long variant (docs/RELIABILITY.md)")
    ap.add_argument("--seconds", type=int, default=0, help="override the run time")
    ap.add_argument("--out", help="append the JSON lines to this file")
    ap.add_argument("--strict", action="store_true",
                    help="sigterm: also fail when a connection opened after the signal is reset")
    ap.add_argument("--connections", type=int, default=0, help="slowloris: slow connections to open")
    a = ap.parse_args()
    global CONNS
    CONNS = a.connections
    if not MODEL.exists():
        print(f"SKIP: {MODEL} missing")
        return SKIP
    names = list(SCENARIOS) if a.scenario == "all" else [a.scenario]
    status = 0
    for name in names:
        work = Path(tempfile.mkdtemp(prefix=f"kiln-soak-{name}-"))
        t0 = time.time()
        rec = {"scenario": name, "variant": "long" if a.long else "short"}
        try:
            fig = SCENARIOS[name](os.path.abspath(a.kiln), work, a.long, a.seconds)
            if fig is None:
                rec["result"] = "skipped"
                print(f"SKIP: {name} needs wrk")
                status = status or SKIP
            else:
                rec.update(result="pass", **fig)
        except Fail as e:
            rec.update(result="fail", why=str(e)[:4000])
            status = 1
        finally:
            shutil.rmtree(work, ignore_errors=True)
        rec["wall_s"] = round(time.time() - t0, 1)
        line = json.dumps(rec)
        print(line)
        if a.out:
            with open(a.out, "a") as f:
                f.write(line + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
