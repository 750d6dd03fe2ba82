"""Which calls are the control plane's, and which the data plane serves itself.

A data-plane replica serves every call a client makes to infer or to learn what it may
infer on, whether or not the control plane is up: inference and its streams, generate,
health and readiness (the replica's own view), server and model metadata, readiness,
config and statistics (asked of the members), shared memory (refused alike). HAProxy
carries inference; what it cannot route (streams, generate, a miss, a rollout's shadow
share, gRPC detours) goes to the replica's own Python forwarder
(``gateway/replica.py``), and so does every call below that is not the control plane's.

The control plane's calls are the ones that change or report the fleet: the lifecycle
API, settings, tenants, residency and the data-plane feed (``/v1/``), the console
(``/ui``), the gateway's own metrics, the repository API, trace and log settings. While
it is down they fail at once, saying so (``gateway/haproxy/answers.py``'s
``CONTROL_ERRORS``); inference does not wait for it.

HAProxy renders its ACLs from these constants (``gateway/haproxy/frontend.py``); the
Python side asks :func:`control_http` and :func:`control_grpc`; the parity test holds
them alike.
"""

from __future__ import annotations

import re

# path prefixes of the control plane's HTTP calls
CONTROL_HTTP_PREFIXES = ("/v1/", "/ui", "/v2/repository/", "/v2/trace/", "/v2/logging")
# whole paths (FastAPI's own pages, the gateway's metrics, the console's root)
CONTROL_HTTP_PATHS = ("/", "/metrics", "/docs", "/openapi.json")
# a model's trace settings
CONTROL_HTTP_PATTERN = r"^/v2/models/[^/]+(/versions/[^/]+)?/trace/setting$"
GRPC_SERVICE = "inference.GRPCInferenceService"
CONTROL_GRPC_METHODS = ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload",
                        "TraceSetting", "LogSettings")

_CONTROL_HTTP = re.compile(CONTROL_HTTP_PATTERN)


def control_http(path: str) -> bool:
    """Whether an HTTP call to ``path`` is the control plane's."""
    return (path in CONTROL_HTTP_PATHS or path.startswith(CONTROL_HTTP_PREFIXES)
            or _CONTROL_HTTP.match(path) is not None)


def control_grpc(path: str) -> bool:
    """Whether a gRPC call to ``path`` (``/<service>/<method>``) is the control plane's."""
    return path in {f"/{GRPC_SERVICE}/{m}" for m in CONTROL_GRPC_METHODS}


__all__ = ["CONTROL_GRPC_METHODS", "CONTROL_HTTP_PATHS", "CONTROL_HTTP_PATTERN",
           "CONTROL_HTTP_PREFIXES", "GRPC_SERVICE", "control_grpc", "control_http"]
