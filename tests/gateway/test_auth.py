"""Tokens: read from file and environment, kept hashed, scopes enforced (401 vs 403)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gateway.auth import (
    TOKENS_ENV,
    Scope,
    TokenConfigError,
    TokenTable,
    load_token_entries,
)
from gateway.errors import Forbidden, Unauthorized

UPLOADER = "uploader-token-0123456789"
OPS = "ops-token-0123456789abcdef"


def _file(tmp_path: Path) -> Path:
    digest = hashlib.sha256(UPLOADER.encode()).hexdigest()
    path = tmp_path / "tokens.yaml"
    path.write_text(f"tokens:\n  - {{name: ci, scopes: [upload], sha256: {digest}}}\n")
    return path


def test_token_table_reads_file_and_environment_when_both_given(tmp_path: Path) -> None:
    env = {TOKENS_ENV: f'{{"tokens": [{{"name": "ops", "scopes": ["admin"], "token": "{OPS}"}}]}}'}
    table = TokenTable(load_token_entries(_file(tmp_path), env), predict_open=False)
    assert table.require(UPLOADER, Scope.UPLOAD).name == "ci"
    assert table.require(OPS, Scope.UPLOAD).name == "ops"  # admin implies upload
    assert table.require(OPS, Scope.PREDICT).name == "ops"


def test_token_table_keeps_only_digests_when_plain_token_configured(tmp_path: Path) -> None:
    env = {TOKENS_ENV: f"tokens: [{{name: ops, scopes: [admin], token: {OPS}}}]"}
    table = TokenTable(load_token_entries(None, env))
    assert OPS not in repr(vars(table))
    assert repr(hashlib.sha256(OPS.encode()).digest()) in repr(vars(table))
    assert table.require(OPS, Scope.ADMIN).name == "ops"


def test_token_table_answers_401_when_token_missing_or_unknown(tmp_path: Path) -> None:
    table = TokenTable(load_token_entries(_file(tmp_path), {}))
    with pytest.raises(Unauthorized, match="missing API token"):
        table.require(None, Scope.UPLOAD)
    with pytest.raises(Unauthorized, match="unknown API token"):
        table.require("not-a-known-token-at-all", Scope.UPLOAD)
    with pytest.raises(Unauthorized):  # same digest prefix is not enough
        table.require(UPLOADER + "x", Scope.UPLOAD)


def test_token_table_answers_403_when_scope_lacking(tmp_path: Path) -> None:
    table = TokenTable(load_token_entries(_file(tmp_path), {}), predict_open=False)
    with pytest.raises(Forbidden, match="lacks the 'admin' scope"):
        table.require(UPLOADER, Scope.ADMIN)
    with pytest.raises(Forbidden, match="'predict'"):
        table.require(UPLOADER, Scope.PREDICT)


def test_token_table_lets_predict_through_when_predict_open(tmp_path: Path) -> None:
    table = TokenTable(load_token_entries(_file(tmp_path), {}), predict_open=True)
    assert table.require(None, Scope.PREDICT).name == "anonymous"
    with pytest.raises(Unauthorized):
        table.require(None, Scope.UPLOAD)


def test_token_table_is_open_when_no_tokens_configured() -> None:
    table = TokenTable()
    assert not table.enabled
    assert table.require(None, Scope.ADMIN).allows(Scope.ADMIN)


@pytest.mark.parametrize("text", [
    "tokens: [{name: a, scopes: [upload]}]",  # no secret
    "tokens: [{name: a, scopes: [upload], token: short}]",  # too short to be a secret
    "tokens: [{name: a, scopes: [root], sha256: " + "0" * 64 + "}]",  # unknown scope
    "tokens: [{name: a, scopes: [upload], sha256: xyz}]",  # not a digest
    "tokens: {",  # not YAML
])
def test_token_table_refuses_config_when_malformed(text: str) -> None:
    with pytest.raises(TokenConfigError):
        load_token_entries(None, {TOKENS_ENV: text})


def test_token_table_refuses_config_when_token_declared_twice() -> None:
    text = f"tokens: [{{name: a, scopes: [upload], token: {OPS}}}, " \
           f"{{name: b, scopes: [admin], token: {OPS}}}]"
    with pytest.raises(TokenConfigError, match="twice"):
        TokenTable(load_token_entries(None, {TOKENS_ENV: text}))


