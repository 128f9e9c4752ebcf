"""LAMB with particleflow's update (``mlpf/optimizers/lamb.py``): weight decay inside the update
before the trust ratio (not decoupled), the trust ratio only where weight decay is nonzero.
Foreach operations, one temporary at a time, no host synchronisation (runs on fake tensors).

Not ``pytorch_optimizer.Lamb``: it divides the step *after* the trust ratio by ``1 - b1^t``
(10 times particleflow's at t = 1), never corrects ``v``, clamps ``|p|`` at 10, and applies the
ratio to groups without weight decay too.
"""

from __future__ import annotations

import math

import torch

BETAS = (0.9, 0.999)
EPS = 1e-6


class Lamb(torch.optim.Optimizer):
    def __init__(
        self,
        params,
        lr: float,
        weight_decay: float = 0.01,
        *,
        bias_correction: bool = True,
        max_grad_norm: float = 1.0,
    ) -> None:
        if not lr > 0.0 or weight_decay < 0.0 or max_grad_norm < 0.0:
            raise ValueError(
                f"LAMB needs lr > 0, weight_decay >= 0 and max_grad_norm >= 0; got "
                f"lr={lr}, weight_decay={weight_decay}, max_grad_norm={max_grad_norm}"
            )
        defaults = dict(
            lr=lr,
            weight_decay=weight_decay,
            betas=BETAS,
            eps=EPS,
            bias_correction=bias_correction,
            max_grad_norm=max_grad_norm,
        )
        super().__init__(params, defaults)

    def _clip_scale(self) -> torch.Tensor | None:
        """min(1, max_grad_norm / global norm) as a tensor; None without clipping."""
        max_norm = self.defaults["max_grad_norm"]
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        if max_norm == 0.0 or not grads:
            return None
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        return (max_norm / total).clamp(max=1.0)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        scale = self._clip_scale()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if any(p.grad.is_sparse for p in params):
                raise RuntimeError("LAMB does not take sparse gradients")
            group["step"] = group.get("step", 0) + 1
            if params:
                self._update(group, params, scale)
        return loss

    def _update(self, group: dict, params: list[torch.Tensor], scale: torch.Tensor | None) -> None:
        b1, b2 = group["betas"]
        t, wd = group["step"], group["weight_decay"]
        c1, c2 = (1 - b1**t, 1 - b2**t) if group["bias_correction"] else (1.0, 1.0)
        grads = [p.grad for p in params]
        if scale is not None:  # clipped copies, freed before the update list is built
            grads = torch._foreach_mul(grads, scale)
        for p in params:
            state = self.state[p]
            if not state:
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        m = [self.state[p]["exp_avg"] for p in params]
        v = [self.state[p]["exp_avg_sq"] for p in params]
        torch._foreach_mul_(m, b1)
        torch._foreach_add_(m, grads, alpha=1 - b1)
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, grads, grads, value=1 - b2)
        del grads
        update = torch._foreach_sqrt(v)
        torch._foreach_mul_(update, 1 / math.sqrt(c2))
        torch._foreach_add_(update, group["eps"])
        torch._foreach_reciprocal_(update)
        torch._foreach_mul_(update, m)
        torch._foreach_mul_(update, 1 / c1)
        if wd != 0.0:
            torch._foreach_add_(update, params, alpha=wd)
            w_norm = torch.stack(torch._foreach_norm(params))
            u_norm = torch.stack(torch._foreach_norm(update))
            ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, 1.0)
            torch._foreach_mul_(update, list(ratio.unbind()))
        torch._foreach_add_(params, update, alpha=-group["lr"])
