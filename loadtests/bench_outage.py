"""What a client sees while the control plane is dead, per kind of call: the gateway's
control plane killed (SIGKILL) under load and started again with the same command.

Layouts (``--layout``, several allowed):

- ``serve``: ``gateway serve --data-plane haproxy`` on one node (HAProxy, the replica's
  own process and the control plane);
- ``split``: a cluster's shape on one machine: a control plane (``--data-plane none``)
  and one data-plane replica (``gateway agent``), the control plane killed;
- ``NAME=DIR``: ``serve`` from another checkout (``git worktree add DIR REV``): before
  and after a change, side by side in one run.

One Triton serves the tiny model and the decoupled ``stream`` model. For each layout, one
thread per kind of call loops for the whole run: unary HTTP and gRPC inference; a new
``ModelStreamInfer`` stream per call; one stream kept open, asked every 0.2 s; ``generate``;
a short ``generate_stream``; health (ready), model metadata over HTTP and gRPC; and a call
of the control plane's own (``GET /metrics``). Phases: ``--before`` seconds up, the
SIGKILL, ``--outage`` seconds dead, the restart (until it says it serves), ``--after``
seconds. The table gives each kind's successes and failures in the outage and after the
restart, and the first failure's message.

    python -m loadtests.bench_outage [--layout serve --layout split --layout before=DIR]
        [--before 3] [--outage 6] [--after 6] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from converters.decoupled import DECOUPLED_MODEL_NAME as STREAM
from converters.decoupled import build_decoupled_model
from converters.tiny import TINY_MODEL_NAME as TINY
from converters.tiny import TINY_WIDTH, build_tiny_model
from infergate.processes import FrontDoor, GatewayProcess, pools_yaml, run_agent, run_gateway
from infergate.triton.local import TritonEndpoints, free_ports
from loadtests.harness import reporter, table, triton

say = reporter("bench_outage")
KINDS = ("infer http", "infer grpc", "new stream", "open stream", "generate",
         "generate_stream", "health", "metadata http", "metadata grpc", "control call")


@dataclass
class Tally:
    """Per kind: (time, ok, message) of each call."""

    calls: dict[str, list[tuple[float, bool, str]]] = field(
        default_factory=lambda: {k: [] for k in KINDS})
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, kind: str, ok: bool, message: str = "") -> None:
        with self.lock:
            self.calls[kind].append((time.monotonic(), ok, message[:160]))

    def between(self, kind: str, start: float, end: float) -> tuple[int, int, str]:
        with self.lock:
            seen = [(ok, m) for t, ok, m in self.calls[kind] if start <= t < end]
        failed = [m for ok, m in seen if not ok]
        return len(seen) - len(failed), len(failed), failed[0] if failed else ""


def _stream_inputs(text: str, count: int, delay_ms: int = 0) -> list[Any]:
    inputs = []
    for name, value, datatype in (
            ("text_input", np.array([text.encode()], dtype=np.object_), "BYTES"),
            ("count", np.array([count], dtype=np.int32), "INT32"),
            ("delay_ms", np.array([delay_ms], dtype=np.int32), "INT32"),
            ("fail_at", np.array([-1], dtype=np.int32), "INT32")):
        tensor = grpcclient.InferInput(name, [1], datatype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


class Stream:
    """A ``ModelStreamInfer`` stream: ask, wait for the answers."""

    def __init__(self, url: str) -> None:
        self.answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=lambda result, error: self.answers.put(
            (result, error)))

    def ask(self, text: str) -> None:
        self.client.async_stream_infer(STREAM, _stream_inputs(text, 1))
        result, error = self.answers.get(timeout=10)
        if error is not None:
            raise RuntimeError(str(error))
        if result.as_numpy("text_output")[0].decode() != f"{text} 0":
            raise RuntimeError("wrong answer")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.stop_stream()
        self.client.close()


def _calls(door: FrontDoor) -> dict[str, Callable[[], None]]:
    base = f"http://{door.http_url}"
    http = httpclient.InferenceServerClient(door.http_url, network_timeout=10)
    grpc = grpcclient.InferenceServerClient(door.grpc_url)
    x = np.ones((1, TINY_WIDTH), np.float32)

    def infer(module: Any, client: Any) -> None:
        tensor = module.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        timeout = {"client_timeout": 10} if module is grpcclient else {}
        y = client.infer(TINY, [tensor], **timeout).as_numpy("y")
        if y is None or float(y[0][0]) != 3.0:
            raise RuntimeError("wrong answer")

    def new_stream() -> None:
        stream = Stream(door.grpc_url)
        try:
            stream.ask("n")
        finally:
            stream.close()

    def ok(resp: httpx.Response) -> None:
        if resp.status_code != 200:
            raise RuntimeError(f"{resp.status_code} {resp.text[:120]}")

    def generate_stream() -> None:
        with httpx.stream("POST", f"{base}/v2/models/{STREAM}/generate_stream", timeout=10,
                          json={"text_input": "g", "count": 3}) as resp:
            events = [e for e in resp.iter_lines() if e]
        if resp.status_code != 200 or len(events) != 3 or "error" in events[-1]:
            raise RuntimeError(f"{resp.status_code} {events[-1:]}")

    return {
        "infer http": lambda: infer(httpclient, http),
        "infer grpc": lambda: infer(grpcclient, grpc),
        "new stream": new_stream,
        "generate": lambda: ok(httpx.post(f"{base}/v2/models/{STREAM}/generate", timeout=10,
                                          json={"text_input": "g", "count": 1})),
        "generate_stream": generate_stream,
        "health": lambda: ok(httpx.get(f"{base}/v2/health/ready", timeout=10)),
        "metadata http": lambda: ok(httpx.get(f"{base}/v2/models/{TINY}", timeout=10)),
        "metadata grpc": lambda: None if grpc.get_model_metadata(
            TINY, client_timeout=10).name == TINY else None,
        # the control plane's own metrics (a call HAProxy sends it whatever is configured)
        "control call": lambda: ok(httpx.get(f"{base}/metrics", timeout=10)),
    }


class Load:
    """Every kind of call, each on a thread of its own, until stopped."""

    def __init__(self, door: FrontDoor) -> None:
        self.tally = Tally()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(k, c), daemon=True)
                        for k, c in _calls(door).items()]
        self.threads.append(threading.Thread(target=self._open_stream, args=(door,),
                                             daemon=True))

    def _loop(self, kind: str, call: Callable[[], None]) -> None:
        while not self.stop.is_set():
            try:
                call()
                self.tally.note(kind, True)
            except Exception as exc:  # noqa: BLE001 - every failure is counted
                self.tally.note(kind, False, f"{type(exc).__name__}: {exc}")
                time.sleep(0.05)
            time.sleep(0.05)

    def _open_stream(self, door: FrontDoor) -> None:
        """One stream for the whole run; broken: counted, and a new one opened."""
        stream = Stream(door.grpc_url)
        while not self.stop.is_set():
            try:
                stream.ask("o")
                self.tally.note("open stream", True)
            except Exception as exc:  # noqa: BLE001
                self.tally.note("open stream", False, f"{type(exc).__name__}: {exc}")
                stream.close()
                stream = Stream(door.grpc_url)
            time.sleep(0.2)
        stream.close()

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)


@contextlib.contextmanager
def _layout(kind: str, source: Path | None, endpoints: TritonEndpoints, work: Path
            ) -> Iterator[tuple[FrontDoor, Callable[[], GatewayProcess],
                                Callable[[], contextlib.AbstractContextManager[Any]]]]:
    """(the front door, crash the control plane, start it again)."""
    pools = pools_yaml(work / "pools.yaml", {"local": [endpoints]})
    http_port, grpc_port = free_ports(2)
    ports = (http_port, grpc_port)
    plane = "none" if kind == "split" else "haproxy"
    with run_gateway(pools, work, data_plane=plane, ports=ports, source=source) as control:
        def crash() -> GatewayProcess:
            control.proc.send_signal(signal.SIGKILL)
            control.proc.wait(10)
            return control

        def again() -> contextlib.AbstractContextManager[Any]:
            return run_gateway(pools, work, data_plane=plane, ports=ports, source=source)

        if kind == "split":
            with run_agent(control, work / "agent", None, source) as agent:
                yield agent, crash, again
        else:
            yield control, crash, again


def measure(name: str, kind: str, source: Path | None, endpoints: TritonEndpoints,
            work: Path, args: argparse.Namespace) -> list[list[object]]:
    work.mkdir(parents=True)
    with _layout(kind, source, endpoints, work) as (door, crash, again), Load(door) as load:
        time.sleep(args.before)
        crash()
        killed = time.monotonic()
        time.sleep(args.outage)
        restarted = time.monotonic()
        with again():
            up = time.monotonic()
            time.sleep(args.after)
            end = time.monotonic()
    say(f"{name}: outage {restarted - killed:.1f} s, restart {up - restarted:.1f} s")
    rows: list[list[object]] = []
    for call in KINDS:
        dead, after = load.tally.between(call, killed, up), load.tally.between(call, up, end)
        rows.append([name, call, f"{dead[0]} / {dead[1]}", f"{after[0]} / {after[1]}",
                     (dead[2] or after[2])[:90]])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layout", action="append",
                        help="serve, split, or NAME=DIR (serve from another checkout)")
    parser.add_argument("--before", type=float, default=3.0)
    parser.add_argument("--outage", type=float, default=6.0)
    parser.add_argument("--after", type=float, default=6.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    layouts = args.layout or ["serve", "split"]
    work = Path(tempfile.mkdtemp(prefix="bench-outage-"))
    repo = work / "model_repo"
    build_tiny_model(repo)
    build_decoupled_model(repo)
    rows: list[list[object]] = []
    with triton(repo, work, (TINY, STREAM)) as endpoints:
        for spec in layouts:
            name, _, folder = spec.partition("=")
            kind = "serve" if folder else name
            rows += measure(name, kind, Path(folder) if folder else None, endpoints,
                            work / name, args)
    text = table(["layout", "call", "outage ok / failed", "after restart ok / failed",
                  "first failure"], rows)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_outage.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
