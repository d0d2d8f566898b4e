"""TLS on `kiln serve`'s REST port (libmicrohttpd over GnuTLS) and
certificate rotation on both ports, against a real server on loopback.

Certificates come from the openssl CLI (a CA, two server certificates for
localhost / 127.0.0.1, a client certificate); clients are Python's ssl
module, http.client and grpcio. What is checked: HTTPS predict with the CA
(answers compared with numpy), plain HTTP refused on the TLS port, mutual
TLS refusing a client without a certificate or with one from another CA,
and rotation: rewriting the certificate files (Kiln's --ssl_cert_file /
--ssl_key_file, or TF Serving's SSLConfig file) makes new connections see
the new certificate, by its SHA-256 fingerprint, on the REST port and on
the gRPC port, with the same server process.
"""

import hashlib
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
from test_grpc import (KILN, PS, affine, free_port, model_line, pb, pem_field,  # noqa: E402,F401
                       predict_request, save_affine, tensor_content, to_numpy)

pytestmark = pytest.mark.skipif(not shutil.which("openssl"), reason="openssl missing")

X = np.arange(6, dtype=np.float32).reshape(2, 3)


def make_pki(d, ca_name="kiln-test-ca", who=("server", "server2", "client")):
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")  # fast to make, unlike RSA
    run("req", "-x509", *ec, "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", f"/CN={ca_name}")
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for w in who:
        run("req", *ec, "-nodes", "-keyout", f"{w}.key", "-out", f"{w}.csr",
            "-subj", f"/CN={'kiln-client' if w == 'client' else 'localhost'}")
        run("x509", "-req", "-in", f"{w}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{w}.pem", "-days", "2", "-extfile", "san.ext")
    return d


def fingerprint_pem(path):
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(path.read_text())).hexdigest()


def client_ctx(pki, cert=None, alpn=None):
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    if cert:
        ctx.load_cert_chain(str(pki / f"{cert}.pem"), str(pki / f"{cert}.key"))
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


def served_fingerprint(port, ctx):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            return hashlib.sha256(s.getpeercert(binary_form=True)).hexdigest()


def https(port, ctx, method, path, body=None):
    c = http.client.HTTPSConnection("localhost", port, timeout=20, context=ctx)
    try:
        c.request(method, path, body=json.dumps(body) if body is not None else None)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def replace_file(dst, src_text):
    """Write a file the way secret managers do: a new file renamed over the old."""
    tmp = dst.with_suffix(dst.suffix + ".new")
    tmp.write_text(src_text)
    os.replace(tmp, dst)


