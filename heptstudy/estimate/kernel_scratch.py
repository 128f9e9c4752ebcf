"""Kernel-internal scratch: memory an op's kernel allocates and frees before it returns.

No dispatch-level tracker sees it, yet the caching allocator does (``logsumexp``'s composite
kernel allocates an input-sized ``(self - max).exp_()``). :data:`SCRATCH` is the fake step's
table (bytes as a multiple of one argument's), added by the tracker as a transient at that op;
tests/test_estimate_target.py checks it against a probe that follows the calls inside each op's
composite kernel on small real CPU tensors (the same code on every device). Scratch inside
native CUDA kernels cannot be found on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from heptstudy.estimate.autocast_policy import aten_op


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


#: op -> rule; factors as the tests' probe measures them with PyTorch 2.13 on CPU (composite
#: kernels: the same code runs on CUDA).
SCRATCH: dict[torch._ops.OpOverload, ScratchRule] = {
    aten_op("logsumexp"): ScratchRule(0, 1.0, "(self - max).exp_() before the sum"),
    aten_op("binary_cross_entropy_with_logits"): ScratchRule(
        0, 2.0, "log-sigmoid and weighted terms (before the reduction, if any)", _bce_factor
    ),
}


def scratch_bytes(func, args) -> int:
    """Scratch bytes of one op call (0 for an op not in :data:`SCRATCH`)."""
    rule = SCRATCH.get(func)
    return 0 if rule is None else rule.bytes_for(args)
