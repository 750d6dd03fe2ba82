"""The conversion report: JSON (everything), Markdown (for people), PNG plots.

Answers "INT8 costs X% accuracy for Y times the speed here; is it worth it?":

- ``latency.png``: p50 latency (p99 dashed) against batch size, per variant;
- ``tradeoff.png``: speed-up over FP32 against accuracy loss, with the budget drawn in.

Rendering works on the report *dict*, so a stored ``report.json`` can be re-rendered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPORT_FILES = ("report.json", "report.md", "latency.png", "tradeoff.png")


def write_report(report: Mapping[str, Any], folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "report.json": folder / "report.json",
        "report.md": folder / "report.md",
        "latency.png": folder / "latency.png",
        "tradeoff.png": folder / "tradeoff.png",
    }
    files["report.json"].write_text(json.dumps(report, indent=2, sort_keys=False, default=str))
    files["report.md"].write_text(render_markdown(report))
    plot_latency(report, files["latency.png"])
    plot_tradeoff(report, files["tradeoff.png"])
    return files


def accuracy_loss(variant: Mapping[str, Any]) -> float | None:
    """Top-1 drop for classifiers, else 1 - cosine."""
    accuracy = variant.get("accuracy")
    if not accuracy:
        return None
    if accuracy.get("top1_drop") is not None:
        return float(accuracy["top1_drop"])
    return 1.0 - float(accuracy["cosine"])


def synthetic_warning(evaluation: Mapping[str, Any]) -> str | None:
    """The sentence every summary of a conversion verified on synthetic inputs carries."""
    if not evaluation.get("synthetic"):
        return None
    return (f"The variants were verified on {evaluation['samples']} synthetic inputs "
            f"(seed {evaluation['seed']}), not on real data: the accuracy figures say only "
            "that each variant computes the same function as the source model, not how "
            "accurate it is on real data.")


def render_markdown(report: Mapping[str, Any]) -> str:
    lines = [f"# Conversion report: {report['model']}", ""]
    chosen = report.get("chosen")
    evaluation = report["evaluation"]
    warning = synthetic_warning(evaluation)
    if warning:
        lines += [f"> **Synthetic evaluation.** {warning}", ""]
    lines += [
        f"- source: `{report['source']['location']}` ({report['source']['kind']}, "
        f"sha256 `{report['source']['sha256'][:16]}…`)",
        f"- target: **{report['target']}**; served variant: **{chosen}**",
        f"- budget: {_budget(report['budget'])}; evaluation: {_evaluation(evaluation)}"
        + (f"; calibration: {report['calibration']['samples']} samples from "
           f"`{report['calibration']['source']}`" if report.get("calibration") else ""),
        *(["- synthetic inputs:"] if evaluation.get("ranges") else []),
        *(f"  - `{r['name']}`: {_value_range(r)}" for r in evaluation.get("ranges") or ()),
        f"- serving: {report['serving']['reason']}" if report.get("serving") else "",
        _footprint(report.get("footprint")),
        "",
        "## Variants",
        "",
        "| variant | recipe | size MB | cosine | top-1 agree | top-5 agree | changed (undecided) "
        "| max abs err | b1 p50 ms | b1 p99 ms | best throughput /s | speed-up | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in report["variants"]:
        acc, prof = v.get("accuracy") or {}, v.get("profile") or {}
        timings = prof.get("timings") or []
        b1 = timings[0] if timings else {}
        best = max((t["throughput"] for t in timings), default=None)
        verdict = v.get("verdict") or {}
        mark = "**chosen**: " if verdict.get("chosen") else ""
        lines.append(
            f"| {v['name']} | {v.get('recipe', '')} | {v.get('size_bytes', 0) / 1e6:.1f} "
            f"| {_num(acc.get('cosine'), 5)} | {_num(acc.get('top1'), 3)}{_ci(acc)} "
            f"| {_num(acc.get('top5'), 3)} | {_flips(acc)} "
            f"| {_num(acc.get('max_abs_err'), 3, 'g')} "
            f"| {_num(b1.get('p50_ms'), 2)} | {_num(b1.get('p99_ms'), 2)} "
            f"| {_num(best, 1)} | {_num(v.get('speedup'), 2)}x "
            f"| {mark}{verdict.get('reason', v.get('failure', ''))} |"
        )
    lines += ["", "*top-1 agree*: with FP32, and its Wilson 95% interval. "
              "*changed (undecided)*: evaluation samples whose top-1 class differs from "
              "FP32, and how many of those FP32 itself barely decides (top-2 softmax margin "
              "under 5%).", "", "![latency](latency.png) ![trade-off](tradeoff.png)", ""]
    lines += _latency_table(report)
    for name, repair in (report.get("repairs") or {}).items():
        lines += [f"## Accuracy repair: {name}", "", repair["reason"], "",
                  "| float layers | float nodes | top-1 drop | cosine | misses |",
                  "|---|---|---|---|---|"]
        for it in repair["iterations"]:
            lines.append(f"| {it['float_layers']} | {it['float_nodes']} "
                         f"| {_num(it.get('top1_drop'), 4)} | {_num(it['cosine'], 5)} "
                         f"| {'; '.join(it['violations']) or 'meets the budget'} |")
        lines += ["", "Most sensitive layers (output noise removed when kept float):", ""]
        lines += [f"- `{s['layer']}` ({s['op_type']}): {s['score']:.3g}"
                  for s in repair["ranking"][:10]]
        lines.append("")
    lines += ["## Model", "", "```json", json.dumps(report.get("facts", {}), indent=1)[:2000],
              "```", "", "## Steps", "", "| step | state | seconds | detail |", "|---|---|---|---|"]
    for step in report.get("steps", []):
        lines.append(f"| {step['label']} | {step['state']} | {step['seconds']:.1f} "
                     f"| {_cell(step['detail'])} |")
    if report.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in report["notes"]]
    return "\n".join(lines) + "\n"


def _footprint(footprint: Mapping[str, Any] | None) -> str:
    if not footprint:
        return "- memory footprint: not measured (see the notes)"
    return (f"- memory footprint: {footprint['bytes'] / 2**20:.1f} MiB "
            f"({footprint['bytes']} bytes; {footprint['method']})")


def _evaluation(evaluation: Mapping[str, Any]) -> str:
    if evaluation.get("synthetic"):
        return f"{evaluation['samples']} synthetic samples (seed {evaluation['seed']})"
    return f"{evaluation['samples']} samples from `{evaluation['source']}`"


def _value_range(value_range: Mapping[str, Any]) -> str:
    bounds = value_range.get("range")
    if value_range["distribution"] == "uniform" and bounds:
        drawn = f"uniform in [{bounds[0]:.4g}, {bounds[1]:.4g}]"
    else:
        drawn = {"normal": "standard normal", "ones": "ones"}.get(
            value_range["distribution"], value_range["distribution"])
    return f"{drawn} ({value_range['reason']})"


def _ci(accuracy: Mapping[str, Any]) -> str:
    interval = accuracy.get("top1_ci95")
    return f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else ""


def _cell(text: str) -> str:
    """Whole text in one Markdown table cell (a failure's reason is never cut)."""
    return " ".join(text.split()).replace("|", "\\|")


def _flips(accuracy: Mapping[str, Any]) -> str:
    if accuracy.get("flips") is None:
        return "–"
    return f"{accuracy['flips']} ({accuracy['undecided_flips']})"


def _latency_table(report: Mapping[str, Any]) -> list[str]:
    profiled = [v for v in report["variants"] if v.get("profile")]
    if not profiled:
        return []
    batches = [t["batch"] for t in profiled[0]["profile"]["timings"]]
    lines = [f"## Latency (ms, p50 / p99) on {profiled[0]['profile']['provider']}", "",
             "| variant | " + " | ".join(f"b{b}" for b in batches) + " |",
             "|---|" + "---|" * len(batches)]
    for v in profiled:
        cells = [f"{t['p50_ms']:.2f} / {t['p99_ms']:.2f}" for t in v["profile"]["timings"]]
        lines.append(f"| {v['name']} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _budget(budget: Mapping[str, Any]) -> str:
    parts = []
    if budget.get("max_top1_drop") is not None:
        parts.append(f"top-1 drop <= {budget['max_top1_drop']:.2%}")
    if budget.get("min_cosine") is not None:
        parts.append(f"cosine >= {budget['min_cosine']}")
    return ", ".join(parts) or "none"


def _num(value: Any, digits: int, kind: str = "f") -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}{kind}}"


