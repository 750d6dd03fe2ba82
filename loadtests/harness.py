"""What every benchmark in loadtests/ shares: a stack (a local Triton, gateways in front of
it, a gateway's YAML), the Prometheus pages read and settled, the figures' arithmetic and
formatting, a Markdown table, a plot's figure and a benchmark's ``--out``.

h2load (its command lines, running it, what it prints) is :mod:`loadtests.h2load`; the
sample model's config variants and a closed-loop gRPC client for the Triton-only
benchmarks are :mod:`loadtests.benchkit`. A benchmark imports these, never another
benchmark.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from converters.model_dir import PYTHON_BACKEND_MODEL
from converters.samples import SAMPLE_MODEL_NAME, build_sample_model
from gateway.files import write_atomically
from infergate.processes import ROOT, GatewayProcess, pools_yaml, run_gateway
from infergate.triton.local import LocalTriton, TritonEndpoints, TritonSettings

RUNTIME_ENV = ROOT / ".venv-triton"
SAMPLE_REPO = ROOT / "model_repo"

T = TypeVar("T")
Row = TypeVar("Row")


def reporter(name: str) -> Callable[[str], None]:
    """A benchmark's progress lines: ``[name] line``, flushed at once."""
    def say(line: str) -> None:
        print(f"[{name}] {line}", flush=True)

    return say


# -- numbers --------------------------------------------------------------------------

def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def median(values: Iterable[float]) -> float:
    return float(statistics.median(values))


def finite_median(values: Iterable[float | None]) -> float | None:
    """Median of the values that were measured (None when none was)."""
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(kept) if kept else None


def spread(values: Iterable[float]) -> list[float] | None:
    """[lowest, highest] of the measured values (None when fewer than two)."""
    kept = [v for v in values if math.isfinite(v)]
    return [min(kept), max(kept)] if len(kept) > 1 else None


def num(value: float | None, spec: str) -> str:
    """``value`` formatted; 'n/a' when it was not measured (None, nan)."""
    return "n/a" if value is None or not math.isfinite(value) else format(value, spec)


def with_range(row: Mapping[str, Any], key: str, spec: str, unit: str = "") -> str:
    """``row[key]`` and, where the row has ``<key>_range``, (lowest..highest) after it."""
    text = num(row[key], spec) + unit
    low_high = row.get(f"{key}_range")
    return f"{text} ({num(low_high[0], spec)}..{num(low_high[1], spec)})" if low_high else text


def parse_source(spec: str) -> tuple[str, Path]:
    """'before=/tmp/before' -> ('before', Path('/tmp/before')), a checkout that exists."""
    name, sep, folder = spec.partition("=")
    source = Path(folder).expanduser().resolve()
    if not (name.strip() and sep and (source / "gateway" / "__main__.py").is_file()):
        raise ValueError(f"{spec!r}: expected NAME=DIR, DIR a checkout of this project")
    return name.strip(), source


# -- tables, plots, results -----------------------------------------------------------

def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table: the header, its rule, a line per row."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


@contextlib.contextmanager
def figure(path: Path, *grid: int, dpi: int = 110, **options: Any) -> Iterator[tuple[Any, Any]]:
    """(figure, axes) of ``plt.subplots(*grid, **options)`` drawn off screen (Agg); laid
    out and saved to ``path`` when the block ends, closed either way."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(*grid, **options)
    try:
        yield fig, axes
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)


def write_results(out: Path, name: str, rows: Sequence[Row], table: str,
                  plot: Callable[[Sequence[Row], Path], list[Path]]) -> list[Path]:
    """A benchmark's ``--out``: ``<name>.json`` (its rows), ``<name>.md`` (its table)
    and its plots; the plots' paths."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / f"{name}.md").write_text(table + "\n")
    return plot(rows, out)


