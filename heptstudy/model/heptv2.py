"""The HEPTv2 layer: LSH-bucketed attention over hits in (eta, phi), rounds merged by their
log-sum-exps. Attention, SwiGLU and norms are autograd functions keeping little for backward and
working in bounded slices; bit for bit the same with and without checkpointing."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from heptstudy import stand_ins
from heptstudy.config import HEPTv2Config
from heptstudy.data.layout import EventLayout, EventSpan
from heptstudy.model import custom_ops
from heptstudy.model.activation_checkpointing import recompute_is_lean
from heptstudy.model.buckets import MASKED, BucketOrder
from heptstudy.model.encoding import COS_PHI, ETA, SIN_PHI

POSITIONAL_HIDDEN = 32

#: Elements of a :class:`SwiGLU` row slice: 8 MiB in float32, whatever the batch.
SWIGLU_SLICE_ELEMENTS = 1 << 21


def hit_coordinates(features: torch.Tensor) -> torch.Tensor:
    """(eta, phi) per hit in float32."""
    f = features.float()
    return torch.stack([f[..., ETA], torch.atan2(f[..., SIN_PHI], f[..., COS_PHI])], dim=-1)


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype autocast would run a matrix product in (the promoted input dtype without it)."""
    device_type = tensors[0].device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


