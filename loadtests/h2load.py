"""h2load, the C load generator the benchmarks drive: its command lines for gRPC
``ModelInfer`` and HTTP binary-tensor requests, running it (one or several at once), and
what it prints (the summary and the per-request ``--log-file``)."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from infergate.processes import stop_process

INFER = "/inference.GRPCInferenceService/ModelInfer"


@dataclass(frozen=True)
class H2loadSummary:
    seconds: float
    req_per_s: float
    started: int
    done: int
    succeeded: int
    failed: int
    errored: int
    timeout: int
    mean_us: float


_UNITS_US = {"us": 1.0, "ms": 1e3, "s": 1e6}


def duration_us(text: str) -> float:
    """h2load's '242us' / '6.13ms' / '1.02s' in microseconds."""
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text.strip())
    if match is None:
        raise ValueError(f"not an h2load duration: {text!r}")
    return float(match[1]) * _UNITS_US[match[2]]


def parse_h2load(stdout: str) -> H2loadSummary:
    finished = re.search(r"finished in ([\d.]+(?:us|ms|s)), ([\d.]+) req/s", stdout)
    counts = re.search(r"requests: \d+ total, (\d+) started, (\d+) done, (\d+) succeeded, "
                       r"(\d+) failed, (\d+) errored, (\d+) timeout", stdout)
    timing = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", stdout)
    if finished is None or counts is None or timing is None:
        raise ValueError(f"unexpected h2load output: {stdout[-800:]!r}")
    started, done, succeeded, failed, errored, timeout = (int(g) for g in counts.groups())
    return H2loadSummary(duration_us(finished[1]) / 1e6, float(finished[2]), started, done,
                         succeeded, failed, errored, timeout, duration_us(timing[3]))


def h2load_gist(stdout: str, stderr: str, most: int = 4) -> str:
    """What went wrong in a run, in h2load's words: its request counts and the first
    distinct lines that mention an error."""
    words = ("error", "fail", "reset", "refused", "timeout", "closed", "GOAWAY")
    lines = [ln.strip() for ln in (stderr + "\n" + stdout).splitlines()]
    counts = [ln for ln in lines if ln.startswith("requests:")]
    noted = [ln for ln in dict.fromkeys(lines) if ln and not ln.startswith("requests:")
             and any(w.lower() in ln.lower() for w in words)]
    return " | ".join([*counts[:1], *noted[:most]]) or "(h2load said nothing)"


def parse_log(log_text: str) -> list[tuple[int, float]]:
    """(HTTP status, us to the end of the response) per request of ``h2load --log-file``
    (columns: start us since the epoch, status, us to the end)."""
    rows = (line.split("\t") for line in log_text.splitlines() if line.strip())
    return [(int(cols[1]), float(cols[2])) for cols in rows]


def complete_log(text: str) -> list[tuple[int, float]]:
    """:func:`parse_log` over the lines h2load finished writing (an interrupted run may
    end mid-line)."""
    return parse_log(text[:text.rfind("\n") + 1])


def status_counts(log: Sequence[tuple[int, float]]) -> dict[int, int]:
    return dict(sorted(Counter(status for status, _ in log).items()))


def grpc_request_bytes(model: str, x: np.ndarray, input_name: str) -> bytes:
    """A serialised ``ModelInferRequest`` of one FP32 input, its tensor as raw contents."""
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name=input_name, datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.astype(np.float32).tobytes())
    return request.SerializeToString()


@dataclass(frozen=True)
class Workload:
    model: str
    grpc_file: Path
    http_file: Path
    http_header_length: int


