"""`heptstudy fit`: will a per-device batch fit a platform's memory over the whole data set?"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from heptstudy.errors import HeptstudyError
from heptstudy.fitting.memmodel import (
    GIB,
    FitError,
    MemoryModel,
    expand_report_paths,
    fit_reports,
    model_key,
)
from heptstudy.fitting.predict import FitAnswer, evaluate

DEFAULT_SCENARIO = "configs/training/scenarios/cld_pf_heptv2_batch512_50k.yaml"
DEFAULT_VARIANT = "hit_heptv2_grouped_tracker_features"
FITS_DIR = Path("configs/fit")
DEVICE_WORDS = {"rocm": "GCD", "cuda": "GPU", "cpu": "CPU process"}


def resolve_config(scenario: str, platform: str, variant: str, data_dir: str | None, overrides=()):
    """The variant's resolved configuration on the platform (validation/test sizes lowered to 0
    when the data set's test split is too small: they do not change the training step)."""
    from heptstudy.scenario import ScenarioError, resolve

    over = ([f"data.data_dir={data_dir}"] if data_dir else []) + list(overrides)
    notes = []
    try:
        res = resolve(scenario, platform, variants=[variant], overrides=over)
    except ScenarioError as err:
        if err.rule != "eval-within-test-split":
            raise
        res = resolve(
            scenario,
            platform,
            variants=[variant],
            overrides=over + ["data.nvalid=0", "data.ntest=0"],
        )
        notes.append(
            "validation/test sizes lowered to 0 for this data set (they do not enter the training step)"
        )
    return res, res.variant(variant), notes


def find_model(
    config, device_kind: str, reports=(), fits_dir: Path = FITS_DIR
) -> MemoryModel | None:
    """A memory model for this configuration and device kind: measured (from ``reports``) first,
    then stored fits in ``fits_dir`` (measured before estimated); ``None`` if there is none."""
    key = model_key(config.to_dict(), device_kind)
    if reports:
        for mm in fit_reports(expand_report_paths(reports)):
            if mm.key == key:
                return mm
    stored = []
    for path in sorted(Path(fits_dir).glob("*.json")) if Path(fits_dir).is_dir() else []:
        try:
            mm = MemoryModel.load(path)
        except FitError:
            continue
        if mm.key == key:
            stored.append(mm)
    stored.sort(key=lambda m: m.source != "measured")
    return stored[0] if stored else None


def answer_words(ans: FitAnswer, platform_name: str, device_kind: str) -> str:
    unit = DEVICE_WORDS.get(device_kind, "device")
    head = f"{ans.per_device_batch} events per {platform_name} {unit}"
    if ans.fits:
        text = f"{head}: fits, with {ans.spare_gib_at_worst:.1f} GiB to spare at the worst batch"
        if ans.worst_possible["peak_gib"] > ans.usable_gib:
            text += " (but a batch holding the data set's longest event would not fit)"
        return text + "."
    n = ans.expected_failures
    return (
        f"{head}: does NOT fit: expected to fail {n:,.0f} time{'s' if round(n) != 1 else ''} in "
        f"{ans.scenario_steps:,} steps ({ans.p_step_fails:.2%} of steps; the first failure ends the run)."
    )


