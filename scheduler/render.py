"""Pictures of a plan: every GPU's 8 memory slots, as terminal text, SVG and PNG.

Each instance spans its memory slots from its start slot, coloured by pool; idle
instances (kept to avoid a repartition) are grey; free slots are empty.
"""

from __future__ import annotations

import hashlib
import io
from xml.sax.saxutils import escape

from rich.console import Console
from rich.table import Table
from rich.text import Text

from scheduler.plan import GpuPlan, PlacementPlan, PoolOutcome
from scheduler.profiles import GPU_TYPES, MEMORY_SLOTS, WHOLE_DEVICE

PALETTE = (
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
    "#b07aa1", "#ff9da7", "#9c755f", "#17becf", "#bcbd22", "#8c564b",
)  # fmt: skip
IDLE = "#bab0ac"
CELL = 4  # characters per slot in the terminal picture


def pool_colour(pool: str) -> str:
    digest = int(hashlib.sha1(pool.encode()).hexdigest()[:8], 16)
    return PALETTE[digest % len(PALETTE)]


def _slot_bar(gpu: GpuPlan) -> Text:
    bar = Text()
    cursor = 0
    for inst in sorted(gpu.instances, key=lambda i: i.start):
        if inst.start > cursor:
            bar.append(" ·  " * (inst.start - cursor), style="dim")
        width = CELL * inst.memory_slices - 1
        label = (inst.pool or "idle")[:width].center(width)
        colour = pool_colour(inst.pool) if inst.pool else IDLE
        bar.append(label, style=f"bold black on {colour}")
        bar.append(" ")
        cursor = inst.start + inst.memory_slices
    if cursor < MEMORY_SLOTS:
        bar.append(" ·  " * (MEMORY_SLOTS - cursor), style="dim")
    return bar


def layout_table(plan: PlacementPlan, used_only: bool = False) -> Table:
    ruler = "".join(f"{s:<{CELL}}" for s in range(MEMORY_SLOTS))
    table = Table(title=f"{plan.id}: GPU memory slots", show_lines=False)
    table.add_column("GPU", no_wrap=True)
    table.add_column("type", no_wrap=True)
    table.add_column(ruler, no_wrap=True)
    table.add_column("profiles", no_wrap=True)
    table.add_column("repartition", no_wrap=True)
    table.add_column("largest free", no_wrap=True)
    for gpu in plan.gpus:
        if used_only and not gpu.used:
            continue
        profiles = ",".join(f"{i.profile}@{i.start}" for i in gpu.instances) or "-"
        table.add_row(
            gpu.key,
            gpu.gpu_type,
            _slot_bar(gpu),
            profiles,
            "yes" if gpu.repartition else "",
            gpu.largest_free or "-",
        )
    return table


def profile_label(outcome: PoolOutcome) -> str:
    """The profile as people read it (``3g.40gb``; ``3g.20gb/3g.71gb`` across GPU types;
    ``gpu`` for whole devices), not its id."""
    if outcome.profile_id is None:
        return "-"
    names = []
    for name in outcome.gpu_types:
        kind = GPU_TYPES.get(name)
        if kind is not None and (outcome.profile_id in kind.profiles or not kind.mig_capable):
            label = kind.profile_name(outcome.profile_id if kind.mig_capable else WHOLE_DEVICE)
            if label not in names:
                names.append(label)
    return "/".join(names) or f"profile {outcome.profile_id}"


def pools_table(plan: PlacementPlan) -> Table:
    table = Table(title="pools")
    for column in ("pool", "status", "profile", "replicas", "served/target req/s", "reason"):
        table.add_column(column)
    for p in plan.pools:
        style = {"placed": "green", "degraded": "yellow", "unplaced": "red"}.get(p.status, "")
        table.add_row(
            p.name,
            Text(p.status, style=style),
            profile_label(p),
            f"{p.replicas_placed}/{p.replicas_wanted}",
            f"{p.served_rps:.0f}/{p.target_rps:.0f}",
            "; ".join(p.reasons),
        )
    return table


def plan_text(plan: PlacementPlan, width: int = 160, used_only: bool = False) -> str:
    """The layout and pool tables as plain text (what the CLI prints, without colour)."""
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(layout_table(plan, used_only))
    console.print(pools_table(plan))
    return console.export_text()


SLOT_W, ROW_H, LABEL_W, PAD = 64, 30, 190, 10


def plan_svg(plan: PlacementPlan, used_only: bool = False) -> str:
    """One row per GPU, 8 slot columns; instances as labelled coloured bars."""
    gpus = [g for g in plan.gpus if g.used or not used_only]
    width = LABEL_W + MEMORY_SLOTS * SLOT_W + 2 * PAD
    height = (len(gpus) + 1) * ROW_H + 2 * PAD
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="monospace" font-size="11">',
        f"<title>{escape(plan.id)}: MIG layout</title>",
    ]
    for s in range(MEMORY_SLOTS):
        x = PAD + LABEL_W + s * SLOT_W + SLOT_W // 2
        out.append(f'<text x="{x}" y="{PAD + 18}" text-anchor="middle">slot {s}</text>')
    for row, gpu in enumerate(gpus, start=1):
        y = PAD + row * ROW_H
        label = f"{gpu.key} {gpu.gpu_type}{' *' if gpu.repartition else ''}"
        out.append(f'<g class="gpu" data-gpu="{escape(gpu.key)}">')
        out.append(f'<text x="{PAD}" y="{y + 18}">{escape(label)}</text>')
        for s in range(MEMORY_SLOTS):
            x = PAD + LABEL_W + s * SLOT_W
            out.append(
                f'<rect class="slot" x="{x}" y="{y + 2}" width="{SLOT_W}" height="{ROW_H - 4}" '
                f'fill="none" stroke="#999"/>'
            )
        for inst in gpu.instances:
            x = PAD + LABEL_W + inst.start * SLOT_W + 2
            w = inst.memory_slices * SLOT_W - 4
            fill = pool_colour(inst.pool) if inst.pool else IDLE
            text = f"{inst.pool or 'idle'} {inst.profile}"
            out.append(
                f'<rect class="instance" x="{x}" y="{y + 4}" width="{w}" height="{ROW_H - 8}" '
                f'rx="3" fill="{fill}"><title>{escape(text)} @ slot {inst.start}</title></rect>'
            )
            out.append(
                f'<text x="{x + w / 2}" y="{y + 19}" text-anchor="middle" '
                f'fill="#000">{escape(text[: max(3, w // 7)])}</text>'
            )
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def plan_png(plan: PlacementPlan, used_only: bool = False, dpi: int = 100) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    gpus = [g for g in plan.gpus if g.used or not used_only]
    fig, ax = plt.subplots(figsize=(10, 0.45 * max(1, len(gpus)) + 1.0), dpi=dpi)
    for row, gpu in enumerate(gpus):
        for inst in gpu.instances:
            colour = pool_colour(inst.pool) if inst.pool else IDLE
            ax.barh(row, inst.memory_slices, left=inst.start, color=colour, edgecolor="black")
            ax.text(
                inst.start + inst.memory_slices / 2, row, (inst.pool or "idle")[:14],
                ha="center", va="center", fontsize=7,
            )  # fmt: skip
    ax.set_yticks(range(len(gpus)), [f"{g.key} {g.gpu_type}" for g in gpus], fontsize=7)
    ax.set_xticks(range(MEMORY_SLOTS + 1))
    ax.set_xlim(0, MEMORY_SLOTS)
    ax.invert_yaxis()
    ax.set_xlabel("memory slot")
    ax.set_title(f"{plan.id}: MIG layout")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()
