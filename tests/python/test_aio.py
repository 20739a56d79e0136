"""memest.aio.Client inside a running event loop: the same answers as the sync client."""

import asyncio

import pytest

import memest


@pytest.mark.asyncio
async def test_aio_matches_sync(server, gpt2):
    async with memest.aio.Client(server, timeout=60) as client:
        result = await client.estimate(preset="gpt2-small", batch_size=2, seq=128,
                                       device="a100-80gb")
        presets = await client.presets()
        devices = await client.devices()
    assert result == gpt2
    with memest.Client(server) as sync:
        assert presets == sync.presets()
        assert devices == sync.devices()


@pytest.mark.asyncio
async def test_aio_plans_as_the_sync_client(server):
    query = dict(preset="gpt2-medium", seq=512, batch_size=16, device="t4", max_gpus=8,
                 max_plans=4)
    async with memest.aio.Client(server, timeout=60) as client:
        plans = await client.plan(**query)
    with memest.Client(server) as sync:
        assert plans == sync.plan(**query)
    assert len(plans) == 4 and plans[0].gpus >= 1


@pytest.mark.asyncio
async def test_aio_concurrent_calls(server):
    async with memest.aio.Client(server, timeout=60) as client:
        results = await asyncio.gather(*(client.estimate(preset="mlp", batch_size=b,
                                                         advice=False)
                                         for b in (1, 2, 4, 8)))
    assert [r.micro_batch for r in results] == [1, 2, 4, 8]


@pytest.mark.asyncio
async def test_aio_errors(server, closed_port):
    async with memest.aio.Client(server) as client:
        with pytest.raises(memest.InvalidArgument, match="config.batch_size"):
            await client.estimate(preset="gpt2-small", batch_size=-1)
        with pytest.raises(memest.NotFound):
            await client.estimate(preset="no-such-model")
    async with memest.aio.Client("127.0.0.1:%d" % closed_port, timeout=2) as dead:
        with pytest.raises(memest.Unavailable):
            await dead.devices()


def test_aio_under_asyncio_run(server):
    async def main():
        async with memest.aio.Client(server.address) as client:
            return await client.estimate(preset="mlp", batch_size=3, advice=False)

    assert asyncio.run(main()).micro_batch == 3


@pytest.mark.asyncio
async def test_aio_closed_client_refuses_calls(server):
    client = memest.aio.Client(server)
    await client.close()
    with pytest.raises(memest.MemestError, match="closed"):
        await client.presets()
