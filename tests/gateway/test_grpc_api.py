"""Wire-level helpers of the gRPC adapter (no sockets)."""

from __future__ import annotations

import pytest
from tritonclient.grpc import service_pb2

from gateway.errors import InvalidInput
from gateway.grpc_api import read_string_field, with_timeout_parameter


def test_timeout_parameter_is_appended_without_decoding_when_deadline_set() -> None:
    original = service_pb2.ModelInferRequest(model_name="m", id="7")
    original.parameters["timeout"].int64_param = 999_999_999
    original.parameters["priority"].int64_param = 1
    merged = service_pb2.ModelInferRequest.FromString(
        with_timeout_parameter(original.SerializeToString(), 0.25)
    )
    assert merged.parameters["timeout"].int64_param == 250_000
    assert merged.parameters["priority"].int64_param == 1
    assert merged.model_name == "m" and merged.id == "7"
    assert read_string_field(original.SerializeToString()) == "m"


def test_read_string_field_finds_model_name_when_not_first_field() -> None:
    request = service_pb2.ModelInferRequest(model_version="3", id="x")
    data = request.SerializeToString() + service_pb2.ModelInferRequest(
        model_name="late").SerializeToString()
    assert read_string_field(data, 1) == "late"


def test_read_string_field_rejects_truncated_bytes() -> None:
    with pytest.raises(InvalidInput):
        read_string_field(b"\x12\xff")
