"""Request policy, written once: every rule an inference request passes before it
reaches a Triton member, as plain data and pure functions that both data planes read.

The Python forwarder (``gateway/python/forwarder.py`` and its adapters ``http_api.py``,
``grpc_api.py``) calls these functions; HAProxy's renderer (``gateway/haproxy/config.py``
and its parts) renders the same constants, patterns and message templates into its
rules. A parity
suite (``tests/gateway/test_parity.py``) sends one table of requests to both planes.

The checks, in the order both planes make them (:data:`ORDER`); the first that refuses
answers:

==============  ==========================================  ===============================
check           refuses with                                module
==============  ==========================================  ===============================
body_size       413 / RESOURCE_EXHAUSTED                    gateway limits (``--max-body``)
request         400 / INVALID_ARGUMENT: no model named,     :mod:`.model_name`,
                a malformed deadline, a shape no request    :mod:`.deadline`,
                can back                                    :mod:`.shape`
auth            401 / UNAUTHENTICATED, 403 / PERMISSION_     :mod:`.access`
                DENIED (inference gated by tokens)
rate            429 / RESOURCE_EXHAUSTED + Retry-After      :mod:`.rate` (a tenant's own
                                                            rate: :mod:`.tenancy`)
route           404 / NOT_FOUND (no pool serves the model)  ``gateway/pools.py``
readiness       503 / UNAVAILABLE + Retry-After             :mod:`.readiness`
admission       429 / RESOURCE_EXHAUSTED + Retry-After:     :mod:`.admission`,
                the model's bound, then with tenants the    :mod:`.tenancy`
                tenant's limit, its class ceiling, its
                share
==============  ==========================================  ===============================

An admitted request of a model under rollout is pinned to its stable or candidate
version (:mod:`.rollout`, the same draw on both planes). Then the member: least loaded
by Triton's queue depth, one retry on another member for a connection failure, the
member ejected after it (:mod:`.upstream`), and Triton's own 500 / INTERNAL for a
request it could not parse turned into 400 / INVALID_ARGUMENT (:mod:`.parse_errors`).
Status codes and gRPC codes come from ``gateway/errors.py``'s one table.
"""

from __future__ import annotations

ORDER = ("body_size", "request", "auth", "rate", "route", "readiness", "admission")
