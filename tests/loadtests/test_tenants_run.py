"""One run of ``bench_tenants`` straight at a member, for real: h2load's answers are the
counts (no gateway counts them), and the run ends with Triton's queue empty, so that the
next run does not wait behind its flood. Over HTTP: h2load cancels what it has in flight
at the end of a run, which over gRPC risks Triton 2.51's cancellation race
(server#8034) in the session's shared Triton."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from converters.tiny import TINY_MODEL_NAME
from infergate.triton.local import LocalTriton
from loadtests import bench_tenants as bt
from loadtests import tenants_figures as tf
from loadtests import tenants_run as tr
from loadtests.harness import page, totals
from loadtests.tenants_scenarios import TenantLoad

pytestmark = pytest.mark.integration


def test_a_run_at_the_member_counts_h2loads_answers_and_leaves_triton_idle(
        triton: LocalTriton, tmp_path: Path) -> None:
    if shutil.which("h2load") is None:
        pytest.fail("h2load not found: install Debian's nghttp2-client (make system-deps)")
    member = triton.endpoints
    assert member is not None
    [work] = bt.workloads(tmp_path, [TINY_MODEL_NAME])
    light = TenantLoad("light-critical", "critical", 2, 0.1)
    flood = TenantLoad("flood-sheddable", "sheddable", 4)
    run = tr.run_phase(member, work, "http", [light, flood], 1.0, tmp_path,
                       direct_per_s=200.0)
    for load in (light, flood):
        m = run[load.tenant]
        assert m.counted is not None and m.counted.source == tf.MEMBER_ANSWERS
        assert m.counted.succeeded == m.statuses[200] > 0 and m.counted.refused == 0
        assert not m.problem and m.gateway_buckets is None and m.queue_buckets is None
    assert run[light.tenant].offered_per_s == pytest.approx(20.0)
    assert tf.figures(run[flood.tenant]).admitted_per_s > tf.figures(
        run[light.tenant]).admitted_per_s
    pending = totals(page(member.metrics_url), tr.PENDING, "model")
    assert sum(pending.values()) == 0
