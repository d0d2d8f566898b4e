"""monitoring_overhead.py - what model monitoring costs `kiln serve`:
requests per second on the tabular MLP (tools/export_models.py's
tabular_mlp: float32 [batch, 64] -> score) with a reference profile in
the version folder, monitoring on (--enable_model_monitoring=true: 64
features binned per request, PSI/JS on every scrape) against off, driven
by wrk with one row per request (bench/serve/post.lua). The target (issue 19)
is at most 3 % fewer requests per second with monitoring on.

The method is built to resolve a few percent on a small machine: the
servers run on their own CPUs and wrk (and perf) on the others (taskset;
by default the first half of the CPUs for the servers, the rest for wrk);
each round is a pair: both servers are started fresh and warmed, then
measured for --duration seconds each, back to back, the order alternating
between rounds. Each round gives the paired change on/off of requests/s
and of the server's CPU time per request (user + system, from /proc); the
report is the median of the paired changes with a distribution-free
confidence interval (the sign test's: order statistics of the changes), so
slow drifts of the machine fall on both sides of each pair. It still
prints, as before, each measurement and the medians of each setting.

    /usr/bin/python3 bench/serve/monitoring_overhead.py [--duration 4] [--rounds 16]
        [--connections 16] [--threads 4] [--server-cpus 0] [--wrk-cpus 1] [--perf]
    /usr/bin/python3 bench/serve/monitoring_overhead.py --instructions [--instr-requests 300]
        [--cache-sim]

Needs wrk, taskset and the kiln binary ($KILN_BIN, default build/kiln); exports
the model with PyTorch into bench/models/tabular_mlp if missing. Not part
of `make test` (timings on a shared machine are noise; run it on a quiet
one).

--perf also samples the server with `perf record -e cpu-clock` during each
round (on and off alike, so perf's own cost falls on both) and reports the share of its CPU samples that fall in
the monitor's own functions (those `nm -l` places in src/serve/monitor/):
a figure that, unlike requests/s, does not move with the load of the rest
of the machine, since both sides of the ratio are the same process.

--instructions counts instead of timing: each server runs under valgrind's
callgrind (instrumentation switched on after a warm-up), is sent
--instr-requests identical requests one after another over one keep-alive
connection, and its instructions (all threads, user space) are counted over
exactly those requests. It prints instructions per request on and off and
their change, the functions whose instructions differ most, and the calls
per request to malloc and its family on and off (monitoring must add none:
the per-request path is allocation-free). Deterministic (repeated runs agree
within about 0.05%), so it works on a loaded machine; it needs valgrind, not
wrk. Valgrind emulates no AVX-512, so the bin plan (binplan.c) takes its
AVX2 path there; on a CPU with AVX-512 the monitor runs fewer instructions
than counted. Instructions are not time (cache misses, frequency), so the
requests/s figure is still the target's measure. --cache-sim adds callgrind's
cache model: the L1 and last-level misses per request on and off, and its
rough estimate of cycles (10 per L1 miss, 100 per last-level miss).
"""
import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
KILN = os.environ.get("KILN_BIN") or str(REPO / "build" / "kiln")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_model():
    d = REPO / "bench" / "models" / "tabular_mlp"
    if not (d / "model.onnx").exists():
        subprocess.run([sys.executable, str(REPO / "tools" / "export_models.py"), "--out",
                        str(d.parent), "--models", "tabular_mlp"], check=True)
    return d / "model.onnx"


