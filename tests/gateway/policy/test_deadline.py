"""X-Request-Timeout-Ms: one rule, read by both planes."""

from __future__ import annotations

import re

import pytest

from gateway.errors import InvalidInput
from gateway.policy.deadline import HTTP_TIMEOUT_PATTERN, http_deadline_s


@pytest.mark.parametrize(("value", "seconds"), [
    (None, None), ("1", 0.001), ("250", 0.25), ("999999999", 999999.999)])
def test_deadline_read_when_whole_positive_milliseconds(value: str | None,
                                                        seconds: float | None) -> None:
    assert http_deadline_s(value) == seconds


@pytest.mark.parametrize("value", ["", "0", "-1", "1.5", "1e3", "nan", "inf", " 5", "05",
                                   "1000000000", "soon", "٣"])
def test_deadline_refused_when_not_whole_positive_milliseconds(value: str) -> None:
    with pytest.raises(InvalidInput, match="X-Request-Timeout-Ms must be a whole number"):
        http_deadline_s(value)
    # HAProxy matches the same pattern (PCRE: \d is not used, so no other digits)
    assert not re.fullmatch(HTTP_TIMEOUT_PATTERN, value)
