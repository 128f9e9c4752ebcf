"""The training loop: set up, (resume), then the measured steps with validation and checkpoints.
:func:`train` reads top to bottom; each named step of it follows in the order it runs."""

from __future__ import annotations

import contextlib
import json
import math
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from heptstudy.atomic import WriteFailed, atomic_open, atomic_write_text, free_space_problem
from heptstudy.config import Config
from heptstudy.data.batching import BatchLoader, validation_batches
from heptstudy.data.prefetch import PrefetchingLoader
from heptstudy.errors import HeptstudyError, Interrupted, os_error_advice
from heptstudy.locks import holding
from heptstudy.model.adaptive_checkpointing import PlanPredictor
from heptstudy.model.checkpoint_plan import plan_of
from heptstudy.paths import resolve_from_cwd
from heptstudy.train import distributed
from heptstudy.train.distributed import DistContext
from heptstudy.train.model_size import check_model_fits
from heptstudy.train.out_dir import (
    choose_out_dir,
    config_file_name,
    drop_records_after,
    latest_checkpoint,
    recheck_held,
    step_of,
)
from heptstudy.train.plan_table import check_table_on
from heptstudy.train.precision import autocast_dtype
from heptstudy.train.state import (
    load_training_state,
    restore_training_state,
    rng_state,
    save_training_state,
)
from heptstudy.train.step import fresh_state, run_step
from heptstudy.train.validate import validate
from heptstudy.units import MIB


class NonFiniteLoss(HeptstudyError):
    pass


class OutOfMemory(HeptstudyError):
    pass


def describe(batches) -> str:
    return "; ".join(
        f"events {b['event_index'].tolist()}, hits {b['length'].tolist()}, "
        f"padded to {list(b['X'].shape[:2])} (batch x hits)"
        for b in batches
    )


def _write_json_line(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(record) + "\n")


@dataclass
class _Run:
    """What the loop's steps share: the settings, the trained objects and where they go."""

    config: Config
    ctx: DistContext
    out: Path
    dtype: torch.dtype | None
    model: torch.nn.Module
    net: torch.nn.Module  # the model, wrapped for gradient averaging under torchrun
    optimizer: torch.optim.Optimizer
    scheduler: Any
    loader: BatchLoader
    valid: list
    plans: PlanPredictor | None
    start: int  # the step resumed from; 0 for a new run
    resume: str | Path | None
    resume_step: int | None

    @property
    def metrics_path(self) -> Path:
        return self.out / "metrics.jsonl"

    def step_file(self, folder: str, step: int) -> Path:
        suffix = ".pt" if folder == "checkpoints" else ".npz"
        return self.out / folder / f"step_{step:06d}{suffix}"


def train(
    config: Config,
    resume: str | Path | None = None,
    progress: bool = True,
    new_run: bool = False,
    plan_predictor: Callable[[Config, torch.device, int], PlanPredictor | None] | None = None,
) -> dict[str, Any]:
    """Train as configured; returns a summary. ``plan_predictor`` chooses the plan per batch
    under ``auto`` (passed in: the estimate sits above training)."""
    _refuse_auto_without_predictor(config, plan_predictor)
    ctx = distributed.setup()
    if config.train.deterministic:
        torch.use_deterministic_algorithms(True)
    per_device = _per_device_batch(config, ctx)
    dtype = autocast_dtype(config, ctx.device)
    # refuse a damaged or unsuitable training state, or an occupied out_dir, before writing
    state = load_training_state(resume, config, ctx.world_size) if resume else None
    resume_step = _resume_step(state, resume, config)
    out = _claim_out_dir(config, ctx, resume, resume_step, new_run)
    with holding(out, "train.out_dir") if ctx.is_main else contextlib.nullcontext():
        if ctx.is_main:
            recheck_held(out, resume_step)
        run = _set_up(config, ctx, out, dtype, state, resume, per_device, plan_predictor, progress)
        last = _loop(run, progress)
        distributed.teardown()
        return {
            "step": config.train.num_steps,
            "last": last,
            "out_dir": str(out),
            "rank": ctx.rank,
            "world_size": ctx.world_size,
        }


