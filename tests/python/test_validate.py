"""Client.validate against a real memest-server whose validation worker runs a fake device
(bookkeeping only: no GPU here), and against one without --device."""

import pytest

import memest
from conftest import server_binary


@pytest.fixture(scope="module")
def gpu_server():
    running = memest.serve(binary=server_binary(),
                           args=["--log-level", "warn", "--device", "0",
                                 "--validate-worker-arg=--fake-device-gib=16"])
    yield running
    running.stop()


def test_validate_streams_progress_and_returns_comparisons(gpu_server):
    events = []
    with memest.Client(gpu_server) as client:
        v = client.validate(preset="gpt2-small", seq=128, batch_size=2, precision="bf16",
                            repeats=1, progress=events.append)
    assert isinstance(v, memest.Validation)
    assert v.device_name == "memest fake device"
    assert v.batch_size == 2 and not v.scaled_down
    assert v.peak_allocated.measured and v.peak_allocated.measured_bytes > 0
    assert v.peak_allocated.measured_bytes == v.peak_allocated.predicted_bytes
    assert {c.name for c in v.categories} >= {"parameters", "activations", "cuda_context"}
    assert [p.phase for p in v.phases][:2] == ["data", "forward"]
    assert v.ops and v.step_milliseconds > 0
    assert v.estimate.peak.allocated_bytes == v.peak_allocated.predicted_bytes
    stages = [e.stage for e in events]
    assert stages[0] == "probing" and "replaying" in stages and stages[-1] == "finishing"
    assert "device total" in repr(v) and "fake device" in repr(v)
    frame = v.to_dataframe("categories")
    assert frame.loc["peak allocated", "rel_error"] == 0.0
    assert list(v.to_dataframe("ops")["milliseconds"])[0] >= v.ops[-1].milliseconds


def test_validate_scales_the_batch_down_when_asked(gpu_server):
    with memest.Client(gpu_server) as client:
        with pytest.raises(memest.FailedPrecondition, match="short by"):
            client.validate(preset="gpt2-medium", batch_size=32, repeats=1)
        v = client.validate(preset="gpt2-medium", batch_size=32, repeats=1,
                            scale_batch_to_fit=True)
    assert v.scaled_down and 1 <= v.batch_size < 32
    assert "validated micro-batch" in v.scaled_down_note


def test_validate_without_a_device_is_unavailable(client):
    with pytest.raises(memest.Unavailable, match="without --device"):
        client.validate(preset="mlp", batch_size=4)


def test_validate_bad_input_names_the_field(gpu_server):
    with memest.Client(gpu_server) as client:
        with pytest.raises(memest.InvalidArgument, match="repeats"):
            client.validate(preset="mlp", batch_size=4, repeats=1000)


def test_aio_validate_in_a_running_loop(gpu_server):
    import asyncio

    async def run():
        events = []
        async with memest.aio.Client(gpu_server) as client:
            v = await client.validate(preset="mlp", batch_size=8, repeats=1, progress=events.append)
            with pytest.raises(memest.FailedPrecondition, match="short by"):
                await client.validate(preset="gpt2-medium", batch_size=32, repeats=1)
        return v, events

    v, events = asyncio.run(run())
    assert v.peak_allocated.measured_bytes == v.peak_allocated.predicted_bytes
    assert events[0].stage == "probing" and events[-1].stage == "finishing"
