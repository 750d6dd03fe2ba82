"""Input shapes no request can back: refused before Triton sees them.

Triton 2.51 multiplies an input's shape into its element count and allocates for it
before it checks the data; a shape whose count overflows 64 bits (or needs exabytes)
crashes the server for every client (``[933246, 1883129, 17592186044415, 9090]``, sent
as JSON, does). A request body holds at most ``--max-request-bytes`` (256 MiB), so no
honest input has more than 10^18 elements, and no honest shape is written with more
than :data:`MAX_SHAPE_DIGITS` digits in all. Both planes scan the start of an HTTP
inference body (the JSON, or the JSON header before binary tensors) for a ``"shape"``
list with more digits than that, with one pattern (:data:`HUGE_SHAPE_PATTERN`): Python's
``re`` here, HAProxy's PCRE on ``req.body``; 400 / INVALID_ARGUMENT.

The scan is bounded to the first :data:`SCANNED_BYTES` of the body (what HAProxy holds
in one buffer): a shape written after that is left to Triton. gRPC needs no scan: its
shapes are int64 fields, which Triton checks.
"""

from __future__ import annotations

import re

from gateway.errors import InvalidInput

MAX_SHAPE_DIGITS = 18
# a "shape": [ ... ] holding more than MAX_SHAPE_DIGITS digits before its "]"
# (\x22 is the double quote: the same text is a valid pattern for Python and for PCRE)
HUGE_SHAPE_PATTERN = r"\x22shape\x22\s*:\s*\[([^\]0-9]*[0-9]){" + str(MAX_SHAPE_DIGITS + 1) + "}"
SCANNED_BYTES = 16 * 1024
HUGE_SHAPE = (f"an input's shape is written with more than {MAX_SHAPE_DIGITS} digits: its "
              "element count is beyond what any request can hold")
_HUGE_SHAPE = re.compile(HUGE_SHAPE_PATTERN.encode())


def check_shapes(body: bytes) -> None:
    """InvalidInput when the start of an HTTP inference body declares a huge shape."""
    if _HUGE_SHAPE.search(body, 0, SCANNED_BYTES):
        raise InvalidInput(HUGE_SHAPE)
