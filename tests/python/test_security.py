"""Model signing and encryption at rest (docs/SECURITY.md): `kiln keygen`,
`kiln sign`, `kiln verify`, `kiln encrypt`, `kiln rekey`, and `kiln serve`
with --trusted_keys and --model_decryption_key_file.

The references are independent of Kiln: kiln.sig is checked with Python's
hashlib (every file's SHA-256) and the `cryptography` package (the Ed25519
signature), and .kenc files are decrypted with libsodium called through
ctypes following the documented layout. Served answers are y = a*x + b of
the affine models, computed here.
"""

import ctypes
import ctypes.util
import hashlib
import os
import shutil
import subprocess

import pytest

import test_serve
from test_serve import KILN, save_affine, wait_for

pytestmark = test_serve.pytestmark

X = [[1.0, 2.0, 3.0]]


def kiln(*args, check=True):
    r = subprocess.run([KILN, *map(str, args)], capture_output=True, text=True, timeout=60)
    if check:
        assert r.returncode == 0, r.stderr
    return r


@pytest.fixture
def signer(tmp_path):
    kiln("keygen", "-o", tmp_path / "signer")
    return tmp_path / "signer.key", tmp_path / "signer.pub"


def signed_folder(path, signer, a=1.0, b=0.0):
    save_affine(path / "model.onnx", a, b)
    (path / "assets.extra").mkdir()
    (path / "assets.extra" / "notes.txt").write_text("hello\n")
    kiln("sign", path, "--key", signer[0])
    return path


# ------------------------------------------------------------------ signing


def test_signature_checks_out_independently(tmp_path, signer):
    """kiln.sig lists every file with its real SHA-256 and size, and the
    Ed25519 signature over 'kiln-manifest-v1\\n' + manifest verifies with
    the public key of signer.pub (checked without Kiln)."""
    ed = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.ed25519")
    d = signed_folder(tmp_path / "m", signer)
    data = (d / "kiln.sig").read_bytes()
    head, manifest = data.split(b"manifest\n", 1)
    lines = head.decode().splitlines()
    assert lines[0] == "kiln-signature-v1"
    pk = bytes.fromhex(lines[1].split()[1])
    sig = bytes.fromhex(lines[2].split()[1])
    assert signer[1].read_text().split()[1] == pk.hex()
    ed.Ed25519PublicKey.from_public_bytes(pk).verify(sig, b"kiln-manifest-v1\n" + manifest)
    want = []
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            rel = os.path.relpath(p, d)
            if rel == "kiln.sig":
                continue
            blob = open(p, "rb").read()
            want.append(f"sha256 {hashlib.sha256(blob).hexdigest()} {len(blob)} {rel}")
    assert manifest.decode().splitlines() == sorted(want)
    r = kiln("verify", d, "--trusted_keys", signer[1])
    assert "2 files signed" in r.stdout


def flip_byte(p):
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 1
    p.write_bytes(bytes(b))


TAMPER = {
    "flipped": (lambda d: flip_byte(d / "model.onnx"), "'model.onnx' does not match"),
    "extra": (lambda d: (d / "extra.bin").write_bytes(b"x"), "'extra.bin' is not in the signed"),
    "missing": (lambda d: (d / "assets.extra" / "notes.txt").unlink(),
                "'assets.extra/notes.txt' is in the signed manifest but missing"),
    "renamed": (lambda d: (d / "assets.extra" / "notes.txt").rename(d / "assets.extra" / "n.txt"),
                "'assets.extra/n.txt' is not in the signed"),
    "truncated": (lambda d: (d / "model.onnx").write_bytes((d / "model.onnx").read_bytes()[:50]),
                  "'model.onnx' is 50 bytes"),
    "manifest_edited": (lambda d: (d / "kiln.sig").write_bytes(
        (d / "kiln.sig").read_bytes().replace(b" model.onnx", b" model.onnz")),
        "does not match its manifest"),
    "unsigned": (lambda d: (d / "kiln.sig").unlink(), "'kiln.sig' is missing"),
}


