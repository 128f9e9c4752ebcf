"""LAMB optimizer and the cosine learning-rate schedule.

Optimizer: ``pytorch_optimizer.Lamb`` (not a hand-written LAMB) with ``lr`` and
``weight_decay`` from ``train``; the package's other settings keep their defaults: betas
(0.9, 0.999), eps 1e-6, decoupled weight decay (``p <- p * (1 - lr * weight_decay)``), no
rectification, no global-norm pre-scaling (``pre_norm=False``, so ``max_grad_norm`` is unused),
no bias correction (LAMB paper, v3). Weight decay applies to tensors with two or more
dimensions (weights of linear layers and embeddings); biases, norm scales and other 1-d
parameters are not decayed. Frozen parameters (``requires_grad=False``) are left out.

Schedule: ``lr(k) = lr * (f + (1 - f) * (1 + cos(pi * k / num_steps)) / 2)`` with
``f = lr_final_fraction``, where k counts ``scheduler.step()`` calls (one after each optimizer
step): ``lr`` at k = 0, ``lr * (1 + f) / 2`` at k = num_steps / 2 and exactly ``lr * f`` at
k = num_steps (and after). A ``torch.optim.lr_scheduler.LambdaLR``, so ``state_dict()`` /
``load_state_dict()`` work as usual; the schedule itself comes from the configuration.
"""

from __future__ import annotations

import math

import torch
from pytorch_optimizer import Lamb

from heptstudy.config import TrainConfig
from heptstudy.errors import ConfigError


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two groups, in parameter order: decayed (ndim >= 2) and not decayed (ndim < 2)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": weight_decay})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(model: torch.nn.Module, train_cfg: TrainConfig) -> torch.optim.Optimizer:
    """LAMB over the trainable parameters of ``model`` (see the module docstring)."""
    if train_cfg.optimizer != "lamb":
        raise ConfigError(f"train.optimizer={train_cfg.optimizer!r} is not supported; use 'lamb'")
    groups = parameter_groups(model, train_cfg.weight_decay)
    if not groups:
        raise ConfigError(
            "the model has no trainable parameters (all have requires_grad=False); "
            "unset model.freeze.* so that something can be trained"
        )
    return Lamb(groups, lr=train_cfg.lr, weight_decay=train_cfg.weight_decay)


def cosine_factor(step: int, num_steps: int, final_fraction: float) -> float:
    """Multiplier of the initial learning rate after ``step`` scheduler steps."""
    progress = min(max(step, 0), num_steps) / num_steps
    return final_fraction + (1.0 - final_fraction) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, train_cfg: TrainConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """Cosine decay from ``train.lr`` to ``train.lr * train.lr_final_fraction`` at
    ``train.num_steps``; call ``scheduler.step()`` once after each ``optimizer.step()``."""
    num_steps, final = train_cfg.num_steps, train_cfg.lr_final_fraction

    def factor(step: int) -> float:
        return cosine_factor(step, num_steps, final)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


__all__ = ["build_optimizer", "build_scheduler", "cosine_factor", "parameter_groups"]
