"""test_serve_console.py - the web console's server side, without a browser.

`kiln serve` serves the console's embedded assets under /console/ and the
JSON stats the page polls at /console/api/stats (src/serve/console.c). These
tests check that the embedded assets are byte for byte the source files in
src/serve/console/assets/ (the build step that generates them is not stale),
the routes and headers (CSP, 404, 405, --enable_console=false), and that the
stats agree with independent references: the Prometheus page's counters and
histograms of the same server, the requests the test itself sent (good and
failed, per version), the server's own load log line, and TF Serving's
status reply for a version that failed to load. The page itself is tested in
headless Chromium by tests/browser/console.test.js.
"""
import json
import re

import numpy as np
import pytest

import test_serve
from test_serve import REPO, Server, save_affine

ASSETS = REPO / "src" / "serve" / "console" / "assets"


def prometheus(srv):
    code, body, _ = srv.request("GET", "/monitoring/prometheus/metrics")
    assert code == 200
    return body.decode()


def prom_value(text, name, **labels):
    """The value of the sample `name{labels...}` (labels in any order), or None."""
    for line in text.splitlines():
        m = re.match(r"^([^{\s]+)\{([^}]*)\}\s+(\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if all(got.get(k) == v for k, v in labels.items()) and len(got) == len(labels):
            return float(m.group(3))
    return None


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """Model 'aff' with versions 1 and 2 served (label stable -> 1) and a
    broken version 3 that fails to load."""
    root = tmp_path_factory.mktemp("console")
    base = root / "aff"
    save_affine(base / "1" / "model.onnx", 2.0, 1.0)
    save_affine(base / "2" / "model.onnx", 3.0, 0.0)
    (base / "3").mkdir()
    (base / "3" / "model.onnx").write_bytes(b"\x08\x07garbage that is not a model")
    cfg = root / "models.config"
    cfg.write_text(f"model_config_list {{ config {{ name: 'aff' base_path: '{base}' "
                   "model_platform: 'tensorflow' model_version_policy { specific { versions: 1 "
                   "versions: 2 versions: 3 } } version_labels { key: 'stable' value: 1 } } }\n")
    srv = Server(base, "aff", f"--model_config_file={cfg}")
    yield srv
    srv.kill()


def test_assets_are_the_source_files(two):
    files = sorted(p.name for p in ASSETS.iterdir())
    assert "index.html" in files and "console.js" in files
    for name in files:
        code, body, ctype = two.request("GET", f"/console/{name}")
        assert code == 200, name
        assert body == (ASSETS / name).read_bytes(), f"{name}: the binary's copy is stale"
    types = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
    for name in files:
        ext = name[name.rindex("."):]
        assert two.request("GET", f"/console/{name}")[2].startswith(types[ext]), name
    index = (ASSETS / "index.html").read_bytes()
    for path in ("/console", "/console/"):
        code, body, ctype = two.request("GET", path)
        assert (code, body) == (200, index), path
        assert ctype == "text/html; charset=utf-8"


def test_headers_and_errors(two):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", two.port, timeout=10)
    for path in ("/console/", "/console/api/stats", "/console/missing.js"):
        c.request("GET", path)
        r = c.getresponse()
        r.read()
        csp = r.getheader("Content-Security-Policy")
        assert csp and "default-src 'self'" in csp and "script-src 'self'" in csp, path
        assert "unsafe-inline" not in csp and "http" not in csp, csp
        assert r.getheader("X-Content-Type-Options") == "nosniff"
        assert r.status == (404 if "missing" in path else 200), path
    c.close()
    code, body = two.json("GET", "/console/missing.js")
    assert code == 404 and body == {"error": "Not found: GET /console/missing.js"}
    assert two.request("POST", "/console/api/stats", "{}")[0] == 405
    # the Prometheus page, the console and the API are separate routes
    assert two.request("GET", "/consoleX")[0] == 404


def test_stats_agree_with_prometheus_and_requests(two):
    x = {"instances": [[1.0, 2.0, 3.0]]}
    for _ in range(3):
        assert two.json("POST", "/v1/models/aff/versions/1:predict", x)[0] == 200
    assert two.json("POST", "/v1/models/aff/labels/stable:predict", x)[0] == 200
    for _ in range(2):  # wrong shape: reaches version 2, fails
        assert two.json("POST", "/v1/models/aff/versions/2:predict", {"instances": [[1.0]]})[0] == 400
    assert two.json("POST", "/v1/models/aff:predict", x)[0] == 200  # latest = 2
    assert two.json("GET", "/v1/models/aff/versions/2/metadata")[0] == 200
    code, st = two.json("GET", "/console/api/stats")
    assert code == 200
    prom = prometheus(two)
    series = {(s["model"], s["version"], s["api"]): s for s in st["requests"]["series"]}
    # what this test sent
    assert (series[("aff", "1", "predict")]["count"], series[("aff", "1", "predict")]["errors"]) == (4, 0)
    assert (series[("aff", "2", "predict")]["count"], series[("aff", "2", "predict")]["errors"]) == (3, 2)
    assert series[("aff", "2", "metadata")]["count"] >= 1
    # the Prometheus page of the same server: counts, sums and every bucket
    bounds = st["requests"]["latency_bounds_us"]
    assert len(bounds) == 33 and bounds[0] == 10 and abs(bounds[1] - 18) < 1e-9
    for (model, version, api), s in series.items():
        labels = dict(model_name=model, version=version, API=api)
        assert prom_value(prom, "kiln_request_latency_us_count", **labels) == s["count"]
        assert prom_value(prom, "kiln_request_latency_us_sum", **labels) == pytest.approx(s["sum_us"])
        assert len(s["buckets"]) == 34 and sum(s["buckets"]) == s["count"]
        cum = np.cumsum(s["buckets"])
        for k, b in enumerate(bounds):
            assert prom_value(prom, "kiln_request_latency_us_bucket", le=f"{b:.10g}", **labels) == cum[k]
    # errors per version add up to Kiln's per-model error counter (any code)
    errs = 0.0
    for line in prom.splitlines():
        if line.startswith("kiln_request_errors_total{") and 'model_name="aff"' in line \
                and 'API="predict"' in line:
            errs += float(line.split()[-1])
    assert errs == sum(s["errors"] for (m, v, a), s in series.items() if a == "predict") == 2
    assert st["batching"] is None  # no --enable_batching
    assert st["metrics_path"] == "/monitoring/prometheus/metrics"
    assert st["refresh_ms"] > 0 and st["time_ms"] > 0


def test_stats_versions_labels_logs(two):
    code, st = two.json("GET", "/console/api/stats")
    (m,) = st["models"]
    assert m["name"] == "aff" and m["ready"] is True and m["labels"] == {"stable": "1"}
    by = {v["version"]: v for v in m["versions"]}
    assert [v["version"] for v in m["versions"]] == ["3", "2", "1"]
    # the version list agrees with /v1/models
    code, lst = two.json("GET", "/v1/models")
    assert {v["version"]: v["state"] for v in lst["models"][0]["versions"]} == \
        {k: v["state"] for k, v in by.items()}
    log = two.logtext()
    for v in ("1", "2"):
        e = by[v]
        assert e["state"] == "AVAILABLE" and e["served"] is True and e["precision"] == "fp32"
        assert e["error_code"] == "OK"
        # the load log and the optimization log are the server's event=load line
        line = next(l for l in log.splitlines() if "event=load " in l and f"version={v} " in l)
        assert e["load_log"] in line and re.search(r"format=onnx signatures=1 load_ms=\S+", e["load_log"])
        opt = json.loads(re.search(r'optimization_log=("(?:[^"\\]|\\.)*")', line).group(1))
        assert e["optimization_log"] == opt and opt.startswith("optimizer:")
    bad = by["3"]
    assert bad["served"] is False and bad["state"] == "END" and "precision" not in bad
    code, status = two.json("GET", "/v1/models/aff/versions/3")
    assert status["model_version_status"][0]["status"]["error_message"] == bad["error_message"]
    assert status["model_version_status"][0]["status"]["error_code"] == bad["error_code"] != "OK"


def test_batching_stats_agree_with_prometheus(tmp_path):
    base = tmp_path / "b"
    save_affine(base / "1" / "model.onnx", 1.0, 0.0)
    params = tmp_path / "batching.config"
    params.write_text("max_batch_size { value: 4 } batch_timeout_micros { value: 1000 } "
                      "allowed_batch_sizes: 2 allowed_batch_sizes: 4\n")
    srv = Server(base, "b", "--enable_batching", f"--batching_parameters_file={params}")
    try:
        for rows in (1, 2, 3):
            code, _ = srv.json("POST", "/v1/models/b:predict", {"instances": [[1.0, 2.0, 3.0]] * rows})
            assert code == 200
        code, st = srv.json("GET", "/console/api/stats")
        prom = prometheus(srv)
        b = st["batching"]
        assert b["size_bounds"][:4] == [1, 2, 4, 8] and len(b["queue_bounds_us"]) == 52
        (s,) = b["series"]
        assert (s["model"], s["version"]) == ("b", "1")
        # three requests ran alone (sequential): padded to 2, 2 and 4 rows
        assert s["batch_size"]["count"] == 3 and s["batch_size"]["sum"] == 8
        assert s["padding_rows"]["sum"] == 1 + 0 + 1
        lab = dict(model_name="b", version="1")
        assert prom_value(prom, "kiln_batch_queue_latency_us_count", **lab) == s["queue_us"]["count"] == 3
        assert prom_value(prom, "kiln_batch_size_sum", **lab) == s["batch_size"]["sum"]
        assert prom_value(prom, "kiln_batch_size_bucket", le="2", **lab) == sum(s["batch_size"]["buckets"][:2])
        runs = re.search(r"^:tensorflow:serving:batching_session:wrapped_run_count (\S+)$", prom, re.M)
        assert b["runs"] == float(runs.group(1)) == 3
    finally:
        srv.kill()


def test_console_off(tmp_path):
    base = tmp_path / "off"
    save_affine(base / "1" / "model.onnx", 1.0, 0.0)
    srv = Server(base, "off", "--enable_console=false")
    try:
        for path in ("/console", "/console/", "/console/api/stats", "/console/console.js"):
            code, body, _ = srv.request("GET", path)
            assert code == 404, path
            assert json.loads(body) == {"error": f"Not found: GET {path}"}
        assert srv.request("GET", "/v1/models/off")[0] == 200
        assert "--enable_console=false" in srv.logtext()
    finally:
        srv.kill()
    code = test_serve.subprocess.run([test_serve.KILN, "serve", "--enable_console=maybe",
                                      "--model_base_path=/nonexistent"], capture_output=True)
    assert code.returncode == 2 and b"--enable_console" in code.stderr
