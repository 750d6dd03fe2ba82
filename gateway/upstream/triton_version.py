"""Which Triton a member runs, and whether the gateway's gRPC requests to it may share
HTTP/2 connections.

Triton before 2.57.0 has a race in its gRPC frontend: requests cancelled while in
flight can segfault it (triton-inference-server/server#8034, fixed by server PR #8078 in
2.57.0, NGC 25.04). Behind HAProxy a second path leads there: 2.51 answers a message it
cannot parse and then repeats its trailers on the closed stream, HAProxy ends that
connection as broken, and every request multiplexed on it is cancelled at once. So a
member whose version lacks the fix gets one gRPC request per connection; a member with
it shares connections (about twice the throughput on small requests). The decision is
made per member from the version it reports (``GET /v2``), never from the Triton this
machine happens to run, and an operator's setting overrides it either way.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

log = logging.getLogger(__name__)

FIXED_IN = (2, 57, 0)
FIXED_RELEASE = "Triton 2.57.0 (NGC 25.04) or later"
RACE = "triton-inference-server/server#8034"
_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?![\d.])")


class GrpcReuse(StrEnum):
    """The operator's setting (``--grpc-upstream-reuse``)."""

    AUTO = "auto"  # decide per member from its Triton version
    SHARED = "shared"  # share connections whatever the version says
    PER_REQUEST = "per-request"  # one request per connection whatever the version says


@dataclass(frozen=True)
class GrpcMode:
    shared: bool
    why: str

    @property
    def label(self) -> str:
        """The value of the ``grpc_connections`` label."""
        return "shared" if self.shared else "per_request"


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """``"2.51.0"`` -> (2, 51, 0); ``"2.58.0dev"`` -> (2, 58, 0); None when the text
    holds no ``MAJOR.MINOR[.PATCH]`` at its start."""
    if not text:
        return None
    match = _VERSION.match(text.strip())
    if match is None:
        return None
    return int(match[1]), int(match[2]), int(match[3] or 0)


def has_fix(version: str | None) -> bool:
    parsed = parse_version(version)
    return parsed is not None and parsed >= FIXED_IN


def grpc_mode(version: str | None, setting: GrpcReuse = GrpcReuse.AUTO) -> GrpcMode:
    """How gRPC requests reach a member that reports ``version`` (None: not read)."""
    if setting is GrpcReuse.SHARED:
        return GrpcMode(True, "--grpc-upstream-reuse shared")
    if setting is GrpcReuse.PER_REQUEST:
        return GrpcMode(False, "--grpc-upstream-reuse per-request")
    if version is None:
        return GrpcMode(False, "its Triton version could not be read (GET /v2)")
    parsed = parse_version(version)
    if parsed is None:
        return GrpcMode(False, f"its Triton version {version!r} is not MAJOR.MINOR.PATCH")
    if parsed >= FIXED_IN:
        return GrpcMode(True, f"Triton {version} has the fix for {RACE}")
    return GrpcMode(False, f"Triton {version} has the gRPC cancellation race {RACE}")


def version_from_metadata(body: Any) -> str | None:
    """The ``version`` of a server metadata answer (``GET /v2``), None when absent."""
    version = body.get("version") if isinstance(body, dict) else None
    return version if isinstance(version, str) and version else None


class VersionWatch:
    """Tells, once per change, what each member runs and how its gRPC connections go:
    a warning for every member that comes up without the fix (or whose version cannot
    be read), and the ``infergate_member_info`` gauge."""

    def __init__(self, gauge: Any, setting: GrpcReuse) -> None:
        self.gauge = gauge  # labels: pool, member, version, grpc_connections
        self.setting = setting
        self._seen: dict[tuple[str, str], tuple[str, str]] = {}  # -> (version, mode label)

    def observe(self, members: Iterable[tuple[str, str, str | None]]) -> None:
        """``members``: (pool, member key, reported version or None) of every member
        whose version was read this round (unhealthy members keep what they had)."""
        for pool, member, version in members:
            mode = grpc_mode(version, self.setting)
            now = (version or "unknown", mode.label)
            before = self._seen.get((pool, member))
            if before == now:
                continue
            if before is not None:
                self.gauge.remove(pool, member, *before)
            self.gauge.labels(pool, member, *now).set(1)
            self._seen[(pool, member)] = now
            self._say(pool, member, version, mode)

    def forget(self, keep: set[tuple[str, str]]) -> None:
        """Members gone from their pool leave the gauge."""
        for key in [k for k in self._seen if k not in keep]:
            self.gauge.remove(*key, *self._seen.pop(key))

    def _say(self, pool: str, member: str, version: str | None, mode: GrpcMode) -> None:
        where = f"member {pool}/{member}"
        if has_fix(version):
            log.info("%s runs Triton %s: gRPC connections %s (%s)", where, version,
                     mode.label.replace("_", " "), mode.why)
            return
        what = (f"runs Triton {version}, which has" if parse_version(version) else
                "runs a Triton whose version is unknown; before 2.57.0 Triton has")
        risk = (f"the gRPC cancellation race {RACE}: a cancelled or broken request can "
                f"crash it. Upgrade it to {FIXED_RELEASE}.")
        if mode.shared:
            log.warning("%s %s %s Its gRPC requests share connections anyway (%s).",
                        where, what, risk, mode.why)
            return
        forced = f"; {mode.why}" if self.setting is GrpcReuse.PER_REQUEST else ""
        log.warning("%s %s %s Until then its gRPC requests go one per connection (about "
                    "half the throughput on small requests%s).", where, what, risk, forced)
