"""Schemathesis against the gateway: the gateway's own OpenAPI (every route FastAPI
declares, uploads and lifecycle included; behind HAProxy, the default data plane) and the
Open Inference Protocol's REST schema (``open_inference_protocol.yaml``, both data
planes), with valid and invalid requests (schemathesis' positive and negative modes),
seeds fixed (derandomized).
No answer may be a server fault; the gateway keeps serving within its bounds."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import httpx
import hypothesis
import pytest
import requests
import schemathesis
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import Case, GenerationMode

from converters.samples import SAMPLE_MODEL_NAME
from converters.tiny import TINY_MODEL_NAME
from tests.fuzz.conftest import fuzzing
from tests.fuzz.tally import Tally, cases
from tests.procs import GatewayProcess

pytestmark = pytest.mark.integration
OIP_SCHEMA = Path(__file__).with_name("open_inference_protocol.yaml")
SERVED_MODELS = (TINY_MODEL_NAME, SAMPLE_MODEL_NAME)


def run_schema(schema: schemathesis.BaseSchema, base_url: str, tally: Tally, surface: str,
               examples: int, prepare: Callable[[Case], None] | None = None) -> None:
    """``examples`` cases per operation and generation mode, recorded in ``tally``."""
    session = requests.Session()
    session.trust_env = False
    for result in schema.get_all_operations():
        operation = result.ok()  # type: ignore[union-attr]
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @given(operation.as_strategy(generation_mode=mode))
            @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
                      phases=[Phase.generate], suppress_health_check=list(HealthCheck))
            def one(case: Case) -> None:
                if prepare is not None:
                    prepare(case)
                try:
                    resp = case.call(base_url=base_url, session=session, timeout=30)
                except (requests.exceptions.InvalidHeader, requests.exceptions.InvalidURL,
                        ValueError, UnicodeError):
                    return  # the client library refuses to send it: nothing to answer
                except requests.ConnectionError as exc:
                    tally.record(surface, "connection-reset", str(exc), _describe(case))
                    return
                tally.record(surface, resp.status_code, resp.text, _describe(case))

            # an operation whose negative mode cannot be satisfied (no parameters to break)
            with contextlib.suppress(hypothesis.errors.Unsatisfiable):
                one()


def _describe(case: Case) -> str:
    body = getattr(case, "body", None)
    return f"{case.method} {case.formatted_path} {case.query or ''} {body!r:.200}"


def _keep_served_models(case: Case) -> None:
    """Never unload (or retune) the models the other tests use."""
    params = case.path_parameters or {}
    if case.method == "POST" and params.get("model") in SERVED_MODELS:
        params["model"] = params["model"] + "_fuzz"


# The gateway's own OpenAPI is the control plane's app (lifecycle, console, settings,
# tenants): the same code behind either data plane, so it is fuzzed behind the default one
# (HAProxy). What the planes do differently, the inference protocol and its framing, is
# fuzzed on both (below, and test_http_tensors.py).
@pytest.mark.parametrize("gateway", ["haproxy"], indirect=True)
def test_gateway_openapi_fuzz_answers_no_server_fault(gateway: GatewayProcess,
                                                      tally: Tally) -> None:
    spec = httpx.get(f"http://{gateway.http_url}/openapi.json").json()
    schema = schemathesis.openapi.from_dict(spec)
    with fuzzing(gateway, tally, "http-openapi-gateway") as surface:
        run_schema(schema, f"http://{gateway.http_url}", tally, surface, cases(8),
                   prepare=_keep_served_models)


def _infer_tiny(case: Case) -> None:
    """Inference cases name the tiny model, so the body reaches Triton's parser (an
    unknown model is answered before the body is read; other suites send those)."""
    if case.formatted_path.endswith("/infer") and case.path_parameters:
        case.path_parameters["model_name"] = TINY_MODEL_NAME
        if "model_version" in case.path_parameters and len(case.formatted_path) % 2:
            case.path_parameters["model_version"] = "1"


def test_open_inference_protocol_fuzz_answers_no_server_fault(gateway: GatewayProcess,
                                                              tally: Tally) -> None:
    schema = schemathesis.openapi.from_dict(yaml.safe_load(OIP_SCHEMA.read_text()))
    with fuzzing(gateway, tally, "http-openapi-oip") as surface:
        run_schema(schema, f"http://{gateway.http_url}", tally, surface, cases(35),
                   prepare=_infer_tiny)
