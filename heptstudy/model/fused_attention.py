"""The fused bucket attention: the HEPTv2 layer's bucket-diagonal softmax attention through
``flex_attention`` (a compiled kernel on CUDA, flex_attention's reference path elsewhere)."""

from __future__ import annotations

import math

import torch

from heptstudy import stand_ins
from heptstudy.model.heptv2 import _MASKED, BucketOrder, _sorted, _unsorted


def fused_bucket_attention(q, k, v, buckets: BucketOrder, block_size: int):
    """The same attention through ``flex_attention`` with a bucket-diagonal block mask (``q``
    pre-scaled, so the kernel scale is 1); on CUDA this is a fused kernel (compiled), elsewhere
    flex_attention's reference path."""
    B, C, H, Sp = buckets.order.shape
    dh = q.shape[-1]
    qs, ks, vs = (_sorted(t, buckets).reshape(B * C, H, Sp, dh) for t in (q, k, v))
    n_valid = buckets.n_valid.repeat_interleave(C)
    out, lse = _flex(qs, ks, vs, bucket_block_mask(n_valid, Sp, block_size, q.device))
    out = out.view(B, C, H, Sp, dh)
    lse = lse.view(B, C, H, Sp)
    # Queries in buckets with no valid key get lse = -inf; give them a finite, negligible weight.
    lse = torch.nan_to_num(lse.float(), neginf=_MASKED)
    return _unsorted(out, buckets), _unsorted(lse, buckets)


#: Sparse block size of flex_attention's block mask.
FLEX_BLOCK = 128


def bucket_block_mask(n_valid: torch.Tensor, seq_len: int, block_size: int, device):
    """The block mask of bucket-diagonal attention, built from the bucket geometry directly:
    each 128-row query block lists the (at most a few) key blocks its buckets touch. Memory is
    O(seq_len), unlike evaluating the mask densely over seq_len x seq_len."""
    from torch.nn.attention.flex_attention import BlockMask

    n_blocks = math.ceil(seq_len / FLEX_BLOCK)
    q_first = torch.arange(n_blocks, device=device) * FLEX_BLOCK
    q_last = torch.clamp(q_first + FLEX_BLOCK, max=seq_len) - 1
    kv_lo = (q_first // block_size * block_size) // FLEX_BLOCK
    kv_hi = torch.clamp((q_last // block_size + 1) * block_size, max=seq_len).sub(1) // FLEX_BLOCK
    count = kv_hi - kv_lo + 1
    # Rows list their key blocks first; flex_attention reads only the first ``count`` of each.
    indices = torch.minimum(kv_lo[:, None] + torch.arange(n_blocks, device=device), kv_hi[:, None])

    def same_bucket(b, h, q_idx, kv_idx):
        return (q_idx // block_size == kv_idx // block_size) & (kv_idx < n_valid[b])

    return BlockMask.from_kv_blocks(
        count.to(torch.int32).view(1, 1, n_blocks),
        indices.to(torch.int32).view(1, 1, n_blocks, n_blocks),
        BLOCK_SIZE=FLEX_BLOCK,
        mask_mod=same_bucket,
        seq_lengths=(seq_len, seq_len),
    )


def _flex(q, k, v, block_mask):
    stand = stand_ins.active()  # a fake-tensor step: a same-footprint stand-in for the kernel
    if stand is not None and stand.flex is not None:
        return stand.flex(q, k, v, block_mask)
    from torch.nn.attention import flex_attention as fa

    fn = fa.flex_attention
    if q.is_cuda:
        fn = _compiled_flex()
    try:
        out, aux = fn(q, k, v, block_mask=block_mask, scale=1.0, return_aux=fa.AuxRequest(lse=True))
        return out, aux.lse
    except (AttributeError, TypeError):
        return fn(q, k, v, block_mask=block_mask, scale=1.0, return_lse=True)


_COMPILED_FLEX = None


def _compiled_flex():
    global _COMPILED_FLEX
    if _COMPILED_FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
    return _COMPILED_FLEX
