"""The Python data plane: the forwarder and its HTTP and gRPC front ends.

- :mod:`.forwarder`: :class:`~.forwarder.Forwarder`, transport-free: the request policy
  (``gateway/policy``) in its order, routing, retry, ejection, metrics;
- :mod:`.http_api` (inference and generate in front of the control plane's HTTP app; the
  infer fast path), :mod:`.fast_path` (what
  the ASGI fast paths share), :mod:`.generate` (generate / generate_stream),
  :mod:`.http_framing` (uvicorn's HTTP parser, bounded);
- :mod:`.grpc_api` (ModelInfer and ModelStreamInfer over the control plane's gRPC
  servicer), :mod:`.streams` (ModelStreamInfer relayed to one member).

Routing is :mod:`gateway.policy.routing`; the rest of the HTTP and gRPC surface is the
control plane's (:mod:`gateway.control.http_app`, :mod:`gateway.control.grpc_app`). Only
the assembler (``gateway/server.py``) imports this package (``tests/test_imports.py``).

With ``--data-plane python`` these carry every request. With HAProxy (the default) they
serve, in the control plane's process behind HAProxy, streams and generate.
"""
