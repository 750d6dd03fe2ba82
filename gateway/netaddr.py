"""Host and port joined into one address and split again, IPv6 literals bracketed.

A member's host comes from ``pools.yaml`` or from DNS (a headless Service's AAAA records
on a dual-stack or IPv6 cluster): ``fd00::5`` joined with its port as ``fd00::5:8001``
is no address at all (httpx refuses the URL, gRPC and HAProxy misread it). Every place
that writes a host and a port as one string, a URL's authority, a gRPC target, an
HAProxy ``server`` line, a member's key, goes through :func:`join_host_port`; hosts are
kept bare (``MemberSpec`` strips brackets).
"""

from __future__ import annotations

import ipaddress
import random
import socket
from collections.abc import Iterable
from pathlib import Path

# where free_port looks when the kernel's ephemeral range leaves room below it
PORTS_FROM = 10_000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def bare_host(host: str) -> str:
    """``host`` without the brackets of a bracketed IPv6 literal; ValueError for a host
    with a colon that is no IPv6 address (a port written into the host, say)."""
    inner = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if ":" in inner:
        try:
            ipaddress.IPv6Address(inner)
        except ValueError:
            raise ValueError(f"'{host}' is neither a host name nor an IP address "
                             "(a port belongs in its own field)") from None
    return inner


def join_host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 literal in brackets (``[fd00::5]:8001``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_host_port(address: str) -> tuple[str, int]:
    """The bare host and the port of ``host:port`` or ``[v6]:port``; ValueError when it
    has no port."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"'{address}' is not HOST:PORT")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(f"'{address}': an IPv6 address needs brackets, [ADDRESS]:PORT")
    return bare_host(host), int(port)


def family(host: str) -> socket.AddressFamily:
    """The socket family of an IP address (a host name: IPv4's)."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _ephemeral_low() -> int:
    """The first port the kernel hands out for outgoing connections (32768 if unread)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int, host: str = "127.0.0.1", taken: Iterable[int] = ()) -> list[int]:
    """``count`` different :func:`free_port` picks, none of them in ``taken`` (ports this
    process was given and has not bound yet). Picks nothing binds yet are invisible to
    the next pick: two servers started from two picks in a row could get one port, and
    HAProxy and grpc-core would share it without a word (``SO_REUSEPORT``)."""
    avoid, ports = set(taken), list[int]()
    while len(ports) < count:
        port = free_port(host)
        if port not in avoid:
            avoid.add(port)
            ports.append(port)
    return ports


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now, for a server to bind soon after: below the
    kernel's ephemeral range when there is room, so that no outgoing connection takes
    it meanwhile (one did, with a port the kernel had handed out: an HAProxy that bound
    it a moment later found it taken). Else one the kernel picks. More than one port:
    :func:`free_ports`."""
    low = _ephemeral_low()
    for _ in range(50 if low > PORTS_FROM + 1000 else 0):
        port = random.randrange(PORTS_FROM, low)
        with socket.socket(family(host), socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(family(host), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