def render(ans: FitAnswer, mm: MemoryModel, res_variant, platform, notes, lengths_info: str) -> str:
    p = ans.peaks_gib
    lines = [
        answer_words(ans, platform.name, platform.device),
        "",
        f"Memory model: {mm.source.upper()} — {mm.describe()}",
    ]
    if mm.validation.get("max_abs_rel_error") is not None:
        lines.append(
            f"  validated on held-out batch sizes {mm.validation['held_out_batch_sizes']}: "
            f"max |error| {mm.validation['max_abs_rel_error']:.1%}"
        )
    lines += [
        f"  fit residuals: max |relative| {mm.allocated.max_abs_rel_residual:.1%}, rms {mm.allocated.rms_residual_mib:.0f} MiB",
        f"Device: {platform.device_memory_gib:g} GiB; safety margin (allocator fragmentation, context) "
        f"{ans.safety_margin_gib:g} GiB, shown separately; usable {ans.usable_gib:.1f} GiB",
        f"Per-batch peak allocated over {ans.simulated_steps:,} simulated steps x {ans.world_size} ranks: "
        f"min {p['min']:.1f}, median {p['p50']:.1f}, p90 {p['p90']:.1f}, p99 {p['p99']:.1f}, max {p['max']:.1f} GiB",
        f"Worst batch met: step {ans.worst_batch['step']}, rank {ans.worst_batch['rank']}, longest padded event "
        f"{ans.worst_batch['longest_padded']:,} hits ({ans.worst_batch['padded_batch_hits']:,} padded hits): "
        f"{ans.worst_batch['peak_gib']:.1f} GiB (+ margin {ans.safety_margin_gib:g} = "
        f"{ans.worst_batch['peak_gib'] + ans.safety_margin_gib:.1f} of {ans.device_memory_gib:g} GiB)",
        f"Worst possible batch (holds the longest event, {ans.worst_possible['longest_padded']:,} padded hits): "
        f"{ans.worst_possible['peak_gib']:.1f} GiB",
        f"P(a batch exceeds usable memory) = {ans.p_batch_exceeds:.4%}; P(a step fails on any rank) = "
        f"{ans.p_step_fails:.4%}; expected failing steps in {ans.scenario_steps:,} steps: {ans.expected_failures:,.1f}",
        f"Largest per-device batch with no expected failure: {ans.largest_safe_batch}",
        "",
        "Assumptions:",
        f"  recipe: {res_variant.name}, global batch {res_variant.config.train.global_batch_size} over "
        f"{ans.world_size} devices, {ans.scenario_steps:,} steps, seed {res_variant.config.train.seed}, "
        f"sampler {res_variant.config.data.sampler}, padding to {res_variant.config.data.pad_to_multiple}, "
        f"dtype {res_variant.config.train.dtype}, attention {res_variant.config.model.heptv2.attention_backend}, "
        f"checkpointing {res_variant.config.model.heptv2.activation_checkpointing}",
        f"  data: {lengths_info}",
        "  each rank's batch = its next events of the interleaved-shard order, padded to the longest one;",
        "  a step's peak = memory model at (batch size, longest padded event); validation steps not modelled",
        *(f"  {n}" for n in notes + mm.notes),
    ]
    return "\n".join(lines)


def run_fit(args) -> dict:
    from heptstudy.data.batching import dataset_for

    res, rv, notes = resolve_config(
        args.scenario, args.platform, args.variant, args.data_dir, getattr(args, "overrides", [])
    )
    platform = res.platform
    config = rv.config
    mm = find_model(config, platform.device, args.reports or (), Path(args.fits_dir))
    if mm is None:
        from heptstudy.fitting.fake import estimate_memory_model

        notes.append("no measured or stored memory model matched: estimated now on a fake device")
        mm = estimate_memory_model(config, args.per_device_batch, platform.device)
    ds = dataset_for(config, "train")
    lengths = ds.lengths()
    margin = (
        args.safety_margin_gib
        if args.safety_margin_gib is not None
        else round(0.1 * platform.device_memory_gib, 1)
    )
    ans = evaluate(
        mm,
        lengths,
        args.per_device_batch,
        platform.device_memory_gib,
        safety_margin_gib=margin,
        world_size=platform.world_size,
        seed=config.train.seed,
        num_steps=config.train.num_steps,
        shard_sizes=ds.shard_sizes,
        mode=config.data.sampler,
        pad_to_multiple=config.data.pad_to_multiple,
    )
    synthetic = bool(ds.metadata.get("synthetic", False))
    info = (
        f"{ds.name} configs {ds.shard_names} train split, {len(lengths):,} events, hits per event "
        f"{int(lengths.min()):,}..{int(lengths.max()):,} (mean {lengths.mean():,.0f})"
        f"{' — SYNTHETIC (generated) events' if synthetic else ''}"
    )
    return {
        "answer": ans,
        "model": mm,
        "variant": rv,
        "platform": platform,
        "notes": notes,
        "data": info,
        "synthetic": synthetic,
    }


