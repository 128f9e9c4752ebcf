"""The recommended hit model, ``hit_heptv2_grouped_tracker_features`` (``DESIGN.md``): the last
decoder layer's predictions are the output, the earlier ones auxiliary (``aux{l}_*``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from heptstudy.config import Config
from heptstudy.data.schema import CLASS_PDG_IDS, HIT_FEATURES
from heptstudy.model.encoding import LeanMLP, TypeEncoder, normalise_features
from heptstudy.model.heptv2 import Dropout, HEPTv2Layer, RMSNorm, hit_coordinates

NUM_CLASSES = len(CLASS_PDG_IDS)
#: The grouping logit of a padded hit.
GROUP_MASKED_LOGIT = -1.0e4
_FACTORS = "group_factors"
MOMENTUM_DIM = 5  # pt, eta, sin phi, cos phi, energy


class DecoderLayer(nn.Module):
    """Masked cross-attention to the hits, self-attention among queries, feed-forward."""

    def __init__(self, dim: int, heads: int, hidden: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.cross_norm = nn.LayerNorm(dim)
        self.cross_q = nn.Linear(dim, dim)
        self.cross_kv = nn.Linear(dim, 2 * dim)
        self.cross_out = nn.Linear(dim, dim)
        self.self_norm = nn.LayerNorm(dim)
        self.self_attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.ffn_norm = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.dropout = Dropout(dropout)

    def dense_projections(self) -> tuple[nn.Module, ...]:
        """The modules whose matrix products the selective policy keeps."""
        return (self.cross_q, self.cross_kv, self.cross_out, self.ffn)

    def forward(
        self, queries: torch.Tensor, memory: torch.Tensor, allowed: torch.Tensor
    ) -> torch.Tensor:
        B, Q, D = queries.shape
        S = memory.shape[1]
        dh = D // self.heads
        q = self.cross_q(self.cross_norm(queries)).view(B, Q, self.heads, dh).transpose(1, 2)
        k, v = self.cross_kv(memory).view(B, S, 2, self.heads, dh).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])
        queries = queries + self.dropout(self.cross_out(attn.transpose(1, 2).reshape(B, Q, D)))
        h = self.self_norm(queries)
        queries = queries + self.dropout(self.self_attn(h, h, h, need_weights=False)[0])
        return queries + self.dropout(self.ffn(self.ffn_norm(queries)))


class PredictionHeads(nn.Module):
    """Shared by every decoder layer, so auxiliary predictions are comparable."""

    def __init__(self, dim: int, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.cls = nn.Linear(dim, NUM_CLASSES)
        self.momentum = LeanMLP(dim, width, MOMENTUM_DIM)
        self.mask_embed = LeanMLP(dim, width, dim)

    def forward(self, queries: torch.Tensor, hit_embed: torch.Tensor, mask: torch.Tensor):
        h = self.norm(queries)
        query_embed = self.mask_embed(h)
        group = torch.einsum("bqd,bsd->bqs", query_embed, hit_embed)
        group = group.masked_fill(~mask[:, None, :], GROUP_MASKED_LOGIT)
        setattr(group, _FACTORS, (query_embed, hit_embed, mask))
        return self.cls(h), self.momentum(h), group


class HitModel(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        m = config.model
        cfg = m.heptv2
        dim = cfg.embedding_dim
        self.neighbourhood_dim = m.tracker_features.num_features
        self.input_encoder = TypeEncoder(len(HIT_FEATURES) + self.neighbourhood_dim, cfg.width, dim)
        self.backbone = nn.ModuleList(HEPTv2Layer(cfg, i) for i in range(cfg.num_convs))
        self.backbone_norm = RMSNorm(dim)
        self.hit_proj = nn.Linear(dim, dim)
        self.queries = nn.Parameter(torch.randn(m.decoder.num_queries, dim) * 0.02)
        self.decoder = nn.ModuleList(
            DecoderLayer(dim, m.decoder.num_heads, 4 * dim, m.decoder.dropout)
            for _ in range(m.decoder.num_layers)
        )
        self.heads = PredictionHeads(dim, cfg.width)
        if m.freeze.input_encoder:
            self.input_encoder.requires_grad_(False)

    def encode(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        raw = batch["X"]
        inputs = normalise_features(raw)
        if self.neighbourhood_dim:
            if "neighbourhood" not in batch:
                raise KeyError(
                    "batch has no 'neighbourhood' features but model.tracker_features.enabled is "
                    "true; build batches with the same configuration as the model"
                )
            inputs = torch.cat([inputs, batch["neighbourhood"].to(inputs.dtype)], dim=-1)
        return self.input_encoder(raw, inputs)

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        mask = batch["mask"]
        coords = hit_coordinates(batch["X"])
        x = self.encode(batch) * mask[..., None]
        # each layer hashes the coordinates itself: a checkpointed layer hashes again in
        # backward rather than keeping its bucket order over the whole step
        for layer in self.backbone:
            x = layer(x, mask, coords)
        hits = self.backbone_norm(x)
        hit_embed = self.hit_proj(hits)

        B = x.shape[0]
        queries = self.queries.unsqueeze(0).expand(B, -1, -1)
        allowed = mask[:, None, :].expand(-1, queries.shape[1], -1)
        outputs: dict[str, torch.Tensor] = {}
        last = len(self.decoder) - 1
        for i, layer in enumerate(self.decoder):
            queries = layer(queries, hits, allowed)
            cls, mom, group = self.heads(queries, hit_embed, mask)
            prefix = "" if i == last else f"aux{i}_"
            outputs[prefix + "class_logits"] = cls
            outputs[prefix + "momentum"] = mom
            outputs[prefix + "group_logits"] = group
            allowed = _next_attention_mask(group, mask)
        return outputs


def group_factors(group_logits: torch.Tensor):
    """The factors (query embeddings [B, Q, D], hit embeddings [B, S, D], mask [B, S]) of grouping
    logits made by :class:`PredictionHeads`, else None: a loss can compute the rows it needs
    from them instead of keeping the [B, Q, S] logits for backward."""
    return getattr(group_logits, _FACTORS, None)


def _next_attention_mask(group_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each query attends to the valid hits it currently claims; a query claiming none attends to
    all valid hits, so attention is never empty."""
    claimed = (group_logits.detach() > 0) & mask[:, None, :]
    empty = ~claimed.any(dim=-1, keepdim=True)
    return claimed | (empty & mask[:, None, :])
