"""Triton's 500 / INTERNAL for an unparseable request becomes a client error; every
other answer is left alone (matched by Triton's message prefix, at this one boundary)."""

from __future__ import annotations

import pytest

from gateway.policy.parse_errors import bounded, grpc_code, http_status


@pytest.mark.parametrize("body", [
    b'{"error":"failed to parse the request JSON buffer: Missing a name for object member."}',
    b'{"error":"Unable to parse \'name\': attempt to access JSON non-string as string"}',
    b'{"error":"failed to get request params.: attempt to get members for non-object"}',
    b'{"error":"parameter key \'a\' was not found in the JSON"}',
])
def test_http_status_is_400_when_triton_could_not_parse_the_body(body: bytes) -> None:
    assert http_status(500, body) == 400


@pytest.mark.parametrize(("status", "body"), [
    (500, b'{"error":"onnx runtime error 6: out of memory"}'),  # a real internal error
    (500, b"failed to parse"),  # not Triton's error body
    (400, b'{"error":"Unable to parse \'shape\'"}'),
    (200, b'{"model_name":"failed to parse"}'),
])
def test_http_status_unchanged_when_not_a_parse_error(status: int, body: bytes) -> None:
    assert http_status(status, body) == status


def test_grpc_code_is_invalid_argument_only_for_internal_parse_errors() -> None:
    assert grpc_code("INTERNAL", "Unable to parse request") \
        == "INVALID_ARGUMENT"
    assert grpc_code("INTERNAL", "CUDA error") == "INTERNAL"
    assert grpc_code("NOT_FOUND", "Unable to parse") == "NOT_FOUND"


def test_repository_load_of_a_model_the_repository_lacks_is_not_found() -> None:
    message = "failed to load 'zz', failed to poll from model repository"
    assert http_status(500, b'{"error":"' + message.encode() + b'"}') == 404
    assert grpc_code("INTERNAL", message) == "NOT_FOUND"


def test_unknown_content_encoding_is_the_clients_mistake() -> None:
    assert http_status(501, b'{"error":"Unsupported compression type x"}') == 400
    assert http_status(501, b'{"error":"not supported through the gateway"}') == 501


def test_bounded_cuts_messages_a_grpc_client_would_refuse() -> None:
    assert bounded("short") == "short"
    cut = bounded("x" * 100_000)
    assert len(cut) < 16 * 1024 and cut.endswith("(100000 characters, cut)")


def test_a_request_tritons_queue_dropped_is_the_clients_deadline() -> None:
    body = b'{"error":"Request timeout expired"}'
    assert http_status(503, body) == 504
    assert http_status(503, b'{"error":"Exceeds maximum queue size"}') == 503
    assert grpc_code("UNAVAILABLE", "Request timeout expired") \
        == "DEADLINE_EXCEEDED"
    assert grpc_code("UNAVAILABLE", "Exceeds maximum queue size") \
        == "UNAVAILABLE"