def publish(rows: Sequence[Row], markdown: Callable[[Sequence[Row]], str],
            plot: Callable[[Sequence[Row], Path], list[Path]], out: Path | None, name: str,
            say: Callable[[str], None]) -> None:
    """A benchmark's end: its table printed and, with ``out``, its results written
    there (:func:`write_results`)."""
    text = markdown(rows)
    print(text)
    if out is not None:
        for path in write_results(out, name, rows, text, plot):
            say(f"wrote {path}")


# -- Prometheus pages -----------------------------------------------------------------

def page(url: str) -> str:
    """A Prometheus page (``/metrics``) as text."""
    return httpx.get(url, timeout=10).text


def metric_samples(text: str) -> Iterator[Sample]:
    """Every sample of a Prometheus page. (The parser names a counter's samples
    ``NAME_total`` even where the page says ``NAME``, as Triton's do.)"""
    for family in text_string_to_metric_families(text):
        yield from family.samples


def totals(text: str, name: str, by: str, **where: str) -> dict[str, float]:
    """The samples of ``name`` (or ``name_total``) whose labels are ``where``, summed
    over every other label by the value of label ``by`` ('?' where it has none)."""
    out: dict[str, float] = {}
    for s in metric_samples(text):
        if s.name in (name, f"{name}_total") and all(
                s.labels.get(k) == v for k, v in where.items()):
            key = s.labels.get(by, "?")
            out[key] = out.get(key, 0.0) + s.value
    return out


def total(text: str, name: str, **where: str) -> float:
    """:func:`totals` summed over every label."""
    return sum(totals(text, name, "", **where).values())


def settle(read: Callable[[], T], quiet_s: float, timeout_s: float, interval_s: float = 0.1,
           key: Callable[[T], object] = lambda r: r,
           busy: Callable[[T], bool] = lambda _: False) -> tuple[T, bool]:
    """``read()`` every ``interval_s`` until its ``key`` has not moved for ``quiet_s``
    and it is not ``busy`` (requests in flight): (that reading, True); at ``timeout_s``
    (the last reading, False). Counters arrive late: a request a client gave up on still
    finishes, and HAProxy's telemetry follows each answer by a little."""
    last, since = read(), time.monotonic()
    deadline = since + timeout_s
    while time.monotonic() < deadline:
        time.sleep(interval_s)
        now = read()
        if key(now) != key(last) or busy(now):
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return now, True
    return last, False


# -- the stack ------------------------------------------------------------------------

def sample_model_dir() -> Path:
    """The sample model in ./model_repo (exported there first if absent, as `make run`)."""
    build_sample_model(SAMPLE_REPO)
    return SAMPLE_REPO / SAMPLE_MODEL_NAME


def refresh_runtime(version_dir: Path) -> bool:
    """A model version's ``model.py`` replaced by the one the converter copies now
    (``converters.model_dir.PYTHON_BACKEND_MODEL``) where they differ: a benchmark
    measures today's runtime on a model converted once (a cached one, the sample in
    ./model_repo). Whether it was replaced."""
    served = version_dir / "model.py"
    today = PYTHON_BACKEND_MODEL.read_bytes()
    if not served.is_file() or served.read_bytes() == today:
        return False
    write_atomically(served, today)
    return True


