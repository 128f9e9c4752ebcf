"""Memory models of the adaptive-checkpointing plans
(:mod:`heptstudy.model.adaptive_checkpointing`), estimated on fake tensors and fitted like
measurements at the start of a run."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from itertools import takewhile

import torch
from tqdm.auto import tqdm

from heptstudy.config import Config, PlatformConfig
from heptstudy.data.batching import dataset_for, load_events
from heptstudy.data.layout import BatchGeometry, geometry_of
from heptstudy.errors import ConfigError
from heptstudy.estimate.fake_step import estimate_step, fit_batches
from heptstudy.estimate.keys import model_key
from heptstudy.estimate.memory_model import MemoryModel, Point, fit_points
from heptstudy.model.adaptive_checkpointing import (
    PlanPredictor,
    candidate_plans,
    plan_config,
    plan_order,
)
from heptstudy.model.checkpoint_plan import CheckpointPlan
from heptstudy.train.plan_table import plans_held_on
from heptstudy.units import MIB

#: Default safety margin, as a fraction of the device memory (context, kernels' workspaces):
#: the auto plans' budget here and the fit's margin (:mod:`heptstudy.fitting.api`).
DEFAULT_MARGIN_FRACTION = 0.1


def memory_budget_mib(
    config: Config,
    device: torch.device,
    platform: PlatformConfig | None = None,
    margin_gib: float | None = None,
) -> tuple[float, str]:
    """The budget in MiB and its source: ``model.heptv2.memory_budget_gib``, else the platform's
    or this GPU's memory less ``margin_gib`` (default: the default safety margin)."""
    given = config.model.heptv2.memory_budget_gib
    keep = 1.0 - DEFAULT_MARGIN_FRACTION
    margin = f"less a {DEFAULT_MARGIN_FRACTION:.0%} safety margin"
    if given is not None:
        return given * 1024, "model.heptv2.memory_budget_gib"
    if platform is not None and margin_gib is not None:
        return (
            (platform.device_memory_gib - margin_gib) * 1024,
            f"platform {platform.name}: {platform.device_memory_gib:g} GiB less the "
            f"{margin_gib:g} GiB safety margin given",
        )
    if platform is not None:
        return (
            platform.device_memory_gib * keep * 1024,
            f"platform {platform.name}: {platform.device_memory_gib:g} GiB {margin}",
        )
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return total * keep / MIB, f"{torch.cuda.get_device_name(device)} {margin}"
    raise ConfigError(
        "model.heptv2.activation_checkpointing=auto needs a memory budget: on a CPU without a "
        "platform profile set model.heptv2.memory_budget_gib (GiB of peak tensor memory per "
        "step), e.g. --set model.heptv2.memory_budget_gib=6"
    )


def plan_model(config: Config, plan: CheckpointPlan, batches, device_type: str, platform=None):
    """``plan``'s memory model from fake-tensor steps over ``batches`` (at least two shapes),
    target-faithful on a GPU as the estimated models are."""
    target = platform.device if platform is not None and platform.device != "cpu" else None
    if device_type == "cuda" and target is None:
        target = "cuda"
    version = platform.torch_version if platform is not None else None
    fake = f"{target} (target-faithful)" if target in ("cuda", "rocm") else "cpu"
    fixed = plan_config(config, plan)
    points = []
    for batch in batches:
        est = estimate_step(
            fixed,
            batch,
            "cpu",
            target=target,
            torch_version=version,
            plan=plan if plan.count else None,
        )
        points.append(
            Point(est.batch_size, est.longest_padded, est.peak_allocated_mib, f"fake {fake}")
        )
    return fit_points(
        model_key(fixed.to_dict(), target or device_type),
        points,
        source="estimated",
        source_detail=f"fake-{fake} steps on {len(points)} calibration batches",
    )


def calibrate(
    config: Config,
    batches: Sequence[dict[str, torch.Tensor]],
    device: torch.device,
    budget: tuple[float, str],
    plans: Sequence[CheckpointPlan],
    platform: PlatformConfig | None = None,
) -> PlanPredictor:
    """A predictor of ``plans`` calibrated in this process (tests and small models)."""
    started = time.perf_counter()
    models = {p.name: plan_model(config, p, batches, device.type, platform) for p in plans}
    seconds = time.perf_counter() - started
    return PlanPredictor(
        list(plans), models, *budget, calibration_s=seconds, order_source="as given"
    )