@pytest.mark.parametrize("case", sorted(TAMPER))
def test_verify_refuses_tampering(tmp_path, signer, case):
    d = signed_folder(tmp_path / "m", signer)
    change, message = TAMPER[case]
    change(d)
    r = kiln("verify", d, "--trusted_keys", signer[1], check=False)
    assert r.returncode == 1 and message in r.stderr, r.stderr


def test_verify_refuses_untrusted_signer(tmp_path, signer):
    d = signed_folder(tmp_path / "m", signer)
    kiln("keygen", "-o", tmp_path / "other")
    r = kiln("verify", d, "--trusted_keys", tmp_path / "other.pub", check=False)
    assert r.returncode == 1 and "not a trusted key" in r.stderr, r.stderr
    # a trusted keys file may hold several keys
    both = tmp_path / "both.pub"
    both.write_text((tmp_path / "other.pub").read_text() + "# comment\n" + signer[1].read_text())
    kiln("verify", d, "--trusted_keys", both)


def test_bad_key_files_are_errors(tmp_path, signer):
    bad = tmp_path / "bad.pub"
    bad.write_text("kiln-ed25519-public-key 1234\n")
    d = signed_folder(tmp_path / "m", signer)
    r = kiln("verify", d, "--trusted_keys", bad, check=False)
    assert r.returncode == 1 and "line 1" in r.stderr
    r = kiln("sign", d, "--key", signer[1], check=False)  # a public key is no signing key
    assert r.returncode == 1 and "not a Kiln signing key" in r.stderr
    assert oct(signer[0].stat().st_mode & 0o777) == "0o600"


def states(srv, name):
    code, body = srv.json("GET", f"/v1/models/{name}")
    assert code == 200, body
    return {int(v["version"]): (v["state"], v["status"]["error_message"])
            for v in body["model_version_status"]}


def predict(srv, name):
    code, body = srv.json("POST", f"/v1/models/{name}:predict", {"instances": X})
    assert code == 200, body
    return body["predictions"]


def affine(a, b):
    return [[x * a + b for x in X[0]]]


def test_serve_refuses_tampered_and_unsigned_versions(tmp_path, signer):
    """With --trusted_keys a version that is tampered, unsigned, partly
    copied or signed by someone else ends with the file named, and the
    version before keeps serving."""
    base = tmp_path / "sm"
    signed_folder(base / "1", signer, 2.0, 1.0)
    srv = test_serve.Server(base, "sm", f"--trusted_keys={signer[1]}")
    try:
        assert predict(srv, "sm") == affine(2.0, 1.0)
        kiln("keygen", "-o", tmp_path / "mallory")
        cases = [
            ("model.onnx' does not match", lambda d: flip_byte(d / "model.onnx")),
            ("'kiln.sig' is missing", lambda d: (d / "kiln.sig").unlink()),
            ("is in the signed manifest but missing",
             lambda d: (d / "assets.extra" / "notes.txt").unlink()),
            ("not a trusted key",
             lambda d: kiln("sign", d, "--key", tmp_path / "mallory.key")),
        ]
        for v, (message, change) in enumerate(cases, start=2):
            stage = tmp_path / f"stage{v}"
            signed_folder(stage, signer, 10.0 * v, 0.0)
            change(stage)
            shutil.move(str(stage), str(base / str(v)))
            assert wait_for(lambda: states(srv, "sm").get(v, ("",))[0] == "END"), states(srv, "sm")
            state, err = states(srv, "sm")[v]
            assert "signature check failed" in err and message in err, err
            assert predict(srv, "sm") == affine(2.0, 1.0)
        # a properly signed version is then served
        signed_folder(tmp_path / "good", signer, 3.0, 0.0)
        shutil.move(str(tmp_path / "good"), str(base / "9"))
        assert wait_for(lambda: states(srv, "sm").get(9, ("",))[0] == "AVAILABLE"), states(srv, "sm")
        assert predict(srv, "sm") == affine(3.0, 0.0)
    finally:
        srv.kill()


# ------------------------------------------------------------------ encryption


def sodium():
    name = ctypes.util.find_library("sodium")
    if not name:
        pytest.skip("libsodium not found for the independent decryptor")
    lib = ctypes.CDLL(name)
    assert lib.sodium_init() >= 0
    return lib


