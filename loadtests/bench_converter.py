"""Converter benchmark: what each INT8 technique buys on this machine, and what it costs.

    python -m loadtests.bench_converter [--per-photo 24] [--calib-per-photo 12] \
        [--iterations 30] [--quick] [--workdir DIR]

EfficientNet-Lite0 (real ImageNet weights), static INT8 (QDQ, U8S8: this CPU has AVX2
without VNNI), one row per technique and batch (1 and 8):

- plain: per-tensor weights, MinMax calibration (ONNX Runtime's defaults);
- cross-layer equalization (per-tensor; it only matters there), per-channel weights;
- the calibration method (MinMax, Entropy, Percentile), chosen by output noise on
  held-out *calibration* views (the evaluation set never chooses);
- bias correction (analytic, and empirical); AdaRound-style rounding; fewer calibration
  images (a quarter) against all of them;
- float fallback: the k layers ranked most sensitive (on calibration views) kept float,
  on top of the best recipe (bias correction + AdaRound-style rounding);
- FP16, as the reference for how much agreement mere rounding noise costs.

Calibration and evaluation views are crops/flips/rotations/colour changes of the
photographs bundled in installed packages (:mod:`converters.photos`, objects and scenes;
different seeds). Agreement is top-1 agreement with FP32 on every evaluation view, with
a Wilson 95% interval and a photo-level bootstrap interval (views of one photo are not
independent). Speed-ups: each distinct graph alternates run by run with FP32 (medians);
recipes that change only weights, biases or scales share their graph's timing.

MiniLM (all-MiniLM-L6-v2): the pipeline's INT8 for the encoder (dynamic, repaired) at
batch 1 and 8, with cosine similarity on held-out sentences.

``run(...) -> list[dict]`` is the ``make bench`` entry point; keys ending in ``ratio``
are the headline figures. Goal: >= 1.8x at >= 99% agreement.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from converters import graph, quantize, repair
from converters.confidence import photo_bootstrap, wilson
from converters.datasets import SampleSet, load_samples
from converters.images import EFFICIENTNET_LITE, image_files
from converters.metrics import AccuracyBudget, agreement, compare_outputs
from converters.minilm import SENTENCES, write_token_set
from converters.photos import OBJECT_PHOTOS, available_photos, photo_of, write_varied_views
from converters.pipeline import ConversionRequest, convert
from converters.quantize import Calibration, StaticInt8Recipe, StaticQuantizer
from converters.runtime import MIXED_PRECISION_DISABLED_OPTIMIZERS, RuntimeSettings, open_session
from converters.samples import export_efficientnet_lite0
from converters.spec import parse_input_spec
from loadtests.harness import figure, table

IMAGE_SPEC = parse_input_spec("input:float32[batch,3,224,224]")
TEXT_SPEC = parse_input_spec(
    "input_ids:int64[batch,sequence];attention_mask:int64[batch,sequence]")
BATCHES = (1, 8)
FALLBACK_LAYERS = (1, 2, 4, 8)


def run(per_photo: int = 24, calibration_per_photo: int = 12, iterations: int = 30,
        threads: int = 0, workdir: Path | None = None, minilm: bool = True,
        ) -> list[dict[str, Any]]:
    """Both models; one row per (model, technique, batch)."""
    with tempfile.TemporaryDirectory(prefix="bench_converter.") as tmp:
        root = workdir or Path(tmp)
        rows = _efficientnet(root / "effnet", per_photo, calibration_per_photo, iterations,
                             threads)
        if minilm:
            rows += _minilm(root / "minilm", iterations, threads)
    return rows


@dataclass(frozen=True)
class Technique:
    name: str
    path: Path
    disabled: tuple[str, ...] = ()
    float_layers: int = 0
    note: str = ""


@dataclass(frozen=True)
class Study:
    prepared: Path
    calibration: SampleSet
    holdout: SampleSet  # calibration views held out to choose the calibration method
    evaluation: SampleSet
    photos: tuple[str, ...]  # source photo of each evaluation view
    reference: np.ndarray
    threads: int
    folder: Path

    def quantized(self, name: str, recipe: StaticInt8Recipe,
                  samples: SampleSet | None = None) -> tuple[StaticQuantizer, Technique]:
        started = time.monotonic()
        quantizer = StaticQuantizer.calibrate(self.prepared, samples or self.calibration,
                                              recipe)
        path = self.folder / f"{name.replace(' ', '_').replace('/', '_')}.onnx"
        onnx.save(quantizer.quantize(), str(path))
        note = f"{recipe.describe()}; built in {time.monotonic() - started:.0f} s"
        if recipe.equalize:
            note += f"; {len(quantizer.equalized)} conv pairs equalized"
        return quantizer, Technique(name, path, note=note)


def _efficientnet(root: Path, per_photo: int, calibration_per_photo: int, iterations: int,
                  threads: int) -> list[dict[str, Any]]:
    study = _prepare(root, per_photo, calibration_per_photo, threads)
    techniques: list[Technique] = []
    per_tensor = StaticInt8Recipe(per_channel=False, bias_correction=False)
    techniques.append(study.quantized("plain (per-tensor, MinMax)", per_tensor)[1])
    techniques.append(study.quantized("per-tensor + CLE",
                                      replace(per_tensor, equalize=True))[1])
    per_channel = replace(per_tensor, per_channel=True)
    noise: dict[Calibration, float] = {}
    methods: tuple[Calibration, ...] = ("minmax", "entropy", "percentile")
    for method in methods:
        recipe = replace(per_channel, calibration=method)
        quantizer, technique = study.quantized(f"per-channel, {method}", recipe)
        noise[method] = _holdout_noise(study, quantizer)
        techniques.append(replace(technique, note=f"{technique.note}; calibration-holdout "
                                                  f"noise {noise[method]:.4f}"))
    best = min(noise, key=noise.__getitem__)
    corrected = replace(per_channel, calibration=best, bias_correction=True)
    quantizer, technique = study.quantized(f"per-channel, {best} + bias correction", corrected)
    techniques.append(replace(technique, note=f"{technique.note}; {best} chosen by "
                                              "calibration-holdout noise"))
    techniques.append(study.quantized(f"per-channel, {best} + BC + CLE",
                                      replace(corrected, equalize=True))[1])
    techniques.append(study.quantized(f"per-channel, {best} + empirical BC",
                                      replace(corrected, empirical_passes=8))[1])
    rounded = replace(corrected, adaround=True)
    quantizer, technique = study.quantized(f"per-channel, {best} + BC + AdaRound-style",
                                           rounded)
    techniques.append(technique)
    quarter = study.calibration.strided(max(8, len(study.calibration) // 4))
    techniques.append(study.quantized(
        f"per-channel, {best} + BC, {len(quarter)} calibration views", corrected, quarter)[1])
    techniques += _fallbacks(study, quantizer)
    fp16 = study.folder / "fp16.onnx"
    quantize.to_fp16(study.prepared, fp16)
    techniques.append(Technique("FP16 (reference: rounding noise alone)", fp16,
                                note="FP16 compute, FP32 inputs/outputs; not an INT8 variant"))
    return _measure(study, techniques, iterations)


def _prepare(root: Path, per_photo: int, calibration_per_photo: int,
             threads: int) -> Study:
    photos = available_photos(OBJECT_PHOTOS)
    calib_dir = write_varied_views(root / "calib", calibration_per_photo, 1000, photos)
    eval_dir = write_varied_views(root / "eval", per_photo, 0, photos)
    source = export_efficientnet_lite0(root / "effnet.onnx")
    evaluation = load_samples(eval_dir, IMAGE_SPEC, "evaluation", EFFICIENTNET_LITE)
    calibration_all = load_samples(calib_dir, IMAGE_SPEC, "calibration", EFFICIENTNET_LITE)
    held = set(range(0, len(calibration_all), 5))  # every 5th calibration view
    holdout = SampleSet("holdout", str(calib_dir),
                        tuple(s for i, s in enumerate(calibration_all.samples) if i in held))
    calibration = SampleSet("calibration", str(calib_dir), tuple(
        s for i, s in enumerate(calibration_all.samples) if i not in held))
    checked, _ = graph.simplify(source, root / "checked.onnx", evaluation.first_batch(2))
    prepared = quantize.prepare_for_quantization(checked, root / "prepared.onnx")
    folder = root / "variants"
    folder.mkdir(exist_ok=True)
    reference = _outputs(prepared, (), evaluation, threads)
    return Study(prepared, calibration, holdout, evaluation,
                 tuple(photo_of(p.stem) for p in image_files(eval_dir)), reference, threads,
                 folder)


def _holdout_noise(study: Study, quantizer: StaticQuantizer) -> float:
    settings = RuntimeSettings(intra_op_threads=study.threads)
    want = [{"y": _outputs(study.prepared, (), study.holdout, study.threads)}]
    got = [{"y": np.concatenate([open_session(quantizer.quantize().SerializeToString(),
                                              settings).run(None, b)[0]
                                 for b in study.holdout.batches(8)])}]
    return repair.output_noise(want, got)


def _fallbacks(study: Study, quantizer: StaticQuantizer) -> list[Technique]:
    """The best recipe with its k most sensitive layers kept float."""
    started = time.monotonic()
    settings = RuntimeSettings(intra_op_threads=study.threads)
    ranking = repair.static_sensitivity(
        quantizer.base_model(), quantizer.quantize_keep_activations(),
        study.calibration.strided(16), settings)
    useful = [r for r in ranking if r.score > 0]
    ranked_s = time.monotonic() - started
    techniques = []
    for k in FALLBACK_LAYERS:
        nodes = tuple(n for r in useful[:k] for n in r.nodes)
        path = study.folder / f"fallback_{k}.onnx"
        onnx.save(quantizer.quantize(nodes), str(path))
        layers = ", ".join(r.layer.removeprefix("/").split("/")[0] for r in useful[:k])
        techniques.append(Technique(
            f"+ {k} most sensitive layer(s) float", path, MIXED_PRECISION_DISABLED_OPTIMIZERS,
            k, f"ranked on 16 calibration views in {ranked_s:.0f} s: {layers}"))
    return techniques


def _measure(study: Study, techniques: Sequence[Technique],
             iterations: int) -> list[dict[str, Any]]:
    timing = _paired_timing(study, techniques, iterations)
    rows = []
    for technique in techniques:
        got = _outputs(technique.path, technique.disabled, study.evaluation, study.threads)
        agree = agreement(study.reference, got)
        matches = study.reference.argmax(axis=1) == got.argmax(axis=1)
        interval = wilson(int(matches.sum()), len(matches))
        clustered = photo_bootstrap(matches.tolist(), study.photos)
        for batch in BATCHES:
            rows.append({
                "model": "EfficientNet-Lite0", "variant": technique.name, "batch": batch,
                "fp32_p50_ms": timing[technique.name][batch][0],
                "int8_p50_ms": timing[technique.name][batch][1],
                "speedup_ratio": timing[technique.name][batch][0] /
                timing[technique.name][batch][1],
                "agreement": agree.top1, "ci_low": interval.low, "ci_high": interval.high,
                "photo_ci_low": clustered.low, "photo_ci_high": clustered.high,
                "top5_agreement": agree.top5, "decided_agreement": agree.decided_top1,
                "changed": agree.flips,
                "undecided": agree.undecided_flips,
                "cosine": compare_outputs(study.reference, got).mean_cosine,
                "samples": len(matches), "photos": len(set(study.photos)),
                "float_layers": technique.float_layers, "note": technique.note,
            })
    return rows


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


def _signature(technique: Technique) -> tuple[Any, ...]:
    """Models with the same nodes and tensor shapes run the same kernels: the recipes that
    only change weights, biases or scales (bias correction, rounding, calibration) share
    one timing, measured with more runs instead of several noisy ones."""
    model = onnx.load(str(technique.path))
    return (technique.disabled, tuple(n.op_type for n in model.graph.node),
            tuple(sorted((i.name, tuple(i.dims)) for i in model.graph.initializer)))


def _paired_timing(study: Study, techniques: Sequence[Technique],
                   iterations: int) -> dict[str, dict[int, tuple[float, float]]]:
    """Technique -> batch -> (FP32 ms, variant ms): each distinct graph is timed against
    FP32 alternating run by run (medians), so both see the same machine load; shared by
    every technique with that graph, with ``iterations`` runs per member."""
    groups: dict[tuple[Any, ...], list[Technique]] = {}
    for technique in techniques:
        groups.setdefault(_signature(technique), []).append(technique)
    timing: dict[str, dict[int, tuple[float, float]]] = {}
    for members in groups.values():
        first = members[0]
        pair = {"fp32": (study.prepared, ()), "variant": (first.path, first.disabled)}
        medians = _side_by_side(pair, study.evaluation, iterations * min(len(members), 3),
                                study.threads)
        for member in members:
            timing[member.name] = {b: (medians["fp32"][b], medians["variant"][b])
                                   for b in BATCHES}
    return timing


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
    cells = []
    for r in rows:
        speedup = f"{r['speedup_ratio']:.2f}x" if r.get("speedup_ratio") else "–"
        agree = (f"{r['agreement']:.1%} [{r['ci_low']:.1%}, {r['ci_high']:.1%}]"
                 if r.get("agreement") is not None else "–")
        photo = (f"[{r['photo_ci_low']:.1%}, {r['photo_ci_high']:.1%}]"
                 if r.get("photo_ci_low") is not None else "–")
        cosine = f"{r['cosine']:.4f}" if r.get("cosine") is not None else "–"
        decided = f"{r['decided_agreement']:.1%}" if r.get("decided_agreement") is not None \
            else "–"
        changed = f"{r['changed']} ({r['undecided']})" if r.get("changed") is not None else "–"
        cells.append((r["model"], r["variant"], r["batch"], f"{r.get('fp32_p50_ms', 0):.2f}",
                      f"{r.get('int8_p50_ms', 0):.2f}", speedup, agree, photo, decided, changed,
                      cosine, r.get("float_layers", "–"), r.get("note", "")))
    lines = [table(("model", "technique", "batch", "FP32 p50 ms", "INT8 p50 ms", "speed-up",
                    "top-1 agree [95% CI]", "photo-bootstrap CI", "decided views",
                    "changed (undecided)", "cosine", "float layers", "note"), cells)]
    effnet = next((r for r in rows if r["model"] == "EfficientNet-Lite0"), {})
    lines.append("")
    lines.append(f"EfficientNet: {effnet.get('samples', '?')} evaluation views of "
                 f"{effnet.get('photos', '?')} bundled photos (calibrated on other views); "
                 "*changed (undecided)*: views whose top-1 class differs from FP32, and how "
                 "many of those FP32 itself barely decides (top-2 margin < 5%); *decided views*: "
                 "agreement on the other views. Ratios are "
                 f"medians of interleaved runs on {os.cpu_count()} CPU cores (ONNX Runtime "
                 "CPU).")
    return "\n".join(lines)


def plot(rows: Sequence[Mapping[str, Any]], out_dir: Path) -> list[Path]:
    """Speed-up over FP32 per variant and batch, labelled with its agreement."""
    measured = [r for r in rows if r.get("speedup_ratio")]
    if not measured:
        return []
    labels = [f"{r['model'].split(' ')[0]}\n{r['variant'].split(' (')[0]}\nb{r['batch']}"
              for r in measured]
    path = out_dir / "bench_converter.png"
    with figure(path, figsize=(8, 4), dpi=100) as (_, ax):
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
    return [path]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-photo", type=int, default=24, help="evaluation views per photo")
    parser.add_argument("--calib-per-photo", type=int, default=12)
    parser.add_argument("--iterations", type=int, default=30, help="timed runs per batch")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0=all)")
    parser.add_argument("--quick", action="store_true", help="small sets, few iterations")
    parser.add_argument("--no-minilm", action="store_true", help="EfficientNet only")
    parser.add_argument("--workdir", type=Path, help="keep models and reports here")
    args = parser.parse_args(argv)
    if args.quick:
        args.per_photo, args.calib_per_photo, args.iterations = 4, 4, 8
    rows = run(args.per_photo, args.calib_per_photo, args.iterations, args.threads,
               args.workdir, minilm=not args.no_minilm)
    print(markdown(rows))
    if args.workdir is not None:
        plot(rows, args.workdir)


if __name__ == "__main__":
    main()
