"""End-to-end tests for `kiln serve --enable_batching`: concurrent predict
requests merged along dimension 0, padded to allowed_batch_sizes, split back
so every client gets exactly its own rows; requests with other non-batch
shapes not merged; a full queue answering 503 with TF Serving's message;
batching metrics; a bad parameters file refused at startup.
"""

import subprocess
import threading

import numpy as np
import pytest

import test_serve
from test_serve import KILN, Server, save_affine

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

pytestmark = test_serve.pytestmark


def save_scale(path):
    """y = x * 2 over float32 [batch, n]: the non-batch width is free."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "n"])
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    g = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "scale", [x], [y], [two])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def start(tmp_path, name, params, save=save_affine, *args):
    base = tmp_path / name
    if save is save_affine:
        save_affine(base / "1" / "model.onnx", 2.0, 1.0)  # y = 2x + 1
    else:
        save(base / "1" / "model.onnx")
    pfile = tmp_path / f"{name}.batching"
    pfile.write_text(params)
    return Server(base, name, "--enable_batching=true", f"--batching_parameters_file={pfile}",
                  "--rest_api_num_threads=32", *args)


def concurrently(fn, n):
    results = [None] * n
    barrier = threading.Barrier(n)

    def body(i):
        barrier.wait()
        results[i] = fn(i)
    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_each_client_gets_its_rows(tmp_path):
    srv = start(tmp_path, "aff", """
        max_batch_size { value: 32 }
        batch_timeout_micros { value: 300000 }
        max_enqueued_batches { value: 100 }
        num_batch_threads { value: 2 }
        allowed_batch_sizes: 8
        allowed_batch_sizes: 16
        allowed_batch_sizes: 32
    """)
    try:
        def client(i):
            rows = [[i * 100 + r * 10 + c for c in range(3)] for r in range(1 + i % 3)]
            code, body = srv.json("POST", "/v1/models/aff:predict", {"instances": rows})
            return rows, code, body
        for rows, code, body in concurrently(client, 16):
            assert code == 200, body
            want = (np.array(rows, np.float32) * 2 + 1).tolist()
            assert body == {"predictions": want}
        # columnar requests go through the batcher too
        code, body = srv.json("POST", "/v1/models/aff:predict", {"inputs": {"x": [[1, 2, 3]]}})
        assert code == 200 and body == {"outputs": [[3, 5, 7]]}
        # larger than max_batch_size: refused as TF Serving does
        code, body = srv.json("POST", "/v1/models/aff:predict", {"instances": [[0, 0, 0]] * 33})
        assert code == 400 and "larger than maximum input batch size 32" in body["error"]

        text = srv.request("GET", "/monitoring/prometheus/metrics")[1].decode()
        p = ":tensorflow:serving:batching_session:"
        runs = metric(text, p + "wrapped_run_count")
        assert runs is not None and runs < 17  # 17 requests, some merged
        assert metric(text, p + "input_batch_size_count") == 17
        assert metric(text, p + "processed_batch_size_count") == runs
        # every run is padded to 8, 16 or 32 rows
        assert metric(text, p + 'processed_batch_size_bucket{le="4"}') == 0
        assert metric(text, p + "padding_size_sum") > 0
        assert metric(text, p + 'queuing_latency_count{thread_pool_name="model_server_batch_threads"}') == 17
    finally:
        srv.kill()


def test_different_shapes_not_merged(tmp_path):
    """Three widths arriving interleaved: each request joins the waiting
    batch of its width, so three queued batches are enough for twelve
    clients (a queue that opened a batch per shape change would refuse
    some with 503)."""
    srv = start(tmp_path, "scale", """
        max_batch_size { value: 16 }
        batch_timeout_micros { value: 200000 }
        max_enqueued_batches { value: 3 }
        num_batch_threads { value: 1 }
    """, save_scale)
    try:
        def client(i):
            width = 2 + i % 3
            rows = [[i + c / 10 for c in range(width)] for _ in range(1 + i % 2)]
            return rows, srv.json("POST", "/v1/models/scale:predict", {"instances": rows})
        for rows, (code, body) in concurrently(client, 12):
            assert code == 200, body
            assert np.allclose(body["predictions"], np.array(rows, np.float32) * 2)
    finally:
        srv.kill()


@pytest.mark.parametrize("pad", [True, False])
def test_pad_variable_length_inputs(tmp_path, pad):
    """With pad_variable_length_inputs, [1, 2] and [1, 4] rows share one run:
    the short one is padded to width 4 with its own first element (TF
    Serving's PadTensor) and its reply keeps the padded width, as TF
    Serving's does. Without it they run separately."""
    srv = start(tmp_path, "pad", f"""
        max_batch_size {{ value: 2 }}
        batch_timeout_micros {{ value: 2000000 }}
        num_batch_threads {{ value: 1 }}
        pad_variable_length_inputs: {str(pad).lower()}
    """, save_scale)
    try:
        rows = [[[1.0, 2.0]], [[3.0, 4.0, 5.0, 6.0]]]
        results = concurrently(
            lambda i: srv.json("POST", "/v1/models/pad:predict", {"instances": rows[i]}), 2)
        (c0, b0), (c1, b1) = results
        assert c0 == 200 and c1 == 200, results
        assert b1 == {"predictions": [[6, 8, 10, 12]]}
        text = srv.request("GET", "/monitoring/prometheus/metrics")[1].decode()
        runs = metric(text, ":tensorflow:serving:batching_session:wrapped_run_count")
        padded = metric(text, 'kiln_batch_padded_elements_total{model_name="pad",version="1"}')
        if pad:
            assert b0 == {"predictions": [[2, 4, 2, 2]]}
            assert runs == 1 and padded == 2
            assert metric(text, 'kiln_batch_size_count{model_name="pad",version="1"}') == 1
        else:
            assert b0 == {"predictions": [[2, 4]]}
            assert runs == 2 and padded == 0
        assert "pad_variable_length_inputs=%s" % str(pad).lower() in srv.logtext()
    finally:
        srv.kill()


def test_full_queue_503(tmp_path):
    srv = start(tmp_path, "tiny", """
        max_batch_size { value: 4 }
        batch_timeout_micros { value: 500000 }
        max_enqueued_batches { value: 1 }
        num_batch_threads { value: 1 }
    """)
    try:
        def client(i):
            return srv.json("POST", "/v1/models/tiny:predict", {"instances": [[i, i, i]] * 3})
        results = concurrently(client, 12)
        codes = [c for c, _ in results]
        assert 200 in codes and 503 in codes, codes
        for code, body in results:
            if code == 503:
                assert body["error"] == ("The batch scheduling queue to which this task was "
                                         "submitted is full")
            else:
                assert code == 200
        text = srv.request("GET", "/monitoring/prometheus/metrics")[1].decode()
        assert metric(text, "kiln_batch_queue_full_count") == codes.count(503)
        assert ':tensorflow:serving:request_count{model_name="tiny",status="UNAVAILABLE"}' in text
    finally:
        srv.kill()


def test_bad_parameters_file(tmp_path):
    save_affine(tmp_path / "m" / "1" / "model.onnx", 1.0, 0.0)
    bad = tmp_path / "bad.batching"
    bad.write_text("max_batch_size { value: 8 }\nallowed_batch_sizes: 4\n")
    r = subprocess.run([KILN, "serve", f"--model_base_path={tmp_path / 'm'}", "--enable_batching",
                        f"--batching_parameters_file={bad}"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert "Last entry in allowed_batch_sizes must match max_batch_size" in r.stderr, r.stderr
    bad.write_text("max_batch_sise { value: 8 }\n")
    r = subprocess.run([KILN, "serve", f"--model_base_path={tmp_path / 'm'}", "--enable_batching",
                        f"--batching_parameters_file={bad}"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "max_batch_sise" in r.stderr, r.stderr


def test_clients_sharing_a_server_thread_join_one_batch(tmp_path):
    """libmicrohttpd's threads accept several connections at a time, so two
    clients' connections often share one HTTP thread. A request waiting for
    its batch must not hold up the other connections of its thread: with as
    many threads as clients and a batch as large as all of them, every client
    lands in one run, closed because it is full (long before the timeout)."""
    srv = start(tmp_path, "share", """
        max_batch_size { value: 8 }
        batch_timeout_micros { value: 20000000 }
        num_batch_threads { value: 1 }
    """, save_scale, "--rest_api_num_threads=8")
    try:
        for round_ in range(3):
            def client(i):
                rows = [[float(round_ * 100 + i), 1.0]]
                return rows, srv.json("POST", "/v1/models/share:predict", {"instances": rows})
            for rows, (code, body) in concurrently(client, 8):
                assert code == 200, body
                assert body == {"predictions": (np.array(rows, np.float32) * 2).tolist()}
        text = srv.request("GET", "/monitoring/prometheus/metrics")[1].decode()
        runs = metric(text, ":tensorflow:serving:batching_session:wrapped_run_count")
        assert runs == 3, f"24 requests in {runs} runs (expected 3 full batches of 8)"
    finally:
        srv.kill()
