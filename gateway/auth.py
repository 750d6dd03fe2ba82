"""API tokens with scopes: who may predict, upload, or administer models.

Tokens come from a YAML/JSON document, read from a file and/or the environment
(``INFERGATE_TOKENS`` holds the same document; read in ``main()``)::

    tokens:
      - name: ci-uploader
        scopes: [upload]
        sha256: 3a7bd3e2360a3d29eea436fcfb7e44c735d117c42d1c1835420b6b9942dd4f1b
      - name: ops
        scopes: [admin]
        token: change-me          # accepted for convenience; hashed at load, then dropped

Only SHA-256 digests are kept in memory. A presented token is hashed once per request,
looked up by its digest's first bytes and confirmed with :func:`hmac.compare_digest`
on the whole digest. No per-request I/O.

Scopes: ``predict`` (inference and model metadata), ``upload`` (new versions, read
jobs and the model registry), ``admin`` (load, unload, rollback, delete, batching;
implies the other two). With no tokens configured the gateway is open (local use).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gateway.errors import Forbidden, Unauthorized
from gateway.policy import access
from gateway.policy.access import key_digest

TOKENS_ENV = "INFERGATE_TOKENS"


class Scope(StrEnum):
    PREDICT = "predict"
    UPLOAD = "upload"
    ADMIN = "admin"


@dataclass(frozen=True)
class Principal:
    """Whoever presented a valid token (or everyone, when auth is off)."""

    name: str
    scopes: frozenset[Scope]

    def allows(self, scope: Scope) -> bool:
        return scope in self.scopes or Scope.ADMIN in self.scopes


ANONYMOUS = Principal("anonymous", frozenset(Scope))


class TokenEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    scopes: tuple[Scope, ...] = Field(min_length=1)
    sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$")
    token: str | None = Field(None, min_length=16)

    @model_validator(mode="after")
    def _one_secret(self) -> TokenEntry:
        if (self.sha256 is None) == (self.token is None):
            raise ValueError(f"token {self.name!r}: give exactly one of 'sha256' or 'token'")
        return self

    def digest(self) -> bytes:
        if self.sha256 is not None:
            return bytes.fromhex(self.sha256)
        assert self.token is not None
        return token_digest(self.token)


class TokenDocument(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tokens: tuple[TokenEntry, ...] = ()


class TokenConfigError(ValueError):
    """The token file or environment variable is malformed."""


def token_digest(token: str) -> bytes:
    """:func:`gateway.policy.access.key_digest` as bytes (compared in constant time)."""
    return bytes.fromhex(key_digest(token))


def parse_tokens(text: str, source: str) -> tuple[TokenEntry, ...]:
    try:
        data = yaml.safe_load(text) or {}
        return TokenDocument.model_validate(data).tokens
    except (yaml.YAMLError, ValidationError) as exc:
        raise TokenConfigError(f"{source}: {exc}") from exc


def load_token_entries(path: Path | None, environ: Mapping[str, str] | None = None
                       ) -> tuple[TokenEntry, ...]:
    """Entries from ``path`` (if given) plus ``$INFERGATE_TOKENS`` (if set)."""
    entries: list[TokenEntry] = []
    if path is not None:
        entries.extend(parse_tokens(path.read_text(), str(path)))
    env_value = (os.environ if environ is None else environ).get(TOKENS_ENV)
    if env_value:
        entries.extend(parse_tokens(env_value, f"${TOKENS_ENV}"))
    return tuple(entries)


class TokenTable:
    """Digest prefix -> (digest, principal). ``require`` is what every adapter calls."""

    def __init__(self, entries: Iterable[TokenEntry] = (), predict_open: bool = True) -> None:
        # Indexed by the first 8 bytes of the digest; the full digest is then compared in
        # constant time. The index reveals nothing: it is itself a hash of the secret.
        self._index: dict[bytes, tuple[bytes, Principal]] = {}
        names: set[str] = set()
        for entry in entries:
            digest = entry.digest()
            if entry.name in names or digest[:8] in self._index:
                raise TokenConfigError(f"token {entry.name!r} is declared twice")
            names.add(entry.name)
            self._index[digest[:8]] = (digest, Principal(entry.name, frozenset(entry.scopes)))
        self.enabled = bool(self._index)
        # When auth is on and predict is gated, inference needs a predict token.
        self.predict_gated = self.enabled and not predict_open

    @classmethod
    def of_digests(cls, digests: Iterable[tuple[bytes, Principal]],
                   predict_gated: bool) -> TokenTable:
        """A table of tokens known by their digests only (what a data-plane replica
        receives in its snapshot: never a token itself)."""
        table = cls()
        for digest, principal in digests:
            table._index[digest[:8]] = (digest, principal)
        table.enabled = bool(table._index)
        table.predict_gated = table.enabled and predict_gated
        return table

    def adopt(self, other: TokenTable) -> None:
        """Check presented tokens against ``other``'s from now on (the servers holding
        this table keep it: a replica's tokens change with its snapshot)."""
        self._index, self.enabled = dict(other._index), other.enabled
        self.predict_gated = other.predict_gated

    def admit(self, entry: TokenEntry) -> None:
        """One more token, on a table with auth on (``gateway serve``'s local replica's
        own: gateway/local_replica.py)."""
        assert self.enabled, "a token admitted to an open table would close it"
        digest = entry.digest()
        self._index[digest[:8]] = (digest, Principal(entry.name, frozenset(entry.scopes)))

    def digests(self) -> list[tuple[bytes, Principal]]:
        """Every token's SHA-256 digest and principal (what a native data plane checks
        presented tokens against); never a token itself."""
        return list(self._index.values())

    def authenticate(self, presented: str | None) -> Principal:
        if not self.enabled:
            return ANONYMOUS
        if not presented:
            raise Unauthorized(access.MISSING_TOKEN)
        digest = token_digest(presented)
        stored, principal = self._index.get(digest[:8], (b"", ANONYMOUS))
        if not hmac.compare_digest(stored, digest):
            raise Unauthorized(access.UNKNOWN_TOKEN)
        return principal

    def require(self, presented: str | None, scope: Scope) -> Principal:
        """The principal behind ``presented`` if it holds ``scope``; else 401/403."""
        if scope is Scope.PREDICT and not self.predict_gated:
            return ANONYMOUS
        principal = self.authenticate(presented)
        if not principal.allows(scope):
            raise Forbidden(access.LACKS_SCOPE.format(name=principal.name, scope=scope.value))
        return principal
