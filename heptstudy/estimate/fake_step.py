"""Peak memory of one training step without the hardware: the real model, loss, backward and
LAMB run on *fake* tensors (``FakeTensorMode``: no data) while the storage tracker of
:mod:`heptstudy.meters.memory` counts every storage they would allocate.

A ``cuda``/``rocm`` target runs on fake *CPU* tensors (a fake CUDA tensor cannot enter CUDA
autocast without a GPU) under the target's autocast lists, kernel stand-ins and scratch. The
Hungarian matching needs a host copy, so it becomes query i <-> target i with as many pairs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from heptstudy import fingerprint as code_fingerprint
from heptstudy import stand_ins
from heptstudy.config import HIT_VARIANT, Config
from heptstudy.data.batching import dataset_for, load_events, map_tensors
from heptstudy.data.layout import geometry_of
from heptstudy.errors import HeptstudyError
from heptstudy.estimate.autocast_policy import UnknownTorchVersion, target_autocast
from heptstudy.estimate.bench_process import simulate_bench_process
from heptstudy.estimate.kernel_scratch import scratch_bytes
from heptstudy.estimate.kernel_stand_ins import fused_flex, target_kernels
from heptstudy.estimate.keys import model_key
from heptstudy.estimate.memory_model import Point, fit_points
from heptstudy.meters.allocation_trace import TracingMemoryMeter
from heptstudy.meters.memory import TrackedMemoryMeter
from heptstudy.model import build_model
from heptstudy.stand_ins import StandIns
from heptstudy.train.losses import EventTargets, targets_from_batch
from heptstudy.train.optim import build_optimizer, build_scheduler
from heptstudy.train.precision import autocast_dtype
from heptstudy.train.step import prime_optimizer, run_step
from heptstudy.units import MIB

TARGETS = ("cuda", "rocm", "cpu")
#: Autocast lists when the platform names no PyTorch version: the H200 measurement's.
DEFAULT_TORCH_VERSION = "2.11"

if TYPE_CHECKING:
    from heptstudy.estimate.autocast_policy import AutocastEmulation
    from heptstudy.estimate.kernel_stand_ins import KernelChoices
    from heptstudy.meters.allocation_trace import StepTrace
    from heptstudy.meters.memory import StepMemory


@dataclass
class FakeStepEstimate:
    batch_size: int
    longest_padded: int
    padded_batch_hits: int
    peak_allocated_bytes: int
    baseline_bytes: int
    #: ``cuda``/``rocm``: the target-faithful step; ``cpu``: the CPU's kernels.
    target: str = "cpu"
    torch_version: str | None = None
    #: op -> calls
    autocast_calls: dict[str, int] | None = None
    stand_in_calls: dict[str, int] | None = None
    scratch_ops: dict[str, int] | None = None
    #: ``record_trace`` only
    trace: StepTrace | None = field(default=None, repr=False, compare=False)

    @property
    def peak_allocated_mib(self) -> float:
        return self.peak_allocated_bytes / MIB


def fake_device_type() -> str:
    return "cuda" if torch.backends.cuda.is_built() else "cpu"


def _deterministic_match(outputs, batch, targets, loss_cfg, prefix=""):
    cl = outputs[prefix + "class_logits"]
    q = cl.shape[1]
    out = []
    for t in targets:
        n = min(q, t.num_particles)
        idx = torch.arange(n, device=cl.device)
        out.append((idx, idx.clone()))
    return out


def _type_encoder_forward(counts):
    """``TypeEncoder.forward`` without a data-dependent shape."""

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


def _skipping_repeats(meter):
    """``repeats`` of :class:`StandIns`: a loop's iterations until one (not the first, which may
    find no cached blocks) leaves the live bytes as it found them, then the last. The skipped ones
    run the same shapes from the same memory, so they repeat its allocations and frees and raise
    no peak; at large batches they were most of a fake step's time."""

    def repeats(items: list) -> Iterator:
        tracker = meter.tracker
        if tracker is None:  # not inside a measured step
            yield from items
            return
        for i, item in enumerate(items):
            before = tracker.live_bytes
            yield item
            if 1 <= i < len(items) - 2 and tracker.live_bytes == before:
                yield items[-1]
                return

    return repeats


def _fake_targets(targets, mode, device):
    def conv(t):
        return mode.from_tensor(t).to(device) if device != "cpu" else mode.from_tensor(t)

    return [
        EventTargets(
            **{f: conv(getattr(t, f)) for f in ("cls", "momentum", "membership", "particle_number")}
        )
        for t in targets
    ]


