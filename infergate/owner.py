"""What a model owner needs on the local stack (``make run``): API tokens made at first
start, and an example upload (an ONNX model, its spec and evaluation samples) to copy.

Tokens: one with the ``upload`` scope, one with ``admin``. Only their SHA-256 digests
go into the token file the gateway reads; the plain tokens are printed once, at first
start, and kept in a file only this user can read (``0600``), for the next starts.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from converters.tiny import TINY_WIDTH, tiny_onnx
from gateway.auth import token_digest

EXAMPLE_MODEL = "my_model"


@dataclass(frozen=True)
class LocalTokens:
    upload: str
    admin: str
    digests_file: Path  # what the gateway reads (hashed)
    folder: Path  # upload.token, admin.token: the plain tokens, 0600
    created: bool  # made just now: print them

    def file(self, scope: str) -> Path:
        return self.folder / f"{scope}.token"


def _private_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(path, 0o600)


def local_tokens(state_dir: Path) -> LocalTokens:
    """The stack's tokens: read back from ``state_dir`` or made there now."""
    plain: dict[str, str] = {}
    created = False
    for scope in ("upload", "admin"):
        path = state_dir / f"{scope}.token"
        if not path.exists():
            _private_write(path, f"ig-{scope}-{secrets.token_urlsafe(24)}\n")
            created = True
        plain[scope] = path.read_text().strip()
    document = {"tokens": [
        {"name": f"local-{scope}", "scopes": [scope], "sha256": token_digest(token).hex()}
        for scope, token in plain.items()
    ]}
    digests_file = state_dir / "tokens.yaml"
    _private_write(digests_file, yaml.safe_dump(document, sort_keys=False))
    return LocalTokens(plain["upload"], plain["admin"], digests_file, state_dir, created)


@dataclass(frozen=True)
class ExampleUpload:
    model: Path
    spec: Path
    evaluation: Path


def example_upload(folder: Path) -> ExampleUpload:
    """A small ONNX model (``y = 2x + 1`` over ``[batch, 16]``), its spec and evaluation
    samples: what an owner's own files look like."""
    folder.mkdir(parents=True, exist_ok=True)
    model = tiny_onnx(folder / "model.onnx")
    spec = folder / "spec.json"
    spec.write_text(json.dumps({
        "inputs": [{"name": "x", "datatype": "FP32", "shape": ["batch", TINY_WIDTH]}],
        "precisions": ["fp32"], "max_batch_size": 8,
    }, indent=2) + "\n")
    evaluation = folder / "evaluation.npz"
    rng = np.random.default_rng(0)
    np.savez(evaluation, x=rng.normal(size=(8, TINY_WIDTH)).astype(np.float32))
    return ExampleUpload(model, spec, evaluation)
