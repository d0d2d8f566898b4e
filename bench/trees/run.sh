#!/bin/bash
# bench/trees/run.sh - gradient-boosted trees: Kiln against XGBoost's predict
# and ONNX Runtime (bench/trees/bench_trees.py says what is measured).
#
# Installs onnxruntime-node into bench/node_modules when missing (the version
# pinned in bench/package.json, npm --ignore-scripts, as bench/run.sh does),
# builds kiln when build/kiln is missing, then runs bench_trees.py with the
# arguments given (e.g. --quick for a smoke run, --threads 4, --batches 1,64,1024).
set -euo pipefail
cd "$(dirname "$0")/../.."
KILN_BIN=${KILN_BIN:-build/kiln}
if [ ! -x "$KILN_BIN" ]; then
    cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build build -j"$(nproc)"
fi
if [ ! -d bench/node_modules/onnxruntime-node ]; then
    echo "bench/trees: installing onnxruntime-node into bench/node_modules (npm)" >&2
    (cd bench && npm install --ignore-scripts --no-audit --no-fund >&2)
fi
exec /usr/bin/python3 bench/trees/bench_trees.py --kiln "$KILN_BIN" "$@"
