"""Client.sweep against a real memest-server: each configuration answered as estimate() answers
it alone, refusals in place, the whole refused for what is the sweep's."""

import asyncio

import pytest

import memest


def test_sweep_answers_each_configuration_as_estimate_does(client):
    common = dict(preset="gpt2-small", seq=128, precision="bf16", layer_rows=2)
    configs = [{"batch_size": 2, "device": "a100-80gb"},
               {"batch_size": 2, "device": "l4", "optimizer": "sgd"},
               {"batch_size": 4, "checkpoint": "every-block"},
               {"batch_size": 2, "device": "tpu-v5"}]
    seen = []
    results = client.sweep(configs=configs, on_result=lambda i, r: seen.append(i), **common)
    assert seen == [0, 1, 2, 3]
    assert len(results) == 4
    for config, result in zip(configs[:3], results):
        alone = client.estimate(**common, **config)
        assert isinstance(result, memest.Estimate)
        assert result.peak.allocated_bytes == alone.peak.allocated_bytes
        assert result.peak_reserved_bytes == alone.peak_reserved_bytes
        assert result.advice == alone.advice and result.notes == alone.notes
        assert len(result.layers) == 2
        assert result.label == alone.label
    assert results[1].fit.device == "l4"
    assert isinstance(results[3], memest.NotFound)
    assert "config.device_name" in str(results[3])


def test_sweep_refusals(client, server):
    with pytest.raises(memest.InvalidArgument, match="configs: a sweep needs at least one"):
        client.sweep(preset="gpt2-small", configs=[])
    with pytest.raises(memest.InvalidArgument, match=r"configs\[1\]\.seq: one for the whole sweep"):
        client.sweep(preset="gpt2-small", configs=[{"batch_size": 1}, {"seq": 64}])
    with pytest.raises(memest.InvalidArgument, match=r"configs\[0\]: precision"):
        client.sweep(preset="gpt2-small", configs=[{"precision": "fp12"}])
    with pytest.raises(memest.InvalidArgument, match=r"max_layer_rows"):
        client.sweep(preset="gpt2-small", layer_rows=-1, configs=[{"batch_size": 1}])
    with pytest.raises(memest.DeadlineExceeded):
        client.sweep(preset="gpt2-small", seq=1024, advice=False, timeout=0.3,
                     configs=[{"batch_size": 1 + i % 8} for i in range(2000)])


def test_aio_sweep(server):
    async def main():
        async with memest.aio.Client(server) as client:
            return await client.sweep(preset="gpt2-small", seq=128, advice=False,
                                      configs=[{"batch_size": 1}, {"batch_size": 0}])
    results = asyncio.run(main())
    assert isinstance(results[0], memest.Estimate)
    assert isinstance(results[1], memest.InvalidArgument)
    assert "config.batch_size" in str(results[1])