def _refuse_auto_without_predictor(config: Config, plan_predictor) -> None:
    if config.model.heptv2.adaptive and plan_predictor is None:
        raise HeptstudyError(
            "model.heptv2.activation_checkpointing=auto needs a plan predictor, and train() was "
            "given none: pass plan_predictor=heptstudy.estimate.plans.predictor_for "
            "(heptstudy train does), or choose a fixed checkpointing value"
        )


def _per_device_batch(config: Config, ctx: DistContext) -> int:
    tc = config.train
    devices = ctx.world_size * tc.grad_accumulation
    if tc.global_batch_size % devices:
        raise HeptstudyError(
            f"train.global_batch_size={tc.global_batch_size} does not divide over {ctx.world_size} "
            f"processes x {tc.grad_accumulation} accumulation steps; choose a multiple of {devices}"
        )
    return tc.global_batch_size // devices


def _resume_step(state: dict[str, Any] | None, resume, config: Config) -> int | None:
    """The step a resume continues from (None for a new run); a finished run is refused."""
    if state is None:
        return None
    step, num_steps = int(state["step"]), config.train.num_steps
    if step >= num_steps:
        raise HeptstudyError(
            f"--resume {str(resume)!r} is at step {step}, and train.num_steps="
            f"{num_steps}: the run is finished, there is nothing to train, so nothing was "
            "run or written. A resume keeps the run's schedule: to train longer, start a new run "
            "(--new-run) with a larger train.num_steps"
        )
    return step


def _claim_out_dir(config: Config, ctx: DistContext, resume, resume_step, new_run) -> Path:
    """The run's folder, chosen by rank 0 for all; refused when the model cannot fit or its
    first training-state file has no room there."""
    check_table_on(config, [plan_of(config)], ctx.device.type)  # before any folder is made
    out = distributed.decided_on_main(
        lambda: choose_out_dir(
            resolve_from_cwd(config.train.out_dir),
            new_run=new_run,
            resume=resume,
            resume_step=resume_step or 0,
        ),
        ctx,
    )
    model_bytes = check_model_fits(config, ctx.device)
    # a training-state file holds the weights and LAMB's two moments: the first one must fit
    if ctx.is_main and (problem := free_space_problem(out, 3 * model_bytes)) is not None:
        raise HeptstudyError(
            f"train.out_dir={str(out)!r}: no room for a training-state file ({problem}); "
            "nothing was run. Free space or choose another train.out_dir"
        )
    return out


def _set_up(config, ctx, out, dtype, state, resume, per_device, plan_predictor, progress) -> _Run:
    """Model, optimizer, schedule and batches, from ``state`` when resuming."""
    model, optimizer, scheduler = fresh_state(config, ctx.device)  # as the bench's
    loader = BatchLoader(
        config, "train", rank=ctx.rank, world_size=ctx.world_size, per_device_batch=per_device
    )
    start = 0
    if state is not None:
        start = restore_training_state(
            state,
            resume,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            loader=loader,
            rank=ctx.rank,
        )
    net = model
    if ctx.distributed:
        net = DistributedDataParallel(
            model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None
        )
    return _Run(
        config=config,
        ctx=ctx,
        out=out,
        dtype=dtype,
        model=model,
        net=net,
        optimizer=optimizer,
        scheduler=scheduler,
        loader=loader,
        valid=validation_batches(config, per_device) if ctx.is_main else [],
        # activation_checkpointing=auto: one memory model per plan, before the first step
        # (the main process shows the calibration's progress: fake steps take seconds each)
        plans=(
            plan_predictor(config, ctx.device, per_device, progress=progress and ctx.is_main)
            if config.model.heptv2.adaptive
            else None
        ),
        start=start,
        resume=resume,
        resume_step=None if state is None else start,
    )


def _loop(run: _Run, progress: bool) -> dict[str, Any]:
    """The steps from the one after ``run.start``; returns the last step's records."""
    config = run.config
    if run.plans is not None and run.ctx.is_main and progress:
        print(run.plans.describe())
    last: dict[str, Any] = {}
    bar = tqdm(
        total=config.train.num_steps,
        initial=run.start,
        disable=not (progress and run.ctx.is_main),
        desc="train",
        unit="step",
    )
    run.net.train()
    step = run.start
    with (
        PrefetchingLoader(run.loader, config.data.prefetch_batches) as batches,
        # inside the loader, so that the line is said before the loader's thread is joined
        _interrupt_said(run.out, lambda: step, bar, run.ctx),
    ):
        for step in range(run.start + 1, config.train.num_steps + 1):
            last = _train_step(run, batches, step, bar)
            last = _validate_and_save(run, batches, step, last)
    bar.close()
    return last


