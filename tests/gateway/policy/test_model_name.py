"""Which model a gRPC message names: field 1 from the wire bytes, or a clear refusal."""

from __future__ import annotations

import pytest
from tritonclient.grpc import service_pb2

from gateway.errors import InvalidInput
from gateway.policy.model_name import NO_MODEL, NOT_UTF8, grpc_model_name


def test_model_name_found_when_not_first_field() -> None:
    request = service_pb2.ModelInferRequest(model_version="3", id="x")
    data = request.SerializeToString() + service_pb2.ModelInferRequest(
        model_name="late").SerializeToString()
    assert grpc_model_name(data) == "late"


@pytest.mark.parametrize("data", [
    b"", b"\x12\xff",  # nothing; a field cut short before field 1
    b"\x0a\x04ti",  # field 1 cut short: no partial name
    b"\x0a\x00",  # empty
    service_pb2.ModelInferRequest(id="x").SerializeToString(),  # absent
    b"\x0b\x0c\x0a\x04tiny",  # a group wire type before it
    b"\x08" + b"\xff" * 11 + b"\x01\x0a\x04tiny",  # a varint longer than 10 bytes
])
def test_model_name_refused_when_missing_empty_or_malformed(data: bytes) -> None:
    with pytest.raises(InvalidInput, match="names no model") as info:
        grpc_model_name(data)
    assert info.value.message == NO_MODEL


def test_model_name_refused_when_not_utf8() -> None:
    with pytest.raises(InvalidInput) as info:
        grpc_model_name(b"\x0a\x02\xff\xfe")
    assert info.value.message == NOT_UTF8
