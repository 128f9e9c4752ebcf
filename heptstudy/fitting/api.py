"""The fit as a library: a :class:`FitRequest` in, a :class:`FitResult` out."""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from heptstudy.config import ALLOC_CONF_VARS
from heptstudy.data.batching import dataset_for, padded_sizes
from heptstudy.data.layout import is_packed
from heptstudy.errors import HeptstudyError
from heptstudy.estimate.autocast_policy import UnknownTorchVersion, lists_for
from heptstudy.estimate.fake_step import DEFAULT_TORCH_VERSION, estimate_memory_model
from heptstudy.estimate.keys import model_key
from heptstudy.estimate.memory_model import FitError, MemoryModel
from heptstudy.estimate.plans import (
    DEFAULT_MARGIN_FRACTION,
    FIT_CALIBRATION_EVENTS,
    predictor_for,
)
from heptstudy.fingerprint import commit_reasons
from heptstudy.fitting.auto import auto_words, evaluate_auto, measured_rates
from heptstudy.fitting.draws import draws_for
from heptstudy.fitting.predict import FitAnswer, criterion_of, evaluate, gib, peak_mib
from heptstudy.fitting.reports import Rejected, expand_report_paths
from heptstudy.fitting.select import STALE_PREFIX, Choice, choose_model
from heptstudy.fitting.words import answer_words
from heptstudy.measure.paired import PAIRED_DIR, read_paired, unpriceable
from heptstudy.measure.report import ReportError
from heptstudy.measure.report_checks import checked_report
from heptstudy.model.adaptive_checkpointing import plan_config
from heptstudy.model.checkpoint_plan import FULL
from heptstudy.paths import ROOT, real_path
from heptstudy.scenario import ScenarioError, resolve

DEFAULT_SCENARIO = "cld_pf_heptv2_batch512_50k"
DEFAULT_VARIANT = "hit_heptv2_grouped_tracker_features"
FITS_DIR = ROOT / "configs" / "fit"


def repo_path(path: str | Path) -> Path:
    """``path`` if it exists, else from the repository if it exists there, else as given."""
    p = Path(path).expanduser()
    if p.exists() or p.is_absolute():
        return p
    in_repo = ROOT / p
    return in_repo if in_repo.exists() else p


@dataclass(frozen=True)
class FitRequest:
    """Will ``per_device_batch`` events of ``scenario``'s ``variant`` fit ``platform`` all along?"""

    platform: str
    per_device_batch: int | None = None  # default: the recipe's (global batch / devices)
    scenario: str = DEFAULT_SCENARIO
    variant: str = DEFAULT_VARIANT
    data_dir: str | None = None  # default: the scenario's
    reports: tuple[str, ...] = ()  # bench reports (files or folders) to fit a measured model
    fits_dir: str | None = None  # stored memory models; default configs/fit
    safety_margin_gib: float | None = None  # default DEFAULT_MARGIN_FRACTION of the device
    overrides: tuple[str, ...] = ()
    estimate_if_missing: bool = True  # else no answer when no measured or stored model holds
    checkpointing: str | None = None  # "auto": also answer for activation_checkpointing=auto
    stored_if_reports_unusable: bool = False  # else refuse reports that do not hold
    estimate: bool = False  # estimate now on a fake device, whatever is stored (regenerating)
    batching: str | None = None  # padded | packed; default: the recipe's

    def __post_init__(self) -> None:
        b = self.per_device_batch
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
            raise FitError(
                f"per-device batch {b!r} is not allowed: give a whole number of events >= 1 "
                "(e.g. --per-device-batch 48)"
            )
        m = self.safety_margin_gib
        if m is not None and (
            isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m < 0
        ):
            raise FitError(
                f"--safety-margin-gib {m!r} is not allowed: the memory kept free must be a finite "
                "number of GiB >= 0 and below the device memory (default "
                f"{DEFAULT_MARGIN_FRACTION:.0%} of the device); omit it for the default"
            )
        if self.checkpointing not in (None, "auto"):
            raise FitError(
                f"--checkpointing {self.checkpointing!r} is not allowed: give auto (the answer "
                "for activation_checkpointing=auto) or leave it out (the recipe's setting)"
            )
        object.__setattr__(self, "reports", tuple(str(r) for r in self.reports))
        object.__setattr__(self, "overrides", tuple(self.overrides))