class RMSNorm(nn.Module):
    """RMS norm keeping its input and one float per row (``F.rms_norm`` also keeps the output);
    one dispatcher op (``heptstudy::rms_norm``) whose output and rstd a policy may keep."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            return RMS_NORM(x, self.weight, self.eps)[0]


def _rms_norm(x, weight, eps):
    xs = x.to(_stats_dtype(x))
    rstd = torch.rsqrt(xs.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xs * rstd * weight).to(x.dtype), rstd


def _rms_norm_fake(x, weight, eps):
    return torch.empty_like(x), x.new_empty(*x.shape[:-1], 1, dtype=_stats_dtype(x))


def _rms_norm_setup(ctx, inputs, output):
    x, weight, _eps = inputs
    ctx.save_for_backward(x, output[1], weight)
    _no_gradient_for(ctx, output[1:])


def _rms_norm_backward(ctx, d_y, _d_rstd):
    if d_y is None:  # no gradient reached the output (grads are not materialised)
        return None, None, None
    x, rstd, weight = ctx.saved_tensors
    normed = x.to(rstd.dtype) * rstd
    d_y = d_y.to(rstd.dtype)
    d_weight = None
    if ctx.needs_input_grad[1]:
        d_weight = (d_y * normed).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
    d_normed = d_y * weight
    correction = (d_normed * normed).mean(dim=-1, keepdim=True)
    d_x = d_normed.sub_(normed.mul_(correction)).mul_(rstd).to(x.dtype)
    return d_x, d_weight, None


RMS_NORM = custom_ops.define(
    "rms_norm",
    "(Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)",
    _rms_norm,
    _rms_norm_fake,
    backward=_rms_norm_backward,
    setup=_rms_norm_setup,
)


class Dropout(nn.Dropout):
    """Dropout keeping a boolean mask on CPU too (``F.dropout`` keeps it in the input's dtype).
    On CPU the mask is its own op (``heptstudy::dropout_mask``, the draws of ``native_dropout``'s
    CPU kernel), so a policy may keep the mask (a byte per element) without the output."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        if x.device.type != "cpu":  # CUDA's fused kernel draws its own way: as it always ran
            return torch.native_dropout(x, self.p, True)[0]
        mask = DROPOUT_MASK(x.detach(), self.p)
        return _MaskedScale.apply(x, mask, 1.0 / (1.0 - self.p) if self.p < 1 else 0.0)


def _dropout_mask(x, p):
    return torch.empty_like(x, dtype=torch.bool).bernoulli_(1.0 - p)


DROPOUT_MASK = custom_ops.define(
    "dropout_mask",
    "(Tensor x, float p) -> Tensor",
    _dropout_mask,
    lambda x, p: torch.empty_like(x, dtype=torch.bool),
)


class _MaskedScale(torch.autograd.Function):
    """``native_dropout``'s output and gradient from a given mask, keeping only the mask."""

    @staticmethod
    def forward(ctx, x, mask, scale):
        ctx.scale = scale
        ctx.save_for_backward(mask)
        return x.mul(mask).mul_(scale)

    @staticmethod
    def backward(ctx, d_out):
        (mask,) = ctx.saved_tensors
        return torch.ops.aten.native_dropout_backward(d_out, mask, ctx.scale), None, None


class SwiGLU(nn.Module):
    """``down(silu(gate) * up)`` a slice of rows at a time, keeping ``x`` and ``gate_up(x)``;
    recomputed lean (every checkpointed plan but ``selective``), only ``x``, so recompute never
    holds the whole product. One dispatcher op (``heptstudy::swiglu``) whose output a policy may
    keep without the hidden products."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = compute_dtype(x, self.gate_up.weight)
        w_gate_up, w_down = self.gate_up.weight.to(dtype), self.down.weight.to(dtype)
        with torch.autocast(device_type=x.device.type, enabled=False):
            return SWIGLU(x.to(dtype), w_gate_up, w_down, not recompute_is_lean())[0]


def _row_slices(rows: int, width: int):
    step = max(1, SWIGLU_SLICE_ELEMENTS // width)
    return stand_ins.repeated([slice(r, min(r + step, rows)) for r in range(0, rows, step)])


def _accumulate_product(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += a @ b``, ``acc`` in float32 at least: bf16 sums over slices would drift."""
    if acc.dtype == a.dtype:
        acc.addmm_(a, b)
    else:
        acc.add_(torch.mm(a, b))


def _swiglu(x, w_gate_up, w_down, keep_gate_up):
    """``(out, gate_up)``; ``gate_up`` is empty unless kept for backward."""
    rows = x.reshape(-1, x.shape[-1])
    out = x.new_empty(*x.shape[:-1], w_down.shape[0])
    gate_up = rows.new_empty(rows.shape[0] if keep_gate_up else 0, w_gate_up.shape[0])
    # looked up per call: a test counts the forwards
    _swiglu_rows(rows, w_gate_up, w_down, out.view(-1, w_down.shape[0]), gate_up)
    return out, gate_up


def _swiglu_rows(rows, w_gate_up, w_down, out_rows, gate_up) -> None:
    """``out_rows`` and, unless empty, ``gate_up`` of ``rows``, a slice at a time."""
    hidden, keep_gate_up = w_down.shape[1], gate_up.numel() > 0
    for r in _row_slices(rows.shape[0], 2 * hidden):
        part = torch.mm(rows[r], w_gate_up.t())
        if keep_gate_up:
            gate_up[r] = part
        hidden_out = F.silu(part[:, :hidden]).mul_(part[:, hidden:])
        out_rows[r] = torch.mm(hidden_out, w_down.t())
        del part, hidden_out


def _swiglu_fake(x, w_gate_up, w_down, keep_gate_up):
    rows = x.numel() // x.shape[-1] if keep_gate_up else 0
    return x.new_empty(*x.shape[:-1], w_down.shape[0]), x.new_empty(rows, w_gate_up.shape[0])


def _swiglu_setup(ctx, inputs, output):
    x, w_gate_up, w_down, keep_gate_up = inputs
    ctx.keep_gate_up = keep_gate_up
    ctx.save_for_backward(x, *([output[1]] if keep_gate_up else []), w_gate_up, w_down)
    _no_gradient_for(ctx, output[1:])


def _swiglu_backward(ctx, d_out, _d_gate_up):
    if d_out is None:  # no gradient reached the output (grads are not materialised)
        return None, None, None, None
    if ctx.keep_gate_up:
        x, gate_up, w_gate_up, w_down = ctx.saved_tensors
    else:
        (x, w_gate_up, w_down), gate_up = ctx.saved_tensors, None
    hidden = w_down.shape[1]
    rows = x.reshape(-1, x.shape[-1])
    d_rows = d_out.reshape(-1, d_out.shape[-1]).to(x.dtype)
    d_x = torch.empty_like(rows)
    d_w_gate_up = torch.zeros_like(w_gate_up, dtype=_stats_dtype(w_gate_up))
    d_w_down = torch.zeros_like(w_down, dtype=_stats_dtype(w_down))
    for r in _row_slices(rows.shape[0], 2 * hidden):
        part = torch.mm(rows[r], w_gate_up.t()) if gate_up is None else gate_up[r]
        _swiglu_slice_backward(
            d_rows[r], rows[r], part, (w_gate_up, w_down), (d_w_gate_up, d_w_down), d_x[r]
        )
        del part
    return d_x.view_as(x), d_w_gate_up.to(w_gate_up.dtype), d_w_down.to(w_down.dtype), None


def _swiglu_slice_backward(d_out, x, gate_up, weights, weight_grads, d_x) -> None:
    """One row slice (a function so its temporaries are freed before the next slice)."""
    (w_gate_up, w_down), (d_w_gate_up, d_w_down) = weights, weight_grads
    hidden = w_down.shape[1]
    gate, up = gate_up[:, :hidden], gate_up[:, hidden:]
    act = F.silu(gate)
    _accumulate_product(d_w_down, d_out.t(), act * up)
    d_hidden = torch.mm(d_out, w_down)
    d_gate_up = torch.empty_like(gate_up)
    d_gate, d_up = d_gate_up[:, :hidden], d_gate_up[:, hidden:]
    torch.mul(d_hidden, up, out=d_gate)
    torch.ops.aten.silu_backward.grad_input(d_gate, gate, grad_input=d_gate)
    torch.mul(d_hidden, act, out=d_up)
    _accumulate_product(d_w_gate_up, d_gate_up.t(), x)
    torch.mm(d_gate_up, w_gate_up, out=d_x)


SWIGLU = custom_ops.define(
    "swiglu",
    "(Tensor x, Tensor w_gate_up, Tensor w_down, bool keep_gate_up) -> (Tensor, Tensor)",
    _swiglu,
    _swiglu_fake,
    backward=_swiglu_backward,
    setup=_swiglu_setup,
)


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
        self.dropout = Dropout(cfg.dropout)

        # Own generator: the global RNG is untouched.
        gen = torch.Generator().manual_seed(cfg.hash_seed * 1000 + layer_index)
        self.register_buffer("hash_directions", torch.randn(cfg.n_hashes, heads, 2, generator=gen))
        root = math.sqrt(cfg.num_regions)
        lo, hi = max(1, int(root / 2)), max(1, int(root * 2))
        n_eta = torch.randint(lo, hi + 1, (cfg.n_hashes, heads), generator=gen)
        n_phi = torch.clamp(torch.round(cfg.num_regions / n_eta.float()), min=1).long()
        self.register_buffer("region_shape", torch.stack([n_eta, n_phi], dim=-1))

    def dense_projections(self) -> tuple[nn.Module, ...]:
        """The modules whose products the selective policy keeps."""
        return (self.qkv, self.out, self.mlp)

    @torch.no_grad()
    def bucket_order(
        self, coords: torch.Tensor, mask: torch.Tensor, layout: EventLayout
    ) -> BucketOrder:
        """Hash and sort every event's hits, in float32: one op, ``heptstudy::bucket_order``,
        given the layout's host integers."""
        with torch.autocast(device_type=coords.device.type, enabled=False):
            spans = layout.spans
            return BucketOrder(
                *BUCKET_ORDER(
                    coords.float(),
                    mask,
                    self.hash_directions,
                    self.region_shape,
                    self.block_size,
                    layout.rows,
                    layout.row_slots,
                    *([getattr(s, f) for s in spans] for f in ("row", "start", "slots", "hits")),
                )
            )

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        coords: torch.Tensor,
        layout: EventLayout,
        buckets: BucketOrder | None = None,
    ) -> torch.Tensor:
        """``buckets`` None: hashed here, inside a checkpointed layer's region, so backward
        rehashes; the model passes None, the backbone bench its own bucket order."""
        if buckets is None:
            buckets = self.bucket_order(coords, mask, layout)
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
        backend = self.attention_backend
        if backend == "fused" or (backend != "plain" and h.is_cuda):
            from heptstudy.model.fused_attention import fused_bucket_attention

            merged = merge_rounds(*fused_bucket_attention(q, k, v, buckets, self.block_size))
        else:
            merged = plain_bucket_attention(q, k, v, buckets, self.block_size)
        return self.out(merged.reshape(B, S, D))


