"""Converter benchmark: what INT8 buys on this machine, and what it costs in accuracy.

    python -m loadtests.bench_converter [--views 50] [--iterations 40] [--quick]

Runs the real pipeline (``converters.pipeline.convert``) and then measures, side by side
in one run (interleaved iterations, medians), FP32 against:

- EfficientNet-Lite0 (real ImageNet weights): plain static INT8 (U8S8, per-channel,
  MinMax), the pipeline's INT8 (the same plus bias correction) and, when repair found
  one, the mixed-precision INT8 it would publish; at batch 1 and 8, with top-1 agreement
  on crops/flips of the bundled photographs (calibrated on other crops);
- MiniLM (all-MiniLM-L6-v2): the pipeline's INT8 for the encoder (dynamic, repaired)
  at batch 1 and 8, with cosine similarity on held-out sentences.

Prints a Markdown table. ``run(...) -> list[dict]`` is the ``make bench`` entry point;
keys ending in ``ratio`` are the headline figures. Goal: >= 1.8x at >= 99% agreement.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from converters.datasets import SampleSet, load_samples
from converters.images import EFFICIENTNET_LITE, SAMPLE_PHOTOS
from converters.metrics import AccuracyBudget, agreement, compare_outputs
from converters.minilm import SENTENCES, write_token_set
from converters.pipeline import ConversionRequest, convert
from converters.quantize import StaticInt8Recipe, StaticQuantizer
from converters.runtime import MIXED_PRECISION_DISABLED_OPTIMIZERS, RuntimeSettings, open_session
from converters.samples import export_efficientnet_lite0, write_photo_views
from converters.spec import parse_input_spec

IMAGE_SPEC = parse_input_spec("input:float32[batch,3,224,224]")
TEXT_SPEC = parse_input_spec(
    "input_ids:int64[batch,sequence];attention_mask:int64[batch,sequence]")
BATCHES = (1, 8)


def run(views: int = 50, calibration_views: int = 8, iterations: int = 40,
        threads: int = 0, workdir: Path | None = None) -> list[dict[str, Any]]:
    """Both models; one row per (model, variant, batch)."""
    with tempfile.TemporaryDirectory(prefix="bench_converter.") as tmp:
        root = workdir or Path(tmp)
        rows = _efficientnet(root / "effnet", views, calibration_views, iterations, threads)
        rows += _minilm(root / "minilm", iterations, threads)
    return rows


def _efficientnet(root: Path, views: int, calibration_views: int, iterations: int,
                  threads: int) -> list[dict[str, Any]]:
    calibration = write_photo_views(root / "calib", SAMPLE_PHOTOS, calibration_views, seed=1000)
    evaluation = write_photo_views(root / "eval", SAMPLE_PHOTOS, views, seed=0)
    source = export_efficientnet_lite0(root / "effnet.onnx")
    work = root / "work"
    started = time.monotonic()
    result = convert(ConversionRequest(
        source=str(source), name="effnet", repo=root / "repo", precisions=("fp32", "int8"),
        calibration=calibration, evaluation=evaluation, preprocessing=EFFICIENTNET_LITE,
        budget=AccuracyBudget(max_top1_drop=0.01, min_cosine=0.99), max_batch_size=8,
        profile_iterations=10, intra_op_threads=threads, keep_workdir=work,
    ))
    seconds = time.monotonic() - started
    samples = load_samples(evaluation, IMAGE_SPEC, "evaluation", EFFICIENTNET_LITE)
    plain = _plain_int8(work, calibration)
    variants = {"fp32": (work / "fp32.onnx", ()), "int8 plain": (plain, ()),
                "int8 bias-corrected": (work / "int8.onnx", ())}
    repaired = work / "int8.repaired.onnx"
    if repaired.is_file():
        variants["int8 repaired"] = (repaired, MIXED_PRECISION_DISABLED_OPTIMIZERS)
    quality = {name: _top1(path, disabled, samples, threads)
               for name, (path, disabled) in variants.items()}
    timing = _side_by_side(variants, samples, iterations, threads)
    int8 = next(v for v in result.report["variants"] if v["name"] == "int8")
    repair = result.report["repairs"].get("int8", {})
    rows = []
    for name in variants:
        if name == "fp32":
            continue
        for batch in BATCHES:
            rows.append({
                "model": "EfficientNet-Lite0", "variant": name, "batch": batch,
                "fp32_p50_ms": timing["fp32"][batch], "int8_p50_ms": timing[name][batch],
                "speedup_ratio": timing["fp32"][batch] / timing[name][batch],
                "agreement": quality[name]["top1"], "top5_agreement": quality[name]["top5"],
                "changed": quality[name]["flips"], "undecided": quality[name]["undecided"],
                "cosine": quality[name]["cosine"], "samples": len(samples),
                "float_layers": len(int8["float_nodes"]) if name == "int8 repaired" else 0,
                "published": result.chosen, "note": repair.get("reason", ""),
                "pipeline_s": seconds,
            })
    return rows


def _plain_int8(work: Path, calibration: Path) -> Path:
    """Static INT8 as ONNX Runtime makes it, without the pipeline's bias correction."""
    import onnx

    samples = load_samples(calibration, IMAGE_SPEC, "calibration", EFFICIENTNET_LITE)
    quantizer = StaticQuantizer.calibrate(work / "prepared.onnx", samples,
                                          StaticInt8Recipe(bias_correction=False))
    target = work / "int8.plain.onnx"
    onnx.save(quantizer.quantize(), str(target))
    return target


