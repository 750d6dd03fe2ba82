"""Residency on real Triton members, through both data planes: a miss loads its model
and is served (HTTP and gRPC), the budget is never exceeded, an eviction under load
loses no request, a failing load is answered clearly, free room fills with models
nobody asked for (and a miss takes it back), a restarted gateway preloads by the use it
recorded, and a data-plane replica holds its misses itself."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import yaml
from tritonclient.grpc import service_pb2, service_pb2_grpc

from converters.tiny import TINY_WIDTH, build_tiny_model
from infergate.processes import run_agent
from infergate.triton.local import LocalTriton, TritonEndpoints, free_ports
from tests.conftest import triton_settings
from tests.gateway.lifecycle.conftest import SteadyLoad, infer_body, stop
from tests.procs import end_in_background, run_gateway, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODELS = ("m0", "m1", "m2", "m3", "m4")
FOOTPRINT = 200_000_000  # configured per model: at least what a tiny model's stub takes
BUDGET = 450_000_000  # two models per member, not three
LOAD_WAIT = "infergate-load-wait-ms"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("residency") / "model_repo"
    for name in MODELS:
        build_tiny_model(repo, name)
    build_tiny_model(repo, "broken")
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not an ONNX model")
    return repo


@pytest.fixture(scope="module")
def members(repo: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[list[TritonEndpoints]]:
    """Two Tritons in explicit model control, nothing loaded."""
    servers = [LocalTriton(triton_settings(repo, tmp_path_factory.mktemp(f"t{i}")))
               for i in range(2)]
    try:
        yield [s.start() for s in servers]
    finally:
        end_in_background(*servers)


def ready_models(member: TritonEndpoints) -> set[str]:
    index = httpx.post(f"http://{member.http_url}/v2/repository/index", json={}).json()
    return {e["name"] for e in index if e.get("state") == "READY"}


def unload_all(members: list[TritonEndpoints]) -> None:
    for member in members:
        for model in ready_models(member):
            httpx.post(f"http://{member.http_url}/v2/repository/models/{model}/unload",
                       json={}, timeout=60)
    assert wait_until(lambda: not any(ready_models(m) for m in members), 30)


def config(path: Path, members: list[TritonEndpoints], **residency: Any) -> Path:
    models: dict[str, Any] = {m: {"on_demand": True, "footprint_bytes": FOOTPRINT}
                              for m in (*MODELS, "broken")}
    data = {"pools": [{
        "name": "shared",
        "members": [{"host": e.host, "http_port": e.http_port, "grpc_port": e.grpc_port,
                     "metrics_port": e.metrics_port} for e in members],
        # (these tests drive misses: the room stays empty until asked for, but in the
        # fill's own test)
        "residency": {"memory_budget_bytes": BUDGET, "min_resident_s": 0,
                      "rps_per_replica": 1000, "fill_free_room": False, **residency},
    }], "models": models}
    path.write_text(yaml.safe_dump(data))
    return path


def infer(url: str, model: str) -> httpx.Response:
    return httpx.post(f"{url}/v2/models/{model}/infer", json=infer_body(), timeout=60)


def grpc_infer(grpc_url: str, model: str) -> dict[str, str]:
    """One gRPC ModelInfer: its trailing metadata (it must answer 2x+1)."""
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, TINY_WIDTH])
    tensor.contents.fp32_contents.extend([1.0] * TINY_WIDTH)
    with grpc.insecure_channel(grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response, call = stub.ModelInfer.with_call(request, timeout=60)
    out = np.frombuffer(response.raw_output_contents[0], np.float32)
    assert out[0] == 3.0
    return dict(call.trailing_metadata() or ())


def residency(url: str) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(f"{url}/v1/residency").json()
    return answer


def within_budget(url: str, members: list[TritonEndpoints]) -> bool:
    """Neither the gateway's accounting nor Triton's own index exceeds two models."""
    report = residency(url)
    accounted = all(m["used_bytes"] <= m["usable_bytes"]
                    for p in report["pools"] for m in p["members"])
    return accounted and all(len(ready_models(m)) <= BUDGET // FOOTPRINT for m in members)


def test_misses_load_their_models_within_the_budget_on_both_protocols(
    repo: Path, members: list[TritonEndpoints], tmp_path: Path, data_plane: str
) -> None:
    unload_all(members)
    with run_gateway(config(tmp_path / "gw.yaml", members), tmp_path,
                     data_plane=data_plane) as gw:
        url = f"http://{gw.http_url}"
        first = infer(url, "m0")
        assert first.status_code == 200, first.text
        assert int(first.headers[LOAD_WAIT]) > 0  # it waited for the load
        again = infer(url, "m0")
        assert again.status_code == 200 and LOAD_WAIT not in again.headers  # a hit
        assert sum("m0" in ready_models(m) for m in members) == 1  # one replica: little use

        assert LOAD_WAIT in grpc_infer(gw.grpc_url, "m1")  # a miss over gRPC
        assert LOAD_WAIT not in grpc_infer(gw.grpc_url, "m1")

        # five models, room for four: misses evict the coldest, every request answered
        for model in MODELS:
            resp = infer(url, model)
            assert resp.status_code == 200, resp.text
            assert within_budget(url, members)
        report = residency(url)
        assert report["models"]["m0"]["footprint_source"] == "configured"
        metrics = httpx.get(f"{url}/metrics").text
        for model in MODELS:  # (with min_resident_s 0 the rounds may move them since)
            assert f'infergate_model_loads_total{{model="{model}",reason="miss"}}' in metrics
        assert "infergate_model_evictions_total" in metrics


def test_an_eviction_under_load_loses_no_request(
    repo: Path, members: list[TritonEndpoints], tmp_path: Path, data_plane: str
) -> None:
    unload_all(members)
    path = config(tmp_path / "gw.yaml", members)
    data = yaml.safe_load(path.read_text())
    data["models"]["m0"]["min_replicas"] = 2  # pinned on both members
    path.write_text(yaml.safe_dump(data))
    with run_gateway(path, tmp_path, data_plane=data_plane) as gw:
        url = f"http://{gw.http_url}"
        keys = [f"{m.host}:{m.grpc_port}" for m in members]
        assert sorted(residency(url)["models"]["m0"]["members"]) == sorted(keys)
        load = SteadyLoad(url, model="m0")
        thread = threading.Thread(target=load.run, daemon=True)
        thread.start()
        try:
            assert wait_until(lambda: len(load.answers) > 50, 30)
            evicted = httpx.post(f"{url}/v1/residency/m0/evict", json={"member": keys[0]},
                                 timeout=60)
            assert evicted.status_code == 200, evicted.text
            metrics = httpx.get(f"{url}/metrics").text
            assert 'infergate_model_evictions_total{model="m0",reason="operator"} 1.0' \
                in metrics  # drained and unloaded before the answer
            # its processes' exit waited for: Triton's Python backend sleeps a second
            # before it finalizes an instance
            timings = residency(url)["timings"]
            assert timings["evictions_measured"] == 1 and timings["eviction_s"] >= 1.0
            assert timings["load_s"] > 0 and timings["loads_measured"] == 1
            # pinned on both: the policy loads it back on the member it left
            assert wait_until(lambda: sorted(residency(url)["models"]["m0"]["members"])
                              == sorted(keys), 30)
            stop(load, answers=50)
        finally:
            load._stop.set()
            thread.join(timeout=30)
        assert load.failures == []
        metrics = httpx.get(f"{url}/metrics").text
        assert 'infergate_model_loads_total{model="m0",reason="pinned"} 3.0' in metrics


def test_a_failing_load_is_answered_clearly_and_disturbs_nothing(
    repo: Path, members: list[TritonEndpoints], tmp_path: Path, data_plane: str
) -> None:
    unload_all(members)
    with run_gateway(config(tmp_path / "gw.yaml", members), tmp_path,
                     data_plane=data_plane) as gw:
        url = f"http://{gw.http_url}"
        assert infer(url, "m0").status_code == 200
        resp = infer(url, "broken")
        assert resp.status_code == 503, resp.text
        message = resp.json()["error"]
        assert "'broken' could not be loaded" in message
        assert all(f"{m.host}:{m.grpc_port}" in message for m in members)  # tried both
        held = residency(url)["pools"][0]["members"]
        assert all(any(x["model"] == "broken" and x["state"] == "failed" for x in m["models"])
                   for m in held)
        again = infer(url, "m0")
        assert again.status_code == 200 and LOAD_WAIT not in again.headers
        unknown = infer(url, "no-such-model")
        assert unknown.status_code == 404, unknown.text
        # a client asks for metadata before it infers: a model held nowhere loads for it
        metadata = httpx.get(f"{url}/v2/models/m3", timeout=60)
        assert metadata.status_code == 200 and metadata.json()["name"] == "m3"
        assert residency(url)["models"]["m3"]["members"]


def test_free_room_fills_with_models_nobody_asked_for_and_a_miss_takes_it_back(
    repo: Path, members: list[TritonEndpoints], tmp_path: Path
) -> None:
    """With ``fill_free_room`` the members load models before anyone asks, leaving a
    miss the room of one model (here its probation share, 112 MB): one model each (the
    failing one tried first, by name, and left failed). A request for a filled model is
    a hit; once the members are full, a miss takes the room of the model filled and never
    used, however young, where every other model is protected (``min_resident_s`` and
    ``probation_min_s`` 60)."""
    unload_all(members)
    path = config(tmp_path / "gw.yaml", members, fill_free_room=True, min_resident_s=60,
                  probation_min_s=60)
    with run_gateway(path, tmp_path, data_plane="haproxy") as gw:
        url = f"http://{gw.http_url}"

        def filled() -> dict[str, str]:  # lent: loaded by the fill, not used since
            return {x["model"]: m["key"] for p in residency(url)["pools"]
                    for m in p["members"] for x in m["models"]
                    if x["lent"]}

        assert wait_until(lambda: len(filled()) == 2, 60)
        lent = filled()
        assert set(lent) == {"m0", "m1"} and len(set(lent.values())) == 2
        assert sorted(len(ready_models(m)) for m in members) == [1, 1]
        hit = infer(url, "m0")
        assert hit.status_code == 200 and LOAD_WAIT not in hit.headers  # ready before asked
        for model in ("m2", "m3"):  # misses into the room left: one on each member
            resp = infer(url, model)
            assert resp.status_code == 200 and LOAD_WAIT in resp.headers, resp.text
        # m0 was used (HAProxy's log says so): an ordinary model now
        assert wait_until(lambda: filled() == {"m1": lent["m1"]}, 10)
        resp = infer(url, "m4")  # the members are full: m1, never used, makes the room
        assert resp.status_code == 200 and LOAD_WAIT in resp.headers, resp.text
        assert residency(url)["models"]["m1"]["members"] == []
        assert within_budget(url, members)
        metrics = httpx.get(f"{url}/metrics").text
        for model in ("m0", "m1"):
            assert f'infergate_model_loads_total{{model="{model}",reason="fill"}} 1.0' \
                in metrics
        assert 'infergate_model_evictions_total{model="m1",reason="room"} 1.0' in metrics


def test_a_restarted_gateway_preloads_by_recorded_use(
    repo: Path, members: list[TritonEndpoints], tmp_path: Path
) -> None:
    unload_all(members)
    path = config(tmp_path / "gw.yaml", members, demand_file="demand.json")
    data = yaml.safe_load(path.read_text())
    data["models"]["m1"]["min_replicas"] = 2  # pinned: ready waits for it on both
    path.write_text(yaml.safe_dump(data))
    with run_gateway(path, tmp_path, data_plane="python") as gw:
        url = f"http://{gw.http_url}"
        for _ in range(20):
            assert infer(url, "m3").status_code == 200
        assert wait_until(lambda: residency(url)["models"]["m3"]["demand_rps"] > 0, 10)
    assert "m3" in (tmp_path / "demand.json").read_text()  # recorded at shutdown
    unload_all(members)  # the members restart empty as well
    with run_gateway(path, tmp_path, data_plane="python") as gw:
        url = f"http://{gw.http_url}"
        assert all("m1" in ready_models(m) for m in members)  # pinned: loaded before ready
        assert wait_until(lambda: residency(url)["models"]["m3"]["members"], 30)
        never_asked = residency(url)["models"]["m2"]
        assert never_asked["members"] == []  # no recorded use: not preloaded
        resp = infer(url, "m3")
        assert resp.status_code == 200 and LOAD_WAIT not in resp.headers  # preloaded: a hit


def test_the_waiting_room_is_bounded_by_its_size_and_the_request_deadline(
    repo: Path, members: list[TritonEndpoints], tmp_path: Path, data_plane: str
) -> None:
    unload_all(members)
    path = config(tmp_path / "gw.yaml", members, waiting_room={"max_requests": 1})
    with run_gateway(path, tmp_path, data_plane=data_plane) as gw:
        url = f"http://{gw.http_url}"
        late = httpx.post(f"{url}/v2/models/m2/infer", json=infer_body(),
                          headers={"X-Request-Timeout-Ms": "50"}, timeout=60)
        assert late.status_code == 503, late.text  # a load takes longer than 50 ms
        assert "is being loaded" in late.json()["error"]
        assert int(late.headers["retry-after"]) >= 1
        # gRPC alike: the gateway's answer, before the client's own deadline fires
        request = service_pb2.ModelInferRequest(model_name="m3")
        tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, TINY_WIDTH])
        tensor.contents.fp32_contents.extend([1.0] * TINY_WIDTH)
        with grpc.insecure_channel(gw.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.ModelInfer(request, timeout=0.5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()
        assert "is being loaded" in (refused.value.details() or "")

        answers: list[httpx.Response] = []

        def ask() -> None:
            answers.append(infer(url, "m4"))

        threads = [threading.Thread(target=ask) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        codes = sorted(a.status_code for a in answers)
        assert codes[0] == 200 and set(codes) <= {200, 503}, [a.text for a in answers]
        full = [a for a in answers if a.status_code == 503]
        assert full and all("waiting room" in a.json()["error"] for a in full)
        assert all("retry-after" in a.headers for a in full)


def test_a_replica_serves_misses_and_says_so_at_once_without_its_control_plane(
    repo: Path, members: list[TritonEndpoints], tmp_path: Path
) -> None:
    """The split layout (gateway/replica.py): a miss through a data-plane replica waits
    in the replica, the control plane loads, the replica's snapshot routes it. With the
    control plane killed, what is held is served and a miss is answered within a second
    saying why; restarted, misses are served again."""
    unload_all(members)
    path = config(tmp_path / "gw.yaml", members)
    http_port, grpc_port = free_ports(2)
    ports = (http_port, grpc_port)
    with run_gateway(path, tmp_path, data_plane="none", ports=ports) as control, \
            run_agent(control, tmp_path / "agent") as agent:
        url = f"http://{agent.http_url}"
        first = infer(url, "m0")
        assert first.status_code == 200, first.text
        assert LOAD_WAIT in first.headers  # held in the replica while it loaded
        assert LOAD_WAIT in grpc_infer(agent.grpc_url, "m1")

        control.proc.send_signal(signal.SIGKILL)
        control.proc.wait(10)
        assert infer(url, "m0").status_code == 200  # held: HAProxy routes it
        assert LOAD_WAIT not in grpc_infer(agent.grpc_url, "m1")
        started = time.monotonic()
        miss = infer(url, "m2")
        assert time.monotonic() - started < 1.0
        assert miss.status_code == 503 and "control plane" in miss.json()["error"], miss.text
        assert "retry-after" in miss.headers
        with pytest.raises(grpc.RpcError) as refused:
            grpc_infer(agent.grpc_url, "m3")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "control plane" in (refused.value.details() or "")

        with run_gateway(path, tmp_path, data_plane="none", ports=ports):
            again = infer(url, "m2")
            assert again.status_code == 200, again.text
            assert LOAD_WAIT in grpc_infer(agent.grpc_url, "m3")
