"""The tenancy changed live (``PUT``/``DELETE /v1/tenants``), kept across restarts and
failovers: :class:`LiveTenancy`, the one writer of the tenancy in force after start.

A change is validated whole, then recorded in the store (where the gateway has one: a
``lifecycle:`` section), then applied: a change the store refuses (a stale leadership
term, an unreachable database) is not applied, so the rules in force are always the
recorded ones. At start the leader applies the recorded change over the configuration
file's tenancy (:meth:`LiveTenancy.restore`, before it serves) and says so in its log;
``GET /v1/tenants`` names where the rules in force came from (``config`` or ``api``, with
when). A recorded document that no longer validates (a gateway whose tenancy schema
changed) leaves the configuration file's rules in force, said loudly.

The records hold no plain key: a tenant's keys are recorded as their digests
(``sha256:<hex>``, which the tenancy document accepts as it accepts a plain key).
Without a store (no lifecycle) a change lasts until the process ends, as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.config.tenancy import parse_tenancy
from gateway.lifecycle.records.store import RecordStore
from gateway.policy.access import DIGEST_PREFIX, key_digest
from gateway.policy.tenancy import Tenancy
from gateway.state import GatewayState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TenancySource:
    """Where the rules in force came from: ``config`` (the configuration file, or
    ``--tenants``) or ``api`` (``PUT``/``DELETE /v1/tenants`` at ``changed_at``, epoch
    seconds)."""

    origin: str
    changed_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"source": self.origin, "changed_at": self.changed_at}


CONFIG = TenancySource("config")


class LiveTenancy:
    """The tenancy of ``state`` as the API changes it, recorded in ``store`` (None: kept
    in memory only). See the module's docstring."""

    def __init__(self, state: GatewayState, store: RecordStore | None = None) -> None:
        self.state = state
        self.store = store
        self.source = CONFIG

    def restore(self) -> None:
        """At start, before serving: the recorded change, if any, over the
        configuration file's tenancy. The store's errors are raised (a leader that cannot
        read its records does not start on rules it may have been told to drop)."""
        if self.store is None:
            return
        override = self.store.tenancy_override()
        if override is None:
            return
        when = _when(override.changed_at)
        try:
            self.state.set_tenancy(None if override.document is None
                                   else parse_tenancy(override.document, "recorded tenancy"))
        except ValueError as exc:
            log.error("tenancy: the change recorded through the API at %s no longer "
                      "applies (%s): the configuration file's rules stay in force; PUT "
                      "/v1/tenants to replace it", when, exc)
            return
        self.source = TenancySource("api", override.changed_at)
        log.warning("tenancy: %s through the API at %s, over the configuration file's "
                    "(GET /v1/tenants shows it)",
                    "turned off" if override.deleted else "the rules set", when)

    def change(self, document: Mapping[str, Any] | None) -> None:
        """``PUT`` (a tenancy document) or ``DELETE`` (None: tenancy off). ValueError
        naming the field when the document is malformed; the store's errors (a stale
        term, an unreachable database) likewise leave the rules as they were."""
        spec = None
        if document is not None:
            spec = parse_tenancy(document)
            # set_tenancy's own ValueError, raised here before anything is recorded
            Tenancy.from_spec(spec, self.state.config.queue_factor)
        changed_at = time.time()
        if self.store is not None:
            recorded = self.store.set_tenancy_override(
                None if document is None else digested(document))
            changed_at = recorded.changed_at
        self.state.set_tenancy(spec)
        self.source = TenancySource("api", changed_at)


def digested(document: Mapping[str, Any]) -> dict[str, Any]:
    """``document`` (validated) with each tenant's plain keys replaced by their digests."""
    tenants = document.get("tenants")
    if not isinstance(tenants, list):
        return dict(document)
    return {**document, "tenants": [
        {**t, "keys": [k if k.startswith(DIGEST_PREFIX) else DIGEST_PREFIX + key_digest(k)
                       for k in t["keys"]]}
        if isinstance(t, dict) and isinstance(t.get("keys"), list) else t
        for t in tenants]}


def _when(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch_s))
