"""What a checkpointed layer keeps for backward. ``full``: only its inputs, recomputed *lean*
(SwiGLU keeps nothing it can recompute by slice, so recomputation holds no hidden-width tensor of
the batch). ``selective``: the dense projections' products (:data:`SELECTIVE_SAVE_OPS`).
``ops``: the outputs of chosen op groups (:mod:`heptstudy.model.op_groups`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial

import torch.utils.checkpoint as torch_checkpoint
from torch import nn

from heptstudy.model import op_groups


class _ThreadState(threading.local):
    lean: bool = False
    #: per thread: recomputation runs in the backward's thread
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
    """True inside a ``full``-policy checkpointed layer."""
    return _STATE.lean


#: ``selective`` keeps these ops' outputs inside ``dense_projections`` (most of the arithmetic;
#: the SwiGLU with its hidden products); the bucket attention (the bulk of the activation
#: memory, cheap to redo) is recomputed.
SELECTIVE_SAVE_OPS = frozenset({"aten::mm", "aten::addmm", "heptstudy::swiglu"})


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
    if op_groups.op_name(op) in SELECTIVE_SAVE_OPS and running is not None and id(running) in saved:
        return torch_checkpoint.CheckpointPolicy.MUST_SAVE
    return torch_checkpoint.CheckpointPolicy.PREFER_RECOMPUTE


def policy_context(
    policy: str, layer: nn.Module, kind: str = "backbone", keep: frozenset[str] = frozenset()
) -> Callable:
    """The ``context_fn`` of ``torch.utils.checkpoint.checkpoint`` for ``policy``; ``ops``
    keeps the op groups ``keep`` of a ``kind`` layer (:mod:`heptstudy.model.op_groups`)."""
    if policy == "full":
        return torch_checkpoint.noop_context_fn
    if policy == "ops":
        return op_groups.policy_context(layer, kind, keep)
    if policy == "selective":
        projections = layer.dense_projections()
        _track_projections(projections)
        keep = partial(_save_dense_projections, frozenset(id(m) for m in projections))
        return partial(torch_checkpoint.create_selective_checkpoint_contexts, keep)
    raise ValueError(
        f"checkpointing policy {policy!r} is not implemented; use full, selective or ops"
    )
