"""memest-webhook over HTTPS, as the Kubernetes API server calls it: AdmissionReview documents
POSTed to /validate and /mutate, its /healthz, and a certificate rotated under it; the
certificates are made here with cryptography (tests/python/test_tls.py's helpers)."""

import base64
import json
import os
import pathlib
import socket
import ssl
import struct
import subprocess
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("cryptography")
from conftest import server_binary  # noqa: E402
from test_tls import make_pki  # noqa: E402

LLAMA = "--preset llama-7b --seq 2048 --batch 16 --precision bf16"


def webhook_binary():
    return str(pathlib.Path(server_binary()).parent / "memest-webhook")


def job_review(gpus, args=LLAMA, product="NVIDIA-H100-80GB-HBM3"):
    container = {"name": "trainer", "image": "trainer:1"}
    if gpus is not None:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "b1f3c0de-0000-4000-8000-000000000001",
            "kind": {"group": "batch", "version": "v1", "kind": "Job"},
            "resource": {"group": "batch", "version": "v1", "resource": "jobs"},
            "operation": "CREATE", "namespace": "ml",
            "object": {
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": "train", "namespace": "ml",
                             "annotations": {"memest.dev/args": args}},
                "spec": {"template": {"spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": product},
                    "containers": [container], "restartPolicy": "Never"}}}}}}


class Webhook:
    def __init__(self, pki, *args):
        self.process = subprocess.Popen(
            [webhook_binary(), "--address", "127.0.0.1:0", "--serving-cert", str(pki / "server.pem"),
             "--serving-key", str(pki / "server.key"), "--local", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        assert line.startswith("memest-webhook listening on "), line + self.process.stderr.read()
        self.port = int(line.rsplit(":", 1)[1])

    def post(self, path, body, ca):
        context = ssl.create_default_context(cafile=str(ca))
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request("https://127.0.0.1:%d%s" % (self.port, path), data=data,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, context=context, timeout=30) as reply:
            return reply.status, reply.read()

    def stop(self):
        self.process.terminate()
        return self.process.wait(timeout=10)


@pytest.fixture
def pki(tmp_path):
    return make_pki(tmp_path)


def test_validates_and_mutates_admission_reviews_over_https(pki):
    hook = Webhook(pki)
    try:
        status, body = hook.post("/validate", job_review(1), pki / "ca.pem")
        response = json.loads(body)["response"]
        assert status == 200 and response["uid"] == "b1f3c0de-0000-4000-8000-000000000001"
        assert response["allowed"] is False
        assert "the fewest that fit: 2 x h100-80gb" in response["status"]["message"]

        response = json.loads(hook.post("/validate", job_review(4), pki / "ca.pem")[1])["response"]
        assert response["allowed"] is True
        assert response["warnings"][0].startswith("memest: fits 2 x h100-80gb")

        response = json.loads(hook.post("/mutate", job_review(None), pki / "ca.pem")[1])["response"]
        patch = json.loads(base64.b64decode(response["patch"]))
        assert patch[-1] == {"op": "add", "value": "2",
                             "path": "/spec/template/spec/containers/0/resources/limits/nvidia.com~1gpu"}

        # The API server appends its timeout to the path.
        response = json.loads(hook.post("/validate?timeout=10s", job_review(4), pki / "ca.pem")[1])
        assert response["response"]["allowed"] is True

        assert hook.post("/healthz", b"", pki / "ca.pem")[1] == b"ok\n"
        with pytest.raises(urllib.error.HTTPError) as bad:
            hook.post("/validate", b"not json", pki / "ca.pem")
        assert bad.value.code == 400
        with pytest.raises(urllib.error.URLError):  # plaintext, or a CA it does not trust
            hook.post("/validate", job_review(1), pki / "other-ca.pem")
    finally:
        assert hook.stop() == 0


def test_a_peer_that_resets_its_connection_costs_nothing(pki):
    """A client gone before the answer (the API server's timeout): the webhook writes into a
    reset connection and carries on."""
    hook = Webhook(pki)
    try:
        context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        body = json.dumps(job_review(1)).encode()
        for _ in range(3):
            raw = socket.create_connection(("127.0.0.1", hook.port))
            tls = context.wrap_socket(raw, server_hostname="127.0.0.1")
            tls.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                        % len(body) + body)
            tls.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            tls.close()  # with SO_LINGER 0: a reset
        time.sleep(1.5)  # the plans end and their replies meet the resets
        assert hook.process.poll() is None, "the webhook died"
        assert hook.post("/healthz", b"", pki / "ca.pem")[1] == b"ok\n"
    finally:
        assert hook.stop() == 0


def test_a_rotated_certificate_is_served_without_a_restart(pki, tmp_path):
    hook = Webhook(pki)
    try:
        assert hook.post("/healthz", b"", pki / "ca.pem")[0] == 200
        rotated = make_pki(tmp_path / "next")
        for name in ("server.key", "server.pem"):
            os.replace(rotated / name, pki / name)
        assert hook.post("/healthz", b"", rotated / "ca.pem")[0] == 200
        with pytest.raises(urllib.error.URLError):
            hook.post("/healthz", b"", pki / "ca.pem")
    finally:
        hook.stop()


def test_bad_serving_files_refuse_the_start(pki, tmp_path):
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    for cert, key, message in ((tmp_path / "junk.pem", pki / "server.key", "--serving-cert: "),
                               (pki / "server.pem", pki / "client.key", "is not the private key")):
        result = subprocess.run(
            [webhook_binary(), "--address", "127.0.0.1:0", "--serving-cert", str(cert),
             "--serving-key", str(key), "--local"], capture_output=True, text=True, timeout=30)
        assert result.returncode == 1 and message in result.stderr, result.stderr
