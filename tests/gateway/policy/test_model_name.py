"""Which model a gRPC message names: field 1 from the wire bytes, or a clear refusal;
whether a message is whole, so that fields may be appended to it."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from gateway.errors import InvalidInput
from gateway.policy.model_name import NO_MODEL, NOT_UTF8, grpc_message_whole, grpc_model_name


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


def _request(shape: tuple[int, ...]) -> bytes:
    request = service_pb2.ModelInferRequest(model_name="tiny", id="r1")
    request.inputs.add(name="x", datatype="FP32", shape=list(shape))
    request.raw_input_contents.append(np.ones(int(np.prod(shape)), np.float32).tobytes())
    request.outputs.add(name="y")
    request.parameters["priority"].int64_param = 300  # a varint over one byte
    return request.SerializeToString()


@pytest.mark.parametrize("shape", [(1, 16), (1, 3, 224, 224)])  # lengths of 1 and 3 bytes
def test_whole_message_is_every_prefix_that_parses(shape: tuple[int, ...]) -> None:
    """Cut anywhere, a valid message is whole exactly when what is left parses: the cut
    fell between two top-level fields (cut inside one, appended fields would complete it)."""
    data = _request(shape)
    step = max(1, len(data) // 4000)
    cuts = {*range(0, min(len(data), 200)), *range(0, len(data), step),
            *range(len(data) - 200, len(data) + 1)}
    for n in sorted(cuts):
        try:
            service_pb2.ModelInferRequest.FromString(data[:n])
            parses = True
        except DecodeError:
            parses = False
        assert grpc_message_whole(data[:n]) is parses, n


@pytest.mark.parametrize("data", [
    b"\x0b\x0c",  # a group wire type: not appended to
    b"\x0f",  # wire types 6, 7 do not exist
    b"\x08" + b"\xff" * 11,  # a varint longer than 10 bytes
    b"\x09\x00\x00",  # fixed64 cut short
    b"\x80",  # a key cut short
])
def test_message_not_whole(data: bytes) -> None:
    assert not grpc_message_whole(data)
