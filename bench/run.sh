#!/bin/bash
# bench/run.sh - Kiln's benchmark harness: Kiln against ONNX Runtime and
# PyTorch on real architectures, results in bench/RESULTS.md.
#
# It prepares what it needs, skipping what is already there, then runs
# bench/compare.py (see its docstring for what is measured and how):
#   1. the kiln binary ($KILN_BIN, default build/kiln; built if missing);
#   2. the peers: PyTorch from Debian (python3-torch, python3-torchvision;
#      apt-get as root), ONNX Runtime from npm (onnxruntime-node, the version
#      pinned in bench/package.json, installed into bench/node_modules with
#      --ignore-scripts: the package ships its CPU library, and the install
#      script only fetches GPU extras);
#   3. the models, exported with random weights and fixed seeds by
#      tools/export_models.py into bench/models/<name>/.
#
# Environment:
#   BENCH_QUICK=1      small models only (tabular_mlp, dlrm, bert_small,
#                      mobilenet_v2), 2 rounds, fewer runs: minutes, not hours
#   BENCH_BERT_BASE=0  leave out bert_base (12 layers, hidden 768; exporting
#                      it takes about 10 minutes and 440 MB, and PyTorch here
#                      takes about 50 s a run at batch 8). On by default,
#                      except with BENCH_QUICK=1.
#   KILN_BIN           the kiln binary to measure (default build/kiln)
# Arguments are passed on to compare.py (e.g. --rounds 5, --models resnet18).
#
# `make bench` builds Kiln and runs this. It is not part of `make test`.
set -euo pipefail

cd "$(dirname "$0")/.."
BENCH_QUICK=${BENCH_QUICK:-0}
if [ "$BENCH_QUICK" = 1 ]; then BENCH_BERT_BASE=${BENCH_BERT_BASE:-0}; else BENCH_BERT_BASE=${BENCH_BERT_BASE:-1}; fi
KILN_BIN=${KILN_BIN:-build/kiln}
PYTHON=/usr/bin/python3

say() { echo "bench: $*" >&2; }
die() { say "$*"; exit 1; }

# Install Debian packages when missing, as root only.
apt_install() {
    if [ "$(id -u)" != 0 ]; then
        die "missing $*; install them (apt-get install $*) or run as root"
    fi
    say "installing $* (apt)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >&2 ||
        { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y --no-install-recommends "$@" >&2; } ||
        die "apt-get install $* failed"
}

# 1. Kiln
if [ ! -x "$KILN_BIN" ]; then
    say "building kiln ($KILN_BIN is missing)"
    cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build build -j"$(nproc)"
    KILN_BIN=build/kiln
fi

# 2. Peers
if ! $PYTHON -c 'import numpy, onnx, torch, torchvision' 2>/dev/null; then
    apt_install python3-numpy python3-onnx python3-torch python3-torchvision
fi
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    apt_install nodejs npm
fi
want_ort=$(sed -n 's/.*"onnxruntime-node": *"\([^"]*\)".*/\1/p' bench/package.json)
have_ort=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' \
    bench/node_modules/onnxruntime-node/package.json 2>/dev/null | head -n 1 || true)
if [ "$have_ort" != "$want_ort" ]; then
    say "installing onnxruntime-node $want_ort into bench/node_modules (npm)"
    (cd bench && npm install --ignore-scripts --no-audit --no-fund >&2) ||
        die "npm install onnxruntime-node failed (is the npm registry reachable?)"
fi

# 3. Models
if [ "$BENCH_QUICK" = 1 ]; then
    models=tabular_mlp,dlrm,bert_small,mobilenet_v2
    quick=--quick
else
    models=resnet18,resnet50,mobilenet_v2,efficientnet_b0,bert_small,tabular_mlp,dlrm
    quick=
fi
missing=
for m in ${models//,/ }; do
    [ -f "bench/models/$m/model.onnx" ] || missing="$missing${missing:+,}$m"
done
bert_base=
if [ "$BENCH_BERT_BASE" = 1 ]; then
    models="$models,bert_base"
    [ -f bench/models/bert_base/model.onnx ] || bert_base=--bert-base
fi
if [ -n "$missing" ] || [ -n "$bert_base" ]; then
    say "exporting ${missing:-}${bert_base:+ bert_base} into bench/models"
    $PYTHON tools/export_models.py --out bench/models --models "$missing" $bert_base >&2
fi

# 4. Measure
command="BENCH_QUICK=$BENCH_QUICK BENCH_BERT_BASE=$BENCH_BERT_BASE"
[ "$KILN_BIN" = build/kiln ] || command="$command KILN_BIN=$KILN_BIN"
command="$command bench/run.sh${*:+ $*}"
exec $PYTHON bench/compare.py $quick --models "$models" --kiln "$KILN_BIN" \
    --command "$command" "$@"