def decrypt_reference(blob, key, name):
    """Decrypt a .kenc by docs/SECURITY.md with libsodium through ctypes."""
    lib = sodium()
    assert blob[:8] == b"KILNENC1"
    n = blob[8]
    key_id = blob[9:9 + n].decode()
    hdr = blob[9 + n:9 + n + 24]
    ad = blob[:9 + n] + name.encode()
    state = ctypes.create_string_buffer(52)
    assert lib.crypto_secretstream_xchacha20poly1305_init_pull(state, hdr, key) == 0
    off, out, final = 9 + n + 24, b"", False
    while off < len(blob):
        c = blob[off:off + 65536 + 17]
        m = ctypes.create_string_buffer(len(c))
        mlen = ctypes.c_ulonglong()
        tag = ctypes.c_ubyte()
        rc = lib.crypto_secretstream_xchacha20poly1305_pull(
            state, m, ctypes.byref(mlen), ctypes.byref(tag), c, ctypes.c_ulonglong(len(c)),
            ad, ctypes.c_ulonglong(len(ad)))
        assert rc == 0, "chunk does not authenticate"
        out += m.raw[:mlen.value]
        off += len(c)
        final = tag.value == 3  # crypto_secretstream_xchacha20poly1305_TAG_FINAL
    assert final
    return key_id, out


def ring(tmp_path, *ids):
    p = tmp_path / "ring"
    for i in ids:
        kiln("keygen", "--encryption", "--key-id", i, "-o", p)
    keys = dict(line.split() for line in p.read_text().splitlines())
    return p, {k: bytes.fromhex(v) for k, v in keys.items()}


def test_encrypt_matches_the_documented_format(tmp_path):
    keyfile, keys = ring(tmp_path, "k1", "k2")
    src = tmp_path / "plain"
    save_affine(src / "model.onnx", 1.0, 2.0)
    big = os.urandom(65536 * 2)  # an exact multiple of the chunk size
    (src / "weights.bin").write_bytes(big)
    (src / "assets.extra").mkdir()
    (src / "assets.extra" / "tf_serving_warmup_requests").write_bytes(b"warm")
    kiln("encrypt", src, "--key", keyfile, "--key-id", "k1", "-o", tmp_path / "enc")
    enc = tmp_path / "enc"
    assert (enc / "assets.extra" / "tf_serving_warmup_requests").read_bytes() == b"warm"
    for f in ("model.onnx", "weights.bin"):
        kid, plain = decrypt_reference((enc / (f + ".kenc")).read_bytes(), keys["k1"], f)
        assert kid == "k1" and plain == (src / f).read_bytes()
    assert not (enc / "model.onnx").exists()
    kiln("rekey", enc, "--key", keyfile, "--key-id", "k2")
    kid, plain = decrypt_reference((enc / "weights.bin.kenc").read_bytes(), keys["k2"], "weights.bin")
    assert kid == "k2" and plain == big
    # the name is bound: the same bytes under another name do not decrypt
    with pytest.raises(AssertionError, match="authenticate"):
        decrypt_reference((enc / "weights.bin.kenc").read_bytes(), keys["k2"], "model.onnx")


def encrypted_version(tmp_path, path, keyfile, key_id, a, b):
    src = tmp_path / f"plain-{path.name}-{key_id}"
    save_affine(src / "model.onnx", a, b)
    path.parent.mkdir(parents=True, exist_ok=True)
    kiln("encrypt", src, "--key", keyfile, "--key-id", key_id, "-o", path)
    return path


