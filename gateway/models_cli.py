"""``infergate models ...``: the model lifecycle from a terminal, against a running gateway.

    infergate models upload NAME --model model.onnx --spec spec.json \\
        [--calibration calib.npz] [--evaluation eval.npz]     # then follows the job
    infergate models job JOB_ID                               # follow (or re-attach to) a job
    infergate models list | show NAME | rollback NAME [--version V] | delete NAME VERSION
    infergate models rollout status|pause|resume|abort NAME   # a progressive rollout
    infergate models status [NAME]                            # where models live (residency)
    infergate models hash-token                               # sha256 for a tokens file

The gateway is ``--url`` (``$INFERGATE_URL``, default http://127.0.0.1:8000); the token
is ``--token`` (``$INFERGATE_TOKEN``), sent as ``Authorization: Bearer``.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import io
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Annotated, Any, cast

import typer
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table

from gateway.lifecycle.client import TERMINAL, LifecycleClient, LifecycleError, model_as_one_file

app = typer.Typer(help="Upload, follow, roll back and delete model versions.",
                  no_args_is_help=True)
console = Console()
err_console = Console(stderr=True)

Url = Annotated[str, typer.Option(envvar="INFERGATE_URL", help="Gateway HTTP address.")]
Token = Annotated[str | None, typer.Option(envvar="INFERGATE_TOKEN", help="API token.",
                                           show_default=False)]
AsJson = Annotated[bool, typer.Option("--json", help="Print the raw JSON answer.")]
STEP_MARKS = {"done": "[green]✓[/]", "failed": "[red]✗[/]", "running": "[yellow]…[/]",
              "skipped": "[dim]-[/]"}


@contextlib.contextmanager
def _client(url: str, token: str | None) -> Iterator[LifecycleClient]:
    """The gateway's lifecycle API; a refusal is printed and ends the command (exit 2 for
    a 4xx, 1 for a 5xx)."""
    try:
        with LifecycleClient(url, token) as client:
            yield client
    except LifecycleError as err:
        err_console.print(f"[red]error {err.status}:[/] {err.message}")
        raise typer.Exit(2 if err.status < 500 else 1) from None


class _Counted:
    """A file whose reads advance a progress bar (httpx streams multipart files)."""

    def __init__(self, handle: IO[bytes], progress: Progress, task: Any) -> None:
        self.handle, self.progress, self.task = handle, progress, task

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        self.progress.advance(self.task, len(data))
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


@app.command()
def upload(
    name: Annotated[str, typer.Argument(help="Model name.")],
    model: Annotated[Path, typer.Option(exists=True, dir_okay=False,
                                        help="ONNX (.onnx), torch.export (.pt2) or "
                                             "TorchScript (.pt).")],
    spec: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="JSON spec.")],
    calibration: Annotated[Path | None, typer.Option(
        exists=True, dir_okay=False, help=".npz/.npy or archive (INT8 needs it).")] = None,
    evaluation: Annotated[Path | None, typer.Option(
        exists=True, dir_okay=False,
        help=".npz/.npy or archive (INT8 needs it; without it FP32/FP16 are verified on "
             "synthetic inputs).")] = None,
    follow: Annotated[bool, typer.Option(help="Follow the job until it ends.")] = True,
    url: Url = "http://127.0.0.1:8000",
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Upload a model version; the gateway converts, loads, warms and serves it."""
    parts = {"model": model, "calibration": calibration, "evaluation": evaluation}
    try:
        inlined = model_as_one_file(model)
    except ValueError as exc:
        err_console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    handles: dict[str, IO[bytes]] = {k: p.open("rb") for k, p in parts.items() if p is not None}
    sizes = {k: p.stat().st_size for k, p in parts.items() if p is not None}
    if inlined is not None:  # its weights kept beside it: sent as one file
        handles["model"].close()
        handles["model"], sizes["model"] = io.BytesIO(inlined), len(inlined)
    total = sum(sizes.values())
    try:
        with Progress("[progress.description]{task.description}", BarColumn(),
                      DownloadColumn(), TransferSpeedColumn(), console=err_console,
                      transient=True) as progress:
            task = progress.add_task(f"uploading {name}", total=total)
            files = {k: (p.name, cast(IO[bytes], _Counted(handles[k], progress, task)))
                     for k, p in parts.items() if p is not None}
            with _client(url, token) as client:
                job = client.upload(name, files["model"], spec.read_bytes(),
                                    evaluation=files.get("evaluation"),
                                    calibration=files.get("calibration"))
    finally:
        for handle in handles.values():
            handle.close()
    if not follow:
        console.print_json(data=job) if as_json else console.print(f"job {job['id']}")
        return
    _follow(job["id"], url, token, as_json)


