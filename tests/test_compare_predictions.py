"""scripts/gpu/compare_predictions.py, the last step of a GPU session: GPU-like output folders
(the H200 evidence's reports with the commit they record edited) against blind predictions
committed in a temporary git repository, before or after the measured commit."""

import json
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from heptstudy.estimate import predictions
from heptstudy.estimate.predictions import PredictionsError, read_predictions

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu" / "compare_predictions.py"
EVIDENCE = REPO / "experiments" / "h200_2026-11-30"
MATRIX = REPO / "configs" / "study" / "gpu.yaml"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def _commit(repo: Path, message: str) -> str:
    _git(repo, "commit", "-q", "--allow-empty", "-am", message)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture
def committed(tmp_path):
    """The committed predictions with this code's fingerprint, committed in a new repository;
    returns (path, the commit that committed them)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    doc = read_predictions(REPO / predictions.PREDICTIONS)
    doc["fingerprint"] = predictions.fingerprint(
        MATRIX, [REPO / "configs/training/platforms/h100.yaml"]
    )
    path = repo / "predictions.json"
    path.write_text(json.dumps(doc, indent=2))
    _git(repo, "add", "predictions.json")
    return path, _commit(repo, "blind predictions")


def _session(tmp_path: Path, commit: str | None, *names: str, folder: str = "study") -> Path:
    """An output folder holding the H200 reports ``names`` (as NAME or SOURCE:NAME), each
    recording ``commit``."""
    out = tmp_path / "out"
    (out / folder).mkdir(parents=True, exist_ok=True)
    for name in names:
        source, _, target = name.partition(":")
        report = json.loads((EVIDENCE / f"{source}.json").read_text())
        report["environment"]["git_commit"] = commit
        (out / folder / f"{target or source}.json").write_text(json.dumps(report))
    return out


def _compare(out, path, capsys):
    rc = runpy.run_path(str(SCRIPT))["main"]([str(out), "--predictions", str(path)])
    printed = capsys.readouterr()
    return rc, printed.out + printed.err


def test_one_report_measured_after_the_predictions_is_blind(tmp_path, committed, capsys):
    path, made = committed
    measured = _commit(path.parent, "the code the GPU measures")
    out = _session(tmp_path, measured, "checkpointed_b48", "parity_deterministic_b1")
    rc, text = _compare(out, path, capsys)
    assert rc == 0, text
    assert f"last changed in commit {made}" in text and f"measured: {measured}" in text
    assert "shown blind" in text and "NOT" not in text
    rows = json.loads((out / "predictions_vs_measured.json").read_text())["rows"]
    row = next(r for r in rows if r["run"] == "study/checkpointed_b48")
    measured_report = json.loads((EVIDENCE / "checkpointed_b48.json").read_text())["summary"]
    predicted = read_predictions(path)["runs"]["checkpointed_b48"]
    assert row["allocated_error"] == pytest.approx(
        predicted["allocated_mib"] / measured_report["max_peak_allocated_mib"] - 1
    )
    parity = next(r for r in rows if r["run"] == "study/parity_deterministic_b1")
    assert parity["not_predicted"] == "parity run: no memory figure"
    assert "study/checkpointed_b48" in (out / "predictions_vs_measured.md").read_text()


def test_the_commit_comes_from_env_txt_when_reports_record_none(tmp_path, committed, capsys):
    path, made = committed
    out = _session(tmp_path, None, "checkpointed_b48")
    rc, text = _compare(out, path, capsys)
    assert rc == 3 and "the reports record no git commit" in text
    (out / "env.txt").write_text(f"torch 2.11\ncommit {made}\n")
    rc, text = _compare(out, path, capsys)
    assert rc == 0 and f"measured: {made}" in text, text


def test_no_folder_or_no_reports_is_an_error(tmp_path, committed, capsys):
    path, _ = committed
    rc, text = _compare(tmp_path / "missing", path, capsys)
    assert rc == 1 and "missing: no such folder" in text
    (tmp_path / "empty" / "study").mkdir(parents=True)
    rc, text = _compare(tmp_path / "empty", path, capsys)
    assert rc == 1 and "holds no bench reports" in text
    assert not (tmp_path / "empty" / "predictions_vs_measured.md").exists()


def test_an_unpredicted_report_is_listed(tmp_path, committed, capsys):
    path, made = committed
    out = _session(tmp_path, made, "baseline_b4:baseline_b2")
    rc, text = _compare(out, path, capsys)
    assert rc == 1 and "none of the 1 reports" in text
    assert f"study/baseline_b2 | ok, not predicted: no prediction named baseline_b2 in {path}" in (
        text
    )
    _session(tmp_path, made, "checkpointed_b48")
    _session(tmp_path, made, "checkpointed_b4", folder="fused")
    rc, text = _compare(out, path, capsys)
    assert rc == 0, text
    assert "study/baseline_b2 | ok, not predicted" in text
    assert "fused/checkpointed_b4 | ok, not predicted: fused/ is not predicted" in text


def test_predictions_changed_after_the_measured_commit_are_not_blind(tmp_path, committed, capsys):
    path, made = committed
    measured = _commit(path.parent, "the code the GPU measures")
    out = _session(tmp_path, measured, "checkpointed_b48")
    doc = json.loads(path.read_text())
    doc["runs"]["checkpointed_b48"]["allocated_mib"] *= 1.5
    path.write_text(json.dumps(doc))
    rc, text = _compare(out, path, capsys)
    assert rc == 3 and "has changes that are not committed" in text
    changed = _commit(path.parent, "predictions edited after the measurement")
    rc, text = _compare(out, path, capsys)
    assert rc == 3, text
    assert f"last changed in commit {changed}" in text and f"measured: {measured}" in text
    assert f"last changed in {changed[:12]}, which is not the measured commit {measured[:12]}" in (
        text
    )
    rows = json.loads((out / "predictions_vs_measured.json").read_text())
    assert rows["blind"] is False


def test_git_age_of_an_uncommitted_file_and_an_unknown_commit(tmp_path, committed):
    git_age = runpy.run_path(str(SCRIPT))["git_age"]
    path, made = committed
    assert git_age(path, [made]).problems == []
    assert "is not in this repository" in git_age(path, ["0" * 40]).problems[0]
    loose = path.parent / "loose.json"
    loose.write_text("{}")
    age = git_age(loose, [made])
    assert age.committed is None and "is not committed" in age.problems[0]
    outside = tmp_path / "elsewhere" / "p.json"
    outside.parent.mkdir()
    shutil.copy(path, outside)
    assert "not in a git checkout" in git_age(outside, [made]).problems[0]


def _edited(tmp_path: Path, edit) -> Path:
    doc = json.loads((REPO / predictions.PREDICTIONS).read_text())
    doc = edit(doc) or doc
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc))  # json writes NaN and Infinity as given
    return path


def _run(doc):
    return doc["runs"]["checkpointed_b48"]


CASES = {
    "negative": (lambda d: _run(d).update(allocated_mib=-100.0), "allocated_mib is -100.0"),
    "string": (lambda d: _run(d).update(reserved_mib="15244"), 'reserved_mib is "15244"'),
    "bool": (lambda d: _run(d).update(reserved_mib=True), "reserved_mib is true"),
    "nan": (lambda d: _run(d).update(allocated_mib=float("nan")), "allocated_mib is NaN"),
    "infinity": (lambda d: _run(d).update(seconds=float("inf")), "seconds is Infinity"),
    "missing": (lambda d: _run(d).pop("reserved_mib") and None, "reserved_mib is null"),
    "below": (lambda d: _run(d).update(reserved_mib=1.0), "reserved_mib is 1.0"),
    "run list": (lambda d: d["runs"].update(checkpointed_b48=[1]), "is a JSON list"),
    "file list": (lambda d: [d], "the file is a JSON list"),
    "schema": (lambda d: d.update(schema="x/9"), 'schema is "x/9"'),
}


@pytest.mark.parametrize("case", list(CASES))
def test_impossible_predictions_are_refused(tmp_path, case):
    edit, said = CASES[case]
    path = _edited(tmp_path, edit)
    with pytest.raises(PredictionsError) as err:
        read_predictions(path)
    assert str(path) in str(err.value) and said in str(err.value)
    assert "allowed:" in str(err.value) and "regenerate it with" in str(err.value)


def test_the_script_refuses_impossible_predictions_without_a_traceback(tmp_path):
    path = _edited(tmp_path, lambda d: [d])
    out = _session(tmp_path, "abc", "checkpointed_b48")
    res = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "--predictions", str(path)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert f"error: {path}: the file is a JSON list" in res.stderr
