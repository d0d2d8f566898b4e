#!/usr/bin/env bash
# Kiln quick start: install what is missing (as root, Debian 12), build, and serve
# the bundled digits classifier (models/digits/1/model.onnx, TF Serving's folder
# layout: model name, then numbered versions) with `kiln serve`. Prints the URLs
# (REST API, web console, Prometheus metrics) and a predict request to paste.
#
#   ./quickstart.sh                 serve in the foreground until Ctrl-C
#   ./quickstart.sh --once          send one predict, print the answer, stop the
#                                   server, exit 0 (non-zero on any failure; CI runs this)
#   ./quickstart.sh --port N        REST port (default 8501, or $KILN_PORT)
#   ./quickstart.sh --grpc-port N   gRPC port (default 8500, or $KILN_GRPC_PORT)
#   ./quickstart.sh --address A     address to listen on (default 127.0.0.1;
#                                   0.0.0.0 to reach it from another machine)
set -euo pipefail
cd "$(dirname "$0")"
once=0
port=${KILN_PORT:-8501}
grpc_port=${KILN_GRPC_PORT:-8500}
address=127.0.0.1
while [ $# -gt 0 ]; do
  case "$1" in
    --once) once=1 ;;
    --port) port=${2:?--port needs a value}; shift ;;
    --port=*) port=${1#*=} ;;
    --grpc-port) grpc_port=${2:?--grpc-port needs a value}; shift ;;
    --grpc-port=*) grpc_port=${1#*=} ;;
    --address) address=${2:?--address needs a value}; shift ;;
    --address=*) address=${1#*=} ;;
    -h|--help) sed -n 2,13p "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "quickstart.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [ "$(id -u)" = 0 ]; then scripts/install-deps.sh; fi
make build
# the Python API (import kiln, docs/PYTHON.md) next to the build, without touching the system
/usr/bin/python3 python/setup.py -q build --build-lib build/python >/dev/null
echo
build/kiln inspect models/digits/1/model.onnx
echo

host=$address
[ "$host" = 0.0.0.0 ] && host=localhost
base="http://$host:$port"
# a held-out digit (8x8 pixels, values 0..16) from the data set the model was not trained on
row=$(/usr/bin/python3 -c 'import numpy as np
x = np.load("models/digits_sample.npy")[0]
print("[" + ", ".join("%g" % v for v in x) + "]")')
label=$(/usr/bin/python3 -c 'import numpy as np; print(int(np.load("models/digits_sample_labels.npy")[0]))')
body="{\"instances\": [$row]}"

build/kiln serve --model_name=digits --model_base_path="$PWD/models/digits" \
  --rest_api_port="$port" --rest_api_address="$address" \
  --port="$grpc_port" --monitoring_config_file=models/monitoring_config.txt &
pid=$!
stop() { kill -TERM "$pid" 2>/dev/null || true; }
trap stop INT TERM
trap 'kill -TERM "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid" || true
    echo "quickstart.sh: kiln serve exited before it was ready (is port $port in use? try --port)" >&2
    exit 1
  fi
  curl -sf "$base/v2/health/ready" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sf "$base/v2/health/ready" >/dev/null || { echo "quickstart.sh: kiln serve not ready after 30 s" >&2; exit 1; }

cat <<EOT

Kiln is serving the digits classifier (version 1 under models/digits/):
  REST API      $base/v1/models/digits            (TF Serving's API; KServe v2 under /v2/)
  Web console   $base/console/
  Metrics       $base/monitoring/prometheus/metrics
  gRPC          $host:$grpc_port                   (TF Serving's PredictionService, ModelService, health, reflection)
  Python        PYTHONPATH=build/python /usr/bin/python3 -c 'import kiln; print(kiln.__doc__)'
                (kiln.InferenceSession("models/digits/1/model.onnx"), as in ONNX Runtime)

Predict one held-out 8x8 image of a $label (pixel values 0..16):
  curl -d '$body' \\
    $base/v1/models/digits:predict

EOT

if [ "$once" = 0 ]; then
  echo "Serving until Ctrl-C."
  wait "$pid" || true        # returns when a signal arrives (the trap stops the server) ...
  wait "$pid" 2>/dev/null || true   # ... then wait for it to drain and exit
  trap - EXIT
  exit 0
fi

# --once: one predict, checked against the true label; the console and metrics pages answer
reply=$(curl -sf -d "$body" "$base/v1/models/digits:predict")
echo "$reply"
got=$(printf '%s' "$reply" | /usr/bin/python3 -c 'import json, sys
p = json.load(sys.stdin)["predictions"][0]
print(max(range(len(p)), key=p.__getitem__))')
echo "predicted digit: $got, true digit: $label"
# the same image through the Python API, in-process
py=$(PYTHONPATH=build/python /usr/bin/python3 -c 'import numpy as np, kiln
s = kiln.InferenceSession("models/digits/1/model.onnx")
x = np.load("models/digits_sample.npy")[:1].astype(np.float32)
print(int(s.run(None, {s.get_inputs()[0].name: x})[0].argmax()))') \
  || { echo "quickstart.sh: the Python API failed" >&2; exit 1; }
echo "Python API (import kiln): predicted digit $py"
# gRPC: the standard health check on the gRPC port (HealthCheckResponse{status: SERVING} is 08 01)
grpc_health=$(/usr/bin/python3 -c 'import sys, grpc
ch = grpc.insecure_channel(sys.argv[1])
check = ch.unary_unary("/grpc.health.v1.Health/Check",
                       request_serializer=lambda b: b, response_deserializer=lambda b: b)
print("SERVING" if check(b"", timeout=10) == b"\x08\x01" else "NOT_SERVING")' "$host:$grpc_port") \
  || { echo "quickstart.sh: no gRPC answer on $host:$grpc_port" >&2; exit 1; }
echo "gRPC health check on $host:$grpc_port: $grpc_health"
curl -sf -o /dev/null "$base/console/" || { echo "quickstart.sh: the console did not answer" >&2; exit 1; }
curl -sf -o /dev/null "$base/monitoring/prometheus/metrics" || { echo "quickstart.sh: no metrics page" >&2; exit 1; }
trap - EXIT INT TERM
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" = 0 ] || { echo "quickstart.sh: kiln serve exited with status $rc" >&2; exit 1; }
[ "$got" = "$label" ] || { echo "quickstart.sh: wrong prediction" >&2; exit 1; }
[ "$grpc_health" = SERVING ] || { echo "quickstart.sh: gRPC health is $grpc_health" >&2; exit 1; }
[ "$py" = "$label" ] || { echo "quickstart.sh: wrong prediction from the Python API" >&2; exit 1; }
echo "quickstart.sh --once: OK"
