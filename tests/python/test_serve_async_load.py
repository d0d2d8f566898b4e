"""Versions load on loader threads of their own (src/serve/manager.c): a
model removed from the config while one of its versions is still loading
leaves at once, the finished load is discarded (not served, not leaked:
the sanitizer build runs this too), and the server exits cleanly after.
The slow load is a long warmup, as in tests/soak/soak.py's slowload."""
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import test_serve
from test_serve import KILN, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "soak"))
import soak  # noqa: E402  (the warmup-file writer and config helper)

pytestmark = test_serve.pytestmark
WARMUP_S = 8  # how long version 2's warmup takes: long beside the config poll (1 s)


def warmup_iterations(tmp_path):
    """Iterations of the slow version's warmup that take about WARMUP_S here: timed with a
    short warmup first (a fixed count would race the config poll on a fast quiet machine
    and take minutes on a loaded one or in the sanitizer build)."""
    cal = tmp_path / "calibrate"
    cal.mkdir()
    soak.add_slow_version(cal, 1, soak.warmup_file(512))
    port = test_serve.free_port()
    with open(tmp_path / "calibrate.log", "w+") as log:
        srv = subprocess.Popen([KILN, "serve", f"--model_base_path={cal}", "--model_name=a",
                                f"--rest_api_port={port}", "--rest_api_address=127.0.0.1",
                                "--port=0", "--num_request_iterations_for_warmup=200"],
                               stdout=log, stderr=subprocess.STDOUT)
        try:
            assert wait_for(lambda: status(port, "a") == {1: "AVAILABLE"}, 120)
        finally:
            srv.kill()
            srv.wait()
        text = Path(log.name).read_text()
    assert "warmup_ms=" in text, text[-2000:]
    per_iter_ms = max(float(text.split("warmup_ms=")[1].split()[0]) / 200, 0.001)
    return int(WARMUP_S * 1000 / per_iter_ms) + 1


def status(port, name):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models/{name}", timeout=10) as r:
            return {int(v["version"]): v["state"] for v in json.load(r)["model_version_status"]}
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:  # not listening yet
        return None


def test_model_removed_while_its_version_loads(tmp_path):
    # The calibration is short, so a load spike during it can make the real warmup finish
    # before the config poll sees the model leave: that run says nothing, and the test
    # runs again with a warmup four times as long (at most three tries).
    iterations = warmup_iterations(tmp_path)
    for attempt in range(3):
        work = tmp_path / f"try{attempt}"
        work.mkdir()
        if removed_while_loading(work, iterations):
            return
        iterations *= 4
    raise AssertionError("the load finished before the model was removed in 3 tries, the last "
                         f"with {iterations // 4} warmup iterations: make it slower")


def removed_while_loading(tmp_path, iterations):
    """False when the load finished before the model was removed (no test); else asserts."""
    for n in ("a", "b"):
        (tmp_path / n).mkdir()
        soak.add_version(tmp_path / n, 1)
    cfg = tmp_path / "models.config"
    cfg.write_text(soak.config_text([("a", tmp_path / "a", ""), ("b", tmp_path / "b", "")]))
    port = test_serve.free_port()
    log = open(tmp_path / "serve.log", "w+")
    srv = subprocess.Popen([KILN, "serve", f"--model_config_file={cfg}",
                            "--model_config_file_poll_wait_seconds=1", f"--rest_api_port={port}",
                            "--rest_api_address=127.0.0.1", "--port=0",
                            "--file_system_poll_wait_seconds=1",
                            f"--num_request_iterations_for_warmup={iterations}"],
                           stdout=log, stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: status(port, "a") == {1: "AVAILABLE"}, 60)
        soak.add_slow_version(tmp_path / "a", 2, soak.warmup_file(512))
        assert wait_for(lambda: isinstance(status(port, "a"), dict)
                        and status(port, "a").get(2) == "LOADING", 20), status(port, "a")
        cfg.write_text(soak.config_text([("b", tmp_path / "b", "")]))
        t0 = time.time()
        assert wait_for(lambda: status(port, "a") == 404, 10)
        removed_s = time.time() - t0
        text = lambda: Path(tmp_path / "serve.log").read_text()  # noqa: E731
        loading = 'event=load model="a" version=2' not in text() and \
            'version=2 detail="loaded after its model left the config"' not in text()
        if not loading:
            return False
        assert removed_s < 5, removed_s
        assert wait_for(lambda: 'model="a" version=2 detail="loaded after its model left the '
                        'config"' in text(), 240), text()[-2000:]
        assert status(port, "b") == {1: "AVAILABLE"}
        srv.terminate()
        assert srv.wait(60) == 0, text()[-2000:]
        assert "Sanitizer" not in text(), text()[-4000:]
        return True
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
        log.close()
