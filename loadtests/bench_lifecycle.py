"""Model lifecycle benchmark: upload-to-first-prediction, the first request after an idle
spell with and without keep-warm, and predict latency while a conversion runs.

One real Triton (explicit model control, empty repository) behind one real gateway with
the lifecycle enabled. EfficientNet-Lite0 (real weights) is uploaded over HTTP twice,
as ``effnet_keepwarm`` (keep-warm policy) and ``effnet_cold`` (none), FP32, evaluated
on crops of the bundled photos.

1. **Upload to first prediction**: from the first byte of the upload to the first
   successful inference through the gateway (convert, publish, load, warm, route).
2. **First request after an idle spell**: per round, the steady p50 of each model
   (``--steady`` back-to-back requests), then ``--idle-s`` seconds with no inference
   request (the client keeps its own connection busy with health probes), then one
   request to each (order alternating). Ratio = first / steady p50, median over rounds.
   Goal: <= 1.5x with keep-warm. Both models are served with max batch 1, so the
   dynamic batcher adds no queue delay to a lone request.
3. **Predict p99 while a conversion runs**: closed-loop requests to
   ``effnet_keepwarm`` for ``--predict-s`` seconds with nothing else running, then
   while a third upload (FP32 + INT8, calibration and repair) converts in its worker.

    python -m loadtests.bench_lifecycle [--rounds 5] [--idle-s 10] [--predict-s 20]

``--split``: the Kubernetes shape instead (one control plane, two data-plane replicas,
HAProxy + agent each): upload through replica A, time to the first prediction through
replica B, and predict p99 through B quiet vs while the control plane converts. (On one
2-core machine the conversion still shares the cores with serving; on a cluster the
control plane runs on its own CPU nodes.)
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from converters.images import EFFICIENTNET_LITE, SAMPLE_PHOTOS, augmented_views, load_image
from converters.images import sample_photo as photo_path
from converters.samples import INPUT_NAME
from gateway.lifecycle.client import JobTimeout, LifecycleClient
from infergate.processes import run_agent
from infergate.triton.local import TritonEndpoints
from loadtests.harness import (
    gateway,
    gateway_yaml,
    median,
    page,
    percentile,
    sample_model_dir,
    stack,
    table,
    totals,
    triton,
)

WARM, COLD, HEAVY = "effnet_keepwarm", "effnet_cold", "effnet_int8"
# On these (virtualised, shared) machines a model left alone answers its next request
# late even direct to Triton, more so the longer the pause (the tiny model: ~1 ms
# steady, 3-7 ms after 0.2 s idle, ~10 ms after 1 s, 50-80 ms after 4 s): the keep-warm
# interval has to be well under a second to matter here.
KEEP_WARM = {"interval_s": 0.1, "idle_after_s": 0.5, "batch_sizes": [1]}
CLIENT_PING_S = 0.01


def _samples(count: int, seed: int) -> bytes:
    images: list[np.ndarray] = []
    for index, name in enumerate(SAMPLE_PHOTOS):
        views = augmented_views(load_image(photo_path(name)), count // len(SAMPLE_PHOTOS) + 1,
                                seed + index)
        images.extend(EFFICIENTNET_LITE(v) for v in views)
    out = io.BytesIO()
    arrays = {INPUT_NAME: np.stack(images[:count]).astype(np.float32)}
    np.savez(out, **arrays)  # type: ignore[arg-type]
    return out.getvalue()


def _spec(precisions: list[str], keep_warm: bool, max_batch_size: int = 8) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "inputs": [{"name": INPUT_NAME, "datatype": "FP32", "shape": ["batch", 3, 224, 224]}],
        "precisions": precisions, "max_batch_size": max_batch_size, "profile_iterations": 5,
        "accuracy_budget": {"max_top1_drop": 0.05, "min_cosine": 0.98},
    }
    if keep_warm:
        spec["keep_warm"] = KEEP_WARM
    return spec


def lifecycle_config(repo: Path) -> Callable[[Path, TritonEndpoints], Path]:
    """A gateway with the lifecycle over ``repo`` (no tokens: uploads open)."""
    return lambda path, member: gateway_yaml(path, {"local": [member]}, lifecycle=repo)


def _upload(client: LifecycleClient, name: str, model: Path, spec: dict[str, Any],
            evaluation: bytes, calibration: bytes | None = None) -> str:
    return str(client.upload(name, model, spec, evaluation=evaluation,
                             calibration=calibration)["id"])


def _warmup_requests(url: str) -> dict[str, float]:
    """Warm-up-labelled requests the gateway counted, by model."""
    return totals(page(f"{url}/metrics"), "infergate_requests_total", "model",
                  traffic="warmup")


def _infer_body() -> bytes:
    x = EFFICIENTNET_LITE(load_image(photo_path("chelsea")))[None].astype(np.float32)
    header = json.dumps({"inputs": [{"name": INPUT_NAME, "shape": list(x.shape),
                                     "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]})
    return header.encode() + x.tobytes()


class Predictor:
    def __init__(self, url: str) -> None:
        self.client = httpx.Client(base_url=url, timeout=60, trust_env=False)
        body = _infer_body()
        self.body = body
        self.header_len = str(len(body) - 3 * 224 * 224 * 4)

    def once(self, model: str) -> float:
        t0 = time.perf_counter()
        resp = self.client.post(f"/v2/models/{model}/infer", content=self.body, headers={
            "inference-header-content-length": self.header_len,
            "content-type": "application/octet-stream"})
        elapsed = (time.perf_counter() - t0) * 1e3
        if resp.status_code != 200:
            raise RuntimeError(f"{model}: {resp.status_code} {resp.text[:200]}")
        return elapsed

    def closed_loop(self, model: str, seconds: float) -> list[float]:
        deadline = time.monotonic() + seconds
        latencies = []
        while time.monotonic() < deadline:
            latencies.append(self.once(model))
        return latencies


def upload_to_first_prediction(client: LifecycleClient, predictor: Predictor, model: Path,
                               name: str, keep_warm: bool, evaluation: bytes) -> float:
    started = time.perf_counter()
    # max batch 1: no dynamic-batching queue delay, so "steady" is the model's own time
    # (a lone request otherwise waits max_queue_delay, which the converter sets to the
    # batch-1 p50 when no latency budget is given)
    job_id = _upload(client, name, model, _spec(["fp32"], keep_warm, max_batch_size=1),
                     evaluation)
    while True:
        try:
            predictor.once(name)
            return time.perf_counter() - started
        except RuntimeError:
            job = client.job(job_id)
            if job["state"] == "failed":
                raise RuntimeError(f"{name}: {job['error']}") from None
            time.sleep(0.05)


def idle_round(predictor: Predictor, idle_s: float, steady: int, order: tuple[str, ...]
               ) -> dict[str, tuple[float, float]]:
    """The models idle, the client does not: it probes ``/v2/health/live`` every 10 ms on
    the same connection, as a client host busy with other traffic would, so what cools
    down is the model's path (gateway upstream, Triton, backend), not the client."""
    p50 = {m: percentile([predictor.once(m) for _ in range(steady)], 50) for m in order}
    deadline = time.monotonic() + idle_s
    while time.monotonic() < deadline:
        predictor.client.get("/v2/health/live")
        time.sleep(CLIENT_PING_S)
    first = {m: predictor.once(m) for m in order}
    return {m: (first[m], p50[m]) for m in order}


