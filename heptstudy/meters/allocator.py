"""The host memory allocator a CPU measurement runs with: which one, its settings, and applying
them inside the measuring process.

glibc as it comes hands large freed blocks back to the kernel, so an uncheckpointed CPU step
pays page faults for its activations on every step (``experiments/cpu_allocator/``). glibc reads
a profile's settings only at process start, so every measurement applies them with ``mallopt``.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from heptstudy.config import load_platform
from heptstudy.errors import HeptstudyError
from heptstudy.paths import PLATFORM_DIR
from heptstudy.units import GIB

#: Environment variables that choose or tune the allocator (glibc, jemalloc, tcmalloc, mimalloc).
_PREFIXES = ("MALLOC_", "GLIBC_TUNABLES", "TCMALLOC_", "MIMALLOC_", "JEMALLOC_")
_PRELOADED = ("jemalloc", "tcmalloc", "mimalloc")
#: glibc's ``mallopt`` parameter (``malloc.h``) of each variable it reads at process start.
_MALLOPT = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_TOP_PAD_": -2, "MALLOC_MMAP_THRESHOLD_": -3}
_INT_MAX = 2**31 - 1
#: {variable: (setting, value applied)}: mallopt cannot be undone, so later measurements in
#: this process run with it too, and say so.
_APPLIED: dict[str, tuple[str, int]] = {}


def is_allocator_variable(name: str, value: str = "") -> bool:
    if name == "LD_PRELOAD":
        return any(lib in value for lib in _PRELOADED)
    return name.startswith(_PREFIXES)


def allocator_settings(env: Mapping[str, str]) -> dict[str, str]:
    return {k: env[k] for k in sorted(env) if is_allocator_variable(k, env[k])}


def measurement_allocator(profile, device_type: str) -> dict[str, str] | None:
    """The allocator settings of the platform profile, else on a CPU ``local_cpu``'s, else None."""
    if profile is None and device_type == "cpu":
        profile = load_platform(PLATFORM_DIR / "local_cpu.yaml")
    return (allocator_settings(profile.env) or None) if profile is not None else None


def start_environment() -> dict[str, str]:
    """The environment this process was started with, else (no ``/proc``) the current one."""
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
    """The preloaded allocator's name, else the C library's (``glibc 2.36``)."""
    preload = settings.get("LD_PRELOAD", "")
    for lib in _PRELOADED:
        if lib in preload:
            return lib
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or "libc"
    except (AttributeError, ValueError, OSError):
        return "libc"


@dataclass(frozen=True)
class AllocatorState:
    name: str
    settings: dict[str, str] = field(default_factory=dict)
    applied: dict[str, int] | None = None


def allocator_in_use() -> AllocatorState:
    """This process's allocator: start environment plus what :func:`apply_allocator` applied."""
    settings = allocator_settings(start_environment())
    if not _APPLIED:
        return AllocatorState(allocator_name(settings), settings)
    settings.update({k: v for k, (v, _) in _APPLIED.items()})
    applied = {k: n for k, (_, n) in _APPLIED.items()}
    return AllocatorState(allocator_name(settings), dict(sorted(settings.items())), applied)


def apply_allocator(settings: Mapping[str, str]) -> AllocatorState:
    """Apply ``settings`` now with glibc's ``mallopt``; one it cannot make is refused, since the
    measurement would not be what its platform asks for."""
    if not settings:
        return allocator_in_use()
    started = allocator_in_use()
    wanted = {k: v for k, v in settings.items() if started.settings.get(k) != v}
    unknown = sorted(set(wanted) - set(_MALLOPT))
    if unknown or (wanted and not started.name.startswith("glibc")):
        why = (
            f"{unknown} cannot be set with mallopt" if unknown else f"{started.name} has no mallopt"
        )
        raise HeptstudyError(
            f"the allocator settings {dict(settings)} cannot be applied inside the measuring "
            f"process: {why} (heptstudy applies {', '.join(_MALLOPT)} of glibc). Start the "
            "process with them ("
            + " ".join(f"{k}={v}" for k, v in wanted.items())
            + " heptstudy bench ...), or measure with allocator: default (--allocator default)"
        )
    libc = ctypes.CDLL(None)
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    applied = {}
    for variable, value in wanted.items():
        if not str(value).isdigit():
            raise HeptstudyError(
                f"allocator setting {variable}={value!r} is not a byte count; give a whole "
                "number of bytes in the platform profile's env, e.g. 1073741824"
            )
        applied[variable] = min(int(value), _INT_MAX)
        if libc.mallopt(_MALLOPT[variable], applied[variable]) != 1:
            raise HeptstudyError(
                f"glibc refused mallopt({variable}={applied[variable]}); give a smaller value "
                "in the platform profile's env, or measure with allocator: default"
            )
        _APPLIED[variable] = (str(value), applied[variable])
    state = allocator_in_use()
    return AllocatorState(state.name, state.settings, {**(state.applied or {}), **applied})


#: ``madvise`` advice that maps the pages of a range writable without changing them (Linux 5.14+).
_MADV_POPULATE_WRITE = 23


def populate_heap() -> int:
    """Grow the heap's free top to ``MALLOC_TOP_PAD_`` and map every page of it; call it between
    warm-up and counted steps. Returns the heap's bytes, or 0 when not done.

    A kept page is mapped only on first touch, so a counted step reaching memory the warm-up
    never wrote would pay faults (``experiments/allocator_entry_points/``)."""
    state = allocator_in_use()
    if not state.name.startswith("glibc") or not state.settings:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    pad = state.settings.get("MALLOC_TOP_PAD_", "")
    if pad.isdigit() and int(pad) > 0:
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        libc.free(libc.malloc(min(int(pad), _INT_MAX)))
    try:
        with open("/proc/self/maps") as maps:
            heap = next(
                (line.split()[0] for line in maps if line.rstrip().endswith("[heap]")), None
            )
    except OSError:
        return 0
    if heap is None:
        return 0
    start, end = (int(a, 16) for a in heap.split("-"))
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if libc.madvise(start, end - start, _MADV_POPULATE_WRITE) != 0:
        return 0
    return end - start


def environment_with(settings: Mapping[str, str], base: Mapping[str, str] | None = None):
    """``base`` (default: this environment) with exactly ``settings`` as allocator variables."""
    base = os.environ if base is None else base
    env = {k: v for k, v in base.items() if not is_allocator_variable(k, v)}
    env.update(settings)
    return env


def allocator_label(report) -> str | None:
    """``glibc 2.36 (defaults)`` or with its settings (``MALLOC_TOP_PAD_=1 GiB, ...``: whole GiB
    in GiB); None for reports that did not record it."""
    env = report.environment
    if env.allocator is None and env.allocator_settings is None:
        return None
    parts = []
    for k, v in (env.allocator_settings or {}).items():
        if v.isdigit() and int(v) >= GIB and int(v) % GIB == 0:
            v = f"{int(v) // GIB} GiB"
        parts.append(f"{k}={v}")
    return f"{env.allocator or 'allocator'} ({', '.join(parts) or 'defaults'})"
