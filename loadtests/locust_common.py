"""What every infergate locustfile shares: command-line options, the model mix, and the
SLO verdict written at the end of the run (locust's exit code is non-zero on violation).

Imported by the locustfiles; the listeners register once (module import is cached).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from locust import events
from locust.env import Environment
from locust.runners import WorkerRunner

from loadtests.slo import Slo, judge, summary_from_stats, write_verdict
from loadtests.workload import DEFAULT_MODEL, ModelMeta, ModelMix

log = logging.getLogger("infergate.loadtest")


@events.init_command_line_parser.add_listener
def _add_options(parser: Any) -> None:
    group = parser.add_argument_group("infergate")
    group.add_argument("--models", default=DEFAULT_MODEL,
                       help="model mix, name[:weight],... (default %(default)s)")
    group.add_argument("--batch-size", type=int, default=1, help="client batch size")
    group.add_argument("--grpc-host", default="127.0.0.1:8001",
                       help="gateway gRPC address for the gRPC locustfile")
    group.add_argument("--slo-p99-ms", type=float, default=1000.0, help="p99 latency SLO")
    group.add_argument("--slo-max-error-rate", type=float, default=0.01,
                       help="highest acceptable failed/total ratio")
    group.add_argument("--slo-min-requests", type=int, default=1,
                       help="a run with fewer requests fails")
    group.add_argument("--verdict-file", default="",
                       help="where to write the verdict JSON (default: <csv prefix>_verdict.json)")
    group.add_argument("--scenario-users", type=int, default=8, help="peak users")
    group.add_argument("--scenario-duration", type=float, default=60.0, help="seconds")
    group.add_argument("--scenario-spawn-rate", type=float, default=4.0, help="users/s")


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_: Any) -> None:
    options = environment.parsed_options
    mix = ModelMix.parse(options.models if options else DEFAULT_MODEL)
    environment.infergate_base_mix = mix  # type: ignore[attr-defined]
    environment.infergate_mix = mix  # type: ignore[attr-defined]


def current_mix(environment: Environment) -> ModelMix:
    return getattr(environment, "infergate_mix", None) or ModelMix.parse(DEFAULT_MODEL)


class MetadataUnavailable(Exception):
    """The gateway did not describe the model (already counted as a failed request)."""


def http_metadata(client: Any) -> Callable[[str], ModelMeta]:
    """Model metadata through the user's own HTTP client, so a failed lookup (unknown
    model, gateway down) is a failed request in the statistics, not a silent crash."""

    def fetch(model: str) -> ModelMeta:
        with client.get(f"/v2/models/{model}", name=f"metadata {model}",
                        catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")
                raise MetadataUnavailable(model)
            return ModelMeta.from_json(json.loads(resp.content))

    return fetch


@events.quitting.add_listener
def _on_quitting(environment: Environment, **_: Any) -> None:
    if isinstance(environment.runner, WorkerRunner) or environment.parsed_options is None:
        return
    options = environment.parsed_options
    slo = Slo(options.slo_p99_ms, options.slo_max_error_rate, options.slo_min_requests)
    verdict = judge(summary_from_stats(environment.stats.total), slo)
    target = options.verdict_file or (f"{options.csv_prefix}_verdict.json"
                                      if options.csv_prefix else "")
    if target:
        write_verdict(verdict, Path(target))
    print(verdict.markdown(), flush=True)
    environment.process_exit_code = 0 if verdict.passed else 1
