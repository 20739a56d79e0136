"""memest.aio.Client: the asyncio client, for code that runs in an event loop (a notebook's).

    async with memest.aio.Client(address) as client:
        result = await client.estimate(preset="gpt2-small", batch_size=8)

The same methods, arguments, results and errors as memest.Client; each method is a coroutine.
Create the client inside the loop that awaits it.
"""

import grpc
import grpc.aio

from memest import v1
from memest.client import (CHANNEL_OPTIONS, ESTIMATE_DOC, VALIDATE_DOC, VALIDATE_TIMEOUT,
                           PLAN_DOC, request_label, validate_request)
from memest.errors import (MemestError, call_metadata, from_rpc_error, request_id_of,
                           token_metadata)
from memest.tls import channel
from memest.planning import PlanCollector, plan_request
from memest.request import build_request
from memest.results import DeviceInfo, Estimate, PresetInfo
from memest.sweeping import SWEEP_DOC, SWEEP_TIMEOUT, SweepCollector, sweep_request
from memest.validation import _Collector


class Client:
    """An asyncio connection to a memest-server at `address` ("host:port" or memest.Server);
    `token` and `tls` as memest.Client's."""

    def __init__(self, address, timeout=30.0, token=None, tls=None):
        self.address = getattr(address, "address", address)
        self.timeout = timeout
        self._metadata = token_metadata(token)
        self._channel = channel(self.address, tls, CHANNEL_OPTIONS, aio=True)
        self._stub = v1.MemoryEstimatorStub(self._channel)
        self._closed = False

    async def _call(self, method, request, timeout, request_id=None):
        """The reply of a unary call and the id the server gave the call."""
        if self._closed:
            raise MemestError("%r: closed" % self)
        try:
            call = method(request, timeout=self.timeout if timeout is None else timeout,
                          metadata=call_metadata(self._metadata, request_id))
            response = await call
            metadata = await call.initial_metadata()
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        return response, request_id_of(metadata)

    async def estimate(self, preset=None, model=None, *, timeout=None, request_id=None, **kwargs):
        request = build_request(preset=preset, model=model, **kwargs)
        return await self.estimate_request(request, timeout=timeout, request_id=request_id)

    estimate.__doc__ = ESTIMATE_DOC

    async def estimate_request(self, request, *, timeout=None, request_id=None):
        """Sends a prepared memest.v1.EstimateRequest; returns a memest.Estimate."""
        response, server_id = await self._call(self._stub.Estimate, request, timeout, request_id)
        return Estimate.from_proto(response, label=request_label(request), request_id=server_id)

    async def validate(self, preset=None, model=None, *, progress=None, timeout=None, **kwargs):
        request, label = validate_request(preset, model, **kwargs)
        if self._closed:
            raise MemestError("%r: closed" % self)
        events = _Collector(progress, label)
        try:
            async for event in self._stub.Validate(request, timeout=timeout or VALIDATE_TIMEOUT,
                                             metadata=self._metadata):
                events.take(event)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        return events.validation()

    validate.__doc__ = VALIDATE_DOC

    async def plan(self, preset=None, model=None, *, on_plan=None, timeout=None, **kwargs):
        request = plan_request(preset, model, **kwargs)
        if self._closed:
            raise MemestError("%r: closed" % self)
        plans = PlanCollector(on_plan)
        try:
            async for event in self._stub.Plan(request, timeout=timeout or self.timeout,
                                         metadata=self._metadata):
                plans.take(event)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        return plans.plans

    plan.__doc__ = PLAN_DOC

    async def sweep(self, preset=None, model=None, *, configs, on_result=None, timeout=None,
                    **kwargs):
        request, labels = sweep_request(preset, model, configs=configs, **kwargs)
        if self._closed:
            raise MemestError("%r: closed" % self)
        results = SweepCollector(labels, on_result)
        try:
            async for result in self._stub.Sweep(request, timeout=timeout or SWEEP_TIMEOUT,
                                                 metadata=self._metadata):
                results.take(result)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        return results.results

    sweep.__doc__ = SWEEP_DOC

    async def presets(self, *, timeout=None):
        """The built-in models, as a list of memest.PresetInfo."""
        response, _ = await self._call(self._stub.ListPresets, v1.ListPresetsRequest(), timeout)
        return [PresetInfo.from_proto(p) for p in response.presets]

    async def devices(self, *, timeout=None):
        """The device catalog, as a list of memest.DeviceInfo."""
        response, _ = await self._call(self._stub.ListDevices, v1.ListDevicesRequest(), timeout)
        return [DeviceInfo.from_proto(d) for d in response.devices]

    async def close(self):
        """Closes the channel; calls after this fail."""
        self._closed = True
        await self._channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    def __repr__(self):
        return "memest.aio.Client(%r)" % (self.address,)
