#!/bin/bash
# bench/serve/run.sh - the serving benchmark: `kiln serve` against Flask +
# PyTorch (gunicorn) and Node.js + onnxruntime-node, driven by wrk on this
# machine; results in the serve section of bench/RESULTS.md (see
# bench/serve/serve_bench.py's docstring for what is measured and how).
#
# It prepares what it needs, skipping what is already there:
#   1. the kiln binary ($KILN_BIN, default build/kiln; built if missing);
#   2. wrk, gunicorn, Flask, PyTorch (Debian packages; apt-get as root),
#      node and onnxruntime-node (bench/node_modules, as bench/run.sh does);
#   3. the models (tools/export_models.py into bench/models/<name>/).
#
# Environment:
#   SERVE_QUICK=1      3 s per wrk run, one round (about 3 minutes)
#   SERVE_DURATION     seconds per wrk run (default 10; quick 3)
#   SERVE_ROUNDS       rounds, servers rotating order each round (default 2; quick 1)
#   SERVE_MODELS       default tabular_mlp,resnet18
#   SERVE_CONNS        default 1,16,64
#   KILN_BIN           the kiln binary to measure (default build/kiln)
# Arguments are passed on to serve_bench.py (e.g. --servers kiln,node).
#
# Not part of `make test`.
set -euo pipefail

cd "$(dirname "$0")/../.."
SERVE_QUICK=${SERVE_QUICK:-0}
if [ "$SERVE_QUICK" = 1 ]; then
    SERVE_DURATION=${SERVE_DURATION:-3}
    SERVE_ROUNDS=${SERVE_ROUNDS:-1}
else
    SERVE_DURATION=${SERVE_DURATION:-10}
    SERVE_ROUNDS=${SERVE_ROUNDS:-2}
fi
SERVE_MODELS=${SERVE_MODELS:-tabular_mlp,resnet18}
SERVE_CONNS=${SERVE_CONNS:-1,16,64}
KILN_BIN=${KILN_BIN:-build/kiln}
PYTHON=/usr/bin/python3

say() { echo "bench/serve: $*" >&2; }
die() { say "$*"; exit 1; }

apt_updated=0
apt_install() {
    if [ "$(id -u)" != 0 ]; then
        die "missing $*; install them (apt-get install $*) or run as root"
    fi
    if [ "$apt_updated" = 0 ]; then
        apt-get update >&2 || die "apt-get update failed"
        apt_updated=1
    fi
    say "installing $* (apt)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >&2 ||
        die "apt-get install $* failed"
}

# 1. Kiln
if [ ! -x "$KILN_BIN" ]; then
    say "building kiln ($KILN_BIN is missing)"
    cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build build -j"$(nproc)"
    KILN_BIN=build/kiln
fi

# 2. Peers and the load generator
want=
command -v wrk >/dev/null || want="$want wrk"
command -v gunicorn >/dev/null || want="$want gunicorn"
$PYTHON -c 'import flask' 2>/dev/null || want="$want python3-flask"
$PYTHON -c 'import numpy, onnx, torch, torchvision' 2>/dev/null ||
    want="$want python3-numpy python3-onnx python3-torch python3-torchvision"
{ command -v node >/dev/null && command -v npm >/dev/null; } || want="$want nodejs npm"
# shellcheck disable=SC2086
[ -z "$want" ] || apt_install $want
want_ort=$(sed -n 's/.*"onnxruntime-node": *"\([^"]*\)".*/\1/p' bench/package.json)
have_ort=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' \
    bench/node_modules/onnxruntime-node/package.json 2>/dev/null | head -n 1 || true)
if [ "$have_ort" != "$want_ort" ]; then
    say "installing onnxruntime-node $want_ort into bench/node_modules (npm)"
    (cd bench && npm install --ignore-scripts --no-audit --no-fund >&2) ||
        die "npm install onnxruntime-node failed (is the npm registry reachable?)"
fi

# 3. Models
missing=
for m in ${SERVE_MODELS//,/ }; do
    [ -f "bench/models/$m/model.onnx" ] || missing="$missing${missing:+,}$m"
done
if [ -n "$missing" ]; then
    say "exporting $missing into bench/models"
    $PYTHON tools/export_models.py --out bench/models --models "$missing" >&2
fi

# 4. Measure
command="SERVE_QUICK=$SERVE_QUICK SERVE_DURATION=$SERVE_DURATION SERVE_ROUNDS=$SERVE_ROUNDS"
[ "$SERVE_MODELS" = tabular_mlp,resnet18 ] || command="$command SERVE_MODELS=$SERVE_MODELS"
[ "$SERVE_CONNS" = 1,16,64 ] || command="$command SERVE_CONNS=$SERVE_CONNS"
[ "$KILN_BIN" = build/kiln ] || command="$command KILN_BIN=$KILN_BIN"
command="$command bench/serve/run.sh${*:+ $*}"
exec $PYTHON bench/serve/serve_bench.py --models "$SERVE_MODELS" --conns "$SERVE_CONNS" \
    --duration "$SERVE_DURATION" --rounds "$SERVE_ROUNDS" --kiln "$KILN_BIN" \
    --command "$command" "$@"
