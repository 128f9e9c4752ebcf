"""`heptstudy bench paired`: plans timed between off steps in one process."""

import json

import pytest

from heptstudy.measure.paired import overheads
from tests.conftest import TINY_MODEL, run_cli, set_options


def _step(plan, seconds, round_=1):
    return {"round": round_, "plan": plan, "batch": 1, "time_s": seconds}


def test_overhead_is_time_over_the_mean_of_the_neighbouring_off_steps():
    steps = [
        _step("off", 10.0),
        _step("full", 15.0),
        _step("off", 14.0),
        _step("keep70", 12.6),
        _step("off", 11.2),
        _step("off", 10.0, 2),
        _step("keep70", 10.5, 2),
        _step("off", 10.0, 2),
        _step("full", 11.0, 2),
        _step("off", 12.0, 2),
    ]
    got = overheads(steps)
    assert list(got) == ["full", "keep70"]
    assert got["full"] == pytest.approx([15 / 12 - 1, 11 / 11 - 1])
    assert got["keep70"] == pytest.approx([12.6 / 12.6 - 1, 0.05])


def _paired(data_dir, out, *argv):
    return run_cli(
        "bench",
        "paired",
        *argv,
        "--batch-size",
        "2",
        "--data-dir",
        str(data_dir),
        *set_options(TINY_MODEL),
        "--output",
        str(out),
        "--no-progress",
    )


@pytest.mark.slow  # 13 steps of the tiny model
def test_paired_timing_alternates_off_with_each_plan_and_writes_its_report(tiny_data_dir, tmp_path):
    out = tmp_path / "paired_b2.json"
    code, said, err = _paired(tiny_data_dir, out, "full", "every2", "--rounds", "2")
    assert code == 0, err
    report = json.loads(out.read_text())
    assert report["kind"] == "paired_timing" and report["synthetic"] is True
    assert report["notes"] == ["data: synthetic (generated) events"]
    sequence = [(s["round"], s["plan"]) for s in report["steps"]]
    assert sequence == [
        *[(1, p) for p in ("off", "full", "off", "every2", "off")],
        *[(2, p) for p in ("off", "every2", "off", "full", "off")],  # the other way round
    ]
    # the rounds take the counted batches (after the one warm-up batch) in turn
    assert [s["batch"] for s in report["steps"]] == [1] * 5 + [2] * 5
    assert report["overhead"]["full"]["per_round"] == pytest.approx(
        overheads(report["steps"])["full"]
    )
    assert len(report["overhead"]["every2"]["per_round"]) == 2
    assert "paired_b2: 2 paired round(s) of 2, batch 2 padded" in said
    assert "synthetic events" in said and "every2" in said
    # a second run replaces the report it wrote, and only that kind of file
    code, _, err = _paired(tiny_data_dir, out, "full", "--rounds", "1")
    assert code == 0, err
    assert json.loads(out.read_text())["rounds"] == 1
    bench_report = tmp_path / "bench.json"
    bench_report.write_text('{"other": 1}\n')
    code, _, err = _paired(tiny_data_dir, bench_report, "full", "--rounds", "1")
    assert code == 2 and "paired-timing report" in err and "Traceback" not in err
    assert bench_report.read_text() == '{"other": 1}\n'


def test_auto_is_paired_running_the_plan_it_chooses_for_each_batch(tiny_data_dir, tmp_path):
    """auto between two off steps: on each batch the plan its predictor chooses within the budget,
    recorded with the step; a budget under the uncheckpointed peak makes it checkpoint."""
    out = tmp_path / "paired_b2.json"
    budget = ["--set", "model.heptv2.memory_budget_gib=0.0035"]  # 3.6 MiB: between full and off
    budget += ["--set", "model.heptv2.auto_plan_order=[full]"]  # one plan to calibrate
    code, said, err = _paired(tiny_data_dir, out, "auto", "every2", "--rounds", "2", *budget)
    assert code == 0, err
    report = json.loads(out.read_text())
    auto = [s for s in report["steps"] if s["plan"] == "auto"]
    # the warm-up batch and the two counted ones; each auto step ran its batch's plan: on the
    # tiny data, off fits the budget on one counted batch and not on the other
    assert len(report["auto_runs"]) == 3
    assert all(s["ran"] == report["auto_runs"][s["batch"]] for s in auto)
    assert sorted(s["ran"] for s in auto) == ["full", "off"]
    assert len(report["overhead"]["auto"]["per_round"]) == 2 and "auto" in said


