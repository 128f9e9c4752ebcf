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

#: Width of the positional MLP's hidden layer.
POSITIONAL_HIDDEN = 32

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
    # The same permutations as flat row indices, for index_select on [B*S*H, dh] rows (sort)
    # and on [B*C*H*Sp, dh] rows (unsort): far cheaper than gather with a full index tensor.
    sort_rows: torch.Tensor  # [B*C*H*Sp]
    unsort_rows: torch.Tensor  # [B*C*S*H]


class HEPTv2Layer(nn.Module):
    def __init__(self, cfg: HEPTv2Config, layer_index: int):
        super().__init__()
        dim, heads = cfg.embedding_dim, cfg.num_heads
        self.num_heads, self.head_dim = heads, dim // heads
        self.block_size, self.n_hashes = cfg.block_size, cfg.n_hashes
        self.attention_backend = cfg.attention_backend
        self.pos_embed = nn.Sequential(
            nn.Linear(2, POSITIONAL_HIDDEN), nn.SiLU(), nn.Linear(POSITIONAL_HIDDEN, dim)
        )
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
        self.register_buffer(
            "region_shape", _region_shapes(cfg.n_hashes, heads, cfg.num_regions, gen)
        )

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

        proj = torch.einsum(
            "bsk,chk->bchs", coords.masked_fill(~mask[..., None], 0.0), self.hash_directions
        )
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
        rank = torch.empty(
            B, self.n_hashes, self.num_heads, S, dtype=torch.long, device=coords.device
        )
        positions = torch.arange(S, device=coords.device).expand_as(rank)
        rank.scatter_(-1, order[..., :S], positions)
        dev = coords.device
        b = torch.arange(B, device=dev).view(B, 1, 1, 1)
        c = torch.arange(self.n_hashes, device=dev).view(1, -1, 1, 1)
        h = torch.arange(self.num_heads, device=dev).view(1, 1, -1, 1)
        sort_rows = ((b * S + order) * self.num_heads + h).reshape(-1)
        # Unsorted results come out as [B, C, S, H]: the layout the output projection reads.
        unsort_rows = (
            (((b * self.n_hashes + c) * self.num_heads + h) * Sp + rank).transpose(2, 3).reshape(-1)
        )
        return BucketOrder(order, rank, n_valid, Sp, sort_rows, unsort_rows)

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
        q, k = self.q_norm(q) * (dh**-0.5), self.k_norm(k)
        if self._use_fused(h):
            from heptstudy.model.fused_attention import fused_bucket_attention

            out, lse = fused_bucket_attention(q, k, v, buckets, self.block_size)
        else:
            out, lse = plain_bucket_attention(q, k, v, buckets, self.block_size)
        # out [B,C,S,H,dh], lse [B,C,S,H]: merge rounds by softmax of their log-sum-exps.
        weights = torch.softmax(lse.float(), dim=1).to(out.dtype)
        merged = (weights.unsqueeze(-1) * out).sum(dim=1)  # [B,S,H,dh]
        return self.out(merged.reshape(B, S, D))

    def _use_fused(self, h: torch.Tensor) -> bool:
        if self.attention_backend == "plain":
            return False
        if self.attention_backend == "fused":
            return True
        return h.is_cuda


def _region_shapes(
    n_hashes: int, heads: int, num_regions: int, gen: torch.Generator
) -> torch.Tensor:
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


def _sorted(t: torch.Tensor, buckets: BucketOrder) -> torch.Tensor:
    """[B,S,H,dh] in hit order -> [B,C,H,Sp,dh], each (round, head) in its own sorted order."""
    dh = t.shape[-1]
    rows = t.reshape(-1, dh).index_select(0, buckets.sort_rows)
    return rows.view(*buckets.order.shape, dh)


def _unsorted(t: torch.Tensor, buckets: BucketOrder) -> torch.Tensor:
    """Inverse of :func:`_sorted`: [B,C,H,Sp(,dh)] -> [B,C,S,H(,dh)] in hit order."""
    B, C, H, S = buckets.rank.shape
    shape = (B, C, S, H)
    if t.dim() == len(shape):
        return t.reshape(-1).index_select(0, buckets.unsort_rows).view(shape)
    dh = t.shape[-1]
    return t.reshape(-1, dh).index_select(0, buckets.unsort_rows).view(*shape, dh)


class _BucketSoftmaxAttention(torch.autograd.Function):
    """Softmax attention inside buckets, returning the output and the log-sum-exp per query.

    Written as one autograd function so that the score tensor is turned into probabilities in
    place and only the probabilities are kept for backward (autograd op by op would keep the
    scores, the probabilities and several same-sized temporaries). The backward is the exact
    gradient: with P the probabilities and O the output, dS = P * (dP - rowsum(dO * O) + dlse),
    where rowsum(dO * O) equals rowsum(dP * P) without a bucket-sized temporary.
    """

    @staticmethod
    def forward(ctx, q, k, v, key_valid):
        scores = torch.matmul(q, k.transpose(-1, -2))
        scores.masked_fill_(~key_valid, _MASKED)
        lse = torch.logsumexp(scores, dim=-1, keepdim=True)
        probs = scores.sub_(lse).exp_()
        out = torch.matmul(probs, v)
        ctx.save_for_backward(q, k, v, probs, out)
        return out, lse.squeeze(-1)

    @staticmethod
    def backward(ctx, d_out, d_lse):
        q, k, v, probs, out = ctx.saved_tensors
        d_v = torch.matmul(probs.transpose(-1, -2), d_out)
        d_scores = torch.matmul(d_out, v.transpose(-1, -2))
        row = (d_out * out).sum(dim=-1, keepdim=True)
        if d_lse is not None:
            row = row - d_lse.unsqueeze(-1)
        d_scores.sub_(row).mul_(probs)
        d_q = torch.matmul(d_scores, k)
        d_k = torch.matmul(d_scores.transpose(-1, -2), q)
        return d_q, d_k, d_v, None


def plain_bucket_attention(q, k, v, buckets: BucketOrder, block_size: int):
    """Softmax attention inside contiguous buckets of the sorted sequences, in plain PyTorch.

    ``q`` must already carry the 1/sqrt(head_dim) scale. Returns the per-round output
    [B,C,H,S,dh] and log-sum-exp [B,C,H,S] in hit order.
    """
    B, C, H, Sp = buckets.order.shape
    dh = q.shape[-1]
    nb = Sp // block_size
    qs, ks, vs = (_sorted(t, buckets).view(B, C, H, nb, block_size, dh) for t in (q, k, v))
    # Valid hits sort first, so a sorted position is a real hit iff it is below the event's count.
    key_valid = torch.arange(Sp, device=q.device)[None, :] < buckets.n_valid[:, None]  # [B,Sp]
    key_valid = key_valid.view(B, 1, 1, nb, 1, block_size)
    out, lse = _BucketSoftmaxAttention.apply(qs, ks, vs, key_valid)
    out = out.view(B, C, H, Sp, dh)
    lse = lse.view(B, C, H, Sp)
    return _unsorted(out, buckets), _unsorted(lse, buckets)
