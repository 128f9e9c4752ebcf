"""``heptstudy fit validate``: the estimator held to committed measured reports, and every value
it reads from a report checked before it is used."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from heptstudy.cli import main
from heptstudy.data.generate import generate_datasets
from heptstudy.estimate.validation import ALLOCATED_TOLERANCE

REPO = Path(__file__).resolve().parents[1]
CPU_REFERENCE = REPO / "experiments" / "cpu_reference"
#: The batch-1 report of the committed CPU reference: the cheapest to estimate (one event a step).
REPORT = CPU_REFERENCE / "baseline_b1.json"
#: A commit of this repository whose model code is not the running code's (the H200 reports').
OLDER_MODEL = "9a5529cdf8da7b06cd08d9c40f633f7e3bab747d"


@pytest.fixture(scope="module")
def reference_data(tmp_path_factory):
    """The reference's data set (``data generate --seed 20261014``), cut to the events the report
    measured: each event's random stream depends only on seed, config, split and index, so the
    first ``max(index) + 1`` events are those of the full set."""
    report = json.loads(REPORT.read_text())
    last = max(i for step in report["steps"] for i in step["event_indices"])
    data_dir = tmp_path_factory.mktemp("reference_tfds")
    generate_datasets(
        data_dir,
        events_train=last + 1,
        events_test=1,
        seed=20261014,
        configs=("1",),
        progress=False,
    )
    return data_dir


def test_a_bench_of_the_running_code_is_estimated_within_tolerance(tiny_data_dir, tmp_path, capsys):
    """The estimator follows the running step: a tiny checkpointed bench measured now (the
    recomputation in backward is what the estimator must follow; the reference below is off),
    and the running code's fake step on the same events, agree on the allocated peak."""
    from heptstudy.measure import bench
    from tests.conftest import tiny_request

    report = tmp_path / "report.json"
    request = tiny_request(
        tiny_data_dir, report, batch_size=2, steps=1, warmup=1, checkpointing="full"
    )
    bench.run_bench(request.resolve())
    out = tmp_path / "validation"
    rc = main(
        ["fit", "validate", "--reports", str(report), "--data-dir", str(tiny_data_dir)]
        + ["--code", "running", "--out", str(out)]
    )
    printed = capsys.readouterr().out
    (row,) = json.loads((out / "validation.json").read_text())["rows"]
    assert abs(row["allocated_error"]) <= ALLOCATED_TOLERANCE, printed
    assert rc == 0 and row["within_tolerance"]


def test_the_cpu_reference_is_estimated_within_tolerance(reference_data, tmp_path, capsys):
    """The running code's fake step on the report's own events gives the CPU bench's allocated
    peak within the tolerance: a change of the step that the estimator does not follow, or of
    the estimator, fails here."""
    # The committed figure is the thing under test: it is the full-size measurement the
    # documents quote, so a step whose memory moved away from it fails here until the
    # reference is re-measured, and the committed figures stay those of the running code (the
    # tiny bench above checks the estimator against the running step itself).
    out = tmp_path / "validation"
    rc = main(
        ["fit", "validate", "--reports", str(REPORT), "--data-dir", str(reference_data)]
        + ["--code", "running", "--out", str(out)]
    )
    printed = capsys.readouterr().out
    doc = json.loads((out / "validation.json").read_text())
    (row,) = doc["rows"]
    assert abs(row["allocated_error"]) <= ALLOCATED_TOLERANCE, printed
    assert rc == 0 and row["within_tolerance"]
    counted = [s["step"] for s in json.loads(REPORT.read_text())["steps"] if s["counted"]]
    assert [s["step"] for s in row["estimated_steps"]] == counted
    assert row["reserved_error"] is None  # the CPU has no caching allocator to compare
    assert (out / "table.md").read_text().strip() in printed


def _bad(tmp_path: Path, name: str, edit) -> Path:
    # the committed report is a well-formed template, broken by ``edit``; its figures are not
    # under test
    data = json.loads(REPORT.read_text())
    data = edit(copy.deepcopy(data))
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def _set(path: str, value):
    def edit(data):
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[int(key) if isinstance(node, list) else key]
        node[last] = value
        return data

    return edit


