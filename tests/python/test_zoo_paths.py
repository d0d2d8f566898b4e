"""test_zoo_paths.py - every model of Kiln's zoo on every execution path, checked
against PyTorch: ctest `zoo_paths` in `make test`, and `make test-zoo-paths` alone
(the default path is test_zoo.py's, ctest `zoo`).

The paths are those test_models.py runs the bundled models on:

    fused-reference-kernels  KILN_FAST=0: plans on the reference kernels
    disable-optimizer        the imported graph on plans and fast kernels
    reference                --reference: imported graph, reference kernels, no plans
    avx2                     KILN_ISA=avx2: AVX2 kernels, layouts blocked by 8
    scalar                   KILN_ISA=scalar: the portable fallbacks

Each output must match PyTorch as test_zoo.py checks the default path (1e-4 of
the output's scale, or about as close to PyTorch's float64 run as PyTorch's
own float32 run is). The zoo is the cached export test_zoo.py uses (the models
are small: batch 2, 64x64 images; all 150 runs take about 30 s in the
RelWithDebInfo build, the reference path 0.65 s on wide_resnet50_2).
KILN_ZOO_PATHS=name,... runs only those paths; KILN_ZOO_HEAVY=0 leaves out the
heavy models as in test_zoo.py.
"""

import os

import pytest

from test_zoo import KNOWN_FAILURES, NAMES, check, kiln_bin, zoo  # noqa: F401

PATHS = {
    "fused-reference-kernels": ([], {"KILN_FAST": "0"}),
    "disable-optimizer": (["--disable-optimizer"], {}),
    "reference": (["--reference"], {}),
    "avx2": ([], {"KILN_ISA": "avx2"}),
    "scalar": ([], {"KILN_ISA": "scalar"}),
}
_only = [p for p in os.environ.get("KILN_ZOO_PATHS", "").split(",") if p]
assert all(p in PATHS for p in _only), f"KILN_ZOO_PATHS names unknown paths: {_only}"
CASES = [(n, p) for p in (_only or PATHS) for n in NAMES]


@pytest.mark.parametrize("name,path", [
    pytest.param(n, p, marks=pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[n]))
    if n in KNOWN_FAILURES else (n, p) for n, p in CASES])
def test_zoo_model_on_path(name, path, kiln_bin, zoo, tmp_path):  # noqa: F811
    args, env = PATHS[path]
    problems = check(name, kiln_bin, zoo / name, tmp_path, args=args, env=env)
    assert not problems, f"{name} ({path}): " + "; ".join(problems)
