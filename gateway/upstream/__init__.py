"""Clients toward the Triton members: :mod:`.triton` (the one admin client: repository
load/unload, config, metadata, statistics, synthetic inference), :mod:`.http` and
:mod:`.grpc` (the Python data plane's forwarding pools)."""
