from __future__ import annotations

import xml.etree.ElementTree as ET

from scheduler.plan import PlanRecord
from scheduler.planner import plan_placement
from scheduler.render import SLOT_W, plan_png, plan_svg, plan_text
from tests.scheduler.builders import gpu, node, pool, request

SVG = "{http://www.w3.org/2000/svg}"


def test_plan_svg_draws_eight_slots_per_gpu_when_rendered(example_record: PlanRecord) -> None:
    root = ET.fromstring(plan_svg(example_record.plan))
    groups = root.findall(f"{SVG}g")
    assert len(groups) == len(example_record.plan.gpus)
    for group, gpu_plan in zip(groups, example_record.plan.gpus, strict=True):
        assert group.get("data-gpu") == gpu_plan.key
        slots = [r for r in group.findall(f"{SVG}rect") if r.get("class") == "slot"]
        bars = [r for r in group.findall(f"{SVG}rect") if r.get("class") == "instance"]
        assert len(slots) == 8
        assert len(bars) == len(gpu_plan.instances)
        for bar, inst in zip(bars, gpu_plan.instances, strict=True):
            assert float(bar.get("width", 0)) == inst.memory_slices * SLOT_W - 4


def test_plan_svg_skips_idle_gpus_when_used_only(example_record: PlanRecord) -> None:
    root = ET.fromstring(plan_svg(example_record.plan, used_only=True))
    assert len(root.findall(f"{SVG}g")) == example_record.plan.metrics.gpus_used


def test_plan_text_shows_pools_and_idle_instances_when_printed() -> None:
    nodes = [node("n", [gpu(0, layout=[(9, 0, "web"), (9, 4, None)])])]
    plan = plan_placement(request(nodes, [pool("web", {9: 100})], objective="stability"))
    text = plan_text(plan)
    assert "web" in text and "idle" in text and "3g.40gb@0,3g.40gb@4" in text


def test_plan_png_is_a_png_when_rendered(example_record: PlanRecord) -> None:
    data = plan_png(example_record.plan, used_only=True)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_pools_table_names_profiles_when_printed() -> None:
    nodes = [node("a100", [gpu(0, "A100-40GB")]), node("h200", [gpu(0, "H200")])]
    spread = pool("spread", {9: 100}, target=200, constraints={"max_replicas_per_gpu": 1})
    text = plan_text(plan_placement(request(nodes, [spread])))
    pools_part = text[text.index("pools") :]
    row = next(line for line in pools_part.splitlines() if "spread" in line)
    assert "3g.20gb/3g.71gb" in row and " 9 " not in row
