"""Peak memory of one training step without the hardware: the real model, loss, backward and
LAMB run on *fake* tensors (``torch._subclasses.fake_tensor.FakeTensorMode``: shapes, dtypes and
devices, no data) while the storage tracker of :mod:`heptstudy.measure.memory` counts the bytes
of every tensor storage they would allocate.

What differs from a real step, and why:

* Device. Fake ``cuda`` tensors when this PyTorch is built with CUDA (no GPU needed); on a
  CPU-only build fake ``cpu`` tensors (fake CUDA tensors abort there on device guards), with CPU
  autocast (bf16 autocast casts the same matmul/linear family on both). The result says which.
* Attention. The platform's ``attention_backend``. ``fused`` runs the real block-mask
  construction and stands in for the flex_attention kernel with a function of the same memory
  footprint (output and log-sum-exp out, q/k/v/out/lse saved, q/k/v gradients back): the fused
  kernel keeps no score matrix, and CPU flex_attention has no backward. ``plain`` runs the real
  plain path.
* Hungarian matching copies the cost matrices to the host, which fake tensors cannot do. Targets
  are built from the real batch before it is faked (same particles, same shapes); the matching is
  replaced by a deterministic assignment (query i <-> target i for i < min(queries, particles)),
  which matches as many pairs as the real assignment, so every loss tensor has its real shape.
  The cost matrices themselves (small, no-grad temporaries) are not built.
* Kernel-internal scratch buffers and the allocator's rounding/caching are not seen (as with the
  CPU tracker): compare with peak *allocated*, not reserved.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from heptstudy import stand_ins
from heptstudy.config import Config
from heptstudy.errors import HeptstudyError
from heptstudy.stand_ins import StandIns
from heptstudy.units import MIB


@dataclass
class FakeStepEstimate:
    batch_size: int
    longest_padded: int
    padded_batch_hits: int
    peak_allocated_bytes: int
    baseline_bytes: int
    device: str
    dtype: str
    attention_backend: str
    categories_at_peak: dict[str, int] | None = None

    @property
    def peak_allocated_mib(self) -> float:
        return self.peak_allocated_bytes / MIB

    def to_dict(self) -> dict:
        return {**asdict(self), "peak_allocated_mib": self.peak_allocated_mib}


def fake_device_type() -> str:
    """``cuda`` when this PyTorch build has CUDA (a GPU is not needed), else ``cpu``."""
    return "cuda" if torch.backends.cuda.is_built() else "cpu"


class _SameFootprintFlex(torch.autograd.Function):
    """Memory stand-in for the fused flex_attention kernel: out [.., S, dh] and lse [.., S]
    (float32) out, q/k/v/out/lse saved for backward, dq/dk/dv back."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _fake_flex(q, k, v, block_mask):
    return _SameFootprintFlex.apply(q, k, v)


def _deterministic_match(outputs, targets, loss_cfg, prefix=""):
    cl = outputs[prefix + "class_logits"]
    q = cl.shape[1]
    out = []
    for t in targets:
        n = min(q, t.num_particles)
        idx = torch.arange(n, device=cl.device)
        out.append((idx, idx.clone()))
    return out


def _type_encoder_forward(counts):
    """``TypeEncoder.forward`` with the per-type hit counts of the real batch: the same tensors
    (selected rows, their encodings, the scattered output) without a data-dependent shape."""

    def forward(self, raw, inputs):
        out = inputs.new_zeros(*inputs.shape[:-1], self.out_dim)
        flat = out.view(-1, self.out_dim)
        for code, enc in ((1, self.type1), (2, self.type2)):
            n = counts.get(code, 0)
            idx = torch.zeros(n, dtype=torch.long, device=inputs.device)
            rows = inputs.reshape(-1, inputs.shape[-1]).index_select(0, idx)
            flat = flat.index_put((idx,), enc(rows).to(out.dtype))
        return flat.view_as(out)

    return forward


def _fake_substitutions(targets, type_counts):
    """The stand-ins of a fake-tensor step (:mod:`heptstudy.stand_ins`): the real batch's
    targets and a deterministic matching (hit model only), the per-type encoding with the real
    batch's counts, and the same-footprint flex_attention."""
    return stand_ins.using(
        StandIns(
            targets=targets,
            match=_deterministic_match if targets is not None else None,
            type_encoding=_type_encoder_forward(type_counts),
            flex=_fake_flex,
        )
    )


def _fake_targets(targets, mode, device):
    from heptstudy.train.losses import EventTargets

    def conv(t):
        return mode.from_tensor(t).to(device) if device != "cpu" else mode.from_tensor(t)

    return [
        EventTargets(
            **{
                f: conv(getattr(t, f))
                for f in ("cls", "momentum", "membership", "valid", "particle_number")
            }
        )
        for t in targets
    ]


