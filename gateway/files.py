"""Files written whole or not at all."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str | bytes, mode: int = 0o644) -> None:
    """``text`` into ``path`` whole or not at all: a crash leaves the file before, and
    a reader never sees half of it. Each write goes through a temporary file of its own
    beside ``path``, so writers at the same moment (threads, processes) never share one:
    the last to finish wins. (A temporary file of one fixed name let one writer move
    another's away: the data-plane replica's snapshot writes then failed, and the
    replica stopped following its control plane for good.) ``mode``: the file's
    permissions (0o600 for one holding a secret: never readable by others, not even
    for a moment; 0o755 for a program)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as out:
            os.fchmod(out.fileno(), mode)
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


__all__ = ["write_atomically"]