@dataclass
class FitResult:
    request: FitRequest
    answer: FitAnswer
    model: MemoryModel
    model_origin: str
    platform: Any  # heptstudy.config.PlatformConfig
    variant: Any  # heptstudy.scenario.ResolvedVariant
    data: str  # one line: data set, events, hits per event, synthetic or not
    synthetic: bool
    notes: list[str] = field(default_factory=list)
    not_used: list[Rejected] = field(default_factory=list)
    cross_checks: list[dict[str, Any]] = field(default_factory=list)
    auto: Any = None  # heptstudy.fitting.auto.AutoAnswer when the configuration is auto

    def words(self) -> str:
        """The headline: auto's plans when the configuration is auto, else the memory answer."""
        return auto_words(self.auto)[0] if self.auto is not None else answer_words(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "answer": self.words(),
            "fits": self.answer.fits,
            "result": self.answer.to_dict(),
            "memory_model": self.model.to_dict(),
            "memory_model_origin": self.model_origin,
            "platform": self.platform.name,
            "variant": self.variant.name,
            "data": self.data,
            "synthetic_data": self.synthetic,
            "notes": self.notes,
            "not_used": [{"path": r.path, "why": r.reason} for r in self.not_used],
            "cross_checks": self.cross_checks,
            "auto": None if self.auto is None else asdict(self.auto),
        }


def resolve_config(request: FitRequest):
    """``(resolution, resolved variant, notes)`` of the request's scenario on its platform."""
    over = list(request.overrides)
    # the fitted variant only: others may have no HEPTv2 backbone, nor read packed batches
    fitted = (
        ["model.heptv2.activation_checkpointing=auto"] if request.checkpointing == "auto" else []
    )
    if request.batching:
        fitted.append(f"data.batching={request.batching}")
    only_fitted = {request.variant: fitted} if fitted else None
    if request.data_dir:
        over.insert(0, f"data.data_dir={real_path(request.data_dir, '--data-dir')}")
    scenario, platform = repo_path(request.scenario), repo_path(request.platform)
    notes = []

    def resolved(overrides):
        return resolve(
            scenario,
            platform,
            variants=[request.variant],
            overrides=overrides,
            variant_overrides=only_fitted,
        )

    try:
        res = resolved(over)
    except ScenarioError as err:
        if err.rule != "eval-within-test-split":
            raise
        res = resolved([*over, "data.nvalid=0", "data.ntest=0"])
        notes.append(
            "validation/test sizes lowered to 0 for this data set (they do not enter the training step)"
        )
    return res, res.variant(request.variant), notes


def _cross_check(
    origin: str, model: MemoryModel, differs: list[str], answer: FitAnswer
) -> dict[str, Any]:
    """Another device kind's or attention backend's model at the answer's worst batch."""
    b = answer.per_device_batch
    longest = answer.worst_batch["padded_batch_hits"] / b  # slots per event
    allocated = gib(model.predict_allocated_mib(b, longest))
    reserved = gib(model.predict_reserved_mib(b, longest))
    return {
        "origin": origin,
        "source": model.source,
        "differs": differs,
        "device_kind": model.key.get("device_kind"),
        "attention_backend": model.key.get("attention_backend"),
        "device_names": model.provenance.get("device_names") or [],
        "worst_batch_allocated_gib": allocated,
        "worst_batch_reserved_gib": reserved,
        "criterion": criterion_of(model),
        "fits": (allocated if reserved is None else reserved) <= answer.usable_gib,
        "stale": next((d for d in differs if d.startswith(STALE_PREFIX)), None),
    }


def _check_torch_version(res) -> None:
    try:
        # a stored or measured model would otherwise answer for a PyTorch it never knew, unsaid
        lists_for(res.platform.torch_version or DEFAULT_TORCH_VERSION)
    except UnknownTorchVersion as err:
        raise FitError(
            f"platform profile {str(res.platform_path)!r}: torch_version="
            f"{res.platform.torch_version!r}: {err}"
        ) from None


def _margin(request: FitRequest, platform) -> float:
    memory, margin = platform.device_memory_gib, request.safety_margin_gib
    if margin is None:
        return round(DEFAULT_MARGIN_FRACTION * memory, 1)
    if margin >= memory:
        raise FitError(
            f"--safety-margin-gib {margin:g} is not allowed: platform {platform.name!r} has "
            f"{memory:g} GiB per device, and the margin must leave some of it usable (0 <= "
            f"margin < {memory:g}); omit it for the default {DEFAULT_MARGIN_FRACTION:.0%} of the "
            "device"
        )
    return float(margin)


