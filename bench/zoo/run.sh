#!/bin/bash
# bench/zoo/run.sh - Kiln against ONNX Runtime and PyTorch on the model zoo
# (tools/export_zoo.py: 25 architectures beyond the eight benchmark models).
#
# Prepares what it needs, as bench/run.sh does, then runs bench/zoo/compare.py:
#   1. the kiln binary ($KILN_BIN, default build/kiln; built if missing);
#   2. onnxruntime-node in bench/node_modules (the version bench/package.json pins);
#   3. the zoo, exported once into $KILN_ZOO_DIR (default ~/.cache/kiln/zoo),
#      models already exported by the same scripts skipped.
# Arguments go to compare.py, e.g.
#   bench/zoo/run.sh --quick --models squeezenet1_1,tcn,gru_classifier   (a smoke run)
#   bench/zoo/run.sh --batch 8 --out /tmp/zoo.md                          (the whole zoo)
# The report is printed (and written to --out); bench/RESULTS.md is not touched.
set -euo pipefail

cd "$(dirname "$0")/../.."
KILN_BIN=${KILN_BIN:-build/kiln}
PYTHON=/usr/bin/python3
say() { echo "bench/zoo: $*" >&2; }

if [ ! -x "$KILN_BIN" ]; then
    say "building kiln ($KILN_BIN is missing)"
    cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build build -j"$(nproc)"
    KILN_BIN=build/kiln
fi
$PYTHON -c 'import numpy, onnx, torch, torchvision' ||
    { say "needs python3-numpy python3-onnx python3-torch python3-torchvision (apt)"; exit 1; }
want_ort=$(sed -n 's/.*"onnxruntime-node": *"\([^"]*\)".*/\1/p' bench/package.json)
have_ort=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' \
    bench/node_modules/onnxruntime-node/package.json 2>/dev/null | head -n 1 || true)
if [ "$have_ort" != "$want_ort" ]; then
    say "installing onnxruntime-node $want_ort into bench/node_modules (npm)"
    (cd bench && npm install --ignore-scripts --no-audit --no-fund >&2)
fi

# Export only the models asked for (--models a,b or --models=a,b), else the whole zoo.
models=
prev=
for a in "$@"; do
    case "$a" in --models=*) models=${a#--models=} ;; esac
    [ "$prev" = --models ] && models=$a
    prev=$a
done
$PYTHON tools/export_zoo.py ${models:+--models "$models"} >&2

exec $PYTHON bench/zoo/compare.py --kiln "$KILN_BIN" "$@"
