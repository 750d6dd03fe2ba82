"""HAProxy's admin socket (the runtime API) and its master CLI: thin, no policy.

One connection per batch: commands are sent ``;``-separated in one line and the answers
come back in order, separated by blank lines. Used from the control plane's event loop
through a thread, so a slow socket never blocks request serving there.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from pathlib import Path

MAX_COMMANDS_PER_LINE = 64
# answers that mean the command did nothing; anything else is informational
FAILURES = ("Unknown command", "No such", "not found", "Require", "Invalid", "unknown",
            "can't", "cannot", "failed", "Unexpected")


class RuntimeError_(Exception):  # noqa: N801 - not the builtin
    """HAProxy refused a runtime command."""


def send(path: Path, command: str, timeout_s: float = 5.0) -> str:
    """One command line on a unix stream socket, the whole answer back."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(path))
        sock.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


class RuntimeAPI:
    def __init__(self, admin_socket: Path, timeout_s: float = 5.0) -> None:
        self.admin_socket = admin_socket
        self.timeout_s = timeout_s

    def run(self, commands: Sequence[str]) -> list[str]:
        """Send ``commands``; return HAProxy's answer to each. Raises on a refusal."""
        answers: list[str] = []
        for start in range(0, len(commands), MAX_COMMANDS_PER_LINE):
            batch = commands[start:start + MAX_COMMANDS_PER_LINE]
            text = send(self.admin_socket, "; ".join(batch), self.timeout_s)
            parts = text.split("\n\n")
            answers += [p.strip() for p in parts[:len(batch)]]
        for command, answer in zip(commands, answers, strict=False):
            if any(word in answer for word in FAILURES):
                raise RuntimeError_(f"HAProxy refused {command!r}: {answer}")
        return answers

    def query(self, command: str) -> str:
        return send(self.admin_socket, command, self.timeout_s)

    async def aquery(self, command: str) -> str:
        return await asyncio.to_thread(self.query, command)


def parse_csv_stats(text: str) -> list[dict[str, str]]:
    """``show stat`` CSV -> one dict per row (proxy, server, scur, qcur, ...)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("# "):
        return []
    header = lines[0][2:].split(",")
    return [dict(zip(header, line.split(","), strict=False)) for line in lines[1:]]


def parse_table(text: str) -> dict[str, dict[str, int]]:
    """``show table NAME`` -> key -> {data name: value}."""
    entries: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        if not line.startswith("0x"):
            continue
        fields = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
        key = fields.pop("key", None)
        if key is None:
            continue
        values = {}
        for name, value in fields.items():
            if name in ("use", "exp"):
                continue
            # "http_req_rate(2000)=3" -> "http_req_rate"
            values[name.split("(", 1)[0]] = int(value) if value.lstrip("-").isdigit() else 0
        entries[key] = values
    return entries
