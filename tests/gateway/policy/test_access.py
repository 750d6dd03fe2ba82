"""Who is calling: one precedence, one digest."""

from __future__ import annotations

import hashlib

import pytest

from gateway.policy.access import configured_digest, key_digest, presented_token


@pytest.mark.parametrize(("headers", "expected"), [
    ({"x-api-key": "k1", "authorization": "Bearer k2"}, "k1"),  # one precedence
    ({"authorization": "bearer  k2 "}, "k2"),
    ({"authorization": "Basic dXNlcg=="}, None),
    ({}, None),
])
def test_presented_token_has_one_precedence_when_both_headers_sent(
    headers: dict[str, str], expected: str | None,
) -> None:
    assert presented_token(headers.get) == expected


def test_key_digest_is_lower_hex_sha256_when_key_given() -> None:
    assert key_digest("k") == hashlib.sha256(b"k").hexdigest()
    assert configured_digest("k") == key_digest("k")
    assert configured_digest("sha256:" + key_digest("k").upper()) == key_digest("k")


@pytest.mark.parametrize("bad", ["sha256:", "sha256:" + "g" * 64, "sha256:" + "a" * 63])
def test_configured_digest_refuses_when_malformed(bad: str) -> None:
    with pytest.raises(ValueError, match="64 hexadecimal"):
        configured_digest(bad)