@app.command("job")
def job_command(job_id: str, url: Url = "http://127.0.0.1:8000", token: Token = None,
                as_json: AsJson = False) -> None:
    """Follow a job (per-step progress) until it succeeds or fails."""
    _follow(job_id, url, token, as_json)


def _follow(job_id: str, url: str, token: str | None, as_json: bool,
            poll_s: float = 0.5) -> None:
    with _client(url, token) as client, Live(console=err_console, transient=as_json) as live:
        job = client.wait(job_id, TERMINAL, poll_s=poll_s,
                          seen=lambda job: live.update(_job_table(job)))
    if as_json:
        console.print_json(data=job)
    if job["state"] == "failed":
        err_console.print(f"[red]job {job_id} failed:[/] {job.get('error')}")
        raise typer.Exit(1)
    console.print(f"[green]{job['model']} version {job.get('version')} is serving[/]")


def _job_table(job: dict[str, Any]) -> Table:
    table = Table(title=f"{job['id']}  {job['model']}  [bold]{job['state']}[/]",
                  title_justify="left", show_edge=False)
    for column in ("", "step", "time", "detail"):
        table.add_column(column)
    now = time.time()
    for step in job.get("steps", []):
        took = (step.get("finished_at") or now) - step["started_at"]
        detail = step.get("detail") or ""
        if step.get("fraction") is not None and step["state"] == "running":
            detail = f"{step['fraction']:.0%} {detail}"
        table.add_row(STEP_MARKS.get(step["state"], step["state"]), step["name"],
                      f"{took:.1f} s", detail[:100])
    return table


@app.command("list")
def list_models(url: Url = "http://127.0.0.1:8000", token: Token = None,
                as_json: AsJson = False) -> None:
    """Models the gateway manages: serving version, state, versions kept."""
    with _client(url, token) as client:
        answer = client.models()
    if as_json:
        console.print_json(data=answer)
        return
    table = Table("model", "state", "serving", "previous", "versions", "pools")
    for m in answer["models"]:
        table.add_row(m["name"], m["state"], str(m["serving_version"] or "-"),
                      str(m["previous_version"] or "-"),
                      ", ".join(str(v["version"]) for v in m["versions"]
                                if v["state"] in ("available", "serving")),
                      ", ".join(m["pools"]) or "(config)")
    console.print(table)


@app.command()
def show(name: str, url: Url = "http://127.0.0.1:8000", token: Token = None,
         as_json: AsJson = False) -> None:
    """One model: versions with state, precision and report link; recent jobs."""
    with _client(url, token) as client:
        answer = client.model(name)
    if as_json:
        console.print_json(data=answer)
        return
    console.print(f"[bold]{answer['name']}[/]  {answer['state']}  serving "
                  f"{answer['serving_version']}  previous {answer['previous_version']}")
    table = Table("version", "state", "precision", "job", "report")
    for v in answer["versions"]:
        state = v["state"] + (f": {v['reason']}" if v.get("reason") else "")
        table.add_row(str(v["version"]), state, v["precision"] or "-", v["job"] or "-",
                      v["report"] or "-")
    console.print(table)


@app.command()
def rollback(name: str,
             version: Annotated[int | None, typer.Option(help="Default: previous.")] = None,
             url: Url = "http://127.0.0.1:8000", token: Token = None,
             as_json: AsJson = False) -> None:
    """Serve the previous (or a given) version again: loaded, warmed, then routed."""
    with _client(url, token) as client:
        answer = client.rollback(name, version)
    if as_json:
        console.print_json(data=answer)
        return
    console.print(f"[green]{name} serves version {answer['serving_version']}[/] "
                  f"(previous {answer['previous_version']})")


class RolloutCommand(enum.StrEnum):
    status = "status"
    pause = "pause"
    resume = "resume"
    abort = "abort"


