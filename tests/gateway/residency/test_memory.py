"""What a member reports of the memory a loaded model takes: the Python-backend stubs of
a real tritonserver, attributed per model (the member asked through MemberAdmin), and
the GPU memory off a metrics page."""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import onnx
import psutil
import pytest
from onnx import TensorProto, helper

from converters.model_dir import (
    ModelArtifact,
    ModelDirectoryRequest,
    sha256_file,
    write_model_directory,
)
from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH, build_tiny_model, tiny_config
from gateway.config.pools import MemberSpec
from gateway.pools import PoolMember
from gateway.residency.memory import (
    RSS_MOVED_BYTES,
    SIZE_KEPT_S,
    Listeners,
    StubSizes,
    gpu_memory_used,
    is_loopback,
    listening_process,
    measured_footprints,
    measured_surges,
    released,
    stub_model,
)
from gateway.upstream.triton import MemberAdmin
from infergate.triton.local import LocalTriton, free_port
from tests.conftest import triton_settings
from tests.procs import started_triton

pytestmark = pytest.mark.integration

HEAVY = "heavy"
HEAVY_WEIGHTS = 4096 * 4096 * 4  # bytes of its one large matrix


def heavy_onnx(path: Path) -> Path:
    """FP32 ``[batch, 16] -> [batch, 16]`` through a 4096 x 4096 matrix (64 MiB)."""
    rng = np.random.default_rng(0)

    def weights(name: str, *shape: int) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array(
            (rng.standard_normal(shape) * 0.01).astype(np.float32), name)

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "up"], ["h"]),
         helper.make_node("MatMul", ["h", "square"], ["h2"]),
         helper.make_node("MatMul", ["h2", "down"], ["y"])],
        HEAVY,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", TINY_WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", TINY_WIDTH])],
        initializer=[weights("up", TINY_WIDTH, 4096), weights("square", 4096, 4096),
                     weights("down", 4096, TINY_WIDTH)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def build_heavy_model(repo: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = heavy_onnx(Path(tmp) / "model.onnx")
        write_model_directory(ModelDirectoryRequest(
            repo=repo, config=tiny_config(HEAVY),
            artifact=ModelArtifact({"model.onnx": path}, sha256_file(path))))


@pytest.fixture(scope="module")
def member(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolMember]:
    """A Triton holding ``tiny`` in two instances and ``heavy`` in one."""
    repo = tmp_path_factory.mktemp("memory") / "model_repo"
    build_tiny_model(repo, instance_count=2)
    build_heavy_model(repo)
    settings = triton_settings(repo, tmp_path_factory.mktemp("triton"), TINY_MODEL_NAME,
                               HEAVY)
    with started_triton(settings) as server:
        yield member_of(server)


def member_of(server: LocalTriton) -> PoolMember:
    assert server.endpoints is not None
    e = server.endpoints
    return PoolMember("p", MemberSpec(host=e.host, http_port=e.http_port,
                                      grpc_port=e.grpc_port, metrics_port=e.metrics_port))


async def test_measured_footprints_attributes_each_model_its_stubs_when_two_are_loaded(
        member: PoolMember, admin: MemberAdmin) -> None:
    footprints = await measured_footprints(member, admin, {TINY_MODEL_NAME, HEAVY, "absent"})
    assert set(footprints) == {TINY_MODEL_NAME, HEAVY}
    assert footprints[TINY_MODEL_NAME] > 0 and footprints[HEAVY] > 0
    # tiny's figure is two stubs' (instance_count 2), heavy's one stub's and its matrix
    one_tiny_stub = footprints[TINY_MODEL_NAME] / 2
    assert footprints[HEAVY] - one_tiny_stub >= 0.9 * HEAVY_WEIGHTS
    assert footprints[HEAVY] < one_tiny_stub + 3 * HEAVY_WEIGHTS


async def test_a_loads_surge_is_what_its_stubs_held_at_their_peak_beyond_now(
        member: PoolMember, admin: MemberAdmin) -> None:
    """ONNX Runtime builds the heavy model's session from its 64 MiB matrix and keeps one
    copy: the load held more for a moment than the model keeps."""
    surges = await measured_surges(member, {TINY_MODEL_NAME, HEAVY, "absent"})
    assert set(surges) == {TINY_MODEL_NAME, HEAVY}
    assert surges[HEAVY] >= 0.5 * HEAVY_WEIGHTS, surges
    assert surges[TINY_MODEL_NAME] < surges[HEAVY]
    remote = PoolMember("p", MemberSpec(host="10.0.0.1", http_port=1, grpc_port=2,
                                        metrics_port=3))
    assert await measured_surges(remote, {HEAVY}) == {}


async def test_the_members_server_is_found_by_one_scan_for_every_measure(
        member: PoolMember, admin: MemberAdmin) -> None:
    """A scan of the host's sockets is the costly part of a measure: the member's
    tritonserver, once found, is kept for every later one."""
    scans: list[int] = []

    def scan(port: int) -> psutil.Process | None:
        scans.append(port)
        return listening_process(port)

    listeners = Listeners(scan)
    first = await measured_footprints(member, admin, {TINY_MODEL_NAME, HEAVY},
                                      listener=listeners)
    again = await measured_footprints(member, admin, {TINY_MODEL_NAME, HEAVY},
                                      listener=listeners)
    surges = await measured_surges(member, {HEAVY}, listener=listeners)
    assert set(first) == set(again) == {TINY_MODEL_NAME, HEAVY} and HEAVY in surges
    assert scans == [member.spec.http_port]


async def test_each_stubs_size_is_read_once_while_its_resident_set_holds_still(
        member: PoolMember, admin: MemberAdmin) -> None:
    """Each round measures every resident model again: a stub that has not moved is not
    read again (its USS walks its page tables), and its figure is what a fresh read
    says."""
    reads: list[int] = []

    def uss(process: psutil.Process) -> int:
        reads.append(process.pid)
        return int(process.memory_full_info().uss)

    sizes = StubSizes(size=uss)
    first = await measured_footprints(member, admin, {TINY_MODEL_NAME, HEAVY}, sizes=sizes)
    again = await measured_footprints(member, admin, {TINY_MODEL_NAME, HEAVY}, sizes=sizes)
    fresh = await measured_footprints(member, admin, {TINY_MODEL_NAME, HEAVY})
    assert first == again and set(first) == {TINY_MODEL_NAME, HEAVY}
    assert len(reads) == len(set(reads)) == 3  # tiny's two stubs and heavy's, once each
    for model, size in fresh.items():
        assert abs(size - first[model]) < RSS_MOVED_BYTES


def test_a_listener_is_kept_while_it_runs_and_found_again_once_it_ends() -> None:
    """Per port; a process that ended (a member restarted: another process on its port)
    is looked for again, and so is a port nobody listens on."""
    first, second = (subprocess.Popen(["sleep", "60"]) for _ in range(2))
    listening: dict[int, int | None] = {8000: first.pid, 8001: first.pid, 8002: None}
    scans: list[int] = []

    def scan(port: int) -> psutil.Process | None:
        scans.append(port)
        pid = listening[port]
        return None if pid is None else psutil.Process(pid)

    listeners = Listeners(scan)
    try:
        assert [getattr(listeners(port), "pid", None) for port in (8000, 8000, 8001)] == [
            first.pid, first.pid, first.pid]
        assert scans == [8000, 8001]
        assert listeners(8002) is None and listeners(8002) is None
        assert scans == [8000, 8001, 8002, 8002]
        first.kill()
        first.wait()
        listening[8000] = second.pid
        found = listeners(8000)
        assert found is not None and found.pid == second.pid
        assert scans == [8000, 8001, 8002, 8002, 8000]
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()


async def test_measured_footprints_leaves_a_model_out_when_it_is_unloaded(
        tmp_path: Path, admin: MemberAdmin) -> None:
    repo = tmp_path / "model_repo"
    build_tiny_model(repo)
    build_tiny_model(repo, "other")
    with started_triton(triton_settings(repo, tmp_path, TINY_MODEL_NAME, "other")) as server:
        member = member_of(server)
        both = await measured_footprints(member, admin, (TINY_MODEL_NAME, "other"))
        assert set(both) == {TINY_MODEL_NAME, "other"}
        assert server.pid is not None
        stubs = [c for c in psutil.Process(server.pid).children(recursive=True)
                 if stub_model(c.cmdline()) == "other"]
        await admin.unload(member, "other")
        assert stubs and await released(member, "other", 10.0)  # its stubs have exited
        assert not any(s.is_running() and s.status() != psutil.STATUS_ZOMBIE for s in stubs)
        assert await released(member, TINY_MODEL_NAME, 0.2) is False  # still loaded
        # watching holds no thread: many watches at once leave the default executor free
        watches = [asyncio.ensure_future(released(member, TINY_MODEL_NAME, 3.0))
                   for _ in range(12)]
        await asyncio.sleep(0.3)  # every watch has found its stubs and waits on them
        await asyncio.wait_for(asyncio.to_thread(lambda: None), 1.0)
        assert not any(await asyncio.gather(*watches))
        after = await measured_footprints(member, admin, (TINY_MODEL_NAME, "other"))
    assert set(after) == {TINY_MODEL_NAME}
    # the same stub, read twice: within 10% (its heap moves a little between reads)
    assert abs(after[TINY_MODEL_NAME] - both[TINY_MODEL_NAME]) < 0.1 * both[TINY_MODEL_NAME]


async def test_measured_footprints_is_empty_when_the_member_is_remote_or_gone(
        admin: MemberAdmin) -> None:
    remote = PoolMember("p", MemberSpec(host="10.1.2.3", http_port=8000))
    assert await measured_footprints(remote, admin, (TINY_MODEL_NAME,)) == {}
    assert admin._channels == {}  # a remote member is not even asked
    nobody = PoolMember("p", MemberSpec(host="127.0.0.1", http_port=free_port(),
                                        grpc_port=free_port()))
    assert await measured_footprints(nobody, admin, (TINY_MODEL_NAME,)) == {}


def test_stub_model_reads_the_model_folder_when_given_a_stub_command_line() -> None:
    stub = "/opt/tritonserver/backends/python/triton_python_backend_stub"
    argv = [stub, "/repo/my_model_0/3/model.py", "triton_python_backend_shm_region_x",
            "1048576", "1048576", "77", "/opt/tritonserver/backends/python", "336",
            "my_model_0_0_1", "DEFAULT"]
    assert stub_model(argv) == "my_model_0"
    assert stub_model(["/usr/bin/python3", "/repo/m/1/model.py"]) is None
    assert stub_model([stub]) is None


def test_is_loopback_when_given_addresses_and_names() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("10.0.0.7") and not is_loopback("triton-0.triton.svc")


def test_gpu_memory_used_sums_the_gpus_when_the_page_has_them() -> None:
    page = "\n".join([
        "# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes",
        "# TYPE nv_gpu_memory_used_bytes gauge",
        'nv_gpu_memory_used_bytes{gpu_uuid="GPU-aaaa"} 1073741824',
        'nv_gpu_memory_used_bytes{gpu_uuid="GPU-bbbb"} 5.36870912e+08',
        'nv_gpu_memory_total_bytes{gpu_uuid="GPU-aaaa"} 85899345920',
        "nv_gpu_memory_used_bytes_other 7",
        'nv_inference_count{model="m",version="1"} 3',
    ])
    assert gpu_memory_used(page) == 1073741824 + 536870912


async def test_gpu_memory_used_is_none_when_the_page_has_no_gpu(
        member: PoolMember, admin: MemberAdmin) -> None:
    """A real CPU-only Triton's page (read through MemberAdmin): no GPU series at all."""
    page = await admin.metrics_text(member)
    assert "nv_inference_count" in page or "nv_cpu" in page
    assert gpu_memory_used(page) is None
    assert gpu_memory_used("") is None


class FakeStub:
    """A stub as :class:`StubSizes` reads it: its identity and its resident set."""

    def __init__(self, pid: int, rss: int, started: float = 1.0) -> None:
        self.pid, self.rss, self.started = pid, rss, started

    def create_time(self) -> float:
        return self.started

    def memory_info(self) -> Any:
        return SimpleNamespace(rss=self.rss)


def test_a_stubs_size_is_read_again_once_its_resident_set_moves_or_the_read_ages() -> None:
    now = [0.0]
    reads: list[int] = []
    truth = {7: 100 << 20, 8: 40 << 20}

    def size(process: Any) -> int:
        reads.append(process.pid)
        return truth[process.pid]

    sizes = StubSizes(clock=lambda: now[0], size=size)
    stub, other = FakeStub(7, 120 << 20), FakeStub(8, 50 << 20)
    assert sizes(cast(psutil.Process, stub)) == 100 << 20
    assert sizes(cast(psutil.Process, other)) == 40 << 20
    truth[7] = 101 << 20  # grew by less than the bound, its resident set unmoved: kept
    stub.rss += RSS_MOVED_BYTES - 1
    now[0] = SIZE_KEPT_S - 0.1
    assert sizes(cast(psutil.Process, stub)) == 100 << 20
    assert reads == [7, 8]
    stub.rss += 1  # moved by the bound since the read: read again
    assert sizes(cast(psutil.Process, stub)) == 101 << 20
    truth[8] = 45 << 20  # unmoved, but its read is SIZE_KEPT_S old: read again
    now[0] = SIZE_KEPT_S
    assert sizes(cast(psutil.Process, other)) == 45 << 20
    # another process with the same pid (restarted): its own read
    assert sizes(cast(psutil.Process, FakeStub(7, 120 << 20, started=2.0))) == 101 << 20
    assert reads == [7, 8, 7, 8, 7]