def estimate_step(
    config: Config,
    batch: dict[str, torch.Tensor],
    device_type: str | None = None,
    track_categories: bool = False,
    plan=None,
) -> FakeStepEstimate:
    """Peak allocated bytes of one training step (forward, loss, backward; the optimizer state
    of an earlier step alive, as in the bench's counted steps) of ``config`` on ``batch`` (a real
    CPU batch, e.g. from :func:`heptstudy.data.load_events`), on a fake device; ``plan``: the
    checkpoint plan of a step of a model built with ``auto``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from heptstudy.measure.memory import TrackedMemoryMeter
    from heptstudy.model import build_model
    from heptstudy.train.losses import targets_from_batch
    from heptstudy.train.optim import build_optimizer, build_scheduler
    from heptstudy.train.precision import autocast_dtype
    from heptstudy.train.step import prime_optimizer, run_step

    device_type = device_type or fake_device_type()
    device = torch.device(device_type)
    dtype = autocast_dtype(config, device)
    real_targets = targets_from_batch(batch) if "ytarget" in batch and _is_hits(config) else None
    torch.manual_seed(config.train.seed)
    with torch.device("meta"):
        model = build_model(config)
    mode = FakeTensorMode(allow_non_fake_inputs=True)

    codes = batch["X"][..., 0]
    type_counts = {c: int((codes == c).sum()) for c in (1, 2)}
    fake_targets = (
        _fake_targets(real_targets, mode, device_type) if real_targets is not None else None
    )
    subs = _fake_substitutions(fake_targets, type_counts)
    try:
        with mode, subs:
            model.to_empty(device=device)
            model.train()
            fbatch = {k: mode.from_tensor(v).to(device) for k, v in batch.items()}
            optimizer = build_optimizer(model, config.train)
            scheduler = build_scheduler(optimizer, config.train)
            # LAMB's state exists before every counted bench step
            prime_optimizer(model, optimizer, scheduler)
            meter = TrackedMemoryMeter(device, track_categories=track_categories)
            # the bench's step (heptstudy.train.step), the meter over forward, loss, backward
            mem = run_step(
                model, fbatch, optimizer, scheduler, config, dtype, meter=meter, plan=plan
            ).memory
    except (RuntimeError, NotImplementedError) as err:
        raise HeptstudyError(
            f"the fake-device step failed on {device_type} ({type(err).__name__}: {str(err).splitlines()[0]}); "
            "the model or loss uses an operation fake tensors cannot run (a host copy or a "
            "data-dependent shape): measure on the device instead (heptstudy bench)"
        ) from err
    B, L = batch["X"].shape[:2]
    return FakeStepEstimate(
        batch_size=int(B),
        longest_padded=int(L),
        padded_batch_hits=int(B * L),
        peak_allocated_bytes=int(mem.peak_allocated_bytes),
        baseline_bytes=int(mem.baseline_bytes or 0),
        device=f"fake {device_type}",
        dtype=config.train.dtype,
        attention_backend=config.model.heptv2.attention_backend,
        categories_at_peak=mem.categories_at_peak,
    )


def _is_hits(config: Config) -> bool:
    from heptstudy.config import HIT_VARIANT

    return config.model.variant == HIT_VARIANT


def estimation_batches(lengths, per_device_batch: int, seed: int = 0) -> list[list[int]]:
    """Events of the batches the estimated model is fitted on: at B/4, B/2 and B events, a
    random batch and the B longest events (so the fit spans batch sizes and the whole range of
    longest padded events)."""
    lengths = np.asarray(lengths)
    rng = np.random.default_rng(seed)
    order = np.argsort(-lengths, kind="stable")
    out = []
    for b in sorted(
        {max(1, per_device_batch // 4), max(1, per_device_batch // 2), per_device_batch}
    ):
        b = min(b, len(lengths))
        out.append(sorted(rng.choice(len(lengths), size=b, replace=False).tolist()))
        out.append(sorted(order[:b].tolist()))
    return out


def estimate_memory_model(
    config: Config, per_device_batch: int, device_kind: str, progress: bool = False
):
    """An *estimated* memory model of ``config`` for a platform of ``device_kind``: fake-device
    steps on real events of the configured data set (see :func:`estimation_batches`), fitted
    like measurements. Its ``source_detail`` says so."""
    from heptstudy.data import load_events
    from heptstudy.data.batching import dataset_for
    from heptstudy.measure.estimate.keys import model_key
    from heptstudy.measure.estimate.memory_model import Point, fit_points

    ds = dataset_for(config, "train")
    lengths = ds.lengths()
    points = []
    dev = fake_device_type()
    for idx in estimation_batches(lengths, per_device_batch, seed=config.train.seed):
        est = estimate_step(config, load_events(config, idx, "train"), dev)
        points.append(
            Point(est.batch_size, est.longest_padded, est.peak_allocated_mib, f"fake {dev} step")
        )
        if progress:
            print(
                f"  estimated B={est.batch_size} L={est.longest_padded}: {est.peak_allocated_mib / 1024:.2f} GiB"
            )
    key = model_key(config.to_dict(), device_kind)
    mm = fit_points(
        key,
        points,
        source="estimated",
        source_detail=(
            f"fake-{dev} steps (FakeTensorMode + storage tracker, {config.train.dtype}, attention "
            f"{config.model.heptv2.attention_backend}) on {len(points)} batches of {ds.name} "
            f"(synthetic={bool(ds.metadata.get('synthetic', False))}); peak allocated only, no allocator overhead"
        ),
    )
    mm.notes.append(FAKE_NOTE + (f" Fake device: {dev}." if dev == "cuda" else CPU_BUILD_NOTE))
    return mm


FAKE_NOTE = (
    "Estimated without the hardware: one training step of the real model on fake tensors; the "
    "Hungarian assignment is replaced by a deterministic one with the same number of pairs, the "
    "fused attention kernel by a same-footprint stand-in; kernel scratch and allocator caching "
    "are not included (use the safety margin)."
)
CPU_BUILD_NOTE = (
    " This PyTorch has no CUDA: fake CPU tensors with CPU autocast stood in for the fake CUDA "
    "device (same tensor shapes and dtypes for the model's matmul/linear path)."
)

__all__ = [
    "FakeStepEstimate",
    "estimate_memory_model",
    "estimate_step",
    "estimation_batches",
    "fake_device_type",
]
