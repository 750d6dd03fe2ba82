"""The residency benchmark's own parts that run without a member: answers checked
against the model's weights, the gRPC request, the load-wait mark in gRPC metadata, the
knobs, the defaults, the stub's model, the gateway's counters and view of a member, and
the models' sizes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from infergate.triton.local import TritonEndpoints
from loadtests import bench_residency as br
from loadtests import residency_models as rm

# -- the traffic: the load-wait mark, answers checked, the gRPC request ---------------

def test_metadata_wait_reads_the_mark_from_trailing_then_initial_metadata() -> None:
    trailing = (("content-type", "x"), ("infergate-load-wait-ms", "880"))
    assert br.metadata_wait(trailing, None) == 880.0
    assert br.metadata_wait(None, (("infergate-load-wait-ms", "7"),)) == 7.0
    assert br.metadata_wait((("other", "1"),), None) is None


def test_right_answer_checks_the_name_and_the_output_against_the_weights() -> None:
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(s).astype(np.float32) for s in ((4, 3), (3, 3), (3, 2))]
    x = rng.standard_normal((1, 4)).astype(np.float32)
    y = br.mlp_output(weights, x)
    assert y.shape == (1, 2)
    assert br.right_answer("m", "m", y.ravel(), y)
    assert not br.right_answer("m", "other", y.ravel(), y)
    assert not br.right_answer("m", "m", y.ravel() + 1, y)
    assert not br.right_answer("m", "m", None, y)
    assert br.right_answer("m", "m", None, None)  # no output known: the name only


def test_expected_outputs_run_the_models_weights(tmp_path: Path) -> None:
    (tmp_path / "a" / "1").mkdir(parents=True)
    rm.mlp_onnx(tmp_path / "a" / "1" / "model.onnx", 8, seed=1)
    x = br.input_of(rm.request_body())
    assert x.shape == (1, rm.INPUT_WIDTH)
    out = br.expected_outputs(tmp_path, ["a"], x)
    graph = onnx.load(str(tmp_path / "a" / "1" / "model.onnx")).graph
    w = [onnx.numpy_helper.to_array(i) for i in graph.initializer]
    assert out["a"].shape == (1, rm.OUTPUT_WIDTH)
    assert np.allclose(out["a"], br.mlp_output(w, x))


def test_grpc_request_carries_the_same_input_as_the_json_body() -> None:
    x = br.input_of(rm.request_body())
    request = br.grpc_request("m07", x)
    assert request.model_name == "m07"
    assert list(request.inputs[0].shape) == [1, rm.INPUT_WIDTH]
    assert request.inputs[0].datatype == "FP32"
    assert np.array_equal(np.frombuffer(request.raw_input_contents[0], np.float32), x[0])


# -- knobs, arms and members ----------------------------------------------------------

def test_settled_waits_for_no_pending_load_and_the_same_holdings_a_poll_later(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    def report(*held: tuple[str, str]) -> dict[str, Any]:
        return {"pools": [{"members": [{"key": "k", "models": [
            {"model": m, "state": state} for m, state in held]}]}]}

    both = (("a", "resident"), ("b", "resident"))
    answers = [report(("a", "loading")), report(("a", "resident")),
               report(("a", "resident"), ("b", "queued")), report(*both), report(*both),
               report()]
    polls: list[str] = []

    class Answer:
        def __init__(self, body: dict[str, Any]) -> None:
            self.body = body

        def json(self) -> dict[str, Any]:
            return self.body

    def get(url: str, timeout: float) -> Answer:
        polls.append(url)
        return Answer(answers[len(polls) - 1])

    monkeypatch.setattr(br.httpx, "get", get)
    monkeypatch.setattr(br.time, "sleep", lambda s: None)
    seconds, held = br.settled("http://gw")
    assert len(polls) == 5 and held == 2 and seconds >= 0
    assert polls[0] == "http://gw/v1/residency"


def test_parse_knob_reads_the_value_as_yaml() -> None:
    assert br.parse_knob("min_resident_s=10") == ("min_resident_s", 10)
    assert br.parse_knob("waiting_room={max_requests: 128}") == (
        "waiting_room", {"max_requests": 128})
    with pytest.raises(Exception, match="NAME=VALUE"):
        br.parse_knob("min_resident_s")


def test_the_default_run_is_all_resident_then_residency_at_half_and_quarter() -> None:
    assert br.DEFAULT_ARMS == ("all", "residency") and list(br.BUDGETS) == ["half", "quarter"]


def test_stub_model_reads_the_model_from_the_stubs_command_line() -> None:
    stub = ["/x/backends/python/triton_python_backend_stub", "/repo/m07_32mb/1/model.py",
            "triton_python_backend_shm_region_3", "1048576", "1048576", "4242", "/x/python",
            "54", "m07_32mb_0_0", "DEFAULT"]
    assert br.stub_model(stub) == "m07_32mb"
    assert br.stub_model(["/x/bin/tritonserver", "--model-repository=/repo"]) is None
    assert br.stub_model([]) is None


_MEMORY_PROBE = """
import json, mmap, os, sys
import numpy as np
from loadtests import bench_residency as br
before = br.private_and_anonymous(os.getpid())
block = np.ones(64 << 20, np.uint8)  # 64 MiB of anonymous pages, touched
grown = br.private_and_anonymous(os.getpid())
with open(sys.argv[1], "rb") as handle, \\
        mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
    pages = sum(mapped[i] for i in range(0, len(mapped), 4096))
    read = br.private_and_anonymous(os.getpid())