def predict_during_conversion(client: LifecycleClient, predictor: Predictor, model: Path,
                              seconds: float, evaluation: bytes, calibration: bytes
                              ) -> dict[str, Any]:
    quiet = predictor.closed_loop(WARM, seconds)
    job_id = _upload(client, HEAVY, model, _spec(["fp32", "int8"], False), evaluation,
                     calibration)
    busy: list[float] = []  # only while the worker converts (not during load/warm-up)
    while client.job(job_id)["state"] in ("queued", "converting"):
        busy.extend(predictor.closed_loop(WARM, 1.0))
    try:
        job = client.wait(job_id, timeout_s=900)
    except JobTimeout as late:
        job = late.job
    return {"quiet": quiet, "busy": busy, "job": job}


@contextmanager
def lifecycle_stack(folder: Path) -> Iterator[tuple[str, Path]]:
    repo = folder / "repo"
    repo.mkdir()
    with stack(folder, repo, config=lifecycle_config(repo)) as st:
        yield st.url, repo


def run(rounds: int = 5, idle_s: float = 10.0, steady: int = 30,
        predict_s: float = 20.0) -> list[dict[str, Any]]:
    model = sample_model_dir() / "1" / "model.onnx"
    evaluation, calibration = _samples(24, seed=1), _samples(48, seed=100)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, lifecycle_stack(Path(tmp)) as (url, _):
        client = LifecycleClient(url)
        predictor = Predictor(url)
        for name, keep in ((WARM, True), (COLD, False)):
            seconds = upload_to_first_prediction(client, predictor, model, name, keep,
                                                 evaluation)
            print(f"[bench_lifecycle] {name}: upload -> first prediction {seconds:.1f} s",
                  flush=True)
            rows.append({"figure": "upload -> first prediction", "model": name,
                         "value": round(seconds, 1), "unit": "s"})
        ratios: dict[str, list[float]] = {WARM: [], COLD: []}
        for r in range(rounds):
            order = (WARM, COLD) if r % 2 == 0 else (COLD, WARM)
            result = idle_round(predictor, idle_s, steady, order)
            for m, (first, p50) in result.items():
                ratios[m].append(first / p50)
                print(f"[bench_lifecycle] round {r + 1} {m}: first {first:.1f} ms, "
                      f"steady p50 {p50:.1f} ms, ratio {first / p50:.2f}x", flush=True)
        warmups = _warmup_requests(url)
        for name, label in ((WARM, "with keep-warm"), (COLD, "without keep-warm")):
            rows.append({"figure": f"first request after {idle_s:g} s idle / steady p50",
                         "model": f"{name} ({label}; {warmups.get(name, 0):.0f} warmup-"
                                  "labelled requests incl. the deploy's)",
                         "value": round(median(ratios[name]), 2),
                         "unit": "x", "rounds": [round(x, 2) for x in ratios[name]]})
        during = predict_during_conversion(client, predictor, model, predict_s, evaluation,
                                           calibration)
        for key, label in (("quiet", "no conversion"), ("busy", "conversion running")):
            values = during[key]
            rows.append({"figure": f"predict p99 ({label})", "model": WARM,
                         "value": round(percentile(values, 99), 1), "unit": "ms",
                         "p50_ms": round(percentile(values, 50), 1), "requests": len(values)})
        job = during["job"]
        rows.append({"figure": "FP32+INT8 conversion job", "model": HEAVY,
                     "value": round((job.get("finished_at") or time.time())
                                    - job["created_at"], 1),
                     "unit": "s", "state": job["state"], "error": job.get("error")})
        client.close()
    return rows


