"""The target's kernel choices where they keep different tensors for backward than the CPU's.

Each stand-in reproduces the target kernel's outputs and saved tensors (values too, so it can be
checked on real tensors): CUDA's fused ``rms_norm`` (input and a float32 rstd per row; the CPU
also keeps a normalised copy), ``native_dropout``'s boolean mask (the CPU's is in the input's
dtype), the memory-efficient ``scaled_dot_product_attention`` (output and log-sum-exp, no
scores; fake tensors only on a CPU build), and the fused flex_attention (:func:`fused_flex`).
The first three are registered at ``AutogradCPU`` inside :func:`target_kernels` only; the last
is handed to the model through :mod:`heptstudy.stand_ins`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

STAND_IN_KEY = "AutogradCPU"


@dataclass
class KernelChoices:
    """How often each stand-in ran (which of them a step actually hit)."""

    calls: dict[str, int] = field(default_factory=dict)

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1


class _FusedRMSNorm(torch.autograd.Function):
    """``x * rsqrt(mean(x^2) + eps) * weight`` saving x, weight and a float32 rstd per row."""

    @staticmethod
    def forward(ctx, x, weight, dims, eps):
        xs = x.float()
        rstd = torch.rsqrt(xs.pow(2).mean(dim=dims, keepdim=True) + eps)
        y = xs * rstd
        if weight is not None:
            y = y * weight.float()
        ctx.save_for_backward(x, weight, rstd)
        ctx.dims = dims
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, d_y):
        x, weight, rstd = ctx.saved_tensors
        normed = x.float() * rstd
        d_normed = d_y.float() * (weight.float() if weight is not None else 1.0)
        d_w = None
        if weight is not None and ctx.needs_input_grad[1]:
            lead = tuple(range(x.dim() - weight.dim()))
            d_w = (d_y.float() * normed).sum(dim=lead).to(weight.dtype)
        correction = (d_normed * normed).mean(dim=ctx.dims, keepdim=True)
        d_x = ((d_normed - normed * correction) * rstd).to(x.dtype)
        return d_x, d_w, None, None


def _rms_norm(choices: KernelChoices):
    fallback = torch.ops.aten.rms_norm.default

    def kernel(x, normalized_shape, weight=None, eps=None):
        if weight is not None and weight.dtype != x.dtype:
            # mixed dtypes: CUDA composes it from ops, as the CPU does
            return fallback.decompose(x, normalized_shape, weight, eps)
        choices._count("rms_norm")
        dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
        if eps is None:
            eps = torch.finfo(x.dtype if x.is_floating_point() else torch.float32).eps
        return _FusedRMSNorm.apply(x, weight, dims, eps)

    return kernel


def _dropout(choices: KernelChoices):
    def kernel(x, p, train):
        if not train or p == 0 or x.numel() == 0:
            return x
        choices._count("dropout")
        if p == 1:
            return x * 0.0
        return torch.ops.aten.native_dropout.default(x, p, train)[0]

    return kernel


def _sdpa(choices: KernelChoices):
    def kernel(
        query,
        key,
        value,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        scale=None,
        enable_gqa=False,
    ):
        choices._count("scaled_dot_product_attention")
        bias = attn_mask
        if bias is not None and bias.dtype == torch.bool:
            # the CUDA path turns a boolean mask into an additive bias of the query's dtype
            bias = torch.zeros(bias.shape, dtype=query.dtype, device=query.device).masked_fill_(
                bias.logical_not(), float("-inf")
            )
        if bias is not None:
            bias = bias.expand(*query.shape[:-2], query.shape[-2], key.shape[-2])
        if enable_gqa and key.shape[-3] != query.shape[-3]:
            reps = query.shape[-3] // key.shape[-3]
            key = key.repeat_interleave(reps, dim=-3)
            value = value.repeat_interleave(reps, dim=-3)
        out = torch.ops.aten._scaled_dot_product_efficient_attention.default(
            query, key, value, bias, True, dropout_p, is_causal, scale=scale
        )
        return out[0]

    return kernel


class _SameFootprintFlex(torch.autograd.Function):
    """The fused flex_attention kernel's footprint: out and float32 lse, both saved with q/k/v."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        q, k, v, _out, _lse = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def fused_flex(q, k, v, block_mask):
    """The fused flex_attention stand-in (:class:`heptstudy.stand_ins.StandIns` ``flex``)."""
    return _SameFootprintFlex.apply(q, k, v)


#: The stand-ins installed for a GPU target.
_KERNELS = {"rms_norm": _rms_norm, "dropout": _dropout, "scaled_dot_product_attention": _sdpa}

_INSTALLED = threading.Lock()


@contextlib.contextmanager
def target_kernels() -> Iterator[KernelChoices]:
    """Inside the block, CPU tensors run the GPU targets' (cuda, rocm) kernel choices
    (:data:`_KERNELS`). Not re-entrant."""
    if not _INSTALLED.acquire(blocking=False):
        raise RuntimeError("target kernel stand-ins are already installed in this process")
    choices = KernelChoices()
    lib = torch.library.Library("aten", "IMPL")
    try:
        for name, make in _KERNELS.items():
            lib.impl(name, make(choices), STAND_IN_KEY)
        yield choices
    finally:
        lib._destroy()
        _INSTALLED.release()
