"""The Kubernetes shape on one machine: HAProxy started on its own (as its container does:
wait for the first configuration, then master-worker), the control plane started with
``--haproxy-external`` on the shared folder. Inference flows through HAProxy; a
structural change reloads it through the master socket; SIGTERM leaves HAProxy to its
own container's stop."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH
from gateway.haproxy.process import find_haproxy
from tests.conftest import triton_settings
from tests.procs import pools_yaml, run_gateway, started_triton

pytestmark = pytest.mark.integration


def test_control_plane_programs_a_separately_started_haproxy_when_external(
    tiny_repo: Path, tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    binary = find_haproxy()
    assert binary is not None
    # the haproxy container's command, verbatim in spirit (k8s/base/gateway.yaml)
    script = (f"until [ -s {run_dir}/haproxy.cfg ]; do sleep 0.1; done; "
              f"exec {binary} -W -db -S {run_dir}/master.sock,mode,600 -f {run_dir}/haproxy.cfg")
    log = (tmp_path / "haproxy.log").open("wb")
    haproxy = subprocess.Popen(["/bin/sh", "-c", script], stdout=log, stderr=subprocess.STDOUT)
    try:
        with started_triton(triton_settings(tiny_repo, tmp_path, TINY_MODEL_NAME)) as triton:
            assert triton.endpoints is not None
            pools = pools_yaml(tmp_path / "p.yaml", {"local": [triton.endpoints]})
            with run_gateway(pools, tmp_path, "--haproxy-external", "--haproxy-run-dir",
                             str(run_dir), data_plane="haproxy") as gw:
                x = np.ones((1, TINY_WIDTH), np.float32)
                for module, url in ((httpclient, gw.http_url), (grpcclient, gw.grpc_url)):
                    client = module.InferenceServerClient(url)
                    inp = module.InferInput("x", list(x.shape), "FP32")
                    inp.set_data_from_numpy(x)
                    np.testing.assert_array_equal(
                        client.infer(TINY_MODEL_NAME, [inp]).as_numpy("y"), 2 * x + 1)
                    client.close()
                assert haproxy.poll() is None
                gw.terminate()
                assert gw.proc.returncode == 0
            # the control plane is gone; HAProxy is its container's to stop
            assert haproxy.poll() is None
    finally:
        haproxy.terminate()
        haproxy.wait(timeout=10)
        log.close()
