"""The ``train`` section: optimiser, loss and the training loop."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from heptstudy.config.strict import StrictInput, named_folder


class LossConfig(StrictInput):
    class_weight: float = Field(1.0, ge=0.0)
    no_particle_weight: float = Field(0.1, ge=0.0, description="CE weight of the 'none' class")
    momentum_weight: float = Field(1.0, ge=0.0)
    group_bce_weight: float = Field(1.0, ge=0.0)
    group_dice_weight: float = Field(1.0, ge=0.0)
    group_loss: Literal["bce", "focal"] = "bce"
    aux_weight: float = Field(1.0, ge=0.0, description="weight of each auxiliary decoder layer")
    cost_class: float = Field(1.0, ge=0.0)
    cost_momentum: float = Field(1.0, ge=0.0)
    cost_mask: float = Field(1.0, ge=0.0)
    cost_dice: float = Field(1.0, ge=0.0)


class LambConfig(StrictInput):
    """LAMB as particleflow's ``mlpf/optimizers/lamb.py`` runs it (see heptstudy.train.lamb)."""

    bias_correction: bool = Field(
        True, description="divide the moment estimates by 1 - beta^step (Adam's correction)"
    )
    max_grad_norm: float = Field(
        1.0,
        ge=0.0,
        description="scale all gradients down together when their global L2 norm exceeds this "
        "(0: no clipping)",
    )
    weight_decay_on: Literal["all", "matrices"] = Field(
        "all",
        description="all: every trainable parameter, as particleflow; matrices: tensors with two "
        "or more dimensions only (biases and norm scales neither decayed nor trust-scaled)",
    )


class TrainConfig(StrictInput):
    global_batch_size: int = Field(4, ge=1)
    grad_accumulation: int = Field(1, ge=1)
    num_steps: int = Field(100, ge=1)
    seed: int = Field(12345, ge=0)
    optimizer: Literal["lamb"] = "lamb"
    lr: float = Field(1e-3, gt=0.0)
    weight_decay: float = Field(0.01, ge=0.0)
    lamb: LambConfig = Field(default_factory=LambConfig)
    lr_final_fraction: float = Field(0.1, ge=0.0, le=1.0)
    val_freq: int = Field(50, ge=1)
    checkpoint_freq: int = Field(50, ge=1)
    dtype: Literal["float32", "bfloat16"] = "float32"
    out_dir: str = "experiments/local/train"
    deterministic: bool = False
    loss: LossConfig = Field(default_factory=LossConfig)

    @field_validator("out_dir")
    @classmethod
    def _out_dir_named(cls, value: str) -> str:
        # outputs are relative to the working directory: '' would write the run's files there
        return named_folder(
            value,
            "the working directory, and the run would write its files straight into it",
            "experiments/local/train",
        )
