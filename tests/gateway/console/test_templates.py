"""The model page's rollout section, rendered from real lifecycle records: every verdict
with its step, the admin's buttons only for an admin; and HTML in any text escaped."""

from __future__ import annotations

import time

from markupsafe import Markup

from gateway.auth import Principal, Scope
from gateway.console.pages import TEMPLATES
from gateway.console.session import Sessions
from gateway.lifecycle.records.jobs import ModelRecord, RolloutRecord, VersionRecord

HOSTILE = "<script>alert(1)</script>"


def _page(scope: Scope, state: str = "running") -> str:
    now = time.time()
    rollout = RolloutRecord(
        job_id="job-1", model="m", stable=1, candidate=2,
        spec={"steps": [10, 50, 100]}, state=state, started_at=now, updated_at=now,
        step=1, percent=50, detail=HOSTILE,
        decisions=({"at": now, "decision": "hold", "reason": "too few answers",
                    "step": 1, "percent": 10},
                   {"at": now, "decision": "promote", "reason": f"within bounds {HOSTILE}",
                    "step": 1, "percent": 10}))
    versions = [VersionRecord("m", v, s, "", now, "fp32") for v, s in ((2, "available"),
                                                                       (1, "serving"))]
    session = Sessions().open(Principal(scope.value, frozenset({scope})))
    row = {"accuracy": "–", "precision": "fp32", "rate": Markup(""), "latency": Markup("")}
    return TEMPLATES.get_template("model.html").render(
        session=session, model=ModelRecord("m", "serving", now, 1, None, ("local",), None,
                                           HOSTILE),
        versions=versions, shown=1, report=None, rollout=rollout, jobs=[], row=row,
        busy=True)


def test_rollout_shows_each_verdict_with_its_step_and_admin_controls() -> None:
    page = _page(Scope.ADMIN)
    assert "Rollout: v1 → v2" in page and "the candidate gets 50 %" in page
    assert "step 2 of 3" in page
    assert page.count("1 (10 %)") == 2 and "too few answers" in page
    assert 'action="/ui/models/m/rollout/pause"' in page
    assert 'action="/ui/models/m/rollout/abort"' in page
    assert "/rollout/resume" not in page
    assert "Serve v2" not in page  # no rollback while a rollout runs
    assert HOSTILE not in page and page.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 3
    assert "/rollout/resume" in _page(Scope.ADMIN, "paused")


def test_rollout_has_no_controls_for_an_upload_token() -> None:
    page = _page(Scope.UPLOAD)
    assert "too few answers" in page and "<button" in page  # sign out only
    assert "/rollout/" not in page and "/rollback" not in page and "/delete" not in page
