"""TLS for memest.Client and memest.aio.Client: how to reach a memest-server started with
--tls-cert (and, for mutual TLS, --tls-client-ca)."""

import grpc


class Tls:
    """TLS settings for a client.

    ca: the CA that signed the server's certificate (a path or PEM bytes); None: the system's
      roots.
    cert, key: this client's certificate and private key, for a server that asks for one
      (memest-server --tls-client-ca); both or neither.
    server_name: the name the server's certificate carries, when the address's host is not it.
    """

    def __init__(self, ca=None, cert=None, key=None, server_name=None):
        if (cert is None) != (key is None):
            raise ValueError("tls: mutual TLS needs both cert and key")
        self.ca = _pem(ca, "ca")
        self.cert = _pem(cert, "cert")
        self.key = _pem(key, "key")
        self.server_name = server_name

    def __repr__(self):
        parts = ["ca=%s" % ("given" if self.ca else "system roots")]
        if self.cert:
            parts.append("client certificate")
        if self.server_name:
            parts.append("server_name=%r" % self.server_name)
        return "memest.Tls(%s)" % ", ".join(parts)


def _pem(value, what):
    if value is None or isinstance(value, bytes):
        return value
    try:
        with open(value, "rb") as f:
            return f.read()
    except OSError as error:
        raise ValueError("tls.%s: cannot read %r: %s" % (what, str(value), error.strerror)) from None


def channel(address, tls, options, aio=False):
    """A channel to `address`: plaintext when `tls` is None or False, else over TLS (`tls` True:
    the system's roots; a memest.Tls: its settings)."""
    module = grpc.aio if aio else grpc
    if tls is None or tls is False:
        return module.insecure_channel(address, options=options)
    if tls is True:
        tls = Tls()
    if not isinstance(tls, Tls):
        raise TypeError("tls: expected True or a memest.Tls, got %r" % (tls,))
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert)
    if tls.server_name:
        options = list(options) + [("grpc.ssl_target_name_override", tls.server_name)]
    return module.secure_channel(address, credentials, options=options)
