"""The HEPTv2 layer's bucket-diagonal attention through ``flex_attention`` with a sparse block
mask; the kernel call itself is :mod:`heptstudy.model.flex_kernel`."""

from __future__ import annotations

import math

import torch

from heptstudy import stand_ins
from heptstudy.model import flex_kernel
from heptstudy.model.buckets import MASKED, BucketOrder

FLEX_BLOCK = flex_kernel.FLEX_BLOCK


def fused_bucket_attention(q, k, v, buckets: BucketOrder, block_size: int):
    """The bucket attention through ``flex_attention``; ``out`` and ``lse`` as the plain path."""
    B, C, H, Sp = buckets.order.shape
    S = buckets.num_hits
    dh = q.shape[-1]
    L = flex_kernel.kernel_length(Sp)
    sort_rows, unsort_rows = _kernel_rows(buckets, L)
    qs, ks, vs = (
        t.reshape(-1, dh).index_select(0, sort_rows).view(B * C, H, L, dh) for t in (q, k, v)
    )
    valid = torch.nn.functional.pad(buckets.valid, (0, L - Sp)).repeat_interleave(C, dim=0)
    stand = stand_ins.active()  # the fake step's stand-in for the kernel
    flex = flex_kernel.flex_attention_lse if stand is None or stand.flex is None else stand.flex
    out, lse = flex(qs, ks, vs, bucket_block_mask(valid, block_size))
    # Queries in buckets with no valid key get lse = -inf; give them a finite, negligible weight.
    lse = torch.nan_to_num(lse.float(), neginf=MASKED)
    out = out.reshape(-1, dh).index_select(0, unsort_rows).view(B, C, S, H, dh)
    lse = lse.reshape(-1).index_select(0, unsort_rows).view(B, C, S, H)
    return out, lse


def _kernel_rows(buckets: BucketOrder, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sort and unsort row indices for a kernel length ``L >= Sp``. Rows past ``Sp`` read
    hit row 0 (masked as keys, never read back as queries); padding the indices rather than the
    sorted tensors costs no copy of q, k or v."""
    Sp = buckets.padded_len
    if L == Sp:
        return buckets.sort_rows, buckets.unsort_rows
    rows = buckets.sort_rows.view(-1, Sp)
    pad = rows.new_zeros(rows.shape[0], L - Sp)
    sort_rows = torch.cat([rows, pad], dim=1).reshape(-1)
    u = buckets.unsort_rows
    return sort_rows, u + (u // Sp) * (L - Sp)


def bucket_block_mask(valid: torch.Tensor, block_size: int):
    """The bucket-diagonal block mask built from the bucket geometry: O(seq_len) memory, unlike
    evaluating the mask densely. ``valid [rows, seq_len]``: the positions holding a real hit
    (buckets never straddle two events, so a bucket is also an event's document mask)."""
    from torch.nn.attention.flex_attention import BlockMask

    seq_len, device = valid.shape[1], valid.device
    n_blocks = math.ceil(seq_len / FLEX_BLOCK)
    q_first = torch.arange(n_blocks, device=device) * FLEX_BLOCK
    q_last = torch.clamp(q_first + FLEX_BLOCK, max=seq_len) - 1
    kv_lo = (q_first // block_size * block_size) // FLEX_BLOCK
    kv_hi = torch.clamp((q_last // block_size + 1) * block_size, max=seq_len).sub(1) // FLEX_BLOCK
    count = kv_hi - kv_lo + 1
    # Rows list their key blocks first; flex_attention reads only the first ``count`` of each.
    indices = torch.minimum(kv_lo[:, None] + torch.arange(n_blocks, device=device), kv_hi[:, None])

    def same_bucket(b, h, q_idx, kv_idx):
        return (q_idx // block_size == kv_idx // block_size) & valid[b, kv_idx]

    return BlockMask.from_kv_blocks(
        count.to(torch.int32).view(1, 1, n_blocks),
        indices.to(torch.int32).view(1, 1, n_blocks, n_blocks),
        BLOCK_SIZE=FLEX_BLOCK,
        mask_mod=same_bucket,
        seq_lengths=(seq_len, seq_len),
    )