def _train_step(run: _Run, batches, step: int, bar) -> dict[str, Any]:
    """One optimizer step and its record (rank 0 writes it; the run is opened on the first)."""
    ctx = run.ctx
    t0 = time.perf_counter()
    losses, events, adaptive = _step(
        run.net, batches, run.optimizer, run.scheduler, run.config, run.dtype, ctx, step, run.plans
    )
    elapsed = time.perf_counter() - t0
    record = {
        "kind": "train",
        "step": step,
        "lr": run.scheduler.get_last_lr()[0],
        "time_s": elapsed,
        "event_index_by_rank": events,
        **adaptive,
        **{f"loss_{k}": distributed.all_mean(v, ctx) for k, v in losses.items()},
    }
    if ctx.is_main:
        if step == run.start + 1:
            _open_run(run)
        _write_json_line(run.metrics_path, record)
        bar.set_postfix(loss=f"{record['loss_total']:.4g}", step_s=f"{elapsed:.2f}")
    bar.update(1)
    return record


def _open_run(run: _Run) -> None:
    """The run's folders and configuration; only once a step has succeeded, so a run failing at
    once leaves nothing blocking a retry."""
    for folder in ("checkpoints", "predictions"):
        (run.out / folder).mkdir(parents=True, exist_ok=True)
    run_config = run.config.model_copy(deep=True)
    run_config.train.out_dir = str(run.out)
    text = run_config.to_yaml()
    atomic_write_text(config_file_name(run.out, text, run.resume_step), text)
    if run.resume_step is not None:
        # records of the steps after the checkpoint, left by an attempt that was stopped
        drop_records_after(run.out, run.resume_step)
        _write_json_line(
            run.metrics_path, {"kind": "resume", "step": run.start, "from": str(Path(run.resume))}
        )


def _validate_and_save(run: _Run, batches, step: int, last: dict[str, Any]) -> dict[str, Any]:
    """Validation and a training-state file when due; ``last`` with the validation's records."""
    tc = run.config.train
    try:
        if step % tc.val_freq == 0 or step == tc.num_steps:
            last = _validation(run, step, last)
        if step % tc.checkpoint_freq == 0 or step == tc.num_steps:
            _checkpoint(run, batches, step)
    except OSError as exc:
        raise _write_failed(exc, run, step) from None
    return last


def _validation(run: _Run, step: int, last: dict[str, Any]):
    """Rank 0 validates and writes the predictions; the other ranks wait for it."""
    if run.ctx.is_main:
        metrics, predictions = validate(run.model, run.valid, run.config, run.ctx.device, run.dtype)
        _write_json_line(run.metrics_path, {"kind": "validation", "step": step, **metrics})
        with atomic_open(run.step_file("predictions", step), "wb") as fh:
            np.savez_compressed(fh, **predictions)
        last = {**last, **{f"val_{k}": v for k, v in metrics.items()}}
    distributed.barrier(run.ctx)
    return last


def _checkpoint(run: _Run, batches, step: int) -> None:
    """Rank 0 writes the training state, with every rank's random generators."""
    rng_by_rank = distributed.gather_on_main(rng_state(), run.ctx)
    if run.ctx.is_main:
        save_training_state(
            run.step_file("checkpoints", step),
            model=run.model,
            optimizer=run.optimizer,
            scheduler=run.scheduler,
            loader=batches,
            step=step,
            config=run.config,
            rng_by_rank=rng_by_rank,
        )
    distributed.barrier(run.ctx)


def _unblock_resume(out: Path, step: int) -> Path | None:
    """Remove ``step``'s predictions unless its checkpoint was written (they would block the
    resume as a later step's file); returns the latest checkpoint."""
    if not (out / "checkpoints" / f"step_{step:06d}.pt").exists():
        (out / "predictions" / f"step_{step:06d}.npz").unlink(missing_ok=True)
    return latest_checkpoint(out / "checkpoints")