@app.command()
def rollout(action: RolloutCommand, name: str, url: Url = "http://127.0.0.1:8000",
            token: Token = None, as_json: AsJson = False) -> None:
    """A model's progressive rollout: status (its steps and every verdict), pause, resume
    or abort (stable takes all traffic again). pause, resume and abort need admin scope."""
    with _client(url, token) as client:
        if action is RolloutCommand.status:
            answer = client.rollout(name)
        else:
            answer = client.rollout_action(name, action.value)
    if as_json:
        console.print_json(data=answer)
        return
    steps = answer["spec"]["steps"]
    console.print(f"[bold]{answer['model']}[/]  {answer['state']}  version "
                  f"{answer['candidate']} beside {answer['stable']}: step "
                  f"{answer['step'] + 1} of {len(steps)} {steps}, {answer['percent']}% to the "
                  f"candidate")
    if answer.get("detail"):
        console.print(answer["detail"])
    table = Table("step", "%", "decision", "candidate (n, err, p99 ms)", "stable", "agreement",
                  "reason")

    def window(w: dict[str, Any] | None) -> str:
        return "-" if not w else f"{w['requests']}, {w['error_rate']:.3f}, {w['p99_ms']}"

    for d in answer["decisions"]:
        agreement = d.get("agreement")
        table.add_row(str(d.get("step", "-")), str(d.get("percent", "-")), d["decision"],
                      window(d.get("candidate")), window(d.get("stable")),
                      "-" if agreement is None else f"{agreement:.3f}", d["reason"][:80])
    console.print(table)


# a holding's states, in the order a model's members are listed ("evicting": the old name)
STATE_STYLES = {"resident": "green", "warming": "cyan", "loading": "yellow",
                "queued": "yellow", "draining": "magenta", "unloading": "magenta",
                "evicting": "magenta", "failed": "red"}
STATE_ORDER = {state: rank for rank, state in enumerate(STATE_STYLES)}


def size_text(n: int | None) -> str:
    """Bytes in the largest binary unit that keeps the figure at least 1."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def for_text(seconds: float | None) -> str:
    """How long a holding has been in its state."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def ago_text(seconds: float | None) -> str:
    return "never" if seconds is None else f"{for_text(seconds)} ago"


