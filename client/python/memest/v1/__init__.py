"""The memest.v1 protocol: the messages and the MemoryEstimator stub, generated at build time
from proto/memest/v1/memest.proto (see setup.py). For example memest.v1.Model,
memest.v1.EstimateRequest, memest.v1.MemoryEstimatorStub."""

from memest.v1.memest_pb2 import *  # noqa: F401,F403  (every message and enum of the proto)
from memest.v1.memest_pb2_grpc import MemoryEstimatorStub  # noqa: F401
