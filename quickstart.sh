#!/usr/bin/env bash
# Kiln quick start: install what is missing, build, and run a prediction
# with the bundled digits classifier (models/digits/1/model.onnx).
set -euo pipefail
cd "$(dirname "$0")"
if [ "$(id -u)" = 0 ]; then scripts/install-deps.sh; fi
make build
echo
build/kiln inspect models/digits/1/model.onnx
echo
out=$(mktemp -d)
build/kiln predict models/digits/1/model.onnx --input pixels=models/digits_sample.npy --output-dir "$out"
/usr/bin/python3 - "$out" <<'PY'
import sys, numpy as np
p = np.load(sys.argv[1] + "/probabilities.npy")
labels = np.load("models/digits_sample_labels.npy")
print("predicted digits:", p.argmax(axis=1).tolist(), " true digits:", labels.tolist())
PY
