"""Input encoding shared by both variants: a fixed, scale-free transform of the raw features
and one small MLP per element type (tracker hits / tracks vs calorimeter hits / clusters)."""

from __future__ import annotations

import torch
from torch import nn

from heptstudy import stand_ins

ETA, SIN_PHI, COS_PHI = 2, 3, 4


def normalise_features(x: torch.Tensor) -> torch.Tensor:
    """Signed log1p of every raw feature (energies in GeV and positions in mm span decades)
    except eta, kept as is, and (sin phi, cos phi), rescaled to unit length because real hit
    data carry a common positive factor on both."""
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


def mlp(inp: int, hidden: int, out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(inp, hidden), nn.GELU(), nn.LayerNorm(hidden), nn.Linear(hidden, out)
    )


class TypeEncoder(nn.Module):
    """Encodes elements of type 1 and type 2 (column 0 of the raw features) with separate MLPs;
    anything else (padding) encodes to zero."""

    def __init__(self, in_dim: int, width: int, out_dim: int):
        super().__init__()
        self.type1 = mlp(in_dim, width, out_dim)
        self.type2 = mlp(in_dim, width, out_dim)
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
