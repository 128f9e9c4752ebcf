"""Op groups: what a layer checkpointed under an ``ops`` plan keeps for its backward
(:attr:`heptstudy.model.checkpoint_plan.CheckpointPlan.keep`); every other op is recomputed.

A group names the ops whose outputs it keeps (``namespace::name``, any overload) and the
submodules of the layer that run them: ``None`` anywhere in the layer, ``""`` the layer's own
code outside every submodule named in its kind's table. Groups of one kind never share an
(op, submodule) pair. The policy sees ops below autograd, one dispatcher op at a time, and keeps
no op it does not name: so a group is useful only where its op is *one* op (the heptstudy ops
of :mod:`heptstudy.model.custom_ops`, a matrix product, a fused norm), and keeping one op does
not spare the ops that only feed it (eager recomputation runs every op it does not keep).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch.utils.checkpoint as torch_checkpoint
from torch import nn

from heptstudy.errors import HeptstudyError


@dataclass(frozen=True)
class OpGroup:
    name: str
    ops: tuple[str, ...]
    modules: tuple[str, ...] | None
    kept: str  # what keeping it spares backward


_PRODUCTS = ("aten::mm", "aten::addmm")
_SDPA = (
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
)
#: CPU: the mask alone (a byte per element); CUDA's fused kernel: its output and mask.
_DROPOUT = ("heptstudy::dropout_mask", "aten::native_dropout")
_LAYER_NORM = ("aten::native_layer_norm",)
_RMS_NORM = ("heptstudy::rms_norm",)

#: Per layer kind (the slot's group of :func:`heptstudy.model.checkpoint_plan.checkpoint_slots`).
GROUPS: dict[str, tuple[OpGroup, ...]] = {
    "backbone": (
        # the int32 order with its positions and valid flags
        OpGroup("order", ("heptstudy::bucket_order",), None, "hashing and sorting"),
        OpGroup("pos_embed", (*_PRODUCTS, "aten::silu"), ("pos_embed",), "the positional MLP"),
        OpGroup("attn_norm", _RMS_NORM, ("attn_norm",), "the attention's input norm"),
        OpGroup("qkv", _PRODUCTS, ("qkv",), "the qkv projection"),
        OpGroup("qk_norm", _RMS_NORM, ("q_norm", "k_norm"), "the q and k norms"),
        # the plain path only: the fused path (flex_attention, CUDA) is no heptstudy op yet
        OpGroup(
            "attention", ("heptstudy::bucket_attention",), None, "the bucket attention forward"
        ),
        OpGroup("out_proj", _PRODUCTS, ("out",), "the output projection"),
        OpGroup("mlp_norm", _RMS_NORM, ("mlp_norm",), "the SwiGLU's input norm"),
        # its output only: a checkpointed layer's backward recomputes the hidden products
        OpGroup("mlp", ("heptstudy::swiglu",), ("mlp",), "the SwiGLU"),
        OpGroup("dropout", _DROPOUT, ("dropout",), "drawing the dropout masks"),
    ),
    "decoder": (
        OpGroup("cross_norm", _LAYER_NORM, ("cross_norm",), "the cross-attention's norm"),
        OpGroup("cross_q", _PRODUCTS, ("cross_q",), "the query projection"),
        OpGroup("cross_kv", _PRODUCTS, ("cross_kv",), "the hits' key/value projection"),
        OpGroup("cross_attention", _SDPA, ("",), "the cross-attention kernels"),
        OpGroup("cross_out", _PRODUCTS, ("cross_out",), "the cross-attention's output projection"),
        OpGroup("self_norm", _LAYER_NORM, ("self_norm",), "the self-attention's norm"),
        OpGroup("self_attn", (*_PRODUCTS, *_SDPA), ("self_attn",), "the self-attention"),
        OpGroup("ffn_norm", _LAYER_NORM, ("ffn_norm",), "the feed-forward's norm"),
        OpGroup("ffn", (*_PRODUCTS, "aten::gelu"), ("ffn",), "the feed-forward"),
        OpGroup("dropout", _DROPOUT, ("dropout",), "drawing the dropout masks"),
    ),
}

GROUP_NAMES = frozenset(g.name for groups in GROUPS.values() for g in groups)


def check_keep(keep) -> frozenset[str]:
    """``keep`` as a set of known group names."""
    keep = frozenset(keep)
    unknown = sorted(keep - GROUP_NAMES)
    if unknown:
        raise HeptstudyError(
            f"op groups {unknown} are not known; allowed: {', '.join(sorted(GROUP_NAMES))} "
            "(heptstudy.model.op_groups.GROUPS)"
        )
    return keep


def groups_of(kind: str) -> tuple[OpGroup, ...]:
    if kind not in GROUPS:
        raise HeptstudyError(f"layer kind {kind!r} has no op groups; allowed: {', '.join(GROUPS)}")
    return GROUPS[kind]


class _Running(threading.local):
    #: per thread: recomputation runs in the backward's thread
    roles: list[str] | None = None


_RUNNING = _Running()
_ROLE_ATTR = "_op_group_role"


def running_role() -> str:
    """The named submodule running now ("" outside all of them)."""
    roles = _RUNNING.roles
    return roles[-1] if roles else ""


def _enter(module: nn.Module, _args) -> None:
    if _RUNNING.roles is None:
        _RUNNING.roles = []
    _RUNNING.roles.append(getattr(module, _ROLE_ATTR))


def _leave(module: nn.Module, _args, _output) -> None:
    _RUNNING.roles.pop()


def track_roles(layer: nn.Module, kind: str) -> None:
    """Hooks telling the policy which named submodule runs; installed once per module."""
    for group in groups_of(kind):
        for name in group.modules or ():
            module = getattr(layer, name, None) if name else None
            if isinstance(module, nn.Module) and not hasattr(module, _ROLE_ATTR):
                setattr(module, _ROLE_ATTR, name)
                module.register_forward_pre_hook(_enter)
                module.register_forward_hook(_leave)


def op_name(op) -> str | None:
    schema = getattr(op, "_schema", None)  # higher-order operators have none
    return None if schema is None else schema.name


def kept_pairs(kind: str, keep: frozenset[str]) -> dict[tuple[str, str | None], str]:
    """(op, submodule or None) -> the group keeping it."""
    return {
        (op, module): group.name
        for group in groups_of(kind)
        if group.name in keep
        for op in group.ops
        for module in (group.modules if group.modules is not None else (None,))
    }


def group_of(pairs: dict[tuple[str, str | None], str], op) -> str | None:
    """The group of ``pairs`` an op running now belongs to, if any."""
    name = op_name(op)
    if name is None:
        return None
    return pairs.get((name, running_role())) or pairs.get((name, None))


def _keep_groups(pairs, ctx, op, *args, **kwargs):
    if group_of(pairs, op) is not None:
        return torch_checkpoint.CheckpointPolicy.MUST_SAVE
    return torch_checkpoint.CheckpointPolicy.PREFER_RECOMPUTE


def draws_outside_dropout(layer: nn.Module) -> bool:
    """A random op outside the dropout group (``nn.MultiheadAttention``'s own dropout, drawn in
    place inside its attention): keeping the masks before it would shift its draws."""
    return any(
        isinstance(m, nn.MultiheadAttention) and m.dropout > 0 and m.training
        for m in layer.modules()
    )


def effective_keep(layer: nn.Module, keep: frozenset[str]) -> frozenset[str]:
    """``keep`` as ``layer`` can honour it: never the dropout masks of a layer drawing others."""
    if "dropout" in keep and draws_outside_dropout(layer):
        return keep - {"dropout"}
    return keep


def policy_context(layer: nn.Module, kind: str, keep: frozenset[str]) -> Callable:
    """The ``context_fn`` keeping the ops of ``keep``'s groups of a ``kind`` layer."""
    track_roles(layer, kind)
    pairs = kept_pairs(kind, effective_keep(layer, keep))
    return partial(
        torch_checkpoint.create_selective_checkpoint_contexts, partial(_keep_groups, pairs)
    )
