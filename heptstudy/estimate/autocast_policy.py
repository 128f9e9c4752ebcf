"""CUDA autocast's op lists, emulated on CPU (fake) tensors.

CPU autocast's lists differ from CUDA's (which runs e.g. ``logsumexp``, ``pow`` and the norms in
float32, ``einsum`` in bf16), and a fake CUDA tensor cannot enter CUDA autocast on a CPU build.
So inside :func:`target_autocast` the target's lists replace CPU autocast's kernels at the
``AutocastCPU`` key (a fallthrough for ops only CPU lists, a Python kernel per listed op), and
model code, autocast regions and checkpoint's autocast state run unchanged with the target's
dtypes. ROCm registers CUDA's lists. The lists are data, ``autocast_lists.json``: one entry per
PyTorch version, each naming its ``autocast_mode.h`` source or the entry it derives from.
"""

from __future__ import annotations

import contextlib
import json
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import reduce
from importlib import resources

import torch

from heptstudy.meters.memory import iter_tensors

AUTOCAST_KEY = "AutocastCPU"


@dataclass(frozen=True)
class AutocastLists:
    """One PyTorch version's CUDA autocast lists (op names as ``name`` or ``name.overload``)."""

    version: str
    lower_precision: tuple[str, ...]
    fp32: tuple[str, ...]
    fp32_set_opt_dtype: tuple[str, ...]
    fp32_append_dtype: dict[str, str]
    promote: tuple[str, ...]
    source: str


def _load_lists() -> dict[str, AutocastLists]:
    """The versions of ``autocast_lists.json``; ``like``: another's lists less ``remove``."""
    raw = json.loads(resources.files(__package__).joinpath("autocast_lists.json").read_text())
    out: dict[str, AutocastLists] = {}
    for version, entry in raw["versions"].items():
        lists = {k: v for k, v in entry.items() if k not in ("like", "remove", "source")}
        if "like" in entry:
            base = out[entry["like"]]
            lists = {k: getattr(base, k) for k in _POLICY_FIELDS} | lists
        for policy, names in entry.get("remove", {}).items():
            lists[policy] = [n for n in lists[policy] if n not in names]
        out[version] = AutocastLists(
            version,
            **{k: dict(v) if k == "fp32_append_dtype" else tuple(v) for k, v in lists.items()},
            source=entry["source"],
        )
    return out


_POLICY_FIELDS = ("lower_precision", "fp32", "fp32_set_opt_dtype", "fp32_append_dtype", "promote")
POLICIES = _load_lists()


class UnknownTorchVersion(ValueError):
    """No autocast table for the requested PyTorch version."""


def lists_for(torch_version: str) -> AutocastLists:
    """The autocast lists of ``torch_version`` (``2.11``, ``2.11.0+cu130``...: major.minor)."""
    key = ".".join(str(torch_version).split("+")[0].split(".")[:2])
    if key not in POLICIES:
        raise UnknownTorchVersion(
            f"no CUDA autocast table for PyTorch {torch_version!r}; known: "
            f"{', '.join(sorted(POLICIES))}. Name one of these (e.g. in the platform profile's "
            "torch_version) or add the version's lists, read from its "
            "aten/src/ATen/autocast_mode.h, to heptstudy/estimate/autocast_lists.json"
        )
    return POLICIES[key]


def aten_op(name: str) -> torch._ops.OpOverload | None:
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


def _eligible(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


def _map_tensors(obj, fn):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(x, fn) for x in obj)
    return obj


@dataclass
class AutocastEmulation:
    """Calls of each listed op, the listed ops this build lacks, and the lower-precision ops
    both lists share (CPU autocast's own kernel runs them)."""

    calls: dict[str, int] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    kept_cpu: list[str] = field(default_factory=list)


def _dtype_slot(op: torch._ops.OpOverload) -> tuple[int | None, bool]:
    """Where ``op``'s ``dtype`` argument goes: (positional index or None, kwarg-only?)."""
    for i, arg in enumerate(op._schema.arguments):
        if arg.name == "dtype":
            return (None, True) if arg.kwarg_only else (i, False)
    return None, False