@pytest.mark.parametrize(
    "argv, says",
    [
        (["off"], "plan 'off' cannot be paired (every plan is paired with it)"),
        (["full", "true"], "plan 'full' is named twice"),
        (["bogus"], "checkpointing='bogus' is not a checkpointing plan"),
        (["full", "--rounds", "0"], "--rounds 0 is not a whole number >= 1"),
    ],
)
def test_paired_timing_refuses_bad_plans_and_rounds_by_name(tiny_data_dir, tmp_path, argv, says):
    out = tmp_path / "paired.json"
    code, _, err = _paired(tiny_data_dir, out, *argv)
    assert code == 2 and says in err, err
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("stop_at, kept", [(2, 0), (6, 1)])
def test_ctrl_c_keeps_the_rounds_completed_before_it(
    tiny_data_dir, tmp_path, monkeypatch, stop_at, kept
):
    """Ctrl-C in the warm-up writes nothing; in round 2 the report holds round 1 and says so."""
    from heptstudy.measure import paired

    calls = []

    def interrupted_step(*args, **kwargs):
        calls.append(kwargs["plan"].name)
        if len(calls) == stop_at:  # warm-up: off, full; round 1: off, full, off; round 2: ...
            raise KeyboardInterrupt
        return run_step(*args, **kwargs)

    run_step = paired.run_step
    monkeypatch.setattr(paired, "run_step", interrupted_step)
    out = tmp_path / "paired_b2.json"
    code, _, err = _paired(tiny_data_dir, out, "full", "--rounds", "3")
    assert code == 130 and "Traceback" not in err
    if kept:
        report = json.loads(out.read_text())
        assert (report["rounds"], report["rounds_asked"]) == (1, 3)
        assert [s["plan"] for s in report["steps"]] == ["off", "full", "off"]
        assert f"the 1 round(s) completed of 3 are in {out}" in err
    else:
        assert not out.exists() and "no round was complete, so nothing was written" in err


@pytest.mark.parametrize(
    "edit, field, read",
    [
        (lambda r: r["steps"][0].update(time_s="fast"), "steps", False),
        (lambda r: r["overhead"]["full"].update(per_round=[]), "overhead", False),
        (lambda r: r.pop("environment"), "environment.device_kind", True),
        (lambda r: r["batches"][0].pop("geometry"), "batches", True),
        (lambda r: r["steps"][0].update(batch=99), "batches", True),
    ],
)
def test_a_paired_report_its_readers_cannot_read_is_refused_by_name(tmp_path, edit, field, read):
    """The study's tables read a paired timing's steps and overheads (an edited report is
    refused, naming the field, never a traceback later); fit's step times also its batches and
    configuration, and name a timing they cannot price instead of using it."""
    from pathlib import Path

    from heptstudy.config import load_config
    from heptstudy.errors import HeptstudyError
    from heptstudy.estimate.keys import model_key
    from heptstudy.fitting.api import _timed_reports
    from heptstudy.measure.paired import read_paired, unpriceable

    committed = Path(__file__).parents[1] / "experiments/study_paired_epyc/paired/paired_b4.json"
    report = json.loads(committed.read_text())
    assert unpriceable(read_paired(committed)) == []  # as measured: readable and priced
    edit(report)
    path = tmp_path / "paired_b4.json"
    path.write_text(json.dumps(report))
    if not read:
        with pytest.raises(HeptstudyError, match=f"whose {field} cannot be read"):
            read_paired(path)
        return
    assert unpriceable(read_paired(path)) == [field]
    config = load_config(overrides=["model.heptv2.attention_backend=plain"])
    bench, paired, other = _timed_reports([path], model_key(config.to_dict(), "cpu"))
    assert paired == [] and other == [f"paired_b4.json (its {field} cannot be read)"]


def test_the_notebook_reads_yaml_s_bare_true_as_the_plan_it_spells(tmp_path):
    """`papermill notebooks/paired.ipynb out.ipynb -y 'plans: [true, keep25]'`: YAML reads the
    bare word as a boolean; the notebook times the plan it spells, as checkpointing does."""
    from heptstudy.measure.paired import from_notebook
    from tests.test_request import prepared_namespace

    namespace = prepared_namespace(tmp_path, "paired", ["-y", "plans: [true, keep25]"])
    _, plans, _ = from_notebook(namespace)
    assert plans == ["full", "keep25"]
