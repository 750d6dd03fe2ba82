"""bench_rules: its figures (pure), and its configurations rendered by this checkout and
answered by a real HAProxy as the benchmark expects: the rules' own answer, or the
stand-in member's, the tenant read where there is one."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from loadtests import bench_rules as br
from loadtests.bench_rules import Cell


def test_rows_give_tenancy_s_cost_and_each_checkout_against_the_first() -> None:
    figures = {}
    for source, scale in (("before", 1.0), ("this", 0.5)):
        for path, base in (("rules", 10.0), ("member", 20.0)):
            figures[Cell(source, "none", path)] = [base * scale, 99.0, base * scale]
            figures[Cell(source, "tenant", path)] = [2 * base * scale, 2 * base * scale, 0.0]
            figures[Cell(source, "queued", path)] = [3 * base * scale] * 3
    rows = br.rows_of(figures)
    assert [(r["source"], r["path"]) for r in rows] == [
        ("before", "rules"), ("before", "member"), ("this", "rules"), ("this", "member")]
    before_rules, _, this_rules, this_member = rows
    assert before_rules["none_us"] == 10.0 and before_rules["tenant_us"] == 20.0
    assert before_rules["tenancy_cost_us"] == 10.0 and before_rules["tenant_none_ratio"] == 2.0
    assert before_rules["queue_cost_us"] == 10.0 and before_rules["queued_none_ratio"] == 3.0
    assert "tenant_vs_before_ratio" not in before_rules
    assert this_rules["tenant_vs_before_ratio"] == 0.5
    assert this_member["none_vs_before_ratio"] == 0.5 and this_member["none_us"] == 10.0
    text = br.markdown(rows)
    assert "| this | member | 10.0 | 20.0 | 30.0 | +10.0 | +10.0 | 2.00x | 3.00x |" in text
    assert "| this | rules | 0.50x | 0.50x | 0.50x |" in text
    assert "medians of 3 rounds" in text


@pytest.mark.parametrize("arm", br.ARMS)
def test_each_configuration_is_valid_and_answered_as_measured(tmp_path: Path, arm: str) -> None:
    """Both paths of ``arm``: ``haproxy -c`` passes; a short measurement at a low rate
    has every request answered, and a request before and after it grpc-status 0 with
    the tenant the rules read (the rules' own ``return``, or through the member, whose
    health checks pass: marked down, it would be grpc-status 14)."""
    body = br.body_file(tmp_path)
    with br.member(tmp_path) as member:
        for path in br.PATHS:
            config = br.render(br.HERE, arm, path, tmp_path / path, member)
            checked = subprocess.run(["haproxy", "-c", "-f", str(config)],
                                     capture_output=True, text=True, check=False)
            assert checked.returncode == 0, checked.stdout + checked.stderr
            text = config.read_text()
            frontend = text.split("\nfrontend grpc\n", 1)[1].split("\nbackend ", 1)[0]
            answers_itself = "http-request return status 200 hdr grpc-status 0" in frontend
            assert answers_itself == (path == "rules")
            assert ("http-request set-var(txn.tn)" in frontend) == (arm != "none")
            assert ("set-priority-class" in frontend) == (arm == "queued")
            # one request before and one after answered grpc-status 0 with the tenant,
            # every one answered 200, or it raises (through the member, for longer than
            # two of its health checks); /proc counts CPU in 10 ms ticks, which a few
            # hundred requests may not fill
            seconds = 2.5 if path == "member" else 0.5
            assert br.measure(config, tmp_path, body, seconds, 200, arm != "none") >= 0.0
