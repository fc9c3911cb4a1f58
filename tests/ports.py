"""A TCP port for a test's own server (torchrun's master, a store, an HTTP server), outside the kernel's
ephemeral range.

``bind(("127.0.0.1", 0))`` hands out an ephemeral port, and between closing that probe and the job
binding it, any other connection on the machine (gloo opens dozens per job, and two test workers run
jobs side by side) may be given the same port: torchrun then fails with EADDRINUSE. A port below the
ephemeral range is never handed out to a connection; picking it at random and checking that it is
free now leaves only another test picking the same one, which the check makes rare and the random
choice keeps independent of timing.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOW = 20000  # above the well-known and registered services most machines run


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A port nobody listens on now, never one the kernel hands out to a connection (on Linux)."""
    hi = _ephemeral_start() - 1
    rng = random.SystemRandom()  # independent of the test order's seeded random
    for _ in range(200):
        port = rng.randint(_LOW, hi) if hi > _LOW else rng.randint(1024, 65535)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    with socket.socket() as s:  # a machine with every low port taken: fall back to an ephemeral one
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
