"""``infergate triton``: one Triton member of a pool, started by hand on a machine
without Kubernetes (a pool of several is this command once per member, on its own ports).

It runs the ``tritonserver`` of the runtime env (:class:`~infergate.triton.local.LocalTriton`)
with the flags of ``k8s/base/triton-pool.yaml`` that apply on CPU: explicit model control
(the gateway says what to load: docs/residency.md), strict readiness, exit on error, CPU
metrics. It stays in the foreground; Ctrl-C or SIGTERM stops Triton and its
Python-backend stubs, and the command returns once none is left.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import typer

from infergate.triton.local import (
    STUB_NICE,
    LocalTriton,
    TritonEndpoints,
    TritonSettings,
    TritonStartupError,
    free_port,
)

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_POLL_S = 0.5  # how often the foreground loop looks whether Triton is still there


class MemberStopped(Exception):
    """SIGINT or SIGTERM arrived: stop Triton and return."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def _stop_on_signals() -> Iterator[Callable[[], None]]:
    """SIGINT/SIGTERM raise :class:`MemberStopped` once, wherever the main thread is
    (start-up included: ``LocalTriton.start`` then stops what it started). Yields a
    function that ignores them from then on, so that a second Ctrl-C cannot cut the stop
    of Triton short and leave its stubs behind; the previous handlers come back after."""
    previous = {s: signal.getsignal(s) for s in _STOP_SIGNALS}

    def ignore() -> None:
        for s in _STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)

    def raise_stop(signum: int, frame: FrameType | None) -> None:
        ignore()
        raise MemberStopped(signum)

    for s in _STOP_SIGNALS:
        signal.signal(s, raise_stop)
    try:
        yield ignore
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def ready_lines(endpoints: TritonEndpoints, settings: TritonSettings) -> list[str]:
    loaded = (f"loaded: {', '.join(settings.models)}" if settings.models
              else "nothing loaded: the gateway loads what it places here")
    e = endpoints
    return [
        f"[infergate] Triton member ready (explicit model control, {loaded})",
        f"  HTTP     {e.http_url}",
        f"  gRPC     {e.grpc_url}",
        f"  metrics  {e.metrics_url}",
        f"  log      {settings.log_file}",
        "  as a pool member in the gateway's YAML:",
        f"    - {{host: {e.host}, http_port: {e.http_port}, grpc_port: {e.grpc_port}, "
        f"metrics_port: {e.metrics_port}}}",
        "Ctrl-C (or SIGTERM) stops it.",
    ]


def _say(line: str, *, error: bool = False) -> None:
    # flushed: a member run in the background writes its endpoints to a file at once
    print(line, file=sys.stderr if error else sys.stdout, flush=True)


def serve_member(settings: TritonSettings) -> int:
    """Start Triton, stay until a signal or until Triton ends by itself; always stop it.
    Returns the command's exit status: 0 when stopped by a signal, else 1."""
    triton = LocalTriton(settings)
    with _stop_on_signals() as ignore_signals:
        try:
            endpoints = triton.start()
            _say("\n".join(ready_lines(endpoints, settings)))
            while triton.running():
                time.sleep(_POLL_S)
            _say(f"[infergate] tritonserver exited by itself (log {settings.log_file}):\n"
                 f"{triton.log_tail()}", error=True)
            return 1
        except MemberStopped as stopped:
            _say(f"[infergate] {stopped}: stopping Triton")
            return 0
        except TritonStartupError as exc:
            _say(f"[infergate] {exc}", error=True)
            return 1
        finally:
            ignore_signals()
            triton.stop()
            _say("[infergate] Triton stopped, no process left")


def triton_command(
    repo: Path = typer.Option(Path("model_repo"), help="Triton model repository."),
    runtime_env: Path = typer.Option(
        Path(".venv-triton"), help="Venv with nvidia-pytriton, onnxruntime, numpy<2."),
    host: str = typer.Option("127.0.0.1", help="Address Triton binds (its three ports)."),
    http_port: int = typer.Option(8100, help="HTTP port (0: a free one)."),
    grpc_port: int = typer.Option(8101, help="gRPC port (0: a free one)."),
    metrics_port: int = typer.Option(8102, help="Prometheus metrics port (0: a free one)."),
    load: list[str] = typer.Option(
        [], "--load", metavar="MODEL",
        help="A model to load before reporting ready (repeatable; default none: in a pool "
             "with residency the gateway decides what each member holds)."),
    log_dir: Path | None = typer.Option(
        None, help="Folder of Triton's log, triton.log (default: .run/triton-HTTP_PORT)."),
    startup_timeout: float = typer.Option(
        180.0, min=1, help="Seconds to wait for Triton (and its --load models) to be ready."),
    stub_nice: int = typer.Option(
        STUB_NICE, min=0, max=19,
        help="How far below Triton each of our models' Python-backend stubs starts (its "
             "start and build; it serves at Triton's priority once built), where this "
             "process may raise it back (CAP_SYS_NICE); 0: at Triton's (docs/residency.md)."),
) -> None:
    """Start one Triton member of a pool and stay in the foreground.

    Triton runs in explicit model control (nothing loaded but --load; the gateway loads
    and unloads models through its repository API), with the flags of
    k8s/base/triton-pool.yaml that apply on CPU: --strict-readiness, --exit-on-error,
    --allow-cpu-metrics. It prints its endpoints and the member line for the gateway's
    YAML. Ctrl-C (or SIGTERM) stops Triton and its Python-backend stubs; no process is
    left behind. Start one per member, on ports of its own (docs/residency.md).
    """
    # free ports chosen here, so that the default log folder can be named after them
    http, grpc, metrics = (p or free_port(host) for p in (http_port, grpc_port, metrics_port))
    settings = TritonSettings(
        model_repository=repo,
        runtime_env=runtime_env,
        log_file=(log_dir or Path(".run") / f"triton-{http}") / "triton.log",
        models=tuple(load),
        host=host,
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        startup_timeout_s=startup_timeout,
        stub_nice=stub_nice,
    )
    loading = ", ".join(settings.models) or "nothing"
    _say(f"[infergate] starting Triton from {runtime_env} on {host} (HTTP {http}, "
         f"gRPC {grpc}, metrics {metrics}), repository {repo}, loading {loading}")
    raise typer.Exit(serve_member(settings))
