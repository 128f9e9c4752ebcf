"""What a checkpointed layer keeps for backward: the policies of
:mod:`heptstudy.model.checkpoint_plan`.

``full`` keeps only the layer's inputs and recomputes the whole layer in backward, *lean*: the
memory-lean functions of the layer (:class:`heptstudy.model.heptv2.SwiGLU`) then keep nothing
that their own backward can recompute slice by slice, so one layer's recomputation holds no
hidden-width tensor of the whole batch. ``selective`` keeps the products of the layer's dense
projections (:data:`SELECTIVE_SAVE_OPS`) and recomputes the rest.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch import nn


class _ThreadState(threading.local):
    #: inside a ``full``-policy checkpointed layer (its first forward, whose saved tensors are
    #: dropped, or its recomputation inside backward)
    lean: bool = False
    #: the dense-projection module running (the recomputation inside backward runs the modules
    #: again, in the thread that runs the backward)
    projection: nn.Module | None = None


_STATE = _ThreadState()


@contextmanager
def lean_recompute() -> Iterator[None]:
    previous, _STATE.lean = _STATE.lean, True
    try:
        yield
    finally:
        _STATE.lean = previous


def recompute_is_lean() -> bool:
    """True inside a ``full``-policy checkpointed layer: keep only what cannot be recomputed
    from the layer's own inputs slice by slice."""
    return _STATE.lean


#: ``selective``: the outputs of these ops are kept for backward when a module of the layer's
#: :meth:`~heptstudy.model.heptv2.HEPTv2Layer.dense_projections` runs them (q/k/v, attention
#: output, SwiGLU gate/up and down: most of the layer's floating-point work, about 1,660 floats
#: per hit); everything else in the layer is recomputed: the positional MLP (nearly free), the
#: bucket attention (its scores and probabilities are the bulk of the activation memory, from
#: small batched products), norms, activations and dropout (replayed with the saved RNG state).
SELECTIVE_SAVE_OPS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.addmm.default})


_HOOKED_ATTR = "_selective_checkpoint_hooks"


def _enter(module: nn.Module, _args) -> None:
    _STATE.projection = module


def _leave(module: nn.Module, _args, _output) -> None:
    _STATE.projection = None


def _track_projections(modules: Sequence[nn.Module]) -> None:
    """Hooks that tell the policy which projection is running; installed once per module."""
    for module in modules:
        if not getattr(module, _HOOKED_ATTR, False):
            module.register_forward_pre_hook(_enter)
            module.register_forward_hook(_leave)
            setattr(module, _HOOKED_ATTR, True)


def _save_dense_projections(saved: frozenset[int], ctx, op, *args, **kwargs):
    running = _STATE.projection
    if op in SELECTIVE_SAVE_OPS and running is not None and id(running) in saved:
        return torch_checkpoint.CheckpointPolicy.MUST_SAVE
    return torch_checkpoint.CheckpointPolicy.PREFER_RECOMPUTE


def policy_context(policy: str, layer: nn.Module) -> Callable:
    """The ``context_fn`` of ``torch.utils.checkpoint.checkpoint`` for ``policy``."""
    if policy == "full":
        return torch_checkpoint.noop_context_fn
    if policy == "selective":
        projections = layer.dense_projections()
        _track_projections(projections)
        keep = partial(_save_dense_projections, frozenset(id(m) for m in projections))
        return partial(torch_checkpoint.create_selective_checkpoint_contexts, keep)
    raise ValueError(f"checkpointing policy {policy!r} is not implemented; use full or selective")
