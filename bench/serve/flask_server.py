#!/usr/bin/python3
"""flask_server.py - the classic PyTorch microservice, as the serving
benchmark's baseline: a Flask app that loads the benchmark model's own
PyTorch nn.Module and answers TF Serving's REST predict call,

    POST /v1/models/<name>:predict   {"instances": [...]}  ->  {"predictions": [...]}

with one model(x) per request (no batching across requests).

The module is bench/models/<name>/torch_model.pt, which `bench/torch_bench.py
prepare` rebuilds from tools/export_models.py with the exporter's seeds (the
same weights as model.onnx; bench/serve/serve_bench.py checks the answers
against Kiln's and ONNX Runtime's before measuring).

Configuration (environment, so that gunicorn can import `app`):
    SERVE_MODEL_DIR      bench/models/<name> (required)
    SERVE_MODEL_NAME     the name in the URL (default: the folder's name)
    SERVE_TORCH_THREADS  torch.set_num_threads (default 1: one per worker)

Run under gunicorn (what serve_bench.py does):
    gunicorn -w 5 -b 127.0.0.1:PORT --chdir bench/serve flask_server:app
or alone with Flask's threaded development server:
    SERVE_MODEL_DIR=bench/models/tabular_mlp /usr/bin/python3 bench/serve/flask_server.py PORT
"""

import os
import sys

import numpy as np
import torch
from flask import Flask, jsonify, request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools"))
import export_models  # noqa: E402,F401  (the pickled module classes live there)

MODEL_DIR = os.environ["SERVE_MODEL_DIR"]
MODEL_NAME = os.environ.get("SERVE_MODEL_NAME") or os.path.basename(os.path.normpath(MODEL_DIR))

torch.set_num_threads(int(os.environ.get("SERVE_TORCH_THREADS", "1")))
model = torch.load(os.path.join(MODEL_DIR, "torch_model.pt")).eval()

app = Flask(__name__)


@app.route(f"/v1/models/{MODEL_NAME}:predict", methods=["POST"])
def predict():
    body = request.get_json(force=True, silent=True)
    if not isinstance(body, dict) or "instances" not in body:
        return jsonify(error="expected a JSON object with \"instances\""), 400
    try:
        x = torch.from_numpy(np.asarray(body["instances"], dtype=np.float32))
    except (TypeError, ValueError) as e:
        return jsonify(error=f"instances: {e}"), 400
    with torch.inference_mode():
        y = model(x)
    return jsonify(predictions=y.numpy().tolist())


@app.route(f"/v1/models/{MODEL_NAME}", methods=["GET"])
def status():
    return jsonify(model_version_status=[{"version": "1", "state": "AVAILABLE"}])


if __name__ == "__main__":
    app.run(host="127.0.0.1", port=int(sys.argv[1]) if len(sys.argv) > 1 else 8502,
            threaded=True)
