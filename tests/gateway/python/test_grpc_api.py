"""Wire-level helpers of the gRPC adapter (no sockets)."""

from __future__ import annotations

from tritonclient.grpc import service_pb2

from gateway.policy.model_name import grpc_message_whole, grpc_model_name
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


def test_timeout_parameter_would_complete_a_message_cut_short_in_its_tensor() -> None:
    """Why ModelInfer appends only to a whole message (``grpc_message_whole``): cut 13
    bytes short in its raw tensor, a message takes the first 13 bytes of the 18-byte
    ``timeout`` parameter as the rest of the tensor, the other 5 as an unknown field, and
    parses, though what the client sent does not."""
    request = service_pb2.ModelInferRequest(model_name="tiny")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.append(bytes(64))
    cut = request.SerializeToString()[:-13]
    parsed = service_pb2.ModelInferRequest.FromString(with_timeout_parameter(cut, 60.0))
    assert len(parsed.raw_input_contents[0]) == 64  # the tensor Triton expects
    assert not grpc_message_whole(cut)
