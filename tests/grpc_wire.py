"""A gRPC call as the wire carries it: ``nghttp`` (nghttp2-client, installed with h2load)
sends one and prints the headers and trailers received, as they were sent. grpc-python
hides what it forgives (an answer without ``content-type: application/grpc``, which
Go's gRPC refuses: "malformed header: missing HTTP content-type")."""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Mapping

GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"
_RECEIVED = re.compile(r"^\[[ 0-9.]+\] recv \(stream_id=\d+\) ([a-z0-9-]+): (.*)$",
                       re.MULTILINE)


def grpc_call(address: str, message: bytes, metadata: Mapping[str, str] | None = None,
              path: str = GRPC_INFER, timeout_s: float = 30.0) -> dict[str, str]:
    """The headers and trailers (together, the later of a name winning) of the answer to
    ``message`` (a serialised request, framed here) sent to ``path`` at ``address``
    ("host:port", plain HTTP/2) with ``metadata``."""
    framed = b"\x00" + len(message).to_bytes(4, "big") + message
    extra = [arg for name, value in (metadata or {}).items()
             for arg in ("-H", f"{name.lower()}: {value}")]
    with tempfile.NamedTemporaryFile(suffix=".grpc") as body:
        body.write(framed)
        body.flush()
        out = subprocess.run(
            ["nghttp", "-v", "-n", "-t", str(int(timeout_s)), "-d", body.name,
             "-H", "content-type: application/grpc", "-H", "te: trailers", *extra,
             f"http://{address}{path}"],
            capture_output=True, text=True, timeout=timeout_s + 10, check=False).stdout
    return dict(_RECEIVED.findall(out))
