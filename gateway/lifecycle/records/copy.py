"""Moving the records from one store to another (``infergate records copy``: SQLite to
PostgreSQL when the control plane goes from one replica to several).

Everything is copied as it is, timestamps, final states, the highest version number
ever issued per model, the residency's recorded demand and the tenancy changed through
the API included, in one transaction on the target, and read back to check.
Idempotent: a target that holds exactly these records already is left alone; a target
that holds others is refused unless ``replace`` (then its records are replaced, all of
them). Stop the gateway that writes the source first: records it writes after
the copy's snapshot stay behind."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import Conflict
from gateway.lifecycle.records.store import RecordStore


class TargetNotEmpty(Conflict):
    """The target holds other records: copying would overwrite them."""


@dataclass(frozen=True)
class CopyOutcome:
    copied: bool  # False: the target held these records already
    counts: dict[str, int]


def copy_records(source: RecordStore, target: RecordStore,
                 replace: bool = False) -> CopyOutcome:
    records = source.export_records()
    present = target.export_records()
    if present == records:
        return CopyOutcome(False, records.counts())
    if not present.empty and not replace:
        held = ", ".join(f"{n} {kind}" for kind, n in present.counts().items() if n)
        raise TargetNotEmpty(f"the target holds other records ({held}): pass replace "
                             "(--replace) to overwrite them all")
    target.import_records(records)
    if target.export_records() != records:
        raise RuntimeError("the target's records differ from the source's after the copy")
    return CopyOutcome(True, records.counts())
