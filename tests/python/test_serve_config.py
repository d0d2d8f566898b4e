"""End-to-end tests for `kiln serve --model_config_file`: several models from
one ModelServerConfig text file, the version policies latest{n}, all and
specific, version labels and the /labels/{l} routes, a broken config, and a
config replaced while the server runs (--model_config_file_poll_wait_seconds).
"""

import subprocess
import time

import pytest

from test_serve import KILN, free_port, save_affine, wait_for  # noqa: F401  (skips if no kiln)
import test_serve

pytestmark = test_serve.pytestmark


class ConfigServer(test_serve.Server):
    """test_serve.Server, started from a config file instead of one model."""

    def __init__(self, config, *extra):  # noqa: D107 (overrides the base constructor)
        self.port = free_port()
        self.log = open(config.parent / "server.log", "w+")
        self.proc = subprocess.Popen(
            [KILN, "serve", f"--model_config_file={config}", f"--rest_api_port={self.port}",
             "--rest_api_address=127.0.0.1", "--rest_api_num_threads=4",
             "--file_system_poll_wait_seconds=1", *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_ready()


def predict(srv, path, rows=((1, 1, 1),)):
    return srv.json("POST", path, {"instances": [list(r) for r in rows]})


def versions(srv, name):
    code, body = srv.json("GET", f"/v1/models/{name}")
    assert code == 200, body
    return {v["version"]: v["state"] for v in body["model_version_status"]}


CONFIG = """
# two models, three policies between them
model_config_list {
  config {
    name: 'lat'
    base_path: '%(root)s/lat'
    model_platform: 'tensorflow'
    model_version_policy { latest { num_versions: 2 } }
  }
  config {
    name: "spec"
    base_path: "%(root)s/spec"
    model_platform: "onnx"
    model_version_policy: { specific { versions: 1 versions: 3 } }
    version_labels { key: 'stable' value: 1 }
    version_labels { key: 'canary' value: 3 }
  }
  config {
    name: 'every'
    base_path: '%(root)s/every'
    model_version_policy { all {} }
  }
}
"""


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    root = tmp_path_factory.mktemp("cfg")
    for name in ("lat", "spec", "every"):
        for v in (1, 2, 3):
            save_affine(root / name / str(v) / "model.onnx", float(v), 0.0)  # y = x * v
    config = root / "models.config"
    config.write_text(CONFIG % {"root": root})
    srv = ConfigServer(config, "--model_config_file_poll_wait_seconds=1")
    srv.root, srv.config = root, config
    yield srv
    srv.kill()


def test_several_models(cfg):
    for name in ("lat", "spec", "every"):
        code, body = predict(cfg, f"/v1/models/{name}:predict")
        assert code == 200, body
    code, body = cfg.json("GET", "/v1/models")
    assert sorted(m["name"] for m in body["models"]) == ["every", "lat", "spec"]


def test_policy_latest_n(cfg):
    assert versions(cfg, "lat") == {"3": "AVAILABLE", "2": "AVAILABLE"}
    assert predict(cfg, "/v1/models/lat:predict") == (200, {"predictions": [[3, 3, 3]]})
    assert predict(cfg, "/v1/models/lat/versions/2:predict") == (200, {"predictions": [[2, 2, 2]]})
    code, body = predict(cfg, "/v1/models/lat/versions/1:predict")
    assert code == 404 and body["error"] == "Servable not found for request: Specific(lat, 1)"


def test_policy_specific(cfg):
    assert versions(cfg, "spec") == {"3": "AVAILABLE", "1": "AVAILABLE"}
    assert predict(cfg, "/v1/models/spec/versions/1:predict")[1] == {"predictions": [[1, 1, 1]]}
    assert predict(cfg, "/v1/models/spec/versions/2:predict")[0] == 404
    assert predict(cfg, "/v1/models/spec:predict")[1] == {"predictions": [[3, 3, 3]]}


def test_policy_all(cfg):
    assert versions(cfg, "every") == {"3": "AVAILABLE", "2": "AVAILABLE", "1": "AVAILABLE"}
    for v in (1, 2, 3):
        code, body = predict(cfg, f"/v1/models/every/versions/{v}:predict")
        assert code == 200 and body == {"predictions": [[v, v, v]]}


def test_labels(cfg):
    assert predict(cfg, "/v1/models/spec/labels/stable:predict")[1] == {"predictions": [[1, 1, 1]]}
    assert predict(cfg, "/v1/models/spec/labels/canary:predict")[1] == {"predictions": [[3, 3, 3]]}
    code, body = cfg.json("GET", "/v1/models/spec/labels/stable")
    assert code == 200 and [v["version"] for v in body["model_version_status"]] == ["1"]
    code, body = cfg.json("GET", "/v1/models/spec/labels/canary/metadata")
    assert code == 200 and body["model_spec"]["version"] == "3"
    # TF Serving: an unknown label is INVALID_ARGUMENT (400), with this message
    code, body = predict(cfg, "/v1/models/spec/labels/nope:predict")
    assert code == 400 and body["error"] == "Unrecognized servable version label: nope"
    code, body = cfg.json("GET", "/v1/models/spec/labels/nope")
    assert code == 400 and body["error"] == "Unrecognized servable version label: nope"
    code, body = predict(cfg, "/v1/models/lat/labels/stable:predict")
    assert code == 400


def test_zz_config_replaced(cfg):
    """Runs last: replaces the config. 'every' goes, 'lat' becomes specific{1}
    and labelled, 'new' appears, 'spec' moves its canary label."""
    save_affine(cfg.root / "new" / "7" / "model.onnx", 7.0, 0.0)
    text = f"""
model_config_list {{
  config {{ name: 'lat' base_path: '{cfg.root}/lat'
           model_version_policy {{ specific {{ versions: 1 }} }}
           version_labels {{ key: 'old' value: 1 }} }}
  config {{ name: 'spec' base_path: '{cfg.root}/spec'
           model_version_policy {{ specific {{ versions: 1 versions: 3 }} }}
           version_labels {{ key: 'stable' value: 1 }}
           version_labels {{ key: 'canary' value: 1 }} }}
  config {{ name: 'new' base_path: '{cfg.root}/new' }}
}}
"""
    tmp = cfg.config.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.rename(cfg.config)

    def applied():
        return predict(cfg, "/v1/models/new:predict")[0] == 200
    assert wait_for(applied, 30), cfg.logtext()
    assert predict(cfg, "/v1/models/new:predict")[1] == {"predictions": [[7, 7, 7]]}
    assert wait_for(lambda: predict(cfg, "/v1/models/every:predict")[0] == 404)
    assert cfg.json("GET", "/v1/models/every")[0] == 404
    assert wait_for(lambda: versions(cfg, "lat").get("1") == "AVAILABLE")
    assert wait_for(lambda: predict(cfg, "/v1/models/lat:predict")[1] == {"predictions": [[1, 1, 1]]})
    st = versions(cfg, "lat")
    assert st["1"] == "AVAILABLE" and st["3"] == "END" and st["2"] == "END"
    assert predict(cfg, "/v1/models/lat/labels/old:predict")[1] == {"predictions": [[1, 1, 1]]}
    assert predict(cfg, "/v1/models/spec/labels/canary:predict")[1] == {"predictions": [[1, 1, 1]]}

    # a broken config is logged and the running one kept
    cfg.config.write_text("model_config_list { config { nmae: 'x' } }")
    time.sleep(2.5)
    assert predict(cfg, "/v1/models/new:predict")[0] == 200
    assert "config_error" in cfg.logtext() and "nmae" in cfg.logtext()


def test_bad_config_file(tmp_path):
    bad = tmp_path / "bad.config"
    bad.write_text("model_config_list { config { name: 'm' base_path: '/x' bogus: 1 } }")
    r = subprocess.run([KILN, "serve", f"--model_config_file={bad}", "--rest_api_port=0"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "bogus" in r.stderr, r.stderr
    r = subprocess.run([KILN, "serve", f"--model_config_file={tmp_path / 'missing'}"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "missing" in r.stderr