def holdings(report: dict[str, Any], model: str,
             entry: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The model's holdings, one per member of its pool that holds it in any state:
    member, state, for_s, reason, waiting; resident first. The model's entry (``entry``,
    else the report's) has them as ``holdings``; a report without them, in its pools'
    members."""
    found = entry if entry is not None else report.get("models", {}).get(model, {})
    held = found.get("holdings")
    if held is None:
        held = [{"member": member["key"], **h}
                for pool in report.get("pools", []) for member in pool.get("members", [])
                for h in member.get("models", []) if h.get("model") == model]
    return sorted(held, key=lambda h: (STATE_ORDER.get(h.get("state", ""), len(STATE_ORDER)),
                                       h.get("member", "")))


def _where(held: list[dict[str, Any]]) -> str:
    if not held:
        return "[dim]held nowhere (loads on its next request)[/]"
    parts = []
    for h in held:
        style = STATE_STYLES.get(h["state"], "white")
        reason = f" ({h['reason']}{', not used yet' if h.get('lent') else ''})" \
            if h.get("reason") else ""
        waiting = f", {h['waiting']} waiting" if h.get("waiting") else ""
        parts.append(f"{h['member']} [{style}]{h['state']}[/] {for_text(h.get('for_s'))}"
                     f"{reason}{waiting}")
    return "\n".join(parts)


def _held_text(models: list[dict[str, Any]]) -> str:
    """A member's holdings counted by state: '1 resident, 2 queued (5 waiting)'."""
    counts: dict[str, int] = {}
    for h in models:
        counts[h.get("state", "?")] = counts.get(h.get("state", "?"), 0) + 1
    text = ", ".join(f"{n} {state}" for state, n in sorted(
        counts.items(), key=lambda c: STATE_ORDER.get(c[0], len(STATE_ORDER))))
    waiting = sum(int(h.get("waiting") or 0) for h in models)
    return (text or "none") + (f" ({waiting} waiting)" if waiting else "")


@app.command()
def status(name: Annotated[str | None, typer.Argument(
               help="One model (default: every model of the pools with residency).",
               show_default=False)] = None,
           url: Url = "http://127.0.0.1:8000", token: Token = None,
           as_json: AsJson = False) -> None:
    """Where models live in pools with residency: each model's state on each member
    holding it (queued, loading, warming, resident, draining, unloading, failed; for how
    long, why, requests waiting for that load), its footprint and where that figure
    comes from, how long its last load took, its demand, last use and requests waiting
    for it; each member's memory against its budget, its loads at once and what it holds;
    the models waiting for room, in the order room goes to them (urgent: its first
    request fails unless room is made now); and how long a load and an eviction
    typically take (what the waiting room expects)."""
    with _client(url, token) as client:
        entry = client.residency(name) if name is not None else None
        if as_json and entry is not None:
            console.print_json(data=entry)
            return
        report = client.residency()
    if as_json:
        console.print_json(data=report)
        return
    if not report.get("enabled", True):
        console.print("no pool of this gateway has residency (memory_budget_bytes): every "
                      "model is loaded on every member of its pools")
        return
    models = report.get("models", {})
    names = [name] if name is not None else sorted(models)
    table = Table("model", "pool", "where (member, state, for, why, waiting)", "footprint",
                  "demand", "last used", "waiting", title="models", title_justify="left")
    for model in names:
        m = entry if model == name and entry is not None else models[model]
        pinned = "pinned" if not m.get("on_demand") else f"min {m.get('min_replicas', 0)}"
        table.add_row(f"{model}\n[dim]{pinned}[/]", m.get("pool", "-"),
                      _where(holdings(report, model, m)),
                      f"{size_text(m.get('footprint_bytes'))}\n"
                      f"[dim]{m.get('footprint_source') or '-'}{_loaded_in(m)}[/]",
                      f"{m.get('demand_rps', 0.0):.2f} req/s",
                      ago_text(m.get("last_used_s_ago")), str(m.get("waiting", 0)))
    console.print(table)
    shown = {models[n]["pool"] for n in names if n in models} if name else None
    members = Table("pool", "member", "used", "usable", "budget", "loads at once", "holds",
                    title="members' memory", title_justify="left", caption_justify="left")
    waiting: list[str] = []
    for pool in report.get("pools", []):
        if shown is not None and pool["name"] not in shown:
            continue
        if pool.get("waiting"):
            waiting.append(f"pool {pool['name']}: {pool['waiting']} requests waiting for loads")
        room = [f"{f['model']} ({f['waiting']} waiting, {for_text(f.get('for_s'))}"
                + (", [red]urgent[/])" if f.get("urgent") else ")")
                for f in pool.get("waiting_for_room", [])]
        if room:
            waiting.append(f"waiting for room, in the order room goes to them: {', '.join(room)}")
        for member in pool.get("members", []):
            usable = member.get("usable_bytes", member.get("budget_bytes"))
            share = member["used_bytes"] / usable if usable else 0.0
            style = "red" if share > 1 else "yellow" if share > 0.9 else "green"
            down = "" if member.get("available", True) else " [red](unavailable)[/]"
            members.add_row(pool["name"], member["key"] + down,
                            f"[{style}]{size_text(member['used_bytes'])} ({share:.0%})[/]",
                            size_text(usable), size_text(member.get("budget_bytes")),
                            str(member.get("load_slots", "-")),
                            _held_text(member.get("models", [])))
    timings = _timings_text(report.get("timings") or {})
    members.caption = "; ".join([*waiting, *timings]) or None
    console.print(members)


def _loaded_in(model: dict[str, Any]) -> str:
    seconds = model.get("load_s")
    return "" if seconds is None else f", loads in {seconds:.2f} s"


def _timings_text(timings: dict[str, Any]) -> list[str]:
    """The typical load and eviction the waiting room expects, once measured."""
    out = []
    if timings.get("load_s") is not None:
        out.append(f"a load takes {timings['load_s']:.2f} s (the median of "
                   f"{timings.get('loads_measured', 0)} models' last)")
    if timings.get("eviction_s") is not None:
        out.append(f"an eviction {timings['eviction_s']:.2f} s from out of routing to its "
                   f"room free (the median of the last {timings.get('evictions_measured', 0)})")
    return out


@app.command()
def delete(name: str, version: int, url: Url = "http://127.0.0.1:8000",
           token: Token = None, as_json: AsJson = False) -> None:
    """Delete a version that is not serving."""
    with _client(url, token) as client:
        answer = client.delete(name, version)
    if as_json:
        console.print_json(data=answer)
        return
    console.print(f"deleted {name} version {version}")


@app.command("hash-token")
def hash_token() -> None:
    """Read a token on stdin; print its sha256 for the tokens file."""
    token = (typer.prompt("token", hide_input=True) if sys.stdin.isatty()
             else sys.stdin.readline()).strip()
    if not token:
        raise typer.BadParameter("no token on stdin")
    typer.echo(hashlib.sha256(token.encode()).hexdigest())