def _memory_model(
    request: FitRequest, config, platform, batch: int, notes: list[str], calibrated=None
) -> Choice:
    """The measured, stored or (now) estimated memory model of ``config`` on ``platform``;
    ``calibrated``, auto's own model of the plan, stands in for an estimate made now."""
    key = model_key(config.to_dict(), platform.device)
    reports = [str(repo_path(r)) for r in request.reports]
    fits_dir = repo_path(request.fits_dir) if request.fits_dir else FITS_DIR
    if request.estimate:
        choice = Choice()
    else:
        choice = choose_model(key, reports, fits_dir, request.stored_if_reports_unusable)
    if choice.model is None and calibrated is not None and not request.estimate:
        choice.model, choice.origin = calibrated, "auto's calibration"
        notes.append(
            "no measured or stored memory model holds: the cross-check uses auto's own model of "
            "the plan (fake steps of a few events, scaled; allocated only)"
        )
    if choice.model is None:
        if not request.estimate_if_missing:
            return choice
        notes.append(
            "estimated now on a fake device (--estimate)"
            if request.estimate
            else "no measured or stored memory model holds: estimated now on a fake device"
        )
        choice.model = estimate_memory_model(
            config, batch, platform.device, torch_version=platform.torch_version
        )
        choice.origin = "estimated now"
    if choice.origin.startswith("reports"):
        notes.append(_reports_code_note(choice.model))
    if choice.assumptions:
        notes.append(
            "model fields the memory model's configuration does not record, taken at their "
            f"defaults: {', '.join(choice.assumptions)}"
        )
    return choice


def _data_words(ds, config, lengths) -> str:
    synthetic = bool(ds.metadata.get("synthetic", False))
    return (
        f"{ds.name} configs {ds.shard_names} train split at {config.data.data_dir}, "
        f"{len(lengths):,} events, hits per event {int(lengths.min()):,}..{int(lengths.max()):,} "
        f"(mean {lengths.mean():,.0f})" + (" — SYNTHETIC (generated) events" if synthetic else "")
    )


def _check_batch(request: FitRequest, batch: int, lengths, ds, notes: list[str]) -> None:
    if batch <= len(lengths):
        return
    if request.per_device_batch is None:  # the recipe's, on a data set smaller than its own
        notes.append(
            f"the data set holds {len(lengths):,} events, fewer than the recipe's {batch:,} per "
            "device: no such batch can be drawn from it, so every batch here holds all of them"
        )
        return
    raise FitError(
        f"per-device batch {batch:,} is larger than the data set: {ds.name} train split holds "
        f"{len(lengths):,} events, so no batch of {batch:,} distinct events can be drawn; give "
        f"--per-device-batch {len(lengths):,} or fewer, or a larger data set (--data-dir)"
    )


def fit(request: FitRequest) -> FitResult | None:
    """``None`` only when no model holds and ``request.estimate_if_missing`` is false."""
    res, rv, notes = resolve_config(request)
    _check_torch_version(res)
    platform, config = res.platform, rv.config
    auto_config = config if config.model.heptv2.adaptive else None
    if auto_config is not None:
        config = plan_config(auto_config, FULL)
        notes.append(
            "activation_checkpointing=auto: the memory answer above is for full checkpointing, "
            "the plan auto falls back on: a cross-check of auto's answer"
        )
    margin = _margin(request, platform)
    batch = request.per_device_batch or rv.per_device_batch
    ds = dataset_for(config, "train")
    lengths = ds.lengths()
    _check_batch(request, batch, lengths, ds, notes)
    predictor = None
    if auto_config is not None:
        predictor = _auto_predictor(
            auto_config, platform, batch, request.safety_margin_gib, lengths
        )
    full = predictor.models.get(FULL.name) if predictor is not None else None
    choice = _memory_model(request, config, platform, batch, notes, calibrated=full)
    if choice.model is None:
        return None
    if batch != rv.per_device_batch:
        notes.append(
            f"the recipe runs {rv.per_device_batch} events per device; this answer is for {batch}"
        )
    expandable = expandable_segments(platform)
    answer = evaluate(
        choice.model,
        lengths,
        batch,
        platform.device_memory_gib,
        safety_margin_gib=margin,
        world_size=platform.world_size,
        num_steps=config.train.num_steps,
        pad_to_multiple=config.data.pad_to_multiple,
        expandable_segments=expandable,
        batching=config.data.batching,
    )
    if expandable:
        notes.append(
            f"platform {platform.name} sets expandable_segments:True in its allocator settings: "
            + (
                "the criterion is the reserved memory predicted for that mode"
                if answer.criterion.quantity == "reserved_expandable"
                else "the memory model has no reserved figure for that mode"
            )
        )
    auto = None
    if predictor is not None:
        auto = _auto_answer(predictor, auto_config, platform, batch, lengths, request.reports)
    return FitResult(
        auto=auto,
        request=request,
        answer=answer,
        model=choice.model,
        model_origin=choice.origin,
        platform=platform,
        variant=rv,
        data=_data_words(ds, config, lengths),
        synthetic=bool(ds.metadata.get("synthetic", False)),
        notes=notes,
        not_used=choice.not_used,
        cross_checks=[_cross_check(o, m, d, answer) for o, m, d in choice.cross_checks],
    )


