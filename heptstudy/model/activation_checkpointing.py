"""Activation checkpointing of the HEPTv2 backbone, decided in one place.

The runner calls each layer either directly or under ``torch.utils.checkpoint.checkpoint``
(non-reentrant, RNG state preserved so dropout replays exactly). Checkpointing only applies when
the model is training and gradients are enabled: in evaluation and under ``no_grad`` there is
nothing to save, so the layers run directly. The policy changes what is kept for backward, never
the result.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch import nn

from heptstudy.config import HEPTv2Config
from heptstudy.errors import HeptstudyError


def checkpoint_wanted(cfg: HEPTv2Config, layer_index: int, module: nn.Module) -> bool:
    if not cfg.activation_checkpointing:
        return False
    if not (module.training and torch.is_grad_enabled()):
        return False
    if cfg.activation_checkpointing == "auto":
        # a plan is chosen per batch before the step; never guess one here
        raise HeptstudyError(
            "model.heptv2.activation_checkpointing=auto: this training step runs without a "
            "chosen plan; run it under heptstudy.model.adaptive_checkpointing.applied_plan "
            "(the trainer and heptstudy bench do) or set true/false"
        )
    return layer_index % cfg.checkpoint_every == 0


def run_layer(layer: nn.Module, cfg: HEPTv2Config, layer_index: int, *args) -> torch.Tensor:
    if not checkpoint_wanted(cfg, layer_index, layer):
        return layer(*args)
    context_fn = _policy_context(cfg.activation_checkpointing_policy, layer)
    return torch_checkpoint.checkpoint(
        layer, *args, use_reentrant=False, preserve_rng_state=True, context_fn=context_fn
    )


def run_backbone(
    layers: Sequence[nn.Module],
    cfg: HEPTv2Config,
    x: torch.Tensor,
    mask: torch.Tensor,
    coords: torch.Tensor,
    bucket_orders: Sequence,
) -> torch.Tensor:
    """Run the backbone layers in turn; each layer's bucket order is computed beforehand."""
    for i, (layer, order) in enumerate(zip(layers, bucket_orders, strict=True)):
        x = run_layer(layer, cfg, i, x, mask, coords, order)
    return x


#: ``selective``: the outputs of these ops are kept for backward when a module of the layer's
#: :meth:`~heptstudy.model.heptv2.HEPTv2Layer.dense_projections` runs them (q/k/v, attention
#: output, SwiGLU gate/up and down: most of the layer's floating-point work, about 1,660 floats
#: per hit); everything else in the layer is recomputed: the positional MLP (nearly free), the
#: bucket attention (its scores and probabilities are the bulk of the activation memory, from
#: small batched products), norms, activations and dropout (replayed with the saved RNG state).
SELECTIVE_SAVE_OPS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.addmm.default})


class _RunningProjection(threading.local):
    """The dense-projection module running in this thread, if any (the recomputation inside
    backward runs the modules again, in the thread that runs the backward)."""

    module: nn.Module | None = None


_RUNNING = _RunningProjection()
_HOOKED_ATTR = "_selective_checkpoint_hooks"


def _enter(module: nn.Module, _args) -> None:
    _RUNNING.module = module


def _leave(module: nn.Module, _args, _output) -> None:
    _RUNNING.module = None


def _track_projections(modules: Sequence[nn.Module]) -> None:
    """Hooks that tell the policy which projection is running; installed once per module."""
    for module in modules:
        if not getattr(module, _HOOKED_ATTR, False):
            module.register_forward_pre_hook(_enter)
            module.register_forward_hook(_leave)
            setattr(module, _HOOKED_ATTR, True)


def _save_dense_projections(saved: frozenset[int], ctx, op, *args, **kwargs):
    running = _RUNNING.module
    if op in SELECTIVE_SAVE_OPS and running is not None and id(running) in saved:
        return torch_checkpoint.CheckpointPolicy.MUST_SAVE
    return torch_checkpoint.CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context(layer: nn.Module) -> Callable:
    projections = layer.dense_projections()
    _track_projections(projections)
    policy = partial(_save_dense_projections, frozenset(id(m) for m in projections))
    return partial(torch_checkpoint.create_selective_checkpoint_contexts, policy)


def _policy_context(policy: str, layer: nn.Module) -> Callable:
    if policy == "full":
        return torch_checkpoint.noop_context_fn
    if policy == "selective":
        return _selective_context(layer)
    raise ValueError(f"model.heptv2.activation_checkpointing_policy={policy!r} is not implemented")