def estimate_step(
    config: Config,
    batch: dict[str, torch.Tensor],
    device_type: str | None = None,
    *,
    target: str | None = None,
    torch_version: str | None = None,
    record_trace: bool = False,
    plan=None,
    skip_repeats: bool = True,
) -> FakeStepEstimate:
    """Peak allocated bytes of one training step on a fake device, optimizer state alive as in
    the bench's counted steps. ``plan``: one step's plan of a model built with ``auto``;
    ``skip_repeats`` False: every iteration of the sliced loops runs (the same figures, slower)."""
    if target is not None and target not in TARGETS:
        raise HeptstudyError(
            f"unknown estimate target {target!r}; allowed: {', '.join(TARGETS)} (the platform "
            "profile's device)"
        )
    faithful = target in ("cuda", "rocm")
    # a faithful target runs on fake CPU tensors (see the module doc)
    device_type = "cpu" if faithful else device_type or fake_device_type()
    version = torch_version or DEFAULT_TORCH_VERSION
    meter_class = TracingMemoryMeter if record_trace else TrackedMemoryMeter
    meter = meter_class(torch.device(device_type), scratch=scratch_bytes if faithful else None)
    emulating = _target_emulation(version) if faithful else contextlib.nullcontext((None, None))
    with emulating as (emulation, kernels):
        mem = _fake_step_memory(config, batch, device_type, meter, plan, skip_repeats)
    geometry = geometry_of(batch)
    return FakeStepEstimate(
        batch_size=geometry.events,
        longest_padded=geometry.length,
        padded_batch_hits=geometry.slots,
        peak_allocated_bytes=int(mem.peak_allocated_bytes),
        baseline_bytes=int(mem.baseline_bytes or 0),
        target=target or "cpu",
        torch_version=version if faithful else None,
        autocast_calls=dict(sorted(emulation.calls.items())) if faithful else None,
        stand_in_calls=dict(sorted(kernels.calls.items())) if faithful else None,
        scratch_ops=dict(sorted(meter.tracker.scratch_ops.items())),
        trace=meter.last_trace if record_trace else None,
    )


@contextlib.contextmanager
def _target_emulation(version: str) -> Iterator[tuple[AutocastEmulation, KernelChoices]]:
    """CUDA autocast's lists of PyTorch ``version`` and the GPU targets' kernels, on CPU tensors."""
    with contextlib.ExitStack() as stack:
        try:
            emulation = stack.enter_context(target_autocast(version))
        except UnknownTorchVersion as err:
            raise HeptstudyError(str(err)) from None
        yield emulation, stack.enter_context(target_kernels())


def _fake_step_memory(config, batch, device_type, meter, plan, skip_repeats) -> StepMemory:
    """``meter``'s figures of one training step on fake ``device_type`` tensors."""
    device = torch.device(device_type)
    dtype = autocast_dtype(config, device)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    substitutes = _step_stand_ins(config, batch, mode, device_type, meter, skip_repeats)
    torch.manual_seed(config.train.seed)
    with torch.device("meta"):
        model = build_model(config)
    try:
        with mode, stand_ins.using(substitutes):
            model.to_empty(device=device)
            model.train()
            fbatch = map_tensors(batch, lambda t: mode.from_tensor(t).to(device))
            optimizer = build_optimizer(model, config.train)
            scheduler = build_scheduler(optimizer, config.train)
            # LAMB's state exists before every counted bench step
            prime_optimizer(model, optimizer, scheduler)
            return run_step(
                model, fbatch, optimizer, scheduler, config, dtype, meter=meter, plan=plan
            ).memory
    except (RuntimeError, NotImplementedError) as err:
        raise HeptstudyError(
            f"the fake-device step failed on {device_type} ({type(err).__name__}: "
            f"{str(err).splitlines()[0]}); the model or loss uses an operation fake tensors "
            "cannot run (a host copy or a data-dependent shape): measure on the device "
            "instead (heptstudy bench)"
        ) from err


def _step_stand_ins(config, batch, mode, device_type, meter, skip_repeats) -> StandIns:
    """The fake step's substitutes for what fake tensors cannot or need not run."""
    targets = None
    if "ytarget" in batch and config.model.variant == HIT_VARIANT:
        targets = _fake_targets(targets_from_batch(batch), mode, device_type)
    codes = batch["X"][..., 0]
    return StandIns(
        targets=targets,
        match=_deterministic_match if targets is not None else None,
        type_encoding=_type_encoder_forward({c: int((codes == c).sum()) for c in (1, 2)}),
        flex=fused_flex,
        repeats=_skipping_repeats(meter) if skip_repeats else None,
    )


