"""Process helpers for integration tests: find any tritonserver / Python-backend stub a
test might have left behind; the gateway runner lives in infergate.processes."""

from __future__ import annotations

import contextlib
from pathlib import Path

from infergate.processes import (  # noqa: F401 (re-exported for tests)
    ROOT,
    GatewayProcess,
    pools_yaml,
    run_gateway,
    wait_until,
)


def triton_processes(marker: str = "") -> list[str]:
    """Live (non-zombie) tritonserver/stub/haproxy processes whose command line contains
    marker."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z" and ("tritonserver" in cmdline or "triton_python_backend_stub"
                                 in cmdline or "haproxy" in cmdline.split(" ", 1)[0]
                                 ) and marker in cmdline:
                found.append(f"{proc.name}: {cmdline[:200]}")
    return found
