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
             exits 0 within its drain time (connections reset during the drain
             are counted, and fail the run with --strict, as ctest runs it); then
             kill -9 under load and a restart on the same folder and port: the
             same versions AVAILABLE again within seconds. Then the gRPC
             port: a raw HTTP/2 client checks the two-step GOAWAY (2^31-1 and
             a PING, then the last stream id), that streams below it are
             served (one still arriving), one above it is refused
             (REFUSED_STREAM) and the connection ends with a FIN; meanwhile
             grpcio clients (plain, wait_for_ready, with retries) call Predict
             through the SIGTERM and a restart: every call is a good answer
             or UNAVAILABLE, no UNAVAILABLE call reached the model (the
             request log), every call in flight at the signal is answered,
             and no wait_for_ready call fails
  badversion an unreadable (chmod 000; as root, where permissions do not
             deny, a corrupt model file instead) version folder, a served
             version folder that vanishes, and the whole base path vanishing
             for a while: no failed request, the server keeps serving
  slowloris  many connections send request headers one byte at a time, and a
             few slow readers leave large answers unread, while a normal
             client predicts: every normal request answers 200 within a
             bound, and each slow reader gets its whole answer in the end
  diskfull   the request log (every predict sampled) writes to a small tmpfs
             mounted in the server's own mount namespace, which the test then
             fills: every predict still answers a good 200, the failure is
             logged once per episode, and logging resumes when space returns,
             each log file still whole records
  slowload   a version whose load takes seconds (a long warmup) while a
             second model and the config file change: version 1 and the
             status pages keep answering, the other model's new version and a
             model added to the config load meanwhile, and the slow version
             is AVAILABLE in the end
  h2flood    HTTP/2 floods on raw sockets against the gRPC port (rapid reset,
             SETTINGS, PING, CONTINUATION, empty DATA, WINDOW_UPDATE, PRIORITY,
             unknown frame types) while a grpcio client predicts, then friendly
             clients: normal calls answered in time, every flood connection
             ended, the frame floods counted in
             kiln_grpc_connections_closed_total{reason="frame_flood"} and
             logged (event=grpc_frame_flood, at most a line a second, the rest
             counted as suppressed), friendly clients never closed or counted

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
import re
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

    def __init__(self, kiln, base, log, port=None, *extra, config=None, wrap=()):
        self.kiln, self.base, self.log = kiln, base, log
        self.port = port or free_port()
        self.extra = extra
        self.config, self.wrap = config, list(wrap)  # a --model_config_file; a command prefix
        self.start()

    def start(self):
        self.logf = open(self.log, "a")
        models = ([f"--model_config_file={self.config}", "--model_config_file_poll_wait_seconds=1"]
                  if self.config else [f"--model_base_path={self.base}", f"--model_name={NAME}"])
        self.proc = subprocess.Popen(
            [*self.wrap, self.kiln, "serve", *models,
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

    def versions(self, name=NAME):
        """{version: state} from TF Serving's model status."""
        status, body = self.request("GET", f"/v1/models/{name}")
        check(status == 200, f"model status of {name} answered {status}")
        return {int(v["version"]): v["state"] for v in json.loads(body)["model_version_status"]}

    def available(self, name=NAME):
        return sorted(v for v, s in self.versions(name).items() if s == "AVAILABLE")

    def wait_available(self, want, limit, name=NAME):
        deadline = time.time() + limit
        while time.time() < deadline:
            try:
                if self.available(name) == want:
                    return
            except Fail:  # a model not yet in the config answers 404
                pass
            time.sleep(0.1)
        raise Fail(f"versions of {name} {self.versions(name)} after {limit} s, want {want} AVAILABLE")

    def metric(self, key):
        """A sample's value on the Prometheus page (0 when absent)."""
        status, body = self.request("GET", "/metrics")
        check(status == 200, f"/metrics answered {status}")
        for line in body.decode().splitlines():
            if line.startswith(key + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def logtext(self):
        return self.logtext_all()[-3000:]

    def logtext_all(self):
        self.logf.flush()
        return Path(self.log).read_text()

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
    try:
        import grpc  # noqa: F401  (the gRPC rounds)
        grpc_ok = True
    except ImportError:
        print("note: no grpcio package: the gRPC port's drain is not tested")
        grpc_ok = False
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
            # or be refused once the listening socket is closed. Resets are counted
            # always and fail the run with --strict (the drain that leaves none:
            # docs/RELIABILITY.md, defect 1).
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
        if grpc_ok:
            grpc_sigterm_round(kiln, work, base, fig)
            fig["grpc_rounds"] = fig.get("grpc_rounds", 0) + 1
    return fig

GRPC_BATCHING = """max_batch_size { value: 64 }
batch_timeout_micros { value: 40000 }
max_enqueued_batches { value: 1000 }
num_batch_threads { value: 2 }
"""


def h2_split(buf):
    """Whole frames off the front of buf: ([(type, flags, stream, payload)], the rest)."""
    out = []
    while len(buf) >= 9:
        n = int.from_bytes(buf[:3], "big")
        if len(buf) < 9 + n:
            break
        out.append((buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, buf[9:9 + n]))
        buf = buf[9 + n:]
    return out, buf


class H2DrainProbe:
    """A raw HTTP/2 connection to the gRPC port that watches the drain frame
    by frame: opened before the SIGTERM with a Predict whose message is only
    half sent (stream 1)."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buf, self.frames, self.eof = b"", [], None
        self.msg = {}
        for sid in (1, 3, 5):  # the first pixel says the stream (-sid) in the request log
            req = predict_request([float(-sid)] + PIXELS[1:])
            self.msg[sid] = b"\x00" + len(req).to_bytes(4, "big") + req
        self.s.sendall(H2_PREFACE + h2_frame(4, 0, 0) + h2_frame(1, 0x4, 1, hpack_request())
                       + h2_frame(0, 0, 1, self.msg[1][:40]))
        self.find(lambda f: f[0] == 4 and not f[1] & 1, "the server's SETTINGS")
        self.s.sendall(h2_frame(4, 1, 0))

    def read(self, timeout):
        self.s.settimeout(timeout)
        try:
            d = self.s.recv(65536)
        except socket.timeout:
            return
        except OSError as e:  # a reset: what the drain must not do
            self.eof = f"error {e!r}"
            return
        if not d:
            self.eof = "fin"
            return
        frames, self.buf = h2_split(self.buf + d)
        self.frames += frames

    def find(self, pred, what, limit=5.0):
        end = time.time() + limit
        while True:
            for f in self.frames:
                if pred(f):
                    return f
            check(self.eof is None and time.time() < end,
                  f"gRPC drain: no {what} (connection {self.eof}); frames read: "
                  f"{[(t, fl, sid, p[:8].hex()) for t, fl, sid, p in self.frames][-12:]}")
            self.read(0.2)

    def after_sigterm(self):
        """The two steps of GOAWAY, a stream served between them, one refused after."""
        fig = {}
        g1 = self.find(lambda f: f[0] == 7, "GOAWAY after SIGTERM")
        last1, code1 = int.from_bytes(g1[3][:4], "big") & 0x7FFFFFFF, int.from_bytes(g1[3][4:8], "big")
        fig["goaway1_last_id"] = last1
        check((last1, code1) == (2**31 - 1, 0),
              f"gRPC drain: the first GOAWAY must say last-stream-id 2^31-1, NO_ERROR: {last1}, {code1}")
        ping = self.find(lambda f: f[0] == 6 and not f[1] & 1, "PING with the first GOAWAY")
        # a call sent before this client read the GOAWAY (as far as the server
        # can tell), the rest of stream 1's message, then the PING's ACK
        self.s.sendall(h2_frame(1, 0x4, 3, hpack_request()) + h2_frame(0, 0x1, 3, self.msg[3])
                       + h2_frame(0, 0x1, 1, self.msg[1][40:]) + h2_frame(6, 1, 0, ping[3]))
        g2 = self.find(lambda f: f[0] == 7 and f is not g1, "the final GOAWAY after the PING's ACK")
        last2, code2 = int.from_bytes(g2[3][:4], "big") & 0x7FFFFFFF, int.from_bytes(g2[3][4:8], "big")
        fig["goaway2_last_id"] = last2
        check((last2, code2) == (3, 0), f"gRPC drain: the final GOAWAY must say last-stream-id 3, "
              f"NO_ERROR: {last2}, {code2}")
        self.s.sendall(h2_frame(1, 0x4, 5, hpack_request()) + h2_frame(0, 0x1, 5, self.msg[5]))
        rst = self.find(lambda f: f[0] == 3 and f[2] == 5, "RST_STREAM of stream 5 (above the last id)")
        check(int.from_bytes(rst[3][:4], "big") == 7, f"gRPC drain: stream 5 must be refused with "
              f"REFUSED_STREAM (7), got {int.from_bytes(rst[3][:4], 'big')}")
        end = time.time() + 10
        while self.eof is None and time.time() < end:
            self.read(0.2)
        fig["probe_close"] = self.eof
        check(self.eof == "fin", f"gRPC drain: the connection must end with a FIN once its calls "
              f"are answered, got {self.eof}")
        for sid in (1, 3):
            data = b"".join(p for t, _, i, p in self.frames if t == 0 and i == sid)
            trailers = [f for f in self.frames if f[0] == 1 and f[2] == sid and f[1] & 1]
            resets = [int.from_bytes(p[:4], "big") for t, _, i, p in self.frames if t == 3 and i == sid]
            check(len(data) > 5 and good_predict_response(data[5:]) and trailers
                  and all(r == 0 for r in resets),
                  f"gRPC drain: stream {sid} ({'its message still arriving at the signal' if sid == 1 else 'opened after the first GOAWAY'}) "
                  f"was not answered in full: {len(data)} bytes of DATA, {len(trailers)} trailers, resets {resets}")
        self.s.close()
        return fig


def grpc_sigterm_round(kiln, work, base, fig):
    """SIGTERM on the gRPC port under grpcio load, then a restart (docs/RELIABILITY.md)."""
    import grpc
    gport, rport = free_port(), free_port()
    params = work / "grpc-batching.txt"
    params.write_text(GRPC_BATCHING)
    logdirs = [work / "grpc-log-a", work / "grpc-log-b"]

    def start(logs):
        shutil.rmtree(logs, ignore_errors=True)
        logs.mkdir()
        cfg = work / f"{logs.name}.config"
        cfg.write_text(config_text([(NAME, base, 'logging_config { log_collector_config { '
                                     f'type: "kiln_jsonl" filename_prefix: "{logs}/{NAME}" }} '
                                     'sampling_config { sampling_rate: 1.0 } }')]))
        srv = Server(kiln, base, work / "grpc-server.log", rport, f"--port={gport}", "--enable_batching",
                     f"--batching_parameters_file={params}", config=cfg)
        srv.wait_ready()
        return srv

    srv = start(logdirs[0])
    srv2 = None
    addr = f"127.0.0.1:{gport}"
    retry_cfg = json.dumps({"methodConfig": [{
        "name": [{"service": "tensorflow.serving.PredictionService"}],
        "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "1s",
                        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]})
    kinds = {"plain": ([], False), "wait_for_ready": ([], True),
             "retry": ([("grpc.enable_retries", 1), ("grpc.service_config", retry_cfg)], False)}
    calls, lock, halt = [], threading.Lock(), threading.Event()
    next_id = [1]

    def client(kind):
        opts, wfr = kinds[kind]
        chan = grpc.insecure_channel(addr, options=opts)
        predict = chan.unary_unary("/tensorflow.serving.PredictionService/Predict")
        while not halt.is_set():
            with lock:
                cid = next_id[0]
                next_id[0] += 1
            req = predict_request([float(cid)] + PIXELS[1:])  # the id, found again in the request log
            t0 = time.time()
            try:
                out = "ok" if good_predict_response(predict(req, timeout=20, wait_for_ready=wfr)) else "bad answer"
            except grpc.RpcError as e:
                out = e.code().name
            with lock:
                calls.append((kind, cid, t0, time.time(), out))
            if out != "ok":
                time.sleep(0.01)
        chan.close()

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in kinds for _ in range(4)]
    try:
        probe = H2DrainProbe(gport)
        for t in threads:
            t.start()
        time.sleep(1.5)
        t_sig = time.time()
        srv.proc.send_signal(signal.SIGTERM)
        try:
            fig.update(probe.after_sigterm())
        finally:
            rc = srv.proc.wait(30)
            exit_s = time.time() - t_sig
        check(rc == 0, f"gRPC round: exit status {rc} after SIGTERM: {srv.logtext()}")
        check(exit_s < 11, f"gRPC round: exit took {exit_s:.1f} s, drain is 10 s")
        fig["grpc_exit_s_max"] = max(fig.get("grpc_exit_s_max", 0.0), round(exit_s, 3))
        srv.logf.close()
        srv2 = start(logdirs[1])  # the restart: waiting clients are served by it
        t_up = time.time()
        time.sleep(1.5)
    finally:
        halt.set()
        for t in threads:
            t.join(30)
        for x in (srv, srv2):
            if x:
                x.stop()
    processed = {}
    for logs in logdirs:
        for path in logs.glob(f"{NAME}.*.jsonl"):
            for line in path.read_bytes().splitlines():
                rec = json.loads(line)
                if rec.get("entrypoint") != "GRPC":
                    continue
                x = rec["request"]["inputs"]
                while not isinstance(x, (int, float)):
                    x = next(iter(x.values())) if isinstance(x, dict) else x[0]
                processed[int(x)] = processed.get(int(x), 0) + 1
    check(processed.get(-1) == 1 and processed.get(-3) == 1 and -5 not in processed,
          f"gRPC drain: the raw client's streams 1 and 3 must run once and the refused stream 5 "
          f"never: {[(-k, processed.get(-k)) for k in (1, 3, 5)]}")
    outcome = {cid: out for _, cid, _, _, out in calls}
    flight = [(k, cid, out) for k, cid, t0, t1, out in calls if t0 < t_sig < t1]
    g = {"calls": len(calls), "ok": sum(o == "ok" for o in outcome.values()),
         "unavailable": sum(o == "UNAVAILABLE" for o in outcome.values()),
         "in_flight_at_signal": len(flight), "processed_logged": len(processed),
         "ok_after_restart": sum(1 for _, _, t0, t1, o in calls if o == "ok" and t1 > t_up)}
    for k in kinds:
        g[f"{k}_failed"] = sum(1 for kk, _, _, _, o in calls if kk == k and o != "ok")
    for key, v in g.items():
        fig[f"grpc_{key}"] = fig.get(f"grpc_{key}", 0) + v
    bad = [(k, cid, o) for k, cid, _, _, o in calls if o not in ("ok", "UNAVAILABLE")]
    check(not bad, f"gRPC calls neither answered nor UNAVAILABLE: {bad[:8]} {g}")
    lost = [cid for cid, o in outcome.items() if o == "UNAVAILABLE" and cid in processed]
    check(not lost, f"gRPC calls failed UNAVAILABLE after the model ran them: {lost[:8]} {g}")
    twice = [cid for cid, n in processed.items() if n > 1]
    check(not twice, f"gRPC calls run more than once: {twice[:8]}")
    cut = [f for f in flight if f[2] != "ok"]
    check(not cut, f"gRPC calls in flight at the SIGTERM not answered: {cut[:8]} {g}")
    check(flight, f"no gRPC call was in flight at the SIGTERM (nothing tested): {g}")
    check(g["wait_for_ready_failed"] == 0, f"wait_for_ready calls failed: "
          f"{[c for c in calls if c[0] == 'wait_for_ready' and c[4] != 'ok'][:8]} {g}")
    check(g["ok_after_restart"] > 0, f"no gRPC call answered after the restart: {g}")


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
        # slow readers: whole requests for 2000 rows whose ~400 KB answers are read
        # through a 4 KiB receive buffer at 1 KiB every 0.5 s (2 KiB/s: a reader that
        # makes progress, which the server's 120 s idle timeout must not cut off; one
        # that reads nothing for longer is dropped by that timeout, by design)
        nread = 40 if long else 10
        big = json.dumps({"instances": [PIXELS] * 2000}).encode()
        readers = []
        for _ in range(nread):
            r = socket.socket()
            r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            r.connect(("127.0.0.1", srv.port))
            r.sendall(f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(big)}\r\n"
                      "Connection: close\r\n\r\n".encode() + big)
            r.setblocking(False)
            readers.append([r, b""])
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
                for rd in readers:
                    try:
                        rd[1] += rd[0].recv(1024)
                    except OSError:  # nothing to read yet (EAGAIN) or closed
                        pass
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
        for r, data in readers:
            r.setblocking(True)
            r.settimeout(30)
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


def config_text(models):
    """A ModelServerConfig listing (name, base_path, extra text) models."""
    return "model_config_list {\n" + "".join(
        f'  config {{ name: "{n}" base_path: "{b}" model_platform: "onnx" {x} }}\n'
        for n, b, x in models) + "}\n"


def unshare_prefix(mountpoint, size):
    """A command prefix that runs the rest in a mount namespace of its own
    with a tmpfs of `size` on mountpoint (the test reaches it through
    /proc/PID/root); None when this machine does not allow it."""
    pre = ["unshare", "-m", "--propagation", "private"] if os.geteuid() == 0 else \
        ["unshare", "-Urm", "--propagation", "private"]
    wrap = pre + ["sh", "-c", f'mount -t tmpfs -o size={size} kiln-soak "$0" && exec "$@"',
                  str(mountpoint)]
    if not shutil.which("unshare"):
        return None
    probe = subprocess.run(wrap + ["true"], capture_output=True)
    return wrap if probe.returncode == 0 else None


def scenario_diskfull(kiln, work, long, seconds):
    """The request log's disk fills up under load, then space comes back."""
    hold = seconds or (60 if long else 3)
    cycles = 3 if long else 1
    base = work / NAME
    base.mkdir()
    add_version(base, 1)
    logs = work / "logs"
    logs.mkdir()
    wrap = unshare_prefix(logs, "16m")
    if wrap is None:
        print("SKIP: diskfull needs a private mount namespace (unshare -m) for its tmpfs")
        return None
    cfg = work / "models.config"
    cfg.write_text(config_text([(NAME, base, 'logging_config { log_collector_config { '
                                 f'type: "kiln_jsonl" filename_prefix: "{logs}/{NAME}" }} '
                                 'sampling_config { sampling_rate: 1.0 } }')]))
    mon = work / "monitoring.config"
    mon.write_text('prometheus_config { enable: true path: "/metrics" }\n')
    srv = Server(kiln, base, work / "server.log", None, "--request_log_max_file_bytes=1M",
                 "--request_log_max_disk_bytes=4M", f"--monitoring_config_file={mon}",
                 config=cfg, wrap=wrap)
    rec_key = f'kiln_request_log_records_total{{model_name="{NAME}"}}'
    drop_key = f'kiln_request_log_dropped_total{{model_name="{NAME}",reason="write_error"}}'
    try:
        srv.wait_ready()
        view = Path(f"/proc/{srv.proc.pid}/root{logs}")  # the tmpfs, as the server sees it
        check(view.is_dir(), f"cannot reach the server's tmpfs at {view}")
        clients = Clients(srv.port)
        fig = {"hold_s": hold, "cycles": cycles, "records_before_full": 0, "dropped_while_full": 0,
               "records_while_full": 0, "records_after": 0, "resume_s_max": 0.0}
        for _ in range(cycles):
            deadline = time.time() + 10
            r0 = srv.metric(rec_key)
            while srv.metric(rec_key) < r0 + 50 and time.time() < deadline:
                time.sleep(0.05)
            check(srv.metric(rec_key) >= r0 + 50, f"request log not written: {srv.logtext()}")
            # fill the filesystem: the log's next writes get ENOSPC
            # unbuffered: a buffered file's close would retry the bytes left in its
            # buffer and raise ENOSPC again
            with open(view / "filler", "wb", buffering=0) as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                except OSError as e:
                    check(e.errno == errno.ENOSPC, f"filling the tmpfs: {e}")
            r1, d1 = srv.metric(rec_key), srv.metric(drop_key)
            time.sleep(hold)
            check(srv.proc.poll() is None, f"server died with a full disk: {srv.logtext()}")
            r2, d2 = srv.metric(rec_key), srv.metric(drop_key)
            fig["records_before_full"] += int(r1 - r0)
            fig["dropped_while_full"] += int(d2 - d1)
            fig["records_while_full"] += int(r2 - r1)
            check(d2 > d1, f"nothing dropped for a full disk: {fig}")
            # space returns: records are written again within seconds
            (view / "filler").unlink()
            t0 = time.time()
            while srv.metric(rec_key) < r2 + 50 and time.time() < t0 + 10:
                time.sleep(0.05)
            resumed = time.time() - t0
            fig["records_after"] += int(srv.metric(rec_key) - r2)
            fig["resume_s_max"] = max(fig["resume_s_max"], round(resumed, 2))
            check(srv.metric(rec_key) >= r2 + 50, f"logging did not resume in 10 s: {fig}")
        ok, failures = clients.finish()
        time.sleep(0.5)  # the writer drains its queue
        fig["requests_ok"], fig["requests_failed"] = ok, len(failures)
        check(not failures, f"failed requests: {failures[:5]} {fig}")
        # every line of every log file is a whole record: a write cut short
        # by ENOSPC was cut back to the record boundary
        lines = 0
        for path in view.glob(f"{NAME}.*.jsonl"):
            for line in path.read_bytes().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    raise Fail(f"{path.name}: a line is not a whole JSON record: {line[:80]!r} {fig}")
                check(isinstance(rec, dict), f"{path.name}: not a record: {line[:80]!r}")
                lines += 1
        fig["lines_in_files"] = lines
        fig["records_total"] = int(srv.metric(rec_key))
        check(lines == fig["records_total"], f"files hold {lines} records, the server wrote "
              f"{fig['records_total']}: {fig}")
        log = Path(srv.log).read_text()
        fig["failure_lines"] = log.count(f"request log of model '{NAME}': cannot")
        fig["resumed_lines"] = log.count(f"request log of model '{NAME}': writing again")
        check(fig["failure_lines"] == cycles, f"the write failure logged {fig['failure_lines']} "
              f"times for {cycles} full-disk episodes: {fig}")
        check(fig["resumed_lines"] == cycles, f"the recovery logged {fig['resumed_lines']} times: {fig}")
        return fig
    finally:
        srv.stop()


# TF Serving warmup file (TFRecord of PredictionLog): enough to make a load slow
def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _fld(num, payload):
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


_CRC_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ (0x82F63B78 if _c & 1 else 0)
    _CRC_TABLE.append(_c)


def _masked_crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = (crc >> 8) ^ _CRC_TABLE[(crc ^ b) & 0xFF]
    crc ^= 0xFFFFFFFF
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def warmup_file(rows):
    """One PredictionLog whose PredictRequest feeds `rows` rows of PIXELS."""
    import struct
    shape = _fld(2, _fld(2, _varint(1 << 3) + _varint(rows)) + _fld(2, _varint(1 << 3) + _varint(64)))
    tensor = _varint(1 << 3) + _varint(1) + shape + _fld(5, struct.pack(f"<{64 * rows}f", *(PIXELS * rows)))
    req = _fld(1, _fld(1, NAME.encode())) + _fld(2, _fld(1, b"pixels") + _fld(2, tensor))
    rec = _fld(6, _fld(1, req))
    n = struct.pack("<Q", len(rec))
    return n + struct.pack("<I", _masked_crc32c(n)) + rec + struct.pack("<I", _masked_crc32c(rec))


def add_slow_version(base, v, warmup):
    tmp = base / f".v{v}.tmp"
    (tmp / "assets.extra").mkdir(parents=True)
    shutil.copy(MODEL, tmp / "model.onnx")
    (tmp / "assets.extra" / "tf_serving_warmup_requests").write_bytes(warmup)
    os.rename(tmp, base / str(v))


def scenario_slowload(kiln, work, long, seconds):
    """A version that takes long to load while everything else goes on."""
    target = seconds or (60 if long else 3)  # under the clients' load it takes about twice that
    warm = warmup_file(256)
    # calibrate: how long one warmup iteration takes here
    cal = work / "calibrate" / NAME
    cal.mkdir(parents=True)
    add_slow_version(cal, 1, warm)
    srv = Server(kiln, cal, work / "calibrate.log", None, "--num_request_iterations_for_warmup=400")
    try:
        srv.wait_ready()
    finally:
        srv.stop()
    text = Path(work / "calibrate.log").read_text()
    check("warmup_ms=" in text, f"no warmup figure in the load line: {text[-2000:]}")
    per_iter_ms = max(float(text.split("warmup_ms=")[1].split()[0]) / 400, 0.01)
    iters = int(target * 1000 / per_iter_ms) + 1
    bases = {n: work / n for n in (NAME, "other", "third")}
    for b in bases.values():
        b.mkdir()
        add_version(b, 1)
    cfg = work / "models.config"
    cfg.write_text(config_text([(NAME, bases[NAME], ""), ("other", bases["other"], "")]))
    srv = Server(kiln, bases[NAME], work / "server.log", None,
                 f"--num_request_iterations_for_warmup={iters}", config=cfg)
    try:
        srv.wait_ready()
        srv.wait_available([1], 10, "other")
        clients = Clients(srv.port)
        # the status pages answer throughout
        status_bad, status_lat = [], []
        halt = threading.Event()

        def poll_status():
            while not halt.is_set():
                for path in (f"/v1/models/{NAME}", "/v1/models/other/metadata"):
                    t0 = time.time()
                    try:
                        code, _ = srv.request("GET", path, timeout=10)
                    except OSError as e:
                        code = repr(e)
                    status_lat.append(time.time() - t0)
                    if code != 200 or status_lat[-1] > 2:
                        status_bad.append((path, code, round(status_lat[-1], 3)))
                time.sleep(0.05)
        st = threading.Thread(target=poll_status, daemon=True)
        st.start()
        t_add = time.time()
        add_slow_version(bases[NAME], 2, warm)
        deadline = time.time() + 10
        while srv.versions().get(2) != "LOADING" and time.time() < deadline:
            time.sleep(0.05)
        check(srv.versions().get(2) == "LOADING", f"version 2 never LOADING: {srv.versions()}")
        # meanwhile: a new version of another model, and a model added to the config
        add_version(bases["other"], 2)
        cfg.write_text(config_text([(n, b, "") for n, b in bases.items()]))
        t0 = time.time()
        srv.wait_available([2], 10, "other")
        other_s = time.time() - t0
        srv.wait_available([1], 10, "third")
        third_s = time.time() - t0
        during = srv.versions()
        check(during.get(2) == "LOADING" and srv.available() == [1],
              f"version 2 no longer LOADING ({during}) when the other model's version 2 and the "
              f"added model were AVAILABLE ({other_s:.1f} / {third_s:.1f} s): they waited for "
              "the slow load, or it was not slow enough")
        srv.wait_available([2], 30 + 20 * target)
        loaded_s = time.time() - t_add
        halt.set()
        st.join(30)
        ok, failures = clients.finish()
        check(srv.proc.poll() is None, "server died")
        status_lat.sort()
        fig = {"warmup_iterations": iters, "per_iteration_ms": round(per_iter_ms, 3),
               "slow_version_available_s": round(loaded_s, 2),
               "other_model_v2_available_s": round(other_s, 2),
               "added_model_available_s": round(third_s, 2),
               "requests_ok": ok, "requests_failed": len(failures),
               "status_requests": len(status_lat), "status_bad": len(status_bad),
               "status_max_ms": round(1000 * status_lat[-1], 1) if status_lat else None}
        check(not failures, f"failed requests: {failures[:5]} {fig}")
        check(not status_bad, f"status requests failed or over 2 s: {status_bad[:5]} {fig}")
        return fig
    finally:
        srv.stop()


# ------------------------------------------------------------ HTTP/2 floods

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PREDICT_PATH = b"/tensorflow.serving.PredictionService/Predict"


def h2_frame(ftype, flags, stream, payload=b""):
    import struct
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", stream) + payload


def hpack_request(path=PREDICT_PATH):
    """A gRPC request's header block in HPACK without Huffman or indexing:
    :method POST, :scheme http (static entries), :path and :authority
    (literals with an indexed name), content-type and te (literal names)."""
    def lit(name, value):
        return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value
    return (b"\x83\x86" + b"\x04" + bytes([len(path)]) + path + b"\x01\x09127.0.0.1"
            + lit(b"content-type", b"application/grpc") + lit(b"te", b"trailers"))


def predict_request(pixels=PIXELS):
    """PredictRequest{model_spec{name}, inputs{"pixels": one row of pixels}} bytes."""
    import struct
    shape = _fld(2, _fld(2, _varint(1 << 3) + _varint(1)) + _fld(2, _varint(1 << 3) + _varint(64)))
    tensor = _varint(1 << 3) + _varint(1) + shape + _fld(5, struct.pack("<64f", *pixels))
    return _fld(1, _fld(1, NAME.encode())) + _fld(2, _fld(1, b"pixels") + _fld(2, tensor))


def _pb_fields(data):
    """(field number, wire type, value) of one protobuf message, flat."""
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _read_varint(data, i)
        elif wt == 2:
            n, i = _read_varint(data, i)
            v, i = data[i:i + n], i + n
        elif wt == 5:
            v, i = data[i:i + 4], i + 4
        elif wt == 1:
            v, i = data[i:i + 8], i + 8
        else:
            raise ValueError("wire type")
        yield num, wt, v


def _read_varint(data, i):
    n = shift = 0
    while True:
        b = data[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def good_predict_response(data):
    """A PredictResponse with one output of 10 floats summing to 1."""
    import struct
    try:
        for num, _, entry in _pb_fields(data):
            if num != 1:
                continue
            for k, _, tensor in _pb_fields(entry):
                if k != 2:
                    continue
                vals = []
                for f, wt, v in _pb_fields(tensor):
                    if f == 4:  # tensor_content
                        vals = list(struct.unpack(f"<{len(v) // 4}f", v))
                    elif f == 5 and wt == 2:  # packed float_val
                        vals += list(struct.unpack(f"<{len(v) // 4}f", v))
                    elif f == 5 and wt == 5:
                        vals.append(struct.unpack("<f", v)[0])
                if len(vals) == 10 and abs(sum(vals) - 1) < 1e-3:
                    return True
    except (ValueError, IndexError, struct.error):
        return False
    return False


class H2Attacker:
    """One abusive HTTP/2 connection pattern, repeated on fresh connections
    for a while; counts frames sent, connections the server ended, and the
    GOAWAY error codes it read."""

    def __init__(self, port, pattern):
        self.port, self.pattern = port, pattern
        self.frames = self.closed = self.conns = 0
        self.goaway = {}
        self.ports = set()  # the local ports of its connections (the server logs them as the peer)
        self.reads = pattern not in ("ping", "settings")  # the floods never read their ACKs

    def _reader(self, s, done):
        buf = b""
        s.settimeout(0.2)
        while not done.is_set():
            try:
                d = s.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                break
            if not d:
                break
            buf += d
            while len(buf) >= 9:
                n = int.from_bytes(buf[:3], "big")
                if len(buf) < 9 + n:
                    break
                if buf[3] == 7 and n >= 8:  # GOAWAY: last stream id, error code
                    code = int.from_bytes(buf[13:17], "big")
                    self.goaway[code] = self.goaway.get(code, 0) + 1
                buf = buf[9 + n:]

    def burst(self, sid):
        """About 100 frames of the pattern; the next stream id."""
        p, out = self.pattern, []
        if p == "rapid_reset":  # CVE-2023-44487: open a call, cancel it, repeat
            req = predict_request()
            msg = b"\x00" + len(req).to_bytes(4, "big") + req
            for _ in range(33):
                out += [h2_frame(1, 0x4, sid, hpack_request()), h2_frame(0, 0x1, sid, msg),
                        h2_frame(3, 0, sid, (8).to_bytes(4, "big"))]  # RST_STREAM CANCEL
                sid += 2
        elif p == "settings":  # CVE-2019-9515
            entry = (4).to_bytes(2, "big") + (65535).to_bytes(4, "big")
            out = [h2_frame(4, 0, 0, entry * 6)] * 100
        elif p == "ping":  # CVE-2019-9512
            out = [h2_frame(6, 0, 0, b"\x01" * 8)] * 100
        elif p == "continuation":  # CVE-2024-27316 and kin: a header block that never ends
            out = [h2_frame(1, 0, sid, hpack_request())]
            out += [h2_frame(9, 0, sid, b"\x00\x01x\x01y")] * 99
            sid += 2
        elif p == "empty_data":  # CVE-2019-9518: an open call fed empty DATA frames
            out = [h2_frame(1, 0x4, sid, hpack_request())] + [h2_frame(0, 0, sid)] * 99
            sid += 2
        elif p == "window_update":  # tiny WINDOW_UPDATEs on the connection and a stream
            out = [h2_frame(1, 0x4, sid, hpack_request())]
            out += [h2_frame(8, 0, 0 if i % 2 else sid, (1).to_bytes(4, "big")) for i in range(99)]
            sid += 2
        elif p == "priority":  # PRIORITY frames for a stream that never opens
            out = [h2_frame(2, 0, sid, (0).to_bytes(4, "big") + b"\x10")] * 100
        elif p == "unknown_type":  # frames of an unassigned type, which HTTP/2 ignores
            out = [h2_frame(0xfa, 0, 0, b"")] * 100
        self.frames += len(out)
        return b"".join(out), sid

    def polite(self, seconds, rate):
        """Frames that carry nothing at rate a second (a third each empty DATA on an
        open call, WINDOW_UPDATE of 1, PING); 1 if the server ended the connection."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=2)
        done = threading.Event()
        rt = threading.Thread(target=self._reader, args=(s, done), daemon=True)
        rt.start()
        closed = 0
        try:
            s.sendall(H2_PREFACE + h2_frame(4, 0, 0) + h2_frame(1, 0x4, 1, hpack_request()))
            kinds = [h2_frame(0, 0, 1), h2_frame(8, 0, 0, (1).to_bytes(4, "big")),
                     h2_frame(6, 0, 0, b"\x02" * 8)]
            t0, i = time.time(), 0
            while time.time() - t0 < seconds:
                s.sendall(kinds[i % 3])
                i += 1
                time.sleep(max(0.0, t0 + i / rate - time.time()))
            self.frames += i
            time.sleep(0.3)
            s.sendall(h2_frame(6, 0, 0, b"\x03" * 8))
            time.sleep(0.3)
        except OSError:
            closed = 1
        done.set()
        rt.join(5)
        s.close()
        return closed or int(bool(self.goaway))

    def run(self, seconds):
        t_end = time.time() + seconds
        while time.time() < t_end:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            self.conns += 1
            self.ports.add(s.getsockname()[1])
            done = threading.Event()
            rt = threading.Thread(target=self._reader, args=(s, done), daemon=True) if self.reads else None
            if rt:
                rt.start()
            try:
                s.sendall(H2_PREFACE + h2_frame(4, 0, 0))
                sid = 1
                while time.time() < t_end:
                    data, sid = self.burst(sid)
                    s.sendall(data)
            except OSError:  # reset, broken pipe, or a send blocked for 2 s
                self.closed += 1
            done.set()
            if rt:
                rt.join(5)
            s.close()


ENHANCE_YOUR_CALM = 11
FLOOD_KEY = 'kiln_grpc_connections_closed_total{reason="frame_flood"}'
# the frame kind h2.c names for each pattern's frames that carry nothing
FLOOD_FRAME = {"empty_data": "empty_data", "window_update": "window_update", "priority": "priority",
               "unknown_type": "unknown_type", "ping": "ping", "settings": "settings"}
FLOOD_LINE = re.compile(r"ts=(\d+\.\d+) event=(grpc_frame_flood(?:_suppressed)?)( .*)")


def flood_log_figures(log, port_of):
    """The server's event=grpc_frame_flood lines (h2.c): how many, how many connections
    they account for (one each plus their suppressed counts), the smallest gap between two,
    and the lines whose peer is not an attacking connection, whose frame is not the kind its
    pattern sent, or whose counts cannot be the budget's (more than 1,000 frames charged)."""
    out = {"lines": 0, "summary_lines": 0, "accounted": 0, "min_gap_s": 1e9, "bad": [],
           "frames": {}}
    last = None
    for line in log.splitlines():
        m = FLOOD_LINE.search(line)
        if not m:
            continue
        ts, event, rest = float(m.group(1)), m.group(2), m.group(3)
        kv = dict(re.findall(r' (\w+)=("[^"]*"|\S+)', rest))
        if last is not None:
            out["min_gap_s"] = min(out["min_gap_s"], round(ts - last, 3))
        last = ts
        out["accounted"] += int(kv.get("suppressed", "-1"))
        if event.endswith("_suppressed"):
            out["summary_lines"] += 1
            continue
        out["lines"] += 1
        out["accounted"] += 1
        host, _, port = kv.get("peer", '""').strip('"').rpartition(":")
        # thousands of attacking connections reuse local ports from one pattern to the
        # next, so a port maps to every pattern that used it
        pats = port_of.get(int(port), set()) if host == "127.0.0.1" and port.isdigit() else set()
        frame = kv.get("frame")
        out["frames"][frame] = out["frames"].get(frame, 0) + 1
        if not any(FLOOD_FRAME.get(pt) == frame for pt in pats) or \
                not int(kv.get("frames", 0)) >= int(kv.get("charged", 0)) > 1000:
            out["bad"].append(line)
    return out


def friendly_h2_clients(grpc, port, predict, req, seconds):
    """Clients that must never trip the server's budget of frames that carry
    nothing: a bidirectional stream of many small messages (reflection's
    list_services, each answered), a channel idle for a while with aggressive
    keepalive PINGs, and a raw connection that sends empty DATA, WINDOW_UPDATEs
    and PINGs at 400 a second (below the 500 a second refill) for 5 s."""
    out = {}
    chan = grpc.insecure_channel(f"127.0.0.1:{port}")
    refl = chan.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo")
    n = 3000
    answers = sum(1 for _ in refl(iter([b"\x3a\x00"] * n), timeout=60))
    out.update(stream_messages=n, stream_answers=answers)
    chan.close()
    states = []
    chan = grpc.insecure_channel(f"127.0.0.1:{port}", options=[
        ("grpc.keepalive_time_ms", 100), ("grpc.keepalive_timeout_ms", 5000),
        ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_time_between_pings_ms", 100)])
    good = chan.unary_unary("/tensorflow.serving.PredictionService/Predict")
    check(good_predict_response(good(req, timeout=10)), "gRPC Predict answered badly")
    chan.subscribe(lambda s: states.append(s.name))
    time.sleep(max(2.0, seconds))
    check(good_predict_response(good(req, timeout=10)), "gRPC Predict answered badly after idling")
    out["keepalive_left_ready"] = any(s != "READY" for s in states[1:])
    chan.close()
    out["keepalive_interval_ms"] = 100
    # more such frames than the burst (1,000) in all, but slower than the refill
    a = H2Attacker(port, "polite")
    out["raw_polite_closed"] = a.polite(max(5.0, seconds), 400)
    out["raw_polite_frames"] = a.frames
    return out


def scenario_h2flood(kiln, work, long, seconds):
    """HTTP/2 abuse on the gRPC port while a normal client calls Predict."""
    try:
        import grpc
    except ImportError:
        print("SKIP: h2flood needs the grpcio package")
        return None
    each = seconds or (60 if long else 1.5)
    bound = 2.0
    patterns = ["rapid_reset", "settings", "ping", "continuation", "empty_data", "window_update",
                "priority", "unknown_type"]
    base = work / NAME
    base.mkdir()
    add_version(base, 1)
    gport = free_port()
    mon = work / "monitoring.config"
    mon.write_text('prometheus_config { enable: true path: "/metrics" }\n')
    srv = Server(kiln, base, work / "server.log", None, f"--port={gport}",
                 f"--monitoring_config_file={mon}")
    try:
        srv.wait_ready()
        chan = grpc.insecure_channel(f"127.0.0.1:{gport}")
        predict = chan.unary_unary("/tensorflow.serving.PredictionService/Predict")
        req = predict_request()
        check(good_predict_response(predict(req, timeout=10)), "gRPC Predict answered badly")
        check(srv.metric(FLOOD_KEY) == 0, f"{FLOOD_KEY} is not 0 before any flood")
        lat, bad = [], []
        halt = threading.Event()

        def normal():
            while not halt.is_set():
                t0 = time.time()
                try:
                    good = good_predict_response(predict(req, timeout=bound + 3))
                    why = "bad answer"
                except grpc.RpcError as e:
                    good, why = False, f"{e.code()} {e.details()}"
                dt = time.time() - t0
                lat.append(dt)
                if not good or dt > bound:
                    bad.append((round(dt, 3), why))
                time.sleep(0.05)
        nt = threading.Thread(target=normal, daemon=True)
        nt.start()

        def cpu_s():
            with open(f"/proc/{srv.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        fig = {"seconds_each": each, "bound_ms": bound * 1000, "patterns": {}}
        port_of = {}  # attacker's local port -> the patterns that used it
        attack_t0 = time.time()
        for p in patterns:
            a = H2Attacker(gport, p)
            c0, t0, m0 = cpu_s(), time.time(), srv.metric(FLOOD_KEY)
            a.run(each)
            wall = time.time() - t0
            fig["patterns"][p] = {"frames": a.frames, "connections": a.conns,
                                  "ended_by_server": a.closed + sum(a.goaway.values()),
                                  "goaway_codes": a.goaway,
                                  "closed_frame_flood": int(srv.metric(FLOOD_KEY) - m0),
                                  "server_cpu_cores": round((cpu_s() - c0) / wall, 2)}
            for port in a.ports:
                port_of.setdefault(port, set()).add(p)
            check(srv.proc.poll() is None, f"server died under {p}: {srv.logtext()}")
        attack_s = time.time() - attack_t0
        time.sleep(0.5)
        c0 = cpu_s()
        time.sleep(1.0)
        fig["idle_cpu_cores_after"] = round(cpu_s() - c0, 2)
        closed_before_friendly = srv.metric(FLOOD_KEY)
        fig["friendly"] = friendly_h2_clients(grpc, gport, predict, req, each)
        fig["friendly"]["closed_frame_flood"] = int(srv.metric(FLOOD_KEY) - closed_before_friendly)
        fig["flood_log"] = flood_log_figures(srv.logtext_all(), port_of)
        fig["flood_log"]["counter"] = int(srv.metric(FLOOD_KEY))
        halt.set()
        nt.join(10)
        chan.close()
        lat.sort()
        fig.update(normal_calls=len(lat), normal_bad=len(bad),
                   normal_p50_ms=round(1000 * lat[len(lat) // 2], 1),
                   normal_max_ms=round(1000 * lat[-1], 1))
        check(not bad, f"normal calls failed or slower than {bound} s: {bad[:5]} {fig}")
        check(len(lat) >= len(patterns) * each / 0.5, f"too few normal calls: {fig}")
        # the floods that are protocol abuse end the attacking connection
        for p in patterns:
            check(fig["patterns"][p]["ended_by_server"] > 0,
                  f"the server kept the {p} connection open: {fig}")
        # frames that carry nothing are Kiln's budget (h2.c, docs/GRPC.md): GOAWAY ENHANCE_YOUR_CALM
        # and each such connection is counted: at least every GOAWAY ENHANCE_YOUR_CALM read
        for p in ("empty_data", "window_update", "priority", "unknown_type"):
            pf = fig["patterns"][p]
            check(pf["goaway_codes"].get(ENHANCE_YOUR_CALM, 0) > 0,
                  f"no GOAWAY ENHANCE_YOUR_CALM for {p}: {fig}")
            check(pf["closed_frame_flood"] >= pf["goaway_codes"].get(ENHANCE_YOUR_CALM, 0),
                  f"{FLOOD_KEY} rose less than the GOAWAYs ENHANCE_YOUR_CALM read under {p}: {pf}")
        total_conns = sum(pf["connections"] for pf in fig["patterns"].values())
        fl = fig["flood_log"]
        check(0 < fl["counter"] <= total_conns,
              f"{FLOOD_KEY} {fl['counter']} for {total_conns} attacking connections: {fig}")
        check(fig["friendly"]["closed_frame_flood"] == 0,
              f"{FLOOD_KEY} rose while only friendly clients connected: {fig['friendly']}")
        # the log: a line per closed connection, at most one a second, the rest counted
        check(fl["lines"] >= 1, f"no event=grpc_frame_flood line in the log: {fl}")
        check(fl["accounted"] == fl["counter"],
              f"the log's lines and suppressed counts add up to {fl['accounted']}, the counter "
              f"to {fl['counter']}: {fl}")
        check(fl["min_gap_s"] >= 0.99, f"two flood log lines less than a second apart: {fl}")
        check(fl["lines"] <= attack_s + 2, f"{fl['lines']} flood log lines in {attack_s:.1f} s: {fl}")
        check(not fl["bad"], f"flood log lines with a wrong peer, frame or count: {fl['bad'][:3]}")
        fr = fig["friendly"]
        check(fr["stream_answers"] == fr["stream_messages"],
              f"a streaming call with many small messages was cut short: {fr}")
        check(not fr["keepalive_left_ready"],
              f"an idle channel sending keepalive PINGs was closed: {fr}")
        check(fr["raw_polite_closed"] == 0, f"a client within the budget was closed: {fr}")
        # nothing keeps spinning once the attack stops
        check(fig["idle_cpu_cores_after"] < 0.3, f"server still busy after the attack: {fig}")
        return fig
    finally:
        srv.stop()


SCENARIOS = {"load": scenario_load, "hotswap": scenario_hotswap, "overload": scenario_overload,
             "sigterm": scenario_sigterm,
             "badversion": scenario_badversion, "slowloris": scenario_slowloris,
             "diskfull": scenario_diskfull, "slowload": scenario_slowload,
             "h2flood": scenario_h2flood}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kiln")
    ap.add_argument("scenario", choices=[*SCENARIOS, "all"])
    ap.add_argument("--long", action="store_true", help="the long variant (docs/RELIABILITY.md)")
    ap.add_argument("--seconds", type=float, default=0, help="override the run time")
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
                print(f"SKIP: {name} (see the line above, or wrk is missing)")
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
