"""Bytes per op group (:mod:`heptstudy.model.op_groups`): what keeping each group costs a
checkpointed layer, from one training-mode forward of one layer on fake tensors (no data, no
real allocation). The seconds each group spares backward are measured elsewhere."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from heptstudy.config import Config
from heptstudy.data.batching import map_tensors
from heptstudy.data.layout import layout_of
from heptstudy.meters.memory import iter_tensors
from heptstudy.model import build_model
from heptstudy.model.activation_checkpointing import lean_recompute
from heptstudy.model.checkpoint_plan import checkpoint_slots
from heptstudy.model.heptv2 import hit_coordinates
from heptstudy.model.op_groups import group_of, groups_of, kept_pairs, track_roles
from heptstudy.train.precision import autocast_dtype


class _OutputBytes(TorchDispatchMode):
    """Sums each op's output storages into the group that would keep them."""

    def __init__(self, pairs):
        super().__init__()
        self.pairs = pairs
        self.bytes: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        group = group_of(self.pairs, func)
        if group is not None:
            storages = {id(s): s.nbytes() for s in map(torch.Tensor.untyped_storage, _tensors(out))}
            self.bytes[group] = self.bytes.get(group, 0) + sum(storages.values())
        return out


def _tensors(out):
    return [t for t in iter_tensors(out) if isinstance(t, torch.Tensor)]


def op_group_bytes(config: Config, batch: dict[str, torch.Tensor], kind: str) -> dict[str, int]:
    """For each op group of the first ``kind`` layer ("backbone" or "decoder"), the bytes of the
    outputs an ``ops`` plan keeping it holds from that layer's forward to its backward, for
    ``batch`` (the decoder's first layer: its queries attend to every hit of their event). A
    group whose ops do not run (dropout of p = 0) takes 0 bytes."""
    pairs = kept_pairs(kind, frozenset(g.name for g in groups_of(kind)))
    torch.manual_seed(config.train.seed)
    with torch.device("meta"):
        model = build_model(config)
    layers, i = checkpoint_slots(model)[(kind, 0)]
    layer = getattr(layers[i], "_checkpoint_wrapped_module", layers[i]).train()
    track_roles(layer, kind)
    dtype = autocast_dtype(config, torch.device("cpu"))
    recorder = _OutputBytes(pairs)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        layer.to_empty(device="cpu")
        fake = map_tensors(batch, mode.from_tensor)
        args = _layer_inputs(kind, fake, config)
        # lean, as a checkpointed layer of an ops plan runs: the SwiGLU keeps no hidden products
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None), lean_recompute():
            with recorder:
                layer(*args)
    return {g.name: recorder.bytes.get(g.name, 0) for g in groups_of(kind)}


def _layer_inputs(kind: str, batch, config: Config) -> tuple:
    mask, layout = batch["mask"], layout_of(batch)
    dim = config.model.heptv2.embedding_dim
    hits = torch.empty(*mask.shape, dim, requires_grad=True)
    if kind == "backbone":
        return hits, mask, hit_coordinates(batch["X"]), layout
    queries = torch.empty(layout.num_events, config.model.decoder.num_queries, dim)
    return queries.requires_grad_(), hits, [None] * layout.num_events, layout
