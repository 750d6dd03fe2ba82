"""The board the residency's moves are worked out on: what a member uses, and the
victims that make room (the coldest, no more of them than needed)."""

from __future__ import annotations

import pytest

from gateway.policy.residency_board import Board, used_bytes
from tests.gateway.policy.test_residency import GB, K, _member, _model, _view


def test_used_bytes_counts_held_and_draining_models() -> None:
    view = _view([_model("a", 1), _model("b", 2), _model("c", 0.5)],
                 [_member("m1", 8, ["a"], draining=["b"]), _member("m2", 8, ["a", "c"])])
    assert used_bytes(view, "m1") == 3 * GB
    assert used_bytes(view, "m2") == int(1.5 * GB)
    with pytest.raises(KeyError):
        used_bytes(view, "m9")


def test_room_takes_the_coldest_models_that_free_it_and_no_more_of_them_than_needed() -> None:
    # demand per byte: a 0.1 / GB, c 0.2 / GB, b 10 / GB (all loaded long ago)
    view = _view([_model("a", 1, demand=0.1), _model("b", 1, demand=10.0),
                  _model("c", 2, demand=0.4)], [_member("m1", 4, ["a", "b", "c"])])
    board = Board(view, K)
    assert board.room("m1", 0, lambda _: True) == []
    assert board.room("m1", GB // 2, lambda _: True) == ["a"]
    # a, then c, free it; c alone does too, so a stays
    assert board.room("m1", int(1.5 * GB), lambda _: True) == ["c"]
    assert board.room("m1", 3 * GB, lambda _: True) == ["a", "c"]
    assert board.room("m1", 4 * GB, lambda _: True) == ["a", "c", "b"]
    assert board.room("m1", 4 * GB + 1, lambda _: True) is None
    # only the eligible go: without c, 1.5 GB takes a and b
    assert board.room("m1", int(1.5 * GB), lambda n: n != "c") == ["a", "b"]
