"""The local Triton runtime: real tritonserver processes, started and always stopped."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import psutil
import pytest

from converters.samples import SAMPLE_MODEL_NAME
from infergate.triton.local import (
    STUB_NICE,
    STUB_NICE_SCRIPT,
    LocalTriton,
    TritonSettings,
    TritonStartupError,
    install_python_stub,
    may_raise_priority,
    stub_nice_env,
)
from tests.conftest import RUNTIME_ENV, triton_settings
from tests.procs import ROOT, triton_processes, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture()
def own_repo(sample_repo: Path, tmp_path: Path) -> Path:
    """A private copy of the sample repository (its path marks this test's processes)."""
    repo = tmp_path / "repo"
    shutil.copytree(sample_repo, repo)
    return repo


def test_local_triton_serves_and_leaves_no_process_when_stopped(own_repo: Path,
                                                                tmp_path: Path) -> None:
    server = LocalTriton(triton_settings(own_repo, tmp_path, SAMPLE_MODEL_NAME))
    with server:
        assert server.running()
        # the Python-backend stub runs beside the server, its numpy's BLAS on one thread
        assert any("triton_python_backend_stub" in p for p in triton_processes(str(own_repo)))
        assert server.pid is not None
        stubs = [c for c in psutil.Process(server.pid).children()
                 if "triton_python_backend_stub" in " ".join(c.cmdline())]
        assert stubs and all(s.environ().get("OPENBLAS_NUM_THREADS") == "1" for s in stubs)
        # started below the server where they may come back (stub_nice.sh)
        asked = {"BASH_ENV": str(STUB_NICE_SCRIPT), "INFERGATE_STUB_NICE": str(STUB_NICE)}
        assert all({k: s.environ().get(k) for k in asked}
                   == (asked if may_raise_priority() else dict.fromkeys(asked))
                   for s in stubs)
    assert not server.running()
    assert triton_processes(str(own_repo)) == []


def test_stubs_start_below_the_server_only_where_they_may_come_back() -> None:
    asked = {"BASH_ENV": str(STUB_NICE_SCRIPT), "INFERGATE_STUB_NICE": "10"}
    assert stub_nice_env(10, permitted=True) == asked
    assert stub_nice_env(10, permitted=False) == {}
    assert stub_nice_env(0, permitted=True) == {}
    # CAP_SYS_NICE (bit 23) in the effective set; without it (root in a container by
    # default) only a RLIMIT_NICE that lets this process's nice value be reached again
    assert may_raise_priority("Name:\tx\nCapEff:\t0000000000800000\n")
    assert may_raise_priority("CapEff:\t000001fffeffffff\n")
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    by_limit = soft == resource.RLIM_INFINITY or \
        20 - os.getpriority(os.PRIO_PROCESS, 0) <= soft
    assert may_raise_priority("CapEff:\t00000000a80425fb\n") == by_limit
    assert may_raise_priority("") == by_limit


def test_local_triton_reports_port_in_use_when_port_taken(own_repo: Path, tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        settings = TritonSettings(
            model_repository=own_repo, runtime_env=RUNTIME_ENV,
            log_file=tmp_path / "t.log", http_port=port,
        )
        with pytest.raises(TritonStartupError, match=f"port 127.0.0.1:{port} is already in use"):
            LocalTriton(settings).start()
    assert triton_processes(str(own_repo)) == []


def test_local_triton_starts_again_on_other_ports_when_another_server_takes_one_it_picked(
        own_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between picking a free port and Triton binding it, another process may take it
    (a full suite's other worker did): Triton exits ("already in use"), and the readiness
    probe meanwhile reaches the other server, whose HTTP/2 bytes are no HTTP/1 answer.
    Neither is mistaken for Triton: it is started again on other ports."""
    import gateway.netaddr
    from infergate.triton import local

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]

        def answer() -> None:  # a gRPC server's first bytes (an HTTP/2 SETTINGS frame)
            while True:
                try:
                    conn, _ = busy.accept()
                except OSError:
                    return
                with conn:
                    conn.sendall(b"\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x64")

        threading.Thread(target=answer, daemon=True).start()
        picks: list[list[int]] = []

        def free_ports(count: int, host: str, taken: object = ()) -> list[int]:
            ports = gateway.netaddr.free_ports(count, host, taken=taken)  # type: ignore[arg-type]
            picks.append([port, *ports[1:]] if not picks else ports)
            return picks[-1]

        monkeypatch.setattr(local, "free_ports", free_ports)
        # as if the port was free when Triton was given it
        monkeypatch.setattr(LocalTriton, "_check_ports_free", lambda self, ports: None)
        with LocalTriton(triton_settings(own_repo, tmp_path, SAMPLE_MODEL_NAME)) as server:
            assert server.endpoints is not None and server.endpoints.http_port != port
            assert len(picks) == 2 and picks[0][0] == port
            ready = httpx.get(f"http://{server.endpoints.http_url}/v2/health/ready")
            assert ready.status_code == 200
    assert triton_processes(str(own_repo)) == []


def test_local_triton_quotes_log_when_model_fails_to_load(own_repo: Path, tmp_path: Path) -> None:
    (own_repo / SAMPLE_MODEL_NAME / "1" / "model.onnx").write_bytes(b"not an onnx model")
    with pytest.raises(TritonStartupError) as info:
        LocalTriton(triton_settings(own_repo, tmp_path, SAMPLE_MODEL_NAME)).start()
    message = str(info.value)
    assert "exited with status" in message
    assert "failed to load" in message and SAMPLE_MODEL_NAME in message
    assert "Protobuf parsing failed" in message  # Triton's own words, quoted from its log
    assert triton_processes(str(own_repo)) == []


def test_local_triton_quotes_its_stderr_when_it_exits_before_its_log_opens(
        own_repo: Path, tmp_path: Path) -> None:
    """An option Triton refuses ends it before it writes its log: the error quotes what
    it printed instead (a parallel test run once saw only "(log empty)")."""
    settings = replace(triton_settings(own_repo, tmp_path), extra_args=("--no-such-option",))
    with pytest.raises(TritonStartupError) as info:
        LocalTriton(settings).start()
    message = str(info.value)
    assert "its stderr" in message and "no-such-option" in message, message
    assert triton_processes(str(own_repo)) == []


def test_local_triton_names_runtime_env_when_binary_missing(own_repo: Path, tmp_path: Path) -> None:
    settings = TritonSettings(model_repository=own_repo, runtime_env=tmp_path / "no-such-venv",
                              log_file=tmp_path / "t.log")
    with pytest.raises(TritonStartupError, match="no-such-venv"):
        LocalTriton(settings).start()


def test_local_triton_dies_with_parent_when_parent_killed(own_repo: Path, tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(ROOT)!r})
        from infergate.triton.local import LocalTriton, TritonSettings
        s = TritonSettings(model_repository=Path({str(own_repo)!r}),
                           runtime_env=Path({str(RUNTIME_ENV)!r}),
                           log_file=Path({str(tmp_path / 't.log')!r}),
                           models=({SAMPLE_MODEL_NAME!r},))
        LocalTriton(s).start()
        print("ready", flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == b"ready"
        assert triton_processes(str(own_repo))
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        assert wait_until(lambda: not triton_processes(str(own_repo)), 30), (
            triton_processes(str(own_repo))
        )
    finally:
        parent.kill()
        parent.wait()


@pytest.fixture()
def sample_only_repo(sample_repo: Path, tmp_path: Path) -> Path:
    """A private repository holding only the sample model: what ``infergate up`` needs
    for its welcome (the first prediction). Every model there is loaded and has a stub
    of its own; Triton unloads them on SIGTERM while it looks at its models once a
    second, so each one more (the session's tiny and stream) costs the stop about 0.5 s."""
    repo = tmp_path / "repo"
    shutil.copytree(sample_repo / SAMPLE_MODEL_NAME, repo / SAMPLE_MODEL_NAME)
    return repo


# The owner's path (an upload, then the console) is walked before one of the two signals
# only: both signals reach one handler (gateway/server.py sets the same stop event for
# each, infergate/stack.py also catches a SIGINT that comes before it), and what the
# upload leaves (the new model's version and its Python-backend stub) must be stopped
# as well, which SIGINT, the Ctrl-C the welcome names, checks.
OWNER_PATH_SIGNAL = signal.SIGINT


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_infergate_up_stops_everything_when_signalled(
    sample_only_repo: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    from infergate.triton.local import free_port

    http_port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "infergate.cli", "up", "--repo", str(sample_only_repo),
         "--runtime-env", str(RUNTIME_ENV), "--http-port", str(http_port),
         "--grpc-port", str(free_port()), "--scheduler-port", "0", "--log-dir", str(tmp_path)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    output = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            if line.startswith("Ctrl-C stops everything"):
                break
        text = "".join(output)
        assert "infergate is up (HAProxy carries inference" in text, text
        # said once: the Triton here lacks the fix for server#8034, and what that costs
        assert text.count("(all that installs on this machine) has the gRPC cancellation "
                          "race") == 1
        assert "one gRPC request per connection to it" in text and "2.57.0" in text
        assert "First prediction (efficientnet_lite0" in text
        first = text.split("bundled cat photo): ")[1].split(" ")[0]
        assert int(first) in range(281, 286)
        if sig == OWNER_PATH_SIGNAL:
            _upload_as_printed(text, tmp_path, http_port)
            _console_as_printed(text, tmp_path, http_port)
        proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, rest
        assert "stopped Triton, gateway and scheduler" in rest
        assert triton_processes(str(sample_only_repo)) == []
        assert triton_processes(str(tmp_path)) == []  # HAProxy's files live there
    finally:
        proc.kill()
        proc.wait()


def _console_as_printed(welcome: str, log_dir: Path, http_port: int) -> None:
    """The console's address and sign-in step as printed: the admin token's file
    signs in, and the model just uploaded is on the models page."""
    url = f"http://127.0.0.1:{http_port}/ui"
    admin = log_dir / "state" / "admin.token"
    assert f"Web console: {url}" in welcome and f"cat {admin}" in welcome
    with httpx.Client(trust_env=False, timeout=30) as client:
        signed = client.post(f"{url}/signin", data={"token": admin.read_text().strip()})
        assert signed.status_code == 303 and "infergate_console" in signed.headers["set-cookie"]
        assert "my_model" in client.get(f"{url}/models").text


def _upload_as_printed(welcome: str, log_dir: Path, http_port: int) -> None:
    """The owner's path the welcome prints: the curl upload with the generated upload
    token, then a prediction on the new model, within a minute."""
    token = (log_dir / "state" / "upload.token").read_text().strip()
    assert token in welcome  # shown once, at first start
    assert (log_dir / "state" / "upload.token").stat().st_mode & 0o077 == 0
    assert token not in (log_dir / "state" / "tokens.yaml").read_text()  # digests only
    example = log_dir / "example"
    url = f"http://127.0.0.1:{http_port}"
    started = time.monotonic()
    files = {name: (path.name, path.read_bytes()) for name, path in (
        ("model", example / "model.onnx"), ("spec", example / "spec.json"),
        ("evaluation", example / "evaluation.npz"))}
    assert httpx.post(f"{url}/v1/models/my_model/versions", files=files).status_code == 401
    job = httpx.post(f"{url}/v1/models/my_model/versions", files=files, timeout=60,
                     headers={"Authorization": f"Bearer {token}"}).json()

    def served() -> bool:
        state = httpx.get(f"{url}/v1/jobs/{job['id']}",
                          headers={"Authorization": f"Bearer {token}"}).json()["state"]
        assert state != "failed"
        return bool(state == "succeeded")

    assert wait_until(served, 60, 0.2)
    answer = httpx.post(f"{url}/v2/models/my_model/infer", json={"inputs": [
        {"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]})
    assert answer.json()["outputs"][0]["data"] == [3.0] * 16  # predict stays open
    assert time.monotonic() - started < 60


def test_tritons_starting_at_once_each_install_the_python_stub_whole(tmp_path: Path) -> None:
    """Each copies it through a temporary file of its own: through one fixed name, one
    start moved another's away and failed (FileNotFoundError)."""
    root = tmp_path / "lib" / "python3.11" / "site-packages" / "pytriton" / "tritonserver"
    source = root / "python_backend_stubs" / "3.11" / "triton_python_backend_stub"
    source.parent.mkdir(parents=True)
    (root / "backends" / "python").mkdir(parents=True)
    source.write_bytes(os.urandom(2 << 20))
    source.chmod(0o755)
    target = root / "backends" / "python" / "triton_python_backend_stub"
    at_once = threading.Barrier(8)
    failures: list[BaseException] = []

    def install() -> None:
        at_once.wait()
        try:
            install_python_stub(tmp_path)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            failures.append(exc)

    for _ in range(5):  # the race is a matter of timing: five rounds of eight at once
        target.unlink(missing_ok=True)
        threads = [threading.Thread(target=install) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        assert target.read_bytes() == source.read_bytes() and os.access(target, os.X_OK)
        assert sorted(p.name for p in target.parent.iterdir()) == [target.name]
