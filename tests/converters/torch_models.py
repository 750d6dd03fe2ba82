"""Small PyTorch models for the source tests (entry points live here, importable as
``tests.converters.torch_models:<factory>``)."""

from __future__ import annotations

from typing import Any

import torch

from converters.sources import EntryPointModel
from converters.spec import parse_input_spec


class TinyNet(torch.nn.Module):
    """[batch, 3, 16, 16] -> [batch, 10]."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def tiny_module() -> Any:
    """A bare module: the caller declares the inputs (--input-spec)."""
    return TinyNet().eval()


def tiny_with_spec() -> EntryPointModel:
    return EntryPointModel(TinyNet().eval(), parse_input_spec("image:float32[batch,3,16,16]"),
                           ("scores",))


def not_a_model() -> Any:
    return {"weights": [1, 2, 3]}


class TokenNet(torch.nn.Module):
    """``ids`` int64 [batch, sequence] over a vocabulary of TOKEN_VOCAB -> [batch, 10]."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(TOKEN_VOCAB, 8)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.embed(ids).mean(dim=1))


TOKEN_VOCAB = 40


def token_with_spec() -> EntryPointModel:
    return EntryPointModel(TokenNet().eval(), parse_input_spec("ids:int64[batch,sequence]"),
                           ("scores",))
