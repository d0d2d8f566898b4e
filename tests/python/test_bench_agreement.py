"""test_bench_agreement.py - bench/compare.py's agreement rule (the "agree" column of
bench/RESULTS.md's tables): within --tol, or for Kiln within 1.5x ONNX Runtime's own
distance from PyTorch, never with a failed runtime or a peer itself far off."""

import importlib.util
import math
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("bench_compare", REPO / "bench" / "compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def pairs(kp, op, ko, pe=0.0):
    return {"kiln/pytorch": kp, "onnxruntime/pytorch": op, "kiln/onnxruntime": ko,
            "pytorch/export": pe}


def test_agreement_rule():
    ok = load().agreement_ok
    tol = 1e-4
    assert ok(pairs(5e-5, 4e-5, 3e-5), {}, tol)
    # inception_v3 on an AVX2 CPU: Kiln 1.2e-4 from PyTorch where ONNX Runtime is 1.0e-4
    assert ok(pairs(1.2e-4, 1.0e-4, 9.2e-5), {}, tol)
    assert not ok(pairs(1.6e-4, 1.0e-4, 9.2e-5), {}, tol)  # beyond 1.5x the peer's
    assert not ok(pairs(1.2e-4, 2e-5, 5e-5), {}, tol)      # the peer is close: Kiln is not
    assert not ok(pairs(2e-4, 1.6e-4, 5e-5), {}, tol)      # the peer itself too far off
    assert not ok(pairs(5e-5, 4e-5, 3e-5, 2e-4), {}, tol)  # PyTorch is not the exported module
    assert not ok(pairs(5e-5, 4e-5, 3e-5), {"kiln": "failed"}, tol)
    assert not ok(pairs(math.inf, 4e-5, math.inf), {}, tol)  # a shape mismatch