#: ``heptstudy fit`` calibrates ``auto`` on batches of at most this many events and scales (the
#: memory models are linear in events and slots): fake steps of the recipe's 64 events cost
#: minutes each on a CPU. A run calibrates on its own batch size.
FIT_CALIBRATION_EVENTS = 2


def predictor_for(
    config: Config,
    device: torch.device,
    per_device_batch: int,
    platform: PlatformConfig | None = None,
    *,
    margin_gib: float | None = None,
    calibration_events: int | None = None,
    covering: Sequence[BatchGeometry] | None = None,
    also: Sequence[str] = (),
    progress: bool = False,
) -> PlanPredictor | None:
    """The predictor of a run of ``config`` (None unless it is ``auto``), calibrated on a random
    and the longest batch of its training data's events and the longest of half as many (at
    most ``calibration_events``). The budget is resolved first, so a missing one fails at once.

    Plans are calibrated cheapest first and no further than the run needs: once every geometry
    of ``covering`` (default: the longest calibration batch, when it has the run's batch size,
    as no batch of the run holds more) fits a plan calibrated so far, the dearer plans are never
    chosen. The plans named in ``also`` are calibrated whatever the covering; without one (an
    empty one, or a calibration scaled to another batch size and none given), every plan is."""
    if not config.model.heptv2.adaptive:
        return None
    budget = memory_budget_mib(config, device, platform, margin_gib)
    started = time.perf_counter()
    lengths = dataset_for(config, "train").lengths()
    b = min(per_device_batch, len(lengths), calibration_events or per_device_batch)
    sizes = [b, b // 2] if b > 1 else [b]
    picks = fit_batches(lengths, sizes, config.train.seed, random_at={b})
    batches = [load_events(config, idx, "train") for idx in picks]
    if covering is None and b == per_device_batch:
        covering = [max(map(geometry_of, batches), key=lambda g: (g.events, g.slots))]
    plans = candidate_plans(config, platform)  # auto's order, cheapest first
    # the device the steps run on (a fit's fake steps run here, for the platform's)
    target = platform.device if platform is not None else device.type
    plans, unheld = plans_held_on(config, plans, target)
    # the plans named in ``also`` first, then the rest cheapest first
    queue = sorted(plans, key=lambda p: p.name not in also) if covering else plans
    # In child processes: fake-tensor steps leave state that made later real CPU steps ~4x
    # slower. A fake step is bound by Python's dispatch, so plans calibrate side by side.
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    spawn = multiprocessing.get_context("spawn")
    workers = max(1, min(len(plans), os.cpu_count() or 1))
    # a round of as many plans as there are workers, so none idles and none calibrates in vain
    per_round = workers if covering else len(plans)
    desc = f"auto: calibrating up to {len(plans)} plans on {len(batches)} fake steps each"
    models: dict[str, MemoryModel] = {}
    with (
        ProcessPoolExecutor(workers, mp_context=spawn) as pool,
        tqdm(total=len(plans), disable=not progress, desc=desc, unit="plan") as bar,
    ):
        for start in range(0, len(queue), per_round):
            futures = {
                pool.submit(plan_model, config, plan, batches, device.type, platform): plan.name
                for plan in queue[start : start + per_round]
            }
            for done in as_completed(futures):
                models[futures[done]] = done.result()
                bar.update(1)
            tried = _tried_in_order(plans, models)
            if covering and _covered(covering, [models[p.name] for p in tried], budget[0]):
                bar.total = bar.n  # the bar ends full: the rest is not needed, not left undone
                break
    seconds = time.perf_counter() - started
    order = plan_order(config, platform)[1] + unheld
    if skipped := [p.name for p in plans[len(tried) :]]:
        order += f"; {', '.join(skipped)} not tried, as every batch of the run fits an earlier plan"
    # models also holds the ``also`` plans' models, tried or not (fit's cross-check reads full's)
    return PlanPredictor(tried, models, *budget, calibration_s=seconds, order_source=order)


def _tried_in_order(plans: list[CheckpointPlan], models) -> list[CheckpointPlan]:
    """The plans auto tries, in its order up to the first one not calibrated."""
    return list(takewhile(lambda plan: plan.name in models, plans))


def _covered(geometries: Sequence[BatchGeometry], models, budget_mib: float) -> bool:
    """Whether every geometry fits one of ``models``: a memory model's terms are non-negative,
    so a plan that fits the fullest batch fits every batch with fewer events and slots."""
    return all(
        any(m.predict_allocated_mib(g.events, g.length) <= budget_mib for m in models)
        for g in geometries
    )