def fit_batches(lengths, sizes, seed: int, random_at=None) -> list[list[int]]:
    """Sorted event indices per fit batch: for each size a random batch (only at ``random_at``'s
    sizes, default all) and the longest events, spanning the range of longest padded events."""
    lengths = np.asarray(lengths)
    rng = np.random.default_rng(seed)
    order = np.argsort(-lengths, kind="stable")
    out = []
    for b in sizes:
        b = min(b, len(lengths))
        if random_at is None or b in random_at:
            out.append(sorted(rng.choice(len(lengths), size=b, replace=False).tolist()))
        out.append(sorted(order[:b].tolist()))
    return out


def estimate_memory_model(
    config: Config,
    per_device_batch: int,
    device_kind: str,
    torch_version: str | None = None,
):
    """An *estimated* memory model: fake-device steps on real events fitted like measurements."""
    ds = dataset_for(config, "train")
    gpu = device_kind in ("cuda", "rocm")
    version = (torch_version or DEFAULT_TORCH_VERSION) if gpu else None
    dev = "cpu" if gpu else fake_device_type()
    sizes = sorted({max(1, per_device_batch // 4), max(1, per_device_batch // 2), per_device_batch})
    target = device_kind if gpu else None
    points, reserved, expandable = [], [], []
    for idx in fit_batches(ds.lengths(), sizes, config.train.seed):
        batch = load_events(config, idx, "train")
        est = estimate_step(
            config, batch, dev, target=target, torch_version=version, record_trace=gpu
        )
        shape, what = (est.batch_size, est.longest_padded), f"fake {dev} step"
        if not gpu:
            points.append(Point(*shape, est.peak_allocated_mib, what))
            continue
        # a bench process whose every step runs this batch (2 warm-up, 3 counted steps)
        sim = simulate_bench_process([est.trace] * 5)
        points.append(Point(*shape, sim.max_allocated() / MIB, f"{what}, simulated allocator"))
        reserved.append(Point(*shape, sim.max_reserved() / MIB, f"{what}, native allocator"))
        expandable.append(
            Point(*shape, sim.max_reserved("expandable") / MIB, f"{what}, expandable segments")
        )
    steps, peaks, notes = _estimate_wording(device_kind, version, dev)
    key = model_key(config.to_dict(), device_kind)
    mm = fit_points(
        key,
        points,
        reserved,
        reserved_expandable=expandable,
        source="estimated",
        source_detail=(
            f"{steps} (FakeTensorMode + storage tracker, {config.train.dtype}, attention "
            f"{config.model.heptv2.attention_backend}) on {len(points)} batches of {ds.name} "
            f"(synthetic={bool(ds.metadata.get('synthetic', False))}); {peaks}"
        ),
        fingerprint=code_fingerprint.make("estimated", key),
    )
    mm.notes.extend(notes)
    return mm


def _estimate_wording(device_kind: str, version: str | None, dev: str):
    """What an estimated model says of its target: how its steps ran, its peaks, its notes."""
    if device_kind in ("cuda", "rocm"):
        return (
            f"target-faithful fake steps for {device_kind} (PyTorch {version}'s autocast lists, "
            "kernel stand-ins and scratch) on fake CPU tensors",
            "peak allocated and reserved from the caching-allocator simulator (native and "
            "expandable segments) replaying each step's allocation trace as a bench process",
            [FAKE_NOTE + TARGET_NOTE.format(target=device_kind, version=version), SIMULATOR_NOTE],
        )
    return (
        f"fake-{dev} steps",
        "peak allocated only, no allocator overhead",
        [FAKE_NOTE + (f" Fake device: {dev}." if dev == "cuda" else CPU_BUILD_NOTE)],
    )


FAKE_NOTE = (
    "Estimated without the hardware: one training step of the real model on fake tensors; the "
    "Hungarian assignment is replaced by a deterministic one with the same number of pairs, the "
    "fused attention kernel by a same-footprint stand-in."
)
TARGET_NOTE = (
    " Target-faithful for {target}: CUDA autocast's lists of PyTorch {version} emulated on fake "
    "CPU tensors, the target's kernel choices (fused rms_norm, native_dropout's mask, "
    "memory-efficient SDPA) and the scratch of composite kernels (logsumexp, "
    "binary_cross_entropy_with_logits); scratch inside native GPU kernels is not included (the "
    "safety margin covers it). Checked against the H200's memory reports "
    "(experiments/h200_2026-11-30): experiments/estimate_validation/."
)
SIMULATOR_NOTE = (
    "Reserved: the step's storage allocations and frees, in order, replayed through a simulator "
    "of PyTorch's CUDA caching allocator for a bench process of that batch (2 warm-up + 3 counted "
    "steps, timed and memory passes, two 32 MiB cuBLAS workspaces assumed); the expandable-"
    "segments figures are predictions no GPU has measured."
)
CPU_BUILD_NOTE = (
    " Fake CPU tensors with the CPU's own autocast and kernels; kernel scratch and allocator "
    "caching are not included."
)
