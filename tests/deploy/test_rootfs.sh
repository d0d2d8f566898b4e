#!/usr/bin/env bash
# test_rootfs.sh - the container's runtime root filesystem, tested without a
# container engine: deploy/rootfs.sh builds it (kiln, exactly the libraries
# ldd lists, a non-root user) with an affine model y = 2x + 1, and the
# server runs from it isolated -- its own mount and PID namespaces, the
# tree as its read-only root (unshare --root) with /proc mounted as a
# container runtime does, as uid 10001 -- with the
# container's environment (MODEL_NAME, MODEL_BASE_PATH=/models). It must
# answer a predict on loopback with 2x + 1, and `kiln healthcheck` (the
# image's HEALTHCHECK) run from the same tree must pass.
# usage: test_rootfs.sh KILN_BINARY   (exit 77: skipped, needs root and unshare)
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
if [ "$(id -u)" != 0 ] || ! unshare --mount --pid --fork true 2>/dev/null; then
  echo "skipped: needs root and unshare (mount and PID namespaces)"
  exit 77
fi
work=$(mktemp -d)
pid=
port=
cleanup() {
  # unshare --fork ignores SIGTERM while it waits; SIGKILL ends it. Its
  # --kill-child does not reach the server: the inner unshare's --setuid
  # clears the parent-death signal, so the server (PID 1 of its namespace)
  # is ended by its command line, which names this run's port
  if [ -n "$port" ]; then
    pkill -KILL -f -- "kiln serve --rest_api_port=$port --rest_api_address=127.0.0.1" 2>/dev/null || true
  fi
  if [ -n "$pid" ]; then kill -KILL "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
/usr/bin/python3 - "$work/base/1/model.onnx" <<'PY'
import sys
from pathlib import Path
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
inits = [numpy_helper.from_array(np.array(2.0, np.float32), "a"),
         numpy_helper.from_array(np.array(1.0, np.float32), "b")]
nodes = [helper.make_node("Mul", ["x", "a"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])]
p = Path(sys.argv[1]); p.parent.mkdir(parents=True)
onnx.save(helper.make_model(helper.make_graph(nodes, "affine", [x], [y], inits),
                            opset_imports=[helper.make_opsetid("", 13)]), str(p))
PY
root="$work/rootfs"
"$repo/deploy/rootfs.sh" "$bin" "$root" "$work/base" affine
# nothing beyond the binary, its libraries and the loader
extra=$(cd "$root" && find . -type f ! -path './lib*' ! -path './usr/lib/*' ! -path './models/*' \
        ! -name kiln ! -name passwd ! -name group)
[ -z "$extra" ] || { echo "FAIL: unexpected files in the rootfs: $extra"; exit 1; }
# a container runtime mounts /proc (and the sanitizer runtimes need it)
mkdir "$root/proc"
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
env -i MODEL_NAME=affine MODEL_BASE_PATH=/models \
  unshare --mount --pid --fork --kill-child sh -c '
    mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" &&
    mount -t proc proc "$0/proc" &&
    exec unshare --root="$0" --setuid 10001 --setgid 10001 \
      /usr/bin/kiln serve --rest_api_port="$1" --rest_api_address=127.0.0.1' "$root" "$port" \
  > "$work/serve.log" 2>&1 &
pid=$!
ready=0
for _ in $(seq 1 100); do
  if unshare --mount --pid --fork sh -c 'mount -t proc proc "$0/proc" &&
       exec unshare --root="$0" /usr/bin/kiln healthcheck --port "$1"' "$root" "$port" \
       2>/dev/null; then ready=1; break; fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.2
done
[ $ready = 1 ] || { echo "FAIL: not ready"; cat "$work/serve.log"; exit 1; }
/usr/bin/python3 - "$port" <<'PY'
import json, sys, urllib.request
port = sys.argv[1]
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models/affine:predict",
                             data=json.dumps({"instances": [[1, 2, 3], [-1, 0, 0.5]]}).encode())
body = json.load(urllib.request.urlopen(req, timeout=30))
want = [[2 * v + 1 for v in row] for row in [[1, 2, 3], [-1, 0, 0.5]]]
assert body == {"predictions": want}, body
status = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models/affine", timeout=30))
assert status["model_version_status"][0]["state"] == "AVAILABLE", status
PY
grep -q "Exporting HTTP/REST API" "$work/serve.log" || { echo "FAIL: log"; cat "$work/serve.log"; exit 1; }
echo "ok: served from $(du -sh "$root" | cut -f1) rootfs, read-only, as uid 10001"
