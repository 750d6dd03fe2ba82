"""The tenancy changed live survives a restart of the control plane: ``PUT``/``DELETE
/v1/tenants`` through the control plane's HTTP app over a real store (SQLite and
PostgreSQL), then a new state over the configuration file and a new store over the same
records, as a restarted leader (or the next one) builds them: the recorded change applies
over the file's, and ``GET /v1/tenants`` says it came from the API, and when. A malformed
change records nothing; one the store refuses changes nothing; the records hold no plain
key; a recorded document that no longer validates leaves the file's rules in force."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any
from unittest.mock import create_autospec

import httpx
import pytest

from gateway.config import GatewayConfig
from gateway.control.http_app import create_control_app
from gateway.control.model_control import ModelControl
from gateway.core import Core
from gateway.lifecycle.records.postgres import PostgresStore
from gateway.lifecycle.records.store import RecordStore, StaleTerm
from gateway.lifecycle.records.tenancy import LiveTenancy
from gateway.policy.access import key_digest
from gateway.upstream.http import UpstreamHTTP
from gateway.upstream.triton import MemberAdmin
from tests.gateway.lifecycle.records.conftest import Backend

FILE_KEY, API_KEY = "file-key-0123456789", "api-key-0123456789"
CONFIG = {"pools": [{"name": "p", "capacity_per_member": 2,
                     "members": [{"host": "127.0.0.1", "http_port": 9, "grpc_port": 10}]}],
          "tenancy": {"tenants": [{"name": "from-file", "keys": [FILE_KEY]}]}}
CHANGE = {"default": {"priority": "sheddable"},
          "tenants": [{"name": "from-api", "priority": "critical", "keys": [API_KEY]}]}


def control_plane(store: RecordStore | None) -> tuple[Core, Any]:
    """A control plane as ``gateway serve`` starts one: its state from the configuration
    file, the recorded tenancy restored over it, the HTTP app."""
    core = Core.for_config(GatewayConfig.model_validate(CONFIG))
    tenancy = LiveTenancy(core.state, store)
    tenancy.restore()
    control = ModelControl(core, MemberAdmin(create_autospec(httpx.AsyncClient,
                                                             instance=True)))
    return core, create_control_app(core, control, UpstreamHTTP(), tenancy=tenancy)


def call(app: Any, method: str, body: Any = None) -> httpx.Response:
    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://cp") as client:
            return await client.request(method, "/v1/tenants", json=body)

    return asyncio.run(run())


def tenants(core: Core) -> dict[str, str]:
    """key digest -> tenant, as the tenancy in force admits them (None: tenancy off)."""
    assert core.state.tenancy is not None
    return dict((digest, name) for digest, name in core.state.tenancy.keys)


def test_tenancy_put_applies_after_restart_when_recorded(backend: Backend) -> None:
    core, app = control_plane(backend.open())
    shown = call(app, "GET").json()
    assert (shown["source"], shown["changed_at"]) == ("config", None)
    assert [t["name"] for t in shown["tenants"]] == ["default", "from-file"]
    put = call(app, "PUT", CHANGE)
    assert put.status_code == 200 and put.json()["source"] == "api"

    core, app = control_plane(backend.open())  # restarted: the file says otherwise
    assert tenants(core) == {key_digest(API_KEY): "from-api"}  # the API key admits
    shown = call(app, "GET").json()
    assert (shown["source"], shown["changed_at"]) == ("api", put.json()["changed_at"])
    assert [t["priority"] for t in shown["tenants"]] == ["sheddable", "critical"]


def test_tenancy_delete_stays_off_after_restart_when_recorded(backend: Backend) -> None:
    _, app = control_plane(backend.open())
    deleted = call(app, "DELETE").json()
    assert deleted["enabled"] is False and deleted["changed_at"] is not None
    core, app = control_plane(backend.open())
    assert core.state.tenancy is None  # off, not the file's
    assert call(app, "GET").json() == {"enabled": False, "source": "api",
                                       "changed_at": deleted["changed_at"]}


def test_records_hold_digests_not_keys_when_tenancy_put(backend: Backend) -> None:
    store = backend.open()
    _, app = control_plane(store)
    assert call(app, "PUT", CHANGE).status_code == 200
    recorded = store.tenancy_override()
    assert recorded is not None and API_KEY not in json.dumps(recorded.document)
    assert recorded.document["tenants"][0]["keys"] == [  # type: ignore[index]
        "sha256:" + key_digest(API_KEY)]


def test_malformed_tenancy_records_nothing_when_put(backend: Backend) -> None:
    store = backend.open()
    core, app = control_plane(store)
    refused = call(app, "PUT", {"tenants": [{"name": "x", "priority": "gold"}]})
    assert refused.status_code == 400 and "tenants.x.priority" in refused.json()["error"]
    assert store.tenancy_override() is None
    assert tenants(core) == {key_digest(FILE_KEY): "from-file"}


def test_recorded_tenancy_that_no_longer_validates_leaves_file_rules_when_restored(
        backend: Backend, caplog: pytest.LogCaptureFixture) -> None:
    backend.open().set_tenancy_override({"tenants": [{"name": "x", "colour": "red"}]})
    with caplog.at_level(logging.ERROR):
        core, app = control_plane(backend.open())
    assert tenants(core) == {key_digest(FILE_KEY): "from-file"}
    assert call(app, "GET").json()["source"] == "config"
    assert "no longer applies" in caplog.text and "tenants.x.colour" in caplog.text


class LostLeadership:
    """The fence of a replica that no longer leads (:class:`~.store.Fence`)."""

    name = "control-plane"

    def fence_term(self) -> int:
        raise StaleTerm("this replica does not lead")


@pytest.mark.integration  # a real PostgreSQL: make test installs it
def test_tenancy_change_refused_by_the_store_changes_nothing(pg_url: str) -> None:
    store = PostgresStore(pg_url, fence=LostLeadership())
    core, app = control_plane(store)
    refused = call(app, "PUT", CHANGE)
    assert refused.status_code == 503 and "does not lead" in refused.json()["error"]
    assert call(app, "DELETE").status_code == 503
    assert tenants(core) == {key_digest(FILE_KEY): "from-file"}  # as it was
    assert call(app, "GET").json()["source"] == "config"
    assert store.tenancy_override() is None
    store.close()
