"""scripts/compare_study_memory.py: a study reproduces the reference's memory when the events and
every counted step's peak allocated are the same; a warm-up step's peak is listed, not judged."""

import json
import runpy
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPARE = runpy.run_path(str(ROOT / "scripts" / "compare_study_memory.py"))["main"]
REPORT = "checkpointed_keep20_b4.json"


def _folders(tmp_path: Path, edit) -> tuple[Path, Path]:
    """A reference holding one committed report, and a study holding it edited by ``edit``."""
    reference, study = tmp_path / "reference", tmp_path / "study"
    for folder in (reference, study):
        folder.mkdir()
    shutil.copy(ROOT / "experiments" / "cpu_reference" / REPORT, reference / REPORT)
    data = json.loads((reference / REPORT).read_text())
    edit(data["steps"])
    (study / REPORT).write_text(json.dumps(data))
    return study, reference


def _shift_peak(steps, counted: bool) -> None:
    step = next(s for s in steps if s["counted"] is counted)
    step["peak_allocated_mib"] += 1.0


def test_the_same_reports_reproduce(tmp_path, capsys):
    study, reference = _folders(tmp_path, lambda steps: None)
    # a study's paired timings (step times, no peaks) are passed over, not read as reports
    for folder in (study, reference):
        (folder / "paired").mkdir()
        shutil.copy(
            ROOT / "experiments" / "cpu_reference" / "paired" / "paired_b4.json", folder / "paired"
        )
    assert COMPARE([str(study), str(reference)]) == 0
    out = capsys.readouterr().out
    assert "| identical |" in out and "paired_b4" not in out


def test_a_counted_step_s_peak_that_moved_fails(tmp_path, capsys):
    study, reference = _folders(tmp_path, lambda steps: _shift_peak(steps, counted=True))
    assert COMPARE([str(study), str(reference)]) == 1
    assert "DIFFERENT" in capsys.readouterr().out


def test_other_events_fail(tmp_path, capsys):
    def other_events(steps):
        steps[-1]["event_indices"] = [i + 1 for i in steps[-1]["event_indices"]]

    study, reference = _folders(tmp_path, other_events)
    assert COMPARE([str(study), str(reference)]) == 1
    assert "| DIFFERENT |" in capsys.readouterr().out


def test_a_warm_up_step_s_peak_is_listed_not_judged(tmp_path, capsys):
    study, reference = _folders(tmp_path, lambda steps: _shift_peak(steps, counted=False))
    assert COMPARE([str(study), str(reference)]) == 0
    assert "identical (warm-up step +1.00 MiB, not a figure)" in capsys.readouterr().out


def test_a_folder_that_is_not_a_study_is_refused_not_passed(tmp_path, capsys):
    """A mistyped folder, or one with no report in common, compares nothing: that is an error,
    not a reproduction (exit 0 said "0 differing" before)."""
    study, reference = _folders(tmp_path, lambda steps: None)
    with pytest.raises(SystemExit) as missing:
        COMPARE([str(tmp_path / "typo"), str(reference)])
    assert missing.value.code == 2 and "study " in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit) as nothing:
        COMPARE([str(empty), str(reference)])
    assert nothing.value.code == 2 and "nothing was compared" in capsys.readouterr().err
    (study / REPORT).write_text("{not json")
    with pytest.raises(SystemExit) as broken:
        COMPARE([str(study), str(reference)])
    err = capsys.readouterr().err
    assert broken.value.code == 2 and REPORT in err and "Traceback" not in err
