"""The Python data plane: the forwarder and its HTTP and gRPC front ends.

- :mod:`.dataplane`: :class:`~.dataplane.DataPlane`, transport-free: the request policy
  (``gateway/policy``) in its order, routing, retry, ejection, metrics;
- :mod:`.routing`: pool by weight, then power-of-two-choices on load (a pure function);
- :mod:`.http_api` (the KServe v2 REST app; its infer fast path), :mod:`.fast_path` (what
  the ASGI fast paths share), :mod:`.generate` (generate / generate_stream),
  :mod:`.http_framing` (uvicorn's HTTP parser, bounded);
- :mod:`.grpc_api` (Triton's gRPC service), :mod:`.streams` (ModelStreamInfer relayed to
  one member).

With ``--data-plane python`` these carry every request. With HAProxy (the default) they
serve, in the control plane's process behind HAProxy, what HAProxy passes on: everything
but inference, plus streams and generate.
"""
