#!/usr/bin/env bash
# Install what Kiln needs to build and test on Debian 12 (run as root).
# Build: gcc, cmake, protobuf-c, oneDNN (libdnnl-dev), libmicrohttpd, zlib. Tests: Debian's Python with numpy, onnx,
# torch/torchvision (model exports), scikit-learn (the digits model), pytest;
# clang for the libFuzzer targets; curl (quickstart.sh), Chromium and Node.js + npm
# (the web console's browser test, tests/browser/).
set -euo pipefail
pkgs=(build-essential cmake pkg-config protobuf-c-compiler libprotobuf-c-dev zlib1g-dev libmicrohttpd-dev libdnnl-dev
      libnghttp2-dev protobuf-compiler libprotobuf-dev python3-grpcio python3-protobuf
      python3 python3-numpy python3-onnx python3-pytest python3-torch python3-torchvision
      python3-sklearn clang curl chromium)
pkgs+=(python3-dev python3-setuptools python3-pip)  # the Python API, python/ (docs/PYTHON.md)
pkgs+=(libsodium-dev python3-cryptography)  # signed and encrypted models (docs/SECURITY.md)
pkgs+=(python3-yaml python3-jsonschema)  # checking deploy/k8s manifests (docs/DEPLOY.md)
pkgs+=(libgnutls28-dev openssl)  # TLS on both ports; test certificates (tests/python/test_rest_tls.py)
# Node.js: Debian's nodejs and npm, unless a node with npm is already installed
# (e.g. NodeSource's nodejs, which bundles npm and conflicts with Debian's npm)
command -v npm >/dev/null 2>&1 || pkgs+=(nodejs npm)
pkgs+=(python3-xgboost)  # XGBoost model files: tests/python/test_xgboost.py, bench/trees
pkgs+=(prometheus)  # promtool and a real Prometheus: deploy/prometheus, tests/python/test_dashboards.py,
                    # kiln rollout-controller (tests/python/test_rollout.py)
pkgs+=(wrk)  # load: the shadow traffic check (tests/python/test_shadow.py), soak tests (tests/soak/)
pkgs+=(dpkg-dev)  # make deb (dpkg-shlibdeps, dpkg-deb)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}"
fi
# The gRPC test's second client stack (@grpc/grpc-js), when npm is there.
if command -v npm >/dev/null && [ ! -d "$(dirname "$0")/../tests/node/node_modules/@grpc/grpc-js" ]; then
  (cd "$(dirname "$0")/../tests/node" && npm ci --no-audit --no-fund --ignore-scripts) || echo "npm ci failed: the Node gRPC test will skip"
fi
# ONNX Runtime (onnxruntime-node ships its CPU library; no install scripts needed) for the
# benchmark's peer and test_emit_onnx.py's check of `kiln compile --emit-onnx` files.
if command -v npm >/dev/null && [ ! -d "$(dirname "$0")/../bench/node_modules/onnxruntime-node" ]; then
  (cd "$(dirname "$0")/../bench" && npm ci --no-audit --no-fund --ignore-scripts) || echo "npm ci failed: the ONNX Runtime checks will skip"
fi
