"""`heptstudy bench`: one measurement of peak memory and step time (or checkpointing parity) of
the configured model on real events of a data set, written as a self-describing JSON report.

Protocol in :data:`heptstudy.measure.report.PROTOCOL`. In short: the events of each step are the
first batches of the interleaved-shard sampler seeded with ``train.seed``, so the same batch size
gets the same events with checkpointing on and off; every phase starts from a freshly seeded
model. Phase 1 times the steps (no tracker); phase 2 runs the same batches with the memory meter
and then validates on test-split events.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from heptstudy.config import HIT_VARIANT, TRACK_CLUSTER_VARIANT, Config, load_config, load_platform
from heptstudy.errors import ConfigError, HeptstudyError
from heptstudy.measure import report as rp
from heptstudy.measure.memory import make_meter
from heptstudy.measure.parity import build_seeded, run_parity, set_deterministic
from heptstudy.measure.timing import StepTimer
from heptstudy.train.optim import build_optimizer, build_scheduler
from heptstudy.train.trainer import autocast_dtype, forward_and_loss, train_step
from heptstudy.train.validate import validate

DATASET_OF_VARIANT = {HIT_VARIANT: "cld_edm_ttbar_hits", TRACK_CLUSTER_VARIANT: "cld_edm_ttbar_pf"}


@dataclass
class BenchOptions:
    batch_size: int
    checkpointing: bool = False
    steps: int = 5
    warmup: int = 2
    variant: str | None = None
    platform: str | None = None
    data_dir: str | None = None
    dtype: str | None = None
    seed: int | None = None
    overrides: list[str] = field(default_factory=list)
    output: str | None = None
    parity_only: bool = False
    deterministic: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        for name, low in (("batch_size", 1), ("steps", 1), ("warmup", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(
                    f"bench {name}={value!r} is not allowed: give an integer >= {low}"
                )

    @property
    def name(self) -> str:
        """The report name for the default policy (see :func:`report_name`)."""
        if self.parity_only:
            return f"parity{'_deterministic' if self.deterministic else ''}_b{self.batch_size}"
        return f"{'checkpointed' if self.checkpointing else 'baseline'}_b{self.batch_size}"


def report_name(opts: BenchOptions, config: Config) -> str:
    """``baseline_b4``, ``checkpointed_b4`` (full policy, every layer), and for other policies
    ``checkpointed_selective_b4``, ``checkpointed_every2_b4``, ``checkpointed_selective_every3_b4``."""
    h = config.model.heptv2
    if opts.parity_only or not opts.checkpointing:
        return opts.name
    policy = (
        ""
        if h.activation_checkpointing_policy == "full"
        else f"_{h.activation_checkpointing_policy}"
    )
    every = "" if h.checkpoint_every == 1 else f"_every{h.checkpoint_every}"
    return f"checkpointed{policy}{every}_b{opts.batch_size}"


def resolve(opts: BenchOptions) -> tuple[Config, torch.device, str | None]:
    """The configuration, device and platform name of a bench run."""
    base: list[str] = [f"data.nvalid={opts.batch_size}", "data.ntest=0"]
    platform_name = None
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if opts.platform:
        plat = load_platform(opts.platform)
        platform_name = plat.name
        device = torch.device("cpu" if plat.device == "cpu" else "cuda")
        base += [
            f"train.dtype={plat.dtype}",
            f"model.heptv2.attention_backend={plat.attention_backend}",
        ]
    if opts.variant:
        if opts.variant not in DATASET_OF_VARIANT:
            raise ConfigError(
                f"--variant {opts.variant!r} is not one of {sorted(DATASET_OF_VARIANT)}"
            )
        base += [
            f"model.variant={opts.variant}",
            f"data.dataset={DATASET_OF_VARIANT[opts.variant]}:3.2.1",
        ]
    if opts.data_dir:
        base.append(f"data.data_dir={opts.data_dir}")
    if opts.dtype:
        base.append(f"train.dtype={opts.dtype}")
    if opts.seed is not None:
        base.append(f"train.seed={opts.seed}")
    base.append(f"model.heptv2.activation_checkpointing={opts.checkpointing}")
    config = load_config(overrides=base + list(opts.overrides))
    return config, device, platform_name


def event_indices(config: Config, batch_size: int, num_batches: int) -> list[list[int]]:
    """The events of each measured step: the first batches of the seeded training sampler."""
    from heptstudy.data.batching import dataset_for
    from heptstudy.data.sampler import InterleavedShardSampler

    ds = dataset_for(config, "train")
    sampler = InterleavedShardSampler(
        ds.shard_sizes, seed=config.train.seed, mode=config.data.sampler
    )
    flat = sampler.take(batch_size * num_batches)
    return [flat[i * batch_size : (i + 1) * batch_size] for i in range(num_batches)]


def run_bench(opts: BenchOptions) -> rp.BenchReport:
    from heptstudy.data import load_events
    from heptstudy.data.batching import dataset_for

    fresh = rp.claim_fresh_process()
    config, device, platform_name = resolve(opts)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise HeptstudyError(
            f"platform {opts.platform!r} is a GPU profile but this PyTorch sees no GPU "
            f"(torch {torch.__version__}); run it on the target machine or use "
            "configs/training/platforms/local_cpu.yaml"
        )
    dtype = autocast_dtype(config, device)
    if opts.deterministic:
        set_deterministic(device)
    ds = dataset_for(config, "train")
    num = 1 if opts.parity_only else opts.warmup + opts.steps
    indices = event_indices(config, opts.batch_size, num)
    batches = [_to(load_events(config, idx, "train"), device) for idx in indices]
    name = report_name(opts, config)
    common: dict[str, Any] = dict(
        name=name,
        environment=rp.environment_info(
            device, config.train.dtype, platform_name, fresh_process=fresh
        ),
        data=rp.DataInfo(
            dataset=config.data.dataset,
            data_dir=config.data.data_dir,
            synthetic=bool(ds.metadata.get("synthetic", False)),
            split="train",
        ),
        config=config.to_dict(),
        batch_size=opts.batch_size,
        checkpointing=rp.Checkpointing(
            enabled=opts.checkpointing,
            policy=config.model.heptv2.activation_checkpointing_policy
            if opts.checkpointing
            else None,
            checkpoint_every=config.model.heptv2.checkpoint_every if opts.checkpointing else None,
        ),
        notes=[] if not ds.metadata.get("synthetic") else ["data: synthetic (generated) events"],
    )
    if opts.parity_only:
        parity = run_parity(config, batches[0], device, dtype)
        report = rp.BenchReport(
            kind="parity", status="ok", parity=_parity_section(parity), **common
        )
    else:
        report = _memory_report(config, device, dtype, batches, opts, common, name)
    report.environment.load_average_1min = rp.host_load()
    report.environment.attention = rp.attention_info(config)
    if opts.output:
        rp.write_report(report, opts.output)
    return report


def _to(batch, device):
    return {k: v.to(device) for k, v in batch.items()}


def _step_record(i, warmup, batch) -> dict[str, Any]:
    return dict(
        step=i,
        counted=i >= warmup,
        event_indices=batch["event_index"].tolist(),
        hits=batch["length"].tolist(),
        padded_hits=batch["padded_length"].tolist(),
    )


def _memory_report(config, device, dtype, batches, opts, common, name) -> rp.BenchReport:
    records = [_step_record(i, opts.warmup, b) for i, b in enumerate(batches)]
    bar = tqdm(total=2 * len(batches), disable=not opts.progress, desc=name, unit="step")
    step, phase = 0, "timing"
    try:
        # Phase 1: time, without any tracker.
        timer = StepTimer(device, warmup=opts.warmup)
        model, optimizer, scheduler = _fresh(config, device)
        for step, batch in enumerate(batches):
            with timer.step():
                losses = train_step(model, batch, optimizer, scheduler, config, dtype)
            records[step]["time_s"] = timer.records[-1].seconds
            records[step]["loss"] = {k: float(v) for k, v in losses.items()}  # host check, untimed
            bar.update(1)
        del model, optimizer, scheduler
        # Phase 2: memory, over the same batches from the same initial state.
        phase = "memory"
        meter = make_meter(device, track_categories=True)
        model, optimizer, scheduler = _fresh(config, device)
        categories = None
        for step, batch in enumerate(batches):
            meter.start_step(batch.values(), model=model, optimizer=optimizer)
            _, losses = forward_and_loss(model, batch, config, dtype)
            losses["total"].backward()
            mem = meter.stop_step()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            records[step]["peak_allocated_mib"] = mem.peak_allocated_mib
            records[step]["peak_reserved_mib"] = mem.peak_reserved_mib
            if records[step]["counted"] and mem.categories_at_peak is not None:
                if categories is None or mem.peak_allocated_bytes > categories.peak_bytes:
                    categories = rp.MemoryCategories(
                        step=step,
                        peak_bytes=mem.peak_allocated_bytes,
                        at_peak_bytes=mem.categories_at_peak,
                        note=_CATEGORY_NOTE,
                    )
            bar.update(1)
        phase = "validation"
        validation, _ = validate(
            model, _validation(config, opts.batch_size, device), config, device, dtype
        )
    except torch.OutOfMemoryError as err:
        bar.close()
        batch = batches[step]
        return rp.BenchReport(
            kind="memory",
            status="oom",
            steps=[rp.StepRecord(**_complete(r)) for r in records[:step]],
            oom=rp.OomInfo(
                message=str(err).splitlines()[0],
                step=step,
                phase=phase,
                batch_size=opts.batch_size,
                padded_hits=batch["padded_length"].tolist(),
                padded_batch_hits=int(batch["X"].shape[0] * batch["X"].shape[1]),
                device_memory_bytes=_device_memory(device),
            ),
            **common,
        )
    bar.close()
    counted = [r for r in records if r["counted"]]
    times = [r["time_s"] for r in counted]
    mean = sum(times) / len(times)
    summary = rp.Summary(
        counted_steps=len(counted),
        warmup_steps=opts.warmup,
        mean_step_time_s=mean,
        std_step_time_s=math.sqrt(sum((t - mean) ** 2 for t in times) / (len(times) - 1))
        if len(times) > 1
        else 0.0,
        min_step_time_s=min(times),
        max_peak_allocated_mib=_max(r.get("peak_allocated_mib") for r in counted),
        max_peak_reserved_mib=_max(r.get("peak_reserved_mib") for r in counted),
        allocated_definition=mem.allocated_definition,
        reserved_definition=mem.reserved_definition,
        reserved_unavailable_reason=mem.reserved_unavailable_reason,
        tracked_memory_note=(
            "times from untracked steps (phase 1); memory from a second pass over the same batches "
            "from the same initial state with the meter on (phase 2)"
        ),
    )
    return rp.BenchReport(
        kind="memory",
        status="ok",
        steps=[rp.StepRecord(**_complete(r)) for r in records],
        summary=summary,
        validation={k: float(v) for k, v in validation.items() if v is not None},
        memory_categories=[categories] if categories else None,
        **common,
    )


_CATEGORY_NOTE = (
    "live tensor-storage bytes by category at the step's peak (storage tracker): parameters and "
    "buffers, gradients, optimizer state, activations saved for backward, inputs (the batch), "
    "temporaries (the rest)"
)


def _complete(r: dict) -> dict:
    return {"time_s": None, "peak_allocated_mib": None, "peak_reserved_mib": None, "loss": {}, **r}


def _max(values) -> float | None:
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def _device_memory(device) -> int | None:
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None


def _fresh(config, device):
    model = build_seeded(config, device)
    optimizer = build_optimizer(model, config.train)
    scheduler = build_scheduler(optimizer, config.train)
    torch.manual_seed(config.train.seed)  # the same dropout sequence in every phase and mode
    return model, optimizer, scheduler


def _validation(config, batch_size, device):
    from heptstudy.data import validation_batches

    return [_to(b, device) for b in validation_batches(config, batch_size)]


def _parity_section(p: dict) -> rp.Parity:
    def comparison(which: str) -> rp.ComparisonSet:
        outputs = [
            rp.TensorComparison(name=r["name"], equal=r["equal"], max_abs_diff=r["max_abs_diff"])
            for r in p["outputs"][which]
        ]
        total = next(r for r in p["loss"][which] if r["name"] == "total")
        grads = [rp.GradientComparison(**r) for r in p["gradients"][which]]
        return rp.ComparisonSet(
            outputs=outputs,
            loss=rp.TensorComparison(
                name="loss_total", equal=total["equal"], max_abs_diff=total["max_abs_diff"]
            ),
            gradients=grads,
            num_outputs=len(outputs),
            num_gradients=len(grads),
        )

    return rp.Parity(
        checkpointed_vs_baseline=comparison("checkpointed_vs_baseline"),
        repeat_vs_baseline=comparison("repeat_vs_baseline"),
        deterministic=p["deterministic"],
        loss_trajectories=p["loss_trajectories"],
    )


def default_output(opts: BenchOptions, out_dir: str | Path = "experiments/scratch") -> Path:
    config, _, _ = resolve(opts)
    return Path(out_dir) / f"{report_name(opts, config)}.json"
