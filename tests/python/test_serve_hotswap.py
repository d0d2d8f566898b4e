"""End-to-end tests for `kiln serve` changing versions under load: client
threads hammer predict while version folders appear and disappear, labels
move (config file re-read) and half-copied versions (empty folder, truncated
model file) show up. Every response must be a 200 from one of the versions
that were whole on disk; none may fail.
"""

import shutil
import threading
import time

import pytest

import test_serve
from test_serve import save_affine, wait_for
from test_serve_config import ConfigServer

pytestmark = test_serve.pytestmark

X = [[1, 2, 3]]


def answer(a):
    return {"predictions": [[a * 1, a * 2, a * 3]]}


class Hammer:
    """n threads posting predict to path until stopped; records every reply."""

    def __init__(self, srv, path, n=3):
        self.srv, self.path = srv, path
        self.replies = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run) for _ in range(n)]
        for t in self.threads:
            t.start()

    def run(self):
        while not self.stop.is_set():
            try:
                r = self.srv.json("POST", self.path, {"instances": X}, timeout=30)
            except Exception as e:  # noqa: BLE001 (a dropped connection is a failure too)
                r = ("exception", repr(e))
            with self.lock:
                self.replies.append(r)

    def count(self):
        with self.lock:
            return len(self.replies)

    def last(self):
        with self.lock:
            return self.replies[-1] if self.replies else None

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(60)
        return self.replies


def states(srv, name):
    code, body = srv.json("GET", f"/v1/models/{name}")
    assert code == 200, body
    return {int(v["version"]): (v["state"], v["status"]["error_message"])
            for v in body["model_version_status"]}


def test_versions_come_and_go_under_load(tmp_path):
    base = tmp_path / "hs"
    save_affine(base / "1" / "model.onnx", 1.0, 0.0)
    srv = test_serve.Server(base, "hs")
    hammer = Hammer(srv, "/v1/models/hs:predict")
    try:
        assert wait_for(lambda: hammer.count() > 20)
        # version 2 appears whole (renamed into place, as a deploy does)
        save_affine(tmp_path / "staging" / "model.onnx", 10.0, 0.0)
        shutil.move(str(tmp_path / "staging"), str(base / "2"))
        assert wait_for(lambda: states(srv, "hs").get(1, ("",))[0] == "END"), states(srv, "hs")
        assert states(srv, "hs")[2][0] == "AVAILABLE"
        shutil.rmtree(base / "1")  # the old folder removed while requests flow
        n = hammer.count()
        assert wait_for(lambda: hammer.count() > n + 20)
        assert hammer.last() == (200, answer(10))

        # a half-copied version 3: an empty folder, then a truncated model file
        (base / "3").mkdir()
        assert wait_for(lambda: states(srv, "hs").get(3, ("",))[0] == "END"), states(srv, "hs")
        good = (base / "2" / "model.onnx").read_bytes()
        (base / "3" / "model.onnx").write_bytes(good[: len(good) // 2])
        time.sleep(2.5)  # two polls: it is retried (the folder changed) and fails again
        st = states(srv, "hs")
        assert st[3][0] == "END" and st[3][1] and st[2][0] == "AVAILABLE", st
        # the copy completes: version 3 is served
        save_affine(tmp_path / "v3.onnx", 100.0, 0.0)
        shutil.move(str(tmp_path / "v3.onnx"), str(base / "3" / "model.onnx"))
        assert wait_for(lambda: states(srv, "hs")[3][0] == "AVAILABLE"), states(srv, "hs")
        n = hammer.count()
        assert wait_for(lambda: hammer.count() > n + 20)
        assert hammer.last() == (200, answer(100))
    finally:
        replies = hammer.finish()
        srv.kill()
    allowed = [(200, answer(a)) for a in (1, 10, 100)]
    bad = [r for r in replies if r not in allowed]
    assert not bad, bad[:5]
    assert all(any(r == a for r in replies) for a in allowed)  # each version answered
    assert len(replies) > 60


CONFIG = """
model_config_list {
  config {
    name: 'lab'
    base_path: '%(base)s'
    model_version_policy { all {} }
    %(labels)s
  }
}
"""


def test_labels_move_under_load(tmp_path):
    base = tmp_path / "lab"
    save_affine(base / "1" / "model.onnx", 1.0, 0.0)
    config = tmp_path / "models.config"

    def write(labels):
        tmp = tmp_path / "config.tmp"
        tmp.write_text(CONFIG % {"base": base, "labels": labels})
        tmp.rename(config)  # replaced whole: the poller never reads half a file
    write("version_labels { key: 'stable' value: 1 }")
    srv = ConfigServer(config, "--model_config_file_poll_wait_seconds=1")
    stable = Hammer(srv, "/v1/models/lab/labels/stable:predict")
    latest = Hammer(srv, "/v1/models/lab:predict", n=1)
    try:
        assert wait_for(lambda: stable.count() > 20)
        save_affine(tmp_path / "staging" / "model.onnx", 10.0, 0.0)
        shutil.move(str(tmp_path / "staging"), str(base / "2"))
        assert wait_for(lambda: states(srv, "lab").get(2, ("",))[0] == "AVAILABLE")
        # canary first, then move stable (TF Serving: labels only on available versions)
        write("version_labels { key: 'stable' value: 1 }\n"
              "    version_labels { key: 'canary' value: 2 }")
        assert wait_for(lambda: srv.json("POST", "/v1/models/lab/labels/canary:predict",
                                         {"instances": X}) == (200, answer(10)))
        write("version_labels { key: 'stable' value: 2 }")
        assert wait_for(lambda: stable.last() == (200, answer(10)))
        shutil.rmtree(base / "1")  # version 1 leaves while stable traffic flows
        assert wait_for(lambda: 1 not in states(srv, "lab") or states(srv, "lab")[1][0] == "END")
        n = stable.count()
        assert wait_for(lambda: stable.count() > n + 20)
    finally:
        replies = stable.finish() + latest.finish()
        srv.kill()
    allowed = [(200, answer(1)), (200, answer(10))]
    bad = [r for r in replies if r not in allowed]
    assert not bad, bad[:5]
    assert all(any(r == a for r in replies) for a in allowed)
