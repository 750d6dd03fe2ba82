"""The Lua HAProxy loads (shipped beside this module, written to the run directory,
``lua-load`` in ``global``: :func:`gateway.haproxy.render.lua_files`), and the filters it
registers, by the names a backend's ``filter lua.<name>`` uses:

- ``grpc_fields.lua``, ``grpc_fields``: appends a rollout's pinned ``model_version``
  (the gRPC pin twins, :func:`gateway.haproxy.backends.pin_backends`) and a class's
  Triton priority level (:mod:`gateway.haproxy.priority_rules`) to a gRPC message;
- ``priority_http.lua``, ``priority_http``: puts a class's Triton priority level into an
  HTTP request's JSON header (:mod:`gateway.haproxy.priority_rules`).
"""

GRPC_FIELDS_LUA, GRPC_FIELDS_FILTER = "grpc_fields.lua", "grpc_fields"
PRIORITY_HTTP_LUA, PRIORITY_HTTP_FILTER = "priority_http.lua", "priority_http"
LUA_FILES = (GRPC_FIELDS_LUA, PRIORITY_HTTP_LUA)