def plot_latency(report: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    for v in report["variants"]:
        timings = (v.get("profile") or {}).get("timings")
        if not timings:
            continue
        batches = [t["batch"] for t in timings]
        line = ax.plot(batches, [t["p50_ms"] for t in timings], marker="o",
                       label=f"{v['name']} p50")[0]
        ax.plot(batches, [t["p99_ms"] for t in timings], linestyle="--",
                color=line.get_color(), alpha=0.6)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("latency (ms), p99 dashed")
    ax.set_title(f"{report['model']}: latency per variant")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_tradeoff(report: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    classify = report.get("task") == "classification"
    for v in report["variants"]:
        loss, speedup = accuracy_loss(v), v.get("speedup")
        if loss is None or speedup is None:
            continue
        chosen = (v.get("verdict") or {}).get("chosen")
        ax.scatter([loss * 100], [speedup], s=90 if chosen else 50,
                   marker="*" if chosen else "o")
        ax.annotate(v["name"], (loss * 100, speedup), textcoords="offset points",
                    xytext=(6, 4))
    budget = report["budget"]
    limit = budget.get("max_top1_drop") if classify else (
        1.0 - budget["min_cosine"] if budget.get("min_cosine") is not None else None)
    if limit is not None:
        ax.axvline(limit * 100, color="red", linestyle=":", label="budget")
        ax.legend()
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.margins(x=0.2, y=0.15)  # room for the labels
    ax.set_xlabel("top-1 disagreement with FP32 (%)" if classify else "1 - cosine (%)")
    ax.set_ylabel("speed-up over FP32 (throughput)")
    ax.set_title(f"{report['model']}: speed-up vs accuracy loss")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
