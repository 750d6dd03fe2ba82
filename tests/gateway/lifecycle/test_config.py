"""The example configuration parses, paths resolve next to it, and the CLI hashes tokens
the way the gateway compares them."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from gateway.auth import Scope, TokenTable, load_token_entries
from gateway.config import load_gateway_config
from gateway.models_cli import app as models_app

EXAMPLES = Path(__file__).resolve().parents[3] / "gateway" / "examples"


def test_example_lifecycle_config_loads_with_paths_next_to_it_when_relative() -> None:
    config = load_gateway_config(EXAMPLES / "lifecycle.yaml")
    assert config.lifecycle is not None
    assert config.lifecycle.repository.resolve() == EXAMPLES.parents[1] / "model_repo"
    assert config.lifecycle.state_dir.resolve() == EXAMPLES.parents[1] / ".infergate"
    assert config.auth.tokens_file == EXAMPLES / "tokens.yaml"
    policy = config.models["efficientnet_lite0"]
    assert policy.preload and policy.keep_warm is not None


def test_example_tokens_admit_their_documented_tokens() -> None:
    table = TokenTable(load_token_entries(EXAMPLES / "tokens.yaml", {}), predict_open=False)
    assert table.require("predict-token-change-me-0001", Scope.PREDICT).name == "apps"
    assert table.require("upload-token-change-me-0002", Scope.UPLOAD).name == "model-owners"
    assert table.require("admin-token-change-me-00003", Scope.ADMIN).name == "platform"


def test_hash_token_prints_digest_the_gateway_accepts() -> None:
    result = CliRunner().invoke(models_app, ["hash-token"], input="my-new-token-0123456789\n")
    assert result.exit_code == 0
    text = f"tokens: [{{name: x, scopes: [upload], sha256: {result.output.strip()}}}]"
    table = TokenTable(load_token_entries(None, {"INFERGATE_TOKENS": text}))
    assert table.require("my-new-token-0123456789", Scope.UPLOAD).name == "x"
