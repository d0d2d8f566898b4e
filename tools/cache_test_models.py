#!/usr/bin/python3
"""cache_test_models.py - export the tests' real models once and keep them.

The whole-model tests (tests/python/test_models.py) and the optimizer's
differential tests on real models (tests/c/unit_opt.c) need the models that
tools/export_models.py builds (random weights, fixed seeds). Exporting takes
a while, so this exports them into a cache folder outside the repository
(the test suite uses build/test-models/) and exports again only what is
missing or was written by a different exporter: each model folder holds a
.export-key file with a hash of export_models.py, this file, the opset and
the torch version. A model is exported into a temporary folder and renamed
into place, so a test never reads a half-written model and two builds
sharing the cache do not collide.

Usage (ctest runs it as the fixture `export_test_models`):
    /usr/bin/python3 tools/cache_test_models.py --out DIR [--models a,b,...]
Exit status 0 when every model is in DIR; 77 (ctest's skip code) when
PyTorch or torchvision is not installed, or 1 when KILN_REQUIRE_TESTDATA=1
(CI has them, so their absence there is a failure). Importable:
cached_model(name, cache_dir) -> folder of that model.
"""

import argparse
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXPORT_SCRIPT = HERE / "export_models.py"
# the small models: the ones test_models.py checks, and unit_opt.c's except resnet50
TEST_MODELS = ["resnet18", "mobilenet_v2", "efficientnet_b0", "bert_small", "tabular_mlp", "dlrm"]
SKIP_CODE = 77

_exporter = None


def _load_exporter():
    global _exporter
    if _exporter is None:
        spec = importlib.util.spec_from_file_location("kiln_export_models", EXPORT_SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _exporter = module
    return _exporter


def export_key(opset):
    """Identity of what an export produces: the exporter's code (its default opset
    included), the opset asked for and the torch and onnx versions. Reading the
    versions from the package metadata spares importing torch when nothing is stale."""
    h = hashlib.sha256()
    h.update(EXPORT_SCRIPT.read_bytes())
    h.update(Path(__file__).read_bytes())
    versions = " ".join(f"{m}={importlib.metadata.version(m)}" for m in ("torch", "onnx"))
    h.update(f"opset={opset} {versions}".encode())
    return h.hexdigest()[:16]


def cached_model(name, cache_dir, opset=None):
    """Folder cache_dir/name holding model.onnx, inputs/ and expected/, exported now
    unless a folder with the same export key is already there."""
    key = export_key(opset or "default")
    cache_dir = Path(cache_dir)
    dest = cache_dir / name
    stamp = dest / ".export-key"
    if stamp.is_file() and stamp.read_text().strip() == key:
        return dest
    exporter = _load_exporter()
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=cache_dir))
    try:
        exporter.export_model(name, str(tmp), opset or exporter.DEFAULT_OPSET)
        (tmp / name / ".export-key").write_text(key + "\n")
        if dest.exists():  # stale: move aside, then replace
            old = Path(tempfile.mkdtemp(prefix=f".old-{name}-", dir=cache_dir))
            os.rename(dest, old / name)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp / name, dest)
        except OSError:
            # another process put a fresh copy there first; keep it if it is current
            if not (stamp.is_file() and stamp.read_text().strip() == key):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="cache folder")
    ap.add_argument("--models", default=",".join(TEST_MODELS))
    args = ap.parse_args()
    required = os.environ.get("KILN_REQUIRE_TESTDATA") == "1"
    for mod in ("torch", "torchvision", "onnx"):
        if importlib.util.find_spec(mod) is None:
            print(f"{'FAIL' if required else 'SKIP'}: Python module '{mod}' is not installed, "
                  f"so the test models cannot be exported (scripts/install-deps.sh installs it)")
            return 1 if required else SKIP_CODE
    for name in [n for n in args.models.split(",") if n]:
        t0 = time.monotonic()
        path = cached_model(name, args.out)
        print(f"{name}: {path} ({time.monotonic() - t0:.1f}s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
