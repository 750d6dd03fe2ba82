"""IPv6 member addresses (gateway/netaddr.py): joined with their ports in brackets
everywhere, and a pool of IPv6 members served end to end by a real Triton listening on
``::1``, on both data planes."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH, build_tiny_model
from gateway.config.pools import MemberSpec
from gateway.haproxy.snapshot import server_name
from gateway.netaddr import (
    bare_host,
    family,
    free_port,
    free_ports,
    join_host_port,
    split_host_port,
)
from infergate.triton.local import LocalTriton
from tests.conftest import triton_settings
from tests.procs import pools_yaml, run_gateway, started_triton, wait_until


@pytest.mark.parametrize(("host", "port", "address"), [
    ("127.0.0.1", 8001, "127.0.0.1:8001"), ("triton-0.triton", 8001, "triton-0.triton:8001"),
    ("fd00::5", 8001, "[fd00::5]:8001"), ("::1", 80, "[::1]:80")])
def test_an_address_joins_and_splits_back_with_ipv6_in_brackets(
        host: str, port: int, address: str) -> None:
    assert join_host_port(host, port) == address
    assert split_host_port(address) == (host, port)


@pytest.mark.parametrize("address", ["fd00::5:8001", "127.0.0.1", "host:", ":80", "[::1]"])
def test_an_address_without_a_clear_port_is_refused(address: str) -> None:
    with pytest.raises(ValueError):
        split_host_port(address)


def test_a_member_keeps_its_host_bare_and_writes_its_addresses_bracketed() -> None:
    member = MemberSpec(host="[fd00::5]", http_port=8000, grpc_port=8001, metrics_port=8002)
    assert member.host == bare_host("fd00::5") == "fd00::5"
    assert (member.http_address, member.grpc_address, member.metrics_address, member.key) == (
        "[fd00::5]:8000", "[fd00::5]:8001", "[fd00::5]:8002", "[fd00::5]:8001")
    with pytest.raises(ValidationError, match="a port belongs in its own field"):
        MemberSpec(host="10.0.0.5:8001")


def test_ipv6_members_get_distinct_haproxy_server_names() -> None:
    assert server_name("127.0.0.1:8001") == "127.0.0.1_8001"
    names = {server_name(join_host_port(host, port)) for host, port in (
        ("fd00::5", 8001), ("fd00::5:0", 801), ("fd00::", 58001), ("::1", 8001))}
    assert len(names) == 4 and "v6_fd00--5_8001" in names
    assert all(n.replace("_", "").replace("-", "").replace(".", "").isalnum() for n in names)


@pytest.fixture(scope="module")
def triton_v6(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    tmp = tmp_path_factory.mktemp("ipv6")
    build_tiny_model(tmp / "repo")
    with started_triton(replace(triton_settings(tmp / "repo", tmp, TINY_MODEL_NAME),
                                host="::1")) as server:
        yield server


def _member_health(http_url: str) -> dict[str, float]:
    text = httpx.get(f"http://{http_url}/metrics").text
    return {s.labels["member"]: s.value
            for f in text_string_to_metric_families(text) if f.name == "infergate_member_healthy"
            for s in f.samples}


@pytest.mark.integration
def test_a_pool_of_ipv6_members_is_probed_and_serves_both_protocols(
        triton_v6: LocalTriton, data_plane: str, tmp_path: Path) -> None:
    """Before, every URL to the member was ``http://::1:PORT`` (refused by the HTTP
    client: the member never turned healthy) and HAProxy's server line ``::1:PORT``."""
    endpoints = triton_v6.endpoints
    assert endpoints is not None and endpoints.host == "::1"
    pools = pools_yaml(tmp_path / "pools.yaml", {"p": [endpoints]})
    x = np.arange(TINY_WIDTH, dtype=np.float32).reshape(1, TINY_WIDTH)
    with run_gateway(pools, tmp_path, data_plane=data_plane) as gw:
        key = f"[::1]:{endpoints.grpc_port}"
        assert wait_until(lambda: _member_health(gw.http_url).get(key) == 1.0, 20), \
            _member_health(gw.http_url)
        http = httpclient.InferenceServerClient(gw.http_url)
        grpc = grpcclient.InferenceServerClient(gw.grpc_url)
        try:
            for module, client in ((httpclient, http), (grpcclient, grpc)):
                tensor = module.InferInput("x", [1, TINY_WIDTH], "FP32")
                tensor.set_data_from_numpy(x)
                result = client.infer(TINY_MODEL_NAME, [tensor])
                np.testing.assert_allclose(result.as_numpy("y"), 2 * x + 1)
            assert grpc.get_model_metadata(TINY_MODEL_NAME).name == TINY_MODEL_NAME
        finally:
            http.close()
            grpc.close()


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_a_free_port_lies_below_the_ephemeral_range_and_can_be_bound(host: str) -> None:
    """No outgoing connection can take it between the pick and the server's bind."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = free_port(host)
        assert port < low
        with socket.socket(family(host)) as sock:
            sock.bind((host, port))


def test_several_free_ports_are_different_and_none_is_one_already_given(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pick nothing binds yet is free to the next pick too: two in a row can be one
    port (and HAProxy and grpc-core would share it, SO_REUSEPORT). The picks here repeat
    a port and offer one the caller was given."""
    picks = iter([20_001, 20_001, 20_002, 20_003, 20_001, 20_004])
    monkeypatch.setattr("gateway.netaddr.free_port", lambda host="127.0.0.1": next(picks))
    assert free_ports(3, taken=(20_002,)) == [20_001, 20_003, 20_004]


def test_several_free_ports_from_the_real_picker_can_all_be_bound() -> None:
    ports = free_ports(5, taken=(free_port(),))
    assert len(set(ports)) == 5
    with contextlib.ExitStack() as held:
        for port in ports:
            held.enter_context(socket.socket()).bind(("127.0.0.1", port))
