"""heptstudy's dispatcher ops (``torch.ops.heptstudy.*``): a checkpointing policy sees each as one
op whose outputs it may keep (:mod:`heptstudy.model.op_groups`). Their kernels are Python over
ATen ops, so they run on real, fake and meta tensors alike; :func:`implementation` hands a
storage tracker the kernel to run *inside* its mode, so the op's own scratch is counted as it
was before the op existed."""

from __future__ import annotations

from collections.abc import Callable

import torch

NAMESPACE = "heptstudy"

_KERNELS: dict[str, Callable] = {}


def define(
    name: str,
    schema: str,
    kernel: Callable,
    fake: Callable,
    *,
    backward: Callable | None = None,
    setup: Callable | None = None,
) -> torch._ops.OpOverload:
    """``heptstudy::name`` with ``schema`` (``(Tensor x, ...) -> Tensor``), run by ``kernel`` on
    every device; ``fake`` gives the outputs' shapes and dtypes only. An op with a gradient gives
    its formula, ``backward``, and ``setup``, which saves what the formula reads."""
    op = torch.library.custom_op(f"{NAMESPACE}::{name}", kernel, mutates_args=(), schema=schema)
    op.register_fake(fake)
    if backward is not None:
        op.register_autograd(backward, setup_context=setup)
    _KERNELS[f"{NAMESPACE}::{name}"] = kernel
    return getattr(torch.ops.heptstudy, name).default


def implementation(func) -> Callable | None:
    """The Python kernel of one of heptstudy's ops (``func`` an OpOverload), else None."""
    if getattr(func, "namespace", None) != NAMESPACE:
        return None
    return _KERNELS.get(func._schema.name)