def serve(base, monitoring, threads, cpus):
    port = free_port()
    cfg = base.parent / "prom.txt"
    cfg.write_text('prometheus_config: { enable: true, path: "/monitoring/prometheus/metrics" }\n')
    p = subprocess.Popen(pinned([KILN, "serve", f"--model_base_path={base}", "--model_name=mlp",
                          f"--rest_api_port={port}", "--rest_api_address=127.0.0.1", "--port=0",
                          f"--rest_api_num_threads={threads}", f"--monitoring_config_file={cfg}",
                          f"--enable_model_monitoring={'true' if monitoring else 'false'}"], cpus),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return p, port
        except OSError:
            time.sleep(0.1)
    p.kill()
    raise SystemExit("kiln serve did not become ready")


def cpu_seconds(pid):
    """User + system CPU time of a process so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(port, body, duration, conns, cpus):
    env = dict(os.environ, WRK_BODY=str(body))
    out = subprocess.run(pinned(["wrk", f"-t{min(conns, 4)}", f"-c{conns}", f"-d{duration:g}s",
                                 "--timeout", "30s", "-s",
                                 str(REPO / "bench" / "serve" / "post.lua"),
                                 f"http://127.0.0.1:{port}/v1/models/mlp:predict"], cpus),
                         env=env, capture_output=True, text=True, check=True).stdout
    line = next(l for l in out.splitlines() if l.startswith("WRKJSON "))
    r = json.loads(line[len("WRKJSON "):])
    if sum(r["errors"].values()):
        raise SystemExit(f"wrk saw errors: {r['errors']}")
    return r["requests"] / (r["duration_us"] / 1e6), r["requests"]


def monitor_symbols():
    """Names of the functions nm -l places in src/serve/monitor/."""
    out = subprocess.run(["nm", "-l", "--defined-only", KILN], capture_output=True, text=True,
                         check=True).stdout
    return {l.split()[2].split(".")[0] for l in out.splitlines()
            if "src/serve/monitor/" in l and len(l.split()) >= 3 and l.split()[1] in "tTwW"}


def perf_share(pid, seconds, symbols, tmp, cpus):
    """Share of the process's cpu-clock samples over `seconds` in `symbols`."""
    data = tmp / "perf.data"
    subprocess.run(pinned(["perf", "record", "-q", "-e", "cpu-clock", "-F", "499", "-p", str(pid),
                           "-o", str(data), "--", "sleep", f"{seconds:g}"], cpus), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rep = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--no-children", "-F",
                          "period,sym", "-t", "\t", "-q"], capture_output=True, text=True,
                         check=True).stdout
    total = mine = 0
    for line in rep.splitlines():
        parts = line.strip().split("\t")
        if len(parts) < 2 or not parts[0].strip().isdigit():
            continue
        n = int(parts[0])
        total += n
        name = parts[1].split("]", 1)[-1].strip().split(".")[0]
        if name in symbols:
            mine += n
    return mine / total if total else 0.0


MALLOC_FAMILY = {"malloc", "calloc", "realloc", "free", "aligned_alloc", "posix_memalign",
                 "memalign", "operator new(unsigned long)", "operator delete(void*)",
                 "operator delete(void*, unsigned long)"}


def parse_callgrind(path):
    """(total instructions, self instructions by function, calls by callee,
    totals of every event by name) of a callgrind output file (Ir first;
    names compressed as "(id) name")."""
    names, self_ir, calls = {}, {}, {}
    total, fn, cfn, skip, events, totals = 0, None, None, False, [], {}

    def name_of(rest):
        rest = rest.strip()
        if rest.startswith("("):
            i = rest.index(")")
            key, nm = rest[1:i], rest[i + 1:].strip()
            if nm:
                names[key] = nm
            return names.get(key, key)
        return rest

    with open(path) as f:
        for line in f:
            if line.startswith("fn="):
                fn = name_of(line[3:])
            elif line.startswith("cfn="):
                cfn = name_of(line[4:])
            elif line.startswith("calls="):
                calls[cfn] = calls.get(cfn, 0) + int(line[6:].split()[0])
                skip = True  # the next cost line is the call's inclusive cost
            elif line[:1].isdigit() or line[:1] in "+-*":
                if skip:
                    skip = False
                    continue
                parts = line.split()
                if len(parts) > 1 and fn is not None:
                    key = "(code without symbols, e.g. oneDNN's JIT)" if fn.startswith("0x") else fn
                    self_ir[key] = self_ir.get(key, 0) + int(parts[1])
            elif line.startswith("events:"):
                events = line.split(":", 1)[1].split()
            elif line.startswith(("totals:", "summary:")):
                vals = [int(v) for v in line.split(":", 1)[1].split()]
                total = vals[0]
                totals = dict(zip(events, vals))
    return total, self_ir, calls, totals