@contextlib.contextmanager
def _interrupt_said(out: Path, step: Callable[[], int], bar: Any, ctx: distributed.DistContext):
    """Ctrl-C during training: one line with the checkpoint kept and the command that goes on;
    the records of the steps after it are removed (by the main rank, which writes them)."""
    try:
        yield
    except KeyboardInterrupt:
        if ctx.distributed:
            _outlive_torchrun_s_sigterm()
        with _ctrl_c_ignored():
            bar.close()  # the line below starts a line of its own
            now = step()
            latest = _unblock_resume(out, now)
            if ctx.is_main:
                drop_records_after(out, step_of(latest) if latest is not None else 0)
        kept = (
            f"the checkpoint {latest} and the steps up to it are kept; later steps were not. Go "
            f"on with the same command and --resume {latest}"
            if latest is not None
            else "no checkpoint was written yet, so nothing can be resumed. Start again with "
            "the same command and --new-run (a new numbered run folder beside this one)"
        )
        raise Interrupted(f"training stopped during step {now} in {out}: {kept}") from None


def _outlive_torchrun_s_sigterm() -> None:
    """The first rank to end makes torchrun SIGTERM the others, which would end them before
    they say what was kept: an interrupted process is ending anyway (and torchrun kills one
    that lingers), so from here on SIGTERM is ignored."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


@contextlib.contextmanager
def _ctrl_c_ignored():
    """torchrun passes its own Ctrl-C on to the workers, which have theirs already: the second
    must not cut the clean-up after the first short."""
    main = threading.current_thread() is threading.main_thread()  # the one that sets handlers
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)


def _write_failed(exc: OSError, run: _Run, step: int):
    """A step's files could not be written: remove its predictions too, so a resume is unblocked."""
    predictions = run.step_file("predictions", step)
    # the predictions are written first: when they are there, the checkpoint is what failed
    where = exc.filename or (
        run.step_file("checkpoints", step) if predictions.exists() else predictions
    )
    latest = _unblock_resume(run.out, step)
    again = (
        f"resume with --resume {latest}"
        if latest is not None
        # the folder holds this stopped run: a plain rerun would be refused as an earlier run's
        else "start again with --new-run (a new numbered run folder beside the stopped one)"
    )
    return WriteFailed(
        f"training stopped at step {step}: {where} could not be written "
        f"({exc.strerror or exc}); nothing of step {step} was kept. {os_error_advice(exc)}, "
        f"then {again}"
    )


def _step(net, batches, optimizer, scheduler, config, dtype, ctx, step, plans):
    micro = [next(batches) for _ in range(config.train.grad_accumulation)]
    # chosen on the host: a batch no plan fits stops before the step allocates anything
    choices = [plans.choose_for(b) if plans is not None else None for b in micro]
    chosen = [None if c is None else c.plan for c in choices]
    if plans is not None and ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    try:
        result = run_step(
            net, micro, optimizer, scheduler, config, dtype, plan=chosen, device=ctx.device
        )
    except torch.OutOfMemoryError:
        hint = (
            "lower the per-device batch (activation checkpointing is already on)"
            if config.model.heptv2.activation_checkpointing != "off"
            else "switch on model.heptv2.activation_checkpointing=true or lower the "
            "per-device batch"
        )
        raise OutOfMemory(f"out of device memory on {describe(micro)}; {hint}") from None
    losses = {k: float(v) for k, v in result.losses.items()}
    if not all(math.isfinite(v) for v in losses.values()):
        raise NonFiniteLoss(
            f"non-finite loss at step {step} ({describe(micro)}): components {losses}. The last "
            "good checkpoint is untouched; lower train.lr or inspect these events"
        )
    events = [i for b in micro for i in b["event_index"].tolist()]
    return losses, distributed.gather_lists(events, ctx), _plan_fields(choices, ctx)


def _plan_fields(choices, ctx) -> dict[str, Any]:
    """This rank's plan per batch, the largest predicted peak and, on a GPU, the measured peak."""
    if not choices or choices[0] is None:
        return {}
    fields: dict[str, Any] = {
        "checkpoint_plan": [c.plan.name for c in choices],
        "predicted_peak_mib": max(c.predicted_peak_mib for c in choices),
        "memory_budget_mib": choices[0].budget_mib,
    }
    if ctx.device.type == "cuda":
        fields["peak_allocated_mib"] = torch.cuda.max_memory_allocated(ctx.device) / MIB
    return fields