def write_workload(folder: Path, model: str, x: np.ndarray, input_name: str,
                   output_name: str) -> Workload:
    body = grpc_request_bytes(model, x, input_name)
    grpc_file = folder / f"{model}.grpc"
    grpc_file.write_bytes(b"\x00" + len(body).to_bytes(4, "big") + body)  # gRPC framing
    header = json.dumps({
        "inputs": [{"name": input_name, "shape": list(x.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": output_name, "parameters": {"binary_data": True}}],
    }).encode()
    http_file = folder / f"{model}.bin"
    http_file.write_bytes(header + x.astype(np.float32).tobytes())
    return Workload(model, grpc_file, http_file, len(header))


def grpc_connections(in_flight: int, most: int = 4) -> int:
    """HTTP/2 connections for ``in_flight`` streams: the largest count up to ``most`` that
    divides them evenly, so that connections x streams is exactly ``in_flight``."""
    return max(c for c in range(1, min(most, in_flight) + 1) if in_flight % c == 0)


def h2load_command(work: Workload, protocol: str, target: Any,
                   in_flight: int, duration: str, log_file: Path | None,
                   headers: Sequence[str] = (), rps: float = 0.0) -> list[str]:
    """gRPC: HTTP/2, up to 4 connections with streams multiplexed; HTTP: one HTTP/1.1
    connection per request in flight (as Triton's HTTP clients do). ``headers``: extra
    'name: value' request headers (gRPC metadata too), e.g. an API key. ``rps`` > 0: open
    loop, that many requests per second in all (h2load's ``--rps`` is per connection:
    divided among them), ``in_flight`` then the most in flight at once."""
    cmd = ["h2load", "-D", duration]
    if log_file is not None:
        cmd += ["--log-file", str(log_file)]
    if rps > 0:
        connections = grpc_connections(in_flight) if protocol == "grpc" else in_flight
        cmd += ["--rps", f"{rps / connections:.3f}"]
    extra = [arg for header in headers for arg in ("-H", header)]
    if protocol == "grpc":
        clients = grpc_connections(in_flight)
        cmd += ["-c", str(clients), "-m", str(in_flight // clients), "-d", str(work.grpc_file),
                "-H", "content-type: application/grpc", "-H", "te: trailers", *extra,
                f"http://{target.grpc_url}{INFER}"]
    else:
        cmd += ["--h1", "-c", str(in_flight), "-d", str(work.http_file),
                "-H", f"Inference-Header-Content-Length: {work.http_header_length}",
                "-H", "Content-Type: application/octet-stream", *extra,
                f"http://{target.http_url}/v2/models/{work.model}/infer"]
    return cmd


# -- running it -----------------------------------------------------------------------

@dataclass(frozen=True)
class H2loadRun:
    """One h2load process, ended: what it printed and logged."""

    command: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    log: tuple[tuple[int, float], ...]  # --log-file: (HTTP status, us) per request
    cut_off: bool = False  # interrupted at its time limit (SIGINT: its summary printed)

    def summary(self) -> H2loadSummary:
        """Its summary; ValueError when it printed none."""
        return parse_h2load(self.stdout)

    def gist(self) -> str:
        return h2load_gist(self.stdout, self.stderr)

    def ok_us(self) -> list[float]:
        """Latencies of the 2xx answers (us)."""
        return [us for status, us in self.log if 200 <= status < 300]


def log_file_of(command: Sequence[str]) -> Path | None:
    return Path(command[command.index("--log-file") + 1]) if "--log-file" in command else None


def run_h2loads(commands: Sequence[Sequence[str]], limit_s: float) -> list[H2loadRun]:
    """The h2load ``commands`` started at once, each interrupted (SIGINT: it prints its
    summary) if still running ``limit_s`` after the start. Each ``--log-file`` is emptied
    first (h2load appends to it)."""
    logs = [log_file_of(cmd) for cmd in commands]
    for log in logs:
        if log is not None:
            log.unlink(missing_ok=True)
    with contextlib.ExitStack() as files:
        outputs = [(files.enter_context(tempfile.TemporaryFile()),
                    files.enter_context(tempfile.TemporaryFile())) for _ in commands]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for cmd, (out, err) in zip(commands, outputs, strict=True):
                procs.append(subprocess.Popen(list(cmd), stdout=out, stderr=err))
            ends = time.monotonic() + limit_s
            cut = []
            for proc in procs:
                try:
                    proc.wait(timeout=max(0.0, ends - time.monotonic()))
                    cut.append(False)
                except subprocess.TimeoutExpired:
                    stop_process(proc, 5, signal.SIGINT)
                    cut.append(True)
        finally:
            for proc in procs:  # an interrupted benchmark leaves none behind
                if proc.poll() is None:
                    stop_process(proc, 5)
        runs = []
        for cmd, proc, (out, err), log, was_cut in zip(commands, procs, outputs, logs, cut,
                                                       strict=True):
            out.seek(0)
            err.seek(0)
            runs.append(H2loadRun(
                tuple(cmd), proc.returncode, out.read().decode(errors="replace"),
                err.read().decode(errors="replace"),
                tuple(complete_log(log.read_text())) if log is not None and log.is_file()
                else (), was_cut))
    return runs


def run_h2load(command: Sequence[str], limit_s: float) -> H2loadRun:
    """One h2load run (:func:`run_h2loads`)."""
    return run_h2loads([command], limit_s)[0]
