"""test_dashboards.py - the shipped dashboard and Prometheus rules, evaluated by
a real Prometheus scraping a real `kiln serve` on loopback (docs/DASHBOARDS.md).

The server serves two versions of one model (version 1 light, version 2
heavier, so their latencies differ) with batching on. Prometheus scrapes it
every second with the `kiln` job of deploy/prometheus/prometheus.yml and
loads deploy/prometheus/kiln-rules.yml. The test sends a bounded, known mix
of requests: successes to both versions, invalid inputs to both (they reach
a version and fail), and requests for a version that does not exist. Then
every expression of deploy/grafana/kiln.json (panels, annotations, template
variables) and every recording and alert rule is evaluated through
Prometheus's HTTP query API, at the timestamp of the first scrape after the
traffic, over a window that starts exactly at the last scrape before it, so
that rate() and increase() see exactly the test's requests (no
extrapolation: both ends of the window are samples). Then:

- every expression parses, and names only metrics that Kiln exports or that
  the metric plan of the rollout, shadow, monitoring and request log work
  defines (a misspelled name would otherwise just return nothing);
- an expression over metrics the server exports returns series, and the
  values the test knows are asserted: request rates per version (count /
  window), error ratio = failed / all, errors by code, observed traffic share,
  p50/p90/p99 per version equal to histogram_quantile computed here from the
  bucket counts on the server's own page before and after the traffic, and
  bounded by facts from outside the server: at most the bucket of the
  latency the client measured for the same rank, at least the bucket of the
  batch timeout every successful request waits; batch counts and sizes,
  queue time, memory against /proc, versions available;
- an expression over metrics not exported yet returns nothing (the list is
  printed); after the other parts of the metric plan land, the same
  expressions must return series;
- the live Prometheus reports every rule healthy and KilnErrorRateHigh
  pending for the model (its error ratio is far above 1 %);
- the Kubernetes pod discovery example (prometheus-kubernetes.yml) relabels a
  pod with Kiln's labels and annotations into the right scrape URL (replayed
  through file discovery with the same __meta labels; Debian's Prometheus is
  built without Kubernetes discovery).

Skips (with the reason) when `prometheus` is not installed
(scripts/install-deps.sh installs Debian's package).
"""

import http.client
import json
import math
import os
import random
import re
import shutil
import subprocess
import time
import urllib.parse
from pathlib import Path

import numpy as np
import pytest

yaml = pytest.importorskip("yaml")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import test_serve  # noqa: E402
from test_serve import KILN, free_port  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PROM_DIR = REPO / "deploy" / "prometheus"
DASHBOARD = REPO / "deploy" / "grafana" / "kiln.json"
PROMETHEUS = shutil.which("prometheus")
METRICS_PATH = "/monitoring/prometheus/metrics"
MODEL = "dash"
WIDTH = 256

pytestmark = [
    test_serve.pytestmark,
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (Debian's "
                       "`prometheus` package; scripts/install-deps.sh installs it)"),
]

# The metric plan of issue 19 (rollout, shadow, monitoring, request log): the
# names the dashboard and rules may use before the server exports them.
PLANNED = {
    "kiln_rollout_requests_total", "kiln_rollout_weight", "kiln_rollout_step", "kiln_rollout_state",
    "kiln_rollout_events_total", "kiln_shadow_requests_total", "kiln_shadow_queue_depth",
    "kiln_shadow_top1_agreement", "kiln_shadow_mean_abs_diff", "kiln_shadow_js_divergence",
    "kiln_shadow_added_latency_us", "kiln_drift_psi", "kiln_drift_js", "kiln_drift_linf",
    "kiln_drift_alert", "kiln_feature_anomalies_total", "kiln_expected_accuracy",
    "kiln_validation_rejections_total", "kiln_request_log_records_total",
    "kiln_request_log_dropped_total", "kiln_request_log_disk_bytes",
} | {f"kiln_prediction_{h}_{s}" for h in ("max_probability", "margin", "entropy")
     for s in ("bucket", "sum", "count")}

# Traffic: successes and invalid inputs per version, and requests for a missing version.
N_OK = {"1": 80, "2": 40}
N_BAD = {"1": 6, "2": 4}
N_MISSING = 5
MISSING_VERSION = 9
BATCH_TIMEOUT_US = 25000


