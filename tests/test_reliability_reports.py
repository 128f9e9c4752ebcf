"""Inputs checked before they are trusted (issue 44): matrix keys as ``study run`` reads them,
YAML that holds itself, reports that contradict themselves or their neighbours, and a single
measurement that says when it cannot be trusted."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import yaml

from heptstudy.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exit_:
            code = exit_.code
    assert "Traceback" not in err.getvalue()
    return code, out.getvalue(), err.getvalue()


# ------------------------------------------------------------------------- matrix and YAML


@pytest.mark.parametrize("value", ["abc", -5, 0, 2.5, True])
def test_study_check_refuses_a_cell_timeout_study_run_could_not_use(value, tmp_path):
    matrix = yaml.safe_load((ROOT / "configs/study/tiny.yaml").read_text())
    matrix["cell_timeout_s"] = value
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(matrix))
    code, said, err = _cli("study", "check", "--matrix", str(path))
    assert code == 2 and said == ""
    assert f"cell_timeout_s={value!r}" in err and "m.yaml" in err and ">= 1" in err


def test_study_check_takes_no_cell_timeout_as_no_limit(tmp_path):
    from heptstudy.study.matrix import load_matrix

    matrix = yaml.safe_load((ROOT / "configs/study/tiny.yaml").read_text())
    matrix["cell_timeout_s"] = None
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(matrix))
    assert load_matrix(path).cell_timeout_s is None
    assert load_matrix(ROOT / "configs/study/tiny.yaml").cell_timeout_s == 600


@pytest.mark.parametrize(
    "text,where",
    [
        ("train: &t {lamb: *t}\n", "'train'"),
        ("data: {configs: &c [*c]}\n", "'data.configs'"),
        ("&top {model: *top}\n", "the top level"),
    ],
)
@pytest.mark.parametrize("command", ["train", "study"])
def test_a_yaml_alias_that_holds_itself_is_refused_by_name(text, where, command, tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text(text)
    argv = ["train", "--config", str(path)] if command == "train" else ["study", "check"]
    if command == "study":
        argv += ["--matrix", str(path)]
    code, said, err = _cli(*argv)
    assert code == 2 and said == ""
    assert "loop.yaml" in err and "contains itself through a YAML alias" in err
    assert where.strip("'") in err


def test_a_shared_yaml_alias_is_read_once_and_kept(tmp_path):
    """A non-recursive alias is ordinary YAML; an alias bomb costs one walk per shared value."""
    from heptstudy.config import read_yaml

    bomb = "a: &a [x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(20)
    )
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb)
    assert read_yaml(path, "configuration")["b"] == [["x", "x"], ["x", "x"]]


# ------------------------------------------------------------------------- reports as input

MIB = 2**20


def _report(name, plan, *, steps=((1.0, 100, 120),), host="h1", commit="c1", torch_="2.9", **env):
    """A consistent memory report: ``steps`` as (wall s, peak allocated MiB, CPU s), after one
    warm-up step; its summary and memory categories agree with them."""
    from heptstudy.config import load_config
    from heptstudy.measure import report as rp

    environment = rp.environment_info("cpu", "float32", "local_cpu", fresh_process=True)
    environment = environment.model_copy(
        update={"hostname": host, "git_commit": commit, "torch_version": torch_, **env}
    )
    records = [
        rp.StepRecord(
            step=0,
            counted=False,
            event_indices=[0],
            hits=[9],
            padded_hits=[16],
            time_s=2.0,
            peak_allocated_mib=1.0,
            peak_reserved_mib=2.0,
        )
    ]
    for i, (wall, alloc, cpu) in enumerate(steps, start=1):
        records.append(
            rp.StepRecord(
                step=i,
                counted=True,
                event_indices=[i],
                hits=[9],
                padded_hits=[16],
                time_s=wall,
                peak_allocated_mib=float(alloc),
                peak_reserved_mib=float(alloc + 10),
                user_time_s=cpu,
                system_time_s=0.0,
            )
        )
    counted = records[1:]
    top = max(counted, key=lambda r: r.peak_allocated_mib)
    return rp.BenchReport(
        kind="memory",
        status="ok",
        name=name,
        environment=environment,
        data=rp.DataInfo(dataset="d:1", data_dir=None, synthetic=True, split="train"),
        config=load_config(overrides=[f"model.heptv2.activation_checkpointing={plan}"]).to_dict(),
        batch_size=4,
        checkpointing=rp.Checkpointing(plan=plan),
        steps=records,
        summary=rp.Summary(
            counted_steps=len(counted),
            warmup_steps=1,
            mean_step_time_s=sum(r.time_s for r in counted) / len(counted),
            max_peak_allocated_mib=top.peak_allocated_mib,
            max_peak_reserved_mib=top.peak_reserved_mib,
        ),
        memory_categories=[
            rp.MemoryCategories(
                step=top.step,
                peak_bytes=int(top.peak_allocated_mib) * MIB,
                at_peak_bytes={"parameters": int(top.peak_allocated_mib) * MIB},
                note="",
            )
        ],
    )


def _write(folder: Path, report) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{report.name}.json"
    path.write_text(report.model_dump_json())
    return path


def _edited(path: Path, edit) -> Path:
    import json

    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return path


def _times_ten(r):
    for st in r["steps"]:
        st["peak_allocated_mib"] *= 10
    r["summary"]["max_peak_allocated_mib"] *= 10


def _no_steps(r):
    r["steps"], r["summary"]["counted_steps"] = [], 0


def _mean_off(r):
    r["summary"]["mean_step_time_s"] *= 2


def _zero_time(r):
    r["steps"][1]["time_s"] = 0.0


@pytest.mark.parametrize(
    "edit,field",
    [
        (_times_ten, "steps.1.peak_allocated_mib"),  # the categories still say the truth
        (_no_steps, "summary.counted_steps"),
        (_mean_off, "summary.mean_step_time_s"),
        (_zero_time, "steps.1.time_s"),
    ],
    ids=["peaks-times-ten", "no-counted-steps", "mean-not-of-its-steps", "zero-time"],
)
def test_a_report_that_contradicts_itself_is_refused_by_every_reader(edit, field, tmp_path):
    from heptstudy.fitting.reports import read_groups
    from heptstudy.measure.report import ReportError
    from heptstudy.measure.report_checks import checked_report
    from heptstudy.study.frames import comparison_frame, load_study, reports_frame

    study = tmp_path / "study"
    _write(study, _report("baseline_b4", "off", steps=((1.0, 100, 1.0), (1.2, 110, 1.2))))
    bad = _edited(_write(study, _report("checkpointed_b4", "full")), edit)
    with pytest.raises(ReportError) as err:
        checked_report(bad)
    assert "checkpointed_b4.json" in str(err.value) and field in str(err.value)
    groups, rejected = read_groups([study])  # fit --reports
    assert [r.path for r in rejected] == [str(bad)] and field in rejected[0].reason
    assert [Path(f).name for g in groups for f in g.files] == ["baseline_b4.json"]
    with pytest.warns(UserWarning, match="checkpointed_b4.json"):  # aggregate: named, left out
        reports = load_study(study)
    assert [p.name for p, _ in reports] == ["baseline_b4.json"]
    assert comparison_frame(reports_frame(reports)).empty  # no memory cut from the edited one


def test_study_aggregate_refuses_a_folder_that_holds_no_study(tmp_path):
    import shutil

    empty = tmp_path / "empty"
    empty.mkdir()
    fits = tmp_path / "fit"
    shutil.copytree(ROOT / "configs" / "fit", fits)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for folder, words in ((empty, "no report files"), (fits, "none of its JSON files")):
        code, said, err = _cli("study", "aggregate", "--out", str(folder))
        assert code == 2 and said == ""
        assert str(folder) in err and "holds no study" in err and words in err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def _frames(folder):
    from heptstudy.study.frames import load_study, reports_frame

    return reports_frame(load_study(folder))


@pytest.mark.parametrize(
    "differ,words",
    [
        ({"host": "h2"}, "machines (h1 vs h2)"),
        ({"commit": "c2"}, "commits (c1 vs c2)"),
        ({"torch_": "2.10"}, "PyTorch versions (2.9 vs 2.10)"),
    ],
)
@pytest.mark.filterwarnings("ignore:No artists with labels")  # the figure has no bar to draw
def test_runs_of_different_setups_are_never_paired(differ, words, tmp_path):
    from heptstudy.plots import overhead_spread_figure
    from heptstudy.study.frames import comparison_frame, overhead_frame, policy_frame
    from heptstudy.study.tables import comparison_table

    same = tmp_path / "same"
    _write(same, _report("baseline_b4", "off", steps=((1.0, 200, 1.0),)))
    _write(same, _report("checkpointed_b4", "full", steps=((1.5, 100, 1.5),)))
    row = comparison_frame(_frames(same)).iloc[0]
    assert row["allocated_reduction_pct"] == pytest.approx(50.0)
    assert row["step_time_overhead_pct"] == pytest.approx(50.0) and row["flag"] == ""

    apart = tmp_path / "apart"
    _write(apart, _report("baseline_b4", "off", steps=((1.0, 200, 1.0),)))
    _write(apart, _report("checkpointed_b4", "full", steps=((1.5, 100, 1.5),), **differ))
    df = _frames(apart)
    row = comparison_frame(df).iloc[0]
    assert (
        row["allocated_reduction_pct"] is None
        or row["allocated_reduction_pct"] != row["allocated_reduction_pct"]
    )
    assert row["step_time_overhead_pct"] != row["step_time_overhead_pct"]  # NaN: not computed
    assert "not compared: measured on different " + words in row["flag"]
    assert words in " ".join(comparison_table(comparison_frame(df))["flag"])
    over = overhead_frame(df).iloc[0]
    assert over["rounds"] == 0 and words in over["flag"]
    texts = [t.get_text() for t in overhead_spread_figure(overhead_frame(df)).axes[0].texts]
    assert not [t for t in texts if "nan" in t]  # no bar drawn for runs not compared
    assert policy_frame(df, min_policies=1).set_index("policy").loc["full", "flag"].count(words)


# ------------------------------------------------------------------ a measurement's own trust


def test_a_busy_host_and_stalled_steps_are_flagged_in_summary_and_study(tmp_path):
    from heptstudy.measure.report_checks import untrusted
    from heptstudy.measure.summary import describe
    from heptstudy.study.frames import comparison_frame
    from heptstudy.study.tables import runs_table
    from heptstudy.study.text import study_statement

    quiet = _report("baseline_b4", "off", steps=((1.0, 200, 1.0), (1.0, 200, 1.9)))
    assert untrusted(quiet) == [] and "not to be trusted" not in describe(quiet)
    busy = _report("baseline_b4", "off", load_average_1min=4.0, threads=2)
    assert [w.split(":")[0] for w in untrusted(busy)] == ["busy host"]
    assert "load average was 4.0" in describe(busy) and "2 threads" in describe(busy)
    stopped = _report("checkpointed_b4", "full", steps=((1.0, 100, 1.0), (2.7, 100, 1.4)))
    (why,) = untrusted(stopped)
    assert why.startswith("stalled steps: 1 of 2") and "step 2: 2.70 s wall, 1.40 s CPU" in why
    assert "not to be trusted: stalled steps" in describe(stopped)

    _write(tmp_path / "none", quiet)
    study = tmp_path / "study"
    _write(study, busy)
    _write(study, stopped)
    df = _frames(study)
    text = study_statement(df)
    assert "not to be trusted:** baseline_b4: busy host" in text
    assert "checkpointed_b4: stalled steps" in text
    flag = comparison_frame(df).iloc[0]["flag"]
    assert "step times not to be trusted (off: busy host; full: stalled steps)" in flag
    runs = runs_table(df).set_index("run")["step time not to be trusted"]
    assert runs["baseline_b4"].startswith("busy host") and runs["checkpointed_b4"].startswith(
        "stalled steps"
    )
    assert "step time not to be trusted" not in runs_table(_frames(tmp_path / "none")).columns


def test_bench_prints_and_notes_a_busy_host(tmp_path, tiny_data_dir, monkeypatch):
    import json
    import os

    from tests.conftest import TINY_MODEL

    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    out = tmp_path / "b1.json"
    argv = ["bench", "--batch-size", "1", "--passes", "timing", "--steps", "1", "--warmup", "0"]
    argv += ["--data-dir", str(tiny_data_dir), "--output", str(out), "--no-progress"]
    code, said, err = _cli(*argv, *[a for o in TINY_MODEL for a in ("--set", o)])
    assert code == 0, err
    assert "not to be trusted: busy host: the 1-minute load average was 64.0" in said
    notes = json.loads(out.read_text())["notes"]
    assert any(n.startswith("busy host: the 1-minute load average was 64.0") for n in notes)
