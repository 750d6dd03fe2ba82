"""HTTP/1.1 framing at the Python front door (uvicorn + httptools), decided as HAProxy
and Triton decide it.

A request with both ``Transfer-Encoding: chunked`` and ``Content-Length`` (what Python
``requests`` sends for a generator body with a length header) is read by its chunked
encoding, the length ignored, and the connection is closed after the answer (RFC 9112
section 6.1: such a message may be an attempt at request smuggling, so nothing after it
on that connection is trusted). HAProxy 2.6 and Triton 2.51 both serve it; httptools
alone refuses it with a plain-text 400.

Every request httptools cannot parse is answered in the gateway's error shape,
``{"error": "..."}``, instead of uvicorn's plain text, and the connection is closed
lingering: the gateway stops writing, then reads and drops whatever the client still
sends (for up to ``LINGER_S``) before it closes. Closing at once with unread bytes makes
the kernel reset the connection, and a client still sending its body (``requests`` with
a generator body that it declared chunked but sends raw) would lose the answer.
"""

from __future__ import annotations

import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.errors import InvalidInput, http_status_of

LINGER_S = 2.0


class GatewayHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the framing decisions above."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lingering = False
        # Transfer-Encoding overrides Content-Length instead of failing the parse
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True,
                                             lenient_chunked_length=True)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        names = {name for name, _ in self.headers}
        cycle = getattr(self, "cycle", None)
        if b"transfer-encoding" in names and b"content-length" in names and cycle is not None:
            cycle.keep_alive = False

    def send_400_response(self, msg: str) -> None:
        body = json.dumps({"error": f"malformed HTTP request: {msg}"}).encode()
        status = http_status_of(InvalidInput)
        head = (f"HTTP/1.1 {status} Bad Request\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
        self.transport.write(head + body)
        self._lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if not self._lingering:  # after a refusal the rest of the bytes mean nothing
            super().data_received(data)

    def eof_received(self) -> None:
        if self._lingering:
            self.transport.close()
            return
        super().eof_received()
