"""The control plane's leader killed under load, with a standby beside it (issue 37).

A cluster's shape on one machine: PostgreSQL (Debian's, a throwaway cluster), one Triton,
two control planes (``gateway serve --data-plane none``, the records in PostgreSQL: one
leads, the other is a standby that serves the lifecycle's reads and passes the rest to
the leader), a front for them that plays the Kubernetes Service (an HAProxy in TCP mode,
each new connection to the next replica whose ``/v1/replica`` answers 200, as
kube-proxy does with the endpoints that the readiness probe of
``k8s/base/control-plane.yaml`` keeps), and one data-plane replica (``gateway agent``)
following the control plane through that front.

Under way when the leader is killed (SIGKILL): unversioned inference of a model through
the replica, which is rolling a candidate out at its 50 % step; an upload of another
model converting; lifecycle API reads (``GET /v1/models``) through the front, a new
connection each (so they reach both replicas, as many clients of a Service do), and
through the standby's own port (one keep-alive connection: the follower's reads).
Measured: how long until the standby leads and until a call that needs the leader is
answered again through the front; inference and reads that failed; how the rollout and
the upload ended; the version numbers issued before and after.

    python -m loadtests.bench_failover [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from converters.tiny import TINY_WIDTH, build_tiny_model
from gateway.haproxy.process import find_haproxy
from gateway.lifecycle.client import TERMINAL, LifecycleClient
from gateway.lifecycle.records.backend import DATABASE_URL_ENV
from infergate.postgres import LocalPostgres, find_postgres_bin
from infergate.processes import FrontDoor, run_agent, run_gateway, wait_until
from infergate.triton.local import TritonEndpoints, free_ports
from loadtests.harness import gateway_yaml, reporter, table, triton
from loadtests.rollout_models import affine_onnx
from loadtests.uploads import TOKENS, evaluation_set, upload, wait_job

say = reporter("bench_failover")
CANARY, OTHER = "canary", "other"


def front_config(run: Path, http: int, grpc: int, planes: list[tuple[int, int]]) -> Path:
    """The Service: each new connection to the next control plane whose readiness
    answers 200 (no retry elsewhere: kube-proxy has none)."""
    lines = ["global", "  maxconn 1000", "defaults", "  mode tcp", "  balance roundrobin",
             "  timeout connect 1s", "  timeout client 120s", "  timeout server 120s",
             "frontend http", f"  bind 127.0.0.1:{http}", "  default_backend http",
             "frontend grpc", f"  bind 127.0.0.1:{grpc}", "  default_backend grpc"]
    for name in ("http", "grpc"):
        lines += [f"backend {name}", "  option httpchk GET /v1/replica",
                  "  http-check expect status 200"]
        for i, (h, g) in enumerate(planes):
            port = h if name == "http" else g
            lines.append(f"  server cp{i} 127.0.0.1:{port} check port {h} "
                         "inter 250ms fall 1 rise 1")
    path = run / "front.cfg"
    path.write_text("\n".join(lines) + "\n")
    return path


@contextlib.contextmanager
def front(run: Path, planes: list[tuple[int, int]]) -> Iterator[FrontDoor]:
    http, grpc = free_ports(2)
    binary = find_haproxy()
    assert binary is not None, "HAProxy is needed (make system-deps)"
    proc = subprocess.Popen([binary, "-db", "-f", str(front_config(run, http, grpc, planes))],
                            stdout=subprocess.DEVNULL, stderr=(run / "front.log").open("wb"))
    try:
        yield FrontDoor(proc, http, grpc)
    finally:
        proc.terminate()
        proc.wait(10)


class Calls(threading.Thread):
    """One kind of call back to back until stopped: (time, ok, what) of each."""

    def __init__(self, method: str, url: str, body: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None, reuse: bool = True) -> None:
        super().__init__(daemon=True)
        self.method, self.url, self.body, self.headers = method, url, body, headers or {}
        self.reuse = reuse  # False: a new connection for each call
        self.seen: list[tuple[float, bool, str]] = []
        self.slopes: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        limits = httpx.Limits() if self.reuse else httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(timeout=30, limits=limits) as client:
            while not self.stop.is_set():
                try:
                    answer = client.request(self.method, self.url, json=self.body,
                                            headers=self.headers)
                    ok = answer.status_code == 200
                    self.seen.append((time.monotonic(), ok, "" if ok else
                                      f"{answer.status_code} {answer.text[:120]}"))
                    if ok and self.body is not None:
                        self.slopes.append(float(answer.json()["outputs"][0]["data"][0]) - 1)
                except httpx.HTTPError as exc:
                    self.seen.append((time.monotonic(), False, repr(exc)[:120]))
                time.sleep(0.02)

    def after(self, t: float) -> tuple[int, int, str]:
        seen = [(ok, m) for at, ok, m in self.seen if at >= t]
        failed = [m for ok, m in seen if not ok]
        return len(seen) - len(failed), len(failed), failed[0] if failed else ""


def _status(url: str, headers: dict[str, str] | None = None,
            method: str = "GET") -> int | None:
    try:
        return httpx.request(method, url, headers=headers, timeout=2).status_code
    except httpx.HTTPError:
        return None


def _split(agent_dir: Path) -> Any:
    with contextlib.suppress(OSError, ValueError):
        routes = json.loads((agent_dir / "snapshot.json").read_text())["routes"]
        return next((r["split"] for r in routes if r["model"] == CANARY), None)
    return None


def measure(work: Path, endpoints: TritonEndpoints, repo: Path, db: str) -> list[list[object]]:
    os.environ[DATABASE_URL_ENV] = db  # (the processes started below inherit it)
    config = gateway_yaml(work / "gateway.yaml", {"cpu": [endpoints]}, lifecycle=repo,
                          tokens=TOKENS, models={CANARY: {"preload": True}})
    ports = free_ports(4)
    a, b = (ports[0], ports[1]), (ports[2], ports[3])
    for folder in ("a", "b"):
        (work / folder).mkdir()
    with run_gateway(config, work / "a", data_plane="none", ports=a) as leader, \
            run_gateway(config, work / "b", data_plane="none", ports=b, until="live") as standby, \
            front(work, [a, b]) as service, \
            run_agent(service, work / "agent", TOKENS["admin"]) as agent:  # type: ignore[arg-type]
        api = LifecycleClient(f"http://{service.http_url}", TOKENS["upload"], timeout=120)
        rollout = upload(api, CANARY, affine_onnx(work / "v2.onnx", 2.1),
                         {"steps": [50, 100], "step_seconds": 3600, "min_requests": 10,
                          "shadow": "none"}, evaluation_set(True))
        assert wait_until(lambda: _split(work / "agent") == [1, 2, 50], 240, 0.2), \
            api.job(rollout)
        body = {"inputs": [{"name": "x", "shape": [1, TINY_WIDTH], "datatype": "FP32",
                            "data": [1.0] * TINY_WIDTH}]}
        infer = Calls("POST", f"http://{agent.http_url}/v2/models/{CANARY}/infer", body)
        reader = {"authorization": f"Bearer {TOKENS['upload']}"}
        reads = Calls("GET", f"http://{service.http_url}/v1/models", headers=reader,
                      reuse=False)
        follower_reads = Calls("GET", f"http://{standby.http_url}/v1/models", headers=reader)
        infer.start()
        reads.start()
        follower_reads.start()
        converting = upload(api, OTHER, affine_onnx(work / "other.onnx", 3.0),
                            {"steps": [100]}, evaluation_set(True))
        # (jobs run one at a time: behind the rollout it may still be queued)
        assert wait_until(lambda: api.job(converting)["state"] != "receiving", 60, 0.1)
        state_at_kill = api.job(converting)["state"]
        leader.proc.kill()
        leader.proc.wait(10)
        killed = time.monotonic()
        leads = wait_until(lambda: _status(f"http://{standby.http_url}/v1/leader") == 200,
                           30, 0.05)
        led = time.monotonic() - killed
        # a call only a leader answers (404 from its catalog), through the Service
        serving = wait_until(lambda: _status(
            f"http://{service.http_url}/v1/models/nope/versions/1",
            {"authorization": f"Bearer {TOKENS['admin']}"}, "DELETE") == 404, 60, 0.05)
        served = time.monotonic() - killed
        time.sleep(5)  # more traffic through the replica, and reads, after the takeover
        for calls in (infer, reads, follower_reads):
            calls.stop.set()
        for calls in (infer, reads, follower_reads):
            calls.join(30)
        new = LifecycleClient(f"http://{service.http_url}", TOKENS["upload"], timeout=120)
        ended_rollout = new.job(rollout)
        ended_upload = wait_job(new, converting, TERMINAL)
        again = upload(new, CANARY, affine_onnx(work / "v3.onnx", 2.2),
                       {"steps": [100], "shadow": "none"}, evaluation_set(True))
        # its version number, once issued (the conversion's end)
        assert wait_until(lambda: new.job(again).get("version") is not None
                          or new.job(again)["state"] in TERMINAL, 300, 0.2)
        again_job = new.job(again)
        log_b = (work / "b" / f"gateway-{b[0]}.log").read_text()
    inf, rd, fr = infer.after(killed), reads.after(killed), follower_reads.after(killed)
    say(f"leader killed; the standby led after {led:.1f} s; a call that needs the leader "
        f"was answered after {served:.1f} s")
    return [
        ["standby leads (its /v1/leader answers 200)",
         f"{led:.1f} s" if leads else "not within 30 s"],
        ["a call that needs the leader answered again through the Service",
         f"{served:.1f} s" if serving else "not within 60 s"],
        ["inference through the replica after the kill, ok / failed",
         f"{inf[0]} / {inf[1]} {inf[2]}"],
        ["lifecycle reads through the Service (both replicas) after the kill, ok / failed",
         f"{rd[0]} / {rd[1]} {rd[2][:60]}"],
        ["lifecycle reads through the follower after the kill, ok / failed",
         f"{fr[0]} / {fr[1]} {fr[2][:60]}"],
        ["the rollout (at 50 %) ended", f"{ended_rollout['state']}: "
         f"{(ended_rollout.get('error') or '')[:80]}"],
        [f"the upload ({state_at_kill} at the kill) ended", f"{ended_upload['state']}: "
         f"{(ended_upload.get('error') or '')[:80]}"],
        ["versions of the canary: rolled out, uploaded after", f"{ended_rollout.get('version')}, "
         f"{again_job.get('version')} ({again_job['state']})"],
        ["the new leader's term", "2" if "leads, term 2" in log_b else "?"],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    bindir = find_postgres_bin()
    assert bindir is not None, "PostgreSQL is needed (make system-deps)"
    work = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    repo = work / "model_repo"
    build_tiny_model(repo, CANARY)
    postgres = LocalPostgres(bindir)
    postgres.start()
    try:
        with triton(repo, work) as endpoints:
            rows = measure(work, endpoints, repo, postgres.create_database("failover"))
    finally:
        postgres.stop()
    text = table(["what", "measured"], rows)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_failover.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
