#!/usr/bin/python3
"""bench/ab.py - one model, one batch size: Kiln binaries against ONNX Runtime, interleaved.

    /usr/bin/python3 bench/ab.py MODEL_DIR BATCH [ROUNDS] [KILN ...]

MODEL_DIR holds model.onnx (a bench/models or zoo folder). Each round runs
every given kiln binary (`kiln bench --json --threads 2`) and then ONNX
Runtime (`node bench/ort_bench.js ... --threads 2`, the inputs from the same
signature as bench/compare.py builds them), each for about 1.5 s of runs; the
report is the median over the rounds per runtime and each Kiln's ratio to ONNX
Runtime. Two binaries (a build before a change and one after) share one ONNX
Runtime figure: on a machine whose speed drifts between minutes, only ratios
inside one run compare. Defaults: 5 rounds, build/kiln.
"""
import json
import os
import statistics
import subprocess
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
import compare as bc  # noqa: E402


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    md, batch = sys.argv[1], int(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    kilns = sys.argv[4:] or [os.path.join(os.path.dirname(BENCH), "build", "kiln")]
    model = os.path.join(md, "model.onnx")
    inputs, _ = bc.signature(kilns[0], model)
    spec = bc.input_spec(inputs, batch)
    res = {k: [] for k in kilns + ["ort"]}
    est = {}
    for _ in range(rounds):
        for k in kilns + ["ort"]:
            n = max(20, min(3000, int(1500 / max(est.get(k, 5.0), 0.01))))
            common = ["--batch", str(batch), "--iterations", str(n), "--warmup", "5",
                      "--threads", "2"]
            if k == "ort":
                cmd = [bc.NODE, os.path.join(BENCH, "ort_bench.js"), model, "--spec",
                       json.dumps(spec)] + common
            else:
                cmd = [k, "bench", model, "--json"] + common
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"{' '.join(cmd[:3])}: {p.stderr.strip()[-400:]}")
            est[k] = bc.last_json(p.stdout)["median_ms"]
            res[k].append(est[k])
    o = statistics.median(res["ort"])
    for k in kilns:
        v = statistics.median(res[k])
        print(f"{os.path.basename(os.path.normpath(md))} b{batch} {k}: {v:.4f} ms  "
              f"ort {o:.4f} ms  ratio {v / o:.3f}")


if __name__ == "__main__":
    main()
