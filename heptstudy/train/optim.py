"""The training recipe's optimizer (LAMB as particleflow runs it) and its cosine schedule.

Optimizer: :class:`heptstudy.train.lamb.Lamb` with ``train.lr``, ``train.weight_decay`` and
``train.lamb``, over every trainable parameter in one group, as particleflow's ``get_optimizer``
does (frozen parameters are left out; particleflow keeps them, without gradient or update).
``train.lamb.weight_decay_on=matrices`` decays only tensors with two or more dimensions; the
other parameters then take the plain Adam step, without trust ratio.

Schedule: ``lr(k) = lr * (f + (1 - f) * (1 + cos(pi * k / num_steps)) / 2)`` with
``f = lr_final_fraction`` and k the ``scheduler.step()`` calls, reaching ``lr * f`` at
``num_steps``; a ``LambdaLR``, so ``state_dict()`` / ``load_state_dict()`` work as usual.
"""

from __future__ import annotations

import math

import torch

from heptstudy.config import TrainConfig
from heptstudy.errors import ConfigError
from heptstudy.train.lamb import Lamb


def parameter_groups(model: torch.nn.Module, train_cfg: TrainConfig) -> list[dict]:
    """The trainable parameters in model order: one decayed group (``weight_decay_on=all``),
    or a decayed group of tensors with ndim >= 2 and an undecayed one (``matrices``)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    wd = train_cfg.weight_decay
    if train_cfg.lamb.weight_decay_on == "all":
        return [{"params": trainable, "weight_decay": wd}] if trainable else []
    decay = [p for p in trainable if p.ndim >= 2]
    no_decay = [p for p in trainable if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": wd}] if decay else []
    return groups + ([{"params": no_decay, "weight_decay": 0.0}] if no_decay else [])


def build_optimizer(model: torch.nn.Module, train_cfg: TrainConfig) -> torch.optim.Optimizer:
    """LAMB over the trainable parameters of ``model`` (see the module docstring)."""
    if train_cfg.optimizer != "lamb":
        raise ConfigError(f"train.optimizer={train_cfg.optimizer!r} is not supported; use 'lamb'")
    groups = parameter_groups(model, train_cfg)
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
    """Cosine decay from ``train.lr`` to ``train.lr * train.lr_final_fraction`` at
    ``train.num_steps``; call ``scheduler.step()`` once after each ``optimizer.step()``."""
    num_steps, final = train_cfg.num_steps, train_cfg.lr_final_fraction
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: cosine_factor(step, num_steps, final)
    )
