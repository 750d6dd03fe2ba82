"""The local stack behind ``make run``: sample model, Triton, gateway (HAProxy data plane,
Python control plane with the model lifecycle on) and scheduler.

Triton runs as a child process (see :mod:`infergate.triton.local`); the gateway and the
scheduler service run on this process's event loop. SIGINT/SIGTERM stop the gateway
(draining in-flight requests), then the scheduler, then Triton.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import uvicorn

from converters.samples import SAMPLE_MODEL_NAME, build_sample_model, cat_input
from gateway.auth import TokenTable, load_token_entries
from gateway.config import GatewayConfig
from gateway.config.lifecycle import LifecycleSpec
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.config.tenancy import TenancySpec
from gateway.server import EmbeddedServer, GatewaySettings, choose_data_plane, serve
from gateway.upstream.triton_version import (
    FIXED_RELEASE,
    RACE,
    GrpcReuse,
    grpc_mode,
    has_fix,
    parse_version,
    version_from_metadata,
)
from infergate.owner import EXAMPLE_MODEL, ExampleUpload, LocalTokens, example_upload, local_tokens
from infergate.triton.local import LocalTriton, TritonEndpoints, TritonSettings

log = logging.getLogger("infergate")

IMAGENET_CATS = {281: "tabby", 282: "tiger cat", 283: "Persian cat", 284: "Siamese cat",
                 285: "Egyptian cat"}


@dataclass(frozen=True)
class LocalStackSettings:
    repo: Path
    runtime_env: Path
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    scheduler_port: int = 8010
    models: tuple[str, ...] = ()
    log_dir: Path = Path(".run")
    data_plane: str = "auto"
    grpc_upstream_reuse: GrpcReuse = GrpcReuse.AUTO
    tenants: TenancySpec | None = None  # --tenants FILE, read in main()


def repository_models(repo: Path) -> tuple[str, ...]:
    return tuple(sorted(p.name for p in repo.iterdir() if (p / "config.pbtxt").is_file()))


def local_pool(endpoints: TritonEndpoints) -> PoolSpec:
    member = MemberSpec(
        host=endpoints.host,
        http_port=endpoints.http_port,
        grpc_port=endpoints.grpc_port,
        metrics_port=endpoints.metrics_port,
    )
    return PoolSpec(name="local", members=(member,))


def run_local_stack(settings: LocalStackSettings) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    print(f"[infergate] model repository: {settings.repo.resolve()}", flush=True)
    written = build_sample_model(settings.repo)
    if written is not None:
        print(f"[infergate] exported sample model {written.name} v{written.version}", flush=True)
    models = settings.models or repository_models(settings.repo)
    triton = LocalTriton(
        TritonSettings(
            model_repository=settings.repo,
            runtime_env=settings.runtime_env,
            log_file=settings.log_dir / "triton.log",
            models=models,
        )
    )
    print(f"[infergate] starting Triton with models: {', '.join(models)}", flush=True)
    endpoints = triton.start()
    try:
        print(f"[infergate] Triton ready (internal HTTP {endpoints.http_url}, "
              f"gRPC {endpoints.grpc_url}, log {settings.log_dir / 'triton.log'})", flush=True)
        asyncio.run(_serve_all(settings, local_pool(endpoints)))
    except KeyboardInterrupt:
        pass
    finally:
        triton.stop()
        print("[infergate] stopped Triton, gateway and scheduler", flush=True)


async def _serve_all(settings: LocalStackSettings, pool: PoolSpec) -> None:
    stop, started = asyncio.Event(), asyncio.Event()
    tokens = local_tokens(settings.log_dir / "state")
    example = example_upload(settings.log_dir / "example")
    data_plane = choose_data_plane(settings.data_plane)
    gateway_settings = GatewaySettings(
        host=settings.host, http_port=settings.http_port, grpc_port=settings.grpc_port,
        data_plane=data_plane, haproxy_run_dir=(settings.log_dir / "haproxy").resolve(),
        grpc_upstream_reuse=settings.grpc_upstream_reuse,
        scheduler_url=(f"http://{settings.host}:{settings.scheduler_port}"
                       if settings.scheduler_port else None),
    )
    gateway = asyncio.create_task(
        serve(gateway_settings, _local_config(settings, pool), stop, started,
              auth=TokenTable(load_token_entries(tokens.digests_file, os.environ),
                              predict_open=True))
    )
    scheduler = _scheduler_server(settings)
    tasks: list[asyncio.Task[Any]] = [gateway]
    if scheduler is not None:
        tasks.append(asyncio.create_task(scheduler.serve()))
    await asyncio.wait({gateway, asyncio.create_task(started.wait())},
                       return_when=asyncio.FIRST_COMPLETED)
    if gateway.done():
        await gateway  # start-up failed: raise its error
    plan = await asyncio.to_thread(_example_plan, settings) if scheduler is not None else None
    await asyncio.to_thread(_print_welcome, settings, scheduler is not None, data_plane)
    await asyncio.to_thread(_print_owner_welcome, settings, tokens, example, plan)
    try:
        await gateway
    finally:
        stop.set()
        if scheduler is not None:
            scheduler.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)


def _local_config(settings: LocalStackSettings, pool: PoolSpec) -> GatewayConfig:
    """One pool over the local Triton; uploads write to the repository Triton serves."""
    lifecycle = LifecycleSpec.model_validate({
        "repository": settings.repo.resolve(),
        "state_dir": (settings.log_dir / "state").resolve(),
        # confined by Landlock where the kernel has it; said in the log where not
        "sandbox": {"filesystem": "if_available"},
    })
    return GatewayConfig(pools=(pool,), lifecycle=lifecycle, tenancy=settings.tenants)


def _example_plan(settings: LocalStackSettings) -> str | None:
    """Plan the scheduler's example fleet once (scheduler/examples: A100, H100 and T4
    nodes, none of them this machine's), so the console's placement page has a picture."""
    from scheduler.request import load_request

    examples = Path(__file__).resolve().parent.parent / "scheduler" / "examples"
    url = f"http://{settings.host}:{settings.scheduler_port}/v1/plans"
    try:
        request = load_request(examples / "fleet.yaml", examples / "pools.yaml")
        answer = httpx.post(url, content=request.model_dump_json(), timeout=120,
                            headers={"content-type": "application/json"})
        answer.raise_for_status()
        return str(answer.json()["id"])
    except (OSError, ValueError, KeyError, httpx.HTTPError) as exc:
        log.warning("the example placement plan could not be made: %s", exc)
        return None


def _print_owner_welcome(settings: LocalStackSettings, tokens: LocalTokens,
                         example: ExampleUpload, plan: str | None = None) -> None:
    http = f"{settings.host}:{settings.http_port}"
    lines = [f"Web console: http://{http}/ui",
             f"  sign in with the admin token (cat {tokens.file('admin')}) or the upload "
             "one: the browser keeps a session cookie, never the token, and no URL holds it.",
             "  Pages: models (versions, traffic), a model's reports and rollback, upload, "
             "pools and placement" + (f" (example MIG plan {plan} from scheduler/examples: "
                                      "this machine has no GPU)." if plan else "."),
             "",
             "Model owners: uploads are on (predict stays open)."]
    if tokens.created:
        lines += [f"  API tokens, made now and shown this once (kept, readable by you only, "
                  f"in {tokens.folder}/*.token):",
                  f"    upload  {tokens.upload}", f"    admin   {tokens.admin}"]
    else:
        lines.append(f"  API tokens: {tokens.folder}/upload.token, admin.token "
                     "(made at first start)")
    token = f"$(cat {tokens.file('upload')})"
    lines += [
        f"  Upload an ONNX model (here the example in {example.model.parent}):",
        f"    .venv/bin/infergate models upload {EXAMPLE_MODEL} --url http://{http} \\",
        f"      --model {example.model} --spec {example.spec} \\",
        f"      --evaluation {example.evaluation} --token \"{token}\"",
        "  or with curl:",
        f"    curl -s -H \"Authorization: Bearer {token}\" \\",
        f"      -F model=@{example.model} -F spec=@{example.spec} "
        f"-F evaluation=@{example.evaluation} \\",
        f"      http://{http}/v1/models/{EXAMPLE_MODEL}/versions",
        "  then predict on it:",
        f"    curl -s -X POST http://{http}/v2/models/{EXAMPLE_MODEL}/infer "
        "-H 'Content-Type: application/json' \\",
        "      -d '{\"inputs\": [{\"name\": \"x\", \"shape\": [1, 16], "
        "\"datatype\": \"FP32\", \"data\": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}]}'",
        "",
        "Ctrl-C stops everything.",
    ]
    print("\n".join(lines), flush=True)


def _scheduler_server(settings: LocalStackSettings) -> EmbeddedServer | None:
    if not settings.scheduler_port:
        return None
    try:
        service = importlib.import_module("scheduler.service")
    except ImportError:
        return None
    app = service.create_app(service.ServiceSettings(output_dir=settings.log_dir / "scheduler"))
    return EmbeddedServer(uvicorn.Config(app, host=settings.host, port=settings.scheduler_port,
                                         log_level="warning", lifespan="off"))


def _print_welcome(settings: LocalStackSettings, with_scheduler: bool,
                   data_plane: str) -> None:
    http = f"{settings.host}:{settings.http_port}"
    grpc = f"{settings.host}:{settings.grpc_port}"
    top5 = _first_prediction(http)
    carrier = ("HAProxy carries inference; the Python control plane serves the rest"
               if data_plane == "haproxy" else "the Python data plane carries inference")
    lines = [
        "",
        f"infergate is up ({carrier}).",
        f"  gateway HTTP  http://{http}   (KServe v2 / Triton REST; metrics at /metrics)",
        f"  gateway gRPC  {grpc}          (inference.GRPCInferenceService)",
    ]
    if with_scheduler:
        lines.append(f"  scheduler     http://{settings.host}:{settings.scheduler_port}/docs")
    if data_plane == "haproxy":
        lines += ["", *triton_version_note(http, settings.grpc_upstream_reuse)]
    lines += [
        "",
        f"First prediction ({SAMPLE_MODEL_NAME}, bundled cat photo): " + ", ".join(
            f"{cls} {IMAGENET_CATS.get(cls, '')} p={p:.2f}".replace("  ", " ")
            for cls, p in top5
        ),
        "",
        "Try it:",
        f"  curl -s http://{http}/v2/models/{SAMPLE_MODEL_NAME} | python3 -m json.tool",
        "  python3 -c 'import json; print(json.dumps({\"inputs\": [{\"name\": \"input\", "
        "\"shape\": [1, 3, 224, 224], \"datatype\": \"FP32\", \"data\": [0.0] * 150528}]}))' \\",
        f"    | curl -s -X POST http://{http}/v2/models/{SAMPLE_MODEL_NAME}/infer "
        "-H 'Content-Type: application/json' --data-binary @- | head -c 300",
        "",
        "  .venv/bin/python - <<'EOF'",
        "  import tritonclient.grpc as grpcclient",
        "  from converters.samples import cat_input",
        f"  client = grpcclient.InferenceServerClient('{grpc}')",
        "  x = cat_input()  # [1, 3, 224, 224] FP32, see converters/images.py",
        "  inp = grpcclient.InferInput('input', list(x.shape), 'FP32')",
        "  inp.set_data_from_numpy(x)",
        f"  logits = client.infer('{SAMPLE_MODEL_NAME}', [inp]).as_numpy('logits')",
        "  print('top-1 ImageNet class:', logits[0].argmax())  # 281-285 are cats",
        "  EOF",
        "",
    ]
    print("\n".join(lines), flush=True)


def triton_version_note(http_url: str, setting: GrpcReuse) -> list[str]:
    """Once, at start: which Triton serves here and what that costs gRPC through
    HAProxy (the gateway decides per member; this is the local stack's one member)."""
    try:
        version = version_from_metadata(httpx.get(f"http://{http_url}/v2", timeout=10).json())
    except (httpx.HTTPError, ValueError):
        version = None
    mode = grpc_mode(version, setting)
    if has_fix(version):
        return [f"Triton {version} here: gRPC through the gateway shares connections "
                f"({mode.why})."]
    what = (f"Triton {version} here (all that installs on this machine) has"
            if parse_version(version) else
            "The Triton here reports no readable version; before 2.57.0 Triton has")
    cost = ("one gRPC request per connection to it: about half the gRPC throughput "
            "on small requests" if not mode.shared else
            "its gRPC connections are shared anyway: a broken or cancelled request can "
            "crash it")
    forced = f" ({mode.why})" if setting is not GrpcReuse.AUTO else ""
    return [f"{what} the gRPC cancellation race {RACE}, so {cost}{forced}.",
            f"  Production images run {FIXED_RELEASE}, which shares them "
            "(docker/, k8s/overlays/gpu-mig)."]


def _first_prediction(http_url: str) -> list[tuple[int, float]]:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(http_url)
    try:
        x = cat_input()
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        logits = client.infer(SAMPLE_MODEL_NAME, [inp]).as_numpy("logits")[0]
    finally:
        client.close()
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    top = np.argsort(probs)[::-1][:5]
    return [(int(i), float(probs[i])) for i in top]
