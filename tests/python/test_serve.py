"""memest.serve(): a child memest-server on a free port, stopped on request."""

import asyncio

import pytest

import memest
from conftest import server_binary


def test_serve_starts_answers_and_stops():
    server = memest.serve(binary=server_binary(), args=["--log-level", "warn"])
    try:
        host, port = server.address.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        assert str(server) == server.address and server.running
        with memest.Client(server) as client:
            assert client.presets()
    finally:
        server.stop()
    assert not server.running
    assert server.process.returncode == 0
    server.stop()  # idempotent
    with memest.Client(server.address, timeout=2) as client:
        with pytest.raises(memest.Unavailable):
            client.presets()


def test_serve_finds_the_binary_from_the_environment(monkeypatch):
    monkeypatch.setenv("MEMEST_SERVER", server_binary())
    assert memest.server.find_binary() == server_binary()
    with memest.serve() as server:
        assert server.running
    assert not server.running


def test_serve_reports_a_missing_binary(tmp_path):
    with pytest.raises(memest.ServerError, match="not an executable"):
        memest.serve(binary=str(tmp_path / "memest-server"))


def test_serve_reports_a_server_that_does_not_start(server):
    # The session's server holds its port; a second one on it must fail, with the log.
    with pytest.raises(memest.ServerError, match="did not start"):
        memest.serve(binary=server_binary(), address=server.address, timeout=10)


def test_a_server_with_a_token_answers_only_clients_that_carry_it(tmp_path):
    """memest-server --auth-token-file: memest.Client(token=) and memest.aio.Client(token=)
    are answered, a client without the token gets memest.Unauthenticated; bad tokens are
    refused before any call."""
    token = tmp_path / "token"
    token.write_text("py-s3cret\n")
    server = memest.serve(binary=server_binary(),
                          args=["--log-level", "warn", "--auth-token-file", str(token)])
    try:
        with memest.Client(server, token="py-s3cret") as c:
            assert any(d.name == "h100-80gb" for d in c.devices())
            assert c.estimate(preset="gpt2-small", seq=64).peak.allocated_bytes > 0
        with memest.Client(server) as c:
            with pytest.raises(memest.Unauthenticated, match="bearer token"):
                c.devices()
        with memest.Client(server, token="wrong") as c:
            with pytest.raises(memest.Unauthenticated):
                c.estimate(preset="gpt2-small", seq=64)

        async def devices():
            async with memest.aio.Client(server, token="py-s3cret") as c:
                return await c.devices()
        assert asyncio.run(devices())
    finally:
        server.stop()
    for bad in ("", "two words", "caf\u00e9"):
        with pytest.raises(ValueError, match="token"):
            memest.Client("127.0.0.1:1", token=bad)


def test_the_request_id_goes_to_the_server_and_comes_back(client):
    """An Estimate carries the id the server logged: the caller's, or one the server made."""
    given = client.estimate(preset="gpt2-small", seq=64, request_id="notebook-7.cell:3")
    assert given.request_id == "notebook-7.cell:3"
    made = client.estimate(preset="gpt2-small", seq=64)
    assert len(made.request_id) == 16 and made.request_id != given.request_id

    async def estimate():
        async with memest.aio.Client(client.address) as c:
            return await c.estimate(preset="gpt2-small", seq=64, request_id="aio-1")
    assert asyncio.run(estimate()).request_id == "aio-1"


def test_layer_rows_cut_the_per_layer_table(client):
    full = client.estimate(preset="gpt2-small", seq=64, advice=False)
    two = client.estimate(preset="gpt2-small", seq=64, advice=False, layer_rows=2)
    none = client.estimate(preset="gpt2-small", seq=64, advice=False, layer_rows=0)
    assert len(full.layers) > 2 and len(two.layers) == 2 and none.layers == []
    assert two.peak == full.peak
