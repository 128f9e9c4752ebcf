"""Paths and overrides as users give them (issue 34, cases 11 and 14): a loop of symbolic links,
an override OmegaConf cannot merge, a full disk under ``data generate`` and a relative platform
given to a launch wrapper each end in one clear message (or the right result), never a
traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import heptstudy_under_file_limit, run_cli, set_options

ROOT = Path(__file__).resolve().parents[1]
MATRIX = str(ROOT / "configs" / "study" / "tiny.yaml")


@pytest.mark.parametrize(
    ("argv", "flag", "given"),
    [
        (["study", "run", "--matrix", MATRIX, "--out", "LOOP"], "--out", "LOOP"),
        (["study", "run", "--matrix", MATRIX, "--figures", "LOOP/f"], "--figures", "LOOP/f"),
        (["study", "aggregate", "--out", "LOOP"], "--out", "LOOP"),
        (["study", "aggregate", "--out", "reports", "--figures", "LOOP"], "--figures", "LOOP"),
        (["bench", "--output", "LOOP/x.json"], "--output", "LOOP/x.json"),
        (["bench", "--output", "LOOP"], "--output", "LOOP"),
        (
            ["scenario", "render", "--scenario", "cld_pf_default", "--platform", "h100"]
            + ["--out", "LOOP"],
            "--out",
            "LOOP",
        ),
    ],
    ids=["run-out", "run-figures", "aggregate-out", "aggregate-figures", "bench-in", "bench-file"]
    + ["render-out"],
)
def test_a_symbolic_link_loop_is_one_message(argv, flag, given, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports").mkdir()
    os.symlink("LOOP", tmp_path / "LOOP")
    code, _, err = run_cli(*argv)
    assert code == 2, err
    assert f"{flag}" in err and f"{given!r} ({tmp_path / given}) is a symbolic-link loop" in err
    assert "fix the links" in err and "choose another path" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LOOP", "reports"]  # nothing made


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["config", "show", "--set", "data.configs.0=2"],
            'data.configs.0=2 cannot be merged: data.configs is a list (["1"]) and a list is '
            "set whole, not item by item; write it whole: --set 'data.configs=[\"2\"]'",
        ),
        (
            ["config", "show", "--set", "data.configs.1=3"],
            'write it whole: --set \'data.configs=["1", "3"]\'',
        ),
        (
            ["config", "show", "--set", "model.heptv2=[1]"],
            "model.heptv2=[1] cannot be merged: model.heptv2 is a section of keys",
        ),
        (
            ["scenario", "resolve", "--scenario", "cld_pf_default", "--platform", "h100"]
            + ["--set", "data.configs.0=2"],
            "data.configs.0=2 cannot be merged: data.configs is a list",
        ),
    ],
    ids=["item-by-position", "item-appended", "list-for-section", "scenario"],
)
def test_an_override_that_cannot_be_merged_names_it_and_how_to_write_it(argv, said):
    code, out, err = run_cli(*argv)
    assert code == 2 and said in err, err
    assert not out


def test_the_written_form_the_message_advises_is_accepted():
    code, out, err = run_cli("config", "show", *set_options(['data.configs=["2"]']))
    assert code == 0, err
    assert "configs:\n  - '2'" in out


def test_data_generate_under_a_file_size_limit_is_one_message_and_leaves_nothing(tmp_path):
    data = tmp_path / "tfds"
    argv = ["data", "generate", "--data-dir", str(data), "--events-train", "8"]
    argv += ["--events-test", "4", "--seed", "1", "--occupancy-scale", "0.03", "--no-progress"]
    done = heptstudy_under_file_limit(64, *argv, "--workers", "1", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"writing the data sets to {str(data)!r} failed: File too large" in done.stderr
    assert "none of them was put in place" in done.stderr
    assert "Raise the file size limit (ulimit -f) or free space" in done.stderr
    assert not data.exists()  # no half-written data set, no empty folder of one


def _wrapper(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A launch wrapper run by bash where sbatch does not exist (it prints the batch scripts and
    submits nothing), with this checkout's package and this interpreter as ``python3``."""
    dirs = [str(Path(sys.executable).parent)]
    dirs += [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    dirs = [d for d in dirs if not (Path(d) / "sbatch").exists()]
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / script / "train_scenario.sh"), *args],
        cwd=cwd,
        env={**os.environ, "PATH": os.pathsep.join(dirs), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_relative_platform_and_render_folder_are_taken_from_the_working_directory(tmp_path):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    shutil.copy(ROOT / "configs" / "training" / "platforms" / "h100.yaml", tmp_path / "plat.yaml")
    (tmp_path / "no_data").mkdir()  # not the checkout's small data set
    away = ["--set", f"data.data_dir={tmp_path / 'no_data'}"]
    done = _wrapper(
        "h100", "cld_pf_default", "../../plat", "--out", "new/../render", *away, cwd=work
    )
    assert done.returncode == 0, done.stderr
    assert "nothing was submitted" in done.stdout
    scripts = sorted((work / "render").glob("*.sbatch"))
    assert len(scripts) == 2 and all(f"  {s}\n" in done.stdout for s in scripts)
    assert not (work / "new").exists()  # `..` taken as the file system does, made nowhere else


@pytest.mark.parametrize("script", ["h100", "lumi"])
def test_a_relative_platform_that_does_not_exist_is_refused(script, tmp_path):
    before = set((ROOT / "experiments").rglob("*"))
    done = _wrapper(script, "cld_pf_default", "../../../../x/plat", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (
        f"platform profile '../../../../x/plat' ({tmp_path}/../../../../x/plat, taken from the "
        "working directory) is not a file: give the path of a profile YAML file, or a profile "
        "name:" in done.stderr
    )
    assert set((ROOT / "experiments").rglob("*")) == before and not (ROOT / "x").exists()


@pytest.mark.parametrize(
    "command", [["bench", "--batch-size", "1"], ["costs", "--batch-size", "1", "--repeats", "1"]]
)
def test_a_relative_data_dir_typed_on_the_command_line_is_the_working_directory_s(
    command, tmp_path, monkeypatch
):
    """bench and costs read it from the repository: from another folder, `--data-dir mine` was
    the repository's folder of that name."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(*command, "--data-dir", "mine")
    assert code == 2, err
    assert f"data directory '{tmp_path / 'mine'}' does not exist" in err
