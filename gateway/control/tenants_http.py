"""``/v1/tenants``: the tenants and priority classes in force (``gateway/policy/tenancy.py``),
read and changed live. Admin scope.

``PUT`` takes the whole tenancy document (the gateway file's ``tenancy:`` section, as
JSON); a malformed one is refused whole with 400 naming the field, and nothing changes.
The answer comes once both data planes apply it (HAProxy through its runtime API, or a
seamless reload when its tables change): requests in flight are not dropped.
``DELETE`` turns tenancy off (admission per model only). Changes last until the gateway
restarts; its configuration file is what it starts with.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, Request

from gateway.auth import Scope, TokenTable
from gateway.config.tenancy import parse_tenancy
from gateway.control.lifecycle_http import requires
from gateway.errors import InvalidInput
from gateway.policy.tenancy import describe
from gateway.state import GatewayState


def create_tenants_router(state: GatewayState, auth: TokenTable) -> APIRouter:
    router = APIRouter(dependencies=[Depends(requires(auth, Scope.ADMIN))])

    def current() -> dict[str, Any]:
        tenancy = state.tenancy
        if tenancy is None:
            return {"enabled": False}
        return {"enabled": True,
                **describe(tenancy, {p.name: p.capacity for p in state.pools},
                           {p.name: state.active_tenants(p.name) for p in state.pools})}

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
            state.set_tenancy(parse_tenancy(data))
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        await state.settle()
        return current()

    @router.delete("/v1/tenants")
    async def delete_tenants() -> dict[str, Any]:
        state.set_tenancy(None)
        await state.settle()
        return current()

    return router
