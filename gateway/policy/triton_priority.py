"""Triton's own priority levels, per request (issue 36): a request of a tenant's class
goes to a model whose config has ``dynamic_batching.priority_levels`` with the level its
class maps to, so that Triton's batcher takes critical requests before those queued
ahead of them. Pure; both data planes read it.

- **The levels** (:func:`level`): critical 1, standard 2, sheddable 3, each capped at
  the model's number of levels (a model with two, as the control plane's batching
  tuner writes them, puts standard and sheddable on its level 2). A model with fewer
  than two levels, or a request without a class (no tenancy), gets nothing: Triton's
  default level.
- **Which models**: the control plane reads each model's config from its members (at
  most every :data:`LEVELS_TTL_S`) and publishes the fewest levels any member has, so
  a level is never out of range on a member (Triton would take it as the default).
- **The parameter**: HTTP ``parameters.priority``, gRPC ``parameters["priority"]``
  (``uint64_param``, as ``tritonclient`` sends it). The gateway's level replaces one
  the client gave: the class is the tenancy's decision (``tenancy.triton_levels:
  false`` leaves the client's).
  - gRPC: :func:`grpc_entry`, appended to the message (a later map entry wins);
    HAProxy's Lua filter appends the same bytes (``gateway/haproxy/grpc_fields.lua``).
  - HTTP: the JSON header of the body (the whole body, or the first
    ``Inference-Header-Content-Length`` bytes). Triton reads the *first* ``parameters``
    object, and the first ``priority`` in it, so the Python plane sets the key in the
    parsed header, and HAProxy's filter inserts ``"priority":N`` first in the top-level
    ``parameters`` object as the body streams through, or a whole ``parameters`` object
    at the end of the header when it has none, padded with spaces to
    :data:`HTTP_ADDED` bytes whichever it was, so the lengths (``content-length``, the
    header length) are known before the body is read.
  - Not for a compressed body (``content-encoding``, a compressed gRPC message): it
    goes as the client sent it.

Measured on this host (docs/request-policy.md, "Triton's priority levels"): a model
with levels loses a fifth to a half of its throughput to them, whatever the requests
ask, and its tail does not shorten for the classes given as levels; so the converter
gives models none, and the classes map onto the levels an operator gave (the batching
tuner's two, ``POST /v1/models/{m}/batching``, among them).
"""

from __future__ import annotations

from tritonclient.grpc import service_pb2

from gateway.config.tenancy import Priority

# the class's level in a model with at least as many (1 is served first)
LEVELS: dict[Priority, int] = {Priority.CRITICAL: 1, Priority.STANDARD: 2,
                               Priority.SHEDDABLE: 3}
LEVELS_TTL_S = 60.0  # a model's levels are read again from its member after this long
PARAMETER = "priority"
# what HAProxy's filter adds to an HTTP body, whichever way it inserts the level: the
# longest form, a whole parameters object (one digit: levels are at most 3)
HTTP_ADDED = len(',"parameters":{"priority":1}')


def level(priority: Priority | None, levels: int) -> int | None:
    """The per-request ``priority`` for a model with ``levels`` priority levels, or
    None (send nothing: the model's default level) when it has fewer than two or the
    request has no class."""
    if priority is None or levels < 2:
        return None
    return min(LEVELS[priority], levels)


def grpc_entry(value: int) -> bytes:
    """``parameters["priority"] = value`` as wire bytes to append to a
    ``ModelInferRequest`` (a map entry of field 4; the last entry of a key wins)."""
    extra = service_pb2.ModelInferRequest()
    extra.parameters[PARAMETER].uint64_param = value
    return extra.SerializeToString()


__all__ = ["HTTP_ADDED", "LEVELS", "LEVELS_TTL_S", "PARAMETER", "grpc_entry", "level"]
