"""Triton's priority levels on HAProxy's plane (pure, no I/O): a request of a tenant's
class to a model whose dynamic batcher has levels carries its class's level to Triton
(:mod:`gateway.policy.triton_priority`), put into the body as it streams through by the
Lua filters :mod:`gateway.haproxy.lua_filters` names (``grpc_fields``,
``priority_http``).

- The frontend (:func:`frontend_rules`): ``txn.lvl``, the level of the request's
  ``model/class`` (``req.mk``, the model's bound's key) in map ``tprio``
  (:func:`gateway.haproxy.maps.route_maps`); not for a compressed or an empty HTTP body
  (a compressed gRPC message goes to the Python plane, which reads it whole).
- The backends a model's requests reach (a pool's, its queue's twins, a managed model's,
  the gRPC pin twins, whose filter is already there): :func:`backend_lines` declares the
  filter and raises the lengths it changes (``content-length``; over HTTP the JSON
  header's ``Inference-Header-Content-Length``) by what it adds. A backend with the
  filter does not retry on an empty response (a retry would send the request the filter
  already changed, as the pin twins'); a connection failure is still retried.

Rendered only while some model has levels and tenants give their classes as levels
(:func:`levels_on`): turning that on or off reloads HAProxy
(:func:`gateway.haproxy.changes.structure`); a model's levels changing after that is a
map change.
"""

from __future__ import annotations

from gateway.haproxy.lua_filters import GRPC_FIELDS_FILTER, PRIORITY_HTTP_FILTER
from gateway.haproxy.snapshot import Snapshot
from gateway.policy.triton_priority import HTTP_ADDED, grpc_entry

GRPC_ADDED = len(grpc_entry(1))
HEADER_LENGTH = "inference-header-content-length"
Rule = tuple[str, str]


def levels_on(snapshot: Snapshot) -> bool:
    """Whether some request may get a level: tenants with classes given as levels
    (``tenancy.triton_levels``), a model with levels."""
    t = snapshot.tenancy
    return t is not None and t.enabled and t.triton_levels and bool(snapshot.levels)


def frontend_rules(snapshot: Snapshot, http: bool) -> list[Rule]:
    if not levels_on(snapshot):
        return []
    # (HTTP: not a compressed body, nor an empty one: nothing to put a level in)
    plain = (" !{ req.hdr(content-encoding) -m found } !{ req.hdr_val(content-length) eq 0 }"
             if http else "")
    return [("set-var(txn.lvl) var(req.mk),map(MAPS/tprio.map)", f"has_class{plain}")]


def backend_lines(snapshot: Snapshot, proto: str, head: list[str]) -> list[str]:
    """A model backend's ``head`` (its settings before its servers; a pin twin's with
    its filter), with the level's filter and length rules."""
    if not levels_on(snapshot):
        return head
    lines = [line for line in head if "retry-on" not in line]
    leveled = "{ var(txn.lvl) -m found }"
    if proto == "grpc":
        fields = f"  filter lua.{GRPC_FIELDS_FILTER}"
        return [*lines, *([] if fields in lines else [fields]),
                "  http-request set-header content-length "
                f"%[req.hdr(content-length),add({GRPC_ADDED})] if {leveled} "
                "{ req.hdr(content-length) -m found }"]
    return [*lines, f"  filter lua.{PRIORITY_HTTP_FILTER}",
            *(f"  http-request set-header {name} %[req.hdr({name}),add({HTTP_ADDED})] "
              f"if {leveled} {{ req.hdr({name}) -m found }}"
              for name in (HEADER_LENGTH, "content-length"))]
