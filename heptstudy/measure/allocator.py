"""The host memory allocator a CPU measurement runs with: which one, its settings, and starting
a process with them.

On CPU, glibc's allocator as it comes hands large freed blocks back to the kernel, so a step
without checkpointing has the kernel map and zero its activations' pages again on every step
(``experiments/cpu_allocator/``): the step time then measures page faults, not recomputation.
A platform profile states the setting its runs need in ``env`` (``local_cpu``: glibc's
``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_``/``MALLOC_TOP_PAD_``). glibc reads these
variables once, when the process starts, so they have to be in the environment a process is
*started* with: the study runner starts each notebook kernel with them, and ``heptstudy bench``
starts itself again with them (:func:`start_with`) before it allocates anything.

Every report records what its process was started with (:func:`allocator_in_use`), read from
``/proc/self/environ`` (the environment at process start, not later changes).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from heptstudy.errors import HeptstudyError
from heptstudy.units import GIB

#: Environment variables that choose or tune the allocator: glibc (``MALLOC_*_``,
#: ``GLIBC_TUNABLES``), jemalloc (``MALLOC_CONF``), tcmalloc (``TCMALLOC_*``), mimalloc.
_PREFIXES = ("MALLOC_", "GLIBC_TUNABLES", "TCMALLOC_", "MIMALLOC_", "JEMALLOC_")
#: A preloaded allocator library is an allocator setting too.
_PRELOADED = ("jemalloc", "tcmalloc", "mimalloc")
#: Set while ``heptstudy bench`` restarts itself, so that it restarts at most once.
_RESTARTED = "HEPTSTUDY_ALLOCATOR_RESTARTED"


def is_allocator_variable(name: str, value: str = "") -> bool:
    if name == "LD_PRELOAD":
        return any(lib in value for lib in _PRELOADED)
    return name.startswith(_PREFIXES)


def allocator_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The allocator variables of ``env``, sorted by name."""
    return {k: env[k] for k in sorted(env) if is_allocator_variable(k, env[k])}


def platform_allocator(platform: str | None) -> dict[str, str] | None:
    """The allocator variables a platform profile's ``env`` sets; None without a profile or when
    it sets none (the process keeps what it was started with)."""
    if not platform:
        return None
    from heptstudy.config import load_platform
    from heptstudy.paths import PLATFORM_DIR, find_file

    profile = load_platform(find_file(platform, PLATFORM_DIR) or platform)
    return allocator_settings(profile.env) or None


#: The profile whose allocator settings a CPU measurement without a platform runs with.
CPU_PROFILE = "local_cpu"


def measurement_allocator(platform: str | None, device_type: str) -> dict[str, str] | None:
    """The allocator settings a measurement runs with: its platform's, else on a CPU the
    ``local_cpu`` profile's (a CPU step time without them measures page faults), else None."""
    if platform:
        return platform_allocator(platform)
    return platform_allocator(CPU_PROFILE) if device_type == "cpu" else None


def start_environment() -> dict[str, str]:
    """The environment this process was started with (``/proc/self/environ``), else the current
    one where ``/proc`` is unavailable."""
    try:
        raw = open("/proc/self/environ", "rb").read()  # noqa: SIM115 - one read
    except OSError:
        return dict(os.environ)
    env = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env


def allocator_name(settings: Mapping[str, str]) -> str:
    """``jemalloc``/``tcmalloc``/``mimalloc`` when preloaded, else the C library's allocator
    (``glibc 2.36``)."""
    preload = settings.get("LD_PRELOAD", "")
    for lib in _PRELOADED:
        if lib in preload:
            return lib
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or "libc"
    except (AttributeError, ValueError, OSError):
        return "libc"


def allocator_in_use() -> tuple[str, dict[str, str]]:
    """(allocator, its settings) of this process as started; empty settings: the defaults."""
    settings = allocator_settings(start_environment())
    return allocator_name(settings), settings


def environment_with(settings: Mapping[str, str], base: Mapping[str, str] | None = None):
    """``base`` (default: this environment) with exactly ``settings`` as allocator variables:
    other allocator variables are removed, so ``{}`` means the allocator's defaults."""
    base = os.environ if base is None else base
    env = {k: v for k, v in base.items() if not is_allocator_variable(k, v)}
    env.update(settings)
    return env


def started_as_command() -> bool:
    """Whether this process is the ``heptstudy`` command itself (the console script,
    ``python -m heptstudy`` or ``python -m heptstudy.cli``), which may be started again; not a
    test runner or a notebook kernel calling into the package."""
    from pathlib import Path

    program = Path(sys.argv[0] if sys.argv else "")
    if program.name == "heptstudy":
        return True
    return program.parent.name == "heptstudy" and program.name in ("__main__.py", "cli.py")


def start_with(settings: Mapping[str, str] | None) -> bool:
    """Make sure this process was started with exactly ``settings`` as allocator variables,
    starting the ``heptstudy`` command again (same interpreter, same arguments) with them if
    not. ``None``: keep what the process has. Returns whether the settings are in effect: False
    only in a process that is not the command (a test, a notebook kernel), which cannot be
    started again and measures with what it has (its report says which). Call it before the
    measurement allocates anything."""
    if settings is None or allocator_settings(start_environment()) == dict(settings):
        os.environ.pop(_RESTARTED, None)
        return True
    if not started_as_command():
        return False
    if os.environ.get(_RESTARTED):
        raise HeptstudyError(
            f"started again with the allocator settings {dict(settings)} but the process still "
            f"sees {allocator_settings(start_environment())}; start it yourself with them, e.g. "
            + " ".join(f"{k}={v}" for k, v in settings.items())
            + " heptstudy bench ..."
        )
    env = environment_with(settings)
    env[_RESTARTED] = "1"
    argv = [sys.executable, *getattr(sys, "orig_argv", [sys.executable, *sys.argv])[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)  # replaces this process: does not return


def describe_settings(settings: Mapping[str, str]) -> str:
    """``MALLOC_MMAP_THRESHOLD_=16 GiB, ...`` (byte counts of a GiB or more in GiB), or
    ``defaults``."""
    if not settings:
        return "defaults"
    parts = []
    for k, v in settings.items():
        if v.isdigit() and int(v) >= GIB and int(v) % GIB == 0:
            v = f"{int(v) // GIB} GiB"
        parts.append(f"{k}={v}")
    return ", ".join(parts)


def allocator_label(report) -> str | None:
    """``glibc 2.36 (defaults)``, ``glibc 2.36 (MALLOC_MMAP_THRESHOLD_=16 GiB, ...)``; None for
    reports from before the allocator was recorded."""
    env = report.environment
    name = getattr(env, "allocator", None)
    settings = getattr(env, "allocator_settings", None)
    if name is None and settings is None:
        return None
    return f"{name or 'allocator'} ({describe_settings(settings or {})})"
