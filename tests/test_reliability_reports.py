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