def merge_rounds(out: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """``out [B,C,S,H,dh]``, ``lse [B,C,S,H]`` -> [B,S,H,dh], rounds weighted by softmax(lse)."""
    weights = torch.softmax(lse.to(_stats_dtype(lse)), dim=1).to(out.dtype)
    return (weights.unsqueeze(-1) * out).sum(dim=1)


def _hash_and_sort(coords, mask, hash_directions, region_shape, layout, block_size):
    """``(order, position, valid)`` of :class:`BucketOrder`, the order in int32."""
    dev = coords.device
    event = layout.slot_event(dev)  # [R, S]
    start = layout.slot_start(dev)
    sort = _event_sort(event, layout.one_event_per_row)
    n_valid = torch.tensor([s.hits for s in layout.spans], device=dev)[event]
    valid_f = mask[:, None, None, :]

    # Quantile bins from each hit's rank among its event's valid hits; padding ranks last.
    big = torch.finfo(torch.float32).max
    eta = coords[..., 0].masked_fill(~mask, big)
    phi = coords[..., 1].masked_fill(~mask, big)
    eta_rank = _ranks(eta, sort).sub_(start).float()
    phi_rank = _ranks(phi, sort).sub_(start).float()
    denom = n_valid.clamp(min=1).float()
    eta_q = (eta_rank / denom)[:, None, None, :]  # [R,1,1,S] in [0,1) for valid hits
    phi_q = (phi_rank / denom)[:, None, None, :]
    n_eta = region_shape[..., 0].float()[None, :, :, None]  # [1,C,H,1]
    n_phi = region_shape[..., 1].float()[None, :, :, None]
    eta_bin = torch.minimum(torch.floor(eta_q * n_eta), n_eta - 1)
    phi_bin = torch.minimum(torch.floor(phi_q * n_phi), n_phi - 1)
    region = eta_bin * n_phi + phi_bin  # [R,C,H,S]

    proj = torch.einsum("bsk,chk->bchs", coords.masked_fill(~mask[..., None], 0.0), hash_directions)
    lo = _event_extreme(proj.masked_fill(~valid_f, big), event, "amin", layout.num_events)
    hi = _event_extreme(proj.masked_fill(~valid_f, -big), event, "amax", layout.num_events)
    span = (hi - lo).clamp(min=1e-6)
    # Normalised projection lies in [0, 1): adding the region index sorts by region first.
    key = region + (proj - lo) / (span * (1 + 1e-4))
    key = key.masked_fill(~valid_f, float("inf"))
    order = sort(key)  # [R,C,H,S], every event's slots in its own run
    position, source, valid = layout.bucket_geometry(block_size, dev)
    R, C, H, _ = order.shape
    order = order.gather(-1, source[:, None, None, :].expand(R, C, H, -1))
    return order.to(torch.int32), position, valid


def _layout(rows, row_slots, *spans) -> EventLayout:
    return EventLayout(rows, row_slots, tuple(EventSpan(*s) for s in zip(*spans, strict=True)))


def _bucket_order_kernel(coords, mask, hash_directions, region_shape, block_size, *layout):
    # _hash_and_sort looked up per call: a test counts the hashing
    return _hash_and_sort(coords, mask, hash_directions, region_shape, _layout(*layout), block_size)


def _bucket_order_fake(coords, mask, hash_directions, region_shape, block_size, *layout):
    layout = _layout(*layout)
    # as EventLayout.bucket_geometry: each event rounded up to whole buckets, rows of equal length
    padded_len = max(
        sum(-(-s.slots // block_size) * block_size for s in layout.spans if s.row == r)
        for r in range(layout.rows)
    )
    R, (C, H) = layout.rows, hash_directions.shape[:2]
    return (
        coords.new_empty(R, C, H, padded_len, dtype=torch.int32),
        coords.new_empty(R, layout.row_slots, dtype=torch.long),
        coords.new_empty(R, padded_len, dtype=torch.bool),
    )


BUCKET_ORDER = custom_ops.define(
    "bucket_order",
    "(Tensor coords, Tensor mask, Tensor hash_directions, Tensor region_shape, int block_size, "
    "int rows, int row_slots, int[] span_rows, int[] span_starts, int[] span_slots, "
    "int[] span_hits) -> (Tensor, Tensor, Tensor)",
    _bucket_order_kernel,
    _bucket_order_fake,
)


def _event_sort(event: torch.Tensor, one_event_per_row: bool):
    """``sort(values)``: the argsort of ``values [R, ..., S]`` by (event, value, slot), stable."""

    def sort(values: torch.Tensor) -> torch.Tensor:
        order = torch.argsort(values, dim=-1, stable=True)
        if one_event_per_row:
            return order  # the event of every slot is its row's: the sort by event is the identity
        events = event.view(event.shape[0], *[1] * (values.dim() - 2), -1).expand_as(values)
        by_event = torch.argsort(events.gather(-1, order), dim=-1, stable=True)
        return order.gather(-1, by_event)

    return sort


def _ranks(values: torch.Tensor, sort) -> torch.Tensor:
    """The position of each slot in its row's sorted order."""
    order = sort(values)
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, torch.arange(values.shape[-1], device=values.device).expand_as(order))
    return ranks


def _event_extreme(values: torch.Tensor, event: torch.Tensor, how: str, events: int):
    """``values [R, C, H, S]`` replaced by their event's minimum or maximum (``how``)."""
    R, C, H, S = values.shape
    index = event[:, None, None, :].expand(R, C, H, S)
    extreme = values.new_zeros(R, C, H, events)
    extreme.scatter_reduce_(-1, index, values, how, include_self=False)
    return extreme.gather(-1, index)


#: Elements of one slice's scores (a round's heads that fit): 32 MiB in float32, whatever the batch.
ATTENTION_SLICE_ELEMENTS = 1 << 23

#: Scores computed at once inside a slice (buckets x block_size^2): 8 MiB in float32.
BUCKET_CHUNK_ELEMENTS = 1 << 21


def plain_bucket_attention(q, k, v, buckets: BucketOrder, block_size: int) -> torch.Tensor:
    """Softmax attention inside the buckets, rounds merged; ``q`` already scaled, [B, S, H, dh]."""
    dtype = compute_dtype(q, k, v)
    with torch.autocast(device_type=q.device.type, enabled=False):
        return BUCKET_ATTENTION(
            q.to(dtype),
            k.to(dtype),
            v.to(dtype),
            buckets.order,
            buckets.position,
            buckets.valid,
            block_size,
        )[0]


def _bucket_attention(q, k, v, order, position, valid, block_size):
    """``(out, lse, sort_index, unsort_index, key_bias)``: the merged output, its log-sum-exp and
    the slices' indices, all of which backward keeps. With P = exp(s - L) backward needs no
    per-round output: dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)), s recomputed."""
    slices = _Slices(BucketOrder(order, position, valid), block_size)
    out, lse = _attention_forward(q, k, v, slices)
    return out, lse, slices.sort_index, slices.unsort_index, slices.key_bias


def _bucket_attention_fake(q, k, v, order, position, valid, block_size):
    B, C, H, Sp = order.shape
    S, dh = position.shape[1], q.shape[-1]
    g = _head_group(B, H, Sp, block_size)
    return (
        q.new_empty(B, S, H, dh),
        q.new_empty(B, S, H, dtype=_stats_dtype(q)),
        order.new_empty(C, H // g, B * g * Sp, dtype=torch.int32),
        order.new_empty(C, H // g, B * g * S, dtype=torch.long),
        q.new_empty(B * g * (Sp // block_size), 1, block_size, dtype=torch.float32),
    )


def _bucket_attention_setup(ctx, inputs, output):
    q, k, v, order, position, _valid, block_size = inputs
    B, C, H, Sp = order.shape
    ctx.slices = (B, C, H, Sp, position.shape[1], block_size), _head_group(B, H, Sp, block_size)
    ctx.save_for_backward(q, k, v, *output)
    _no_gradient_for(ctx, output[1:])


def _no_gradient_for(ctx, outputs) -> None:
    """Outputs backward reads but never differentiates: no zero gradient is made for them
    (autograd would materialise one of each, in backward, at the layer's peak)."""
    ctx.mark_non_differentiable(*outputs)
    ctx.set_materialize_grads(False)


def _bucket_attention_backward(ctx, d_out, *_unused):
    if d_out is None:  # no gradient reached the output (grads are not materialised)
        return (None,) * 7
    q, k, v, out, lse, *indices = ctx.saved_tensors
    slices = _Slices.__new__(_Slices)
    slices.shape, slices.group = ctx.slices
    slices.sort_index, slices.unsort_index, slices.key_bias = indices
    return (*_attention_backward(d_out, q, k, v, out, lse, slices), None, None, None, None)


BUCKET_ATTENTION = custom_ops.define(
    "bucket_attention",
    "(Tensor q, Tensor k, Tensor v, Tensor order, Tensor position, Tensor valid, int block_size) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    _bucket_attention,
    _bucket_attention_fake,
    backward=_bucket_attention_backward,
    setup=_bucket_attention_setup,
)


def _head_group(B: int, H: int, Sp: int, block_size: int) -> int:
    """The most heads of a round whose scores fit in ATTENTION_SLICE_ELEMENTS."""
    per_head = B * Sp * block_size
    fits = [g for g in range(1, H + 1) if H % g == 0 and g * per_head <= ATTENTION_SLICE_ELEMENTS]
    return max(fits, default=1)


class _Slices:
    """The slices (round c, head group j) of one bucket order and their int32 gather indices
    (``sort_index`` into :meth:`table`, padding reading its zero row; ``unsort_index`` back)."""

    def __init__(self, buckets: BucketOrder, block_size):
        B, C, H, Sp = buckets.order.shape
        self.shape = (B, C, H, Sp, buckets.num_hits, block_size)
        self.group = g = _head_group(B, H, Sp, block_size)
        S, G, dev = buckets.num_hits, H // g, buckets.order.device
        b = torch.arange(B, device=dev).view(1, 1, B, 1, 1)
        within = torch.arange(g, device=dev).view(1, 1, 1, g, 1)
        grouped = buckets.sorted_slots().view(B, C, G, g, S).permute(1, 2, 0, 3, 4)  # [C,G,B,g,S]
        # fill positions read the table's zero row
        sort_index = torch.full((C, G, B, g, Sp), B * S * g, dtype=torch.int32, device=dev)
        position = buckets.position.view(1, 1, B, 1, S).expand(C, G, B, g, S)
        sort_index.scatter_(-1, position, ((b * S + grouped) * g + within).to(torch.int32))
        self.sort_index = sort_index.view(C, G, -1)
        rank = buckets.rank.view(B, C, G, g, S).permute(1, 2, 0, 4, 3)  # [C, G, B, S, g]
        within = within.view(1, 1, 1, 1, g)
        self.unsort_index = ((b * g + within) * Sp + rank).reshape(C, G, -1)
        padding = ~buckets.valid  # [B, Sp]
        bias = torch.zeros(B, 1, Sp // block_size, 1, block_size, device=dev)
        bias.masked_fill_(padding.view(B, 1, -1, 1, block_size), MASKED)
        self.key_bias = bias.expand(B, g, -1, 1, block_size).reshape(-1, 1, block_size)

    @property
    def groups(self):
        return stand_ins.repeated(list(range(self.shape[2] // self.group)))

    def heads(self, j: int) -> slice:
        return slice(j * self.group, (j + 1) * self.group)

    def table(self, tensors: list[torch.Tensor], j: int) -> torch.Tensor:
        """Head group ``j`` of [B, S, H, w_i] tensors as rows [B*S*g + 1, sum w_i], last row 0."""
        B, _, _, _, S, _ = self.shape
        g, hs = self.group, self.heads(j)
        width = sum(t.shape[-1] for t in tensors)
        table = tensors[0].new_empty(B * S * g + 1, width)
        torch.cat([t[:, :, hs] for t in tensors], dim=-1, out=table[:-1].view(B, S, g, width))
        table[-1].zero_()
        return table

    def gather(self, rows: torch.Tensor, c: int, j: int) -> torch.Tensor:
        bs = self.shape[-1]
        return rows.index_select(0, self.sort_index[c, j]).view(-1, bs, rows.shape[-1])

    def to_hit_order(self, sorted_rows: torch.Tensor, c: int, j: int, out=None) -> torch.Tensor:
        return torch.index_select(sorted_rows, 0, self.unsort_index[c, j], out=out)

    def scores(self, qs: torch.Tensor, ks: torch.Tensor, buckets: slice) -> torch.Tensor:
        return torch.baddbmm(self.key_bias[buckets].to(qs.dtype), qs, ks.transpose(1, 2))

    def bucket_chunks(self, buckets: int):
        bs = self.shape[-1]
        step = max(1, BUCKET_CHUNK_ELEMENTS // (bs * bs))
        return stand_ins.repeated(
            [slice(i, min(i + step, buckets)) for i in range(0, buckets, step)]
        )

    def put_heads(self, target: torch.Tensor, j: int, rows: torch.Tensor) -> None:
        B, _, _, _, S, _ = self.shape
        target[:, :, self.heads(j)] = rows.reshape(B, S, self.group, -1)


def _stats_dtype(t: torch.Tensor) -> torch.dtype:
    """Softmax and norm statistics in float32 at least (bf16 would lose the log-sum-exp)."""
    return torch.promote_types(t.dtype, torch.float32)


def _attention_forward(q, k, v, slices: _Slices):
    B, S, H, dh = q.shape
    stats = _stats_dtype(q)
    out = q.new_empty(B, S, H, dh)
    lse = torch.empty(B, S, H, 1, dtype=stats, device=q.device)
    for j in slices.groups:
        qkv = slices.table([q, k, v], j)
        # Rounds merged as they come, with a running maximum: no round waits for the others.
        rows = B * S * slices.group
        merged = torch.zeros(rows, dh, dtype=stats, device=q.device)
        total = torch.zeros(rows, dtype=stats, device=q.device)
        top = torch.full((rows,), -math.inf, dtype=stats, device=q.device)
        for c in range(slices.shape[1]):  # the rounds
            round_out, round_lse = _slice_forward(slices.gather(qkv, c, j), slices, stats)
            round_out = slices.to_hit_order(round_out.view(-1, dh), c, j)
            round_lse = slices.to_hit_order(round_lse.view(-1), c, j)
            new_top = torch.maximum(top, round_lse)
            keep = top.sub_(new_top).exp_()  # the earlier rounds' rescaling (0 at the first)
            weight = round_lse.sub_(new_top).exp_()
            merged.mul_(keep.unsqueeze(-1)).add_(weight.unsqueeze(-1) * round_out)
            total.mul_(keep).add_(weight)
            top = new_top
            del round_out, round_lse, keep, weight
        del qkv
        slices.put_heads(out, j, merged.div_(total.unsqueeze(-1)))
        slices.put_heads(lse, j, total.log_().add_(top).unsqueeze(-1))
    return out, lse.squeeze(-1)


def _slice_forward(qkv: torch.Tensor, slices: _Slices, stats: torch.dtype):
    qs, ks, vs = qkv.unflatten(-1, (3, -1)).unbind(dim=2)
    n, bs, dh = vs.shape
    out = vs.new_empty(n, bs, dh)
    lse = torch.empty(n, bs, 1, dtype=stats, device=vs.device)
    for r in slices.bucket_chunks(n):
        scores = slices.scores(qs[r], ks[r], r).to(stats)
        top = scores.amax(dim=-1, keepdim=True)
        scores.sub_(top).exp_()
        total = scores.sum(dim=-1, keepdim=True)
        out[r] = torch.bmm(scores.to(vs.dtype), vs[r]).div_(total.to(vs.dtype))
        lse[r] = total.log_().add_(top)
        del scores, top, total
    return out, lse


def _attention_backward(d_out, q, k, v, out, lse, slices: _Slices):
    B, S, H, dh = q.shape
    stats = _stats_dtype(q)
    bs = slices.shape[-1]
    d_out = d_out.to(q.dtype)
    delta = (d_out.to(stats) * out.to(stats)).sum(dim=-1, keepdim=True)  # rowsum(dO * O)
    lse = lse.to(stats).unsqueeze(-1)
    d_q, d_k, d_v = (torch.empty_like(q) for _ in range(3))
    for j in slices.groups:
        tensors = slices.table([q, k, v, d_out], j)
        statistics = slices.table([lse, delta], j)
        grads = q.new_zeros(B * S * slices.group + 1, 3 * dh)
        for c in range(slices.shape[1]):  # the rounds
            index = slices.sort_index[c, j]
            for r in slices.bucket_chunks(index.numel() // bs):
                rows = index[r.start * bs : r.stop * bs]
                chunk = _bucket_backward(
                    tensors.index_select(0, rows).view(-1, bs, 4 * dh),
                    statistics.index_select(0, rows).view(-1, bs, 2),
                    slices.key_bias[r],
                )
                grads.index_add_(0, rows, chunk.view(-1, 3 * dh))
                del chunk
        del tensors, statistics
        for target, part in zip((d_q, d_k, d_v), grads[:-1].split(dh, dim=-1), strict=True):
            slices.put_heads(target, j, part)
    return d_q, d_k, d_v


def _bucket_backward(tensors: torch.Tensor, statistics: torch.Tensor, key_bias: torch.Tensor):
    qs, ks, vs, dos = tensors.unflatten(-1, (4, -1)).unbind(dim=2)
    ls, ds = statistics.unbind(dim=-1)
    scores = torch.baddbmm(key_bias.to(qs.dtype), qs, ks.transpose(1, 2))
    probs = scores.to(ls.dtype).sub_(ls.unsqueeze(-1)).exp_()
    d_v = torch.bmm(probs.to(qs.dtype).transpose(1, 2), dos)
    d_scores = torch.bmm(dos, vs.transpose(1, 2)).to(ls.dtype)
    d_scores = d_scores.sub_(ds.unsqueeze(-1)).mul_(probs).to(qs.dtype)
    del probs
    d_q = torch.bmm(d_scores, ks)
    d_k = torch.bmm(d_scores.transpose(1, 2), qs)
    return torch.cat([d_q, d_k, d_v], dim=-1)
