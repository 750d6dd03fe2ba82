"""The Python plane's HTTP infer path: the client's deadline handed to Triton as its
``timeout`` parameter, and the class's Triton ``priority``, in the JSON header of the
body as it is on the wire."""

from __future__ import annotations

import json

from gateway.python.http_api import with_parameters


def test_timeout_inserted_into_a_json_body_without_parameters() -> None:
    body = b' {"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1.0]}]}'
    out = with_parameters(body, {}, 0.25, None)
    assert json.loads(out) == {"parameters": {"timeout": 225_000}, **json.loads(body)}


def test_timeout_in_a_binary_body_moves_the_header_length() -> None:
    head = b'{"inputs":[{"name":"x","shape":[1],"datatype":"FP32",' \
           b'"parameters":{"binary_data_size":4}}]}'
    headers = {"inference-header-content-length": str(len(head))}
    out = with_parameters(head + b"\x00\x00\x80\x3f", headers, 1.0, None)
    size = int(headers["inference-header-content-length"])
    assert json.loads(out[:size])["parameters"] == {"timeout": 900_000}
    assert out[size:] == b"\x00\x00\x80\x3f"


def test_a_clients_own_shorter_timeout_is_kept_a_longer_one_shortened() -> None:
    def timeout(own: int) -> int:
        body = json.dumps({"parameters": {"timeout": own, "priority": 1},
                           "inputs": []}).encode()
        parsed = json.loads(with_parameters(body, {}, 0.5, None))
        assert parsed["parameters"]["priority"] == 1
        return int(parsed["parameters"]["timeout"])
    assert timeout(1000) == 1000
    assert timeout(9_000_000) == 450_000  # 90 % of what is left: Triton answers first


def test_bodies_it_cannot_read_go_as_they_are() -> None:
    for body, headers in [(b"{not json", {}), (b"[1, 2]", {}), (b"", {}),
                          (b'{"parameters": 5}', {}),
                          (b'{"inputs": []}', {"content-encoding": "gzip"}),
                          (b'{"inputs": []}', {"inference-header-content-length": "x"})]:
        assert with_parameters(body, dict(headers), 1.0, 1) == body


def test_the_classs_level_replaces_the_clients_priority_and_keeps_the_rest() -> None:
    body = json.dumps({"parameters": {"priority": 3, "sequence_id": 7},
                       "inputs": []}).encode()
    parsed = json.loads(with_parameters(body, {}, None, 1))
    assert parsed["parameters"] == {"priority": 1, "sequence_id": 7}
    bare = json.loads(with_parameters(b'{"inputs": []}', {}, None, 2))
    assert bare == {"inputs": [], "parameters": {"priority": 2}}


def test_nothing_to_set_leaves_the_body_as_sent() -> None:
    body = b'{ "inputs" : [] }'
    assert with_parameters(body, {}, None, None) is body
