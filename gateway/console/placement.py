"""The scheduler as the console sees it: its newest placement plan and that plan's
picture (GPUs x memory slots, coloured by pool), read over the scheduler's HTTP API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class LatestPlan:
    id: str
    created_at: str
    plan: dict[str, Any]  # the scheduler's PlacementPlan as JSON


class PlacementUnavailable(Exception):
    """The scheduler did not answer as expected (said on the page, not raised to it)."""


class SchedulerPlans:
    def __init__(self, url: str, client: httpx.AsyncClient) -> None:
        self.url, self._client = url.rstrip("/"), client

    async def latest(self) -> LatestPlan | None:
        """The newest plan the scheduler keeps, or None when it has none yet."""
        listed = await self._get("/v1/plans", params={"limit": 1})
        plans = listed.json().get("plans") or []
        if not plans:
            return None
        plan_id = str(plans[0]["id"])
        plan = (await self._get(f"/v1/plans/{plan_id}")).json()
        return LatestPlan(plan_id, str(plans[0].get("created_at", "")), plan)

    async def svg(self, plan_id: str) -> bytes:
        return (await self._get(f"/v1/plans/{plan_id}/layout.svg")).content

    async def _get(self, path: str, params: dict[str, Any] | None = None) -> httpx.Response:
        try:
            answer = await self._client.get(f"{self.url}{path}", params=params, timeout=10.0)
        except httpx.HTTPError as exc:
            raise PlacementUnavailable(f"the scheduler at {self.url} did not answer "
                                       f"({type(exc).__name__})") from None
        if answer.status_code != 200:
            raise PlacementUnavailable(f"the scheduler at {self.url} answered "
                                       f"{answer.status_code} to GET {path}")
        return answer
