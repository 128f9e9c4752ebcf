"""Activation checkpointing of the HEPTv2 backbone, decided in one place.

The runner calls each layer either directly or under ``torch.utils.checkpoint.checkpoint``
(non-reentrant, RNG state preserved so dropout replays exactly). Checkpointing only applies when
the model is training and gradients are enabled: in evaluation and under ``no_grad`` there is
nothing to save, so the layers run directly. The policy changes what is kept for backward, never
the result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch import nn

from heptstudy.config import HEPTv2Config


def checkpoint_wanted(cfg: HEPTv2Config, layer_index: int, module: nn.Module) -> bool:
    if not cfg.activation_checkpointing:
        return False
    if not (module.training and torch.is_grad_enabled()):
        return False
    return layer_index % cfg.checkpoint_every == 0


def run_layer(layer: nn.Module, cfg: HEPTv2Config, layer_index: int, *args) -> torch.Tensor:
    if not checkpoint_wanted(cfg, layer_index, layer):
        return layer(*args)
    context_fn = _policy_context(cfg.activation_checkpointing_policy)
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


def _policy_context(policy: str) -> Callable:
    if policy == "full":
        return torch_checkpoint.noop_context_fn
    raise ValueError(f"model.heptv2.activation_checkpointing_policy={policy!r} is not implemented")
