"""The control plane's parts beside the lifecycle: it probes, programs and answers off
the hot path.

- :mod:`.probes`: members' health, Triton queue depth and version, DNS membership (what
  :class:`gateway.state.GatewayState` learns each round);
- :mod:`.model_control` and :mod:`.fanout`: repository calls and settings sent to every
  member of a model; :mod:`.batching`: dynamic-batching settings from an SLO;
- :mod:`.lifecycle_http`, :mod:`.settings_http`: the HTTP views of the lifecycle and the
  settings (``/v1/...``);
- :mod:`.standby` and :mod:`.leader_proxy`: what a replica serves while another leads
  (the lifecycle's reads from the records) and passes to the leader (the rest).

The assembly is ``gateway/server.py`` (``serve``); HAProxy's side is ``gateway/haproxy``.
"""
