"""The local stack behind ``make run``: sample model, Triton, gateway and scheduler.

Triton runs as a child process (see :mod:`infergate.triton.local`); the gateway and the
scheduler service run on this process's event loop. SIGINT/SIGTERM stop the gateway
(draining in-flight requests), then the scheduler, then Triton.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import uvicorn

from converters.samples import SAMPLE_MODEL_NAME, build_sample_model, cat_input
from gateway.pools import GatewayConfig, MemberSpec, PoolSpec
from gateway.server import EmbeddedServer, GatewaySettings, choose_data_plane, serve
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
    data_plane = choose_data_plane(settings.data_plane)
    gateway_settings = GatewaySettings(
        host=settings.host, http_port=settings.http_port, grpc_port=settings.grpc_port,
        data_plane=data_plane, haproxy_run_dir=(settings.log_dir / "haproxy").resolve(),
    )
    gateway = asyncio.create_task(
        serve(gateway_settings, GatewayConfig(pools=(pool,)), stop, started)
    )
    scheduler = _scheduler_server(settings)
    tasks: list[asyncio.Task[Any]] = [gateway]
    if scheduler is not None:
        tasks.append(asyncio.create_task(scheduler.serve()))
    await asyncio.wait({gateway, asyncio.create_task(started.wait())},
                       return_when=asyncio.FIRST_COMPLETED)
    if gateway.done():
        await gateway  # start-up failed: raise its error
    await asyncio.to_thread(_print_welcome, settings, scheduler is not None, data_plane)
    try:
        await gateway
    finally:
        stop.set()
        if scheduler is not None:
            scheduler.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)


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
        "Ctrl-C stops everything.",
    ]
    print("\n".join(lines), flush=True)


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
