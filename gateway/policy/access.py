"""Who is calling: the presented token, its digest, and what a refusal says.

One precedence for HTTP headers, gRPC metadata and HAProxy's rules: ``x-api-key``,
else ``authorization: Bearer <token>``. A key is only ever held as its SHA-256 digest
(lower-case hex, :func:`key_digest`): token tables, rate-limit tables, HAProxy's maps
and stick tables all key by it, and no error message holds a credential. HAProxy
computes the same digest with ``sha2(256),hex,lower`` (:data:`HAPROXY_DIGEST`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

DIGEST_PREFIX = "sha256:"
HAPROXY_DIGEST = "sha2(256),hex,lower"  # HAProxy's converters for key_digest
ANONYMOUS = "anonymous"  # requests without a key (never a hex digest)
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")

MISSING_TOKEN = ("missing API token: send 'X-API-Key: <token>' or 'Authorization: Bearer "
                 "<token>' (gRPC: 'x-api-key' or 'authorization' metadata)")
UNKNOWN_TOKEN = "unknown API token"
LACKS_SCOPE = "token '{name}' lacks the '{scope}' scope"
WWW_AUTHENTICATE = 'Bearer realm="infergate"'


def presented_token(header: Callable[[str], str | None]) -> str | None:
    """The token a caller presents; ``header`` looks a lower-case name up."""
    key = header("x-api-key")
    if key is not None:
        return key
    auth = header("authorization") or ""
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return None


def key_digest(key: str) -> str:
    """The one digest of a presented key: hex SHA-256 of its UTF-8 bytes."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def configured_digest(configured: str) -> str:
    """A key as configuration names it, ``sha256:<64 hex digits>`` (a config file need
    not hold the key) or the plain key, as its digest; ValueError when malformed."""
    if configured.startswith(DIGEST_PREFIX):
        digest = configured[len(DIGEST_PREFIX):].lower()
        if not _HEX_DIGEST.fullmatch(digest):
            raise ValueError(f"key {configured[:12]}…: expected sha256: followed by 64 "
                             "hexadecimal digits")
        return digest
    return key_digest(configured)
