"""The sort of one HEPTv2 layer's hashing, shared by the plain path (:mod:`heptv2`) and the
fused path (:mod:`fused_attention`) without either importing the other."""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Large finite "minus infinity" so fully padded buckets stay finite (never NaN).
MASKED = -1.0e30


@dataclass
class BucketOrder:
    """For every (event, round, head), the hit index at each sorted position, padded to whole
    buckets. Only ``order`` is stored, in int32 (it lives until the layer's backward); the
    inverse and the fused path's row tables are derived on demand."""

    order: torch.Tensor  # [B, C, H, Sp] int32, indices into 0..S-1
    n_valid: torch.Tensor  # [B] long
    num_hits: int  # S
    padded_len: int  # Sp, a multiple of block_size

    @property
    def rank(self) -> torch.Tensor:
        """[B, C, H, S] int32: the sorted position of every hit (built on each call)."""
        B, C, H, _ = self.order.shape
        S = self.num_hits
        rank = torch.empty(B, C, H, S, dtype=torch.int32, device=self.order.device)
        positions = torch.arange(S, dtype=torch.int32, device=self.order.device)
        return rank.scatter_(-1, self.order[..., :S].long(), positions.expand_as(rank))

    @property
    def sort_rows(self) -> torch.Tensor:
        """``order`` as flat rows of a [B*S*H, dh] view, in the [B, C, H, Sp] layout."""
        B, C, H, Sp = self.order.shape
        b, _, h = _grid(B, C, H, self.order.device)
        return ((b * self.num_hits + self.order.long()) * H + h).reshape(-1)

    @property
    def unsort_rows(self) -> torch.Tensor:
        """The inverse: rows of a sorted [B, C, H, Sp, ...] tensor in hit order [B, C, S, H]."""
        B, C, H, _ = self.order.shape
        b, c, h = _grid(B, C, H, self.order.device)
        rows = ((b * C + c) * H + h) * self.padded_len + self.rank.long()
        return rows.transpose(2, 3).reshape(-1)


def _grid(B: int, C: int, H: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        torch.arange(B, device=device).view(B, 1, 1, 1),
        torch.arange(C, device=device).view(1, C, 1, 1),
        torch.arange(H, device=device).view(1, 1, H, 1),
    )
