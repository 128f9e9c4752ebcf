"""Input encoding shared by both variants: a fixed, scale-free transform of the raw features
and one small MLP per element type (tracker hits / tracks vs calorimeter hits / clusters)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from heptstudy import stand_ins
from heptstudy.data.schema import COS_PHI, ETA, SIN_PHI


def normalise_features(x: torch.Tensor) -> torch.Tensor:
    """Signed log1p of every raw feature except eta and (sin phi, cos phi), rescaled to unit
    length (real hit data carry a common factor on both)."""
    out = torch.sign(x) * torch.log1p(x.abs())
    norm = torch.sqrt(x[..., SIN_PHI] ** 2 + x[..., COS_PHI] ** 2).clamp(min=1e-12)
    return torch.cat(
        [
            out[..., :ETA],
            x[..., ETA : ETA + 1],
            (x[..., SIN_PHI] / norm).unsqueeze(-1),
            (x[..., COS_PHI] / norm).unsqueeze(-1),
            out[..., COS_PHI + 1 :],
        ],
        dim=-1,
    )


class LeanMLP(nn.Sequential):
    """``Linear -> GELU -> LayerNorm -> Linear`` keeping only its input for backward (op by op
    would keep 6 KiB per hit); same state-dict keys as the plain ``nn.Sequential``."""

    def __init__(self, inp: int, hidden: int, out: int):
        super().__init__(
            nn.Linear(inp, hidden), nn.GELU(), nn.LayerNorm(hidden), nn.Linear(hidden, out)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, _, norm, last = self
        params = (first.weight, first.bias, norm.weight, norm.bias, last.weight, last.bias)
        return _LeanMLPFunction.apply(x, norm.eps, *params)


def _hidden(x, eps, w1, b1, norm_w, norm_b):
    h = F.gelu(F.linear(x, w1, b1))
    return F.layer_norm(h, (h.shape[-1],), norm_w, norm_b, eps)


class _LeanMLPFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, eps, w1, b1, norm_w, norm_b, w2, b2):
        device_type = x.device.type
        ctx.autocast = torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
        ctx.eps = eps
        ctx.save_for_backward(x, w1, b1, norm_w, norm_b, w2, b2)
        return F.linear(_hidden(x, eps, w1, b1, norm_w, norm_b), w2, b2)

    @staticmethod
    def backward(ctx, d_out):
        x, w1, b1, norm_w, norm_b, w2, b2 = ctx.saved_tensors
        enabled, dtype = ctx.autocast
        needs = [ctx.needs_input_grad[i] for i in (0, 2, 3, 4, 5)]
        first = [
            t.detach().requires_grad_(need)
            for t, need in zip((x, w1, b1, norm_w, norm_b), needs, strict=True)
        ]
        with torch.enable_grad(), torch.autocast(x.device.type, dtype=dtype, enabled=enabled):
            hidden = _hidden(first[0], ctx.eps, *first[1:])
        dt = d_out.dtype
        d_rows = d_out.reshape(-1, d_out.shape[-1])
        h_rows = hidden.detach().reshape(-1, hidden.shape[-1]).to(dt)
        d_hidden = torch.mm(d_rows, w2.to(dt)).view_as(hidden).to(hidden.dtype)
        d_w2 = torch.mm(d_rows.t(), h_rows).to(w2.dtype) if ctx.needs_input_grad[6] else None
        d_b2 = d_rows.sum(0).to(b2.dtype) if ctx.needs_input_grad[7] else None
        wanted = [t for t in first if t.requires_grad]
        grads = iter(torch.autograd.grad(hidden, wanted, d_hidden) if wanted else ())
        d_first = [next(grads) if t.requires_grad else None for t in first]
        return d_first[0], None, *d_first[1:], d_w2, d_b2


class TypeEncoder(nn.Module):
    """Separate MLPs for element types 1 and 2; anything else (padding) encodes to zero."""

    def __init__(self, in_dim: int, width: int, out_dim: int):
        super().__init__()
        self.type1 = LeanMLP(in_dim, width, out_dim)
        self.type2 = LeanMLP(in_dim, width, out_dim)
        self.out_dim = out_dim

    def forward(self, raw: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        stand = stand_ins.active()  # a fake-tensor step cannot take data-dependent shapes
        if stand is not None and stand.type_encoding is not None:
            return stand.type_encoding(self, raw, inputs)
        elemtype = raw[..., 0]
        out = inputs.new_zeros(*inputs.shape[:-1], self.out_dim)
        for code, enc in ((1, self.type1), (2, self.type2)):
            sel = elemtype == code
            out = out.index_put((sel,), enc(inputs[sel]).to(out.dtype))
        return out
