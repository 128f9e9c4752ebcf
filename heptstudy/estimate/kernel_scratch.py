"""Kernel-internal scratch: memory an op's kernel allocates and frees before it returns.

No dispatch-level tracker sees it, yet the caching allocator does (``logsumexp``'s composite
kernel allocates an input-sized ``(self - max).exp_()``). :data:`SCRATCH` is the fake step's
table (bytes as a multiple of one argument's), added by the tracker as a transient at that op;
:func:`probe` measures an op's scratch on small real CPU tensors by following the calls inside
its composite kernel (the same code on every device), and the tests check the table against it.
Scratch inside native CUDA kernels cannot be found on a CPU.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from heptstudy.meters.memory import iter_tensors


@dataclass(frozen=True)
class ScratchRule:
    """``factor`` (or ``factor_of(args)``) times the bytes of the ``arg``-th argument."""

    arg: int
    factor: float
    note: str
    factor_of: Callable[[tuple], float] | None = None

    def bytes_for(self, args) -> int:
        t = args[self.arg] if len(args) > self.arg else None
        if not isinstance(t, torch.Tensor):
            return 0
        factor = self.factor_of(args) if self.factor_of is not None else self.factor
        return int(factor * t.numel() * t.element_size())


def _bce_factor(args) -> float:
    # reduction (argument 4): none keeps one input-sized temporary, a reduction two
    reduction = args[4] if len(args) > 4 else 1
    return 1.0 if reduction == 0 else 2.0


def _aten(name: str):
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


#: op -> rule; factors as :func:`probe` measures them with PyTorch 2.13 on CPU (composite
#: kernels: the same code runs on CUDA).
SCRATCH: dict[torch._ops.OpOverload, ScratchRule] = {
    _aten("logsumexp"): ScratchRule(0, 1.0, "(self - max).exp_() before the sum"),
    _aten("binary_cross_entropy_with_logits"): ScratchRule(
        0, 2.0, "log-sigmoid and weighted terms (before the reduction, if any)", _bce_factor
    ),
}


def scratch_bytes(func, args) -> int:
    """Scratch bytes of one op call (0 for an op not in :data:`SCRATCH`)."""
    rule = SCRATCH.get(func)
    return 0 if rule is None else rule.bytes_for(args)


class _Probe(TorchDispatchMode):
    """Counts the storages allocated inside one op's composite kernel."""

    def __init__(self, op):
        super().__init__()
        self.op = op
        self.inside = False
        self.live = 0
        self.peak = 0
        self.seen: dict[int, int] = {}
        self.outside: set[int] = set()  # storages of the arguments: not the kernel's

    def _free(self, key: int) -> None:
        self.live -= self.seen.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is self.op and not self.inside:
            self.inside = True
            try:
                if not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _CEA):
                    raise ValueError(
                        f"{func} has no composite kernel to follow (CompositeExplicitAutograd): "
                        "its scratch, if any, is inside a native kernel, which a CPU probe "
                        "cannot see"
                    )
                with self:  # the kernel's own ATen calls come back through this mode
                    return func._op_dk(_CEA, *args, **kwargs)
            finally:
                self.inside = False
        key = _followed_key(func) if self.inside else None
        if key is not None:
            with self:  # follow nested kernels (e.g. an op into its out= variant)
                out = func._op_dk(key, *args, **kwargs)
        else:
            out = func(*args, **kwargs)
        if self.inside:
            for t in iter_tensors(out):
                s = t.untyped_storage()
                key = id(s)
                if key not in self.seen and key not in self.outside:
                    self.seen[key] = s.nbytes()
                    self.live += s.nbytes()
                    weakref.finalize(s, self._free, key)
            self.peak = max(self.peak, self.live)
        return out


_CEA = torch._C.DispatchKey.CompositeExplicitAutograd
_FOLLOWED = (
    _CEA,
    torch._C.DispatchKey.CompositeExplicitAutogradNonFunctional,
    torch._C.DispatchKey.CPU,
)


def _followed_key(op):
    """The kernel whose own ATen calls the probe follows: the composite one, else the CPU one."""
    for key in _FOLLOWED:
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key):
            return key
    return None


def probe(op, *args, **kwargs) -> int:
    """Peak bytes allocated inside ``op``'s composite kernel beyond its result, on these (small,
    real CPU) arguments."""
    p = _Probe(op)
    p.outside = {id(t.untyped_storage()) for t in iter_tensors([*args, *kwargs.values()])}
    with p:
        out = op(*args, **kwargs)
    kept = 0
    for t in iter_tensors(out):
        kept += p.seen.get(id(t.untyped_storage()), 0)
    return max(0, p.peak - kept)
