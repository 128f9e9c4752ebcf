"""The sort of one HEPTv2 layer's hashing, shared by the plain path (:mod:`heptv2`) and the
fused path (:mod:`fused_attention`) without either importing the other."""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Large finite "minus infinity" so fully padded buckets stay finite (never NaN).
MASKED = -1.0e30


@dataclass
class BucketOrder:
    """For every (row, round, head), the slot read at each bucket position, every event rounded
    up to whole buckets of its own. Kept in int32 (it lives until the layer's backward); the
    inverse and the fused path's row tables are derived on demand."""

    order: torch.Tensor  # [R, C, H, Sp] int32, slots 0..S-1 of the row
    position: torch.Tensor  # [R, S] long: the bucket position of each slot of sorted order
    valid: torch.Tensor  # [R, Sp] bool: the position holds a real hit

    @property
    def num_hits(self) -> int:
        return self.position.shape[1]

    @property
    def padded_len(self) -> int:
        return self.order.shape[-1]

    def sorted_slots(self) -> torch.Tensor:
        """[R, C, H, S]: ``order`` without the fill positions, in sorted order."""
        R, C, H, _ = self.order.shape
        return self.order.gather(-1, self.position[:, None, None, :].expand(R, C, H, -1))

    @property
    def rank(self) -> torch.Tensor:
        """[R, C, H, S] int32: the bucket position of every slot (built on each call)."""
        R, C, H, _ = self.order.shape
        rank = torch.empty(R, C, H, self.num_hits, dtype=torch.int32, device=self.order.device)
        slots = self.sorted_slots().long()
        positions = self.position.to(torch.int32)[:, None, None, :].expand(R, C, H, -1)
        return rank.scatter_(-1, slots, positions)

    @property
    def sort_rows(self) -> torch.Tensor:
        """``order`` as flat rows of a [R*S*H, dh] view, in the [R, C, H, Sp] layout."""
        R, C, H, Sp = self.order.shape
        b, _, h = _grid(R, C, H, self.order.device)
        return ((b * self.num_hits + self.order.long()) * H + h).reshape(-1)

    @property
    def unsort_rows(self) -> torch.Tensor:
        """The inverse: rows of a sorted [R, C, H, Sp, ...] tensor in slot order [R, C, S, H]."""
        R, C, H, _ = self.order.shape
        b, c, h = _grid(R, C, H, self.order.device)
        rows = ((b * C + c) * H + h) * self.padded_len + self.rank.long()
        return rows.transpose(2, 3).reshape(-1)


def _grid(B: int, C: int, H: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        torch.arange(B, device=device).view(B, 1, 1, 1),
        torch.arange(C, device=device).view(1, C, 1, 1),
        torch.arange(H, device=device).view(1, 1, H, 1),
    )
