"""Does `heptstudy fit --checkpointing auto`'s fast calibration (fake steps of at most
FIT_CALIBRATION_EVENTS events, scaled) choose the plans a run's own calibration (fake steps of
its whole batch) chooses? For every auto report given: both predictors, built now on this code,
choose a plan for each of the report's batches, and for random batches of the data set.

    .venv/bin/python scripts/auto_calibration_check.py experiments/cpu_reference \
        --data-dir data/tfds --out experiments/auto_calibration/agreement.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from heptstudy.atomic import atomic_write_text, json_text
from heptstudy.config import load_config
from heptstudy.data.batching import dataset_for
from heptstudy.estimate.plans import FIT_CALIBRATION_EVENTS, predictor_for
from heptstudy.fitting.auto import evaluate_auto
from heptstudy.fitting.reports import expand_report_paths
from heptstudy.measure.report import read_report
from heptstudy.scenario import find_platform


def _predictor(config, batch: int, platform, events):
    started = time.perf_counter()
    # every plan (an empty covering): the two calibrations are compared over the whole data
    predictor = predictor_for(
        config, torch.device("cpu"), batch, platform, calibration_events=events, covering=()
    )
    return predictor, time.perf_counter() - started


def check(path: Path, data_dir: str) -> dict:
    report = read_report(path)
    config = load_config(base=report.config, overrides=[f"data.data_dir={data_dir}"])
    platform = find_platform(report.environment.platform or "local_cpu")[0]
    b = report.batch_size
    slow, slow_s = _predictor(config, b, platform, None)
    fast, fast_s = _predictor(config, b, platform, FIT_CALIBRATION_EVENTS)
    steps = []
    for st in report.steps:
        s, f = slow.choose(st.geometry), fast.choose(st.geometry)
        steps.append(
            {
                "step": st.step,
                "geometry": st.geometry.words(),
                "plan_in_report": st.checkpoint_plan,
                "slow_plan": s.plan.name,
                "fast_plan": f.plan.name,
                "slow_peak_mib": round(s.predicted_peak_mib, 1),
                "fast_peak_mib": round(f.predicted_peak_mib, 1),
            }
        )
    lengths = dataset_for(config, "train").lengths()
    over_data = {
        kind: evaluate_auto(predictor, lengths, b, packed=report.packed).plan_fractions
        for kind, predictor in (("slow", slow), ("fast", fast))
    }
    return {
        "report": path.name,
        "batch_size": b,
        "batching": report.geometry.batching,
        "budget_mib": slow.budget_mib,
        "calibration_s": {"slow": round(slow_s, 1), "fast": round(fast_s, 1)},
        "steps": steps,
        "plan_fractions_over_the_data": over_data,
        "agree": all(x["slow_plan"] == x["fast_plan"] for x in steps)
        and over_data["slow"] == over_data["fast"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    results = []
    for path in expand_report_paths(args.reports):
        report = read_report(path)
        if (
            report.kind == "memory"
            and report.status == "ok"
            and report.checkpointing.plan == "auto"
        ):
            results.append(check(path, args.data_dir))
            print(json.dumps(results[-1], indent=1))
    text = json_text(
        {
            "what": __doc__.split("\n\n")[0],
            "fast_calibration_events": FIT_CALIBRATION_EVENTS,
            "synthetic_data": True,
            "runs": results,
        },
        "the agreement check",
    )
    atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
