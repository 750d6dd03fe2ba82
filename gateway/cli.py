"""``infergate gateway ...``: run the gateway over pools declared in a YAML file."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from gateway.auth import TOKENS_ENV, TokenConfigError, TokenTable, load_token_entries
from gateway.config import GatewayConfig, load_gateway_config
from gateway.config.tenancy import load_tenancy_file
from gateway.haproxy.snapshot import LEASE_S, LEASE_STEP_S, parse_tune
from gateway.server import GatewaySettings, choose_data_plane, serve
from gateway.upstream.triton_version import GrpcReuse

app = typer.Typer(help="The KServe v2 / Triton-compatible gateway.", no_args_is_help=True)
GRPC_REUSE_HELP = (
    "How gRPC requests reach each Triton member: 'auto' shares HTTP/2 connections with "
    "members that report Triton 2.57.0 or later (GET /v2) and sends one request per "
    "connection to older ones, whose cancellation race (server#8034) a broken request "
    "on a shared connection can trigger; 'shared' or 'per-request' override that for "
    "every member. Sharing is about twice the throughput on small requests.")


HAPROXY_TUNE_HELP = (
    "An HAProxy global tune.* setting, KEY=VALUE (repeatable; default: HAProxy's own). "
    "For large tensors: tune.bufsize=65536 and tune.h2.initial-window-size=1048576 "
    "(measured in docs/haproxy.md, 'HTTP/2 windows and buffers').")


def _tune(values: list[str]) -> tuple[tuple[str, str], ...]:
    try:
        return tuple(parse_tune(v) for v in values)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--haproxy-tune") from exc


TENANTS_HELP = ("Tenants and priority classes (YAML: default, tenants, refuse_at; "
                "docs/request-policy.md, 'Tenants and priorities: who is refused first'); "
                "overrides the config's tenancy section. Changed live by PUT /v1/tenants.")


def with_tenants(config: GatewayConfig, path: Path) -> GatewayConfig:
    """``config`` with the tenancy document of ``path``; BadParameter naming the field."""
    try:
        return config.model_copy(update={"tenancy": load_tenancy_file(path)})
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tenants") from exc


@app.callback()
def _group() -> None:
    """The KServe v2 / Triton-compatible gateway."""


@app.command("serve")
def serve_command(
    pools: Annotated[Path, typer.Option(
        exists=True, dir_okay=False,
        help="YAML: pools (members or DNS), optional model policies and rate limits.",
    )],
    host: str = typer.Option("127.0.0.1", help="Address to bind (0.0.0.0 in a container)."),
    http_port: int = typer.Option(8000, help="HTTP (KServe v2 REST) port."),
    grpc_port: int = typer.Option(8001, help="gRPC (inference.GRPCInferenceService) port."),
    probe_interval: float = typer.Option(1.0, help="Seconds between member health probes."),
    drain_timeout: float = typer.Option(
        10.0, help="Seconds to finish in-flight on SIGTERM/SIGINT; then open streams end "
                   "with a retryable error (UNAVAILABLE) and the process exits within a "
                   "few seconds."),
    log_level: str = typer.Option("warning", help="Log level."),
    event_loop: str = typer.Option("uvloop", help="Event loop: uvloop or asyncio."),
    data_plane: str = typer.Option(
        "auto", help="Who carries inference requests: 'haproxy' (native: HAProxy, with the "
        "replica's Python forwarder in a process of its own for streams, generate, misses, "
        "health and metadata; this process runs the control plane), 'python' (this "
        "process), 'none' (this process is the control plane alone: a cluster's, whose "
        "data-plane replicas are `gateway agent`s), or 'auto' (haproxy when installed)."),
    max_request_bytes: int = typer.Option(
        256 * 1024 * 1024, min=1024,
        help="Largest inference request body (HTTP) or message (gRPC); larger ones are "
             "answered 413 / RESOURCE_EXHAUSTED."),
    haproxy_run_dir: Annotated[Path | None, typer.Option(
        help="Folder for HAProxy's configuration, maps and sockets (default: one in the "
             "temporary folder named after --host and the ports, so that a restart finds "
             "the HAProxy a crash left running).")] = None,
    haproxy_external: bool = typer.Option(
        False, help="HAProxy runs elsewhere on --haproxy-run-dir (its own container): "
                    "write its files and reload it through its master socket."),
    replica_process: bool = typer.Option(
        True, help="With the HAProxy data plane, run the data-plane replica (streams, "
                   "generate, misses, health, metadata) in a process of its own that "
                   "outlives a crash of this one (default); --no-replica-process: inside "
                   "this process, one process fewer (a crash then takes those calls with "
                   "it)."),
    grpc_upstream_reuse: GrpcReuse = typer.Option(GrpcReuse.AUTO, help=GRPC_REUSE_HELP),
    haproxy_tune: Annotated[list[str], typer.Option(help=HAPROXY_TUNE_HELP)] = [],  # noqa: B006
    tokens: Annotated[Path | None, typer.Option(
        exists=True, dir_okay=False,
        help=f"API tokens (YAML: name, scopes, sha256). Also read from ${TOKENS_ENV}; "
             "overrides auth.tokens_file of the config.",
    )] = None,
    tenants: Annotated[Path | None, typer.Option(
        exists=True, dir_okay=False, help=TENANTS_HELP)] = None,
    scheduler_url: Annotated[str | None, typer.Option(
        help="The placement scheduler's HTTP address (http://host:port): the console's "
             "'Pools and placement' page pictures its newest MIG plan.")] = None,
    advertise_address: Annotated[str | None, typer.Option(
        help="With the records in PostgreSQL (several control-plane replicas): HOST or "
             "HOST:PORT the other replicas reach this one's HTTP port at when it leads "
             "(its gRPC port: the same host, --grpc-port); a standby passes what it does "
             "not serve itself there. Default: --host and --http-port (in Kubernetes: "
             "the pod's IP).")] = None,
) -> None:
    """Serve HTTP and gRPC until SIGTERM/SIGINT, then drain and exit. The web console is
    at /ui on the HTTP port (sign in with an upload or admin token).

    With the HAProxy data plane, HAProxy and the data-plane replica (`gateway
    agent --no-haproxy`, its own process) outlive a crash of this process: they
    keep serving every call a client makes to infer on their last snapshot, and
    the same command started again adopts both (on --haproxy-run-dir, whose
    default is derived from the ports). SIGTERM/SIGINT stops them after the
    drain."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    settings = GatewaySettings(
        host=host,
        http_port=http_port,
        grpc_port=grpc_port,
        probe_interval_s=probe_interval,
        drain_timeout_s=drain_timeout,
        log_level=log_level,
        data_plane=choose_data_plane(data_plane),
        max_request_bytes=max_request_bytes,
        haproxy_run_dir=haproxy_run_dir,
        haproxy_external=haproxy_external,
        haproxy_detached=True,
        local_replica=replica_process,
        grpc_upstream_reuse=grpc_upstream_reuse,
        haproxy_tune=_tune(haproxy_tune),
        scheduler_url=scheduler_url,
        advertise_address=advertise_address,
    )
    config = load_gateway_config(pools)
    if tenants is not None:
        config = with_tenants(config, tenants)
    try:
        auth = TokenTable(load_token_entries(tokens or config.auth.tokens_file, os.environ),
                          predict_open=config.auth.predict == "open")
    except (TokenConfigError, OSError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--tokens") from exc
    with asyncio.Runner(loop_factory=_loop_factory(event_loop)) as runner:
        runner.run(serve(settings, config, auth=auth))


def _loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    if name == "asyncio":
        return None
    raise typer.BadParameter(f"unknown event loop {name!r} (uvloop or asyncio)")


@app.command("agent")
def agent_command(
    control_plane: str = typer.Option(
        ..., help="The control plane's HTTP address, host:port (its Service)."),
    control_grpc: str = typer.Option(..., help="The control plane's gRPC address, host:port."),
    state_dir: Path = typer.Option(
        Path("/run/infergate/agent"),
        help="Where the last snapshot and HAProxy's files are kept."),
    host: str = typer.Option("127.0.0.1", help="Address HAProxy binds (0.0.0.0 in a pod)."),
    http_port: int = typer.Option(8000, help="HTTP (KServe v2 REST) port."),
    grpc_port: int = typer.Option(8001, help="gRPC port."),
    status_port: int = typer.Option(9101, help="This replica's /metrics and /status."),
    max_request_bytes: int = typer.Option(256 * 1024 * 1024, min=1024,
                                          help="Largest inference request."),
    haproxy_external: bool = typer.Option(
        False, help="HAProxy runs in its own container on STATE_DIR/haproxy: write its "
                    "files and reload it through its master socket."),
    grpc_upstream_reuse: GrpcReuse = typer.Option(GrpcReuse.AUTO, help=GRPC_REUSE_HELP),
    haproxy_tune: Annotated[list[str], typer.Option(help=HAPROXY_TUNE_HELP)] = [],  # noqa: B006
    canary_lease: float = typer.Option(
        LEASE_S, min=LEASE_STEP_S + 1.0,
        help="Seconds without a rollout verdict from the control plane after which this "
             "replica sends the model's traffic to stable (more than the lease's "
             f"{LEASE_STEP_S:.0f} s publication step)."),
    drain_timeout: float = typer.Option(
        10.0, help="Seconds to finish in-flight on SIGTERM/SIGINT before the servers close."),
    haproxy: bool = typer.Option(
        True, help="Run HAProxy on --http-port/--grpc-port (a cluster's data-plane pod). "
                   "--no-haproxy: the replica's forwarder alone serves those ports, behind "
                   "an HAProxy the control plane programs (what `gateway serve "
                   "--data-plane haproxy` starts on one node)."),
    log_level: str = typer.Option("warning", help="Log level."),
) -> None:
    """One data-plane replica: HAProxy following the control plane's snapshots (and its
    last one on disk while the control plane is down), with its own Python forwarder for
    streams, generate, misses, health and metadata. Token: $INFERGATE_AGENT_TOKEN (admin
    scope) when the control plane has auth on."""
    from gateway.agent import AgentSettings, run_agent

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    settings = AgentSettings(
        control_http=control_plane, control_grpc=control_grpc, state_dir=state_dir,
        host=host, http_port=http_port, grpc_port=grpc_port, status_port=status_port,
        token=os.environ.get("INFERGATE_AGENT_TOKEN"), max_request_bytes=max_request_bytes,
        haproxy_external=haproxy_external, grpc_upstream_reuse=grpc_upstream_reuse,
        haproxy_tune=_tune(haproxy_tune), canary_lease_s=canary_lease,
        drain_timeout_s=drain_timeout, haproxy=haproxy,
    )
    asyncio.run(run_agent(settings))
