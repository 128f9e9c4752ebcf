"""The host memory allocator a CPU measurement runs with: which one, its settings, and applying
them inside the measuring process.

On CPU, glibc's allocator as it comes hands large freed blocks back to the kernel, so a step
without checkpointing has the kernel map and zero its activations' pages again on every step
(``experiments/cpu_allocator/``): the step time then measures page faults, not recomputation.
A platform profile states the setting its runs need in ``env`` (``local_cpu``: glibc's
``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_``/``MALLOC_TOP_PAD_``). glibc reads those
variables only when a process starts; every measurement applies the same settings itself, with
``mallopt`` at the start of the measurement (:func:`apply_allocator`), so that ``heptstudy
bench``, a notebook and a study run measure the same way whatever environment started them
(``experiments/allocator_entry_points/``). ``mallopt`` takes a C ``int``: a setting above
2 GiB - 1 is applied as 2 GiB - 1, and the report records the values applied.

Every report records the allocator, its settings and what was applied
(:func:`allocator_state`); settings not applied come from ``/proc/self/environ`` (the
environment at process start, not later changes).
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

#: Environment variables that choose or tune the allocator: glibc (``MALLOC_*_``,
#: ``GLIBC_TUNABLES``), jemalloc (``MALLOC_CONF``), tcmalloc (``TCMALLOC_*``), mimalloc.
_PREFIXES = ("MALLOC_", "GLIBC_TUNABLES", "TCMALLOC_", "MIMALLOC_", "JEMALLOC_")
#: A preloaded allocator library is an allocator setting too.
_PRELOADED = ("jemalloc", "tcmalloc", "mimalloc")
#: glibc's ``mallopt`` parameter (``malloc.h``) of each variable it reads at process start.
_MALLOPT = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_TOP_PAD_": -2, "MALLOC_MMAP_THRESHOLD_": -3}
_INT_MAX = 2**31 - 1
#: What this process has applied so far ({variable: (setting, value applied)}): mallopt cannot be
#: undone, so a later measurement in the same process runs with it too, and says so.
_APPLIED: dict[str, tuple[str, int]] = {}


def is_allocator_variable(name: str, value: str = "") -> bool:
    if name == "LD_PRELOAD":
        return any(lib in value for lib in _PRELOADED)
    return name.startswith(_PREFIXES)


def allocator_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The allocator variables of ``env``, sorted by name."""
    return {k: env[k] for k in sorted(env) if is_allocator_variable(k, env[k])}


#: The profile whose allocator settings a CPU measurement without a platform runs with.
CPU_PROFILE = "local_cpu"


def measurement_allocator(profile, device_type: str) -> dict[str, str] | None:
    """The allocator settings a measurement applies: its platform profile's (a
    :class:`~heptstudy.config.PlatformConfig`), else on a CPU the ``local_cpu`` profile's (a
    CPU step time without them measures page faults), else None."""
    if profile is None and device_type == "cpu":
        profile = load_platform(PLATFORM_DIR / f"{CPU_PROFILE}.yaml")
    return (allocator_settings(profile.env) or None) if profile is not None else None


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


@dataclass(frozen=True)
class AllocatorState:
    """The allocator a measurement ran with: its name, its settings (``{}``: the defaults) and
    the ``mallopt`` values applied in the process (None: nothing applied)."""

    name: str
    settings: dict[str, str] = field(default_factory=dict)
    applied: dict[str, int] | None = None


def allocator_in_use() -> AllocatorState:
    """This process's allocator: its settings from the start environment, with what
    :func:`apply_allocator` applied in it since (mallopt stays in effect)."""
    settings = allocator_settings(start_environment())
    if not _APPLIED:
        return AllocatorState(allocator_name(settings), settings)
    settings.update({k: v for k, (v, _) in _APPLIED.items()})
    applied = {k: n for k, (_, n) in _APPLIED.items()}
    return AllocatorState(allocator_name(settings), dict(sorted(settings.items())), applied)


def apply_allocator(settings: Mapping[str, str]) -> AllocatorState:
    """Apply ``settings`` to this process's allocator now (glibc ``mallopt``; call it at the
    start of the measurement) and say what it runs with. ``{}``: nothing applied, the allocator
    as the process was started. A setting the process was started with already (``LD_PRELOAD``
    of another allocator, say) is in effect; any other that ``mallopt`` cannot make is refused,
    since the measurement would not be what its platform asks for."""
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


def _heap_range() -> tuple[int, int] | None:
    """The address range of this process's heap (``[heap]`` in ``/proc/self/maps``), if any."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if line.rstrip().endswith("[heap]"):
                    start, end = line.split()[0].split("-")
                    return int(start, 16), int(end, 16)
    except OSError:
        pass
    return None


def populate_heap() -> int:
    """Give the heap at least ``MALLOC_TOP_PAD_`` of free top and map every page of it now: the
    heap's bytes, or 0 when the allocator runs as it comes (it hands freed memory back, so there
    is nothing to keep mapped) or this cannot be done (no ``[heap]``, a kernel older than 5.14).
    Call it between the warm-up and the counted steps.

    With the heap kept and padded, a page the allocator holds is still mapped by the kernel only
    on its first touch: a counted step that reuses a free chunk the warm-up never wrote, or that
    reaches above the warm-up's high-water mark into the top pad, pays those faults. How many
    depends on the heap's layout, which the entry point shapes (a notebook kernel allocates more
    before the measurement than a bench process) and which varies from run to run: touching a
    fixed 512 MiB of the pad instead left 9 to 37,000 faults per counted step, mapping the heap
    as the warm-up left it still up to 74,000 in the uncheckpointed batch-4 step that needs more
    than the warm-up (``experiments/allocator_entry_points/``). A block of the pad's size,
    allocated and freed, grows the heap's free top to at least the pad (glibc trims what exceeds
    the trim threshold back to the pad); ``MADV_POPULATE_WRITE`` then maps the whole heap without
    writing to it, so live data is untouched."""
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
    heap = _heap_range()
    if heap is None:
        return 0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    start, end = heap
    if libc.madvise(start, end - start, _MADV_POPULATE_WRITE) != 0:
        return 0
    return end - start


def environment_with(settings: Mapping[str, str], base: Mapping[str, str] | None = None):
    """``base`` (default: this environment) with exactly ``settings`` as allocator variables:
    other allocator variables are removed, so ``{}`` means the allocator's defaults."""
    base = os.environ if base is None else base
    env = {k: v for k, v in base.items() if not is_allocator_variable(k, v)}
    env.update(settings)
    return env


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