def _cmd_fit(args: argparse.Namespace) -> int:
    if args.per_device_batch < 1:
        raise HeptstudyError(f"--per-device-batch {args.per_device_batch} must be >= 1")
    out = run_fit(args)
    ans, mm = out["answer"], out["model"]
    if args.save_model:
        mm.save(args.save_model)
    if args.json:
        print(
            json.dumps(
                {
                    "answer": answer_words(ans, out["platform"].name, out["platform"].device),
                    "result": ans.to_dict(),
                    "memory_model": mm.to_dict(),
                    "platform": out["platform"].name,
                    "variant": out["variant"].name,
                    "data": out["data"],
                    "synthetic_data": out["synthetic"],
                    "notes": out["notes"],
                },
                indent=2,
            )
        )
    else:
        print(render(ans, mm, out["variant"], out["platform"], out["notes"], out["data"]))
    return 0


def register_cli(subparsers) -> None:
    from heptstudy.cli import add_set_arg

    p = subparsers.add_parser(
        "fit", help="will a per-device batch fit a platform's memory over the whole data set?"
    )
    p.add_argument("--platform", required=True, help="platform profile (YAML file or name)")
    p.add_argument("--per-device-batch", required=True, type=int, help="events per device")
    p.add_argument(
        "--scenario",
        default=DEFAULT_SCENARIO,
        help=f"training scenario (default {DEFAULT_SCENARIO})",
    )
    p.add_argument(
        "--variant", default=DEFAULT_VARIANT, help=f"scenario variant (default {DEFAULT_VARIANT})"
    )
    p.add_argument("--data-dir", default=None, help="TFDS data directory (default: the scenario's)")
    p.add_argument(
        "--reports",
        nargs="*",
        default=[],
        help="bench reports (files or directories) to fit a measured model",
    )
    p.add_argument(
        "--fits-dir", default=str(FITS_DIR), help=f"stored memory models (default {FITS_DIR})"
    )
    p.add_argument(
        "--safety-margin-gib",
        type=float,
        default=None,
        help="memory kept free for allocator fragmentation and context (default 10%% of the device)",
    )
    p.add_argument(
        "--save-model", default=None, help="write the memory model used to this JSON file"
    )
    add_set_arg(p, help="dotted override of the resolved recipe (repeatable)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_fit)


def fit_warning(resolution) -> str | None:
    """One line for ``heptstudy scenario resolve``: a warning when the stored memory model of a
    resolved variant says its per-device batch will not fit (``None`` when it fits or when no
    stored model matches: this never estimates or reads the data set's events itself)."""
    warnings = []
    plat = resolution.platform
    for v in resolution.variants:
        mm = find_model(v.config, plat.device)
        if mm is None:
            continue
        margin = 0.1 * plat.device_memory_gib
        usable = plat.device_memory_gib - margin
        worst = mm.key and _worst_stored(mm, v)
        if worst is not None and worst > usable:
            warnings.append(
                f"{v.name}: {v.per_device_batch} events per device on {plat.name} is expected to exceed "
                f"{usable:.0f} GiB ({plat.device_memory_gib:g} GiB less a {margin:.1f} GiB margin): "
                f"{mm.source} model gives {worst:.1f} GiB for a batch holding the longest event seen by the "
                f"model; run `heptstudy fit --platform {resolution.platform_path} --per-device-batch "
                f"{v.per_device_batch}` for the full answer"
            )
    return "; ".join(warnings) or None


def _worst_stored(mm: MemoryModel, v) -> float | None:
    longest = max((p.longest_padded for p in mm.inputs + mm.held_out), default=None)
    if longest is None:
        return None
    return float(mm.predict_allocated_mib(v.per_device_batch, longest)) * 1024**2 / GIB
