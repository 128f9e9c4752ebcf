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
from heptstudy.model.heptv2 import POSITIONAL_HIDDEN


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


#: ``selective``: the outputs of these ops are kept for backward; everything else in a layer is
#: recomputed. They are the layer's dense projections (q/k/v, attention output, SwiGLU gate/up
#: and down): most of its floating-point work, but only about 1,660 floats per hit. The
#: positional MLP's products are recognised by their two-coordinate input and recomputed, being
#: nearly free. Recomputed: the bucket gathers, the bucket scores and probabilities (blocks of
#: block_size x block_size per hit and head: the bulk of the activation memory, from two small
#: batched products), log-sum-exp, round merging, norms, activations and dropout (replayed with
#: the saved RNG state).
SELECTIVE_SAVE_OPS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.addmm.default})


def _save_dense_projections(ctx, op, *args, **kwargs):
    if op in SELECTIVE_SAVE_OPS and not _is_positional(op, args):
        return torch_checkpoint.CheckpointPolicy.MUST_SAVE
    return torch_checkpoint.CheckpointPolicy.PREFER_RECOMPUTE


def _is_positional(op, args) -> bool:
    # addmm(bias, input, weight) / mm(input, weight): the positional MLP's first product reads
    # the (eta, phi) pair, its second one a POSITIONAL_HIDDEN-wide hidden layer.
    inp = args[1] if op is torch.ops.aten.addmm.default else args[0]
    return inp.shape[-1] in (2, POSITIONAL_HIDDEN)


def _selective_context():
    return torch_checkpoint.create_selective_checkpoint_contexts(_save_dense_projections)


def _policy_context(policy: str) -> Callable:
    if policy == "full":
        return torch_checkpoint.noop_context_fn
    if policy == "selective":
        return _selective_context
    raise ValueError(f"model.heptv2.activation_checkpointing_policy={policy!r} is not implemented")