@pytest.mark.parametrize(
    "name, edit, words",
    [
        ("version", _set("schema_version", "heptstudy.bench/99"), ["schema_version", "bench/99"]),
        (
            "negative",
            _set("summary.max_peak_allocated_mib", -5.0),
            ["max_peak_allocated_mib", "-5"],
        ),
        ("zero", _set("summary.max_peak_allocated_mib", 0.0), ["max_peak_allocated_mib", "0"]),
        ("list", lambda data: [data], ["JSON object", "list"]),
        ("hits", _set("steps.1.hits", [1, 2]), ["steps [1]", "event_indices"]),
        ("unknown", _set("environment.git_commit", "f" * 40), ["git_commit", "f" * 40, "--code"]),
        ("dirty", _set("environment.git_dirty", True), ["git_dirty", "--code"]),
        (
            "older",
            _set("environment.git_commit", OLDER_MODEL),
            ["model code", f"scripts/at_commit.sh {OLDER_MODEL[:9]} fit validate"],
        ),
    ],
)
def test_a_bad_report_is_refused_naming_file_field_and_value(tmp_path, capsys, name, edit, words):
    path = _bad(tmp_path, name, edit)
    rc = main(["fit", "validate", "--reports", str(path), "--data-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert str(path) in err and err.count("\n") <= 3
    for word in words:
        assert word in err


def test_a_code_that_is_no_commit_is_refused(tmp_path, capsys):
    rc = main(
        ["fit", "validate", "--reports", str(REPORT), "--data-dir", str(tmp_path)]
        + ["--code", "nosuchcommit"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "--code 'nosuchcommit' is no commit" in err and "Traceback" not in err


def test_reports_of_other_data_are_refused(tmp_path, capsys):
    """Another data set than the one measured: the hits of the report's events differ."""
    tiny = tmp_path / "tfds"
    generate_datasets(
        tiny,
        events_train=104,
        events_test=1,
        seed=7,
        configs=("1",),
        occupancy_scale=0.03,
        progress=False,
    )
    rc = main(
        ["fit", "validate", "--reports", str(REPORT), "--data-dir", str(tiny), "--code", "running"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "hits" in err and "--data-dir" in err and "Traceback" not in err


def test_a_folder_without_memory_reports_says_why_each_is_skipped(tmp_path, capsys):
    for name in ("parity_deterministic_b1.json", "auto_b4.json"):
        (tmp_path / name).write_text((CPU_REFERENCE / name).read_text())
    rc = main(["fit", "validate", "--reports", str(tmp_path), "--data-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert (
        "parity_deterministic_b1.json: a parity report" in err
        and "auto_b4.json: activation_checkpointing=auto" in err
    )


def test_a_paired_timing_is_named_as_one_by_validate_and_fit(reference_data, tmp_path, capsys):
    """A study's paired/ timings hold step times, not peaks: given as a report, each command says
    what the file is, not that its schema version is missing."""
    paired = CPU_REFERENCE / "paired" / "paired_b4.json"
    rc = main(["fit", "validate", "--reports", str(paired), "--data-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "a paired timing (`heptstudy bench paired`" in err
    assert "schema_version" not in err
    rc = main(
        ["fit", "--platform", "local_cpu", "--per-device-batch", "4", "--reports", str(paired)]
        + ["--data-dir", str(reference_data)]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "paired_b4.json: a paired timing: step times, no peaks" in err


def test_an_event_the_data_does_not_hold_is_refused_naming_the_report(
    reference_data, tmp_path, capsys
):
    path = _bad(tmp_path, "range", _set("steps.1.event_indices", [5000]))
    args = ["--reports", str(path), "--data-dir", str(reference_data), "--code", "running"]
    rc = main(["fit", "validate", *args])
    err = capsys.readouterr().err
    assert rc == 2 and str(path) in err and "5000" in err and "Traceback" not in err


def test_at_commit_runs_that_commits_own_code_from_a_worktree(tmp_path):
    """scripts/at_commit.sh: the commit's own `heptstudy`, relative report paths naming that
    commit's files, --data-dir made absolute from where it was started."""
    (tmp_path / "data").mkdir()
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    done = subprocess.run(
        [str(REPO / "scripts" / "at_commit.sh"), "HEAD", "fit", "validate", "--reports"]
        + ["experiments/cpu_reference/parity_deterministic_b1.json", "--data-dir", "data"],
        cwd=tmp_path,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    assert f"at commit {head[:9]}" in done.stderr
    assert (
        "parity_deterministic_b1.json: a parity report" in done.stderr
    )  # read in the worktree, not here
    worktrees = subprocess.run(
        ["git", "worktree", "list"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert "heptstudy-at-" not in worktrees  # removed at the end
