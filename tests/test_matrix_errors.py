"""A study matrix that cannot be used is refused with a message naming the file, the key and the
value, never a traceback and never a silent fix: its top-level keys (``defaults``, ``notes``,
``description``), a run whose configuration cannot be built, and a run that needs more events
than its data set holds, refused by ``study check`` as ``study run`` would refuse them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from heptstudy.study.common import StudyError
from heptstudy.study.matrix import check_event_counts, load_matrix
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
TINY = yaml.safe_load((ROOT / "configs/study/tiny.yaml").read_text())


def _matrix(tmp_path: Path, runs: list | None = None, **top) -> Path:
    """configs/study/tiny.yaml with ``top`` replacing its top-level keys (and ``runs``)."""
    data = {**TINY, **top, **({"runs": runs} if runs is not None else {})}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ------------------------------------------------------------------- top-level keys


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        *[("defaults", v, ("mapping", "leave the key out")) for v in ([1], 5, "abc")],
        *[("notes", v, ("list of strings",)) for v in (5, "a note", {"a": "note"})],
        *[("description", v, ("one string",)) for v in (["a"], 5, {"a": 1})],
    ],
)
def test_a_top_level_key_of_the_wrong_type_is_refused_by_name(key, value, words, tmp_path):
    with pytest.raises(StudyError) as err:
        load_matrix(_matrix(tmp_path, **{key: value}))
    said = str(err.value)
    assert "m.yaml" in said and f"{key}={value!r} is not allowed" in said
    assert all(w in said for w in words), said


def test_a_note_that_is_no_string_is_refused_by_name(tmp_path):
    with pytest.raises(StudyError, match=r"m\.yaml: notes item 2, 5, is not allowed.*string"):
        load_matrix(_matrix(tmp_path, notes=["first", 5]))


def test_strings_notes_and_no_keys_read_as_given(tmp_path):
    m = load_matrix(_matrix(tmp_path, notes=["one note", "two"], description="text"))
    assert m.notes == ["one note", "two"] and m.description == "text"
    m = load_matrix(_matrix(tmp_path, notes=None, description=None, defaults=None))
    assert m.notes == [] and m.description == ""


# ------------------------------------------------------- runs whose configuration fails


@pytest.mark.parametrize(
    "run, says",
    [
        ({"overrides": ["model.heptv2.width=-1"]}, "model.heptv2.width=-1 is not allowed"),
        ({"overrides": ["foo=1"]}, "unknown key foo=1"),
        # the tiny model has 3 layers (model.heptv2.num_convs=3)
        ({"checkpointing": "layers9"}, "layers9 checkpoints 9 of the backbone's 3 layers"),
    ],
)
def test_a_run_whose_configuration_is_refused_is_refused_by_index_and_name(run, says, tmp_path):
    path = _matrix(tmp_path, runs=[{"batch_size": 2}, {"batch_size": 2, **run}])
    with pytest.raises(StudyError) as err:
        load_matrix(path)
    said = str(err.value)
    assert "m.yaml, run 2 (" in said and says in said, said


def test_a_paired_run_naming_a_plan_twice_is_refused(tmp_path):
    run = {"notebook": "paired", "batch_size": 2, "plans": ["full", "full"], "rounds": 2}
    with pytest.raises(StudyError) as err:
        load_matrix(_matrix(tmp_path, runs=[run]))
    said = str(err.value)
    assert "m.yaml, run 1 (paired_b2): plans=['full', 'full']" in said
    assert "plan 'full' is named twice" in said and "bench" not in said


def test_a_run_needing_more_events_than_its_data_set_holds_is_refused(tmp_path, tiny_data_dir):
    huge = 10**30
    path = _matrix(tmp_path, runs=[{"batch_size": 2}, {"batch_size": huge}])
    m = load_matrix(path, data_dir=str(tiny_data_dir))
    with pytest.raises(StudyError) as err:
        check_event_counts(m)
    said = str(err.value)
    assert "m.yaml" in said and f"run 2 (baseline_b{huge}): batch_size={huge}" in said
    assert "run 1 " not in said and "holds 24" in said


def test_events_are_not_counted_where_the_data_set_is_not_there_and_that_is_said(tmp_path):
    m = load_matrix(_matrix(tmp_path), data_dir=str(tmp_path / "absent"))
    (note,) = check_event_counts(m)
    assert str(tmp_path / "absent") in note and "not counted" in note and "does not exist" in note


def test_study_check_refuses_a_run_that_can_only_fail(tmp_path, tiny_data_dir):
    path = _matrix(tmp_path, runs=[{"batch_size": 2, "overrides": ["model.heptv2.width=-1"]}])
    code, said, err = run_cli("study", "check", "--matrix", str(path))
    assert code == 2 and said == ""
    assert "m.yaml, run 1 (baseline_b2)" in err and "model.heptv2.width=-1" in err
    path = _matrix(tmp_path, runs=[{"batch_size": 10**30}])
    code, said, err = run_cli(
        "study", "check", "--matrix", str(path), "--data-dir", str(tiny_data_dir)
    )
    assert code == 2 and said == "" and f"batch_size={10**30}" in err


def test_study_check_passes_the_tiny_matrix_and_says_what_it_did_not_count(tmp_path):
    code, said, err = run_cli("study", "check", "--matrix", str(_matrix(tmp_path)))
    assert code == 0 and "baseline_b2" in said and "parity_b1" in said
    assert "note: the events of the runs on" in err and "data/tiny" in err


# ------------------------------------------------------------------ study aggregate


def test_aggregate_says_a_folder_s_matrix_does_not_read_and_goes_on(tmp_path, capsys):
    from heptstudy.cli.study import _matrix_of

    _matrix(tmp_path, defaults=[1]).rename(tmp_path / "matrix.yaml")
    assert _matrix_of(tmp_path) is None
    said = capsys.readouterr().out
    assert "matrix.yaml does not read" in said and "defaults=[1] is not allowed" in said
    assert "titled by the folder's name" in said


def test_aggregate_titles_by_a_matrix_whose_runs_no_longer_build(tmp_path):
    """A study folder's copy gives the report its title and notes: the configuration of today
    refusing a run it measured then does not take them away."""
    from heptstudy.cli.study import _matrix_of

    run = {"batch_size": 2, "overrides": ["foo=1"]}
    _matrix(tmp_path, runs=[run], notes=["kept"]).rename(tmp_path / "matrix.yaml")
    matrix = _matrix_of(tmp_path)
    assert matrix is not None and matrix.name == "tiny" and matrix.notes == ["kept"]


def test_an_empty_matrix_path_is_said_to_be_empty():
    with pytest.raises(StudyError, match="study matrix file '' is an empty path"):
        load_matrix("")
