"""The training recipe's optimizer (LAMB, every trainable parameter in one group, as
particleflow) and its cosine schedule."""

from __future__ import annotations

import math

import torch

from heptstudy.config import TrainConfig
from heptstudy.errors import ConfigError
from heptstudy.train.lamb import Lamb


def build_optimizer(model: torch.nn.Module, train_cfg: TrainConfig) -> torch.optim.Optimizer:
    """LAMB over the trainable parameters of ``model``, in model order."""
    if train_cfg.optimizer != "lamb":
        raise ConfigError(f"train.optimizer={train_cfg.optimizer!r} is not supported; use 'lamb'")
    trainable = [p for p in model.parameters() if p.requires_grad]
    wd = train_cfg.weight_decay
    if train_cfg.lamb.weight_decay_on == "all":
        groups = [{"params": trainable, "weight_decay": wd}] if trainable else []
    else:
        decay = [p for p in trainable if p.ndim >= 2]
        no_decay = [p for p in trainable if p.ndim < 2]
        groups = [{"params": decay, "weight_decay": wd}] if decay else []
        groups += [{"params": no_decay, "weight_decay": 0.0}] if no_decay else []
    if not groups:
        raise ConfigError(
            "the model has no trainable parameters (all have requires_grad=False); "
            "unset model.freeze.* so that something can be trained"
        )
    return Lamb(
        groups,
        lr=train_cfg.lr,
        weight_decay=train_cfg.weight_decay,
        bias_correction=train_cfg.lamb.bias_correction,
        max_grad_norm=train_cfg.lamb.max_grad_norm,
    )


def cosine_factor(step: int, num_steps: int, final_fraction: float) -> float:
    """Multiplier of the initial learning rate after ``step`` scheduler steps."""
    progress = min(max(step, 0), num_steps) / num_steps
    return final_fraction + (1.0 - final_fraction) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, train_cfg: TrainConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """Cosine decay to ``train.lr * train.lr_final_fraction`` at ``train.num_steps``."""
    num_steps, final = train_cfg.num_steps, train_cfg.lr_final_fraction
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: cosine_factor(step, num_steps, final)
    )
