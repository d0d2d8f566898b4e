"""Bearer tokens with scopes (`kiln serve --auth_token_file`, `kiln token
create`, src/serve/auth.c) against a real server on loopback, over REST
(http.client) and gRPC (grpcio with `authorization` metadata).

The token file lines are checked against an independent SHA-256 (hashlib);
the answers against the documented contract (docs/SECURITY.md): 401 with
`WWW-Authenticate: Bearer` for a missing or unknown token, 403 for a token
without the route's scope, probes and metrics open, gRPC UNAUTHENTICATED /
PERMISSION_DENIED, admin for HandleReloadConfigRequest, and revocation by
editing the file without a restart. Predictions are compared with numpy.
"""

import base64
import hashlib
import http.client
import json
import socket
import subprocess
import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
from test_grpc import (KILN, MS, PS, Server, affine, expect_error, model_line, pb,  # noqa: E402,F401
                       predict_request, save_affine, tensor_content, to_numpy)


def create_token(scopes, name=None, append=None):
    args = [KILN, "token", "create", "--scopes", scopes]
    if name:
        args += ["--name", name]
    if append:
        args += ["--append", str(append)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    token, line = r.stdout.splitlines()
    return token, line


def rest(port, method, path, token=None, body=None, auth=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if auth is not None:
            headers["Authorization"] = auth
        c.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        r = c.getresponse()
        return r.status, r.getheader("WWW-Authenticate"), r.read()
    finally:
        c.close()


X = np.arange(6, dtype=np.float32).reshape(2, 3)
PREDICT = {"instances": X.tolist()}


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    d = tmp_path_factory.mktemp("tokens")
    out = {}
    for scopes, name in (("predict", "client"), ("metadata", "viewer"), ("admin", "ops"),
                         ("predict,metadata", "both")):
        out[name] = create_token(scopes, name)
    return d, out


def test_token_create_line_is_sha256_of_token(tokens):
    _, t = tokens
    for name, (token, line) in t.items():
        assert token.startswith("kiln_") and len(token) == 5 + 43
        fields = line.split()
        assert fields[0] == "sha256:" + hashlib.sha256(token.encode()).hexdigest()
        assert fields[-1] == f"name={name}"
    assert len({tok for tok, _ in t.values()}) == len(t)  # random, not derived from the name
    assert t["both"][1].split()[1] == "scopes=predict,metadata"
    r = subprocess.run([KILN, "token", "create", "--scopes", "predict,root"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode != 0 and "unknown scope 'root'" in r.stderr


@pytest.fixture(scope="module")
def authsrv(tmp_path_factory, tokens):
    root = tmp_path_factory.mktemp("authsrv")
    save_affine(root / "aff" / "1" / "model.onnx", [2.0, 3.0, 4.0], [1.0, 0.5, -1.0])
    _, t = tokens
    tf = root / "tokens.txt"
    tf.write_text("# Kiln tokens\n" + "".join(line + "\n" for _, line in t.values()))
    s = Server(root, [model_line("aff", root / "aff")], f"--auth_token_file={tf}",
               "--grpc_channel_arguments=grpc.max_receive_message_length=1048576")
    s.token_file = tf
    s.root = root
    yield s
    s.kill()


def test_startup_says_open_or_protected(authsrv, tmp_path):
    assert "access control: 4 tokens" in authsrv.logtext()
    save_affine(tmp_path / "aff" / "1" / "model.onnx", [1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    s = Server(tmp_path, [model_line("aff", tmp_path / "aff")])
    try:
        assert "the server is open (no authentication)" in s.logtext()
        assert rest(s.rest, "POST", "/v1/models/aff:predict", body=PREDICT)[0] == 200
    finally:
        s.kill()


def test_rest_scopes(authsrv, tokens):
    _, t = tokens
    p = authsrv.rest
    code, challenge, body = rest(p, "POST", "/v1/models/aff:predict", body=PREDICT)
    assert code == 401 and challenge.startswith("Bearer") and b"error" in body
    assert b"predictions" not in body
    code, challenge, _ = rest(p, "POST", "/v1/models/aff:predict", token="kiln_wrong", body=PREDICT)
    assert code == 401 and challenge.startswith("Bearer")
    assert rest(p, "POST", "/v1/models/aff:predict", auth="Token abc", body=PREDICT)[0] == 401
    code, challenge, body = rest(p, "POST", "/v1/models/aff:predict", token=t["viewer"][0], body=PREDICT)
    assert code == 403 and challenge is None and b"predict" in body
    code, _, body = rest(p, "POST", "/v1/models/aff:predict", token=t["client"][0], body=PREDICT)
    assert code == 200
    np.testing.assert_allclose(np.array([r["y"] for r in json.loads(body)["predictions"]], np.float32), affine(X))
    # KServe v2 infer is predict too
    v2 = {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": X.ravel().tolist()}]}
    assert rest(p, "POST", "/v2/models/aff/infer", body=v2)[0] == 401
    assert rest(p, "POST", "/v2/models/aff/infer", token=t["client"][0], body=v2)[0] == 200
    # metadata routes
    for path in ("/v1/models/aff", "/v1/models/aff/metadata", "/v2/models/aff", "/v2/models/aff/ready"):
        assert rest(p, "GET", path)[0] == 401, path
        assert rest(p, "GET", path, token=t["client"][0])[0] == 403, path
        assert rest(p, "GET", path, token=t["viewer"][0])[0] == 200, path
        assert rest(p, "GET", path, token=t["both"][0])[0] == 200, path
    # probes and metrics stay open; unknown paths need a token before they say 404
    for path in ("/v2/health/live", "/v2/health/ready", "/metrics"):
        assert rest(p, "GET", path)[0] == 200, path
    assert rest(p, "GET", "/nothing/here")[0] == 401
    assert rest(p, "GET", "/nothing/here", token=t["viewer"][0])[0] == 404


def test_refused_before_the_body_is_read(authsrv, tokens):
    """A POST without a valid token is answered at its headers: a client
    that announces a large body and never sends it still gets its 401."""
    _, t = tokens
    for auth, want in ((None, 401), ("Bearer " + t["viewer"][0], 403)):
        with socket.create_connection(("127.0.0.1", authsrv.rest), timeout=10) as c:
            head = "POST /v1/models/aff:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 50000000\r\n"
            if auth:
                head += f"Authorization: {auth}\r\n"
            c.sendall((head + "\r\n").encode() + b"{" * 1000)
            resp = b""
            while b"\r\n\r\n" not in resp:
                chunk = c.recv(4096)
                if not chunk:
                    break
                resp += chunk
            assert resp.startswith(f"HTTP/1.1 {want}".encode()), resp[:200]
    # the server is fine afterwards
    assert rest(authsrv.rest, "POST", "/v1/models/aff:predict", token=t["client"][0], body=PREDICT)[0] == 200


def test_console_basic_auth(authsrv, tokens):
    _, t = tokens
    p = authsrv.rest
    code, challenge, _ = rest(p, "GET", "/console/")
    assert code == 401 and challenge.startswith("Basic")
    basic = "Basic " + base64.b64encode(b"anyone:" + t["viewer"][0].encode()).decode()
    code, _, body = rest(p, "GET", "/console/api/stats", auth=basic)
    assert code == 200 and "models" in json.loads(body)
    bad = "Basic " + base64.b64encode(b"anyone:kiln_nope").decode()
    assert rest(p, "GET", "/console/api/stats", auth=bad)[0] == 401
    assert rest(p, "GET", "/console/api/stats", token=t["client"][0])[0] == 403


def test_grpc_scopes(authsrv, tokens, pb):
    _, t = tokens
    s = authsrv
    req = predict_request(pb, "aff", {"x": tensor_content(pb, X, 1)})

    def md(name):
        return [("authorization", f"Bearer {t[name][0]}")]

    expect_error(lambda: s.call(PS + "Predict", req, pb.predict.PredictResponse), grpc.StatusCode.UNAUTHENTICATED)
    expect_error(lambda: s.call(PS + "Predict", req, pb.predict.PredictResponse,
                                metadata=[("authorization", "Bearer kiln_wrong")]),
                 grpc.StatusCode.UNAUTHENTICATED)
    expect_error(lambda: s.call(PS + "Predict", req, pb.predict.PredictResponse, metadata=md("viewer")),
                 grpc.StatusCode.PERMISSION_DENIED, "predict")
    r = s.call(PS + "Predict", req, pb.predict.PredictResponse, metadata=md("client"))
    np.testing.assert_array_equal(to_numpy(pb, r.outputs["y"]), affine(X))
    # refused at the headers: a message over the receive limit (1 MiB here) would otherwise be
    # RESOURCE_EXHAUSTED; without a token it is never looked at
    big = predict_request(pb, "aff", {"x": tensor_content(pb, np.zeros((100_000, 3), np.float32), 1)})
    expect_error(lambda: s.call(PS + "Predict", big, pb.predict.PredictResponse), grpc.StatusCode.UNAUTHENTICATED)
    expect_error(lambda: s.call(PS + "Predict", big, pb.predict.PredictResponse, metadata=md("client")),
                 grpc.StatusCode.RESOURCE_EXHAUSTED)
    st = pb.status.GetModelStatusRequest()
    st.model_spec.name = "aff"
    expect_error(lambda: s.call(MS + "GetModelStatus", st, pb.status.GetModelStatusResponse, metadata=md("client")),
                 grpc.StatusCode.PERMISSION_DENIED)
    assert s.call(MS + "GetModelStatus", st, pb.status.GetModelStatusResponse,
                  metadata=md("viewer")).model_version_status[0].version == 1
    # config reload is an admin operation
    reload = pb.mgmt.ReloadConfigRequest()
    reload.config.model_config_list.config.add(name="aff", base_path=str(s.root / "aff"), model_platform="onnx")
    for who in ("client", "viewer", "both"):
        expect_error(lambda: s.call(MS + "HandleReloadConfigRequest", reload, pb.mgmt.ReloadConfigResponse,
                                    metadata=md(who)), grpc.StatusCode.PERMISSION_DENIED, "admin")
    r = s.call(MS + "HandleReloadConfigRequest", reload, pb.mgmt.ReloadConfigResponse, metadata=md("ops"),
               timeout=60)
    assert r.status.error_code == 0
    # health stays open (load balancers and Kubernetes gRPC probes)
    hc = s.call("/grpc.health.v1.Health/Check", pb.health.HealthCheckRequest(), pb.health.HealthCheckResponse)
    assert hc.status == 1


def wait_for(fn, timeout=10.0):
    end = time.time() + timeout
    while time.time() < end:
        if fn():
            return True
        time.sleep(0.2)
    return False


def test_revocation_and_new_token_without_restart(authsrv, tokens):
    _, t = tokens
    s = authsrv
    pid = s.proc.pid
    tok = t["both"][0]
    assert rest(s.rest, "POST", "/v1/models/aff:predict", token=tok, body=PREDICT)[0] == 200
    # delete the line: refused within seconds
    lines = [ln for ln in s.token_file.read_text().splitlines() if ln != t["both"][1]]
    s.token_file.write_text("\n".join(lines) + "\n")
    assert wait_for(lambda: rest(s.rest, "POST", "/v1/models/aff:predict", token=tok, body=PREDICT)[0] == 401)
    # a broken file keeps the last good tokens, and says so
    good = s.token_file.read_text()
    s.token_file.write_text(good + "sha256:zz scopes=predict\n")
    # (the file is looked at when requests arrive)
    assert wait_for(lambda: rest(s.rest, "GET", "/v2/models/aff", token=t["viewer"][0])[0] == 200
                    and "the last tokens read stay in force" in s.logtext())
    assert rest(s.rest, "POST", "/v1/models/aff:predict", token=t["client"][0], body=PREDICT)[0] == 200
    s.token_file.write_text(good)
    # a token appended with kiln token create --append works without a restart
    new, _ = create_token("predict", "late", append=s.token_file)
    assert wait_for(lambda: rest(s.rest, "POST", "/v1/models/aff:predict", token=new, body=PREDICT)[0] == 200)
    assert s.proc.pid == pid and s.proc.poll() is None


def test_bad_token_file_stops_startup(tmp_path):
    save_affine(tmp_path / "aff" / "1" / "model.onnx", [1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    tf = tmp_path / "tokens.txt"
    tf.write_text("# ok\nsha256:" + "ab" * 32 + " scopes=predict,everything\n")
    r = subprocess.run([KILN, "serve", f"--model_base_path={tmp_path / 'aff'}", "--rest_api_port=0",
                        f"--auth_token_file={tf}"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert f"token file '{tf}' line 2: unknown scope 'everything'" in r.stderr