def _kernel(emu: AutocastEmulation, name: str, policy: str, op, redispatch=None):
    dtype_index, dtype_kwarg = _dtype_slot(op) if policy == "fp32_set_opt_dtype" else (None, False)
    defaults = [a.default_value if a.has_default_value() else None for a in op._schema.arguments]

    def kernel(*args, **kwargs):
        emu.calls[name] = emu.calls.get(name, 0) + 1
        with torch._C._ExcludeDispatchKeyGuard(
            torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
        ):
            if policy in ("lower_precision", "fp32", "promote"):
                if policy == "promote":  # to the widest floating dtype, when they differ
                    floats = [
                        t.dtype for t in iter_tensors((args, list(kwargs.values()))) if _eligible(t)
                    ]
                    to = reduce(torch.promote_types, floats) if len(set(floats)) > 1 else None
                elif policy == "fp32":
                    to = torch.float32
                else:
                    to = torch.get_autocast_dtype("cpu")
                if to is not None:
                    args, kwargs = _cast_all(args, kwargs, to)
                return op(*args, **kwargs)
            first = next(iter_tensors(args), None)
            if first is None or not _eligible(first):
                return op(*args, **kwargs)
            if policy == "fp32_append_dtype":
                return redispatch(*args, dtype=torch.float32, **kwargs)
            # fp32_set_opt_dtype: a float32 result unless the caller chose a dtype
            if dtype_kwarg:
                if kwargs.get("dtype") is None:
                    kwargs = {**kwargs, "dtype": torch.float32}
            elif dtype_index is not None:
                args = list(args)
                while len(args) <= dtype_index:
                    args.append(defaults[len(args)])
                if args[dtype_index] is None:
                    args[dtype_index] = torch.float32
            return op(*args, **kwargs)

    return kernel


def _cast_all(args, kwargs, dtype):
    def cast(t):
        return t.to(dtype) if _eligible(t) and t.dtype != dtype else t

    return _map_tensors(tuple(args), cast), {k: _map_tensors(v, cast) for k, v in kwargs.items()}


def _cpu_autocast_ops() -> list[str]:
    """Ops with a kernel at ``AutocastCPU`` in this process (CPU autocast's registrations)."""
    return sorted(
        n
        for n in torch._C._dispatch_get_all_op_names()
        if n.startswith("aten::")
        and torch._C._dispatch_has_kernel_for_dispatch_key(n, AUTOCAST_KEY)
    )


_INSTALLED = threading.Lock()


@contextlib.contextmanager
def target_autocast(torch_version: str = "2.11") -> Iterator[AutocastEmulation]:
    """Inside the block, ``torch.autocast('cpu')`` regions follow CUDA's (and so ROCm's)
    autocast lists of ``torch_version``. Not re-entrant (one emulation per process at a time)."""
    lists = lists_for(torch_version)
    if not _INSTALLED.acquire(blocking=False):
        raise RuntimeError("a target autocast emulation is already installed in this process")
    emu = AutocastEmulation()
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            # replacing CPU autocast's kernels is the point: no "overriding a kernel" warning
            warnings.filterwarnings("ignore", message=".*[Oo]verrid")
            _register(lib, emu, lists)
        yield emu
    finally:
        lib._destroy()
        _INSTALLED.release()


def _register(lib, emu: AutocastEmulation, lists: AutocastLists) -> None:
    # CPU's kernels of shared lower-precision ops stay: they cast with ``cached_cast`` exactly as
    # CUDA's do. Python kernels cast without the cache (only parameters would use it).
    cpu_ops = _cpu_autocast_ops()
    cpu_set = set(cpu_ops)
    listed: set[str] = set()
    for policy in ("lower_precision", "fp32", "fp32_set_opt_dtype", "promote"):
        for name in getattr(lists, policy):
            op = aten_op(name)
            if op is None:
                emu.missing.append(name)
                continue
            qualified = _qualified(op)
            listed.add(qualified)
            if policy == "lower_precision" and qualified in cpu_set:
                emu.kept_cpu.append(name)
                continue
            lib.impl(qualified[len("aten::") :], _kernel(emu, name, policy, op), AUTOCAST_KEY)
    for name, target_name in lists.fp32_append_dtype.items():
        op, redispatch = aten_op(name), aten_op(target_name)
        if op is None or redispatch is None:
            emu.missing.append(name)
            continue
        lib.impl(name, _kernel(emu, name, "fp32_append_dtype", op, redispatch), AUTOCAST_KEY)
        listed.add(_qualified(op))
    for qualified in cpu_ops:
        if qualified not in listed:
            lib.impl(qualified[len("aten::") :], torch.library.fallthrough_kernel, AUTOCAST_KEY)


def _qualified(op: torch._ops.OpOverload) -> str:
    """``aten::name`` or ``aten::name.overload``."""
    return op._schema.name + ("" if op._overloadname == "default" else f".{op._overloadname}")