def _minilm(root: Path, iterations: int, threads: int) -> list[dict[str, Any]]:
    calibration = write_token_set(root / "calib", SENTENCES[:32], lengths=(16, 32, 64))
    evaluation = write_token_set(root / "eval", SENTENCES[32:], lengths=(24, 48, 64))
    work = root / "work"
    started = time.monotonic()
    result = convert(ConversionRequest(
        source="converters.minilm:sentence_encoder", name="minilm", repo=root / "repo",
        precisions=("fp32", "int8"), calibration=calibration, evaluation=evaluation,
        budget=AccuracyBudget(max_top1_drop=None, min_cosine=0.99), max_batch_size=8,
        profile_iterations=10, intra_op_threads=threads, keep_workdir=work,
    ))
    seconds = time.monotonic() - started
    samples = load_samples(evaluation, TEXT_SPEC, "evaluation")
    within = sorted((v for v in result.report["variants"] if v["precision"] == "int8"
                     and (v.get("verdict") or {}).get("within_budget")),
                    key=lambda v: -v["profile"]["speed"])
    if not within:
        return [{"model": "MiniLM-L6", "variant": "int8", "batch": b, "speedup_ratio": None,
                 "note": "no INT8 variant within the budget"} for b in BATCHES]
    int8 = within[0]
    name = int8["name"]
    rows: list[dict[str, Any]] = []
    path = work / f"{name}.repaired.onnx"
    path = path if path.is_file() else work / f"{name}.onnx"
    disabled = tuple(int8.get("disabled_optimizers", ()))
    variants = {"fp32": (work / "fp32.onnx", ()), name: (path, disabled)}
    long = SampleSet("evaluation", samples.source,
                     tuple(s for s in samples.samples if s["input_ids"].shape[0] == 64))
    timing = _side_by_side(variants, long, iterations, threads)
    cosine = _cosines(variants, samples, threads)
    for batch in BATCHES:
        rows.append({
            "model": "MiniLM-L6 (seq 64)", "variant": f"{name} ({int8['recipe']})",
            "batch": batch, "fp32_p50_ms": timing["fp32"][batch],
            "int8_p50_ms": timing[name][batch],
            "speedup_ratio": timing["fp32"][batch] / timing[name][batch],
            "cosine": cosine["mean"], "min_cosine": cosine["min"], "samples": len(samples),
            "float_layers": len(int8["float_nodes"]), "published": result.chosen,
            "note": result.report["repairs"].get(name, {}).get("reason", ""),
            "pipeline_s": seconds,
        })
    return rows


def _runtime(disabled: Sequence[str], threads: int) -> RuntimeSettings:
    return RuntimeSettings(intra_op_threads=threads, disabled_optimizers=tuple(disabled))


def _outputs(path: Path, disabled: Sequence[str], samples: SampleSet,
             threads: int) -> np.ndarray:
    session = open_session(path, _runtime(disabled, threads))
    return np.concatenate([session.run(None, batch)[0] for batch in samples.batches(8)])


def _top1(path: Path, disabled: Sequence[str], samples: SampleSet,
          threads: int) -> dict[str, float]:
    reference = _outputs(path.with_name("fp32.onnx"), (), samples, threads)
    got = _outputs(path, disabled, samples, threads)
    result = agreement(reference, got)
    return {"top1": result.top1, "top5": result.top5, "flips": result.flips,
            "undecided": result.undecided_flips,
            "cosine": compare_outputs(reference, got).mean_cosine}


