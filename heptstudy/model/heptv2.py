"""The HEPTv2 layer: LSH-bucketed attention over hits in (eta, phi).

Each layer hashes hits with ``n_hashes`` OR-rounds per head; a round sorts the hits of an event
by (AND-region cell, random projection) and cuts the sorted sequence into contiguous buckets of
``block_size``. Attention runs inside buckets, returning the log-sum-exp per query, and the
rounds are merged with a softmax over those log-sum-exps, which equals softmax attention over
the union of a query's buckets.

The hashing depends only on hit coordinates and fixed tables, never on the embeddings, so it is
computed once per layer (:meth:`HEPTv2Layer.bucket_order`) outside any checkpointed region and
handed to :meth:`HEPTv2Layer.forward`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from heptstudy.config import HEPTv2Config

#: Indices of the raw hit features the layer reads.
ETA, SIN_PHI, COS_PHI = 2, 3, 4

#: Large finite "minus infinity" so fully padded buckets stay finite (never NaN).
_MASKED = -1.0e30


def hit_coordinates(features: torch.Tensor) -> torch.Tensor:
    """(eta, phi) per hit in float32; phi from atan2, so a common positive factor on
    (sin phi, cos phi) does not matter."""
    f = features.float()
    return torch.stack([f[..., ETA], torch.atan2(f[..., SIN_PHI], f[..., COS_PHI])], dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


@dataclass
class BucketOrder:
    """The sort of one layer's hashing: for every (event, round, head), the hit index at each
    sorted position (``order``) and the sorted position of every hit (``rank``); plus the valid
    hit count per event. Sorted sequences are padded to a whole number of buckets."""

    order: torch.Tensor  # [B, C, H, Sp] long, indices into 0..S-1 (padding points at S-1)
    rank: torch.Tensor  # [B, C, H, S] long, positions into 0..Sp-1
    n_valid: torch.Tensor  # [B] long
    padded_len: int  # Sp, a multiple of block_size


class HEPTv2Layer(nn.Module):
    def __init__(self, cfg: HEPTv2Config, layer_index: int):
        super().__init__()
        dim, heads = cfg.embedding_dim, cfg.num_heads
        self.num_heads, self.head_dim = heads, dim // heads
        self.block_size, self.n_hashes = cfg.block_size, cfg.n_hashes
        self.attention_backend = cfg.attention_backend
        self.pos_embed = nn.Sequential(nn.Linear(2, 32), nn.SiLU(), nn.Linear(32, dim))
        self.attn_norm = RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.q_norm = RMSNorm(self.head_dim)
        self.k_norm = RMSNorm(self.head_dim)
        self.out = nn.Linear(dim, dim)
        self.mlp_norm = RMSNorm(dim)
        self.mlp = SwiGLU(dim, int(round(dim * cfg.mlp_ratio)))
        self.dropout = nn.Dropout(cfg.dropout)

        # Fixed random tables: drawn from their own generator so they do not depend on (or
        # disturb) the global RNG, and kept as buffers so the state dict carries them.
        gen = torch.Generator().manual_seed(cfg.hash_seed * 1000 + layer_index)
        self.register_buffer("hash_directions", torch.randn(cfg.n_hashes, heads, 2, generator=gen))
        self.register_buffer("region_shape", _region_shapes(cfg.n_hashes, heads, cfg.num_regions, gen))

    # -- hashing ---------------------------------------------------------------------------
    @torch.no_grad()
    def bucket_order(self, coords: torch.Tensor, mask: torch.Tensor) -> BucketOrder:
        """Hash and sort every event's hits, in float32 whatever the autocast dtype."""
        with torch.autocast(device_type=coords.device.type, enabled=False):
            return self._bucket_order(coords.float(), mask)

    def _bucket_order(self, coords: torch.Tensor, mask: torch.Tensor) -> BucketOrder:
        B, S, _ = coords.shape
        n_valid = mask.sum(dim=1)
        valid_f = mask[:, None, None, :]

        # Equal-count quantile bins need each hit's rank in eta and in phi among its event's
        # valid hits; padded hits are pushed past every valid one.
        big = torch.finfo(torch.float32).max
        eta = coords[..., 0].masked_fill(~mask, big)
        phi = coords[..., 1].masked_fill(~mask, big)
        eta_rank = _ranks(eta).float()
        phi_rank = _ranks(phi).float()
        denom = n_valid.clamp(min=1).float()[:, None]
        eta_q = (eta_rank / denom)[:, None, None, :]  # [B,1,1,S] in [0,1) for valid hits
        phi_q = (phi_rank / denom)[:, None, None, :]
        n_eta = self.region_shape[..., 0].float()[None, :, :, None]  # [1,C,H,1]
        n_phi = self.region_shape[..., 1].float()[None, :, :, None]
        eta_bin = torch.minimum(torch.floor(eta_q * n_eta), n_eta - 1)
        phi_bin = torch.minimum(torch.floor(phi_q * n_phi), n_phi - 1)
        region = eta_bin * n_phi + phi_bin  # [B,C,H,S]

        proj = torch.einsum("bsk,chk->bchs", coords.masked_fill(~mask[..., None], 0.0), self.hash_directions)
        lo = proj.masked_fill(~valid_f, big).amin(dim=-1, keepdim=True)
        hi = proj.masked_fill(~valid_f, -big).amax(dim=-1, keepdim=True)
        span = (hi - lo).clamp(min=1e-6)
        # Normalised projection lies in [0, 1): adding the region index sorts by region first.
        key = region + (proj - lo) / (span * (1 + 1e-4))
        key = key.masked_fill(~valid_f, float("inf"))
        order = torch.argsort(key, dim=-1, stable=True)  # [B,C,H,S]

        Sp = math.ceil(S / self.block_size) * self.block_size
        if Sp > S:
            # Extra slots are padding; they point at a padded hit (or any hit: they are masked).
            fill = order[..., -1:].expand(*order.shape[:-1], Sp - S)
            order = torch.cat([order, fill], dim=-1)
        rank = torch.empty(B, self.n_hashes, self.num_heads, S, dtype=torch.long, device=coords.device)
        positions = torch.arange(S, device=coords.device).expand_as(rank)
        rank.scatter_(-1, order[..., :S], positions)
        return BucketOrder(order=order, rank=rank, n_valid=n_valid, padded_len=Sp)

    # -- forward ---------------------------------------------------------------------------
    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, coords: torch.Tensor, buckets: BucketOrder
    ) -> torch.Tensor:
        x = x + self.pos_embed(coords.to(x.dtype))
        attn = self.attention(self.attn_norm(x), buckets)
        x = x + self.dropout(attn)
        x = x + self.dropout(self.mlp(self.mlp_norm(x)))
        return x * mask[..., None].to(x.dtype)

    def attention(self, h: torch.Tensor, buckets: BucketOrder) -> torch.Tensor:
        B, S, D = h.shape
        H, dh = self.num_heads, self.head_dim
        q, k, v = self.qkv(h).view(B, S, 3, H, dh).unbind(dim=2)
        q, k = self.q_norm(q), self.k_norm(k)
        # [B,S,H,dh] -> [B,1,H,S,dh] so each round gathers its own sort of the same tensors.
        q, k, v = (t.transpose(1, 2).unsqueeze(1) for t in (q, k, v))
        if self._use_fused(h):
            out, lse = fused_bucket_attention(q, k, v, buckets, self.block_size)
        else:
            out, lse = plain_bucket_attention(q, k, v, buckets, self.block_size)
        # out [B,C,H,S,dh], lse [B,C,H,S]: merge rounds by softmax of their log-sum-exps.
        weights = torch.softmax(lse.float(), dim=1).to(out.dtype)
        merged = (weights.unsqueeze(-1) * out).sum(dim=1)  # [B,H,S,dh]
        return self.out(merged.transpose(1, 2).reshape(B, S, D))

    def _use_fused(self, h: torch.Tensor) -> bool:
        if self.attention_backend == "plain":
            return False
        if self.attention_backend == "fused":
            return True
        return h.is_cuda


