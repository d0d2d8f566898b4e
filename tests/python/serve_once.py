"""serve_once.py - start `kiln serve` on a model folder, send one TF Serving
:predict request, stop it. Shared by the tabular tests (not a test module)."""

import http.client
import json
import socket
import subprocess
import time


def serve_predict(kiln_bin, base, name, instances):
    """Start kiln serve on base (version folders), POST :predict, return the JSON reply."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(base.parent / f"{name}.log", "w+")
    proc = subprocess.Popen([kiln_bin, "serve", f"--model_base_path={base}", f"--model_name={name}",
                             f"--rest_api_port={port}", "--rest_api_address=127.0.0.1"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while True:
            assert proc.poll() is None, (log.seek(0), log.read())[1]
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                c.request("POST", f"/v1/models/{name}:predict", body=json.dumps({"instances": instances}))
                r = c.getresponse()
                body = r.read()
                c.close()
                if r.status == 200:
                    return json.loads(body)
                assert r.status in (404, 503), body
            except OSError:
                pass
            assert time.time() < deadline, "server not ready in 60 s"
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        log.close()

