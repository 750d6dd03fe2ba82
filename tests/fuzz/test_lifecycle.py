"""Uploads and the lifecycle/control APIs, against a lifecycle-enabled gateway behind
HAProxy (the front door ``make run`` serves) with tokens: multipart uploads with corrupt
archives, traversal and absolute member names, symlinks, zip bombs, wrong specs, wrong
content types and broken multipart framing; then schemathesis over the gateway's OpenAPI
with no token, a wrong one, and each scope's. Nothing is a server fault, nothing lands
in the model repository, and the gateway keeps serving."""

from __future__ import annotations

import io
import json
import random
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import schemathesis
from schemathesis import Case

from converters.tiny import TINY_MODEL_NAME, build_tiny_model
from infergate.processes import GatewayProcess
from tests.conftest import triton_settings
from tests.fuzz.conftest import fuzzing
from tests.fuzz.tally import Tally, cases
from tests.fuzz.test_http_schemas import run_schema
from tests.gateway.lifecycle.conftest import TINY_SPEC, TOKENS, bearer, lifecycle_config, tree
from tests.procs import run_gateway, started_triton

pytestmark = pytest.mark.integration
Upload = tuple[str, dict[str, str], bytes]  # model name, headers, body


@pytest.fixture(scope="module")
def lifecycle_gateway(tmp_path_factory: pytest.TempPathFactory
                      ) -> Iterator[tuple[GatewayProcess, Path]]:
    tmp = tmp_path_factory.mktemp("fuzz-lifecycle")
    repo = tmp / "model_repo"
    build_tiny_model(repo)
    with started_triton(triton_settings(repo, tmp, TINY_MODEL_NAME)) as triton:
        assert triton.endpoints is not None
        config = lifecycle_config(tmp / "gateway.yaml", {"local": [triton.endpoints]}, repo,
                                  lifecycle={"limits": {"max_model_bytes": 1 << 20,
                                                        "max_samples_bytes": 1 << 20,
                                                        "max_extracted_bytes": 8 << 20}})
        with run_gateway(config, tmp, data_plane="haproxy") as gw:
            yield gw, repo


def _npz(rng: random.Random) -> bytes:
    out = io.BytesIO()
    np.savez(out, x=np.asarray([[rng.random()] * 16] * 4, np.float32))
    return out.getvalue()


def _tar(members: list[tuple[tarfile.TarInfo, bytes]], mode: str = "w") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode=mode) as archive:  # type: ignore[call-overload]
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out.getvalue()


def _hostile_tar(rng: random.Random) -> tuple[str, bytes]:
    kind = rng.randrange(5)
    if kind == 0:
        info = tarfile.TarInfo(rng.choice(["../../escape.npy", "/etc/passwd-x", "a/../../b"]))
        return "evaluation.tar", _tar([(info, b"x" * 16)])
    if kind == 1:
        link = tarfile.TarInfo("link.npy")
        link.type = rng.choice([tarfile.SYMTYPE, tarfile.LNKTYPE])
        link.linkname = rng.choice(["/etc/shadow", "../../secret", "x.npy"])
        return "evaluation.tar.gz", _tar([(link, b"")], "w:gz")
    if kind == 2:
        dev = tarfile.TarInfo("dev.npy")
        dev.type = rng.choice([tarfile.CHRTYPE, tarfile.FIFOTYPE, tarfile.BLKTYPE])
        return "evaluation.tar", _tar([(dev, b"")])
    if kind == 3:  # many members
        return "evaluation.tar", _tar([(tarfile.TarInfo(f"m{i}.npy"), b"")
                                       for i in range(rng.choice([10, 2000]))])
    return "evaluation.tgz", rng.randbytes(rng.randint(0, 400))  # not an archive at all


def _hostile_zip(rng: random.Random) -> tuple[str, bytes]:
    out = io.BytesIO()
    kind = rng.randrange(4)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        if kind == 0:
            archive.writestr(rng.choice(["../../x.npy", "/abs/x.npy", "..\\..\\x.npy"]), b"x")
        elif kind == 1:  # a zip bomb: 16 MiB of zeros in a few KiB
            archive.writestr("bomb.npy", b"\0" * (16 << 20))
        elif kind == 2:  # a member flagged as a symbolic link
            info = zipfile.ZipInfo("link.npy")
            info.external_attr = 0o120777 << 16
            archive.writestr(info, "/etc/passwd")
        else:
            archive.writestr("x.npy", b"not npy")
    data = out.getvalue()
    if rng.random() < 0.2:  # a corrupt archive: bytes cut or flipped
        cut = bytearray(data[: rng.randrange(1, len(data))])
        cut[rng.randrange(len(cut))] ^= 0xFF
        data = bytes(cut)
    return "evaluation.zip", data


def _spec(rng: random.Random) -> str:
    return rng.choice([
        json.dumps(TINY_SPEC), "{", "[]", "null", json.dumps({"inputs": "x"}),
        json.dumps({**TINY_SPEC, "max_batch_size": -3}), json.dumps({**TINY_SPEC, "x": 1}),
        json.dumps({**TINY_SPEC, "precisions": ["fp7"]}),
        json.dumps({**TINY_SPEC, "pools": ["nope"]}),
        json.dumps({"inputs": [{"name": "x", "datatype": "FP99", "shape": [1]}]}),
        "\udcff".encode("utf-8", "surrogatepass").decode("latin-1"), "x" * 70_000,
    ])


