"""What HAProxy answers itself (``gateway/haproxy/answers.py``): its error files follow
the error table. The ``http-request return`` lines in place: ``test_golden.py``."""

from __future__ import annotations

import pytest

from gateway import errors
from gateway.haproxy.answers import LOCAL_ERRORS, error_files


@pytest.mark.parametrize("status", sorted(LOCAL_ERRORS))
def test_error_files_use_the_error_table_when_haproxy_answers_itself(status: int) -> None:
    error, _ = LOCAL_ERRORS[status]
    files = error_files()
    http, grpc = files[f"http-{status}.http"], files[f"grpc-{status}.http"]
    assert http.startswith(f"HTTP/1.1 {errors.http_status_of(error)} ")
    assert '{"error": "' in http
    assert grpc.startswith("HTTP/1.1 200 ")  # gRPC errors travel as trailers-only 200s
    assert f"grpc-status: {errors.grpc_code_number(error)}\r\n" in grpc
