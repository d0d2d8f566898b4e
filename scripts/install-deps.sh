#!/usr/bin/env bash
# Install what Kiln needs to build and test on Debian 12 (run as root).
# Build: gcc, cmake, protobuf-c, oneDNN (libdnnl-dev), libmicrohttpd, zlib. Tests: Debian's Python with numpy, onnx,
# torch/torchvision (model exports), scikit-learn (the digits model), pytest;
# clang for the libFuzzer targets.
set -euo pipefail
pkgs=(build-essential cmake pkg-config protobuf-c-compiler libprotobuf-c-dev zlib1g-dev libmicrohttpd-dev libdnnl-dev
      libnghttp2-dev protobuf-compiler libprotobuf-dev python3-grpcio python3-protobuf
      python3 python3-numpy python3-onnx python3-pytest python3-torch python3-torchvision
      python3-sklearn clang)
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