def test_serve_decrypts_with_a_key_ring_and_rotation(tmp_path):
    """Version 1 under k1 and version 2 under k2 both load from one ring;
    wrong key, unknown key id and altered ciphertext end with clear errors
    while the version before keeps serving; no plaintext is written."""
    keyfile, _ = ring(tmp_path, "k1", "k2")
    base = tmp_path / "em"
    encrypted_version(tmp_path, base / "1", keyfile, "k1", 2.0, 0.5)
    srv = test_serve.Server(base, "em", f"--model_decryption_key_file={keyfile}")
    try:
        assert predict(srv, "em") == affine(2.0, 0.5)
        encrypted_version(tmp_path, tmp_path / "s2", keyfile, "k2", 4.0, 0.0)
        shutil.move(str(tmp_path / "s2"), str(base / "2"))
        assert wait_for(lambda: states(srv, "em").get(2, ("",))[0] == "AVAILABLE"), states(srv, "em")
        assert predict(srv, "em") == affine(4.0, 0.0)
        # an unknown key id, a wrong key under a known id, an altered ciphertext
        (tmp_path / "o").mkdir()
        other, _ = ring(tmp_path / "o", "k9")
        encrypted_version(tmp_path, tmp_path / "s3", other, "k9", 9.0, 0.0)
        wrong = tmp_path / "wrong"
        wrong.mkdir()
        wk, _ = ring(wrong, "k2")  # same id as the server's k2, other bytes
        encrypted_version(tmp_path, tmp_path / "s4", wk, "k2", 9.0, 0.0)
        encrypted_version(tmp_path, tmp_path / "s5", keyfile, "k2", 9.0, 0.0)
        flip_byte(tmp_path / "s5" / "model.onnx.kenc")
        cases = {3: "key id 'k9' is not in the decryption key file",
                 4: "does not authenticate with key 'k2'",
                 5: "does not authenticate with key 'k2'"}
        for v, message in cases.items():
            shutil.move(str(tmp_path / f"s{v}"), str(base / str(v)))
            assert wait_for(lambda: states(srv, "em").get(v, ("",))[0] == "END"), states(srv, "em")
            assert message in states(srv, "em")[v][1], states(srv, "em")[v]
            assert predict(srv, "em") == affine(4.0, 0.0)
            shutil.rmtree(base / str(v))
        # version 2 goes: version 1, under the older key, loads again
        shutil.rmtree(base / "2")
        # version 1 loads before version 2 is unloaded (no gap in serving): wait for both
        assert wait_for(lambda: states(srv, "em").get(1, ("",))[0] == "AVAILABLE" and
                        states(srv, "em").get(2, ("END",))[0] == "END"), states(srv, "em")
        assert predict(srv, "em") == affine(2.0, 0.5)
        written = {p.name for p in base.rglob("*") if p.is_file()}
        assert written == {"model.onnx.kenc"}, written
    finally:
        srv.kill()


def test_serve_needs_a_key_for_encrypted_versions(tmp_path, signer):
    """Without --model_decryption_key_file an encrypted version is refused;
    signed and encrypted versions are checked, then decrypted."""
    keyfile, _ = ring(tmp_path, "k1")
    base = tmp_path / "se"
    signed_folder(base / "1", signer, 1.0, 1.0)
    srv = test_serve.Server(base, "se")
    try:
        encrypted_version(tmp_path, base / "2", keyfile, "k1", 5.0, 0.0)
        assert wait_for(lambda: states(srv, "se").get(2, ("",))[0] == "END"), states(srv, "se")
        assert "--model_decryption_key_file" in states(srv, "se")[2][1]
    finally:
        srv.kill()
    base = tmp_path / "se2"
    encrypted_version(tmp_path, base / "1", keyfile, "k1", 6.0, 1.0)
    kiln("sign", base / "1", "--key", signer[0])
    srv = test_serve.Server(base, "se2", f"--model_decryption_key_file={keyfile}",
                            f"--trusted_keys={signer[1]}")
    try:
        assert predict(srv, "se2") == affine(6.0, 1.0)
    finally:
        srv.kill()


def test_serve_refuses_bad_key_files_at_startup(tmp_path):
    bad = tmp_path / "ring"
    bad.write_text("k1 nothex\n")
    r = subprocess.run([KILN, "serve", f"--model_base_path={tmp_path}", "--rest_api_port=1",
                        f"--model_decryption_key_file={bad}"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 1 and "--model_decryption_key_file" in r.stderr and "line 1" in r.stderr


@pytest.mark.parametrize("cmd", ["keygen", "sign", "verify", "encrypt", "rekey", "fingerprint",
                                 "healthcheck"])
def test_help_and_usage_errors(cmd):
    r = kiln(cmd, "--help")
    assert r.stdout.startswith(f"usage: kiln {cmd}")
    assert cmd in kiln("--help").stdout
    r = kiln(cmd, "--bogus-flag", check=False)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--bogus-flag" in r.stderr, r.stderr