def _cosines(variants: Mapping[str, tuple[Path, Sequence[str]]], samples: SampleSet,
             threads: int) -> dict[str, float]:
    (ref_path, _), (path, disabled) = variants["fp32"], list(variants.values())[1]
    reference = _outputs(ref_path, (), samples, threads)
    stats = compare_outputs(reference, _outputs(path, disabled, samples, threads))
    return {"mean": stats.mean_cosine, "min": stats.min_cosine}


def _side_by_side(variants: Mapping[str, tuple[Path, Sequence[str]]], samples: SampleSet,
                  iterations: int, threads: int) -> dict[str, dict[int, float]]:
    """Median ms per variant and batch; variants interleaved iteration by iteration."""
    sessions = {n: open_session(p, _runtime(d, threads)) for n, (p, d) in variants.items()}
    medians: dict[str, dict[int, float]] = {n: {} for n in sessions}
    for batch in BATCHES:
        feeds = samples.first_batch(batch)
        times: dict[str, list[float]] = {n: [] for n in sessions}
        for session in sessions.values():
            for _ in range(3):
                session.run(None, feeds)
        names = list(sessions)
        for i in range(iterations):
            for name in names[i % len(names):] + names[: i % len(names)]:
                start = time.perf_counter()
                sessions[name].run(None, feeds)
                times[name].append(time.perf_counter() - start)
        for name, seconds in times.items():
            medians[name][batch] = float(np.median(seconds) * 1000)
    return medians


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = ["| model | variant | batch | FP32 p50 ms | INT8 p50 ms | speed-up | top-1 agree "
             "| changed (undecided) | cosine | float layers | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        speedup = f"{r['speedup_ratio']:.2f}x" if r.get("speedup_ratio") else "–"
        agree = f"{r['agreement']:.1%}" if r.get("agreement") is not None else "–"
        cosine = f"{r['cosine']:.4f}" if r.get("cosine") is not None else "–"
        changed = f"{r['changed']} ({r['undecided']})" if r.get("changed") is not None else "–"
        lines.append(
            f"| {r['model']} | {r['variant']} | {r['batch']} | {r.get('fp32_p50_ms', 0):.2f} "
            f"| {r.get('int8_p50_ms', 0):.2f} | {speedup} | {agree} | {changed} | {cosine} "
            f"| {r.get('float_layers', '–')} | {str(r.get('note', ''))[:90]} |")
    extra = rows[0] if rows else {}
    lines.append("")
    lines.append(f"EfficientNet: {extra.get('samples', '?')} evaluation views of "
                 f"{len(SAMPLE_PHOTOS)} bundled photos; *changed (undecided)*: views whose "
                 "top-1 class differs from FP32, and how many of those FP32 itself barely "
                 "decides (top-2 margin < 5%). Ratios are medians of interleaved runs on "
                 f"{os.cpu_count()} CPU cores (ONNX Runtime CPU).")
    return "\n".join(lines)


def plot(rows: Sequence[Mapping[str, Any]], out_dir: Path) -> list[Path]:
    """Speed-up over FP32 per variant and batch, labelled with its agreement."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in rows if r.get("speedup_ratio")]
    if not measured:
        return []
    fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
    labels = [f"{r['model'].split(' ')[0]}\n{r['variant'].split(' (')[0]}\nb{r['batch']}"
              for r in measured]
    bars = ax.bar(range(len(measured)), [r["speedup_ratio"] for r in measured])
    for bar, r in zip(bars, measured, strict=True):
        quality = f"{r['agreement']:.1%} top-1" if r.get("agreement") is not None \
            else f"cos {r['cosine']:.4f}"
        ax.annotate(quality, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=7)
    ax.axhline(1.8, color="red", linestyle=":", label="goal 1.8x")
    ax.set_xticks(range(len(measured)), labels, fontsize=7)
    ax.set_ylabel("speed-up over FP32 (median p50)")
    ax.legend()
    fig.tight_layout()
    path = out_dir / "bench_converter.png"
    fig.savefig(path)
    plt.close(fig)
    return [path]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--views", type=int, default=50, help="evaluation crops per photo")
    parser.add_argument("--calibration-views", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=40, help="timed runs per batch")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0=all)")
    parser.add_argument("--quick", action="store_true", help="small sets, few iterations")
    parser.add_argument("--workdir", type=Path, help="keep models and reports here")
    args = parser.parse_args(argv)
    if args.quick:
        args.views, args.calibration_views, args.iterations = 8, 4, 10
    rows = run(args.views, args.calibration_views, args.iterations, args.threads, args.workdir)
    print(markdown(rows))
    if args.workdir is not None:
        plot(rows, args.workdir)


if __name__ == "__main__":
    main()
