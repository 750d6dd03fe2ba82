"""``GET /v1/residency``: which models live on which member of each pool with a memory
budget, what each takes and why it is there (:meth:`Residency.report`); ``GET
/v1/residency/{model}``: one model's entry. Upload scope, as ``GET /v1/models``: model
owners and operators both ask where a model lives.

``POST /v1/residency/{model}/load`` and ``.../evict`` (``{"member": "host:grpc_port"}``,
admin scope): an operator's move, carried out as the policy's are (an eviction drains
first); the policy decides again at its next rounds."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from gateway.auth import Scope, TokenTable
from gateway.control.lifecycle_http import requires
from gateway.errors import ModelNotFound
from gateway.residency.manager import Residency


class MoveRequest(BaseModel):
    member: str = Field(description="The member's key, host:grpc_port (GET /v1/residency).")


def create_residency_router(residency: Residency | None, auth: TokenTable) -> APIRouter:
    router = APIRouter(dependencies=[Depends(requires(auth, Scope.UPLOAD))])
    admin = Depends(requires(auth, Scope.ADMIN))

    def report() -> dict[str, Any]:
        if residency is None:
            return {"enabled": False, "pools": [], "models": {}}
        return {"enabled": True, **residency.report()}

    @router.get("/v1/residency")
    async def get_residency() -> dict[str, Any]:
        return report()

    @router.get("/v1/residency/{model}")
    async def get_model_residency(model: str) -> dict[str, Any]:
        entry = report()["models"].get(model)
        if entry is None:
            raise ModelNotFound(f"model '{model}' is in no pool with residency")
        return {"model": model, **entry}

    @router.post("/v1/residency/{model}/{action}", dependencies=[admin])
    async def move(model: str, action: Literal["load", "evict"],
                   body: MoveRequest) -> dict[str, Any]:
        if residency is None:  # the model is in no pool with residency: there is none
            raise ModelNotFound(f"model '{model}' is in no pool with residency (no pool of "
                                "this gateway has a memory_budget_bytes)")
        await residency.operator_move(model, body.member, action)
        return {"model": model, **report()["models"][model]}

    return router
