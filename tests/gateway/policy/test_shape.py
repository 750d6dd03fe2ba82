"""Shapes no request can back, found in the start of an HTTP inference body."""

from __future__ import annotations

import json

import pytest

from gateway.errors import InvalidInput
from gateway.policy.shape import SCANNED_BYTES, check_shapes


def _body(*shapes: list[int], before: str = "") -> bytes:
    inputs = [{"name": f"x{i}", "datatype": "INT16", "shape": s, "data": [1]}
              for i, s in enumerate(shapes)]
    return (before + json.dumps({"inputs": inputs})).encode()


@pytest.mark.parametrize("shapes", [
    ([933246, 1883129, 17592186044415, 9090],),  # crashed Triton 2.51 (element count overflow)
    ([1, 16], [10**19]),  # the second input
    ([123456789, 123456789, 12],),  # 20 digits
])
def test_shape_refused_when_written_with_more_than_18_digits(shapes: tuple[list[int]]) -> None:
    with pytest.raises(InvalidInput, match="more than 18 digits"):
        check_shapes(_body(*shapes))


@pytest.mark.parametrize("body", [
    _body([1, 3, 224, 224]), _body([-1, 16]), _body([999999999, 999999999]),  # 18 digits
    b'{"inputs": [{"shape": [1, 16], "data": [' + b"12345678901234567890, " * 10 + b"1]}]}",
    _body([10**19], before=" " * SCANNED_BYTES),  # beyond the scanned start: Triton's
])
def test_shape_passes_when_within_18_digits_or_beyond_the_scan(body: bytes) -> None:
    check_shapes(body)
