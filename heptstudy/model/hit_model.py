"""The recommended hit model, ``hit_heptv2_grouped_tracker_features`` (``docs/layout.md``): the last
decoder layer's predictions are the output, the earlier ones auxiliary (``aux{l}_*``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from heptstudy.config import Config
from heptstudy.data.layout import EventLayout, EventSpan, layout_of
from heptstudy.data.schema import CLASS_PDG_IDS, HIT_FEATURES
from heptstudy.model.checkpoint_plan import CheckpointPlan
from heptstudy.model.encoding import LeanMLP, TypeEncoder, normalise_features
from heptstudy.model.heptv2 import Dropout, HEPTv2Layer, RMSNorm, hit_coordinates

NUM_CLASSES = len(CLASS_PDG_IDS)
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
        self,
        queries: torch.Tensor,
        memory: torch.Tensor,
        allowed: list[torch.Tensor | None],
        layout: EventLayout,
    ) -> torch.Tensor:
        """``queries [E, Q, D]`` of each event attend to their own event's hits of ``memory``
        (``[R, S, D]`` rows of slots), as far as ``allowed[e] [Q, hits]`` lets them."""
        E, Q, D = queries.shape
        H, dh = self.heads, D // self.heads
        q = self.cross_q(self.cross_norm(queries)).view(E, Q, H, dh).transpose(1, 2)
        kv = self.cross_kv(memory)
        attn = torch.cat(
            [
                F.scaled_dot_product_attention(
                    q[e : e + 1],
                    *event_hits(kv, span).view(1, -1, 2, H, dh).permute(2, 0, 3, 1, 4),
                    attn_mask=None if allowed[e] is None else allowed[e][None, None],
                )
                for e, span in enumerate(layout.spans)
            ]
        )
        queries = queries + self.dropout(self.cross_out(attn.transpose(1, 2).reshape(E, Q, D)))
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

    def forward(self, queries: torch.Tensor):
        """Class logits, momentum and the query embeddings of the grouping logits
        (:func:`event_group_logits`): the [Q, hits] logits of an event are made where needed."""
        h = self.norm(queries)
        return self.cls(h), self.momentum(h), self.mask_embed(h)


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

    def decoder_entry(self) -> nn.Module:
        return self.backbone_norm

    def forward(
        self, batch: dict[str, torch.Tensor], running_plan: CheckpointPlan | None = None
    ) -> dict[str, torch.Tensor]:
        """Per decoder layer (``aux{l}_`` before the last): ``class_logits`` and ``momentum``
        [E, Q, ...] and ``group_embed`` [E, Q, D]; once, ``hit_embed`` [R, S, D]. An event's
        grouping logits are ``group_embed[e]`` against its hits' ``hit_embed``
        (:func:`event_group_logits`). ``running_plan``: this step's plan under ``auto``."""
        mask, layout = batch["mask"], layout_of(batch)
        coords = hit_coordinates(batch["X"])
        x = self.encode(batch) * mask[..., None]
        # each layer hashes the coordinates itself, inside its checkpointed region: a
        # checkpointed layer hashes again in backward rather than keeping its bucket order
        # over the whole step (docs/layout.md)
        plan = {} if running_plan is None else {"running_plan": running_plan}
        for layer in self.backbone:
            x = layer(x, mask, coords, layout, **plan)
        hits = self.backbone_norm(x)
        hit_embed = self.hit_proj(hits)

        queries = self.queries.unsqueeze(0).expand(layout.num_events, -1, -1)
        allowed: list[torch.Tensor | None] = [None] * layout.num_events  # every hit at first
        outputs: dict[str, torch.Tensor] = {"hit_embed": hit_embed}
        last = len(self.decoder) - 1
        for i, layer in enumerate(self.decoder):
            queries = layer(queries, hits, allowed, layout, **plan)
            cls, mom, group_embed = self.heads(queries)
            prefix = "" if i == last else f"aux{i}_"
            outputs[prefix + "class_logits"] = cls
            outputs[prefix + "momentum"] = mom
            outputs[prefix + "group_embed"] = group_embed
            if i < last:
                allowed = _next_attention_masks(group_embed, hit_embed, layout)
        return outputs


def event_hits(t: torch.Tensor, span: EventSpan) -> torch.Tensor:
    """The real hits of one event of a [R, S, ...] tensor (a view: they lead its slots)."""
    return t[span.row, span.start : span.start + span.hits]


def event_group_logits(
    group_embed: torch.Tensor, hit_embed: torch.Tensor, span: EventSpan, e: int
) -> torch.Tensor:
    """Grouping logits [Q, hits] of event ``e``."""
    return torch.mm(group_embed[e], event_hits(hit_embed, span).t())


@torch.no_grad()
def _next_attention_masks(group_embed, hit_embed, layout: EventLayout):
    """Each query attends to the hits it currently claims; a query claiming none attends to all
    of its event's hits, so attention is never empty."""
    allowed = []
    for e, span in enumerate(layout.spans):
        claimed = event_group_logits(group_embed, hit_embed, span, e) > 0
        allowed.append(claimed | ~claimed.any(dim=-1, keepdim=True))
    return allowed
