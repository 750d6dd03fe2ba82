"""``/v1/tenants``: the tenants and priority classes in force (``gateway/policy/tenancy.py``),
read and changed live. Admin scope.

``PUT`` takes the whole tenancy document (the gateway file's ``tenancy:`` section, as
JSON); a malformed one is refused whole with 400 naming the field, and nothing changes.
The answer comes once both data planes apply it (HAProxy through its runtime API, or a
seamless reload when its tables change): requests in flight are not dropped.
``DELETE`` turns tenancy off (admission per model only). With a lifecycle a change is
recorded before it is applied and outlives a restart or a failover: the leader applies
the last one over the configuration file's at start
(:class:`~gateway.lifecycle.records.tenancy.LiveTenancy`); without one it lasts until the
process ends. ``GET`` says where the rules in force came from: ``source`` ``config`` or
``api``, with ``changed_at`` (epoch seconds), and ``model_levels``: per model whose
dynamic batcher has priority levels, the level each class gets there.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, Request

from gateway.auth import Scope, TokenTable
from gateway.control.lifecycle_http import requires
from gateway.errors import InvalidInput
from gateway.lifecycle.records.tenancy import LiveTenancy
from gateway.policy import triton_priority
from gateway.policy.tenancy import Priority, describe


def create_tenants_router(tenancy: LiveTenancy, auth: TokenTable) -> APIRouter:
    router = APIRouter(dependencies=[Depends(requires(auth, Scope.ADMIN))])
    state = tenancy.state

    def current() -> dict[str, Any]:
        rules = state.tenancy
        source = tenancy.source.to_json()
        if rules is None:
            return {"enabled": False, **source}
        return {"enabled": True, **source,
                **describe(rules, {p.name: p.capacity for p in state.pools},
                           {p.name: state.active_tenants(p.name) for p in state.pools},
                           {p.name for p in state.pools if p.spec.gateway_queue},
                           {p.name: p.spec.lane_per_member for p in state.pools}),
                "model_levels": model_levels() if rules.triton_levels else {}}

    def model_levels() -> dict[str, dict[str, int]]:
        """Per model whose dynamic batcher has priority levels, the level each class
        gets there (gateway/policy/triton_priority.py)."""
        return {model: {p.value: level for p in Priority
                        if (level := triton_priority.level(p, levels)) is not None}
                for model, levels in sorted(state.leveled_models().items())}

    @router.get("/v1/tenants")
    async def get_tenants() -> dict[str, Any]:
        return current()

    @router.put("/v1/tenants")
    async def put_tenants(request: Request) -> dict[str, Any]:
        try:
            data = json.loads(await request.body())
        except ValueError:
            raise InvalidInput("tenancy: the body is not JSON") from None
        try:
            tenancy.change(data)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        await state.settle()
        return current()

    @router.delete("/v1/tenants")
    async def delete_tenants() -> dict[str, Any]:
        tenancy.change(None)
        await state.settle()
        return current()

    return router