print(json.dumps({"before": before, "grown": grown, "read": read, "pages": pages}))
"""


def test_private_and_anonymous_memory_grow_with_an_allocation_and_a_mapped_file_is_private_only(
        tmp_path: Path) -> None:
    """Measured in a process of its own: a test worker's memory moves under it (another
    test's threads freeing theirs, pages reclaimed), by 7 MB once in a full suite."""
    import json
    import subprocess
    import sys

    (tmp_path / "weights").write_bytes(b"\1" * (32 << 20))
    out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, str(tmp_path / "weights")],
                         capture_output=True, text=True, timeout=120, check=True,
                         cwd=Path(br.__file__).resolve().parents[1])
    figures = json.loads(out.stdout)
    before, grown, read = figures["before"], figures["grown"], figures["read"]
    assert grown[0] - before[0] >= 60 << 20 and grown[1] - before[1] >= 60 << 20
    assert figures["pages"] == (32 << 20) // 4096
    # a file's pages mapped and read: private (this process alone maps them), not anonymous
    assert read[0] - grown[0] >= 30 << 20 and abs(read[1] - grown[1]) < 8 << 20


def test_counters_sum_loads_and_evictions_over_their_labels() -> None:
    text = "\n".join([
        "# TYPE infergate_model_loads counter",
        'infergate_model_loads_total{model="a",reason="miss"} 3',
        'infergate_model_loads_total{model="b",reason="plan"} 2',
        "# TYPE infergate_model_evictions counter",
        'infergate_model_evictions_total{model="a",reason="room"} 1', ""])
    assert br.counters(text) == {"loads": 5.0, "evictions": 1.0}
    assert br.counters("") == {"loads": 0.0, "evictions": 0.0}


def test_model_sizes_aim_at_their_weights_and_names_carry_the_size() -> None:
    names = rm.model_names()
    assert len(names) == 36 and len({n for n, _ in names}) == 36
    assert {size.label for _, size in names} == {"1MB", "32MB", "100MB"}
    assert names[0][0] == "m00_1mb" and names[-1][0] == "m35_100mb"
    assert rm.catalogue_name() == "14x1mb-12x32mb-10x100mb"
    assert br.MODELS.name == "models-14x1mb-12x32mb-10x100mb"
    for size in rm.SIZES:
        h = size.hidden
        assert 4 * h * (rm.INPUT_WIDTH + h + rm.OUTPUT_WIDTH) == pytest.approx(
            size.weight_bytes, rel=0.01)


def test_mlp_onnx_writes_the_weights_it_reports_and_seeds_differ(tmp_path: Path) -> None:
    a = rm.mlp_onnx(tmp_path / "a.onnx", 32, seed=1)
    rm.mlp_onnx(tmp_path / "b.onnx", 32, seed=2)
    assert a == 4 * 32 * (256 + 32 + 16)
    one, two = (onnx.load(str(tmp_path / f"{n}.onnx")) for n in "ab")
    assert [i.name for i in one.graph.input] == [rm.INPUT_NAME]
    assert sum(onnx.numpy_helper.to_array(w).nbytes for w in one.graph.initializer) == a
    assert not np.array_equal(onnx.numpy_helper.to_array(one.graph.initializer[0]),
                              onnx.numpy_helper.to_array(two.graph.initializer[0]))


def test_member_view_finds_the_member_by_its_grpc_or_http_address() -> None:
    member = TritonEndpoints("127.0.0.1", 8000, 8001, 8002)
    view = [{"key": "127.0.0.1:9001", "used_bytes": 1},
            {"key": "127.0.0.1:8001", "used_bytes": 2}]
    assert br.member_view(view, member) == view[1]
    assert br.member_view([{"key": "cpu/127.0.0.1:8000", "used_bytes": 3}], member) == {
        "key": "cpu/127.0.0.1:8000", "used_bytes": 3}
    assert br.member_view(view[:1], member) is None


