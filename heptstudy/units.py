"""Byte units used by every report, table and figure (binary: MiB = 2**20 bytes), and the host
memory that a requested size is checked against before anything is allocated."""

from __future__ import annotations

from heptstudy.errors import HeptstudyError

MIB = 1024**2
GIB = 1024**3


class TooLarge(HeptstudyError):
    """A requested size cannot fit in this machine's memory."""


def host_memory_available() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (None where the system does not say)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def refuse_above_memory(need: int, what: str, advice: str) -> None:
    """Raise :class:`TooLarge` when ``need`` bytes (a lower bound) exceed the available memory."""
    free = host_memory_available()
    if free is not None and need > free:
        raise TooLarge(
            f"{what} needs at least {need / GIB:,.1f} GiB of memory, but this host has "
            f"{free / GIB:,.1f} GiB available (MemAvailable), so nothing was allocated. {advice}"
        )
