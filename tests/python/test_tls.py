"""memest.Client and memest.aio.Client over TLS and mutual TLS, against memest-server started
with --tls-cert, --tls-key and --tls-client-ca; certificates made here with cryptography."""

import asyncio
import datetime
import ipaddress

import pytest

cryptography = pytest.importorskip("cryptography")
from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

import memest  # noqa: E402
from conftest import server_binary  # noqa: E402


def _name(common_name):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(path, cert, key):
    path.with_suffix(".pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        path.with_suffix(".key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))


def _certificate(subject, issuer, public_key, signing_key, ca):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(public_key).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=1))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def make_pki(d):
    """Writes into directory `d` ca.pem, other-ca.pem; server, client (signed by ca) and rogue
    (signed by other-ca) .pem/.key pairs; returns `d`."""
    d.mkdir(parents=True, exist_ok=True)
    for ca_name, issued in (("ca", ("server", "client")), ("other-ca", ("rogue",))):
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = _certificate(ca_name, ca_name, ca_key.public_key(), ca_key, ca=True)
        _write(d / ca_name, ca_cert, None)
        for name in issued:
            key = ec.generate_private_key(ec.SECP256R1())
            _write(d / name, _certificate(name, ca_name, key.public_key(), ca_key, ca=False), key)
    return d


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("certs"))


def test_mutual_tls_answers_clients_with_a_certificate_from_its_ca(certs):
    good = memest.Tls(ca=certs / "ca.pem", cert=certs / "client.pem", key=certs / "client.key")
    server = memest.serve(binary=server_binary(), tls=good, args=[
        "--log-level", "warn", "--tls-cert", str(certs / "server.pem"),
        "--tls-key", str(certs / "server.key"), "--tls-client-ca", str(certs / "ca.pem")])
    try:
        with memest.Client(server, tls=good) as c:
            assert c.estimate(preset="gpt2-small", seq=64).peak.allocated_bytes > 0

        async def devices():
            async with memest.aio.Client(server, tls=good) as c:
                return await c.devices()
        assert asyncio.run(devices())

        pem = memest.Tls(ca=(certs / "ca.pem").read_bytes(),
                         cert=(certs / "client.pem").read_bytes(),
                         key=(certs / "client.key").read_bytes())
        with memest.Client(server, tls=pem) as c:
            assert c.devices()
        refused = (
            None,                                               # plaintext
            memest.Tls(ca=certs / "ca.pem"),                    # no client certificate
            memest.Tls(ca=certs / "ca.pem", cert=certs / "rogue.pem", key=certs / "rogue.key"),
            memest.Tls(ca=certs / "other-ca.pem", cert=certs / "client.pem",
                       key=certs / "client.key"),               # does not trust the server
        )
        for tls in refused:
            with memest.Client(server, tls=tls, timeout=5) as c:
                with pytest.raises(memest.Unavailable):
                    c.devices()
    finally:
        server.stop()


def test_bad_tls_settings_are_refused_before_any_call(certs, tmp_path):
    with pytest.raises(ValueError, match="both cert and key"):
        memest.Tls(cert=certs / "client.pem")
    with pytest.raises(ValueError, match="tls.ca: cannot read"):
        memest.Tls(ca=tmp_path / "missing.pem")
    with pytest.raises(TypeError, match="memest.Tls"):
        memest.Client("127.0.0.1:1", tls="yes")
