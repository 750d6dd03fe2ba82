"""``infergate``: one command line for the whole platform.

- ``infergate up``: the local stack (``make run``): sample model, Triton, gateway, scheduler.
- ``infergate triton``: one Triton member of a pool (explicit model control), by hand.
- ``infergate gateway serve``: the gateway over pools declared in YAML.
- ``infergate schedule ...``: MIG placement (plan, apply, simulate, serve).
- ``infergate sample build``: export the EfficientNet-Lite0 sample into a model repository.
- ``infergate records copy``: the lifecycle's records from SQLite to PostgreSQL.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import typer

from gateway.cli import GRPC_REUSE_HELP
from gateway.cli import app as gateway_app
from gateway.models_cli import app as models_app
from gateway.upstream.triton_version import GrpcReuse
from infergate.records_cli import app as records_app
from infergate.triton.cli import triton_command

app = typer.Typer(
    help="infergate: a Triton inference gateway, model converter and MIG scheduler.",
    no_args_is_help=True,
)
app.add_typer(gateway_app, name="gateway")
app.add_typer(models_app, name="models")
app.add_typer(records_app, name="records")

sample_app = typer.Typer(
    help="The bundled sample model (EfficientNet-Lite0).", no_args_is_help=True
)
app.add_typer(sample_app, name="sample")


def _mount_optional(module: str, name: str) -> None:
    """Sub-commands whose package may be absent from a slimmed-down image."""
    try:
        sub = importlib.import_module(module).app
    except ImportError:
        return
    app.add_typer(sub, name=name)


_mount_optional("scheduler.cli", "schedule")
try:  # `infergate convert SOURCE ...` (the converter pipeline)
    from converters.cli import convert_command

    app.command("convert")(convert_command)
except ImportError:
    pass


@sample_app.command("build")
def sample_build(
    repo: Path = typer.Option(Path("model_repo"), help="Triton model repository."),
) -> None:
    """Export EfficientNet-Lite0 (real ImageNet weights) to ONNX and publish it (if absent)."""
    from converters.samples import build_sample_model

    written = build_sample_model(repo)
    if written is None:
        typer.echo(f"sample model already present in {repo}")
    else:
        typer.echo(f"wrote {written.path} version {written.version}")


@app.command()
def up(
    repo: Path = typer.Option(Path("model_repo"), help="Triton model repository."),
    runtime_env: Path = typer.Option(
        Path(".venv-triton"), help="Venv with nvidia-pytriton, onnxruntime, numpy<2."
    ),
    host: str = typer.Option("127.0.0.1", help="Address the gateway binds."),
    http_port: int = typer.Option(8000, help="Gateway HTTP port."),
    grpc_port: int = typer.Option(8001, help="Gateway gRPC port."),
    scheduler_port: int = typer.Option(8010, help="Scheduler service port (0 = off)."),
    model: list[str] = typer.Option([], help="Models to load (default: all in the repo)."),
    log_dir: Path = typer.Option(
        Path(".run"), help="The stack's working folder: Triton's log, the API tokens and "
                           "the lifecycle's job store (state/), HAProxy's files (haproxy/), "
                           "the example upload (example/) and the scheduler's output "
                           "(scheduler/)."),
    data_plane: str = typer.Option(
        "auto", help="Who carries inference: 'haproxy', 'python', or 'auto' (HAProxy when "
                     "installed, else Python, said at start-up)."),
    grpc_upstream_reuse: GrpcReuse = typer.Option(GrpcReuse.AUTO, help=GRPC_REUSE_HELP),
    tenants: Path | None = typer.Option(
        None, exists=True, dir_okay=False,
        help="Tenants and priority classes (YAML: default, tenants, refuse_at; "
             "docs/request-policy.md, 'Tenants and priorities: who is refused first'). "
             "Changed live by PUT /v1/tenants."),
) -> None:
    """Start Triton + gateway (HAProxy data plane + Python control plane) + scheduler
    locally and print where to point a client.

    Ctrl-C (or SIGTERM) stops everything; no Triton process is left behind.

    For development, all in one process: HAProxy ends with it however it
    ends, a crash included (`infergate gateway serve` keeps HAProxy serving
    through a crash and adopts it when started again).
    """
    from converters.repository import VersionConflict
    from gateway.config.tenancy import load_tenancy_file
    from infergate.stack import LocalStackSettings, run_local_stack

    try:
        tenancy = load_tenancy_file(tenants) if tenants is not None else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tenants") from exc

    try:
        run_local_stack(LocalStackSettings(
            repo=repo,
            runtime_env=runtime_env,
            host=host,
            http_port=http_port,
            grpc_port=grpc_port,
            scheduler_port=scheduler_port,
            models=tuple(model),
            log_dir=log_dir,
            data_plane=data_plane,
            grpc_upstream_reuse=grpc_upstream_reuse,
            tenants=tenancy,
        ))
    except VersionConflict as exc:  # another `infergate up` exported other files meanwhile
        typer.echo(f"[infergate] {exc}", err=True)
        raise typer.Exit(1) from None


# after `up`, in `infergate --help` too: a member of a pool, started by hand
app.command("triton")(triton_command)

if __name__ == "__main__":
    app()
