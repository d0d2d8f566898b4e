"""The stateful counter SavedModel from TF Serving's test data
(saved_model_counter: a float VariableV2 'counter' that the incr_counter,
incr_counter_by and reset_counter signatures assign, and get_counter reads).
Served by the real server, state must persist across requests, be shared by
all signatures, and every concurrent increment must count exactly once.
Skipped when the shared test data is absent.
"""

import os
import shutil
import threading
from pathlib import Path

import pytest

import test_serve
from test_serve import Server

pytestmark = test_serve.pytestmark

REPO = Path(__file__).resolve().parents[2]
TESTDATA = Path(os.environ.get("KILN_TESTDATA") or REPO.parent / "shared" / "testdata")
COUNTER = (TESTDATA / "savedmodels" / "serving" / "tensorflow_serving" / "servables" / "tensorflow"
           / "testdata" / "saved_model_counter" / "00000123")


@pytest.fixture()
def counter(tmp_path):
    if not COUNTER.is_dir():
        pytest.skip(f"{COUNTER} missing")
    base = tmp_path / "counter"
    shutil.copytree(COUNTER, base / "123")
    srv = Server(base, "counter")
    yield srv
    srv.kill()


def call(srv, sig, inputs=None):
    body = {"signature_name": sig, "inputs": inputs or {}}
    code, out = srv.json("POST", "/v1/models/counter:predict", body)
    assert code == 200, out
    return out["outputs"]


def test_counter_signatures(counter):
    assert call(counter, "get_counter") == 0          # restored from the checkpoint
    assert call(counter, "incr_counter") == 1
    assert call(counter, "incr_counter") == 2
    assert call(counter, "get_counter") == 2          # shared by every signature
    assert call(counter, "incr_counter_by", {"delta": 5.5}) == 7.5
    assert call(counter, "reset_counter") == 0
    assert call(counter, "get_counter") == 0
    assert call(counter, "incr_counter_by", {"delta": -2}) == -2


def test_counter_concurrent_increments_each_count_once(counter):
    n_threads, per_thread = 4, 25
    errors = []

    def worker():
        try:
            for _ in range(per_thread):
                call(counter, "incr_counter")
        except AssertionError as e:  # reported below; a thread cannot fail the test itself
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert call(counter, "get_counter") == n_threads * per_thread
