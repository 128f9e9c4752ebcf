"""The autocast dtype of a run: one rule for training, bench and the fake-device estimate."""

from __future__ import annotations

import torch

from heptstudy.config import Config


def autocast_dtype(config: Config, device: torch.device) -> torch.dtype | None:
    """bf16 autocast when the configuration asks for it; float32 otherwise (the CPU default)."""
    return torch.bfloat16 if config.train.dtype == "bfloat16" else None