def _reports_code_note(model: MemoryModel) -> str:
    commits = model.provenance.get("git_commits") or []
    if len(commits) != 1:
        return f"the reports name {len(commits)} commits ({', '.join(commits) or 'none'})"
    reasons = commit_reasons(commits[0])
    if reasons is None:
        return (
            f"the reports measured commit {commits[0][:9]}, which this repository does not hold: "
            "whether they measured the code that runs now cannot be said"
        )
    if reasons:
        return f"the reports measured OTHER CODE than runs now (commit {commits[0][:9]}): {'; '.join(reasons)}"
    return f"the reports measured the code that runs now (commit {commits[0][:9]})"


def expandable_segments(platform) -> bool:
    # the platform's schema refused any other spelling (heptstudy.config.check_alloc_conf)
    return any(
        "".join(item.split()) == "expandable_segments:True"
        for name in ALLOC_CONF_VARS
        for item in platform.env.get(name, "").split(",")
    )


def _auto_predictor(config, platform, batch: int, margin_gib: float | None, lengths):
    import torch

    sizes = padded_sizes(lengths, config.data.pad_to_multiple)

    # the fake steps run on the host, target-faithful to the platform's device (cuda or rocm)
    return predictor_for(
        config,
        torch.device("cpu"),
        batch,
        platform,
        margin_gib=margin_gib,
        calibration_events=FIT_CALIBRATION_EVENTS,
        # no batch of the data holds more than its fullest; full's model cross-checks the answer
        covering=[draws_for(is_packed(config.data.batching), sizes, batch).worst],
        also=[FULL.name],
        progress=sys.stderr.isatty(),  # a terminal's bar; no widget in a notebook's report
    )


def _auto_answer(predictor, config, platform, batch: int, lengths, reports):
    bench, paired, other = _timed_reports(reports, model_key(config.to_dict(), platform.device))
    packed = is_packed(config.data.batching)
    rates, used = measured_rates(bench, packed, paired)
    answer = evaluate_auto(
        predictor,
        lengths,
        batch,
        world_size=platform.world_size,
        pad_to_multiple=config.data.pad_to_multiple,
        packed=packed,
        rates=rates,
        rate_sources=used,
    )
    if other:
        answer.notes.append(
            f"step times not taken from {len(other)} report(s) of another configuration "
            f"(device, dtype, variant, attention or model sizes) or unreadable: "
            f"{', '.join(other[:3])}" + (", ..." if other[3:] else "")
        )
    return answer


#: What a report's step times must share with the configuration to price its plans.
_TIMING_KEY = ("device_kind", "dtype", "variant", "attention_backend", "model_hash")


def _timed_reports(reports, key) -> tuple[list, list[dict], list[str]]:
    """The bench reports and paired timings among ``reports`` (a folder's files and its
    ``paired/`` timings) measured in ``key``'s configuration, any plan; the names of the others
    (a paired timing whose steps cannot be priced among them, with why)."""
    paths = expand_report_paths(map(repo_path, reports))
    for folder in map(repo_path, reports):
        paths += sorted((folder / PAIRED_DIR).glob("*.json")) if folder.is_dir() else []
    bench, paired, other = [], [], []
    for path in paths:
        try:
            report = checked_report(path)
            config, device_kind = report.config, report.environment.device_kind
        except ReportError:  # choose_model already names the bench reports it cannot use
            try:
                report = read_paired(path)
            except HeptstudyError:
                continue
            if unreadable := unpriceable(report):
                other.append(f"{path.name} (its {', '.join(unreadable)} cannot be read)")
                continue
            config, device_kind = report["config"], report["environment"]["device_kind"]
        found = model_key(config, device_kind)
        if any(found[k] != key[k] for k in _TIMING_KEY):
            other.append(path.name)
        else:
            (paired if isinstance(report, dict) else bench).append(report)
    return bench, paired, other


def fit_warning(resolution) -> str | None:
    """``scenario resolve``'s warning that a stored model says a variant's batch will not fit."""
    warnings = []
    plat = resolution.platform
    margin = DEFAULT_MARGIN_FRACTION * plat.device_memory_gib
    usable = plat.device_memory_gib - margin
    for v in resolution.variants:
        mm = choose_model(model_key(v.config.to_dict(), plat.device), (), FITS_DIR).model
        if mm is None or not mm.allocated_points:
            continue
        longest = max(p.longest_padded for p in mm.allocated_points)
        what = criterion_of(mm)
        peak_gib = gib(peak_mib(mm, what, v.per_device_batch, longest))
        if peak_gib > usable:
            warnings.append(
                f"{v.name}: {v.per_device_batch} events per device on {plat.name} is expected to "
                f"exceed {usable:.0f} GiB ({plat.device_memory_gib:g} GiB less a {margin:.1f} GiB "
                f"margin): the {mm.source} model gives {peak_gib:.1f} GiB {what} for a batch "
                f"holding an event of {longest:,} padded hits; run `heptstudy fit --platform "
                f"{plat.name} --per-device-batch {v.per_device_batch}` for the full answer"
            )
    return "; ".join(warnings) or None
