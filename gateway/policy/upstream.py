"""The member: health, retry and ejection, as both planes apply them.

- Health: a member is probed on ``/v2/health/live``; one that still answers is down
  after :data:`HEALTH_FALL` failed probes in a row (a refused connection: at once), and
  back after one passing probe. HAProxy's ``check ... fall`` / ``rise``; the Python
  plane's probe loop (``gateway/control/probes.py``).
- Retry: inference is idempotent, so a request whose member fails at the connection
  (refused, reset, no answer) is retried :data:`RETRIES` time on another member.
- Ejection: a member that fails :data:`EJECT_AFTER_FAILURES` request in a row is out
  of routing until its health check passes again (HAProxy's ``observe layer4
  error-limit ... on-error mark-down``); the Python plane ejects it for a back-off of
  ``1 s * 2^k`` (capped at 30 s) or until a probe passes, whichever comes first.
"""

from __future__ import annotations

from dataclasses import dataclass

HEALTH_FALL = 2
RETRIES = 1
EJECT_AFTER_FAILURES = 1


@dataclass(frozen=True)
class EjectionPolicy:
    """The Python plane's back-off: after ``failures`` consecutive connection failures
    a member sits out ``base_s * 2**k`` seconds (capped); a passing probe brings it
    back at once."""

    failures: int = EJECT_AFTER_FAILURES
    base_s: float = 1.0
    max_s: float = 30.0

    def ejection_s(self, consecutive_failures: int) -> float:
        steps = max(0, consecutive_failures - self.failures)
        return float(min(self.max_s, self.base_s * (2**steps)))
