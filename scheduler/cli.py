"""``infergate schedule ...`` (or ``python -m scheduler``): plan, apply, simulate, serve.

Settings are built here, from the command line, and passed down; nothing is read from the
environment at import time.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from scheduler.apply import apply_plan, kubernetes_cluster, write_directory
from scheduler.changeover import ChangeoverSettings
from scheduler.errors import SchedulerError, exit_code
from scheduler.plan import PlanRecord
from scheduler.planner import plan_placement
from scheduler.render import layout_table, plan_png, plan_svg, pools_table
from scheduler.request import PlannerOptions, load_request

app = typer.Typer(
    help="MIG placement scheduler: slot-exact plans for Triton pools on MIG GPUs.",
    no_args_is_help=True,
)

FleetPath = Annotated[
    Path, typer.Option(exists=True, dir_okay=False, help="fleet.yaml (nodes, GPUs, layouts)")
]
PoolsPath = Annotated[
    Path, typer.Option(exists=True, dir_okay=False, help="pools.yaml (Triton pools)")
]
Solver = Annotated[str, typer.Option(help="auto, exact (CP-SAT) or heuristic")]
Objective = Annotated[
    str,
    typer.Option(
        help="auto (stability when the fleet already runs pools, else efficiency), "
        "efficiency or stability"
    ),
]


def _fail(error: SchedulerError) -> typer.Exit:
    console = Console(stderr=True)
    console.print(f"[red]error:[/red] {error.message}")
    for problem in getattr(error, "problems", ()):
        console.print(f"  {problem.where}: {problem.msg}")
    return typer.Exit(exit_code(error))


def _options(
    solver: str, objective: str, time_limit: float, seed: int, headroom: float
) -> PlannerOptions:
    return PlannerOptions.model_validate(
        {
            "solver": solver,
            "objective": objective,
            "time_limit_s": time_limit,
            "seed": seed,
            "headroom": headroom,
        }
    )


Residency = Annotated[
    str | None,
    typer.Option(
        help="The gateway's GET /v1/residency answer (a JSON file, or the gateway's URL "
        "with --token): pools with a working_set take their models' footprints and "
        "demand from it and are sized from what stays resident, not from every model."
    ),
]
GatewayToken = Annotated[
    str | None,
    typer.Option("--token", envvar="INFERGATE_TOKEN", help="Token for --residency URL.",
                 show_default=False),
]


def read_residency(source: str | None, token: str | None = None) -> dict[str, Any] | None:
    """A residency report from a file, or from ``GET {url}/v1/residency``."""
    if source is None:
        return None
    if source.startswith(("http://", "https://")):
        import httpx

        url = source.rstrip("/")
        url = url if url.endswith("/v1/residency") else f"{url}/v1/residency"
        headers = {"authorization": f"Bearer {token}"} if token else {}
        try:
            answer = httpx.get(url, headers=headers, timeout=30.0, trust_env=False)
        except httpx.HTTPError as exc:
            raise typer.BadParameter(f"{url}: {type(exc).__name__}: {exc}") from None
        if answer.status_code != 200:
            raise typer.BadParameter(f"{url} answered {answer.status_code}: {answer.text[:200]}")
        report = answer.json()
    else:
        path = Path(source)
        if not path.is_file():
            raise typer.BadParameter(f"no file {source}")
        report = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(report, dict) or not isinstance(report.get("models"), dict):
        raise typer.BadParameter(f"{source} is not a residency report (pools, models)")
    return report


def _make_record(
    fleet: Path, pools: Path, options: PlannerOptions, residency: dict[str, Any] | None = None
) -> PlanRecord:
    request = load_request(fleet, pools, options, residency)
    plan = plan_placement(request, rng=random.Random(options.seed))
    return PlanRecord(request=request, plan=plan)


def _console() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=200)


def _print_summary(console: Console, record: PlanRecord, used_only: bool) -> None:
    plan = record.plan
    console.print(layout_table(plan, used_only))
    console.print(pools_table(plan))
    m = plan.metrics
    console.print(
        f"{plan.solver} ({plan.solver_status}) in {plan.solve_seconds:.2f}s: "
        f"{m.gpus_used}/{m.gpus_total} GPUs used, fragmentation {m.fragmentation}, "
        f"{m.gpus_repartitioned} GPUs on {m.nodes_reconfigured} nodes rebuilt, "
        f"{m.instances_disrupted} instances disrupted ({m.instances_destroyed} destroyed), "
        f"{m.instances_moved} moved, {m.pools_unplaced} pools unplaced; objective {plan.objective}"
    )


@app.command("plan")
def plan_command(
    fleet: FleetPath,
    pools: PoolsPath,
    solver: Solver = "auto",
    objective: Objective = "auto",
    time_limit: Annotated[float, typer.Option(help="Seconds CP-SAT may use.")] = 10.0,
    seed: Annotated[int, typer.Option(help="Random seed (ties, restarts, CP-SAT).")] = 0,
    headroom: Annotated[float, typer.Option(help="Multiplier on every pool's target_rps.")] = 1.0,
    out: Annotated[Path | None, typer.Option(help="Write the plan record (JSON) here.")] = None,
    svg: Annotated[Path | None, typer.Option(help="Write the slot picture as SVG.")] = None,
    png: Annotated[Path | None, typer.Option(help="Write the slot picture as PNG.")] = None,
    manifests: Annotated[
        Path | None, typer.Option(help="Write manifests into this folder.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    used_only: Annotated[bool, typer.Option(help="Show only GPUs that hold pools.")] = False,
    residency: Residency = None,
    token: GatewayToken = None,
) -> None:
    """Plan MIG layouts and pool placement, print the picture, optionally write outputs."""
    report = read_residency(residency, token)
    try:
        record = _make_record(
            fleet, pools, _options(solver, objective, time_limit, seed, headroom), report
        )
        if manifests is not None:
            write_directory(record, manifests)
    except SchedulerError as e:
        raise _fail(e) from e
    if out is not None:
        out.write_text(record.model_dump_json(indent=2), encoding="utf-8")
    if svg is not None:
        svg.write_text(plan_svg(record.plan, used_only), encoding="utf-8")
    if png is not None:
        png.write_bytes(plan_png(record.plan, used_only))
    if as_json:
        typer.echo(record.plan.model_dump_json(indent=2))
    else:
        _print_summary(_console(), record, used_only)


@app.command("apply")
def apply_command(
    fleet: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="fleet.yaml")
    ] = None,
    pools: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="pools.yaml")
    ] = None,
    plan: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="A plan record.")
    ] = None,
    kubeconfig: Annotated[
        Path | None, typer.Option(exists=True, help="Apply to this cluster.")
    ] = None,
    context: Annotated[str | None, typer.Option(help="kubeconfig context.")] = None,
    out_dir: Annotated[Path, typer.Option(help="Without kubeconfig: write here.")] = Path(
        "scheduler-out"
    ),
    wait: Annotated[
        float, typer.Option(help="Seconds a node may take to report this change's MIG state.")
    ] = 900.0,
    solver: Solver = "auto",
    objective: Objective = "auto",
    time_limit: Annotated[float, typer.Option()] = 10.0,
    seed: Annotated[int, typer.Option()] = 0,
    residency: Residency = None,
    token: GatewayToken = None,
) -> None:
    """Apply a plan (--plan, or made from --fleet/--pools) to a cluster or a folder.

    With --kubeconfig: roll out node by node (drain, relabel, wait for this change's
    nvidia.com/mig.config.state, bring the pools up, restore routing). Without: manifest
    files in --out-dir/<plan id>/.
    """
    try:
        if plan is not None:
            record = PlanRecord.model_validate_json(plan.read_text(encoding="utf-8"))
        elif fleet is not None and pools is not None:
            options = _options(solver, objective, time_limit, seed, 1.0)
            record = _make_record(fleet, pools, options, read_residency(residency, token))
        else:
            raise typer.BadParameter("give --plan, or both --fleet and --pools")
        if kubeconfig is not None:
            settings = ChangeoverSettings(mig_timeout_s=wait)
            cluster = kubernetes_cluster(kubeconfig, context)
            done = apply_plan(record, cluster, changeover_settings=settings)
        else:
            done = write_directory(record, out_dir / record.plan.id)
    except SchedulerError as e:
        raise _fail(e) from e
    table = Table(title=f"applied {record.plan.id}")
    for column in ("kind", "name", "namespace", "where"):
        table.add_column(column)
    for o in done:
        table.add_row(o.kind, o.name, o.namespace or "", o.where)
    _console().print(table)


@app.command("simulate")
def simulate_command(
    gpus: Annotated[int, typer.Option(help="A100-80GB GPUs in the fleet.")] = 48,
    pools: Annotated[int, typer.Option(help="Pools (models).")] = 60,
    hours: Annotated[float, typer.Option(help="Hours of demand to replay.")] = 24.0,
    step_min: Annotated[float, typer.Option(help="Minutes per step.")] = 5.0,
    replan_min: Annotated[float, typer.Option(help="Minutes between re-plans.")] = 15.0,
    headroom: Annotated[float, typer.Option(help="Capacity over the forecast demand.")] = 1.15,
    load: Annotated[float, typer.Option(help="Mean load per pool, in 1g slices of work.")] = 1.2,
    seed: Annotated[int, typer.Option()] = 7,
    as_json: Annotated[bool, typer.Option("--json", help="Print rows as JSON.")] = False,
) -> None:
    """Replay a seeded diurnal trace with spikes under this planner and the baselines."""
    from scheduler.simulation.scenario import Scenario, run

    scenario = Scenario(gpus=gpus, pools=pools, hours=hours, step_min=step_min,
                        replan_min=replan_min, headroom=headroom, load=load, seed=seed)  # fmt: skip
    rows = [r.as_row() for r in run(scenario)]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(
        title=f"{hours:g} h, {pools} pools on {gpus} GPUs, re-plan every {replan_min:g} min"
    )
    for column in rows[0]:
        table.add_column(column)
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    _console().print(table)


@app.command("inventory")
def inventory_command(
    kubeconfig: Annotated[Path, typer.Option(exists=True, help="Cluster to read.")],
    context: Annotated[str | None, typer.Option()] = None,
    out: Annotated[
        Path | None, typer.Option(help="Write fleet.yaml here (default: stdout).")
    ] = None,
) -> None:
    """Read the fleet from GPU feature discovery labels and print it as fleet.yaml."""
    from scheduler.k8s_inventory import read_fleet

    try:
        fleet = read_fleet(kubeconfig, context)
    except SchedulerError as e:
        raise _fail(e) from e
    text = yaml.safe_dump(fleet.model_dump(mode="json", exclude_defaults=True), sort_keys=False)
    if out is None:
        typer.echo(text)
    else:
        out.write_text(text, encoding="utf-8")


@app.command("serve")
def serve_command(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8010,
    kubeconfig: Annotated[
        Path | None, typer.Option(exists=True, help="Apply to this cluster.")
    ] = None,
    context: Annotated[str | None, typer.Option()] = None,
    output_dir: Annotated[Path, typer.Option(help="Without kubeconfig: write here.")] = Path(
        "scheduler-out"
    ),
    log_level: Annotated[str, typer.Option()] = "info",
) -> None:
    """Run the HTTP service: POST /v1/plans, GET /v1/plans/ID, its /manifests, /apply."""
    import uvicorn

    from scheduler.service import ServiceSettings, create_app

    settings = ServiceSettings(kubeconfig=kubeconfig, kube_context=context, output_dir=output_dir)
    uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level)


def _profile_rows(name: str) -> list[dict[str, Any]]:
    from scheduler.profiles import PROFILES, gpu_type

    kind = gpu_type(name)
    return [
        {
            "id": pid,
            "name": kind.profile_name(pid),
            "memory_gib": kind.profile_memory_gib(pid),
            "compute": PROFILES[pid].compute_slices,
            "memory_slices": PROFILES[pid].memory_slices,
            "max": PROFILES[pid].max_per_gpu,
            "starts": ",".join(map(str, PROFILES[pid].start_slots)),
        }
        for pid in kind.profiles
    ]


@app.command("profiles")
def profiles_command(
    gpu_type: Annotated[str, typer.Argument(help="GPU type or alias.")] = "A100-80GB",
) -> None:
    """Show a GPU type's MIG profiles and their valid start slots."""
    try:
        rows = _profile_rows(gpu_type)
    except KeyError as e:
        raise typer.BadParameter(str(e.args[0])) from e
    if not rows:
        typer.echo(f"{gpu_type} is not MIG-capable: scheduled as a whole device")
        return
    table = Table(title=f"{gpu_type} MIG profiles")
    for column in rows[0]:
        table.add_column(column)
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    _console().print(table)