def _multipart(rng: random.Random) -> Upload:
    name = rng.choice([TINY_MODEL_NAME, "fuzz-model", "../etc", "a" * 300, "UPPER", "%00x",
                       "tiny.v2", ""])
    files: dict[str, Any] = {}
    if rng.random() < 0.9:
        files["model"] = (rng.choice(["model.onnx", "model.pt2", "model.pt", "model.exe",
                                      "../../model.onnx", "/abs/model.onnx", ""]),
                          rng.choice([b"not onnx", rng.randbytes(300), b"PK\x03\x04junk",
                                      b"\x80\x04\x95junk-pickle"]))
    if rng.random() < 0.8:
        files["spec"] = ("spec.json", _spec(rng))
    if rng.random() < 0.7:
        files["evaluation"] = rng.choice([lambda: ("evaluation.npz", _npz(rng)),
                                          lambda: _hostile_tar(rng),
                                          lambda: _hostile_zip(rng),
                                          lambda: ("evaluation.exe", b"MZ")])()
    if rng.random() < 0.1:
        files["surprise"] = ("x.bin", b"?")
    request = httpx.Request("POST", "http://gw/", files=files or {"x": ("x", b"")})
    body = request.read()
    return name, {"content-type": request.headers["content-type"]}, body


def _wrong_framing(rng: random.Random) -> Upload:
    name, headers, body = _multipart(rng)
    kind = rng.randrange(5)
    if kind == 0:
        headers["content-type"] = rng.choice(["application/json", "text/plain",
                                              "multipart/form-data", "multipart/mixed; b=x",
                                              "application/zip"])
    elif kind == 1:
        body = body[: rng.randrange(1, len(body))]  # cut short: the final boundary missing
    elif kind == 2:
        headers["content-type"] = "multipart/form-data; boundary=" + "x" * rng.choice([1, 80, 300])
    elif kind == 3:
        body = rng.randbytes(rng.randint(0, 500))
    else:  # the parts' boundary is not the one the header announces
        body = body.replace(b"--", b"-=", rng.randint(1, 3))
        headers["content-length"] = str(len(body))
    return name, headers, body


def test_upload_fuzz_answers_no_server_fault_and_repository_unchanged(
    lifecycle_gateway: tuple[GatewayProcess, Path], tally: Tally,
) -> None:
    gw, repo = lifecycle_gateway
    rng = random.Random(13)
    before = tree(repo)
    makers: list[Callable[[random.Random], Upload]] = [_multipart, _multipart, _wrong_framing]
    with fuzzing(gw, tally, "http-uploads") as surface, \
            httpx.Client(base_url=f"http://{gw.http_url}", timeout=60, trust_env=False) as client:
        for _ in range(cases(400)):
            name, headers, body = rng.choice(makers)(rng)
            auth = rng.choice([bearer("upload"), bearer("upload"), bearer("admin"),
                               bearer("predict"), {}, {"authorization": "Bearer nope"}])
            try:
                resp = client.post(f"/v1/models/{name}/versions", content=body,
                                   headers={**headers, **auth})
            except (httpx.LocalProtocolError, httpx.InvalidURL):
                continue  # httpx would not send it
            except httpx.RemoteProtocolError as exc:
                tally.record(surface, "connection-reset", str(exc), name)
                continue
            tally.record(surface, resp.status_code, resp.text, (name, body[:160]))
    assert tree(repo) == before, "a refused upload changed the model repository"


TOKEN_CHOICES = [None, "wrong-token-0123456789abcdef", TOKENS["predict"], TOKENS["upload"],
                 TOKENS["admin"]]


def test_lifecycle_and_control_api_fuzz_with_and_without_tokens(
    lifecycle_gateway: tuple[GatewayProcess, Path], tally: Tally,
) -> None:
    gw, repo = lifecycle_gateway
    spec = httpx.get(f"http://{gw.http_url}/openapi.json").json()
    spec["paths"] = {p: ops for p, ops in spec["paths"].items() if p.startswith("/v1/")
                     and not p.endswith("/versions")}  # uploads: the suite above
    schema = schemathesis.openapi.from_dict(spec)
    rng = random.Random(17)

    def authorize(case: Case) -> None:
        token = rng.choice(TOKEN_CHOICES)
        if case.headers is None:
            case.headers = {}
        if token is not None:
            case.headers[rng.choice(["authorization", "x-api-key"])] = (
                token if rng.random() < 0.5 else f"Bearer {token}")
        params = case.path_parameters or {}
        if params.get("name") == TINY_MODEL_NAME or params.get("model") == TINY_MODEL_NAME:
            params.update({k: "fuzz-model" for k in ("name", "model") if k in params})

    before = tree(repo)
    with fuzzing(gw, tally, "http-lifecycle-api") as surface:
        run_schema(schema, f"http://{gw.http_url}", tally, surface, cases(40),
                   prepare=authorize)
    assert tree(repo) == before