def copy_model(source: Path, target: Path) -> Path:
    """A model directory copied to ``target`` (its caches left out), each version served
    with today's ``model.py`` (:func:`refresh_runtime`)."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    for version in target.iterdir():
        refresh_runtime(version)
    return target


def gateway_yaml(path: Path, pools: Mapping[str, Sequence[TritonEndpoints]], *,
                 capacity_per_member: int | None = None, lifecycle: Path | None = None,
                 tokens: Mapping[str, str] | None = None, **sections: Any) -> Path:
    """A gateway's YAML at ``path``: ``pools`` (name -> members), each with
    ``capacity_per_member`` when given; ``lifecycle``: a lifecycle section over that
    repository (its state beside the file); ``tokens``: scope -> token, in a tokens file
    beside it, inference open to all; ``sections``: any other top-level sections
    (``models``, ``tenancy``, ``queue_factor`` ...)."""
    extra = {} if capacity_per_member is None else {"capacity_per_member": capacity_per_member}
    members = {name: list(each) for name, each in pools.items()}
    data = yaml.safe_load(pools_yaml(path, members, **extra).read_text())
    if lifecycle is not None:
        data["lifecycle"] = {"repository": str(lifecycle), "state_dir": str(path.parent / "state")}
    if tokens is not None:
        tokens_file = path.parent / "tokens.yaml"
        tokens_file.write_text(yaml.safe_dump({"tokens": [
            {"name": scope, "scopes": [scope], "token": token}
            for scope, token in tokens.items()]}))
        data["auth"] = {"predict": "open", "tokens_file": str(tokens_file)}
    data.update(sections)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@contextlib.contextmanager
def triton(repo: Path, log_dir: Path, models: Sequence[str] = ()) -> Iterator[TritonEndpoints]:
    """A local Triton over ``repo`` with ``models`` loaded (none: explicit model
    control, nothing loaded), its log in ``log_dir``; stopped on exit."""
    server = LocalTriton(TritonSettings(model_repository=repo, runtime_env=RUNTIME_ENV,
                                        log_file=log_dir / "triton.log", models=tuple(models)))
    server.start()
    try:
        assert server.endpoints is not None
        yield server.endpoints
    finally:
        server.stop()


def last_words(log_tail: str) -> str:
    """The last line of a log tail that says something (not a box drawn around it)."""
    lines = [ln.strip(" │╭╮╰╯─|") for ln in log_tail.splitlines()]
    return next((ln for ln in reversed(lines) if any(c.isalnum() for c in ln)), "?")[:300]


def log_tail(log: Path | None, lines: int = 15) -> str:
    """The end of a gateway's log, indented, for a line saying why it failed."""
    if log is None or not log.is_file():
        return "(no gateway log)"
    tail = log.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join(f"    | {line}" for line in tail) or "    (gateway log empty)"


class GatewayFailed(RuntimeError):
    """A gateway did not start; the message is its last words."""


@contextlib.contextmanager
def gateway(config: Path, log_dir: Path, *args: str, data_plane: str | None = None,
            source: Path | None = None) -> Iterator[GatewayProcess]:
    """``gateway serve`` over ``config`` (extra ``args``), its log and HAProxy's files in
    ``log_dir``; ready when yielded, stopped on exit. One that does not start raises
    :class:`GatewayFailed`. ``source``: another checkout's gateway (default this one)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as started:
        try:
            gw = started.enter_context(run_gateway(config, log_dir, *args, data_plane=data_plane,
                                                  source=source))
        except RuntimeError as err:
            raise GatewayFailed(last_words(str(err))) from err
        yield gw


@dataclass(frozen=True)
class Stack:
    member: TritonEndpoints  # the one Triton
    gateway: GatewayProcess
    folder: Path  # the logs, the YAML, scratch files

    @property
    def url(self) -> str:
        return f"http://{self.gateway.http_url}"

    def metrics(self) -> str:
        """The gateway's Prometheus page."""
        return page(f"{self.url}/metrics")


def plain_pools(path: Path, member: TritonEndpoints) -> Path:
    """One pool, ``local``, of the one member."""
    return gateway_yaml(path, {"local": [member]})


@contextlib.contextmanager
def stack(folder: Path, repo: Path, models: Sequence[str] = (), *args: str,
          data_plane: str | None = None,
          config: Callable[[Path, TritonEndpoints], Path] = plain_pools) -> Iterator[Stack]:
    """A Triton over ``repo`` (:func:`triton`) and one gateway in front of it
    (:func:`gateway`, extra ``args``), its YAML written by ``config(path, member)``;
    everything under ``folder``."""
    with triton(repo, folder, models) as member:
        path = config(folder / "gateway.yaml", member)
        with gateway(path, folder / "gateway", *args, data_plane=data_plane) as gw:
            yield Stack(member, gw, folder)
