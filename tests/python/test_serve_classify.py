"""End-to-end tests for :classify and :regress against TF Serving's own
test model saved_model_half_plus_two_cpu (y = x/2 + 2, y2 = x/2 + 3; its
classify and regress signatures take serialized tf.Example). The server
encodes the request's "examples" (and "context") as tf.Example protos.
Skipped when the shared test data is absent.
"""

import os
import shutil
from pathlib import Path

import pytest

import test_serve
from test_serve import Server

pytestmark = test_serve.pytestmark

REPO = Path(__file__).resolve().parents[2]
TESTDATA = Path(os.environ.get("KILN_TESTDATA") or REPO.parent / "shared" / "testdata")
HALF = (TESTDATA / "savedmodels" / "serving" / "tensorflow_serving" / "servables" / "tensorflow"
        / "testdata" / "saved_model_half_plus_two_cpu" / "00000123")


@pytest.fixture(scope="module")
def half(tmp_path_factory):
    if not HALF.is_dir():
        pytest.skip(f"{HALF} missing")
    base = tmp_path_factory.mktemp("half") / "half"
    shutil.copytree(HALF, base / "123")
    srv = Server(base, "half")
    yield srv
    srv.kill()


def post(srv, verb, body):
    return srv.json("POST", f"/v1/models/half:{verb}", body)


def test_classify(half):
    code, body = post(half, "classify", {"signature_name": "classify_x_to_y",
                                         "examples": [{"x": 1.0}]})
    assert code == 200, body
    assert body == {"results": [[["", 2.5]]]}
    code, body = post(half, "classify", {"signature_name": "classify_x_to_y",
                                         "examples": [{"x": 1.0}, {"x": -4.0}, {"x": 10.5}]})
    assert code == 200 and body == {"results": [[["", 2.5]], [["", 0]], [["", 7.25]]]}


def test_regress(half):
    code, body = post(half, "regress", {"signature_name": "regress_x_to_y",
                                        "examples": [{"x": 1.0}]})
    assert code == 200 and body == {"results": [2.5]}
    code, body = post(half, "regress", {"signature_name": "regress_x_to_y2",
                                        "examples": [{"x": 1.0}, {"x": 2.0}]})
    assert code == 200 and body == {"results": [3.5, 4]}
    # context features go into every example
    code, body = post(half, "regress", {"signature_name": "regress_x_to_y",
                                        "context": {"x": 4.0}, "examples": [{}, {}]})
    assert code == 200 and body == {"results": [4, 4]}
    code, body = half.json("POST", "/v1/models/half/versions/123:regress",
                           {"signature_name": "regress_x_to_y", "examples": [{"x": [6.0]}]})
    assert code == 200 and body == {"results": [5]}


@pytest.mark.parametrize("verb,body,needle", [
    ("regress", {"examples": [{"x": 1.0}]},
     "Expected regression signature method_name to be tensorflow/serving/regress"),
    ("classify", {"signature_name": "regress_x_to_y", "examples": [{"x": 1.0}]},
     "Expected classification signature method_name"),
    ("regress", {"signature_name": "nope", "examples": [{"x": 1.0}]}, "not found in signature def"),
    ("regress", {"signature_name": "regress_x_to_y"}, "Missing 'examples' key"),
    ("regress", {"signature_name": "regress_x_to_y", "examples": []}, "No values in 'examples'"),
    ("regress", {"signature_name": "regress_x_to_y", "examples": [{"x": None}]}, "'x'"),
    ("regress", {"signature_name": "regress_x_to_y", "examples": [{"x": [1.0, "a"]}]}, "'x'"),
    ("regress", {"signature_name": "regress_x_to_y", "examples": [{"x": [[1.0]]}]}, "'x'"),
    ("regress", {"signature_name": "regress_x_to_y", "context": {"x": 1.0},
                 "examples": [{"x": 2.0}]}, "both the context and an example"),
    ("regress", {"signature_name": "regress_x_to_y", "examples": [{"x": 1}]}, "int64"),
])
def test_bad_requests(half, verb, body, needle):
    code, resp = post(half, verb, body)
    assert code == 400, resp
    assert needle in resp["error"]


def test_unknown_model(half):
    code, body = half.json("POST", "/v1/models/nope:classify", {"examples": [{"x": 1.0}]})
    assert code == 404 and body["error"] == "Servable not found for request: Latest(nope)"


def test_metrics_api_label(half):
    post(half, "regress", {"signature_name": "regress_x_to_y", "examples": [{"x": 1.0}]})
    text = half.request("GET", "/monitoring/prometheus/metrics")[1].decode()
    assert 'request_latency_count{model_name="half",API="regress",entrypoint="REST"}' in text
