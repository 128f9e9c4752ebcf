"""Step-time overheads of checkpointing plans against ``off``, paired step by step in one process.

Plans timed in fresh processes minutes apart differ by the machine's drift as much as by their
recomputation (docs/results.md, "How far to trust the times"). Here one model, built with every
layer wrapped (as ``auto`` builds it), runs each plan's step between two ``off`` steps on the same
batch: a plan's overhead in a round is its step time over the mean of its two neighbours', so a
drift slower than a step cancels. The plans run in reverse order every other round, so no plan
always follows the same one. ``auto`` may be among them: on each batch it runs the plan it chooses
for that batch within its budget. Memory is not measured: ``heptstudy bench`` measures it.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from heptstudy.atomic import Output, json_text, write_text_or_keep
from heptstudy.config.plans import parse_plan_name
from heptstudy.data.batching import dataset_for, event_indices, load_events, to_device
from heptstudy.data.layout import geometry_of
from heptstudy.errors import HeptstudyError, Interrupted
from heptstudy.estimate.plans import predictor_for
from heptstudy.measure import report as rp
from heptstudy.measure.bench import check_enough_events, check_writable, report_header
from heptstudy.measure.request import (
    MEMORY,
    NOTEBOOK_PARAMETERS,
    PAIRED,
    Measurement,
    MeasurementRequest,
)
from heptstudy.meters.allocator import apply_allocator
from heptstudy.meters.timing import StepTimer
from heptstudy.model.checkpoint_plan import AUTO, CheckpointPlan, plan_named
from heptstudy.train.model_size import check_model_fits
from heptstudy.train.plan_table import check_table_on
from heptstudy.train.precision import autocast_dtype
from heptstudy.train.step import fresh_state, run_step

KIND = rp.PAIRED_KIND
#: A study folder's paired timings: reports of their own kind, apart from the others.
PAIRED_DIR = "paired"
PAIRED_FILE = Output("heptstudy paired-timing report", ".json", f'"kind": "{KIND}"'.encode())
REFERENCE = "off"

PROTOCOL = (
    "one process, one model with every layer wrapped; after one untimed warm-up step of every "
    "plan, each round runs off, plan, off, plan, ..., off on one counted batch (the plans in "
    "reverse order every other round, the rounds taking the counted batches in turn); a plan's "
    "overhead in a round is its step time over the mean of the two off steps around it, minus 1; "
    "auto runs on each batch the plan its predictor chooses for that batch within its budget"
)


def why_unpaired(name: str) -> str | None:
    """Why the plan ``name`` cannot be paired with ``off`` (it is off), or None."""
    return "every plan is paired with it" if name.strip().lower() == REFERENCE else None


def plan_names(values: Sequence[Any]) -> list[str]:
    """Plans as a matrix's YAML or a notebook's ``-y`` gives them: YAML reads a bare off/true as
    a boolean, the plan it spells (as checkpointing's)."""
    return [parse_plan_name(v) if isinstance(v, bool) else str(v) for v in values]


def paired_plans(names: Sequence[str], m: Measurement) -> list[CheckpointPlan]:
    """The plans to pair with ``off``, each named once; ``off`` itself is refused by name."""
    plans, num_layers = [], m.config.model.heptv2.num_convs
    for name in names:
        try:
            plan = plan_named(name, num_layers, config=m.config)
        except HeptstudyError as err:  # named as the plans are given, not as checkpointing=
            raise HeptstudyError(f"paired plans: {name!r}: {err}") from None
        if why := why_unpaired(plan.name):
            raise HeptstudyError(
                f"heptstudy bench paired: plan {name!r} cannot be paired ({why}); name the plans "
                "to compare with off, e.g. full keep70"
            )
        if any(p.name == plan.name for p in plans):
            raise HeptstudyError(
                f"heptstudy bench paired: plan {plan.name!r} is named twice; name each plan once"
            )
        plans.append(plan)
    return plans


def check_rounds(rounds: int) -> int:
    if rounds < 1:
        raise HeptstudyError(
            f"heptstudy bench paired: --rounds {rounds!r} is not a whole number >= 1; give the "
            "number of rounds, e.g. --rounds 5"
        )
    return rounds


#: A paired timing's parameters besides its request's.
PAIRED_ONLY = ("plans", "rounds")


#: A paired timing's request: the layers wrapped as ``auto`` wraps them, so that every step can
#: run its own plan, and time only.
_FIXED = {"kind": MEMORY, "checkpointing": "auto", "passes": "timing"}


def paired_request(**fields: Any) -> MeasurementRequest:
    """The request of a paired timing (:data:`_FIXED`, then ``fields``)."""
    return MeasurementRequest.build(**_FIXED, **fields)


def paired_name(request: MeasurementRequest) -> str:
    """``[packed_]paired_bB``: the request's name with ``auto`` (its wrapping) replaced."""
    return request.name.replace("auto", "paired")


def paired_measurement(request: MeasurementRequest) -> Measurement:
    """``request`` resolved, named by :func:`paired_name` (its report too, unless given)."""
    m = request.resolve()
    name = paired_name(request)
    path = m.report_path if request.output else m.report_path.with_name(f"{name}.json")
    return replace(m, name=name, report_path=path)


def from_notebook(namespace: Mapping[str, Any]) -> tuple[Measurement, list[str], int]:
    """``paired.ipynb``'s measurement, plans and rounds from its kernel's globals."""
    plans, rounds = namespace.get("plans"), namespace.get("rounds")
    if isinstance(plans, str) or not isinstance(plans, list | tuple) or not plans:
        raise HeptstudyError(
            f"paired.ipynb: plans={plans!r} is not a list of plans; give the plans to compare "
            'with off, e.g. -y \'plans: ["full", "keep70"]\''
        )
    if isinstance(rounds, bool) or not isinstance(rounds, int):
        raise HeptstudyError(
            f"paired.ipynb: rounds={rounds!r} is not a whole number; give e.g. -p rounds 3"
        )
    request = MeasurementRequest.from_namespace(
        namespace, NOTEBOOK_PARAMETERS[PAIRED], "paired.ipynb", also=PAIRED_ONLY, **_FIXED
    )
    return paired_measurement(request), plan_names(plans), check_rounds(rounds)


def read_paired(path: str | Path) -> dict[str, Any]:
    """A paired-timing report; a file of another kind or an unreadable one is refused."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HeptstudyError(f"{path}: not a readable paired-timing report ({err})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise HeptstudyError(f"{path}: not a paired-timing report (kind {KIND!r})")
    if broken := _unreadable(data, _CORE):
        raise HeptstudyError(
            f"{path}: a paired-timing report whose {', '.join(broken)} cannot be read (edited, "
            "or written by another version); time the plans again with heptstudy bench paired"
        )
    return data


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _steps_read(data) -> bool:
    steps = data.get("steps")
    return isinstance(steps, list) and all(
        isinstance(st, dict)
        and isinstance(st.get("plan"), str)
        and _number(st.get("time_s"))
        and st["time_s"] > 0
        for st in steps
    )


def _overheads_read(data) -> bool:
    overhead = data.get("overhead")
    return isinstance(overhead, dict) and all(
        isinstance(o, dict)
        and isinstance(o.get("per_round"), list)
        and o["per_round"]
        and all(map(_number, o["per_round"]))
        for o in overhead.values()
    )


def _geometries_read(data) -> bool:
    """Every batch's geometry, and every step's batch among them."""
    batches, steps = data.get("batches"), data.get("steps")
    return (
        isinstance(batches, list)
        and all(
            isinstance(b, dict)
            and isinstance(b.get("geometry"), dict)
            and all(_number(b["geometry"].get(k)) for k in ("events", "slots", "longest"))
            and b["geometry"]["slots"] > 0
            for b in batches
        )
        and isinstance(steps, list)
        and all(isinstance(st, dict) and st.get("batch") in range(len(batches)) for st in steps)
    )


#: What every reader of a paired timing takes (the study's tables: the plans' overheads).
_CORE = {
    "batch_size": lambda d: isinstance(d.get("batch_size"), int),
    "steps": _steps_read,
    "overhead": _overheads_read,
}
#: What pricing its steps per slot takes besides (fit's step times): which configuration and
#: batches they ran.
_PRICED = {
    "config": lambda d: isinstance(d.get("config"), dict),
    "environment.device_kind": lambda d: isinstance(
        (d.get("environment") or {}).get("device_kind"), str
    ),
    "batches": _geometries_read,
}


def _unreadable(data: dict[str, Any], checks) -> list[str]:
    return [name for name, readable in checks.items() if not readable(data)]


def unpriceable(report: dict[str, Any]) -> list[str]:
    """The fields of a read paired timing that pricing its steps per slot cannot read."""
    return _unreadable(report, _PRICED)


def complete(report: Mapping[str, Any]) -> bool:
    """Whether every round asked for was timed (an interrupted timing keeps fewer)."""
    return report.get("rounds") == report.get("rounds_asked", report.get("rounds"))


def run_paired(m: Measurement, names: Sequence[str], rounds: int) -> dict[str, Any]:
    """Time ``names`` against ``off`` in ``rounds`` paired rounds; write and return the report.

    ``m`` must be resolved with ``checkpointing=auto`` (the layers wrapped so that a step can run
    any plan); its ``warmup`` and ``steps`` give the warm-up batch and the counted batches."""
    if m.config.model.heptv2.activation_checkpointing != "auto":
        raise HeptstudyError("run_paired needs a measurement resolved with checkpointing=auto")
    fresh = rp.claim_fresh_process()
    allocator = apply_allocator(m.allocator)  # before anything is allocated
    plans = paired_plans(names, m)
    check_table_on(m.config, plans, m.device.type)
    rounds = check_rounds(rounds)
    check_writable(m.report_path, PAIRED_FILE)
    check_enough_events(m)
    check_model_fits(m.config, m.device)
    request, config, device = m.request, m.config, m.device
    dtype = autocast_dtype(config, device)
    indices = event_indices(config, request.batch_size, request.warmup + request.steps)
    batches = [to_device(load_events(config, idx, "train"), device) for idx in indices]
    chosen = _auto_choices(m, plans, batches)
    off = plan_named(REFERENCE)
    state = fresh_state(config, device)
    timer = StepTimer(device)

    def step(plan: CheckpointPlan, b: int) -> float:
        runs = chosen[b] if plan.name == AUTO.name else plan
        with timer.step():
            run_step(*state[:1], batches[b], *state[1:], config, dtype, plan=runs)
        return timer.seconds

    counted = batches[request.warmup :]
    total = len(plans) + 1 + rounds * (2 * len(plans) + 1)
    bar = tqdm(total=total, disable=not request.progress, desc=f"paired {m.name}", unit="step")
    steps: list[dict[str, Any]] = []
    header = _header(m, plans, batches, fresh, allocator)
    if chosen:
        header["auto_runs"] = [p.name for p in chosen]
    written = 0
    with bar:
        try:
            for plan in (off, *plans):  # one-time costs (first calls, the heap) left untimed
                step(plan, 0)
                bar.update(1)
            for r in range(rounds):
                b = request.warmup + r % len(counted)
                order = plans if r % 2 == 0 else plans[::-1]
                for plan in (off, *[p for q in order for p in (q, off)]):
                    seconds = step(plan, b)
                    record = {"round": r + 1, "plan": plan.name, "batch": b, "time_s": seconds}
                    if plan.name == AUTO.name:
                        record["ran"] = chosen[b].name
                    steps.append(record)
                    bar.update(1)
                # every round written as it ends: an interruption keeps the rounds before it
                report = _report(header, r + 1, rounds, steps)
                text = json_text(report, "the paired timing")
                write_text_or_keep(m.report_path, text, "the paired timing", PAIRED_FILE)
                written = r + 1
        except KeyboardInterrupt:
            kept = (
                f"the {written} round(s) completed of {rounds} are in {m.report_path}"
                if written
                else "no round was complete, so nothing was written"
            )
            raise Interrupted(f"{kept}; run the same command again for all of them") from None
    return report


def _auto_choices(m: Measurement, plans, batches) -> list[CheckpointPlan]:
    """The plan ``auto`` runs on each batch (its predictor calibrated as a bench run's), or []
    when ``auto`` is not among ``plans``."""
    if not any(p.name == AUTO.name for p in plans):
        return []
    predictor = predictor_for(
        m.config,
        m.device,
        m.request.batch_size,
        m.profile,
        covering=[geometry_of(b) for b in batches],
        progress=m.request.progress,
    )
    return [predictor.choose_for(b).plan for b in batches]


def overheads(steps: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Each plan's overhead over ``off`` per round: its time over the mean of the ``off`` steps
    just before and after it, minus 1."""
    out: dict[str, list[float]] = {}
    for before, here, after in zip(steps, steps[1:], steps[2:], strict=False):
        if here["plan"] != REFERENCE and before["plan"] == after["plan"] == REFERENCE:
            out.setdefault(here["plan"], []).append(
                here["time_s"] / ((before["time_s"] + after["time_s"]) / 2) - 1
            )
    return out


def _header(m: Measurement, plans, batches, fresh, allocator) -> dict[str, Any]:
    config = m.config
    synthetic = bool(dataset_for(config, "train").metadata.get("synthetic", False))
    shared = report_header(m, fresh_process=fresh, synthetic=synthetic, allocator=allocator)
    del shared["checkpointing"]  # the model's auto wrapping; the plans timed are listed below
    return {
        "kind": KIND,  # first: the mark PAIRED_FILE recognises
        "protocol": PROTOCOL,
        **{
            k: v.model_dump(mode="json") if hasattr(v, "model_dump") else v
            for k, v in shared.items()
        },
        "synthetic": synthetic,
        "batching": config.data.batching,
        "plans": {p.name: p.label for p in plans},
        "batches": [
            {
                "event_indices": b["event_index"].tolist(),
                "hits": b["length"].tolist(),
                "padded_hits": b["padded_length"].tolist(),
                "geometry": asdict(geometry_of(b)),
            }
            for b in batches
        ],
    }


def _report(header, rounds: int, asked: int, steps) -> dict[str, Any]:
    """The report after ``rounds`` of the ``asked`` rounds."""
    environment = {**header["environment"], "load_average_1min": rp.load_average()}
    overhead = {
        name: {
            "per_round": values,
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
        }
        for name, values in overheads(steps).items()
    }
    off_median = statistics.median(s["time_s"] for s in steps if s["plan"] == REFERENCE)
    return {
        **header,
        "environment": environment,
        "rounds": rounds,
        "rounds_asked": asked,
        "steps": list(steps),
        "overhead": overhead,
        "off_step_time_s": off_median,
    }


def describe_paired(report: dict[str, Any]) -> str:
    """The report's overheads as a console table, plans in the order given."""
    done, asked = report["rounds"], report.get("rounds_asked", report["rounds"])
    head = (
        f"{report['name']}: {done} paired round(s) of {asked}, batch {report['batch_size']} "
        f"{report['batching']}, off {report['off_step_time_s']:.2f} s a step (median)"
        + (", synthetic events" if report["synthetic"] else "")
    )
    rows = [f"  {'plan':<12} {'median':>8} {'range':>18}   per round"]
    for name, o in report["overhead"].items():
        rounds = ", ".join(f"{v:+.1%}" for v in o["per_round"])
        rows.append(
            f"  {name:<12} {o['median']:>+8.1%} {o['min']:>+8.1%} to {o['max']:<+7.1%}   {rounds}"
        )
    return "\n".join([head, *rows])