# ------------------------------------------------------------------ models


def save_chain(path, depth, seed):
    """y = tanh(...tanh(x W)... W), depth MatMul+Tanh layers over float32 [batch, WIDTH]."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((WIDTH, WIDTH)) / math.sqrt(WIDTH)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])
    nodes, prev = [], "x"
    for i in range(depth):
        out = "y" if i == depth - 1 else f"t{i}"
        nodes += [helper.make_node("MatMul", [prev, "w"], [f"m{i}"]),
                  helper.make_node("Tanh", [f"m{i}"], [out])]
        prev = out
    g = helper.make_graph(nodes, "chain", [x], [y], [numpy_helper.from_array(w, "w")])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


# ------------------------------------------------------------------ Prometheus text and PromQL helpers


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_page(text):
    """{(name, frozenset(labels.items())): value} of a Prometheus text page."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, f"unparsable metrics line {line!r}"
        labels = frozenset(LABEL.findall(m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def series(page, name, **match):
    """[(labels dict, value)] of the page's series `name` whose labels include match."""
    res = []
    for (n, labels), v in page.items():
        d = dict(labels)
        if n == name and all(d.get(k) == str(x) for k, x in match.items()):
            res.append((d, v))
    return res


def histogram_quantile(q, buckets):
    """Prometheus's histogram_quantile (promql/quantile.go) over [(le, count)]: the
    independent reference the dashboard's quantiles are held to."""
    b = sorted(buckets)
    assert b and math.isinf(b[-1][0]), "no +Inf bucket"
    counts = [c for _, c in b]
    for i in range(1, len(counts)):  # ensureMonotonic
        counts[i] = max(counts[i], counts[i - 1])
    total = counts[-1]
    if total == 0:
        return math.nan
    rank = q * total
    i = next(k for k, c in enumerate(counts[:-1] + [counts[-1]]) if c >= rank)
    if i == len(b) - 1:
        return b[-2][0]
    if i == 0 and b[0][0] <= 0:
        return b[0][0]
    start, end, count = 0.0, b[i][0], counts[i]
    if i > 0:
        start = b[i - 1][0]
        count -= counts[i - 1]
        rank -= counts[i - 1]
    return start + (end - start) * (rank / count)


def bucket_deltas(before, after, name, **match):
    """{le: increase} of histogram `name` between two pages, summed over the other labels."""
    out = {}
    for labels, v in series(after, f"{name}_bucket", **match):
        le = float(labels["le"])
        prev = before.get((f"{name}_bucket", frozenset(labels.items())), 0.0)
        out[le] = out.get(le, 0.0) + v - prev
    return sorted(out.items())


def bucket_of(bounds, v):
    """Index of the histogram bucket (upper bounds, +Inf last) holding v."""
    return next(i for i, le in enumerate(bounds) if v <= le)


KEYWORDS = {"and", "or", "unless", "bool", "by", "without", "on", "ignoring", "group_left",
            "group_right", "offset", "inf", "nan", "Inf", "NaN"}


def metric_names(expr):
    """The metric names an expression selects (strings, matchers, ranges, grouping lists removed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\boffset\s+\w+", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:]|\s*\()", e):
        if m.group(1) not in KEYWORDS:
            names.add(m.group(1))
    return names


class Prom:
    """A Prometheus server on a free loopback port, with its TSDB in a temp folder."""

    def __init__(self, tmp, config):
        self.port = free_port()
        cfg = tmp / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log = open(tmp / "prometheus.log", "w+")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while True:
            assert self.proc.poll() is None, "prometheus exited: " + self.logtext()
            try:
                if self.get("/-/ready")[0] == 200:
                    return
            except OSError:
                pass
            assert time.time() < deadline, "prometheus not ready in 60 s: " + self.logtext()
            time.sleep(0.2)

    def logtext(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def get(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def api(self, path, **params):
        code, body = self.get(f"/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}")
        return code, json.loads(body)

    def query(self, expr, at):
        """Instant query at time `at` (seconds): the result vector; fails on any error."""
        code, body = self.api("query", query=expr, time=f"{at:.3f}")
        assert code == 200 and body.get("status") == "success", f"{expr}\n-> {code} {body}"
        assert body["data"]["resultType"] in ("vector", "scalar"), expr
        return body["data"]["result"]

    def kill(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()


class ConfigServer(test_serve.Server):
    """kiln serve from a model config file, batching on, the Prometheus page on."""

    def __init__(self, tmp, config, batching):  # noqa: D107 (overrides the base constructor)
        self.port = free_port()
        self.log = open(tmp / "kiln.log", "w+")
        mon = tmp / "monitoring.config"
        mon.write_text(f'prometheus_config {{ enable: true path: "{METRICS_PATH}" }}\n')
        self.proc = subprocess.Popen(
            [KILN, "serve", f"--model_config_file={config}", f"--rest_api_port={self.port}",
             "--rest_api_address=127.0.0.1", "--rest_api_num_threads=4",
             f"--monitoring_config_file={mon}", "--enable_batching=true",
             f"--batching_parameters_file={batching}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_ready()

    def page(self):
        code, body, _ = self.request("GET", METRICS_PATH)
        assert code == 200, body
        return parse_page(body.decode())


# ------------------------------------------------------------------ the scenario


def prometheus_config(kiln_port, rules, sd_file):
    """deploy/prometheus's `kiln` job scraping the test's server every second with
    Kiln's rules, plus the Kubernetes example's relabeling over file discovery."""
    shipped = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    job = next(j for j in shipped["scrape_configs"] if j["job_name"] == "kiln")
    job = dict(job, scrape_interval="1s", scrape_timeout="1s",
               static_configs=[{"targets": [f"127.0.0.1:{kiln_port}"]}])
    k8s = yaml.safe_load((PROM_DIR / "prometheus-kubernetes.yml").read_text())
    kjob = next(j for j in k8s["scrape_configs"] if j["job_name"] == "kiln")
    kjob = {k: v for k, v in kjob.items() if k != "kubernetes_sd_configs"}
    kjob.update(job_name="kiln-kubernetes", scrape_interval="1s", scrape_timeout="1s",
                file_sd_configs=[{"files": [str(sd_file)], "refresh_interval": "1s"}],
                # only `up` is kept: the scraped series would double the `kiln` job's
                metric_relabel_configs=[{"source_labels": ["__name__"], "regex": ".+",
                                         "action": "drop"}])
    return {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)], "scrape_configs": [job, kjob]}


def pod_targets(kiln_port):
    """File discovery targets carrying the __meta labels Kubernetes pod discovery sets."""
    def pod(name, app, phase, scrape="true"):
        return {"targets": ["127.0.0.1"], "labels": {
            "__meta_kubernetes_namespace": "serving", "__meta_kubernetes_pod_name": name,
            "__meta_kubernetes_pod_phase": phase,
            "__meta_kubernetes_pod_label_app_kubernetes_io_name": app,
            "__meta_kubernetes_pod_annotation_prometheus_io_scrape": scrape,
            "__meta_kubernetes_pod_annotation_prometheus_io_port": str(kiln_port),
            "__meta_kubernetes_pod_annotation_prometheus_io_path": METRICS_PATH}}
    return [pod("kiln-0", "kiln", "Running"), pod("other-0", "other", "Running"),
            pod("kiln-1", "kiln", "Pending"), pod("kiln-2", "kiln", "Running", scrape="false")]


def wait_for(what, fn, timeout=30):
    deadline = time.time() + timeout
    while True:
        v = fn()
        if v:
            return v
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def last_sample(prom, expr, want):
    """Timestamp (s, ms precision) of the latest scrape in which the series expr == want.
    One range query gives each sample with its own timestamp: two instant queries (the
    timestamp, then the value) could straddle a scrape and pair a scrape taken during the
    traffic with the value of the one after it."""
    def probe():
        code, body = prom.api("query", query=f"{expr}[10s]", time=f"{time.time():.3f}")
        assert code == 200 and body.get("status") == "success", f"{expr}\n-> {code} {body}"
        r = body["data"]["result"]
        if len(r) == 1 and r[0]["values"] and float(r[0]["values"][-1][1]) == want:
            return float(r[0]["values"][-1][0])
        return None
    return wait_for(f"a scrape with {expr} == {want}", probe)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dash")
    save_chain(tmp / MODEL / "1" / "model.onnx", depth=2, seed=1)
    save_chain(tmp / MODEL / "2" / "model.onnx", depth=8, seed=2)
    config = tmp / "models.config"
    config.write_text(f"model_config_list {{ config {{ name: '{MODEL}' base_path: '{tmp / MODEL}' "
                      "model_platform: 'onnx' model_version_policy { all {} } } }\n")
    batching = tmp / "batching.config"
    # a request alone waits the whole batch timeout: every successful request takes at
    # least BATCH_TIMEOUT_US on the server, well inside one latency bucket
    batching.write_text(f"max_batch_size {{ value: 8 }}\nbatch_timeout_micros {{ value: {BATCH_TIMEOUT_US} }}\n"
                        "num_batch_threads { value: 2 }\n")
    kiln = ConfigServer(tmp, config, batching)
    prom = None
    try:
        rng = np.random.default_rng(0)
        good = {"instances": rng.standard_normal((1, WIDTH)).round(3).tolist()}
        bad = {"instances": [[1.0, 2.0, 3.0]]}  # wrong width: INVALID_ARGUMENT from the version

        def send(version, body):
            t = time.perf_counter()
            code, data, _ = kiln.request("POST", f"/v1/models/{MODEL}/versions/{version}:predict", body)
            return code, (time.perf_counter() - t) * 1e6, data

        def wait_available():
            code, body = kiln.json("GET", f"/v1/models/{MODEL}")
            return code == 200 and sorted(v["version"] for v in body["model_version_status"]
                                          if v["state"] == "AVAILABLE") == ["1", "2"]
        wait_for("versions 1 and 2 available", wait_available, 60)

        # warm-up: every series the window will count exists before it starts
        for v in N_OK:
            assert send(v, good)[0] == 200
            assert send(v, bad)[0] == 400
        assert send(MISSING_VERSION, good)[0] == 404

        sd_file = tmp / "pods.json"
        sd_file.write_text(json.dumps(pod_targets(kiln.port)))
        prom = Prom(tmp, prometheus_config(kiln.port, PROM_DIR / "kiln-rules.yml", sd_file))

        before = kiln.page()
        # one raw series (timestamp() of an aggregation is the evaluation time, not the scrape's)
        ok_expr = f':tensorflow:serving:request_count{{model_name="{MODEL}",status="OK"}}'
        t0 = last_sample(prom, ok_expr, series(before, ":tensorflow:serving:request_count",
                                               model_name=MODEL, status="OK")[0][1])

        plan = ([(v, "ok") for v, n in N_OK.items() for _ in range(n)] +
                [(v, "bad") for v, n in N_BAD.items() for _ in range(n)] +
                [(str(MISSING_VERSION), "missing")] * N_MISSING)
        random.Random(19).shuffle(plan)
        latencies = {v: [] for v in N_OK}
        for v, kind in plan:
            code, us, data = send(v, bad if kind == "bad" else good)
            assert code == {"ok": 200, "bad": 400, "missing": 404}[kind], data
            if v in latencies:
                latencies[v].append(us)
        after = kiln.page()
        rss = int(Path(f"/proc/{kiln.proc.pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        def count(page):
            return sum(v for _, v in series(page, ":tensorflow:serving:request_count",
                                            model_name=MODEL))
        assert count(after) - count(before) == len(plan)
        t1 = last_sample(prom, ok_expr, series(after, ":tensorflow:serving:request_count",
                                               model_name=MODEL, status="OK")[0][1])
        yield dict(kiln=kiln, prom=prom, before=before, after=after, t0=t0, t1=t1,
                   window_ms=round((t1 - t0) * 1000), latencies=latencies, rss=rss, tmp=tmp)
    finally:
        if prom:
            prom.kill()
        kiln.kill()


# ------------------------------------------------------------------ expectations


def window_s(sc):
    return sc["window_ms"] / 1000.0


def by(result, *labels):
    """{label values: float value} of a query result."""
    out = {}
    for r in result:
        key = tuple(r["metric"].get(k) for k in labels)
        assert key not in out, f"duplicate series {key} in {result}"
        out[key] = float(r["value"][1])
    return out


def close(a, b, rel=1e-9, abs_=1e-9):
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def n_version(v):
    return N_OK[v] + N_BAD[v]


N_ERRORS = sum(N_BAD.values()) + N_MISSING
N_TOTAL = sum(N_OK.values()) + N_ERRORS


def expect_version_rates(sc, result):
    got = by(result, "model_name", "version")
    assert set(got) == {(MODEL, v) for v in N_OK}, got
    for v in N_OK:
        assert close(got[(MODEL, v)] * window_s(sc), n_version(v), 1e-6), (v, got)


def expect_share(sc, result):
    got = by(result, "model_name", "version")
    assert set(got) == {(MODEL, v) for v in N_OK}, got
    for v in N_OK:
        assert close(got[(MODEL, v)], n_version(v) / sum(map(n_version, N_OK)), 1e-6), (v, got)


def expect_error_ratio(sc, result):
    got = by(result, "model_name")
    assert set(got) == {(MODEL,)}, got
    assert close(got[(MODEL,)], N_ERRORS / N_TOTAL, 1e-6), got


def expect_model_rate(count):
    def check(sc, result):
        got = by(result, "model_name")
        assert set(got) == {(MODEL,)}, got
        assert close(got[(MODEL,)] * window_s(sc), count, 1e-6), got
    return check


def expect_errors_by_code(sc, result):
    got = by(result, "model_name", "code")
    want = {(MODEL, "INVALID_ARGUMENT"): sum(N_BAD.values()), (MODEL, "NOT_FOUND"): N_MISSING}
    assert set(got) == set(want), got
    for k, n in want.items():
        assert close(got[k] * window_s(sc), n, 1e-6), (k, got)


def check_client_bucket(sc, q, v, got):
    """Bounds on a latency quantile that do not come from the server. Above: the server's
    latency of each request is at most the latency the client measured, so the server's
    k-th smallest is at most the client's, and the quantile is at most the upper bound of
    the bucket holding the client's. Below: each successful request waited the whole batch
    timeout on the server, and the rank lies past the few (fast) invalid requests, so the
    quantile is at least the lower bound of the bucket holding the timeout."""
    bounds = [le for le, _ in bucket_deltas(sc["before"], sc["after"], "kiln_request_latency_us",
                                            model_name=MODEL, version=v)]
    lat = sorted(sc["latencies"][v])
    k = math.ceil(q * len(lat))
    assert k > N_BAD[v]
    client = lat[k - 1]
    hi = bucket_of(bounds, client)
    lo = bucket_of(bounds, BATCH_TIMEOUT_US)
    lower = bounds[lo - 1] if lo > 0 else 0.0
    assert lower <= got <= bounds[hi], (
        f"v{v} q{q}: Prometheus {got:.0f} µs, client {client:.0f} µs, bounds ({lower}, {bounds[hi]}]")


def expect_latency_quantile(q, metric="kiln_request_latency_us", client=True):
    def check(sc, result):
        got = by(result, "model_name", "version")
        assert set(got) == {(MODEL, v) for v in N_OK}, got
        for v in N_OK:
            ref = histogram_quantile(q, bucket_deltas(sc["before"], sc["after"], metric,
                                                      model_name=MODEL, version=v))
            assert close(got[(MODEL, v)], ref, 1e-6), (q, v, got, ref)
            if client:
                check_client_bucket(sc, q, v, got[(MODEL, v)])
    return check


def expect_queue_quantile(q):
    """As the server's histogram says, and, independently, not below the bucket holding the
    batch timeout: a request alone in its batch waits all of it."""
    reference = expect_latency_quantile(q, "kiln_batch_queue_latency_us", False)

    def check(sc, result):
        reference(sc, result)
        for v in N_OK:
            bounds = [le for le, _ in bucket_deltas(sc["before"], sc["after"],
                                                    "kiln_batch_queue_latency_us",
                                                    model_name=MODEL, version=v)]
            lo = bucket_of(bounds, BATCH_TIMEOUT_US)
            got = by(result, "version")[(v,)]
            assert got >= (bounds[lo - 1] if lo > 0 else 0.0), (q, v, got)
    return check


def expect_batch_mean(sc, result):
    got = by(result, "model_name", "version")
    assert set(got) == {(MODEL, v) for v in N_OK}, got
    assert all(close(x, 1.0) for x in got.values()), got  # one request at a time


def expect_memory(sc, result):
    got = by(result, "instance")
    assert len(got) == 1, got
    (value,) = got.values()
    assert 0.75 * sc["rss"] <= value <= 1.25 * sc["rss"], (value, sc["rss"])


def expect_versions_available(sc, result):
    assert by(result, "model_name", "version") == {(MODEL, "1"): 1.0, (MODEL, "2"): 1.0}


def expect_zero(sc, result):
    assert result and all(float(r["value"][1]) == 0.0 for r in result), result


def expect_in_flight(sc, result):
    values = [float(r["value"][1]) for r in result]
    assert values and all(0 <= x <= 2 for x in values), result  # at most the two jobs' scrapes


# Dashboard panels (title, refId) whose values the test knows.
PANEL_EXPECT = {
    ("Requests per second by version", "A"): expect_version_rates,
    ("Error ratio by model", "A"): expect_error_ratio,
    ("Errors by code", "A"): expect_errors_by_code,
    ("Latency p50 / p90 / p99 by version", "A"): expect_latency_quantile(0.5),
    ("Latency p50 / p90 / p99 by version", "B"): expect_latency_quantile(0.9),
    ("Latency p50 / p90 / p99 by version", "C"): expect_latency_quantile(0.99),
    ("Traffic share (observed)", "A"): expect_share,
    ("Batch size (mean and p90)", "A"): expect_batch_mean,
    ("Batch size (mean and p90)", "B"): expect_latency_quantile(0.9, "kiln_batch_size", False),
    ("Batch queue time p50 / p99", "A"): expect_queue_quantile(0.5),
    ("Batch queue time p50 / p99", "B"): expect_queue_quantile(0.99),
    ("Batching queue refusals", "A"): expect_zero,
    ("Resident memory by replica", "A"): expect_memory,
    ("Requests in flight", "A"): expect_in_flight,
    ("Requests in flight", "B"): expect_zero,
    ("Versions available", "A"): expect_versions_available,
}

# Recording rules whose values the test knows.
RECORD_EXPECT = {
    "model_name_version:kiln_request_latency_us:p50_rate5m": expect_latency_quantile(0.5),
    "model_name_version:kiln_request_latency_us:p90_rate5m": expect_latency_quantile(0.9),
    "model_name_version:kiln_request_latency_us:p99_rate5m": expect_latency_quantile(0.99),
    "model_name_version:kiln_requests:rate5m": expect_version_rates,
    "model_name_version:kiln_request_share:rate5m": expect_share,
    "model_name:kiln_requests:rate5m": expect_model_rate(N_TOTAL),
    "model_name:kiln_request_errors:rate5m": expect_model_rate(N_ERRORS),
    "model_name:kiln_request_error_ratio:rate5m": expect_error_ratio,
    "model_name_version:kiln_batch_size:mean_rate5m": expect_batch_mean,
    "model_name_version:kiln_batch_queue_latency_us:p99_rate5m": expect_queue_quantile(0.99),
}


# ------------------------------------------------------------------ collecting expressions


def dashboard_exprs():
    """[(where, expr, key)] of every PromQL expression in the dashboard."""
    d = json.loads(DASHBOARD.read_text())
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((f"panel {p['title']!r} {t['refId']}", t["expr"], (p["title"], t["refId"])))
            walk(p.get("panels", []))
    walk(d["panels"])
    for a in d["annotations"]["list"]:
        if a.get("expr"):
            out.append((f"annotation {a['name']!r}", a["expr"], None))
    return out


def substitute_dashboard(expr, sc):
    w = f"{sc['window_ms']}ms"
    for var in ("$__rate_interval", "$__interval", "$__range"):
        expr = expr.replace(var, w)
    expr = expr.replace("$model", MODEL).replace("$version", ".*")
    assert "$" not in expr, f"unknown dashboard variable in {expr}"
    return expr


def rules():
    groups = yaml.safe_load((PROM_DIR / "kiln-rules.yml").read_text())["groups"]
    return [r for g in groups for r in g["rules"]]


def expand_rule(expr, records, sc):
    """The expression with each recorded series replaced by its rule (recursively) and
    every range set to the test's window."""
    for _ in range(5):
        changed = False
        for name, rexpr in records.items():
            pat = re.compile(r"(?<![\w:])" + re.escape(name) + r"(?![\w:])")
            if pat.search(expr):
                assert not re.search(re.escape(name) + r"\s*[{\[]", expr), \
                    f"{name} is used with matchers or a range; the test cannot expand it"
                expr = pat.sub(lambda _: f"({rexpr.strip()})", expr)
                changed = True
        if not changed:
            break
    return re.sub(r"\[\d+[smhdwy]\]", f"[{sc['window_ms']}ms]", expr)


# ------------------------------------------------------------------ tests


def present_names(sc):
    return {name for name, _ in sc["after"]}


def check_expression(sc, where, expr, expect, exempt_nonempty=False):
    """Evaluate at t1: (the absent metric names it selects, the result)."""
    known = present_names(sc) | PLANNED | {r["record"] for r in rules() if "record" in r}
    names = metric_names(expr)
    assert names, f"{where}: no metric in {expr}"
    unknown = names - known
    assert not unknown, f"{where}: unknown metric names {sorted(unknown)} in {expr}"
    result = sc["prom"].query(expr, sc["t1"])
    absent = names - present_names(sc)
    if not absent and not exempt_nonempty:
        assert result, f"{where}: no series from {expr}"
    if absent and absent == names:
        assert not result, f"{where}: series from metrics the server does not export? {result}"
    if expect:
        expect(sc, result)
    return absent, result


def test_window_is_exact(scenario):
    """Premise of the value checks: the window's first sample is the scrape before the
    traffic, its last the scrape after, so rate() * window is the exact count."""
    sc = scenario
    r = sc["prom"].api("query", query=f'kiln_request_latency_us_count{{model_name="{MODEL}"}}'
                       f'[{sc["window_ms"]}ms]', time=f"{sc['t1']:.3f}")[1]["data"]["result"]
    assert r, (sc["t0"], sc["t1"], sc["window_ms"])
    for s in r:
        ts = [float(t) for t, _ in s["values"]]
        assert abs(ts[0] - sc["t0"]) < 1e-3 and abs(ts[-1] - sc["t1"]) < 1e-3, (ts, sc["t0"], sc["t1"])


def test_dashboard_expressions(scenario):
    sc = scenario
    not_exported = {}
    checked = set()
    for where, expr, key in dashboard_exprs():
        annotation = key is None  # `> 0` filters: empty when nothing happened
        absent, _ = check_expression(sc, where, substitute_dashboard(expr, sc),
                                     PANEL_EXPECT.get(key), exempt_nonempty=annotation)
        checked.add(key)
        if absent:
            not_exported[where] = sorted(absent)
    assert set(PANEL_EXPECT) <= checked, set(PANEL_EXPECT) - checked
    print("\ndashboard expressions over metrics not exported yet:")
    for where, names in sorted(not_exported.items()):
        print(f"  {where}: {', '.join(names)}")


def test_rule_expressions(scenario):
    sc = scenario
    all_rules = rules()
    records = {r["record"]: r["expr"] for r in all_rules if "record" in r}
    assert set(RECORD_EXPECT) <= set(records)
    not_exported = {}
    fired = {}
    for r in all_rules:
        name = r.get("record") or r["alert"]
        expr = expand_rule(r["expr"], records, sc)
        absent, result = check_expression(sc, name, expr, RECORD_EXPECT.get(name),
                                          exempt_nonempty="alert" in r)
        if absent:
            not_exported[name] = sorted(absent)
        if "alert" in r:
            fired[name] = [(x["metric"], float(x["value"][1])) for x in result]
            assert r.get("for") is not None and r["labels"]["severity"] in ("critical", "warning", "info")
            assert r["annotations"]["summary"] and r["annotations"]["description"], name
    # the test's traffic: 15 of 145 requests fail (> 1 %, >= 100 requests), p99 far below 500 ms
    p99 = max(by(sc["prom"].query(expand_rule(
        "model_name_version:kiln_request_latency_us:p99_rate5m", records, sc), sc["t1"]),
        "version").values())
    assert p99 < 500000
    assert fired["KilnErrorRateHigh"] == [({"model_name": MODEL},
                                            pytest.approx(N_ERRORS / N_TOTAL, rel=1e-6))]
    for quiet in ("KilnLatencyP99High", "KilnModelLoadFailed", "KilnBatchQueueFull"):
        assert fired[quiet] == [], (quiet, fired[quiet])
    print("\nrules over metrics not exported yet:")
    for name, names in sorted(not_exported.items()):
        print(f"  {name}: {', '.join(names)}")


def test_template_variables(scenario):
    """The dashboard's model and version variables list what the server serves."""
    sc = scenario
    d = json.loads(DASHBOARD.read_text())
    want = {"model": {MODEL}, "version": set(N_OK)}
    seen = set()
    for v in d["templating"]["list"]:
        if v["type"] != "query":
            assert v["type"] == "datasource" and v["query"] == "prometheus"
            continue
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["query"]["query"])
        assert m, v["query"]
        selector = m.group(1).replace("$model", MODEL)
        code, body = sc["prom"].api("series", **{"match[]": selector})
        assert code == 200 and body["status"] == "success", body
        values = {s[m.group(2)] for s in body["data"] if m.group(2) in s}
        assert values == want[v["name"]], (v["name"], values)
        seen.add(v["name"])
    assert seen == set(want)


def test_live_rules_and_alerts(scenario):
    """The live Prometheus evaluates every rule without error, and KilnErrorRateHigh is
    pending (its `for: 5m` has not passed) for the model."""
    sc = scenario
    prom = sc["prom"]

    def healthy_and_pending():
        code, body = prom.api("rules")
        rs = [r for g in body["data"]["groups"] for r in g["rules"]]
        if len(rs) != len(rules()) or any(r.get("health") != "ok" for r in rs):
            return None
        alert = next(r for r in rs if r["name"] == "KilnErrorRateHigh")
        return [a for a in alert.get("alerts", []) if a["labels"].get("model_name") == MODEL]
    alerts = wait_for("healthy rules and a pending KilnErrorRateHigh", healthy_and_pending, 30)
    assert alerts[0]["state"] in ("pending", "firing")
    assert alerts[0]["labels"]["severity"] == "critical"
    code, body = prom.api("rules")
    bad = [(r["name"], r.get("lastError")) for g in body["data"]["groups"] for r in g["rules"]
           if r.get("health") != "ok" or r.get("lastError")]
    assert not bad, bad


def test_kubernetes_relabeling(scenario):
    """prometheus-kubernetes.yml keeps only Kiln's running pods that ask to be scraped and
    scrapes the annotated port and path."""
    sc = scenario
    prom = sc["prom"]

    def targets():
        body = prom.api("targets")[1]["data"]
        active = [t for t in body["activeTargets"] if t["labels"].get("job") == "kiln-kubernetes"]
        return (active, body) if active and all(t["health"] == "up" for t in active) else None
    active, body = wait_for("the Kubernetes example's target up", targets, 30)
    assert len(active) == 1, active
    t = active[0]
    assert t["scrapeUrl"] == f"http://127.0.0.1:{sc['kiln'].port}{METRICS_PATH}"
    assert t["labels"]["namespace"] == "serving" and t["labels"]["pod"] == "kiln-0"
    dropped = [d for d in body["droppedTargets"]
               if d["discoveredLabels"].get("job") == "kiln-kubernetes"]
    assert sorted(d["discoveredLabels"]["__meta_kubernetes_pod_name"] for d in dropped) == \
        ["kiln-1", "kiln-2", "other-0"]


def test_dashboard_structure():
    """What Grafana needs to import the dashboard and lay it out: a current schema, the
    data source variable on every query, unique panel ids, panels inside the 24-column
    grid without overlaps, a description and a unit on every panel."""
    d = json.loads(DASHBOARD.read_text())
    assert d["schemaVersion"] >= 39 and d["uid"] and d["title"]
    ids, cells = set(), set()
    for p in d["panels"]:
        assert p["id"] not in ids, p["title"]
        ids.add(p["id"])
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"panel {p['title']!r} overlaps another"
                cells.add((x, y))
        if p["type"] == "row":
            continue
        assert p["description"] and p["fieldConfig"]["defaults"].get("unit"), p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(set(refs)) == len(refs), p["title"]
        assert all(t["datasource"] == p["datasource"] for t in p["targets"]), p["title"]
    for a in d["annotations"]["list"]:
        if a.get("expr"):
            assert a["datasource"]["uid"] == "${datasource}", a["name"]
