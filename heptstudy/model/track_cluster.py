"""The reference variant, ``track_cluster_mlpf``: standard self-attention over the tracks and
calorimeter clusters of an event, with an element-wise class and momentum per element."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from heptstudy.config import HIT_VARIANT, TRACK_CLUSTER_VARIANT, Config
from heptstudy.data.schema import PF_FEATURES
from heptstudy.errors import ConfigError
from heptstudy.model.encoding import LeanMLP, TypeEncoder, normalise_features
from heptstudy.model.heptv2 import Dropout
from heptstudy.model.hit_model import MOMENTUM_DIM, NUM_CLASSES


def refuse_checkpointing(config: Config) -> None:
    """Checkpointing is a study of the HEPTv2 backbone (DESIGN.md): this reference model has no
    layers a plan checkpoints, so a run would be reported under a plan that never ran."""
    plan = config.model.heptv2.activation_checkpointing
    if plan != "off":
        raise ConfigError(
            f"model.heptv2.activation_checkpointing={plan} (bench --checkpointing {plan}) is "
            f"not allowed with model.variant={TRACK_CLUSTER_VARIANT!r}: the plans checkpoint "
            "layers of the HEPTv2 backbone and its decoder, which this reference model does not "
            "have, so nothing would be checkpointed. This variant takes only off (false): set "
            f"that, or measure the plan with model.variant={HIT_VARIANT!r}"
        )


class SelfAttentionLayer(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, S, D = x.shape
        q, k, v = (
            self.qkv(self.norm1(x))
            .view(B, S, 3, self.heads, D // self.heads)
            .permute(2, 0, 3, 1, 4)
        )
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        x = x + self.dropout(self.out(attn.transpose(1, 2).reshape(B, S, D)))
        x = x + self.dropout(self.ffn(self.norm2(x)))
        return x * mask[..., None].to(x.dtype)


class TrackClusterModel(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        refuse_checkpointing(config)
        cfg = config.model.track_cluster
        dim = cfg.embedding_dim
        self.input_encoder = TypeEncoder(len(PF_FEATURES), cfg.width, dim)
        self.layers = nn.ModuleList(
            SelfAttentionLayer(dim, cfg.num_heads, 4 * dim, cfg.dropout)
            for _ in range(cfg.num_layers)
        )
        self.norm = nn.LayerNorm(dim)
        self.cls = LeanMLP(dim, cfg.width, NUM_CLASSES)
        self.momentum = LeanMLP(dim, cfg.width, MOMENTUM_DIM)
        if config.model.freeze.input_encoder:
            self.input_encoder.requires_grad_(False)

    def decoder_entry(self) -> nn.Module:
        return self.norm

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        mask = batch["mask"]
        raw = batch["X"]
        x = self.input_encoder(raw, normalise_features(raw))
        for layer in self.layers:
            x = layer(x, mask)
        h = self.norm(x)
        return {"class_logits": self.cls(h), "momentum": self.momentum(h)}
