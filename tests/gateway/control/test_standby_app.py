"""A standby control plane's HTTP API (gateway/control/standby.py), on a real PostgreSQL
whose records are written through the store, beside a real leader stand-in (uvicorn on a
loopback port, at the address it advertised with its term): the lifecycle's reads served
from the records with the leader's auth; everything else streamed to the leader; 503 +
Retry-After where no leader is known or reached; readiness by the database; the gRPC
relay."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from gateway.auth import Scope, TokenEntry, TokenTable
from gateway.config import GatewayConfig
from gateway.control.leader_proxy import VIA, TcpRelay
from gateway.control.standby import Standby, advertised
from gateway.lifecycle.records.leader import Advertised, Leadership
from gateway.lifecycle.records.postgres import TABLES, PostgresStore, connect, migrate
from gateway.lifecycle.records.store import ModelRecord, RolloutRecord, VersionRecord
from infergate.postgres import LocalPostgres
from infergate.triton.local import free_port

pytestmark = pytest.mark.integration  # a real PostgreSQL: make test installs it

TOKENS = {"predict": "predict-token-0123456789", "upload": "upload-token-0123456789",
          "admin": "admin-token-0123456789ab"}
UPLOAD = {"authorization": f"Bearer {TOKENS['upload']}"}
CHUNK = b"x" * (256 * 1024)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def records_db(postgres: LocalPostgres) -> str:
    url = postgres.create_database("standby_app")
    with connect(url) as conn:
        migrate(conn)
    return url


@pytest.fixture
def db(records_db: str) -> Iterator[str]:
    with connect(records_db) as conn:
        conn.execute(f"TRUNCATE {', '.join(TABLES)}, leadership")
    yield records_db


def leader_stand_in(seen: list[dict[str, Any]], first_chunk: asyncio.Event) -> FastAPI:
    """What the leader answers, and what reached it (``seen``)."""
    app = FastAPI()

    @app.post("/v1/models/{name}/versions")
    async def upload(name: str, request: Request) -> Response:
        digest, size = hashlib.sha256(), 0
        async for chunk in request.stream():
            if chunk:
                first_chunk.set()
            digest.update(chunk)
            size += len(chunk)
        seen.append({"headers": dict(request.headers), "query": request.url.query})
        answer = JSONResponse({"model": name, "size": size, "sha256": digest.hexdigest()},
                              status_code=202, headers={"location": "/v1/jobs/j9"})
        answer.raw_headers += [(b"set-cookie", b"a=1"), (b"set-cookie", b"b=2")]
        return answer

    @app.get("/v1/models/{name}")
    async def adopted(name: str) -> JSONResponse:
        return JSONResponse({"name": name, "answered_by": "leader"})

    return app


@pytest.fixture
async def leader(db: str) -> AsyncIterator[tuple[str, list[dict[str, Any]], asyncio.Event]]:
    """A leader stand-in on a loopback port, leading in the database (term 1) and
    advertising that port: (its address, the calls it saw, its first upload chunk)."""
    seen: list[dict[str, Any]] = []
    first_chunk = asyncio.Event()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(leader_stand_in(seen, first_chunk), host="127.0.0.1",
                                           port=port, lifespan="off", log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    address = f"127.0.0.1:{port}"
    leadership = Leadership(db, holder="leader-a", advertised=Advertised(address, address))
    assert leadership.poll().value == "leader"
    try:
        yield address, seen, first_chunk
    finally:
        leadership.close()
        server.should_exit = True
        await serving


def config(repo: Path) -> GatewayConfig:
    return GatewayConfig.model_validate({
        "pools": [{"name": "p", "dns": "triton.svc"}],
        "lifecycle": {"repository": str(repo), "state_dir": str(repo.parent / "state")}})


@pytest.fixture
async def standby(db: str, tmp_path: Path) -> AsyncIterator[Standby]:
    auth = TokenTable([TokenEntry(name=scope, scopes=(Scope(scope),), token=token)
                       for scope, token in TOKENS.items()])
    (tmp_path / "repo").mkdir()
    replica = Standby(Leadership(db, holder="standby-b", clock=FakeClock()), auth,
                      config(tmp_path / "repo"))
    try:
        yield replica
    finally:
        await replica.close()
        replica.leadership.close()


def client(standby: Standby) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=standby.app),
                             base_url="http://standby")


def write_records(url: str, repo: Path) -> None:
    """A model serving version 1 (with a report) after version 2 failed, its upload job,
    and a rollout at its 50 % step: written as the leader writes them."""
    store = PostgresStore(url)
    now = time.time()
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "1" / "report.json").write_text('{"accuracy": 0.99}')
    store.put_version(VersionRecord("m", 1, "serving", "cfg", now, precision="fp16",
                                    report="report.json"))
    store.put_version(VersionRecord("m", 2, "available", "cfg", now))
    store.put_model(ModelRecord("m", "serving", now, serving_version=1, pools=("p",)))
    store.create_job("j1", "m", "upload")
    store.update_job("j1", state="rolling_out", version=2)
    store.put_rollout(RolloutRecord("j1", "m", 1, 2, {"steps": [50, 100]}, "running", now,
                                    now, step=0, percent=50))
    store.close()


async def test_standby_serves_lifecycle_reads_from_the_records_when_another_replica_leads(
        leader: tuple[str, list[dict[str, Any]], asyncio.Event], standby: Standby,
        db: str, tmp_path: Path) -> None:
    write_records(db, tmp_path / "repo")
    assert await standby.step() is False  # a follower: the records opened, the leader seen
    async with client(standby) as api:
        listed = await api.get("/v1/models", headers=UPLOAD)
        assert listed.status_code == 200
        (model,) = listed.json()["models"]
        assert (model["name"], model["state"], model["serving_version"]) == ("m", "serving", 1)
        assert [v["state"] for v in model["versions"]] == ["serving", "available"]
        assert model["versions"][0]["report"] == "/v1/models/m/versions/1/report"
        assert model["loading"] is None  # only the leader probes: said, not guessed
        assert model["rollout"]["percent"] == 50 and model["recent_jobs"][0]["id"] == "j1"
        assert (await api.get("/v1/models/m", headers=UPLOAD)).json() == model
        job = (await api.get("/v1/jobs/j1", headers=UPLOAD)).json()
        assert job["state"] == "rolling_out" and job["rollout"]["candidate"] == 2
        assert job["links"] == {"self": "/v1/jobs/j1", "model": "/v1/models/m"}
        rollout = (await api.get("/v1/models/m/rollout", headers=UPLOAD)).json()
        assert rollout["state"] == "running" and "window" not in rollout  # as recorded
        report = await api.get("/v1/models/m/versions/1/report", headers=UPLOAD)
        assert report.json() == {"accuracy": 0.99}
        missing = await api.get("/v1/jobs/nope", headers=UPLOAD)
        assert missing.status_code == 404
    leader_address, seen, _ = leader
    assert seen == []  # none of it reached the leader


async def test_standby_enforces_the_lifecycle_scopes_when_it_serves_reads(
        leader: tuple[str, list[dict[str, Any]], asyncio.Event], standby: Standby) -> None:
    await standby.step()
    async with client(standby) as api:
        anonymous = await api.get("/v1/models")
        assert anonymous.status_code == 401 and "www-authenticate" in anonymous.headers
        predict = await api.get("/v1/models", headers={"x-api-key": TOKENS["predict"]})
        assert predict.status_code == 403
        assert (await api.get("/v1/models", headers=UPLOAD)).status_code == 200


async def test_standby_streams_an_upload_to_the_leader_when_it_receives_one(
        leader: tuple[str, list[dict[str, Any]], asyncio.Event], standby: Standby) -> None:
    _, seen, first_chunk = leader
    await standby.step()

    async def body() -> AsyncIterator[bytes]:
        yield CHUNK
        # the leader holds the first chunk before the client sends the rest: streamed,
        # not buffered whole by the standby (a buffering proxy would wait here for good)
        await asyncio.wait_for(first_chunk.wait(), 10)
        for _ in range(7):
            yield CHUNK

    async with client(standby) as api:
        answer = await api.post(
            "/v1/models/m/versions?dry=1", content=body(),
            headers={**UPLOAD, "content-type": "multipart/form-data; boundary=b",
                     "connection": "keep-alive, x-drop-me", "x-drop-me": "1",
                     "te": "trailers", "x-kept": "yes"})
    assert answer.status_code == 202, answer.text
    assert answer.json() == {"model": "m", "size": 8 * len(CHUNK),
                             "sha256": hashlib.sha256(CHUNK * 8).hexdigest()}
    assert answer.headers["location"] == "/v1/jobs/j9"
    assert answer.headers.get_list("set-cookie") == ["a=1", "b=2"]
    (call,) = seen
    headers = call["headers"]
    assert call["query"] == "dry=1"
    assert headers["authorization"] == UPLOAD["authorization"]  # the leader checks it
    assert headers["x-kept"] == "yes" and headers[VIA] == "standby-b"
    assert headers["x-forwarded-for"] == "127.0.0.1" and headers["x-forwarded-host"] == "standby"
    assert "x-drop-me" not in headers and "te" not in headers  # hop by hop


async def test_standby_passes_a_model_to_the_leader_when_only_the_repository_has_it(
        leader: tuple[str, list[dict[str, Any]], asyncio.Event], standby: Standby,
        tmp_path: Path) -> None:
    (tmp_path / "repo" / "fresh" / "1").mkdir(parents=True)  # the leader records it
    await standby.step()
    async with client(standby) as api:
        answer = await api.get("/v1/models/fresh", headers=UPLOAD)
        assert answer.json() == {"name": "fresh", "answered_by": "leader"}
        assert (await api.get("/v1/models/absent", headers=UPLOAD)).status_code == 404


async def test_standby_answers_503_with_retry_after_when_the_leader_cannot_be_reached(
        standby: Standby, db: str, tmp_path: Path) -> None:
    write_records(db, tmp_path / "repo")
    closed = f"127.0.0.1:{free_port()}"  # nothing listens: the leader's process died
    gone = Leadership(db, holder="leader-a", advertised=Advertised(closed, closed))
    gone.poll()
    try:
        await standby.step()
        async with client(standby) as api:
            refused = await api.post("/v1/models/m/rollback", headers=UPLOAD, json={})
            assert refused.status_code == 503 and refused.headers["retry-after"] == "2"
            assert "cannot be reached" in refused.json()["error"]
            assert "leader-a" not in refused.json()["error"] and closed in refused.json()["error"]
            # reads go on from the records meanwhile
            assert (await api.get("/v1/models/m", headers=UPLOAD)).status_code == 200
    finally:
        gone.close()
    # the lock is free: this replica leads at its next round, and says it is starting
    assert await standby.step() is True
    async with client(standby) as api:
        starting = await api.post("/v1/models/m/rollback", headers=UPLOAD, json={})
        assert starting.status_code == 503 and "starting" in starting.json()["error"]
        assert (await api.get("/v1/leader")).status_code == 200


async def test_standby_answers_503_when_no_leader_is_known(
        standby: Standby, db: str) -> None:
    with connect(db) as holder:  # the lock held, the term row not (yet) written
        holder.execute("SELECT pg_advisory_lock(%s)", (standby.leadership.key,))
        assert await standby.step() is False
        async with client(standby) as api:
            refused = await api.get("/ui", headers=UPLOAD)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "2"
            assert "no leader is known" in refused.json()["error"]


async def test_standby_refuses_to_pass_a_call_again_when_a_standby_passed_it(
        leader: tuple[str, list[dict[str, Any]], asyncio.Event], standby: Standby) -> None:
    await standby.step()
    async with client(standby) as api:
        bounced = await api.post("/v1/models/m/rollback", headers={**UPLOAD, VIA: "standby-c"})
    assert bounced.status_code == 503 and "standby-c" in bounced.json()["error"]
    assert leader[1] == []


async def test_standby_is_ready_while_its_database_answers_when_another_replica_leads(
        leader: tuple[str, list[dict[str, Any]], asyncio.Event], standby: Standby) -> None:
    await standby.step()
    clock = standby.leadership.clock
    assert isinstance(clock, FakeClock)
    async with client(standby) as api:
        assert (await api.get("/v2/health/live")).status_code == 200
        ready = await api.get("/v1/replica")
        assert ready.status_code == 200, ready.text
        assert ready.json()["leader"]["http"] == leader[0]
        assert ready.json()["leader"]["holder"] == "leader-a"
        leads = await api.get("/v1/leader")  # for whoever needs the leader itself
        assert leads.status_code == 503 and leads.headers["retry-after"] == "2"
        metrics = await api.get("/metrics")  # the leader's are not counted twice
        assert metrics.status_code == 200 and metrics.content == b""
        clock.now += standby.leadership.grace_s + 1  # no answer from the database since
        assert (await api.get("/v1/replica")).status_code == 503


async def test_tcp_relay_carries_a_connection_to_the_leader_when_one_is_known() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data.upper())
            await writer.drain()
        writer.close()

    leader = await asyncio.start_server(echo, "127.0.0.1", 0)
    target = f"127.0.0.1:{leader.sockets[0].getsockname()[1]}"
    known: list[str] = [target]

    def locate() -> str:
        if not known:
            raise ConnectionRefusedError("no leader")
        return known[0]

    relay, port = TcpRelay(locate), free_port()
    await relay.start("127.0.0.1", port)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"frames")
        await writer.drain()
        assert await reader.readexactly(6) == b"FRAMES"
        writer.close()
        known.clear()  # no leader: a connection is closed at once (gRPC: UNAVAILABLE)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    finally:
        await relay.close()
        leader.close()
        await leader.wait_closed()


@pytest.mark.parametrize(("host", "given", "http", "grpc"), [
    ("127.0.0.1", None, "127.0.0.1:8000", "127.0.0.1:8001"),
    ("0.0.0.0", "10.1.2.3", "10.1.2.3:8000", "10.1.2.3:8001"),
    ("0.0.0.0", "10.1.2.3:9000", "10.1.2.3:9000", "10.1.2.3:8001"),
    ("::", "fd00::5", "[fd00::5]:8000", "[fd00::5]:8001"),
    ("::", "[fd00::5]:9000", "[fd00::5]:9000", "[fd00::5]:8001"),
])
def test_advertised_address_is_the_given_one_else_where_it_serves_when_built(
        host: str, given: str | None, http: str, grpc: str) -> None:
    assert advertised(host, 8000, 8001, given) == Advertised(http, grpc)
