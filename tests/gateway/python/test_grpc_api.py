"""Wire-level helpers of the gRPC adapter (no sockets)."""

from __future__ import annotations

from tritonclient.grpc import service_pb2

from gateway.policy.model_name import grpc_model_name
from gateway.python.grpc_api import with_timeout_parameter


def test_timeout_parameter_is_appended_without_decoding_when_deadline_set() -> None:
    original = service_pb2.ModelInferRequest(model_name="m", id="7")
    original.parameters["timeout"].int64_param = 999_999_999
    original.parameters["priority"].int64_param = 1
    merged = service_pb2.ModelInferRequest.FromString(
        with_timeout_parameter(original.SerializeToString(), 0.25)
    )
    assert merged.parameters["timeout"].int64_param == 225_000  # 90 % (triton_timeout_us)
    assert merged.parameters["priority"].int64_param == 1
    assert merged.model_name == "m" and merged.id == "7"
    assert grpc_model_name(original.SerializeToString()) == "m"
