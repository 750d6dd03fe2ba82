"""Snapshot -> HAProxy: everything a fresh HAProxy process needs, from its modules.

Pure functions, no I/O. :func:`render` composes three of them:
- :mod:`gateway.haproxy.config`: the configuration text (global, defaults, error
  sections, the frontends and their request rules, tables, backends);
- :mod:`gateway.haproxy.maps`: the map files' contents (routes and splits, limits,
  readiness, token and rate-key digests);
- :mod:`gateway.haproxy.answers`: what HAProxy answers itself (its error files and the
  ``http-request return`` lines the configuration's rules use);
- the Lua it loads, shipped beside this module (:mod:`gateway.haproxy.lua_filters`:
  ``grpc_fields.lua``, the filter that appends a rollout's pinned version and a class's
  Triton priority level to a gRPC message; ``priority_http.lua``, the filter that puts
  that level into an HTTP request's JSON header).
:mod:`gateway.haproxy.changes` gives the admin-socket commands that move a running
process from one snapshot to the next, or ``None`` when the change is structural
(pools, members, rate classes, default routes: :func:`gateway.haproxy.changes.structure`)
and needs a seamless reload.

The hot path, per request, inside HAProxy, in the request policy's order
(``gateway/policy``): body size; the request (the model's name, a well-formed deadline);
predict auth when gated; the rate limit per API key; the pool (a weighted split; none:
404); readiness; admission; then the pool's backend, least connections over members
weighted by their Triton queue depth, with health checks, ejection and one retry.
Each step is a rule of the configuration, explained step by step in
:mod:`gateway.haproxy.config`. Every answer HAProxy produces itself is built from
``gateway.errors``' one table.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import resources

from gateway.haproxy.answers import error_files
from gateway.haproxy.config import render_config
from gateway.haproxy.lua_filters import LUA_FILES
from gateway.haproxy.maps import route_maps
from gateway.haproxy.snapshot import Layout, Snapshot


@dataclass(frozen=True)
class Rendered:
    config: str
    maps: dict[str, dict[str, str]]  # map name -> key -> value
    error_files: dict[str, str]  # file name -> raw HTTP response
    # file name -> text, in the run directory: the Lua the configuration loads
    lua: dict[str, str] = field(default_factory=dict)


@functools.cache
def lua_files() -> dict[str, str]:
    """The Lua HAProxy loads (``lua-load``), shipped in this package
    (:mod:`gateway.haproxy.lua_filters`)."""
    package = resources.files(__package__)
    return {name: package.joinpath(name).read_text() for name in LUA_FILES}


def render(snapshot: Snapshot, layout: Layout) -> Rendered:
    return Rendered(render_config(snapshot, layout), route_maps(snapshot), error_files(),
                    lua_files())