def run_split(predict_s: float = 20.0) -> list[dict[str, Any]]:
    model = sample_model_dir() / "1" / "model.onnx"
    evaluation, calibration = _samples(24, seed=1), _samples(48, seed=100)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        repo = folder / "repo"
        repo.mkdir()
        with triton(repo, folder, ()) as member:
            config = lifecycle_config(repo)(folder / "gateway.yaml", member)
            with gateway(config, folder / "control", data_plane="python") as control, \
                    run_agent(control, folder / "a") as a, run_agent(control, folder / "b") as b:
                client = LifecycleClient(f"http://{a.http_url}")
                predictor = Predictor(f"http://{b.http_url}")
                seconds = upload_to_first_prediction(client, predictor, model, WARM, False,
                                                     evaluation)
                print(f"[bench_lifecycle] split: upload via A -> first prediction via B "
                      f"{seconds:.1f} s", flush=True)
                rows.append({"figure": "upload via replica A -> first prediction via B",
                             "model": WARM, "value": round(seconds, 1), "unit": "s"})
                during = predict_during_conversion(client, predictor, model, predict_s,
                                                   evaluation, calibration)
                for key, label in (("quiet", "no conversion"),
                                   ("busy", "conversion running on the control plane")):
                    values = during[key]
                    rows.append({"figure": f"predict p99 via replica B ({label})",
                                 "model": WARM, "value": round(percentile(values, 99), 1),
                                 "unit": "ms", "p50_ms": round(percentile(values, 50), 1),
                                 "requests": len(values)})
                client.close()
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    def value(row: dict[str, Any]) -> str:
        extra = ""
        if "p50_ms" in row:
            extra = f" (p50 {row['p50_ms']} ms, {row['requests']} requests)"
        if "rounds" in row:
            extra = f" (rounds {row['rounds']})"
        if row.get("state"):
            extra = f" ({row['state']}{': ' + row['error'] if row.get('error') else ''})"
        return f"{row['value']} {row['unit']}{extra}"

    return table(("figure", "model", "value"),
                 ((row["figure"], row["model"], value(row)) for row in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--steady", type=int, default=30)
    parser.add_argument("--predict-s", type=float, default=20.0)
    parser.add_argument("--split", action="store_true",
                        help="control plane + two data-plane replicas (see above)")
    args = parser.parse_args()
    if args.split:
        print(markdown(run_split(args.predict_s)))
        return
    print(markdown(run(args.rounds, args.idle_s, args.steady, args.predict_s)))


if __name__ == "__main__":
    main()