def _region_shapes(n_hashes: int, heads: int, num_regions: int, gen: torch.Generator) -> torch.Tensor:
    """A random (eta regions, phi regions) pair per (round, head), product about num_regions."""
    root = math.sqrt(num_regions)
    lo, hi = max(1, int(root / 2)), max(1, int(root * 2))
    n_eta = torch.randint(lo, hi + 1, (n_hashes, heads), generator=gen)
    n_phi = torch.clamp(torch.round(num_regions / n_eta.float()), min=1).long()
    return torch.stack([n_eta, n_phi], dim=-1)


def _ranks(values: torch.Tensor) -> torch.Tensor:
    """Rank of each entry along the last dimension (0 = smallest)."""
    order = torch.argsort(values, dim=-1, stable=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, torch.arange(values.shape[-1], device=values.device).expand_as(order))
    return ranks


def _sorted(t: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Gather [B,1,H,S,dh] into each round's order [B,C,H,Sp] -> [B,C,H,Sp,dh]."""
    B, C, H, Sp = order.shape
    src = t.expand(B, C, H, t.shape[-2], t.shape[-1])
    return torch.gather(src, 3, order.unsqueeze(-1).expand(B, C, H, Sp, t.shape[-1]))


def _unsorted(t: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_sorted` for tensors with or without a trailing feature dimension."""
    if t.dim() == rank.dim():
        return torch.gather(t, 3, rank)
    return torch.gather(t, 3, rank.unsqueeze(-1).expand(*rank.shape, t.shape[-1]))


def plain_bucket_attention(q, k, v, buckets: BucketOrder, block_size: int):
    """Softmax attention inside contiguous buckets of the sorted sequences, in plain PyTorch.

    Returns the per-round output [B,C,H,S,dh] and log-sum-exp [B,C,H,S] in hit order.
    """
    B, C, H, Sp = buckets.order.shape
    dh = q.shape[-1]
    nb = Sp // block_size
    qs, ks, vs = (_sorted(t, buckets.order).view(B, C, H, nb, block_size, dh) for t in (q, k, v))
    # Valid hits sort first, so a sorted position is a real hit iff it is below the event's count.
    key_valid = torch.arange(Sp, device=q.device)[None, :] < buckets.n_valid[:, None]  # [B,Sp]
    key_valid = key_valid.view(B, 1, 1, nb, 1, block_size)
    scores = torch.matmul(qs, ks.transpose(-1, -2)) * (dh**-0.5)
    scores = scores.masked_fill(~key_valid, _MASKED)
    lse = torch.logsumexp(scores.float(), dim=-1)
    probs = torch.exp(scores.float() - lse.unsqueeze(-1)).to(vs.dtype)
    out = torch.matmul(probs, vs).view(B, C, H, Sp, dh)
    lse = lse.view(B, C, H, Sp)
    return _unsorted(out, buckets.rank), _unsorted(lse, buckets.rank)


def fused_bucket_attention(q, k, v, buckets: BucketOrder, block_size: int):
    """The same attention through ``flex_attention`` with a bucket-diagonal block mask; on CUDA
    this is a fused kernel (compiled), elsewhere flex_attention's reference path."""
    from torch.nn.attention.flex_attention import create_block_mask

    B, C, H, Sp = buckets.order.shape
    dh = q.shape[-1]
    qs, ks, vs = (_sorted(t, buckets.order).reshape(B * C, H, Sp, dh) for t in (q, k, v))
    n_valid = buckets.n_valid.repeat_interleave(C)

    def same_bucket(b, h, q_idx, kv_idx):
        return (q_idx // block_size == kv_idx // block_size) & (kv_idx < n_valid[b])

    block_mask = create_block_mask(same_bucket, B * C, None, Sp, Sp, device=q.device.type)
    out, lse = _flex(qs, ks, vs, block_mask)
    out = out.view(B, C, H, Sp, dh)
    lse = lse.view(B, C, H, Sp)
    # Queries in buckets with no valid key get lse = -inf; give them a finite, negligible weight.
    lse = torch.nan_to_num(lse.float(), neginf=_MASKED)
    return _unsorted(out, buckets.rank), _unsorted(lse, buckets.rank)


def _flex(q, k, v, block_mask):
    from torch.nn.attention import flex_attention as fa

    fn = fa.flex_attention
    if q.is_cuda:
        fn = _compiled_flex()
    try:
        out, aux = fn(q, k, v, block_mask=block_mask, return_aux=fa.AuxRequest(lse=True))
        return out, aux.lse
    except (AttributeError, TypeError):
        return fn(q, k, v, block_mask=block_mask, return_lse=True)


_COMPILED_FLEX = None


def _compiled_flex():
    global _COMPILED_FLEX
    if _COMPILED_FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
    return _COMPILED_FLEX
