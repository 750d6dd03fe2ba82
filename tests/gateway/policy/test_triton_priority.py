"""The class's Triton level (gateway/policy/triton_priority.py), and its gRPC bytes as
Triton's own protobufs read them."""

from __future__ import annotations

from importlib import resources

from tritonclient.grpc import service_pb2

from gateway.config.tenancy import Priority
from gateway.haproxy.lua_filters import GRPC_FIELDS_LUA, PRIORITY_HTTP_LUA
from gateway.policy.triton_priority import HTTP_ADDED, grpc_entry, level


def test_each_class_its_level_capped_at_the_models_levels() -> None:
    assert [level(p, 3) for p in Priority] == [1, 2, 3]
    assert [level(p, 5) for p in Priority] == [1, 2, 3]
    # the batching tuner's two levels: standard and sheddable share the second
    assert [level(p, 2) for p in Priority] == [1, 2, 2]


def test_nothing_without_levels_or_without_a_class() -> None:
    assert level(Priority.CRITICAL, 0) is None
    assert level(Priority.CRITICAL, 1) is None
    assert level(None, 3) is None


def test_the_grpc_entry_appended_replaces_the_clients_priority() -> None:
    request = service_pb2.ModelInferRequest(model_name="m")
    request.parameters["priority"].uint64_param = 3
    request.parameters["sequence_id"].int64_param = 7
    wire = request.SerializeToString() + grpc_entry(1)
    parsed = service_pb2.ModelInferRequest.FromString(wire)
    assert parsed.parameters["priority"].uint64_param == 1
    assert parsed.parameters["sequence_id"].int64_param == 7
    assert parsed.model_name == "m"


def test_the_grpc_entry_is_the_sixteen_bytes_the_lua_filter_appends() -> None:
    # gateway/haproxy/grpc_fields.lua builds these bytes itself: tag 0x22, length 14, key,
    # value (InferParameter field 5, uint64)
    assert grpc_entry(2) == b'\x22\x0e\x0a\x08priority\x12\x02\x28\x02'


def test_the_http_insertion_is_as_long_as_a_whole_parameters_object() -> None:
    assert HTTP_ADDED == len(b',"parameters":{"priority":3}') == 28


def test_the_lua_filters_add_what_the_policy_says() -> None:
    """HAProxy's filters build the same bytes in Lua: the HTTP insertion's length the
    backends raise the lengths by, and the gRPC entry before its level's byte."""
    lua = resources.files("gateway.haproxy")
    assert f"local ADDED = {HTTP_ADDED}" in lua.joinpath(PRIORITY_HTTP_LUA).read_text()
    escaped = "".join(chr(b) if chr(b).islower() else f"\\x{b:02x}"
                      for b in grpc_entry(1)[:-1])
    assert f'"{escaped}" .. string.char(' in lua.joinpath(GRPC_FIELDS_LUA).read_text()
