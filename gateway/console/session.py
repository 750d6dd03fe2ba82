"""Console sign-in: a token is exchanged once for a session cookie, and form posts carry
a per-session CSRF token.

- The API token is read from the sign-in form's body, checked by the gateway's
  :class:`~gateway.auth.TokenTable` (the same tokens and scopes as the API), and never
  stored: the session keeps the principal it resolved to.
- The cookie holds only a random session id (256 bits): ``HttpOnly`` (no script reads
  it), ``SameSite=Strict`` (no other site's page sends it), ``Path=/ui``, and ``Secure``
  when the console is reached over HTTPS.
- Every form post must carry the session's CSRF token (a hidden field, compared in
  constant time) and, when the browser sends one, an ``Origin`` of this host.
- Sessions live in this process's memory and end after ``idle_s`` without a request,
  at sign-out, or when the gateway restarts (sign in again); the cookie itself lasts
  until the browser closes.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from gateway.auth import Principal, Scope
from gateway.errors import Forbidden

COOKIE = "infergate_console"
MAX_SESSIONS = 10_000


@dataclass
class Session:
    id: str
    principal: Principal
    csrf: str
    last_seen: float

    @property
    def can_upload(self) -> bool:
        return self.principal.allows(Scope.UPLOAD)

    @property
    def is_admin(self) -> bool:
        return self.principal.allows(Scope.ADMIN)


@dataclass
class Sessions:
    idle_s: float = 8 * 3600
    clock: Callable[[], float] = time.monotonic
    _by_id: dict[str, Session] = field(default_factory=dict)

    def open(self, principal: Principal) -> Session:
        self._expire()
        if len(self._by_id) >= MAX_SESSIONS:  # the oldest goes first
            oldest = min(self._by_id.values(), key=lambda s: s.last_seen)
            del self._by_id[oldest.id]
        session = Session(secrets.token_urlsafe(32), principal, secrets.token_urlsafe(32),
                          self.clock())
        self._by_id[session.id] = session
        return session

    def find(self, session_id: str | None) -> Session | None:
        session = self._by_id.get(session_id or "")
        if session is None:
            return None
        now = self.clock()
        if now - session.last_seen > self.idle_s:
            del self._by_id[session.id]
            return None
        session.last_seen = now
        return session

    def close(self, session_id: str | None) -> None:
        self._by_id.pop(session_id or "", None)

    def _expire(self) -> None:
        now = self.clock()
        for stale in [s.id for s in self._by_id.values() if now - s.last_seen > self.idle_s]:
            del self._by_id[stale]


def check_origin(origin: str | None, host: str | None) -> None:
    """When the browser says where a form came from (``Origin``), it is this host (an
    ``Origin: null`` is refused too). Else 403."""
    if origin is not None and urlsplit(origin).netloc != (host or ""):
        raise Forbidden(f"form posted from {origin}, not from this console")


def check_form(session: Session, presented: str | None, origin: str | None,
               host: str | None) -> None:
    """A form post is the session's own: its CSRF token matches, and its origin is this
    host (:func:`check_origin`). Else 403."""
    check_origin(origin, host)
    if not presented or not hmac.compare_digest(presented.encode(), session.csrf.encode()):
        raise Forbidden("the form's CSRF token is missing or stale: reload the page and "
                        "submit again")