class Client:
    """One keep-alive HTTP/1.1 connection sending the same POST again and again."""

    def __init__(self, port, body):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.req = (f"POST /v1/models/mlp:predict HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                    ).encode() + body

    def send(self):
        self.sock.sendall(self.req)
        buf = b""
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise SystemExit("kiln serve closed the connection")
            buf += chunk
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                continue
            head = buf[:end].decode("latin-1")
            if not head.startswith("HTTP/1.1 200"):
                raise SystemExit(f"kiln serve answered: {head.splitlines()[0]}")
            length = next(int(l.split(":", 1)[1]) for l in head.split("\r\n")
                          if l.lower().startswith("content-length:"))
            while len(buf) < end + 4 + length:
                buf += self.sock.recv(65536)
            return


def count_instructions(base, monitoring, threads, body, requests, tmp, cache_sim=False):
    """Instructions of kiln serve (callgrind) over `requests` sequential requests,
    and the parse of its output (parse_callgrind)."""
    port = free_port()
    cfg = base.parent / "prom.txt"
    cfg.write_text('prometheus_config: { enable: true, path: "/monitoring/prometheus/metrics" }\n')
    out = tmp / f"callgrind.{'on' if monitoring else 'off'}"
    p = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no"]
                         + (["--cache-sim=yes"] if cache_sim else []) + [
                          f"--callgrind-out-file={out}.%p", KILN, "serve",
                          f"--model_base_path={base}", "--model_name=mlp",
                          f"--rest_api_port={port}", "--rest_api_address=127.0.0.1", "--port=0",
                          f"--rest_api_num_threads={threads}", f"--monitoring_config_file={cfg}",
                          f"--enable_model_monitoring={'true' if monitoring else 'false'}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(1200):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.25)
        else:
            raise SystemExit("kiln serve (under valgrind) did not become ready")
        c = Client(port, body.read_bytes())
        for _ in range(50):  # warm: first-request work (the monitor's state, plan caches)
            c.send()
        ctl = ["callgrind_control"]
        subprocess.run(ctl + ["-i", "on", str(p.pid)], check=True, capture_output=True)
        for _ in range(20):  # warm again, now instrumented (valgrind translates the code)
            c.send()
        time.sleep(0.5)
        subprocess.run(ctl + ["-z", str(p.pid)], check=True, capture_output=True)
        for _ in range(requests):
            c.send()
        time.sleep(0.5)  # the server's work after each reply (metrics) is done
        subprocess.run(ctl + ["-d", str(p.pid)], check=True, capture_output=True)
    finally:
        p.kill()
        p.wait()
    dumps = sorted(tmp.glob(f"{out.name}.{p.pid}.*"))
    if not dumps:
        raise SystemExit("callgrind wrote no dump")
    return parse_callgrind(dumps[-1])


def instructions_mode(a, base, body, tmp):
    res = {}
    for on in (True, False):
        res[on] = count_instructions(base, on, a.threads, body, a.instr_requests, tmp, a.cache_sim)
        print(f"monitoring {'on ' if on else 'off'}: {res[on][0] / a.instr_requests:,.0f} "
              f"instructions per request", flush=True)
    n = a.instr_requests
    (ton, son, con, eon), (toff, soff, coff, eoff) = res[True], res[False]
    change = 100 * (ton / toff - 1)
    print(f"instructions per request with monitoring on: {(ton - toff) / n:+,.0f} ({change:+.2f}%), "
          f"counted by callgrind over {n} requests (valgrind has no AVX-512: the bin plan takes "
          "its AVX2 path, or the portable one in builds without it)")
    print("functions whose instructions per request differ most (self, on - off):")
    for k in sorted(set(son) | set(soff), key=lambda k: -abs(son.get(k, 0) - soff.get(k, 0)))[:12]:
        d = (son.get(k, 0) - soff.get(k, 0)) / n
        if abs(d) >= 1:
            print(f"  {d:+9.1f}  {k}")
    allocs = {on: {k: round(v / n, 2) for k, v in sorted(c.items()) if k in MALLOC_FAMILY}
              for on, c in ((True, con), (False, coff))}
    print(f"malloc family calls per request: on {allocs[True]}, off {allocs[False]} (a few calls "
          "in the whole window, such as the model poll's, show as hundredths)")
    extra = {k: round(allocs[True].get(k, 0) - allocs[False].get(k, 0), 2)
             for k in set(allocs[True]) | set(allocs[False])}
    misses = {}
    if a.cache_sim:  # callgrind's cache model: L1 and last-level misses per request
        misses = {k: round((eon.get(k, 0) - eoff.get(k, 0)) / n, 1)
                  for k in ("I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")}

        def cycles(e, ton_):  # callgrind_annotate's estimate: 10 per L1 miss, 100 per LL miss
            return ton_ + 10 * (e.get("I1mr", 0) + e.get("D1mr", 0) + e.get("D1mw", 0)) + 100 * (
                e.get("ILmr", 0) + e.get("DLmr", 0) + e.get("DLmw", 0))
        misses["estimated_cycles_change_percent"] = round(100 * (cycles(eon, ton) / cycles(eoff, toff) - 1), 2)
        print(f"cache misses per request, on - off (callgrind's cache model): {misses}")
    print(json.dumps({"model": "tabular_mlp", "requests": n, **({"cache": misses} if misses else {}),
                      "instructions_per_request_on": round(ton / n),
                      "instructions_per_request_off": round(toff / n),
                      "instructions_change_percent": round(change, 2),
                      "malloc_family_calls_per_request_on_minus_off": extra}))


def sign_test_ci(xs, level=0.95):
    """Distribution-free confidence interval of the median of xs from the
    order statistics (the sign test's interval): [x_(k), x_(n+1-k)] with the
    largest k whose coverage, 1 - 2 P(Binomial(n, 1/2) < k), is at least
    `level`; with too few values, [min, max] and its (lower) coverage.
    Returns (lo, hi, coverage)."""
    x = sorted(xs)
    n = len(x)
    cdf, acc = [], 0.0  # cdf[j] = P(B <= j)
    for j in range(n + 1):
        acc += math.comb(n, j) / 2 ** n
        cdf.append(acc)
    k = 1
    while k + 1 <= (n + 1) // 2 and 1 - 2 * cdf[k] >= level:  # k + 1 still covers
        k += 1
    return x[k - 1], x[n - k], 1 - 2 * cdf[k - 1]


def cpu_list(spec):
    """taskset's CPU list ("0", "0-3", "1,3") as a set; empty for "none"."""
    if spec in ("", "none"):
        return set()
    cpus = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def pinned(cmd, cpus):
    return (["taskset", "-c", ",".join(map(str, sorted(cpus)))] + cmd) if cpus else cmd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=4, help="seconds of wrk per measurement")
    ap.add_argument("--rounds", type=int, default=16, help="pairs of measurements (on and off)")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--threads", type=int, default=4, help="the server's REST threads")
    avail = sorted(os.sched_getaffinity(0))
    half = max(1, len(avail) // 2)
    ap.add_argument("--server-cpus", default=",".join(map(str, avail[:half])) if len(avail) > 1 else "none",
                    help="CPUs the servers run on (taskset -c list; 'none': not pinned); default: "
                         "the first half of this process's CPUs")
    ap.add_argument("--wrk-cpus", default=",".join(map(str, avail[half:])) if len(avail) > 1 else "none",
                    help="CPUs wrk (and perf) run on; default: the other half")
    ap.add_argument("--perf", action="store_true",
                    help="sample the server with perf and report the monitor's share of its CPU")
    ap.add_argument("--instructions", action="store_true",
                    help="count the server's instructions per request on and off (callgrind) "
                         "instead of timing it")
    ap.add_argument("--instr-requests", type=int, default=300,
                    help="requests counted per setting with --instructions")
    ap.add_argument("--cache-sim", action="store_true",
                    help="with --instructions: also callgrind's cache model (L1 and last-level "
                         "misses per request, and its estimate of cycles)")
    a = ap.parse_args()
    server_cpus, wrk_cpus = cpu_list(a.server_cpus), cpu_list(a.wrk_cpus)
    if server_cpus & wrk_cpus:
        raise SystemExit(f"--server-cpus {a.server_cpus} and --wrk-cpus {a.wrk_cpus} overlap")
    symbols = monitor_symbols() if a.perf else set()
    model = ensure_model()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = tmp / "mlp"
        (base / "1" / "assets.extra").mkdir(parents=True)
        (base / "1" / "model.onnx").write_bytes(model.read_bytes())
        rng = np.random.default_rng(0)
        (tmp / "ref").mkdir()
        np.save(tmp / "ref" / "features.npy", rng.standard_normal((2000, 64)).astype(np.float32))
        subprocess.run([KILN, "profile", str(model), "--data", str(tmp / "ref"), "-o",
                        str(base / "1" / "assets.extra" / "kiln_profile.json")], check=True)
        body = tmp / "body.json"
        body.write_text(json.dumps({"instances": [rng.standard_normal(64).astype(np.float32).tolist()]}))
        if a.instructions:
            instructions_mode(a, base, body, tmp)
            return
        rates = {True: [], False: []}
        cpu_us = {True: [], False: []}  # server CPU per request: less noisy on a busy machine
        shares = []
        for rnd in range(a.rounds):
            # a pair: both servers started (fresh, so layout luck varies between pairs) and
            # warmed, then measured back to back, the order alternating between pairs
            procs, got = {}, {}
            try:
                for on in (True, False):
                    procs[on] = serve(base, on, a.threads, server_cpus)
                    wrk(procs[on][1], body, 1, a.connections, wrk_cpus)  # warm up
                for on in ((True, False) if rnd % 2 == 0 else (False, True)):
                    p, port = procs[on]
                    c0 = cpu_seconds(p.pid)
                    if a.perf:  # both settings sampled alike, so perf's own cost cancels
                        res = {}
                        t = threading.Thread(target=lambda: res.update(share=perf_share(
                            p.pid, max(1, a.duration - 1), symbols, tmp, wrk_cpus)))
                        t.start()
                    rate, n = wrk(port, body, a.duration, a.connections, wrk_cpus)
                    if a.perf:
                        t.join()
                    if n == 0:  # a machine too busy to finish a request
                        print(f"round {rnd + 1}: monitoring {'on ' if on else 'off'}: no request "
                              f"finished in {a.duration:g} s; the round is left out", flush=True)
                        break
                    got[on] = (rate, (cpu_seconds(p.pid) - c0) / n * 1e6, res.get("share") if a.perf else None)
                    if on:  # the monitor really ran: 64 features with values in the window
                        with urllib.request.urlopen(
                                f"http://127.0.0.1:{port}/monitoring/prometheus/metrics") as r:
                            counts = [float(l.rsplit(" ", 1)[1]) for l in r.read().decode().splitlines()
                                      if l.startswith("kiln_drift_window_values{")]
                        assert len(counts) == 64 and min(counts) > 0, counts
                    print(f"round {rnd + 1}: monitoring {'on ' if on else 'off'} {got[on][0]:.0f} req/s, "
                          f"{got[on][1]:.1f} us server CPU per request"
                          + (f", monitor {100 * got[on][2]:.2f}% of server CPU samples"
                             if a.perf and on else ""), flush=True)
            finally:
                for p, _ in procs.values():
                    p.kill()
                    p.wait()
            if len(got) < 2:
                continue
            for on in (True, False):
                rates[on].append(got[on][0])
                cpu_us[on].append(got[on][1])
            if a.perf:
                shares.append(got[True][2])
            print(f"round {rnd + 1}: on/off {100 * (rates[True][-1] / rates[False][-1] - 1):+.2f}% req/s, "
                  f"{100 * (cpu_us[True][-1] / cpu_us[False][-1] - 1):+.2f}% server CPU per request",
                  flush=True)
    if not rates[True]:
        raise SystemExit("no round finished: the machine is too busy")
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    # paired per round: the two measurements of a pair ran seconds apart, so the machine's
    # slow drifts (other work, thermal, frequency) fall on both
    rate_change = [100 * (x / y - 1) for x, y in zip(rates[True], rates[False])]
    cpu_change = [100 * (x / y - 1) for x, y in zip(cpu_us[True], cpu_us[False])]
    rlo, rhi, level = sign_test_ci(rate_change)
    clo, chi, _ = sign_test_ci(cpu_change)
    # judged only on an interval of at least 95% (6 rounds or more)
    verdict = ("inconclusive (too few rounds)" if level < 0.95 else
               "met" if rlo > -3 else "not met" if rhi < -3 else "inconclusive")
    print(f"paired over {len(rate_change)} rounds: requests/s with monitoring on {statistics.median(rate_change):+.2f}% "
          f"(median; {100 * level:.1f}% CI {rlo:+.2f}% .. {rhi:+.2f}%), server CPU per request "
          f"{statistics.median(cpu_change):+.2f}% ({clo:+.2f}% .. {chi:+.2f}%); target >= -3% req/s: "
          f"{verdict}", flush=True)
    print(json.dumps({"model": "tabular_mlp", "connections": a.connections, "duration_s": a.duration,
                      "rounds": len(rate_change), "req_per_s_on": round(on), "req_per_s_off": round(off),
                      "change_percent": round(100 * (on - off) / off, 2),
                      "server_cpu_us_per_request_on": round(statistics.median(cpu_us[True]), 2),
                      "server_cpu_us_per_request_off": round(statistics.median(cpu_us[False]), 2),
                      **({"monitor_share_of_server_cpu_percent":
                          round(100 * statistics.median(shares), 2)} if a.perf else {}),
                      "server_cpus": a.server_cpus, "wrk_cpus": a.wrk_cpus,
                      "paired_change_percent_median": round(statistics.median(rate_change), 2),
                      "paired_change_percent_ci": [round(rlo, 2), round(rhi, 2)],
                      "ci_level": round(level, 4),
                      "paired_server_cpu_change_percent_median": round(statistics.median(cpu_change), 2),
                      "paired_server_cpu_change_percent_ci": [round(clo, 2), round(chi, 2)],
                      "target_minus_3_percent": verdict}))


if __name__ == "__main__":
    main()