class TlsServer:
    def __init__(self, tmp, pki, *flags, ready_cert=None):
        save_affine(tmp / "aff" / "1" / "model.onnx", [2.0, 3.0, 4.0], [1.0, 0.5, -1.0])
        cfg = tmp / "models.config"
        cfg.write_text("model_config_list {\n" + model_line("aff", tmp / "aff") + "}\n")
        self.rest, self.grpc = free_port(), free_port()
        self.log = open(tmp / "server.log", "w+")
        self.proc = subprocess.Popen(
            [KILN, "serve", f"--model_config_file={cfg}", f"--rest_api_port={self.rest}",
             f"--port={self.grpc}", "--rest_api_address=127.0.0.1", "--rest_api_num_threads=2",
             "--grpc_max_threads=2", *flags], stdout=self.log, stderr=subprocess.STDOUT)
        ctx = client_ctx(pki, ready_cert)
        deadline = time.time() + 60
        while time.time() < deadline:
            assert self.proc.poll() is None, self.logtext()
            try:
                if https(self.rest, ctx, "GET", "/v2/health/ready")[0] == 200:
                    return
            except (OSError, ssl.SSLError, http.client.HTTPException):
                pass
            time.sleep(0.1)
        self.kill()
        raise AssertionError("server not ready in 60 s: " + self.logtext())

    def logtext(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()


def wait_for(fn, timeout=10.0):
    end = time.time() + timeout
    while time.time() < end:
        if fn():
            return True
        time.sleep(0.2)
    return False


def test_https_predict_plain_refused_and_rotation(tmp_path, pb):
    pki = make_pki(tmp_path)
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(pki / "server.pem", live / "tls.crt")
    shutil.copy(pki / "server.key", live / "tls.key")
    s = TlsServer(tmp_path, pki, f"--ssl_cert_file={live / 'tls.crt'}", f"--ssl_key_file={live / 'tls.key'}")
    try:
        ctx = client_ctx(pki)
        code, body = https(s.rest, ctx, "POST", "/v1/models/aff:predict", {"instances": X.tolist()})
        assert code == 200
        np.testing.assert_allclose(np.array([r["y"] for r in json.loads(body)["predictions"]], np.float32), affine(X))
        # plain HTTP on the TLS port gets no HTTP answer
        with pytest.raises((OSError, http.client.HTTPException)):
            c = http.client.HTTPConnection("127.0.0.1", s.rest, timeout=5)
            c.request("GET", "/v2/health/ready")
            c.getresponse().read()
        # the container probe: plain HTTP fails on the TLS port, --tls answers
        hc = [KILN, "healthcheck", "--port", str(s.rest), "--timeout_ms", "5000"]
        assert subprocess.run(hc, capture_output=True, timeout=30).returncode != 0
        r = subprocess.run(hc + ["--tls"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        # gRPC over TLS with the same files (ALPN h2)
        creds = grpc.ssl_channel_credentials(root_certificates=(pki / "ca.pem").read_bytes())
        req = predict_request(pb, "aff", {"x": tensor_content(pb, X, 1)})
        with grpc.secure_channel(f"localhost:{s.grpc}", creds) as ch:
            fn = ch.unary_unary(PS + "Predict", request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=pb.predict.PredictResponse.FromString)
            np.testing.assert_array_equal(to_numpy(pb, fn(req, timeout=20).outputs["y"]), affine(X))

        old, new = fingerprint_pem(pki / "server.pem"), fingerprint_pem(pki / "server2.pem")
        assert old != new
        h2 = client_ctx(pki, alpn=["h2"])
        assert served_fingerprint(s.rest, ctx) == old
        assert served_fingerprint(s.grpc, h2) == old
        # a keep-alive connection opened before the rotation
        keep = http.client.HTTPSConnection("localhost", s.rest, timeout=20, context=ctx)
        keep.request("GET", "/v2/health/ready")
        assert keep.getresponse().read() is not None
        # rotate: the key first (a moment where key and certificate do not match), then the chain
        replace_file(live / "tls.key", (pki / "server2.key").read_text())
        time.sleep(1.2)
        replace_file(live / "tls.crt", (pki / "server2.pem").read_text())
        assert wait_for(lambda: served_fingerprint(s.rest, ctx) == new), s.logtext()
        assert wait_for(lambda: served_fingerprint(s.grpc, h2) == new), s.logtext()
        code, _ = https(s.rest, ctx, "POST", "/v1/models/aff:predict", {"instances": X.tolist()})
        assert code == 200
        keep.request("GET", "/v2/health/ready")  # the old connection still works
        assert keep.getresponse().status == 200
        keep.close()
        # a broken certificate file keeps the last good one in use
        said = s.logtext().count("stays in use")
        replace_file(live / "tls.crt", "not a certificate\n")
        assert wait_for(lambda: served_fingerprint(s.rest, ctx) == new
                        and s.logtext().count("stays in use") > said), s.logtext()
        assert served_fingerprint(s.rest, ctx) == new
        assert s.proc.poll() is None
    finally:
        s.kill()


def test_mutual_tls(tmp_path):
    pki = make_pki(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    make_pki(other, ca_name="another-ca", who=("client",))
    s = TlsServer(tmp_path, pki, f"--ssl_cert_file={pki / 'server.pem'}", f"--ssl_key_file={pki / 'server.key'}",
                  f"--ssl_ca_file={pki / 'ca.pem'}", "--ssl_client_verify",
                  "--enable_batching", ready_cert="client")  # suspended connections over TLS too
    try:
        code, body = https(s.rest, client_ctx(pki, "client"), "POST", "/v1/models/aff:predict",
                           {"instances": X.tolist()})
        assert code == 200
        np.testing.assert_allclose(np.array([r["y"] for r in json.loads(body)["predictions"]], np.float32), affine(X))
        with pytest.raises((OSError, ssl.SSLError, http.client.HTTPException)):
            https(s.rest, client_ctx(pki), "GET", "/v2/health/ready")
        hc = [KILN, "healthcheck", "--port", str(s.rest), "--tls", "--timeout_ms", "5000"]
        assert subprocess.run(hc, capture_output=True, timeout=30).returncode != 0
        r = subprocess.run(hc + ["--cert", str(pki / "client.pem"), "--key", str(pki / "client.key")],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        foreign = client_ctx(pki)
        foreign.load_cert_chain(str(other / "client.pem"), str(other / "client.key"))
        with pytest.raises((OSError, ssl.SSLError, http.client.HTTPException)):
            https(s.rest, foreign, "GET", "/v2/health/ready")
    finally:
        s.kill()


def test_rest_ssl_config_file_rotation(tmp_path):
    pki = make_pki(tmp_path, who=("server", "server2"))
    conf = tmp_path / "rest_ssl.config"

    def write(who):
        replace_file(conf, pem_field("server_key", (pki / f"{who}.key").read_bytes())
                     + pem_field("server_cert", (pki / f"{who}.pem").read_bytes()))
    write("server")
    # TF Serving's flag for gRPC and Kiln's for REST, both on the same SSLConfig file
    s = TlsServer(tmp_path, pki, f"--rest_api_ssl_config_file={conf}", f"--ssl_config_file={conf}")
    try:
        ctx, h2 = client_ctx(pki), client_ctx(pki, alpn=["h2"])
        assert served_fingerprint(s.rest, ctx) == fingerprint_pem(pki / "server.pem")
        assert served_fingerprint(s.grpc, h2) == fingerprint_pem(pki / "server.pem")
        write("server2")
        assert wait_for(lambda: served_fingerprint(s.rest, ctx) == fingerprint_pem(pki / "server2.pem"))
        assert wait_for(lambda: served_fingerprint(s.grpc, h2) == fingerprint_pem(pki / "server2.pem"))
        assert "re-read: serving certificate serial" in s.logtext()
    finally:
        s.kill()


def test_tls_setup_errors(tmp_path):
    pki = make_pki(tmp_path, who=("server", "server2"))
    save_affine(tmp_path / "aff" / "1" / "model.onnx", [1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    base = [KILN, "serve", f"--model_base_path={tmp_path / 'aff'}", f"--rest_api_port={free_port()}", "--port=0"]
    r = subprocess.run(base + [f"--ssl_cert_file={pki / 'server.pem'}", f"--ssl_key_file={pki / 'server2.key'}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "server key / certificate" in r.stderr, r.stderr
    r = subprocess.run(base + [f"--ssl_cert_file={pki / 'server.pem'}"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--ssl_key_file" in r.stderr, r.stderr
